//! What the server, the examples and the benchmarks share: the one command-line parser
//! ([`Options`]) and the WebRTC helpers ([`webrtc`]: webrtcbin's addresses, the DTLS
//! certificate, SDP text).

pub mod options;
pub mod webrtc;

pub use options::Options;
