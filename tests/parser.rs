//! qwencodecparse and the .npy typefinder: alone, before qwencodecdec, and in decodebin and
//! playbin. The .npy files are written here, header bytes and all.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{Fixture, describe, errors_and_warnings, init, load_fixture};
use gst::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every integer type string the parser takes, with byte orders.
const DTYPES: [&str; 16] = [
    "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", ">u4", "<i8", ">i8", "<u8", ">u8", "=i2",
    "=u8",
];

/// A .npy file as numpy writes it: magic, version, header length (u16 for version 1, u32
/// after), the dict padded with spaces and a newline to a multiple of 64 bytes, the data.
fn npy_file(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let length_bytes = if version == 1 { 2 } else { 4 };
    let unpadded = 8 + length_bytes + dict.len() + 1;
    let text = format!("{dict}{}\n", " ".repeat(unpadded.next_multiple_of(64) - unpadded));
    let mut bytes = b"\x93NUMPY".to_vec();
    bytes.extend([version, 0]);
    bytes.extend(&(text.len() as u32).to_le_bytes()[..length_bytes]);
    bytes.extend(text.as_bytes());
    bytes.extend(data);
    bytes
}

fn dict(descr: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
}

/// `codes` stored as `descr` says.
fn encode(codes: &[i16], descr: &str) -> Vec<u8> {
    let size: usize = descr[2..].parse().unwrap();
    let big_endian = descr.starts_with('>') || (descr.starts_with('=') && cfg!(target_endian = "big"));
    codes
        .iter()
        .flat_map(|&code| {
            let mut item = (code as i64).to_le_bytes()[..size].to_vec();
            if big_endian {
                item.reverse();
            }
            item
        })
        .collect()
}

/// Frame-major `codes` of `codebooks` each as a .npy file of `descr`, shaped (T, Q) or, with
/// `with_batch`, (1, T, Q).
fn codes_npy(codes: &[i16], codebooks: usize, version: u8, descr: &str, with_batch: bool) -> Vec<u8> {
    let frames = codes.len() / codebooks;
    let shape = if with_batch {
        format!("(1, {frames}, {codebooks})")
    } else {
        format!("({frames}, {codebooks})")
    };
    npy_file(version, &dict(descr, &shape), &encode(codes, descr))
}

fn fixture_npy(fixture: &Fixture, version: u8, descr: &str, with_batch: bool) -> Vec<u8> {
    codes_npy(&fixture.codes, fixture.codebooks, version, descr, with_batch)
}

fn temp_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// What a pipeline ending in `appsink name=sink` gave.
#[derive(Default)]
struct Run {
    buffers: Vec<gst::Buffer>,
    caps: Option<gst::Caps>,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Run {
    fn codes(&self) -> Vec<i16> {
        self.buffers
            .iter()
            .flat_map(|buffer| {
                let map = buffer.map_readable().unwrap();
                map.chunks_exact(2)
                    .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn audio(&self) -> Vec<f32> {
        self.buffers
            .iter()
            .flat_map(|buffer| {
                let map = buffer.map_readable().unwrap();
                map.chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn errors(&self) -> String {
        self.errors.join("\n")
    }

    fn warnings(&self) -> String {
        self.warnings.join("\n")
    }
}

/// Runs a gst-launch description ending in `appsink name=sink` to EOS or an error. With a
/// seek target, prerolls, seeks there (flushing) and plays from there.
fn run_pipeline(description: &str, seek: Option<gst::ClockTime>) -> Run {
    init();
    let pipeline = gst::parse::launch(description)
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
    run_built(&pipeline, seek)
}

/// What `run_pipeline` does, on a pipeline already made.
fn run_built(pipeline: &gst::Pipeline, seek: Option<gst::ClockTime>) -> Run {
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    sink.set_sync(false);
    let collected = Arc::new(Mutex::new(Run::default()));
    let into = collected.clone();
    sink.set_callbacks(
        gst_app::AppSinkCallbacks::builder()
            .new_sample(move |sink| {
                let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                let mut run = into.lock().unwrap();
                run.buffers.push(sample.buffer_owned().unwrap());
                run.caps = sample.caps_owned();
                Ok(gst::FlowSuccess::Ok)
            })
            .build(),
    );
    let bus = pipeline.bus().unwrap();
    let mut messages = Vec::new();
    if let Some(target) = seek {
        pipeline.set_state(gst::State::Paused).unwrap();
        let (prerolled, _, _) = pipeline.state(gst::ClockTime::from_seconds(60));
        assert!(prerolled.is_ok(), "preroll: {prerolled:?}");
        pipeline.seek_simple(gst::SeekFlags::FLUSH, target).expect("seek");
        pipeline.state(gst::ClockTime::from_seconds(60)).0.unwrap();
    }
    pipeline.set_state(gst::State::Playing).unwrap();
    while let Some(message) = bus.timed_pop_filtered(
        gst::ClockTime::from_seconds(120),
        &[
            gst::MessageType::Eos,
            gst::MessageType::Error,
            gst::MessageType::Warning,
        ],
    ) {
        match message.view() {
            gst::MessageView::Warning(_) => messages.extend(describe(&message).map(|text| (false, text))),
            gst::MessageView::Error(_) => {
                messages.extend(describe(&message).map(|text| (true, text)));
                break;
            }
            _ => break,
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let mut run = std::mem::take(&mut *collected.lock().unwrap());
    for (error, text) in messages {
        if error {
            run.errors.push(text)
        } else {
            run.warnings.push(text)
        }
    }
    run
}

/// `filesrc ! [queue !] qwencodecparse PROPERTIES ! appsink`: pull mode, or push mode with the
/// queue.
fn parse_file(path: &Path, push_mode: bool, properties: &str) -> Run {
    let queue = if push_mode { "queue !" } else { "" };
    run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! {queue} qwencodecparse {properties} ! appsink name=sink",
            path.display()
        ),
        None,
    )
}

fn decode_file(path: &Path, fixture: &Fixture, properties: &str, seek: Option<gst::ClockTime>) -> Run {
    run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! qwencodecparse {properties} ! qwencodecdec model-path=\"{}\" device=cpu \
             ! appsink name=sink",
            path.display(),
            fixture.dir.display()
        ),
        seek,
    )
}

fn assert_codes_caps(run: &Run, codebooks: i32, framerate: gst::Fraction) {
    let caps = run.caps.as_ref().expect("output caps");
    let s = caps.structure(0).unwrap();
    assert_eq!(s.name(), "audio/x-qwen3-tts-codes");
    assert_eq!(s.get::<i32>("codebooks").unwrap(), codebooks);
    assert_eq!(s.get::<gst::Fraction>("framerate").unwrap(), framerate);
    assert!(s.get::<bool>("parsed").unwrap());
}

/// Buffers start where the previous ended, at frame k / framerate exactly, and hold whole
/// frames, `per_buffer` of them but the last.
fn assert_timestamps(run: &Run, frames: u64, codebooks: usize, framerate: gst::Fraction, per_buffer: u64) {
    let time = |frame: u64| {
        gst::ClockTime::SECOND
            .mul_div_floor(frame * framerate.denom() as u64, framerate.numer() as u64)
            .unwrap()
    };
    let mut frame = 0;
    for (index, buffer) in run.buffers.iter().enumerate() {
        let count = (buffer.size() / (2 * codebooks)) as u64;
        assert_eq!(buffer.size() % (2 * codebooks), 0, "buffer {index} cuts a frame");
        assert!(
            count == per_buffer || frame + count == frames,
            "buffer {index}: {count} frames"
        );
        assert_eq!(buffer.pts(), Some(time(frame)), "buffer {index}");
        assert_eq!(
            buffer.duration(),
            Some(time(frame + count) - time(frame)),
            "buffer {index}"
        );
        frame += count;
    }
    assert_eq!(frame, frames);
}

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

/// The samples of a float WAV with a canonical 44-byte header.
fn wav_samples(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"RIFF");
    bytes[44..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

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
    fixture.assert_matches(&wav_samples(&wav), "filesrc ! decodebin");

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
    fixture.assert_matches(&wav_samples(&wav), "gst-play-1.0 codes.npy");
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
    // Other arrays are .npy files still: the parser will say what is wrong with them.
    let floats = npy_file(1, &dict("<f4", "(10, 16)"), &[0; 640]);
    let (caps, probability) =
        gst_base::functions::type_find_helper_for_data(None::<&gst::Object>, &floats).unwrap();
    assert_eq!(caps.to_string(), "application/x-npy");
    assert_eq!(probability, gst::TypeFindProbability::Likely);
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
///   (5× upstream's own float32 error);
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
    common::run_script("pipelines/npy-to-wav.sh", &[&npy, &wav, &fixture.dir], &[]);
    // 16-bit samples after a 44-byte header.
    assert_eq!(
        std::fs::metadata(&wav).unwrap().len() as usize,
        44 + 2 * fixture.audio.len()
    );
    // Without arguments: the bundled codes, made into a .npy file, and the bundled checkpoint.
    let default_wav = dir.path().join("default.wav");
    std::fs::create_dir(dir.path().join("cwd")).unwrap();
    let status = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/npy-to-wav.sh"))
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
        bytes[44..]
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
        "pipelines/play-npy.sh",
        &[&npy, &fixture.dir],
        &[("AUDIO_SINK", "fakesink sync=false")],
    );
}
