//! What every connection handler needs: the server's state and settings.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::connections::{Connections, TrustedProxies};
use crate::metrics::Metrics;
use crate::session::Sessions;
use crate::{access, ice, janus, liveness, rtp_ingress};

/// What every connection handler needs.
pub struct Server {
    pub sessions: Sessions,
    /// Who may feed a session (`/codes`), and the operator's token (`/broadcast`).
    pub senders: access::SenderPolicy,
    pub max_message_bytes: usize,
    /// How long a new connection may stay silent before it is closed (its request head too).
    pub idle_timeout: Duration,
    /// When a browser or a sender that answers nothing is gone (see `liveness`).
    pub peer_times: liveness::PeerTimes,
    /// Origins besides the server's own whose pages may open `/signal`.
    pub allowed_origins: Vec<String>,
    /// The hosts a request may name (`--allow-host`); empty: any.
    pub allowed_hosts: Vec<String>,
    /// Who may join a session, and how many and how often each client.
    pub joins: access::JoinPolicy,
    /// A 1:1 NAT's public address (`--public-address`), which an RTP sender is told to send to.
    pub public_address: Option<IpAddr>,
    pub metrics: Arc<Metrics>,
    /// What a sender's codes over RTP are (`/codes?...&transport=rtp`).
    pub rtp_format: rtp_ingress::RtpFormat,
    /// The STUN and TURN servers each page's peer connection is given (`RTCIceServer`s).
    pub ice: Arc<ice::Ice>,
    /// Codes over RTP are taken as SRTP alone (`--rtp-srtp required`).
    pub rtp_srtp_required: bool,
    /// Where broadcasts go (`--janus`), if anywhere.
    pub janus: Option<Arc<janus::Janus>>,
    /// janus.js for the broadcast listener page (`--janus-js`), if it was found.
    pub janus_js: Option<String>,
    /// `/metrics` and `/status` are served on `--metrics-bind` alone.
    pub monitoring_apart: bool,
    /// The connections open on `--bind` and their caps.
    pub connections: Arc<Connections>,
    /// The proxies whose `X-Forwarded-For` names the client (`--trusted-proxy`).
    pub trusted_proxies: TrustedProxies,
}
