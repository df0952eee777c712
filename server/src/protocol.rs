//! What the server's two WebSocket endpoints take, parsed and checked: the browsers' signalling
//! messages (`/signal`) and the TTS senders' messages (`/codes`). Free of GStreamer and of the
//! network, so that the fuzz targets (`fuzz/`) build it as it is.

use std::fmt;

use serde::Deserialize;

/// A browser's message on `/signal` (JSON text).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum FromBrowser {
    Join,
    Answer {
        sdp: String,
    },
    Ice {
        candidate: String,
        #[serde(rename = "sdpMLineIndex")]
        mline_index: u32,
    },
}

/// A sender's text message on `/codes` (its binary messages are frames, see [`FrameLayout`]).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum FromSender {
    /// The utterance so far is complete.
    End,
    /// Barge-in: drop what is queued and not yet heard.
    Cancel,
}

pub fn browser_message(text: &str) -> Result<FromBrowser, String> {
    serde_json::from_str(text).map_err(|err| format!("malformed signalling message: {err}"))
}

pub fn sender_message(text: &str) -> Result<FromSender, String> {
    serde_json::from_str(text).map_err(|err| format!("malformed message: {err}"))
}

/// The codec frames the model takes: `codebooks` little-endian int16 codes each, every code in
/// `0..codebook_size`.
#[derive(Debug, Clone, Copy)]
pub struct FrameLayout {
    pub codebooks: usize,
    pub codebook_size: usize,
}

/// Why a binary message is not frames the model takes.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    NotWholeFrames {
        bytes: usize,
        frame_bytes: usize,
        codebooks: usize,
    },
    OutsideCodebook {
        frame: usize,
        codebook: usize,
        code: i16,
        codebook_size: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::NotWholeFrames {
                bytes,
                frame_bytes,
                codebooks,
            } => write!(
                f,
                "not whole frames: {bytes} bytes, a frame is {frame_bytes} ({codebooks} codes of 2 bytes)"
            ),
            FrameError::OutsideCodebook {
                frame,
                codebook,
                code,
                codebook_size,
            } => write!(
                f,
                "frame {frame}, codebook {codebook}: code {code} is outside 0..{codebook_size}"
            ),
        }
    }
}

impl FrameLayout {
    pub fn frame_bytes(&self) -> usize {
        2 * self.codebooks
    }

    /// The number of frames in `bytes`, if they are whole frames of valid codes.
    pub fn check(&self, bytes: &[u8]) -> Result<usize, FrameError> {
        let frame_bytes = self.frame_bytes();
        if bytes.is_empty() || !bytes.len().is_multiple_of(frame_bytes) {
            return Err(FrameError::NotWholeFrames {
                bytes: bytes.len(),
                frame_bytes,
                codebooks: self.codebooks,
            });
        }
        for (at, pair) in bytes.chunks_exact(2).enumerate() {
            let code = i16::from_le_bytes([pair[0], pair[1]]);
            if code < 0 || code as usize >= self.codebook_size {
                return Err(FrameError::OutsideCodebook {
                    frame: at / self.codebooks,
                    codebook: at % self.codebooks,
                    code,
                    codebook_size: self.codebook_size,
                });
            }
        }
        Ok(bytes.len() / frame_bytes)
    }
}
