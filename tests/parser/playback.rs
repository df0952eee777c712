//! The parser in decodebin and playbin: typefinding, duration and position queries,
//! conversions and seeks, another model's frame rate, and the pipeline scripts.

use super::*;

const TO_FLOAT_WAV: &str = "audioconvert ! audio/x-raw,format=F32LE ! wavenc ! filesink";

#[test]
fn decodebin_and_gst_play_find_parser_and_decoder() {
    let fixture = load_fixture("release-tiny");
    let dir = tempfile::tempdir().unwrap();
    let npy = temp_file(&dir, "codes.npy", &fixture_npy(&fixture, 1, "<i8", false));
    let wav = dir.path().join("decodebin.wav");
    let status = std::process::Command::new("gst-launch-1.0")
        .env("GST_PLUGIN_PATH", common::build_dir())
        .env("QWENCODEC_MODEL_PATH", &fixture.dir)
        .arg("-q")
        .arg("filesrc")
        .arg(format!("location={}", npy.display()))
        .args(["!", "decodebin", "!"])
        .args(TO_FLOAT_WAV.split(' '))
        .arg(format!("location={}", wav.display()))
        .status()
        .unwrap();
    assert!(status.success());
    fixture.assert_matches(&common::wav_f32_samples(&wav), "filesrc ! decodebin");

    // What users type: gst-play-1.0 codes.npy (playbin), here into a WAV file.
    let wav = dir.path().join("gst-play.wav");
    let output = std::process::Command::new("gst-play-1.0")
        .env("GST_PLUGIN_PATH", common::build_dir())
        .env("QWENCODEC_MODEL_PATH", &fixture.dir)
        .args(["--no-interactive", "-q"])
        .arg(format!("--audiosink={TO_FLOAT_WAV} location={}", wav.display()))
        .arg(&npy)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    fixture.assert_matches(&common::wav_f32_samples(&wav), "gst-play-1.0 codes.npy");
}

#[test]
fn the_typefinder_recognises_npy_codes() {
    init();
    let fixture = load_fixture("release-tiny");
    for (version, descr, with_batch) in [(1, "<i8", false), (2, "<i2", true), (3, "|u1", false)] {
        let bytes = fixture_npy(&fixture, version, descr, with_batch);
        let (caps, probability) =
            gst_base::functions::type_find_helper_for_data(None::<&gst::Object>, &bytes).unwrap();
        assert_eq!(caps.to_string(), "application/x-npy, codebooks=(int)16");
        assert_eq!(probability, gst::TypeFindProbability::Maximum);
    }
    // Other arrays are .npy files still (the parser will say what is wrong with them), but only
    // possibly ours: any typefinder that knows them goes first.
    for (descr, shape) in [("<f4", "(10, 16)"), ("<i2", "(2, 10, 16)")] {
        let other = npy_file(1, &dict(descr, shape), &[0; 640]);
        let (caps, probability) =
            gst_base::functions::type_find_helper_for_data(None::<&gst::Object>, &other).unwrap();
        assert_eq!(caps.to_string(), "application/x-npy", "{descr} {shape}");
        assert_eq!(probability, gst::TypeFindProbability::Possible, "{descr} {shape}");
    }
    let factory = gst::TypeFindFactory::factories()
        .into_iter()
        .find(|factory| factory.name() == "qwencodec_npy")
        .unwrap();
    assert_eq!(factory.rank(), gst::Rank::SECONDARY);
    let raw = std::fs::read(fixture.dir.join("codes.raw")).unwrap();
    if let Ok((caps, _)) = gst_base::functions::type_find_helper_for_data(None::<&gst::Object>, &raw) {
        assert_ne!(caps.structure(0).unwrap().name(), "application/x-npy");
    }
}

/// Duration and position of `filesrc ! qwencodecparse ! fakesink`, prerolled.
fn prerolled_queries(path: &Path, properties: &str) -> (Option<gst::ClockTime>, Option<gst::ClockTime>, i64) {
    init();
    let pipeline = gst::parse::launch(&format!(
        "filesrc location=\"{}\" ! qwencodecparse name=parse {properties} ! fakesink",
        path.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    pipeline.set_state(gst::State::Paused).unwrap();
    pipeline.state(gst::ClockTime::from_seconds(30)).0.unwrap();
    let duration = pipeline.query_duration::<gst::ClockTime>();
    let position = pipeline.query_position::<gst::ClockTime>();
    let parse = pipeline.by_name("parse").unwrap();
    let mut convert = gst::query::Convert::new(gst::ClockTime::from_mseconds(500), gst::Format::Bytes);
    assert!(parse.src_pads()[0].query(&mut convert));
    let bytes = convert.result().1.value();
    pipeline.set_state(gst::State::Null).unwrap();
    (duration, position, bytes)
}

#[test]
fn duration_position_and_conversions() {
    let fixture = load_fixture("release-tiny");
    let dir = tempfile::tempdir().unwrap();
    let bytes = fixture_npy(&fixture, 1, "<i4", false);
    let header = bytes.len() - fixture.codes.len() * 4;
    let path = temp_file(&dir, "codes.npy", &bytes);
    let (duration, position, bytes_at) = prerolled_queries(&path, "");
    assert_eq!(duration, Some(gst::ClockTime::from_mseconds(12_800)));
    assert_eq!(position, Some(gst::ClockTime::ZERO));
    // 500 ms is in frame 6 (480..560 ms): its bytes start after the header and six frames.
    assert_eq!(bytes_at as usize, header + 6 * 16 * 4);

    let (duration, _, _) = prerolled_queries(&path, "framerate=25/1");
    assert_eq!(duration, Some(gst::ClockTime::from_mseconds(6_400)));

    // A truncated file lasts as long as its whole frames.
    let truncated = temp_file(&dir, "short.npy", &bytes[..header + 100 * 64 + 10]);
    let (duration, _, _) = prerolled_queries(&truncated, "");
    assert_eq!(duration, Some(gst::ClockTime::from_mseconds(8_000)));
}

/// A seek plays from the target, exactly to the sample, after the parser has pushed
/// `seek-context-frames` frames before it for the decoder to warm up on (its audio is clipped).
///
/// How close the audio after a seek comes to the continuous decode depends on how far back the
/// network looks. Attention alone reaches layers × (window - 1) frames back: 3 × 5 for
/// gqa-bias, 8 × 71 for the release geometry. The tests:
/// - context back to the stream start: the continuous decode, within the fixture tolerance
///   (2.4× upstream's own float32 error);
/// - gqa-bias with the default 25 frames, more than its reach plus the convolutions': relative
///   L2 below 1e-4 (9.4e-5 measured, in pull and push mode alike: what remains decays
///   geometrically; exact from 40 frames, 1.7e-6);
/// - release-tiny with the default 25 frames, well short of its 568: only better than no
///   context at all. Random weights attend evenly over the whole window, so the first frames
///   after the target keep differing (relative L2 0.30, against 0.42 cold); how far a trained
///   model really looks back decides the context it needs.
#[test]
fn seeking_resumes_at_the_target_with_a_warmed_up_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = load_fixture("gqa-bias");
    let path = temp_file(&dir, "gqa.npy", &fixture_npy(&fixture, 1, "<i2", false));
    // 151 ms: inside frame 60 (2.5 ms each) of 120, 2416 samples in.
    let target = gst::ClockTime::from_mseconds(151);
    let expected = &fixture.audio[151 * 16..];
    let seek_error = |properties: &str, push_mode: bool| {
        let queue = if push_mode { "queue !" } else { "" };
        let run = run_pipeline(
            &format!(
                "filesrc location=\"{}\" ! {queue} qwencodecparse framerate=400/1 {properties} ! qwencodecdec \
                 model-path=\"{}\" device=cpu ! appsink name=sink",
                path.display(),
                fixture.dir.display()
            ),
            Some(target),
        );
        assert!(run.errors.is_empty(), "{}", run.errors());
        assert_eq!(run.buffers[0].pts(), Some(target), "{properties}");
        let audio = run.audio();
        assert_eq!(audio.len(), expected.len(), "{properties}");
        common::relative_l2(&audio, expected)
    };
    for push_mode in [false, true] {
        let warm = seek_error("", push_mode);
        assert!(warm < 1e-4, "default context: {warm:e}");
        let exact = seek_error("seek-context-frames=40", push_mode);
        assert!(exact <= fixture.tolerance(), "40 frames of context: {exact:e}");
        let cold = seek_error("seek-context-frames=0", push_mode);
        assert!(cold > 1e-2, "no context: {cold:e}");
    }

    let fixture = load_fixture("release-tiny");
    let path = temp_file(&dir, "release.npy", &fixture_npy(&fixture, 1, "<i2", false));
    // Inside frame 80 of 160.
    let target = gst::ClockTime::from_mseconds(6_410);
    let expected = &fixture.audio[6_410 * 24..];
    let seek_error = |properties: &str| {
        let run = decode_file(&path, &fixture, properties, Some(target));
        assert!(run.errors.is_empty(), "{}", run.errors());
        assert_eq!(run.buffers[0].pts(), Some(target), "{properties}");
        let audio = run.audio();
        assert_eq!(audio.len(), expected.len(), "{properties}");
        common::relative_l2(&audio, expected)
    };
    let exact = seek_error("seek-context-frames=80");
    assert!(exact <= fixture.tolerance(), "context from the start: {exact:e}");
    let (warm, cold) = (seek_error(""), seek_error("seek-context-frames=0"));
    assert!(warm < cold, "25 frames of context: {warm:e}, none: {cold:e}");
}

/// The parser alone after a seek: the frames from `seek-context-frames` before the target on,
/// in a segment that starts at the target. Raw codes seek too. (Seen on the parser's src pad:
/// a sink would drop the frames before the segment.)
#[test]
fn seeks_start_the_context_frames_before_the_target() {
    init();
    let fixture = load_fixture("gqa-bias");
    let dir = tempfile::tempdir().unwrap();
    let npy = temp_file(&dir, "gqa.npy", &fixture_npy(&fixture, 2, "<i4", true));
    let raw = fixture.dir.join("codes.raw");
    // 151 ms is in frame 60 (2.5 ms each); 25 frames (62.5 ms) before it is 88.5 ms, in frame
    // 35: the first frame pushed.
    let target = gst::ClockTime::from_mseconds(151);
    for (source, properties, first) in [
        (
            format!("filesrc location=\"{}\"", npy.display()),
            "framerate=400/1",
            35u64,
        ),
        (
            format!("filesrc location=\"{}\" ! queue", npy.display()),
            "framerate=400/1",
            35,
        ),
        (
            format!(
                "filesrc location=\"{}\" ! audio/x-qwen3-tts-codes,codebooks=8,framerate=400/1",
                raw.display()
            ),
            "",
            35,
        ),
        (
            format!("filesrc location=\"{}\"", npy.display()),
            "framerate=400/1 seek-context-frames=0",
            60,
        ),
    ] {
        let what = format!("{source} {properties}");
        let pipeline = gst::parse::launch(&format!(
            "{source} ! qwencodecparse name=parse {properties} ! fakesink name=sink"
        ))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
        // What left the parser since the last flush: segment start and buffers.
        let seen = Arc::new(Mutex::new((None, Vec::<gst::Buffer>::new())));
        let into = seen.clone();
        pipeline
            .by_name("parse")
            .unwrap()
            .static_pad("src")
            .unwrap()
            .add_probe(
                gst::PadProbeType::BUFFER
                    | gst::PadProbeType::EVENT_DOWNSTREAM
                    | gst::PadProbeType::EVENT_FLUSH,
                move |_, info| {
                    let mut seen = into.lock().unwrap();
                    match &info.data {
                        Some(gst::PadProbeData::Buffer(buffer)) => seen.1.push(buffer.clone()),
                        Some(gst::PadProbeData::Event(event)) => match event.view() {
                            gst::EventView::FlushStop(_) => *seen = (None, Vec::new()),
                            gst::EventView::Segment(segment) => {
                                seen.0 = Some(segment.segment().start().value())
                            }
                            _ => (),
                        },
                        _ => (),
                    }
                    gst::PadProbeReturn::Ok
                },
            );
        pipeline.set_state(gst::State::Paused).unwrap();
        pipeline.state(gst::ClockTime::from_seconds(30)).0.unwrap();
        pipeline.seek_simple(gst::SeekFlags::FLUSH, target).unwrap();
        pipeline.set_state(gst::State::Playing).unwrap();
        let bus = pipeline.bus().unwrap();
        let message = bus
            .timed_pop_filtered(
                gst::ClockTime::from_seconds(30),
                &[gst::MessageType::Eos, gst::MessageType::Error],
            )
            .unwrap();
        assert!(
            matches!(message.view(), gst::MessageView::Eos(_)),
            "{what}: {message:?}"
        );
        pipeline.set_state(gst::State::Null).unwrap();

        let (segment_start, buffers) = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(segment_start, Some(target.nseconds() as i64), "{what}");
        let run = Run {
            buffers,
            ..Default::default()
        };
        assert_eq!(
            run.buffers[0].pts(),
            Some(gst::ClockTime::from_useconds(2_500 * first)),
            "{what}"
        );
        assert_eq!(run.codes(), fixture.codes[first as usize * 8..], "{what}");
    }
}

/// A `.npy` file does not say its frame rate: through decodebin, the parser takes the rate of
/// the decoder's model, here 400 frames a second (not the released 25/2 the parser assumes
/// alone), so that the audio is exact and its timestamps too.
#[test]
fn npy_codes_of_a_model_at_another_frame_rate_play_through_decodebin() {
    init();
    let fixture = load_fixture("gqa-bias");
    let frame_rate = fixture.sample_rate as usize / fixture.samples_per_frame;
    assert_ne!(
        frame_rate * 2,
        25,
        "the fixture runs at another rate than the released one"
    );
    let dir = tempfile::tempdir().unwrap();
    let npy = temp_file(&dir, "codes.npy", &fixture_npy(&fixture, 1, "<i2", false));
    let pipeline = gst::parse::launch(&format!(
        "filesrc location=\"{}\" ! decodebin name=decode ! audioconvert ! audio/x-raw,format=F32LE \
         ! appsink name=sink",
        npy.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    // What QWENCODEC_MODEL_PATH does for gst-launch, without changing this process's environment.
    let model = fixture.dir.clone();
    pipeline
        .by_name("decode")
        .unwrap()
        .downcast::<gst::Bin>()
        .unwrap()
        .connect_element_added(move |_, element| {
            if element.factory().is_some_and(|f| f.name() == "qwencodecdec") {
                element.set_property("model-path", model.to_str().unwrap());
            }
        });
    let run = run_built(&pipeline, None);
    assert!(run.errors.is_empty(), "{}", run.errors());
    fixture.assert_matches(&run.audio(), "a 400 frames/s .npy through decodebin");
    let mut samples = 0;
    for (index, buffer) in run.buffers.iter().enumerate() {
        let at = gst::ClockTime::SECOND.mul_div_floor(samples, fixture.sample_rate as u64);
        let pts = buffer.pts().unwrap();
        assert!(
            pts.nseconds().abs_diff(at.unwrap().nseconds()) <= 1,
            "buffer {index} at {pts}, its first sample at {}",
            at.unwrap()
        );
        samples += (buffer.size() / 4) as u64;
    }
    assert_eq!(samples as usize, fixture.frames * fixture.samples_per_frame);
}

#[test]
fn npy_pipeline_scripts_run() {
    let fixture = load_fixture("release-tiny");
    let dir = tempfile::tempdir().unwrap();
    let npy = temp_file(&dir, "codes.npy", &fixture_npy(&fixture, 1, "<i8", false));
    let wav = dir.path().join("out.wav");
    common::run_script(
        "examples/pipelines/npy-to-wav.sh",
        &[&npy, &wav, &fixture.dir],
        &[],
    );
    // 16-bit samples.
    let bytes = std::fs::read(&wav).unwrap();
    assert_eq!(common::wav_chunks(&bytes).1.len(), 2 * fixture.audio.len());
    // Without arguments: the bundled codes, made into a .npy file, and the bundled checkpoint.
    let default_wav = dir.path().join("default.wav");
    std::fs::create_dir(dir.path().join("cwd")).unwrap();
    let status = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pipelines/npy-to-wav.sh"))
        .arg("")
        .arg(&default_wav)
        .env_remove("QWENCODEC_MODEL_PATH")
        .status()
        .unwrap();
    assert!(status.success());
    // Both runs give upstream's audio through audioconvert's 16-bit dither (TPDF, up to 1 LSB
    // each way, plus the rounding: measured up to 2.3 LSB), and the same dither on both: their
    // samples differ by at most the 1 LSB of a rounding that the last float bits tip (frames
    // that arrive during a step join the next one, as timing has it).
    let read = |path: &Path| -> Vec<i16> {
        let bytes = std::fs::read(path).unwrap();
        common::wav_chunks(&bytes)
            .1
            .chunks_exact(2)
            .map(|p| i16::from_le_bytes([p[0], p[1]]))
            .collect()
    };
    let (first, second) = (read(&wav), read(&default_wav));
    for samples in [&first, &second] {
        assert_eq!(samples.len(), fixture.audio.len());
        let worst = samples
            .iter()
            .zip(&fixture.audio)
            .map(|(&a, &b)| (a as f32 / 32767.0 - b).abs() * 32767.0)
            .fold(0.0, f32::max);
        assert!(worst <= 3.0, "{worst} LSB from upstream's audio");
    }
    let apart = first
        .iter()
        .zip(&second)
        .map(|(a, b)| (a - b).abs())
        .max()
        .unwrap();
    assert!(apart <= 1, "the two runs are {apart} LSB apart");

    common::run_script(
        "examples/pipelines/play-npy.sh",
        &[&npy, &fixture.dir],
        &[("AUDIO_SINK", "fakesink sync=false")],
    );
}
