//! Input the parser cannot take: each an error (or, for short data, a warning) that says what
//! was wrong, after the frames before it.

use super::*;

/// `bytes` pushed in pieces into the parser, as from a source that does not tell its size.
fn harness_run(bytes: &[u8], caps: &str, properties: &[(&str, &dyn ToValue)]) -> Run {
    init();
    let element = gst::ElementFactory::make("qwencodecparse").build().unwrap();
    for (name, value) in properties {
        element.set_property_from_value(name, &value.to_value());
    }
    harness_run_on(&element, bytes, caps)
}

/// Runs `bytes` through `element` in a harness; it is back in NULL after.
fn harness_run_on(element: &gst::Element, bytes: &[u8], caps: &str) -> Run {
    let bus = gst::Bus::new();
    element.set_bus(Some(&bus));
    let mut h = gst_check::Harness::with_element(element, Some("sink"), Some("src"));
    h.set_src_caps_str(caps);
    h.play();
    h.push_event(gst::event::Segment::new(&gst::FormattedSegment::<
        gst::format::Bytes,
    >::new()));
    for piece in bytes.chunks(100) {
        if h.push(gst::Buffer::from_slice(piece.to_vec())).is_err() {
            break;
        }
    }
    h.push_event(gst::event::Eos::new());
    let mut run = Run {
        buffers: std::iter::from_fn(|| h.try_pull()).collect(),
        caps: h.sinkpad().unwrap().current_caps(),
        ..Default::default()
    };
    (run.errors, run.warnings) = errors_and_warnings(&bus);
    run
}

/// The first 20 frames of release-tiny, as `descr` stores them.
fn twenty_frames(descr: &str) -> (Vec<i16>, Vec<u8>) {
    let codes = load_fixture("release-tiny").codes[..20 * 16].to_vec();
    let data = encode(&codes, descr);
    (codes, data)
}

#[test]
fn after_an_error_the_parser_parses_again_once_back_in_null() {
    init();
    let element = gst::ElementFactory::make("qwencodecparse").build().unwrap();
    let (codes, data) = twenty_frames("<i2");
    let good = npy_file(1, &dict("<i2", "(20, 16)"), &data);
    let mut truncated_header = good.clone();
    truncated_header.truncate(40);
    let mut bad_code = npy_file(1, &dict("<i4", "(20, 16)"), &encode(&codes, "<i4"));
    let at = bad_code.len() - 4;
    bad_code[at..].copy_from_slice(&70_000i32.to_le_bytes());
    for (bad, says) in [
        (npy_file(1, &dict("<f4", "(20, 16)"), &data), "is floating point"),
        (truncated_header, "The stream ends inside the .npy header"),
        (bad_code, "value 70000 does not fit"),
        (b"not codes".repeat(10), "it does not start with the"),
    ] {
        let run = harness_run_on(&element, &bad, "application/x-npy");
        assert!(run.errors().contains(says), "{says}: {}", run.errors());
        // Once, not again for each later buffer or when EOS drains what the failed parse left
        // (the base class adds its own "No valid frames found" at EOS where nothing was parsed).
        let posted = run.errors.iter().filter(|error| error.contains(says)).count();
        assert_eq!(posted, 1, "{says}: {}", run.errors());
        let run = harness_run_on(&element, &good, "application/x-npy");
        assert!(run.errors.is_empty(), "after {says}: {}", run.errors());
        assert_eq!(run.codes(), codes, "after {says}");
    }
}

#[test]
fn header_errors_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (_, data) = twenty_frames("<i2");
    let mut too_long = b"\x93NUMPY\x02\x00".to_vec();
    too_long.extend(20_000u32.to_le_bytes());
    too_long.extend(b"{'descr': '<i2', ".repeat(100));
    for (bytes, expected) in [
        (
            npy_file(1, &dict("<f4", "(20, 16)"), &data),
            "Invalid .npy header: dtype '<f4' is floating point: codes must be integers",
        ),
        (
            npy_file(3, &dict(">f8", "(20, 16)"), &data),
            "Invalid .npy header: dtype '>f8' is floating point",
        ),
        (
            npy_file(1, &dict("<U8", "(20, 16)"), &data),
            "Invalid .npy header: dtype \"<U8\" is not supported: codes must be integers",
        ),
        (
            npy_file(
                1,
                "{'descr': '<i2', 'fortran_order': True, 'shape': (20, 16), }",
                &data,
            ),
            "Invalid .npy header: the array is in Fortran order: only C order is supported",
        ),
        (
            npy_file(2, &dict("<i2", "(2, 10, 16)"), &data),
            "Invalid .npy header: shape (2, 10, 16) is not (T, Q) or (1, T, Q): a 3-D array must hold a \
             single sequence",
        ),
        (
            npy_file(1, &dict("<i2", "(320,)"), &data),
            "Invalid .npy header: shape (320,) is not (T, Q) or (1, T, Q)",
        ),
        (
            npy_file(1, "{'descr': '<i2', 'shape': (20, 16), }", &data),
            "Invalid .npy header: the header has no 'fortran_order' key",
        ),
        (
            npy_file(
                1,
                "{'descr': '<i2', 'fortran_order': False, 'shape': (20, 16)",
                &data,
            ),
            "Invalid .npy header: malformed header at character",
        ),
        (
            too_long,
            "Invalid .npy header: the header is 20000 bytes long, over the limit of 10000",
        ),
        (
            b"\x93NUMPY\x09\x00\x40\x00".repeat(10),
            "Invalid .npy header: unsupported .npy format version 9.0",
        ),
    ] {
        for push_mode in [false, true] {
            let path = temp_file(&dir, "bad.npy", &bytes);
            let run = parse_file(&path, push_mode, "");
            assert!(run.errors().contains(expected), "{expected}: {}", run.errors());
            assert_eq!(run.errors.len(), 1, "{expected}: {}", run.errors());
            assert!(run.buffers.is_empty());
        }
    }
}

#[test]
fn a_header_that_declares_less_data_than_follows_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (codes, data) = twenty_frames("<i2");
    let bytes = npy_file(1, &dict("<i2", "(10, 16)"), &data);
    // Where the size is known, before anything is pushed.
    let path = temp_file(&dir, "lies.npy", &bytes);
    for push_mode in [false, true] {
        let run = parse_file(&path, push_mode, "");
        assert!(
            run.errors().contains(
                "The .npy header lies about the size: the .npy header (shape (10, 16), dtype <i2) has 320 \
                 bytes of data, but 640 bytes follow it"
            ),
            "{}",
            run.errors()
        );
        assert!(run.buffers.is_empty());
    }
    // Where it is not, once the surplus comes, after the declared frames.
    let run = harness_run(&bytes, "application/x-npy", &[]);
    assert!(
        run.errors().contains("has 320 bytes of data, but more follow it"),
        "{}",
        run.errors()
    );
    assert_eq!(run.codes(), codes[..10 * 16]);
}

#[test]
fn truncated_data_is_decoded_as_far_as_it_goes_then_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (codes, data) = twenty_frames("<i4");
    let header = npy_file(1, &dict("<i4", "(20, 16)"), &[]);
    // 12 frames and half of the 13th.
    let cut = [header.as_slice(), &data[..12 * 64 + 32]].concat();
    let expected = "Truncated .npy data: the .npy header (shape (20, 16), dtype <i4) declares 20 frames, the \
                    data holds 12 whole frames and 32 bytes of an incomplete frame (dropped)";
    let path = temp_file(&dir, "cut.npy", &cut);
    for push_mode in [false, true] {
        let run = parse_file(&path, push_mode, "frames-per-buffer=5");
        assert!(run.errors.is_empty(), "{}", run.errors());
        assert_eq!(run.warnings.len(), 1, "{}", run.warnings());
        assert!(run.warnings().contains(expected), "{}", run.warnings());
        assert_eq!(run.codes(), codes[..12 * 16]);
    }
    let run = harness_run(&cut, "application/x-npy", &[]);
    assert!(run.warnings().contains(expected), "{}", run.warnings());
    assert_eq!(run.codes(), codes[..12 * 16]);
    // Cut on a frame boundary, from a source that does not tell its size: known at EOS.
    let run = harness_run(&cut[..cut.len() - 32], "application/x-npy", &[]);
    assert!(
        run.warnings()
            .contains("declares 20 frames, the data holds 12 whole frames"),
        "{}",
        run.warnings()
    );

    // Through the decoder: the audio of the whole frames, then the warning.
    let fixture = load_fixture("release-tiny");
    let run = decode_file(&path, &fixture, "", None);
    assert!(run.warnings().contains(expected), "{}", run.warnings());
    fixture.assert_prefix_matches(&run.audio(), 12, "the whole frames of truncated .npy data");

    // Raw codes that end in a partial frame.
    let raw = [encode(&codes, "<i2").as_slice(), &[1, 2, 3, 4]].concat();
    let path = temp_file(&dir, "codes.raw", &raw);
    let run = run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! audio/x-qwen3-tts-codes,codebooks=16 ! qwencodecparse ! appsink name=sink",
            path.display()
        ),
        None,
    );
    assert!(
        run.warnings()
            .contains("Dropped 4 bytes at the end of the stream: an incomplete frame"),
        "{}",
        run.warnings()
    );
    assert_eq!(run.codes(), codes);
}

#[test]
fn a_truncated_header_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_, data) = twenty_frames("<i2");
    let bytes = npy_file(1, &dict("<i2", "(20, 16)"), &data);
    let path = temp_file(&dir, "cut.npy", &bytes[..40]);
    for push_mode in [false, true] {
        let run = parse_file(&path, push_mode, "");
        assert!(
            run.errors()
                .contains("The stream ends inside the .npy header: it holds 40 bytes, the header needs 128"),
            "{}",
            run.errors()
        );
    }
    let run = harness_run(&bytes[..40], "application/x-npy", &[]);
    assert!(
        run.errors()
            .contains("The stream ends inside the .npy header: it holds 40 bytes, the header needs 128"),
        "{}",
        run.errors()
    );
}

#[test]
fn codes_that_do_not_fit_16_bits_are_an_error_after_the_frames_before() {
    let dir = tempfile::tempdir().unwrap();
    let (codes, _) = twenty_frames("<i4");
    let mut wide: Vec<i64> = codes.iter().map(|&c| c as i64).collect();
    wide[5 * 16 + 3] = 70_000;
    let data: Vec<u8> = wide.iter().flat_map(|&c| (c as i32).to_le_bytes()).collect();
    let path = temp_file(&dir, "wide.npy", &npy_file(1, &dict("<i4", "(20, 16)"), &data));
    let run = parse_file(&path, false, "");
    assert!(
        run.errors().contains(
            "Code out of range: frame 5, codebook 3: value 70000 does not fit in a signed 16-bit code"
        ),
        "{}",
        run.errors()
    );
    assert_eq!(run.codes(), codes[..5 * 16]);
}

#[test]
fn input_that_is_neither_npy_nor_described_by_caps_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = temp_file(&dir, "noise.bin", &[7u8; 1000]);
    let run = parse_file(&path, false, "");
    assert!(
        run.errors().contains(
            "Cannot tell what the input is: it is not a .npy file, and no caps say \
             audio/x-qwen3-tts-codes,codebooks=Q"
        ),
        "{}",
        run.errors()
    );
}

#[test]
fn a_stream_that_does_not_fit_the_model_is_refused_by_the_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let release = load_fixture("release-tiny");
    let path = temp_file(&dir, "codes.npy", &fixture_npy(&release, 1, "<i2", false));
    let run = decode_file(&path, &load_fixture("gqa-bias"), "", None);
    assert!(
        run.errors()
            .contains("codebooks=16 (model has 8), framerate=400 (model has 400)"),
        "{}",
        run.errors()
    );
    assert!(run.buffers.is_empty());
}
