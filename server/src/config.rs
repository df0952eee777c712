//! What the server is run with: its options as read from the command line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gstqwencodec::model::Dtype;

use crate::ice::Ice;
use crate::liveness::PeerTimes;
use crate::opus::OpusSettings;
use qwencodec_protocol::token::JoinSecret;

/// Where Debian's libjs-janus-gateway puts janus.js.
pub const DEBIAN_JANUS_JS: &str = "/usr/share/javascript/janus-gateway/janus.js";

/// The bundled test checkpoint (random weights: noise, but every part of the server is real).
pub fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/release-tiny")
}

/// The environment variable that may hold the operator's codes token (`--token-file` wins).
pub const CODES_TOKEN_VARIABLE: &str = "QWENCODEC_CODES_TOKEN";

/// Why the server must not start bound to `bind`, if it must not: on an address other hosts
/// reach, without a join secret anyone who reaches it may join any session, which the operator
/// must ask for (`--insecure-open`) rather than get by default.
pub fn open_bind_refusal(bind: SocketAddr, join_secret: bool, insecure_open: bool) -> Option<String> {
    if join_secret || insecure_open || bind.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "--bind {bind} is reachable from other hosts, and without a join secret anyone who reaches \
         it may join any session. Make a secret (head -c 32 /dev/urandom | base64 > FILE; chmod 600 \
         FILE), give it with --join-secret-file FILE or ${}, and have the application's backend \
         sign join tokens with it (docs/server-protocol.md); or say --insecure-open to serve \
         anyone (a demo)",
        qwencodec_protocol::token::SECRET_VARIABLE
    ))
}

/// What the log says at start of the TTS side: where senders connect (`codes_url`) and with what
/// credential: the session's sender token where a join secret signs them (`signed_senders`),
/// and the operator's token, as shown (`operator`: a token given is shown by where it came from).
/// And a warning where the TTS side shares the public listener (`shared_bind`: `--bind`, where no
/// `--codes-bind` is given).
pub fn codes_start_lines(
    codes_url: &str,
    shared_bind: Option<SocketAddr>,
    signed_senders: bool,
    operator: Option<&str>,
) -> Vec<String> {
    let credential = match (signed_senders, operator) {
        (true, Some(operator)) => format!(
            "<the session's sender token>\" (or \"Bearer {operator}\", the operator's token: any \
             session, but no takeover=1)"
        ),
        (true, None) => "<the session's sender token>\" (no operator token)".to_owned(),
        (false, Some(operator)) => format!("{operator}\""),
        (false, None) => "\" (no credential takes it: give --token-file FILE)".to_owned(),
    };
    let mut lines = vec![format!(
        "codes ingress: {codes_url} with the header \"Authorization: Bearer {credential}"
    )];
    if let Some(bind) = shared_bind {
        lines.push(format!(
            "warning: /codes and /broadcast share the public listener (--bind {bind}): whoever \
             reaches the page may try senders' credentials there, and a flood of the public side \
             holds senders up. Give --codes-bind ADDRESS:PORT on a private address (the TTS \
             farm's network) to serve them there alone (docs/streaming-server.md, the TTS side apart)"
        ));
    }
    lines
}

/// Where the operator's codes token came from.
pub enum TokenSource {
    /// Made at start, where no join secret is given (senders then have no other credential): it
    /// is printed.
    Made,
    /// Given by this option or variable: not printed (the log may go where the token must not).
    Given(&'static str),
}

/// How many sessions the server takes (`--admission`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// As many as the decoder serves in real time, measured at start, and none while behind.
    Measured,
    /// `--max-sessions` alone.
    Off,
}

/// Every option of the server (the binary's usage text describes each).
pub struct Config {
    pub bind: SocketAddr,
    pub model: PathBuf,
    pub device: String,
    pub dtype: Dtype,
    pub chunk_frames: u32,
    /// The operator's token (`/codes` for any session, `/broadcast`): None where a join secret
    /// is given and no token, as senders then have tokens of their own.
    pub token: Option<(String, TokenSource)>,
    pub join_secret: Option<JoinSecret>,
    /// `--join-secret-file`, for the log (else the secret came from the environment).
    pub join_secret_file: Option<String>,
    /// `--max-token-ttl`, seconds.
    pub max_token_ttl: u64,
    pub allowed_hosts: Vec<String>,
    pub max_sessions_per_address: usize,
    pub max_joins_per_minute: u32,
    pub codes_bind: Option<SocketAddr>,
    /// `/metrics` and `/status` on this address alone.
    pub metrics_bind: Option<SocketAddr>,
    pub max_codes_connections: usize,
    pub max_sessions: usize,
    pub max_message_bytes: usize,
    pub idle_timeout: Duration,
    pub peer_times: PeerTimes,
    pub allowed_origins: Vec<String>,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    pub instance: Option<String>,
    /// Seconds.
    pub drain_timeout: f64,
    pub admission: Admission,
    pub margin_floor: f64,
    pub cores: Option<usize>,
    /// The cores this host has.
    pub host_cores: usize,
    pub ice: Ice,
    pub opus: OpusSettings,
    pub janus_api: Option<String>,
    pub janus_public: Option<String>,
    /// Janus's API secret, the Streaming plugin's admin key, its token secret (`--janus-*-file`).
    pub janus_secrets: crate::janus::Secrets,
    /// `--trusted-proxy`: the proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// janus.js's file, read when broadcasts go to Janus.
    pub janus_js: String,
    /// `--tls-cert` and `--tls-key`: `--bind` serves https and wss.
    pub tls: Option<TlsFiles>,
    /// `--rtp-srtp required`: codes over RTP are taken as SRTP alone.
    pub rtp_srtp_required: bool,
}

/// The PEM files of `--bind`'s TLS: the certificate chain (the server's first) and its key.
pub struct TlsFiles {
    pub certificate: PathBuf,
    pub key: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_says_where_senders_connect_and_warns_of_a_shared_listener() {
        let bind: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let url = "ws://0.0.0.0:8080/codes?session=ID";
        let lines = codes_start_lines(url, Some(bind), false, Some("abc123"));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines[0],
            "codes ingress: ws://0.0.0.0:8080/codes?session=ID with the header \"Authorization: \
             Bearer abc123\""
        );
        assert!(
            lines[1].starts_with(
                "warning: /codes and /broadcast share the public listener (--bind 0.0.0.0:8080)"
            ) && lines[1].contains("Give --codes-bind ADDRESS:PORT on a private address"),
            "{}",
            lines[1]
        );
        // On a listener of their own: no warning.
        let apart = codes_start_lines("ws://10.0.0.5:8081/codes?session=ID", None, true, None);
        assert_eq!(
            apart,
            [
                "codes ingress: ws://10.0.0.5:8081/codes?session=ID with the header \"Authorization: \
              Bearer <the session's sender token>\" (no operator token)"
            ]
        );
        let both = codes_start_lines(url, None, true, Some("<the token of --token-file>"));
        assert!(
            both[0].ends_with(
                "Bearer <the session's sender token>\" (or \"Bearer <the token of --token-file>\", \
                 the operator's token: any session, but no takeover=1)"
            ),
            "{}",
            both[0]
        );
    }

    #[test]
    fn a_server_others_reach_needs_a_join_secret_or_insecure_open() {
        let bind = |text: &str| -> SocketAddr { text.parse().unwrap() };
        for open in ["0.0.0.0:8080", "[::]:8080", "192.0.2.1:443", "[2001:db8::1]:80"] {
            let refusal = open_bind_refusal(bind(open), false, false).expect(open);
            assert!(
                refusal.starts_with(&format!("--bind {open} is reachable")),
                "{refusal}"
            );
            assert!(refusal.contains("--join-secret-file") && refusal.contains("--insecure-open"));
            assert_eq!(
                open_bind_refusal(bind(open), true, false),
                None,
                "{open} with a secret"
            );
            assert_eq!(
                open_bind_refusal(bind(open), false, true),
                None,
                "{open}, --insecure-open"
            );
        }
        for loopback in ["127.0.0.1:8080", "127.0.0.2:0", "[::1]:8080"] {
            assert_eq!(
                open_bind_refusal(bind(loopback), false, false),
                None,
                "{loopback}"
            );
        }
    }
}
