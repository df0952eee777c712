//! Codes over RTP without GStreamer: the payload format of codec frames
//! (`X-QWEN3-TTS-CODES`, [`payload`]) and what a receiver makes of a stream of its packets
//! ([`receiver`]: loss, the frames it took, where utterances start), and which packets a port of
//! one sender's takes ([`source`]: its address, then the first packet's port and SSRC). The
//! plugin's payloader and depayloader adapt them, the media server locks its ports with the
//! last; the fuzz target drives them alone.

pub mod payload;
pub mod receiver;
pub mod source;

pub use payload::{BadPacket, ENCODING_NAME, Layout, MAX_CODEBOOK_SIZE, MAX_FRAMES, Packet, VERSION};
pub use receiver::{Received, Receiver, RtpPacket, Stats};
pub use source::{SourceLock, Stranger, ssrc_of};
