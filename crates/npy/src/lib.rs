//! NumPy `.npy` files of codec frames, without GStreamer.
//!
//! A `.npy` file is a magic string, a format version, a header length, a header (a Python dict
//! literal such as `{'descr': '<i8', 'fortran_order': False, 'shape': (160, 16), }`) and the
//! array's bytes. [`read_header`] takes the first bytes of a stream (a parser sees bytes, not a
//! file) and says how many more it needs, or what the header describes: where the data starts,
//! T frames of Q codes, and their integer type. [`FrameFormat::to_codes`] turns whole frames of
//! the payload into `i16` codes.
//!
//! Anything that is not the header of a C-order integer array of shape (T, Q) or (1, T, Q) is
//! an error that says what was found; no input makes these functions panic.

use std::fmt;

use literal::Value;

mod literal;
#[cfg(test)]
mod tests;

/// The first bytes of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The longest header accepted, in bytes: numpy's own default `max_header_size`, past which it
/// refuses to evaluate a header.
pub const MAX_HEADER_LEN: usize = 10_000;

/// The most codebooks a frame may have (a frame is then at most 512 KiB).
pub const MAX_CODEBOOKS: u64 = 65_536;

/// What the first bytes of a stream are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderRead {
    /// The header, read whole.
    Complete(Header),
    /// The header is not whole yet: it needs at least `needed` bytes from the stream start.
    Incomplete { needed: usize },
}

/// A `.npy` header describing T frames of Q integer codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Format version (major, minor): (1, 0), (2, 0) or (3, 0).
    pub version: (u8, u8),
    /// Where the array's bytes start: the length of magic, version, length field and header.
    pub data_offset: usize,
    /// T, the number of frames.
    pub frames: u64,
    /// The codes' type and the number of codebooks Q.
    pub format: FrameFormat,
    /// The shape as written, (T, Q) or (1, T, Q).
    pub shape: Vec<u64>,
}

impl Header {
    /// The bytes of the array the header declares: T × Q × item size.
    pub fn data_bytes(&self) -> u64 {
        // Checked when the header was read.
        self.frames * self.format.frame_bytes() as u64
    }

    /// The shape as Python writes it, e.g. `(160, 16)`.
    pub fn shape_string(&self) -> String {
        shape_string(&self.shape)
    }
}

/// The integer types codes may be stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IntType {
    pub signed: bool,
    /// Bytes per value: 1, 2, 4 or 8.
    pub size: usize,
    pub little_endian: bool,
}

impl IntType {
    /// Raw codec frames: little-endian `int16`.
    pub const I16_LE: IntType = IntType {
        signed: true,
        size: 2,
        little_endian: true,
    };

    /// Parses a numpy type string such as `<i4` or `|u1`.
    fn from_descr(descr: &str) -> Result<IntType, HeaderError> {
        let unsupported = || HeaderError::UnsupportedDtype(descr.to_owned());
        let mut chars = descr.chars();
        let (Some(order), Some(kind)) = (chars.next(), chars.next()) else {
            return Err(unsupported());
        };
        let size: usize = chars.as_str().parse().map_err(|_| unsupported())?;
        let signed = match kind {
            'i' => true,
            'u' => false,
            'f' | 'c' => return Err(HeaderError::FloatDtype(descr.to_owned())),
            _ => return Err(unsupported()),
        };
        if !matches!(size, 1 | 2 | 4 | 8) {
            return Err(unsupported());
        }
        let little_endian = match order {
            '<' => true,
            '>' => false,
            '=' => cfg!(target_endian = "little"),
            // "Not applicable": only meaningful where there is no byte order.
            '|' if size == 1 => true,
            _ => return Err(unsupported()),
        };
        Ok(IntType {
            signed,
            size,
            little_endian,
        })
    }

    /// The value of one item, stored in `bytes` (`size` of them).
    fn value(&self, bytes: &[u8]) -> i128 {
        let size = bytes.len().min(8);
        let mut little_endian = [0u8; 8];
        for (index, slot) in little_endian.iter_mut().enumerate().take(size) {
            *slot = if self.little_endian {
                bytes[index]
            } else {
                bytes[size - 1 - index]
            };
        }
        let unsigned = u64::from_le_bytes(little_endian) as i128;
        let negative = self.signed && size > 0 && little_endian[size - 1] & 0x80 != 0;
        if negative {
            unsigned - (1i128 << (8 * size))
        } else {
            unsigned
        }
    }
}

impl fmt::Display for IntType {
    /// The numpy type string, e.g. `<i4`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let order = match (self.size, self.little_endian) {
            (1, _) => '|',
            (_, true) => '<',
            (_, false) => '>',
        };
        let kind = if self.signed { 'i' } else { 'u' };
        write!(f, "{order}{kind}{}", self.size)
    }
}

/// The layout of one codec frame: Q codes of one integer type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameFormat {
    pub dtype: IntType,
    /// Q, the number of codebooks (codes per frame).
    pub codebooks: usize,
}

impl FrameFormat {
    /// Bytes per frame.
    pub fn frame_bytes(&self) -> usize {
        self.codebooks * self.dtype.size
    }

    /// The codes of the whole frames in `payload` (bytes after a partial last frame are
    /// ignored), frame-major. `first_frame` is the index of the first one in the stream, for
    /// the error of a value that does not fit in `i16`.
    pub fn to_codes(&self, payload: &[u8], first_frame: u64) -> Result<Vec<i16>, CodeError> {
        let frame_bytes = self.frame_bytes();
        if frame_bytes == 0 {
            return Ok(Vec::new());
        }
        let frames = payload.len() / frame_bytes;
        let mut codes = Vec::with_capacity(frames * self.codebooks);
        for (frame_index, frame) in payload.chunks_exact(frame_bytes).enumerate() {
            for (codebook, item) in frame.chunks_exact(self.dtype.size).enumerate() {
                let value = self.dtype.value(item);
                let code = i16::try_from(value).map_err(|_| CodeError {
                    frame: first_frame.saturating_add(frame_index as u64),
                    codebook,
                    value,
                })?;
                codes.push(code);
            }
        }
        Ok(codes)
    }
}

/// A value that does not fit in a 16-bit code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frame {frame}, codebook {codebook}: value {value} does not fit in a signed 16-bit code")]
pub struct CodeError {
    pub frame: u64,
    pub codebook: usize,
    pub value: i128,
}

/// Why a stream's first bytes are not the header of an array of codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("not a .npy file: it does not start with the \\x93NUMPY magic")]
    NotNpy,
    #[error("unsupported .npy format version {major}.{minor} (1.0, 2.0 and 3.0 are known)")]
    UnsupportedVersion { major: u8, minor: u8 },
    #[error("the header is {length} bytes long, over the limit of {MAX_HEADER_LEN}")]
    TooLong { length: u64 },
    #[error("the header of a version 3.0 file is not valid UTF-8")]
    NotUtf8,
    #[error("malformed header at character {position}: {what}")]
    Syntax { position: usize, what: String },
    #[error("the header has no '{0}' key")]
    MissingKey(&'static str),
    #[error("the header has an unknown key {0:?}")]
    UnknownKey(String),
    #[error("the header has the key '{0}' twice")]
    DuplicateKey(String),
    #[error("the header's '{key}' must be {expected}")]
    WrongValue {
        key: &'static str,
        expected: &'static str,
    },
    #[error("dtype '{0}' is floating point: codes must be integers (int16, int32, int64, ...)")]
    FloatDtype(String),
    #[error(
        "dtype {0:?} is not supported: codes must be integers of 1, 2, 4 or 8 bytes (|i1 |u1 <i2 <u2 <i4 \
         <u4 <i8 <u8, or big-endian >i2 ...)"
    )]
    UnsupportedDtype(String),
    #[error("the array is in Fortran order: only C order is supported (save np.ascontiguousarray(codes))")]
    FortranOrder,
    #[error("shape {shape} {why}")]
    UnsupportedShape { shape: String, why: &'static str },
}

/// Reads the header at the start of `bytes`, the first bytes of a stream.
pub fn read_header(bytes: &[u8]) -> Result<HeaderRead, HeaderError> {
    let magic_seen = bytes.len().min(MAGIC.len());
    if bytes[..magic_seen] != MAGIC[..magic_seen] {
        return Err(HeaderError::NotNpy);
    }
    let (Some(&major), Some(&minor)) = (bytes.get(6), bytes.get(7)) else {
        return Ok(HeaderRead::Incomplete { needed: 10 });
    };
    let length_bytes = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => return Err(HeaderError::UnsupportedVersion { major, minor }),
    };
    let text_start = 8 + length_bytes;
    let Some(length_field) = bytes.get(8..text_start) else {
        return Ok(HeaderRead::Incomplete { needed: text_start });
    };
    let length = length_field
        .iter()
        .rev()
        .fold(0u64, |value, &byte| (value << 8) | byte as u64);
    if length > MAX_HEADER_LEN as u64 {
        return Err(HeaderError::TooLong { length });
    }
    let data_offset = text_start + length as usize;
    let Some(text) = bytes.get(text_start..data_offset) else {
        return Ok(HeaderRead::Incomplete { needed: data_offset });
    };
    // Versions 1 and 2 are latin-1 in practice, version 3 is UTF-8.
    let text: String = if major == 3 {
        std::str::from_utf8(text)
            .map_err(|_| HeaderError::NotUtf8)?
            .to_owned()
    } else {
        text.iter().map(|&byte| byte as char).collect()
    };
    let dict = HeaderDict::parse(&text)?;
    let header = dict.into_header((major, minor), data_offset)?;
    Ok(HeaderRead::Complete(header))
}

/// The three entries of a header, as written.
struct HeaderDict {
    descr: Value,
    fortran_order: Value,
    shape: Value,
}

impl HeaderDict {
    fn parse(text: &str) -> Result<HeaderDict, HeaderError> {
        let entries = literal::parse_dict(text)?;
        let (mut descr, mut fortran_order, mut shape) = (None, None, None);
        for (key, value) in entries {
            let slot = match key.as_str() {
                "descr" => &mut descr,
                "fortran_order" => &mut fortran_order,
                "shape" => &mut shape,
                _ => return Err(HeaderError::UnknownKey(key)),
            };
            if slot.replace(value).is_some() {
                return Err(HeaderError::DuplicateKey(key));
            }
        }
        Ok(HeaderDict {
            descr: descr.ok_or(HeaderError::MissingKey("descr"))?,
            fortran_order: fortran_order.ok_or(HeaderError::MissingKey("fortran_order"))?,
            shape: shape.ok_or(HeaderError::MissingKey("shape"))?,
        })
    }

    fn into_header(self, version: (u8, u8), data_offset: usize) -> Result<Header, HeaderError> {
        let Value::Str(descr) = self.descr else {
            return Err(match self.descr {
                Value::Sequence(_) => HeaderError::UnsupportedDtype("a structured dtype".into()),
                _ => HeaderError::WrongValue {
                    key: "descr",
                    expected: "a type string such as '<i8'",
                },
            });
        };
        let dtype = IntType::from_descr(&descr)?;
        match self.fortran_order {
            Value::Bool(false) => (),
            Value::Bool(true) => return Err(HeaderError::FortranOrder),
            _ => {
                return Err(HeaderError::WrongValue {
                    key: "fortran_order",
                    expected: "True or False",
                });
            }
        }
        let shape = match self.shape {
            Value::Sequence(items) => items
                .iter()
                .map(|item| match item {
                    Value::Int(value) => u64::try_from(*value).ok(),
                    _ => None,
                })
                .collect::<Option<Vec<u64>>>(),
            _ => None,
        }
        .ok_or(HeaderError::WrongValue {
            key: "shape",
            expected: "a tuple of non-negative integers",
        })?;
        let unsupported = |why| HeaderError::UnsupportedShape {
            shape: shape_string(&shape),
            why,
        };
        let (frames, codebooks) = match shape[..] {
            [frames, codebooks] | [1, frames, codebooks] => (frames, codebooks),
            [_, _, _] => {
                return Err(unsupported(
                    "is not (T, Q) or (1, T, Q): a 3-D array must hold a single sequence",
                ));
            }
            _ => {
                return Err(unsupported(
                    "is not (T, Q) or (1, T, Q): codes are a 2-D array of T frames by Q codebooks",
                ));
            }
        };
        if !(1..=MAX_CODEBOOKS).contains(&codebooks) {
            return Err(unsupported("has a number of codebooks Q outside 1..=65536"));
        }
        let format = FrameFormat {
            dtype,
            codebooks: codebooks as usize,
        };
        if frames
            .checked_mul(format.frame_bytes() as u64)
            .and_then(|bytes| bytes.checked_add(data_offset as u64))
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(unsupported("describes more data than any stream can hold"));
        }
        Ok(Header {
            version,
            data_offset,
            frames,
            format,
            shape,
        })
    }
}

fn shape_string(shape: &[u64]) -> String {
    match shape {
        [single] => format!("({single},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", dims.join(", "))
        }
    }
}
