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

/// The first bytes of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The longest header accepted, in bytes: numpy's own default `max_header_size`, past which it
/// refuses to evaluate a header.
pub const MAX_HEADER_LEN: usize = 10_000;

/// The most codebooks a frame may have (a frame is then at most 512 KiB).
pub const MAX_CODEBOOKS: u64 = 65_536;

/// Tuples nested deeper than this in a header are refused, so that recursion stays shallow.
const MAX_NESTING: usize = 16;

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
        let mut parser = Parser {
            chars: text.chars().collect(),
            position: 0,
        };
        let entries = parser.dict()?;
        parser.skip_whitespace();
        if parser.position != parser.chars.len() {
            return Err(parser.error("unexpected text after the dict"));
        }
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

/// The Python literals a header holds.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    Int(i128),
    None,
    /// A tuple or a list.
    Sequence(Vec<Value>),
}

/// A parser for the subset of Python literals that numpy writes in headers: a dict of strings,
/// booleans, integers (with Python 2's `L` suffix) and tuples or lists of them.
struct Parser {
    chars: Vec<char>,
    position: usize,
}

impl Parser {
    fn error(&self, what: &str) -> HeaderError {
        HeaderError::Syntax {
            position: self.position,
            what: what.to_owned(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.position).copied()
    }

    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(|c| matches!(c, ' ' | '\t' | '\n' | '\r')) {
            self.position += 1;
        }
    }

    fn expect(&mut self, wanted: char) -> Result<(), HeaderError> {
        self.skip_whitespace();
        if self.peek() == Some(wanted) {
            self.position += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected '{wanted}'")))
        }
    }

    /// Whether the next non-blank character is `wanted`; consumes it if so.
    fn accept(&mut self, wanted: char) -> bool {
        self.skip_whitespace();
        let found = self.peek() == Some(wanted);
        if found {
            self.position += 1;
        }
        found
    }

    fn dict(&mut self) -> Result<Vec<(String, Value)>, HeaderError> {
        self.expect('{')?;
        let mut entries = Vec::new();
        while !self.accept('}') {
            self.skip_whitespace();
            let Value::Str(key) = self.value(1)? else {
                return Err(self.error("dict keys must be strings"));
            };
            self.expect(':')?;
            let value = self.value(1)?;
            entries.push((key, value));
            if !self.accept(',') {
                self.expect('}')?;
                break;
            }
        }
        Ok(entries)
    }

    fn value(&mut self, depth: usize) -> Result<Value, HeaderError> {
        if depth > MAX_NESTING {
            return Err(self.error("nested too deeply"));
        }
        self.skip_whitespace();
        match self.peek() {
            Some(quote @ ('\'' | '"')) => self.string(quote),
            Some(open @ ('(' | '[')) => {
                let close = if open == '(' { ')' } else { ']' };
                self.position += 1;
                let mut items = Vec::new();
                while !self.accept(close) {
                    items.push(self.value(depth + 1)?);
                    if !self.accept(',') {
                        self.expect(close)?;
                        break;
                    }
                }
                Ok(Value::Sequence(items))
            }
            Some(c) if c.is_ascii_digit() || c == '-' => self.integer(),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.position;
                while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    self.position += 1;
                }
                let word: String = self.chars[start..self.position].iter().collect();
                match word.as_str() {
                    "True" => Ok(Value::Bool(true)),
                    "False" => Ok(Value::Bool(false)),
                    "None" => Ok(Value::None),
                    _ => {
                        self.position = start;
                        Err(self.error(&format!("unexpected name {word:?}")))
                    }
                }
            }
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("the header ends early")),
        }
    }

    fn integer(&mut self) -> Result<Value, HeaderError> {
        let negative = self.peek() == Some('-');
        if negative {
            self.position += 1;
        }
        let start = self.position;
        let mut value: i128 = 0;
        while let Some(digit) = self.peek().and_then(|c| c.to_digit(10)) {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(digit as i128))
                .filter(|v| *v <= u64::MAX as i128)
                .ok_or_else(|| self.error("integer too large"))?;
            self.position += 1;
        }
        if self.position == start {
            return Err(self.error("expected digits"));
        }
        // Python 2's long integers, as in headers numpy wrote then.
        if matches!(self.peek(), Some('L' | 'l')) {
            self.position += 1;
        }
        Ok(Value::Int(if negative { -value } else { value }))
    }

    fn string(&mut self, quote: char) -> Result<Value, HeaderError> {
        self.position += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(c) if c == quote => {
                    self.position += 1;
                    return Ok(Value::Str(text));
                }
                Some('\\') => {
                    self.position += 1;
                    match self.peek() {
                        None => return Err(self.error("unterminated string")),
                        Some('n') => text.push('\n'),
                        Some('t') => text.push('\t'),
                        Some(escaped) => text.push(escaped),
                    }
                    self.position += 1;
                }
                Some(c) => {
                    text.push(c);
                    self.position += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A header as numpy writes it: the dict padded with spaces and a newline to a multiple
    /// of 64 bytes.
    fn npy(version: u8, dict: &str) -> Vec<u8> {
        let length_bytes = if version == 1 { 2 } else { 4 };
        let unpadded = 8 + length_bytes + dict.len() + 1;
        let text = format!("{dict}{}\n", " ".repeat(unpadded.next_multiple_of(64) - unpadded));
        let mut bytes = MAGIC.to_vec();
        bytes.extend([version, 0]);
        bytes.extend(&(text.len() as u32).to_le_bytes()[..length_bytes]);
        bytes.extend(text.as_bytes());
        bytes
    }

    fn dict(descr: &str, fortran: &str, shape: &str) -> String {
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
    }

    fn complete(bytes: &[u8]) -> Header {
        match read_header(bytes) {
            Ok(HeaderRead::Complete(header)) => header,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_every_version() {
        for version in 1..=3 {
            let bytes = npy(version, &dict("<i2", "False", "(160, 16)"));
            let header = complete(&bytes);
            assert_eq!(header.version, (version, 0));
            assert_eq!(header.data_offset, bytes.len());
            assert_eq!(header.data_offset % 64, 0);
            assert_eq!((header.frames, header.format.codebooks), (160, 16));
            assert_eq!(header.format.dtype, IntType::I16_LE);
            assert_eq!(header.data_bytes(), 160 * 16 * 2);
        }
    }

    #[test]
    fn reads_every_integer_dtype() {
        for (descr, signed, size, little_endian) in [
            ("|i1", true, 1, true),
            ("|u1", false, 1, true),
            ("<i1", true, 1, true),
            ("<i2", true, 2, true),
            (">i2", true, 2, false),
            ("<u2", false, 2, true),
            (">u2", false, 2, false),
            ("<i4", true, 4, true),
            (">i4", true, 4, false),
            ("<u4", false, 4, true),
            (">u4", false, 4, false),
            ("<i8", true, 8, true),
            (">i8", true, 8, false),
            ("<u8", false, 8, true),
            (">u8", false, 8, false),
            ("=i4", true, 4, cfg!(target_endian = "little")),
        ] {
            let header = complete(&npy(1, &dict(descr, "False", "(3, 4)")));
            let expected = IntType {
                signed,
                size,
                little_endian,
            };
            assert_eq!(header.format.dtype, expected, "{descr}");
            if !matches!(descr, "<i1" | "=i4") {
                assert_eq!(expected.to_string(), descr);
            }
        }
    }

    #[test]
    fn reads_both_shapes_and_old_spellings() {
        let header = complete(&npy(1, &dict("<i8", "False", "(1, 7, 16)")));
        assert_eq!((header.frames, header.format.codebooks), (7, 16));
        assert_eq!(header.shape_string(), "(1, 7, 16)");
        // Python 2 longs, a list, double quotes, no trailing comma, other spacing.
        let header = complete(&npy(
            1,
            "{\"descr\":\"<i4\",\"fortran_order\":False,\"shape\":[5L,8L]}",
        ));
        assert_eq!((header.frames, header.format.codebooks), (5, 8));
        let header = complete(&npy(3, &dict("<i2", "False", "(0, 16)")));
        assert_eq!(header.frames, 0);
    }

    #[test]
    fn asks_for_more_bytes_until_the_header_is_whole() {
        let bytes = npy(2, &dict("<i2", "False", "(10, 16)"));
        let mut needed = 0;
        for length in 0..bytes.len() {
            match read_header(&bytes[..length]) {
                Ok(HeaderRead::Incomplete { needed: more }) => {
                    assert!(more > length && more <= bytes.len(), "{length}: {more}");
                    assert!(more >= needed);
                    needed = more;
                }
                other => panic!("{length} bytes: {other:?}"),
            }
        }
        assert_eq!(needed, bytes.len());
        complete(&bytes);
    }

    #[test]
    fn says_what_is_wrong() {
        let error = |bytes: &[u8]| read_header(bytes).unwrap_err();
        assert_eq!(error(b"RIFF\0\0\0\0WAVE"), HeaderError::NotNpy);
        assert_eq!(error(b"\x93NUMPX"), HeaderError::NotNpy);
        assert_eq!(
            error(b"\x93NUMPY\x04\x00\x10\x00"),
            HeaderError::UnsupportedVersion { major: 4, minor: 0 }
        );
        assert_eq!(
            error(b"\x93NUMPY\x02\x00\x00\x00\x01\x00"),
            HeaderError::TooLong { length: 65536 }
        );
        assert_eq!(
            error(&npy(1, &dict("<f4", "False", "(3, 4)"))),
            HeaderError::FloatDtype("<f4".into())
        );
        assert_eq!(
            error(&npy(1, &dict("<f8", "False", "(3, 4)"))).to_string(),
            "dtype '<f8' is floating point: codes must be integers (int16, int32, int64, ...)"
        );
        for descr in ["<U4", "|b1", "|O", "<i3", "|i2", "<i16", "", "<"] {
            assert_eq!(
                error(&npy(1, &dict(descr, "False", "(3, 4)"))),
                HeaderError::UnsupportedDtype(descr.into()),
                "{descr}"
            );
        }
        assert_eq!(
            error(&npy(
                1,
                "{'descr': [('a', '<i2')], 'fortran_order': False, 'shape': (3,), }"
            )),
            HeaderError::UnsupportedDtype("a structured dtype".into())
        );
        assert_eq!(
            error(&npy(1, &dict("<i2", "True", "(3, 4)"))),
            HeaderError::FortranOrder
        );
        for (shape, message) in [
            (
                "(5,)",
                "shape (5,) is not (T, Q) or (1, T, Q): codes are a 2-D array",
            ),
            ("()", "shape () is not (T, Q) or (1, T, Q)"),
            (
                "(2, 5, 4)",
                "shape (2, 5, 4) is not (T, Q) or (1, T, Q): a 3-D array must hold a single",
            ),
            ("(1, 1, 5, 4)", "shape (1, 1, 5, 4) is not"),
            (
                "(5, 0)",
                "shape (5, 0) has a number of codebooks Q outside 1..=65536",
            ),
            ("(5, 65537)", "outside 1..=65536"),
            (
                "(18446744073709551615, 16)",
                "describes more data than any stream can hold",
            ),
        ] {
            let text = error(&npy(1, &dict("<i2", "False", shape))).to_string();
            assert!(
                text.starts_with(message) || text.contains(message),
                "{shape}: {text}"
            );
        }
        assert_eq!(
            error(&npy(1, &dict("<i2", "False", "(-5, 4)"))),
            HeaderError::WrongValue {
                key: "shape",
                expected: "a tuple of non-negative integers"
            }
        );
        assert_eq!(
            error(&npy(1, "{'descr': '<i2', 'shape': (3, 4), }")),
            HeaderError::MissingKey("fortran_order")
        );
        assert_eq!(
            error(&npy(
                1,
                "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 4), 'x': 1}"
            )),
            HeaderError::UnknownKey("x".into())
        );
        assert_eq!(
            error(&npy(
                1,
                "{'descr': '<i2', 'descr': '<i2', 'fortran_order': False, 'shape': (3, 4)}"
            )),
            HeaderError::DuplicateKey("descr".into())
        );
        assert!(matches!(
            error(&npy(
                1,
                "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 4)"
            )),
            HeaderError::Syntax { .. }
        ));
        assert!(matches!(
            error(&npy(
                1,
                "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 4)} junk"
            )),
            HeaderError::Syntax { .. }
        ));
        let mut bad_utf8 = npy(3, &dict("<i2", "False", "(3, 4)"));
        bad_utf8[15] = 0xff;
        assert_eq!(error(&bad_utf8), HeaderError::NotUtf8);
        let deep = format!(
            "{{'descr': '<i2', 'fortran_order': False, 'shape': {}3{}}}",
            "(".repeat(100),
            ")".repeat(100)
        );
        assert!(matches!(error(&npy(1, &deep)), HeaderError::Syntax { .. }));
    }

    #[test]
    fn converts_every_type_and_byte_order_and_checks_the_range() {
        for descr in [
            "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", ">u4", "<i8", ">i8", "<u8", ">u8",
        ] {
            let dtype = IntType::from_descr(descr).unwrap();
            let codes: [i64; 6] = if dtype.size == 1 {
                [0, 1, 200, 255, 100, 7]
            } else {
                [0, 1, 2047, 255, 100, 7]
            };
            let mut payload = Vec::new();
            for &code in &codes {
                let bytes = code.to_le_bytes();
                let mut item = bytes[..dtype.size].to_vec();
                if !dtype.little_endian {
                    item.reverse();
                }
                payload.extend(item);
            }
            let format = FrameFormat { dtype, codebooks: 3 };
            let expected: Vec<i16> = codes.iter().map(|&c| c as i16).collect();
            assert_eq!(format.to_codes(&payload, 0).unwrap(), expected, "{descr}");
            // A partial last frame is left alone.
            assert_eq!(
                format.to_codes(&payload[..payload.len() - 1], 0).unwrap().len(),
                3,
                "{descr}"
            );
        }
        let signed = |descr, bytes: &[u8]| IntType::from_descr(descr).unwrap().value(bytes);
        assert_eq!(signed("|i1", &[0xff]), -1);
        assert_eq!(signed("|u1", &[0xff]), 255);
        assert_eq!(signed("<i2", &[0x00, 0x80]), -32768);
        assert_eq!(signed(">i4", &[0xff, 0xff, 0xff, 0xfe]), -2);
        assert_eq!(signed("<i8", &i64::MIN.to_le_bytes()), i64::MIN as i128);
        assert_eq!(signed(">u8", &u64::MAX.to_be_bytes()), u64::MAX as i128);

        let format = FrameFormat {
            dtype: IntType::from_descr("<i4").unwrap(),
            codebooks: 4,
        };
        let mut payload: Vec<u8> = [1i32, 2, 3, 4, 5, 6, 70000, 8]
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        let error = format.to_codes(&payload, 10).unwrap_err();
        assert_eq!(
            error,
            CodeError {
                frame: 11,
                codebook: 2,
                value: 70000
            }
        );
        assert_eq!(
            error.to_string(),
            "frame 11, codebook 2: value 70000 does not fit in a signed 16-bit code"
        );
        payload[24..28].copy_from_slice(&(-32769i32).to_le_bytes());
        assert_eq!(format.to_codes(&payload, 0).unwrap_err().value, -32769);
    }

    /// Bytes that headers are made of, for mutations that reach deep into the parser.
    const PUNCTUATION: &[u8] = b"(),'0123456789L:{} TrueFalsN\"\\[]-";

    /// The fuzz target's property, on random and mutated headers: never a panic, and a
    /// complete header is consistent.
    #[test]
    fn never_panics_on_any_bytes() {
        let mut rng = StdRng::seed_from_u64(7);
        let seeds = [
            npy(1, &dict("<i2", "False", "(160, 16)")),
            npy(3, &dict(">u8", "False", "(1, 7, 16)")),
            npy(
                2,
                "{'descr': [('a', '<i2')], 'fortran_order': False, 'shape': ((3L,),), }",
            ),
        ];
        for round in 0..20_000 {
            let bytes: Vec<u8> = if round % 4 == 0 {
                let length = rng.random_range(0..200);
                let mut bytes: Vec<u8> = (0..length).map(|_| rng.random()).collect();
                if round % 8 == 0 {
                    // Keep the magic, so that the rest gets looked at.
                    bytes.splice(..length.min(8), MAGIC.iter().copied().chain([1, 0]));
                }
                bytes
            } else {
                let mut bytes = seeds[round % seeds.len()].clone();
                for _ in 0..rng.random_range(1..6) {
                    let at = rng.random_range(0..bytes.len());
                    match rng.random_range(0..4) {
                        0 => bytes[at] = rng.random(),
                        1 => bytes[at] = PUNCTUATION[rng.random_range(0..PUNCTUATION.len())],
                        2 => {
                            bytes.remove(at);
                        }
                        _ => bytes.truncate(at),
                    }
                    if bytes.is_empty() {
                        break;
                    }
                }
                bytes
            };
            check_consistent(&bytes);
        }
    }

    /// What the fuzz target asserts about any input.
    fn check_consistent(bytes: &[u8]) {
        match read_header(bytes) {
            Ok(HeaderRead::Complete(header)) => {
                assert!(header.data_offset <= bytes.len());
                assert!(header.format.codebooks >= 1);
                let payload = &bytes[header.data_offset..];
                if let Ok(codes) = header.format.to_codes(payload, 0) {
                    assert_eq!(
                        codes.len(),
                        payload.len() / header.format.frame_bytes() * header.format.codebooks
                    );
                }
            }
            Ok(HeaderRead::Incomplete { needed }) => assert!(needed > bytes.len()),
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
}
