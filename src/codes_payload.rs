//! The RTP payload of codec frames (`X-QWEN3-TTS-CODES`, a private format: docs/rtp-codes.md).
//!
//! ```text
//!  0 1 2 3 4 5 6 7
//! +-+-+-+-+-+-+-+-+---------------------------------------------------+
//! |V=0| frames - 1|  the frames' codes, frame-major, `bits` bits each, |
//! +-+-+-+-+-+-+-+-+  most significant bit first, zero bits to a byte  |
//! ```
//!
//! `bits` is the fewest that hold every code of the codebook (11 for 2048 codes). The header
//! says how many frames follow (1 to 64), so that a packet's length is exact: any other length
//! is a bad packet. GStreamer-free; both elements use it.

/// The RTP encoding name (the SDP's `a=rtpmap:<pt> X-QWEN3-TTS-CODES/<clock rate>`).
pub const ENCODING_NAME: &str = "X-QWEN3-TTS-CODES";
/// The most frames a packet holds (the header's six bits).
pub const MAX_FRAMES: usize = 64;
/// The header's version, the two top bits of its byte.
const VERSION: u8 = 0;
const HEADER_BYTES: usize = 1;

/// What the packets of one stream share, from the caps (the SDP's `a=fmtp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Codes per frame.
    pub codebooks: usize,
    /// Codes run from 0 to `codebook_size - 1`.
    pub codebook_size: u32,
}

/// Why a packet was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadPacket {
    #[error("an empty payload")]
    Empty,
    #[error("payload version {0}, this receiver knows version 0")]
    Version(u8),
    #[error(
        "{frames} frames of {codebooks} codes at {bits} bits take {expected} bytes, the payload has {found}"
    )]
    Length {
        frames: usize,
        codebooks: usize,
        bits: u32,
        expected: usize,
        found: usize,
    },
    #[error("frame {frame}, codebook {codebook}: code {code} is outside 0..{codebook_size}")]
    Code {
        frame: usize,
        codebook: usize,
        code: u32,
        codebook_size: u32,
    },
}

impl Layout {
    /// Bits per code: the fewest that hold `codebook_size - 1`.
    pub fn bits(&self) -> u32 {
        (u32::BITS - (self.codebook_size.max(2) - 1).leading_zeros()).max(1)
    }

    /// The payload bytes of `frames` frames.
    pub fn payload_len(&self, frames: usize) -> usize {
        HEADER_BYTES + (frames * self.codebooks * self.bits() as usize).div_ceil(8)
    }

    /// The most frames a payload of at most `bytes` holds (0 if not even one).
    pub fn frames_within(&self, bytes: usize) -> usize {
        let bits_per_frame = self.codebooks * self.bits() as usize;
        (bytes.saturating_sub(HEADER_BYTES) * 8 / bits_per_frame).min(MAX_FRAMES)
    }

    /// The payload of whole frames of codes (`codes.len()` a multiple of `codebooks`, 1 to
    /// [`MAX_FRAMES`] frames, every code in the codebook: the caller checked).
    pub fn pack(&self, codes: &[i16]) -> Vec<u8> {
        let frames = codes.len() / self.codebooks;
        assert!(
            (1..=MAX_FRAMES).contains(&frames) && codes.len() == frames * self.codebooks,
            "whole frames, 1 to {MAX_FRAMES}"
        );
        let bits = self.bits();
        let mut payload = Vec::with_capacity(self.payload_len(frames));
        payload.push(VERSION << 6 | (frames - 1) as u8);
        let (mut pending, mut pending_bits) = (0u64, 0u32);
        for &code in codes {
            pending = pending << bits | (code as u16 as u64 & ((1 << bits) - 1));
            pending_bits += bits;
            while pending_bits >= 8 {
                pending_bits -= 8;
                payload.push((pending >> pending_bits) as u8);
            }
        }
        if pending_bits > 0 {
            payload.push((pending << (8 - pending_bits)) as u8);
        }
        payload
    }

    /// The codes of a payload, frame-major, checked against the codebook.
    pub fn unpack(&self, payload: &[u8]) -> Result<Vec<i16>, BadPacket> {
        let (&header, body) = payload.split_first().ok_or(BadPacket::Empty)?;
        if header >> 6 != VERSION {
            return Err(BadPacket::Version(header >> 6));
        }
        let frames = (header & 0x3f) as usize + 1;
        let expected = self.payload_len(frames);
        if payload.len() != expected {
            return Err(BadPacket::Length {
                frames,
                codebooks: self.codebooks,
                bits: self.bits(),
                expected,
                found: payload.len(),
            });
        }
        let bits = self.bits();
        let mask = (1u64 << bits) - 1;
        let mut codes = Vec::with_capacity(frames * self.codebooks);
        let (mut pending, mut pending_bits) = (0u64, 0u32);
        let mut bytes = body.iter();
        while codes.len() < frames * self.codebooks {
            while pending_bits < bits {
                // The length was checked: the bytes cover every code.
                pending = pending << 8 | u64::from(*bytes.next().expect("length checked"));
                pending_bits += 8;
            }
            pending_bits -= bits;
            let code = ((pending >> pending_bits) & mask) as u32;
            if code >= self.codebook_size {
                let index = codes.len();
                return Err(BadPacket::Code {
                    frame: index / self.codebooks,
                    codebook: index % self.codebooks,
                    code,
                    codebook_size: self.codebook_size,
                });
            }
            codes.push(code as i16);
        }
        Ok(codes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELEASE: Layout = Layout {
        codebooks: 16,
        codebook_size: 2048,
    };

    /// Codes from a small generator of our own: every value of the codebook turns up.
    fn codes(count: usize, codebook_size: u32, seed: u32) -> Vec<i16> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..count)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state % codebook_size) as i16
            })
            .collect()
    }

    #[test]
    fn bits_hold_every_code_and_no_more() {
        let bits = |codebook_size| {
            Layout {
                codebooks: 1,
                codebook_size,
            }
            .bits()
        };
        assert_eq!(bits(2048), 11);
        assert_eq!(bits(2049), 12);
        assert_eq!(bits(1024), 10);
        assert_eq!(bits(1000), 10);
        assert_eq!(bits(2), 1);
        assert_eq!(bits(32768), 15);
    }

    #[test]
    fn the_release_packs_a_frame_in_22_bytes_and_a_packet_holds_up_to_64() {
        // 16 codes of 11 bits: 176 bits, 22 bytes, and the header.
        assert_eq!(RELEASE.payload_len(1), 23);
        assert_eq!(RELEASE.payload_len(4), 1 + 88);
        // An MTU of 1400 less the RTP header's 12 bytes.
        assert_eq!(RELEASE.frames_within(1388), 63);
        assert_eq!(RELEASE.frames_within(100_000), MAX_FRAMES);
        assert_eq!(RELEASE.frames_within(22), 0);
    }

    #[test]
    fn codes_come_back_bit_identical_at_every_size() {
        for layout in [
            RELEASE,
            Layout {
                codebooks: 3,
                codebook_size: 1000,
            },
            Layout {
                codebooks: 1,
                codebook_size: 2,
            },
            Layout {
                codebooks: 5,
                codebook_size: 32768,
            },
        ] {
            for frames in 1..=MAX_FRAMES {
                let sent = codes(frames * layout.codebooks, layout.codebook_size, frames as u32);
                let payload = layout.pack(&sent);
                assert_eq!(payload.len(), layout.payload_len(frames));
                assert_eq!(
                    layout.unpack(&payload).unwrap(),
                    sent,
                    "{layout:?}, {frames} frames"
                );
            }
        }
    }

    #[test]
    fn the_largest_and_smallest_codes_survive() {
        let sent = [2047, 0, 2047, 1, 1024, 2046, 0, 0, 2047, 2047, 5, 6, 7, 8, 9, 10];
        assert_eq!(RELEASE.unpack(&RELEASE.pack(&sent)).unwrap(), sent);
    }

    #[test]
    fn says_what_is_wrong_with_a_bad_packet() {
        let payload = RELEASE.pack(&codes(32, 2048, 1));
        assert_eq!(RELEASE.unpack(&[]), Err(BadPacket::Empty));
        let mut version = payload.clone();
        version[0] |= 0x40;
        assert_eq!(RELEASE.unpack(&version), Err(BadPacket::Version(1)));
        let short = &payload[..payload.len() - 1];
        assert!(matches!(
            RELEASE.unpack(short),
            Err(BadPacket::Length {
                frames: 2,
                expected: 45,
                found: 44,
                ..
            })
        ));
        // A header claiming three frames over two frames' bytes.
        let mut count = payload.clone();
        count[0] = 2;
        assert!(matches!(
            RELEASE.unpack(&count),
            Err(BadPacket::Length { frames: 3, .. })
        ));
        // 10 bits hold 1000 codes and 24 more values, which are no codes.
        let layout = Layout {
            codebooks: 2,
            codebook_size: 1000,
        };
        let bad = [0u8, 0b1111_1111, 0b1100_0000, 0];
        assert_eq!(
            layout.unpack(&bad),
            Err(BadPacket::Code {
                frame: 0,
                codebook: 0,
                code: 1023,
                codebook_size: 1000
            })
        );
        assert!(
            BadPacket::Code {
                frame: 0,
                codebook: 0,
                code: 1023,
                codebook_size: 1000
            }
            .to_string()
            .contains("outside 0..1000")
        );
    }
}
