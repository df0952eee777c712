//! A TTS media server: codec frames come in over a WebSocket from a TTS process, each browser
//! session hears its own speech over WebRTC.
//!
//! ```text
//! TTS process --ws /codes?session=ID (token)--> ingress --appsrc--> session pipeline --WebRTC--> browser
//!   (or its frames as RTP packets: /codes?session=ID&transport=rtp names a UDP port, rtp_ingress)
//! browser --ws /signal (JSON: join, SDP, ICE)--> signalling --> session pipeline
//!
//! session pipeline: appsrc ! qwencodecdec ! audioconvert ! audioresample ! opusenc
//!                     ! rtpopuspay ! clocksync ! webrtcbin
//! ```
//!
//! One process serves the page (`/`), the browsers' signalling (`/signal`), the codes ingress
//! (`/codes`) and a status document (`/status`: sessions, live pipelines and the capacity). Every
//! session's decoder is an element of its own on the one model the server loaded at start.
//! docs/server-protocol.md has the message formats and the refusals. The binary
//! (`qwencodec-server`) reads a [`Config`] from its command line and calls [`run`].

pub mod access;
pub mod admission;
pub mod broadcast;
pub mod config;
pub mod connections;
pub mod http;
pub mod ice;
pub mod ingress;
pub mod janus;
pub mod listen;
pub mod liveness;
mod log;
pub mod metrics;
pub mod opus;
pub mod random;
pub mod refusal_log;
pub mod routes;
pub mod rtp_ingress;
mod run;
pub mod server;
pub mod session;
pub mod session_loop;
pub mod signalling;
pub mod turn_rest;

pub use config::Config;
pub use run::run;
