//! What the parser pushes: whole frames of codes with exact times, from every kind of `.npy`
//! file and from raw codes, and the audio they decode to.

use super::*;

#[test]
fn every_version_dtype_byte_order_and_shape_gives_the_same_codes() {
    let fixture = load_fixture("release-tiny");
    let dir = tempfile::tempdir().unwrap();
    for version in 1..=3 {
        for descr in DTYPES {
            for with_batch in [false, true] {
                // One-byte types hold small codes only.
                let codes: Vec<i16> = if descr.ends_with('1') {
                    fixture.codes.iter().map(|code| code % 100).collect()
                } else {
                    fixture.codes.clone()
                };
                let bytes = codes_npy(&codes, 16, version, descr, with_batch);
                let path = temp_file(&dir, "codes.npy", &bytes);
                let what = format!("version {version}, {descr}, batch {with_batch}");
                // Push mode too, on a few.
                let push_mode = version == 2 && with_batch;
                let run = parse_file(&path, push_mode, "");
                assert!(run.errors.is_empty(), "{what}: {}", run.errors());
                assert!(run.warnings.is_empty(), "{what}: {}", run.warnings());
                assert_eq!(run.codes(), codes, "{what}");
                assert_codes_caps(&run, 16, gst::Fraction::new(25, 2));
                assert_timestamps(&run, 160, 16, gst::Fraction::new(25, 2), 1);
            }
        }
    }
}

#[test]
fn pieces_pushed_at_random_give_whole_frames_and_exact_times() {
    init();
    let fixture = load_fixture("gqa-bias");
    let bytes = fixture_npy(&fixture, 3, ">i8", false);
    let mut rng = StdRng::seed_from_u64(5);
    for per_buffer in [1u32, 3, 7] {
        // Properties are read at start.
        let element = gst::ElementFactory::make("qwencodecparse")
            .property("frames-per-buffer", per_buffer)
            .property("framerate", gst::Fraction::new(400, 1))
            .build()
            .unwrap();
        let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
        h.set_src_caps_str("application/x-npy");
        h.play();
        // As from a byte source, so that times come from the parser.
        h.push_event(gst::event::Segment::new(&gst::FormattedSegment::<
            gst::format::Bytes,
        >::new()));
        let mut at = 0;
        while at < bytes.len() {
            let size = rng.random_range(1..=100).min(bytes.len() - at);
            h.push(gst::Buffer::from_slice(bytes[at..at + size].to_vec()))
                .unwrap();
            at += size;
        }
        h.push_event(gst::event::Eos::new());
        let run = Run {
            buffers: std::iter::from_fn(|| h.try_pull()).collect(),
            caps: h.sinkpad().unwrap().current_caps(),
            ..Default::default()
        };
        assert_eq!(run.codes(), fixture.codes, "{per_buffer} frames per buffer");
        assert_codes_caps(&run, 8, gst::Fraction::new(400, 1));
        assert_timestamps(
            &run,
            fixture.frames as u64,
            8,
            gst::Fraction::new(400, 1),
            per_buffer as u64,
        );
    }
}

#[test]
fn raw_codes_take_codebooks_and_framerate_from_caps() {
    let fixture = load_fixture("gqa-bias");
    let raw = fixture.dir.join("codes.raw");
    for queue in ["", "queue !"] {
        let run = run_pipeline(
            &format!(
                "filesrc location=\"{}\" ! audio/x-qwen3-tts-codes,codebooks=8,framerate=400/1 ! {queue} \
                 qwencodecparse frames-per-buffer=4 ! appsink name=sink",
                raw.display()
            ),
            None,
        );
        assert!(run.errors.is_empty(), "{}", run.errors());
        assert_eq!(run.codes(), fixture.codes);
        assert_codes_caps(&run, 8, gst::Fraction::new(400, 1));
        assert_timestamps(&run, fixture.frames as u64, 8, gst::Fraction::new(400, 1), 4);
    }
    // Without framerate in the caps, the property gives it.
    let run = run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! audio/x-qwen3-tts-codes,codebooks=8 ! qwencodecparse framerate=400/1 \
             ! appsink name=sink",
            raw.display()
        ),
        None,
    );
    assert_codes_caps(&run, 8, gst::Fraction::new(400, 1));
}

#[test]
fn parser_then_decoder_matches_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = load_fixture("release-tiny");
    let path = temp_file(&dir, "release.npy", &fixture_npy(&fixture, 1, "<i8", true));
    let run = decode_file(&path, &fixture, "frames-per-buffer=3", None);
    assert!(run.errors.is_empty(), "{}", run.errors());
    fixture.assert_matches(
        &run.audio(),
        "filesrc ! qwencodecparse ! qwencodecdec, .npy <i8 (1, T, Q)",
    );

    let fixture = load_fixture("gqa-bias");
    let path = temp_file(&dir, "gqa.npy", &fixture_npy(&fixture, 2, ">u2", false));
    let run = decode_file(&path, &fixture, "framerate=400/1", None);
    fixture.assert_matches(
        &run.audio(),
        "filesrc ! qwencodecparse ! qwencodecdec, .npy >u2 (T, Q)",
    );

    let run = run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! audio/x-qwen3-tts-codes,codebooks=8,framerate=400/1 ! qwencodecparse ! \
             qwencodecdec model-path=\"{}\" device=cpu ! appsink name=sink",
            fixture.dir.join("codes.raw").display(),
            fixture.dir.display()
        ),
        None,
    );
    fixture.assert_matches(&run.audio(), "raw codes through qwencodecparse ! qwencodecdec");
}
