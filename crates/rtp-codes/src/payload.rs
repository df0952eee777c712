//! The RTP payload of codec frames (`X-QWEN3-TTS-CODES`, a private format: docs/rtp-codes.md).
//!
//! ```text
//!  0                   1
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-------------------------------------+
//! |V=1| frames - 1|   utterance   |  the frames' codes, frame-major,    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  `bits` bits each, most significant |
//! |  bit first, zero bits to a whole byte                              |
//! +--------------------------------------------------------------------+
//! ```
//!
//! `bits` is the fewest that hold every code of the codebook (11 for 2048 codes). The header
//! says how many frames follow (1 to 64), so that a packet's length is exact: any other length
//! is a bad packet. `utterance` numbers the sender's utterances (modulo 256): a receiver that
//! lost an utterance's first (marked) packet still sees the next one start where the number
//! changes. Version 1; version 0 (one header byte, no utterance number) is refused. GStreamer-free;
//! both elements use it.

/// The RTP encoding name (the SDP's `a=rtpmap:<pt> X-QWEN3-TTS-CODES/<clock rate>`).
pub const ENCODING_NAME: &str = "X-QWEN3-TTS-CODES";
/// The payload format's version, the two top bits of the header and the SDP's `version=`.
pub const VERSION: u8 = 1;
/// The most frames a packet holds (the header's six bits).
pub const MAX_FRAMES: usize = 64;
/// The largest codebook: codes are int16, 15 bits at most.
pub const MAX_CODEBOOK_SIZE: u32 = 1 << 15;
const HEADER_BYTES: usize = 2;

/// The contents of one packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The sender's utterance number, modulo 256.
    pub utterance: u8,
    /// The codes, frame-major.
    pub codes: Vec<i16>,
}

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
    #[error("payload version {0}, this receiver reads version 1")]
    Version(u8),
    #[error("a payload of one byte, shorter than the 2-byte header")]
    NoHeader,
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
    /// [`MAX_FRAMES`] frames, every code in the codebook: the caller checked) of utterance
    /// number `utterance`.
    pub fn pack(&self, utterance: u8, codes: &[i16]) -> Vec<u8> {
        let frames = codes.len() / self.codebooks;
        assert!(
            (1..=MAX_FRAMES).contains(&frames) && codes.len() == frames * self.codebooks,
            "whole frames, 1 to {MAX_FRAMES}"
        );
        let bits = self.bits();
        let mut payload = Vec::with_capacity(self.payload_len(frames));
        payload.push(VERSION << 6 | (frames - 1) as u8);
        payload.push(utterance);
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

    /// The utterance number and codes of a payload, checked against the codebook.
    pub fn unpack(&self, payload: &[u8]) -> Result<Packet, BadPacket> {
        let &header = payload.first().ok_or(BadPacket::Empty)?;
        if header >> 6 != VERSION {
            return Err(BadPacket::Version(header >> 6));
        }
        let [_, utterance, body @ ..] = payload else {
            return Err(BadPacket::NoHeader);
        };
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
        Ok(Packet {
            utterance: *utterance,
            codes,
        })
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
        // The largest codebook's codes are int16's positive values.
        assert_eq!(MAX_CODEBOOK_SIZE, i16::MAX as u32 + 1);
    }

    #[test]
    fn the_release_packs_a_frame_in_22_bytes_and_a_packet_holds_up_to_64() {
        // 16 codes of 11 bits: 176 bits, 22 bytes, and the header's 2.
        assert_eq!(RELEASE.payload_len(1), 24);
        assert_eq!(RELEASE.payload_len(4), 2 + 88);
        // An MTU of 1400 less the RTP header's 12 bytes.
        assert_eq!(RELEASE.frames_within(1388), 63);
        assert_eq!(RELEASE.frames_within(100_000), MAX_FRAMES);
        assert_eq!(RELEASE.frames_within(23), 0);
        assert_eq!(RELEASE.frames_within(24), 1);
    }

    /// docs/rtp-codes.md's example, byte by byte: one release frame of utterance 5. Code 2
    /// (1365, 0b101_0101_0101) takes the body's bits 22 to 32: the last two bits of its third
    /// byte, all of its fourth and the first of its fifth.
    #[test]
    fn a_release_frame_packs_to_the_documented_bytes() {
        let codes = [2047, 0, 1365, 1, 1024, 2046, 682, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        let golden = [
            0x40, 0x05, // version 1, 1 frame; utterance 5
            0xff, 0xe0, 0x02, 0xaa, 0x80, 0x18, 0x01, 0xff, 0x95, 0x50, 0x03, 0x00, 0x80, 0x14, 0x03, 0x00,
            0x70, 0x10, 0x02, 0x40, 0x50, 0x0b,
        ];
        assert_eq!(RELEASE.pack(5, &codes), golden);
        assert_eq!(
            RELEASE.unpack(&golden),
            Ok(Packet {
                utterance: 5,
                codes: codes.to_vec()
            })
        );
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
                let utterance = frames as u8 * 4;
                let payload = layout.pack(utterance, &sent);
                assert_eq!(payload.len(), layout.payload_len(frames));
                let packet = layout.unpack(&payload).unwrap();
                assert_eq!(packet.codes, sent, "{layout:?}, {frames} frames");
                assert_eq!(packet.utterance, utterance);
            }
        }
    }

    #[test]
    fn the_largest_and_smallest_codes_survive() {
        let sent = [2047, 0, 2047, 1, 1024, 2046, 0, 0, 2047, 2047, 5, 6, 7, 8, 9, 10];
        let packet = RELEASE.unpack(&RELEASE.pack(255, &sent)).unwrap();
        assert_eq!((packet.utterance, packet.codes.as_slice()), (255, &sent[..]));
    }

    #[test]
    fn says_what_is_wrong_with_a_bad_packet() {
        let payload = RELEASE.pack(0, &codes(32, 2048, 1));
        assert_eq!(RELEASE.unpack(&[]), Err(BadPacket::Empty));
        // Version 0: one header byte, no utterance number.
        let mut version = payload.clone();
        version[0] &= 0x3f;
        assert_eq!(RELEASE.unpack(&version), Err(BadPacket::Version(0)));
        version[0] |= 0xc0;
        assert_eq!(RELEASE.unpack(&version), Err(BadPacket::Version(3)));
        assert_eq!(RELEASE.unpack(&payload[..1]), Err(BadPacket::NoHeader));
        let short = &payload[..payload.len() - 1];
        assert!(matches!(
            RELEASE.unpack(short),
            Err(BadPacket::Length {
                frames: 2,
                expected: 46,
                found: 45,
                ..
            })
        ));
        // A header claiming three frames over two frames' bytes.
        let mut count = payload.clone();
        count[0] = 0x42;
        assert!(matches!(
            RELEASE.unpack(&count),
            Err(BadPacket::Length { frames: 3, .. })
        ));
        // 10 bits hold 1000 codes and 24 more values, which are no codes.
        let layout = Layout {
            codebooks: 2,
            codebook_size: 1000,
        };
        let bad = [0x40u8, 0, 0b1111_1111, 0b1100_0000, 0];
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
        // The error names where the bad code lies: the second frame's third codebook.
        let layout = Layout {
            codebooks: 3,
            codebook_size: 1000,
        };
        assert_eq!(
            layout.unpack(&layout.pack(0, &[1, 2, 3, 4, 5, 1023])),
            Err(BadPacket::Code {
                frame: 1,
                codebook: 2,
                code: 1023,
                codebook_size: 1000
            })
        );
    }
}
