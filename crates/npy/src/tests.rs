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
