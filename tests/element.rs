//! qwencodecdec through gst_check's Harness and in real pipelines.

use qwencodec_testing as common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::{
    FIXTURES, audio_of, buffer, bus_for, code_bytes, codes_caps, decoder, fixture_dir, harness, init,
    load_fixture, messages, pull_all, random_buffers, samples, unclosed_input_buffers,
};
use gst::glib;
use gst::prelude::*;
use gstqwencodec::model::{Dtype, Model};
use rand::SeedableRng;
use rand::rngs::StdRng;

#[test]
fn output_caps_follow_the_model_and_downstream() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[]);
    let bytes = code_bytes(&fixture.codes[..fixture.codebooks]);
    h.push(buffer(&bytes, Some(gst::ClockTime::ZERO))).unwrap();
    // The audio leaves from the element's step thread: wait for it.
    h.pull().unwrap();
    let caps = h.sinkpad().unwrap().current_caps().unwrap();
    let s = caps.structure(0).unwrap();
    assert_eq!(s.get::<&str>("format").unwrap(), "F32LE");
    assert_eq!(s.get::<i32>("rate").unwrap(), 16000);
    assert_eq!(s.get::<i32>("channels").unwrap(), 1);

    let mut h = gst_check::Harness::with_element(&decoder(&fixture.dir, &[]), Some("sink"), Some("src"));
    h.set_sink_caps_str("audio/x-raw,format=S16LE,rate=16000,channels=1,layout=interleaved");
    h.set_src_caps(fixture.caps());
    h.play();
    h.push(buffer(&code_bytes(&fixture.codes), Some(gst::ClockTime::ZERO)))
        .unwrap();
    h.push_event(gst::event::Eos::new());
    let buffers = pull_all(&mut h);
    let s16: Vec<f32> = buffers
        .iter()
        .flat_map(|b| {
            let map = b.map_readable().unwrap();
            map.chunks_exact(2)
                .map(|p| i16::from_le_bytes([p[0], p[1]]) as f32 / 32767.0)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(s16.len(), fixture.audio.len());
    let worst = s16
        .iter()
        .zip(&fixture.audio)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst <= 1.0 / 32767.0, "S16 output off by {worst}");
}

/// Accept-caps answers by the pad template (its ACCEPT_TEMPLATE flag), before and after the
/// model loads, so that caps the model cannot decode reach set_format, which says why; the
/// caps query answers with the model's own caps once it is loaded.
#[test]
fn accept_caps_takes_the_template_and_the_caps_query_the_model() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[]);
    let pad = element.static_pad("sink").unwrap();
    assert!(pad.pad_flags().contains(gst::PadFlags::ACCEPT_TEMPLATE));
    let fits = fixture.caps();
    let other_model = codes_caps(16, gst::Fraction::new(25, 2));
    let not_codes = gst::Caps::new_empty_simple("audio/x-raw");
    for loaded in [false, true] {
        if loaded {
            element.set_state(gst::State::Ready).unwrap();
        }
        assert!(pad.query_accept_caps(&fits), "loaded {loaded}");
        assert!(pad.query_accept_caps(&other_model), "loaded {loaded}");
        assert!(!pad.query_accept_caps(&not_codes), "loaded {loaded}");
        let caps = pad.query_caps(None);
        assert!(caps.can_intersect(&fits), "loaded {loaded}: {caps}");
        assert_eq!(
            caps.can_intersect(&other_model),
            !loaded,
            "loaded {loaded}: {caps}"
        );
    }
    element.set_state(gst::State::Null).unwrap();
}

#[test]
fn caps_that_do_not_fit_the_model_are_refused() {
    init();
    let fixture = load_fixture("gqa-bias");
    for (caps, wrong) in [
        (
            codes_caps(16, gst::Fraction::new(400, 1)),
            "codebooks=16 (model has 8)",
        ),
        (
            codes_caps(8, gst::Fraction::new(25, 2)),
            "framerate=25/2 (model has 400)",
        ),
    ] {
        let element = decoder(&fixture.dir, &[]);
        let bus = bus_for(&element);
        let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
        h.set_src_caps(caps);
        h.play();
        // Upstream sends the caps again before each buffer: one error for them.
        for _ in 0..2 {
            let pushed = h.push(buffer(&code_bytes(&fixture.codes), None));
            assert_eq!(pushed, Err(gst::FlowError::NotNegotiated));
        }
        let errors = messages(&bus, gst::MessageType::Error);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains(wrong), "{errors:?}");
        assert!(errors[0].contains(fixture.dir.to_str().unwrap()), "{errors:?}");
    }
}

/// The sink pad converts bytes and time exactly, by the model's frame (release-tiny: 16 codes
/// of 2 bytes, 80 ms), a time to the bytes of the whole frames before it (a byte offset to
/// seek to starts a frame): what lets the base class take a BYTES segment straight from
/// filesrc.
#[test]
fn the_sink_pad_converts_bytes_and_time_by_the_frame() {
    let fixture = load_fixture("release-tiny");
    let h = harness(&fixture, &[]);
    assert_eq!(
        (fixture.codebooks, fixture.caps().to_string().contains("25/2")),
        (16, true)
    );
    let sink = h.element().unwrap().static_pad("sink").unwrap();
    let convert = |from: gst::GenericFormattedValue, to: gst::Format| {
        let mut query = gst::query::Convert::new(from, to);
        assert!(sink.query(&mut query), "{from:?} to {to:?}");
        query.result().1
    };
    let bytes = |n: u64| gst::GenericFormattedValue::from(gst::format::Bytes::from_u64(n));
    let ns = |n: u64| gst::GenericFormattedValue::from(gst::ClockTime::from_nseconds(n));
    // 100 frames and a half: 8.04 s.
    assert_eq!(convert(bytes(3216), gst::Format::Time), ns(8_040_000_000));
    assert_eq!(convert(bytes(3200), gst::Format::Time), ns(8_000_000_000));
    // 8.079 s holds 100 whole frames and 0.99 of one.
    assert_eq!(convert(ns(8_079_000_000), gst::Format::Bytes), bytes(3200));
    assert_eq!(convert(ns(8_080_000_000), gst::Format::Bytes), bytes(3232));
}

/// A new stream (STREAM_START without EOS before it, as concat joins two files) ends the one
/// before: its frames are decoded with their tail (two frames short of a step here), and the
/// next stream's decode as on a fresh decoder. Both match upstream's decode. (The base class
/// drains and flushes at STREAM_START.)
#[test]
fn a_new_stream_ends_the_one_before() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    let bytes = code_bytes(&fixture.codes);
    let first_frames = fixture.frames - 2;
    h.push(buffer(&bytes[..first_frames * 2 * fixture.codebooks], None))
        .unwrap();
    h.push_event(gst::event::StreamStart::new("the next"));
    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    h.push(buffer(&bytes, None)).unwrap();
    h.push_event(gst::event::Eos::new());
    let audio = audio_of(&pull_all(&mut h));
    let (first, second) = audio.split_at(first_frames * fixture.samples_per_frame);
    fixture.assert_prefix_matches(first, first_frames, "the first stream");
    fixture.assert_matches(second, "the stream after STREAM_START");
}

/// A value of one of the element's enum properties (`tail-strategy`, `dtype`) by its nick: their
/// types are the plugin's own, so the harness cannot take them as strings.
fn enum_value(property: &str, nick: &str) -> glib::Value {
    init();
    let element = gst::ElementFactory::make("qwencodecdec").build().unwrap();
    let enum_type = element.find_property(property).unwrap().value_type();
    glib::EnumClass::with_type(enum_type)
        .unwrap()
        .to_value_by_nick(nick)
        .unwrap()
}

/// The `decode-steps` count of the element's `stats`.
fn decode_steps(h: &gst_check::Harness) -> u64 {
    h.element()
        .unwrap()
        .property::<gst::Structure>("stats")
        .get("decode-steps")
        .unwrap()
}

/// Every chunk size 1-8 with every tail it can leave (0 to chunk - 1 frames), both strategies,
/// from prefixes of the fixtures (as in tests/model_parity.rs) cut into buffers at random. The
/// step count tells that the strategy asked for ran: eager decodes the tail one frame a step,
/// pad in one step.
#[test]
fn random_buffer_splits_match_upstream() {
    let mut rng = StdRng::seed_from_u64(3);
    for name in ["release-tiny", "gqa-bias"] {
        let fixture = load_fixture(name);
        let model = Model::shared(&fixture.dir, tch::Device::Cpu, Dtype::F32).unwrap();
        let window = model.config().sliding_window;
        for chunk_frames in 1..=8u32 {
            let chunk = chunk_frames as usize;
            for frames in fixture.tail_lengths(chunk, window + chunk) {
                let bytes = code_bytes(fixture.prefix_codes(frames));
                for tail in ["eager", "pad"] {
                    let tail_strategy = enum_value("tail-strategy", tail);
                    let mut h = harness(
                        &fixture,
                        // Steps of chunk-frames only: frames that wait would join into larger ones.
                        &[
                            ("chunk-frames", &chunk_frames),
                            ("tail-strategy", &tail_strategy),
                            ("max-step-frames", &chunk_frames),
                        ],
                    );
                    for piece in random_buffers(&bytes, 2 * fixture.codebooks, &mut rng) {
                        h.push(piece).unwrap();
                    }
                    h.push_event(gst::event::Eos::new());
                    let audio = audio_of(&pull_all(&mut h));
                    let tail_frames = frames % chunk;
                    let what = format!("element, chunk-frames {chunk_frames}, tail of {tail_frames}, {tail}");
                    let tail_steps = if tail == "eager" {
                        tail_frames
                    } else {
                        usize::from(tail_frames > 0)
                    };
                    assert_eq!(
                        decode_steps(&h),
                        (frames / chunk + tail_steps) as u64,
                        "{name}: {what}: decode steps"
                    );
                    fixture.assert_prefix_matches(&audio, frames, &what);
                }
            }
        }
    }
}

/// Half-precision compute through the element, at the core's bounds (model_parity.rs): float16
/// as [`common::Fixture::f16_bound`], bfloat16 as [`common::Fixture::bf16_bound`], on every
/// fixture.
#[test]
fn bf16_and_f16_decode_within_their_bounds() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let bytes = code_bytes(&fixture.codes);
        for (dtype, bound) in [("f16", fixture.f16_bound()), ("bf16", fixture.bf16_bound())] {
            let dtype_value = enum_value("dtype", dtype);
            let mut h = harness(&fixture, &[("chunk-frames", &3u32), ("dtype", &dtype_value)]);
            let mut rng = StdRng::seed_from_u64(5);
            for piece in random_buffers(&bytes, 2 * fixture.codebooks, &mut rng) {
                h.push(piece).unwrap();
            }
            h.push_event(gst::event::Eos::new());
            let audio = audio_of(&pull_all(&mut h));
            assert_eq!(
                audio.len(),
                fixture.audio.len(),
                "{name} in {dtype}: audio length"
            );
            let error = common::relative_l2(&audio, &fixture.audio);
            println!("measured {name} {dtype} {error:.4e} (the element)");
            assert!(
                error <= bound,
                "{name} in {dtype}: relative L2 error {error:.3e} above {bound:.3e}"
            );
        }
    }
}

/// Players name what they play: the audio goes out with the `audio-codec` tag.
#[test]
fn the_audio_is_tagged_with_its_codec() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[]);
    h.push(buffer(
        &code_bytes(fixture.prefix_codes(1)),
        Some(gst::ClockTime::ZERO),
    ))
    .unwrap();
    h.push_event(gst::event::Eos::new());
    let codec = std::iter::from_fn(|| h.try_pull_event()).find_map(|event| match event.view() {
        gst::EventView::Tag(tag) => tag
            .tag()
            .get::<gst::tags::AudioCodec>()
            .map(|codec| codec.get().to_owned()),
        _ => None,
    });
    assert_eq!(codec.as_deref(), Some("Qwen3-TTS speech codec"));
}

#[test]
fn eos_decodes_the_frames_waiting_for_a_full_step() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    h.push(buffer(&code_bytes(fixture.prefix_codes(10)), None))
        .unwrap();
    // Two full steps' audio leaves without EOS (one step of 8 frames, max-step-frames);
    // the last 2 frames wait for a full step.
    let mut audio = Vec::new();
    while audio.len() < 8 * fixture.samples_per_frame {
        audio.extend(audio_of(&[h.pull().unwrap()]));
    }
    assert_eq!(audio.len(), 8 * fixture.samples_per_frame);
    assert!(h.try_pull().is_none(), "audio of frames waiting for a full step");
    h.push_event(gst::event::Eos::new());
    audio.extend(audio_of(&pull_all(&mut h)));
    fixture.assert_prefix_matches(&audio, 10, "two full steps and a tail of 2 at EOS");
}

#[test]
fn flush_starts_a_fresh_stream() {
    let fixture = load_fixture("gqa-bias");
    let bytes = code_bytes(&fixture.codes);
    let mut h = harness(&fixture, &[("chunk-frames", &2u32)]);
    // Half a stream, a partial frame included, then a flushing seek once some of its audio is
    // out (the base class then counts subframes of an input buffer that the flush drops).
    h.push(buffer(&bytes[..bytes.len() / 2 + 3], None)).unwrap();
    h.pull().unwrap();
    pull_all(&mut h);
    h.push_event(gst::event::FlushStart::new());
    h.push_event(gst::event::FlushStop::new(true));
    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    pull_all(&mut h);
    h.push(buffer(&bytes, None)).unwrap();
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&audio_of(&pull_all(&mut h)), "after a flush");
}

/// A flush with every input buffer finished (its frames' audio all out): the base class's count
/// of audio pushed for its oldest input buffer is reset by finishing all of its queued buffers,
/// none here, without the "more decoded frames than provided" warning that finishing one of an
/// empty queue posts. Then the same for a stop after EOS.
#[test]
fn a_flush_or_a_stop_with_every_input_buffer_finished_posts_no_warning() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &1u32)]);
    let element = h.element().unwrap();
    let bus = bus_for(&element);
    let bytes = code_bytes(&fixture.codes);
    h.push(buffer(&bytes, None)).unwrap();
    let mut audio = Vec::new();
    while audio.len() < fixture.frames * fixture.samples_per_frame {
        audio.extend(samples(&h.pull().unwrap()));
    }
    fixture.assert_matches(&audio, "the stream before the flush");
    h.push_event(gst::event::FlushStart::new());
    h.push_event(gst::event::FlushStop::new(true));
    let warnings = messages(&bus, gst::MessageType::Warning);
    assert!(warnings.is_empty(), "the flush: {warnings:?}");

    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    h.push(buffer(&bytes, None)).unwrap();
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&audio_of(&pull_all(&mut h)), "the stream after the flush");
    element.set_state(gst::State::Ready).unwrap();
    let warnings = messages(&bus, gst::MessageType::Warning);
    assert!(warnings.is_empty(), "the stop: {warnings:?}");
}

/// An input buffer is closed as soon as the audio of every frame that starts in it is out, a
/// frame cut by a buffer boundary counting as its first buffer's: two buffers of a frame and a
/// half each hold frames 0-1 and 2, and once the three frames' audio is out (no EOS) the base
/// class holds neither (its `delay`).
#[test]
fn input_buffers_are_closed_as_their_frames_audio_is_out() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &1u32)]);
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes[..3 * fixture.codebooks]);
    let half = frame_bytes + frame_bytes / 2;
    h.push(buffer(&bytes[..half], None)).unwrap();
    h.push(buffer(&bytes[half..], None)).unwrap();
    let mut audio = Vec::new();
    while audio.len() < 3 * fixture.samples_per_frame {
        audio.extend(samples(&h.pull().unwrap()));
    }
    fixture.assert_prefix_matches(&audio, 3, "three frames in two buffers");
    let element = h.element().unwrap();
    // The second buffer is closed just after its frame's audio goes out.
    let waited = std::time::Instant::now();
    while unclosed_input_buffers(&element) > 0 && waited.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        unclosed_input_buffers(&element),
        0,
        "input buffers left unclosed with their audio out"
    );
}

/// At EOS every input buffer is closed, that of a cut frame too: the base class counts none
/// still waiting for audio (its `delay`), where its drain would otherwise drop them unclosed.
#[test]
fn every_input_buffer_is_closed_by_eos() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    // 10 frames in buffers of 3: two steps of 4, then a tail of 2, the last buffer ending in
    // 4 bytes of a cut frame, which the EOS drops.
    let frames = 10;
    let bytes = code_bytes(&fixture.codes[..(frames + 1) * fixture.codebooks]);
    let frame_bytes = 2 * fixture.codebooks;
    for first in (0..frames).step_by(3) {
        let end = if first + 3 >= frames {
            frames * frame_bytes + 4
        } else {
            (first + 3) * frame_bytes
        };
        h.push(buffer(&bytes[first * frame_bytes..end], None)).unwrap();
    }
    h.push_event(gst::event::Eos::new());
    fixture.assert_prefix_matches(&audio_of(&pull_all(&mut h)), frames, "ten frames and EOS");
    assert_eq!(
        unclosed_input_buffers(&h.element().unwrap()),
        0,
        "input buffers left unclosed at EOS"
    );
}

#[test]
fn invalid_codes_are_an_error_naming_them_after_the_good_audio() {
    init();
    let fixture = load_fixture("gqa-bias");
    // max-errors 0: the first bad code is an error (by default, -1, a warning: tests/max_errors.rs).
    let element = decoder(&fixture.dir, &[("chunk-frames", &4u32), ("max-errors", &0i32)]);
    let bus = bus_for(&element);
    let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    let mut codes = fixture.codes[..6 * fixture.codebooks].to_vec();
    codes[5 * fixture.codebooks + 3] = 999;
    assert_eq!(
        h.push(buffer(&code_bytes(&codes), None)),
        Err(gst::FlowError::Error)
    );
    // The five good frames before the bad one are decoded and pushed, not lost.
    let audio = audio_of(&pull_all(&mut h));
    fixture.assert_prefix_matches(&audio, 5, "the frames before the bad one");
    let errors = messages(&bus, gst::MessageType::Error).join("\n");
    for part in ["frame 5", "codebook 3", "code 999", "0..64"] {
        assert!(errors.contains(part), "{errors:?} lacks {part:?}");
    }
}

#[test]
fn a_partial_frame_at_eos_is_reported() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[]);
    let bus = bus_for(&element);
    let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    h.push(buffer(
        &code_bytes(&fixture.codes[..3 * fixture.codebooks + 2]),
        None,
    ))
    .unwrap();
    h.push_event(gst::event::Eos::new());
    assert_eq!(audio_of(&pull_all(&mut h)).len(), 3 * fixture.samples_per_frame);
    let warnings = messages(&bus, gst::MessageType::Warning).join("\n");
    assert!(warnings.contains("Dropped 4 bytes"), "{warnings:?}");
}

/// Starting fails with an element error that names what is wrong.
fn start_error(properties: &[(&str, &dyn ToValue)], model_path: Option<&Path>) -> String {
    init();
    let element = gst::ElementFactory::make("qwencodecdec").build().unwrap();
    element.set_property("model-path", model_path.map(|p| p.to_str().unwrap()));
    element.set_property("device", "cpu");
    for (name, value) in properties {
        element.set_property_from_value(name, &value.to_value());
    }
    let bus = bus_for(&element);
    assert!(element.set_state(gst::State::Paused).is_err(), "started");
    element.set_state(gst::State::Null).unwrap();
    messages(&bus, gst::MessageType::Error).join("\n")
}

#[test]
fn start_errors_say_what_and_where() {
    let missing = Path::new("/nonexistent/model");
    let message = start_error(&[], Some(missing));
    assert!(
        message.contains("/nonexistent/model") && message.contains("not a directory"),
        "{message}"
    );

    let empty = tempfile::tempdir().unwrap();
    let message = start_error(&[], Some(empty.path()));
    assert!(
        message.contains("config.json") && message.contains("is missing"),
        "{message}"
    );

    // No property: the environment variable is the fallback, and here it is unset.
    // SAFETY: only this test touches this variable.
    unsafe { std::env::remove_var("QWENCODEC_MODEL_PATH") };
    let message = start_error(&[], None);
    assert!(
        message.contains("model-path") && message.contains("QWENCODEC_MODEL_PATH"),
        "{message}"
    );

    if !tch::Cuda::is_available() {
        let message = start_error(&[("device", &"cuda")], Some(&fixture_dir("gqa-bias")));
        assert!(message.contains("no CUDA device"), "{message}");
    }
    let message = start_error(&[("device", &"gpu7")], Some(&fixture_dir("gqa-bias")));
    assert!(message.contains("\"gpu7\""), "{message}");
}

#[test]
fn elements_share_one_loaded_model() {
    init();
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir("gqa-bias").join(file), dir.path().join(file)).unwrap();
    }
    let elements: Vec<_> = (0..2).map(|_| decoder(dir.path(), &[])).collect();
    elements[0].set_state(gst::State::Paused).unwrap();
    let model = Model::shared(dir.path(), tch::Device::Cpu, Dtype::F32).unwrap();
    // What one started element holds of the model (its decoder and its stream).
    let per_element = Arc::strong_count(&model) - 1;
    assert!(per_element > 0, "a started element holds the loaded model");
    elements[1].set_state(gst::State::Paused).unwrap();
    assert_eq!(
        Arc::strong_count(&model),
        1 + 2 * per_element,
        "the second element holds the same loaded model"
    );
    for element in &elements {
        element.set_state(gst::State::Null).unwrap();
    }
    assert_eq!(
        Arc::strong_count(&model),
        1,
        "the elements let go of it when stopped"
    );
}

/// The streaming thread is not held for a step: buffers that arrive during one wait for the
/// next, which takes them together (up to max-step-frames), and a step's audio leaves when the
/// step ends, with no more input needed; at EOS too.
#[test]
fn buffers_arriving_during_a_step_join_the_next_one() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[]);
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes);
    h.push(buffer(&bytes[..frame_bytes], None)).unwrap();
    let mut audio = audio_of(&[h.pull().unwrap()]);
    assert_eq!(
        audio.len(),
        fixture.samples_per_frame,
        "the first frame's audio, alone"
    );
    // A frame per buffer. The model's compute is held after the next step (the second frame's,
    // or several frames' if the step thread is later) while eight more frames arrive: they wait
    // together, whatever the machine's speed.
    let model = Model::shared(&fixture.dir, tch::Device::Cpu, Dtype::F32).unwrap();
    let (release, held) = hold_after_next_batch(&model);
    let frames: Vec<&[u8]> = bytes[frame_bytes..].chunks(frame_bytes).collect();
    for frame in &frames[..9] {
        h.push(buffer(frame, None)).unwrap();
    }
    drop(release);
    for frame in &frames[9..] {
        h.push(buffer(frame, None)).unwrap();
    }
    h.push_event(gst::event::Eos::new());
    let buffers = pull_all(&mut h);
    // Step by step, also for the frames EOS found waiting: at least one output per step of
    // max-step-frames (8), not one output at the end.
    assert!(
        buffers.len() >= (fixture.frames - 1) / 8,
        "{} output buffers for {} frames",
        buffers.len(),
        fixture.frames - 1
    );
    audio.extend(audio_of(&buffers));
    fixture.assert_matches(&audio, "one-frame buffers pushed during steps");
    assert!(
        held.load(Ordering::SeqCst),
        "the element's steps ran on another model"
    );
    let steps = decode_steps(&h);
    assert!(
        steps < fixture.frames as u64,
        "{steps} steps for {} one-frame buffers: none joined a step in flight's successor",
        fixture.frames
    );
}

/// Once a push has failed (downstream returned EOS), no step starts: the waiting frames' audio
/// would go nowhere, and the streaming thread returns the flow with its next buffer. Counted:
/// one buffer of ten frames, the first step's audio refused; a while after that step is
/// counted, the count has not moved on.
#[test]
fn no_step_starts_after_a_push_failed() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[]);
    let src = h.element().unwrap().static_pad("src").unwrap();
    src.add_probe(gst::PadProbeType::BUFFER, |_, info| {
        // Handled, not dropped: a dropped buffer's push returns Ok.
        info.flow_res = Err(gst::FlowError::Eos);
        gst::PadProbeReturn::Handled
    });
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes);
    // Taken whatever its flow (the step's push may have failed before it returns).
    let _ = h.push(buffer(&bytes[..10 * frame_bytes], None));
    let waited = std::time::Instant::now();
    while decode_steps(&h) < 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the first step never ran"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Long enough for a step begun after it to end (a step of release-tiny takes milliseconds).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        decode_steps(&h),
        1,
        "steps went on after downstream refused the audio"
    );
    assert_eq!(
        h.push(buffer(&bytes[10 * frame_bytes..11 * frame_bytes], None)),
        Err(gst::FlowError::Eos)
    );
}

/// Holds `model`'s compute thread after its next batch until the sender returned is dropped
/// (10 s at most: the test's assertions then tell); the flag says whether it held.
fn hold_after_next_batch(model: &Model) -> (mpsc::Sender<()>, Arc<AtomicBool>) {
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(Some(released));
    let held = Arc::new(AtomicBool::new(false));
    let flag = held.clone();
    model.observe_batches(move |_| {
        let Some(released) = released.lock().unwrap().take() else {
            return;
        };
        flag.store(true, Ordering::SeqCst);
        let _ = released.recv_timeout(Duration::from_secs(10));
    });
    (release, held)
}

#[test]
fn stats_count_what_went_through() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &2u32)]);
    h.push(buffer(&code_bytes(&fixture.codes), None)).unwrap();
    h.push_event(gst::event::Eos::new());
    pull_all(&mut h);
    let stats = h.element().unwrap().property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u64>("frames-in").unwrap(), fixture.frames as u64);
    assert_eq!(
        stats.get::<u64>("samples-out").unwrap(),
        fixture.audio.len() as u64
    );
    // One buffer of every frame: they wait together, so they run in steps that ramp up to
    // max-step-frames (8 by default: 120 = 2 + 4 + 14 x 8 + 2), each alone (no other stream
    // on the model).
    assert_eq!(h.element().unwrap().property::<u32>("max-step-frames"), 8);
    assert_eq!(fixture.frames, 120);
    assert_eq!(stats.get::<u64>("decode-steps").unwrap(), 17);
    assert_eq!(stats.get::<f64>("mean-batch-rows").unwrap(), 1.0);
    assert_eq!(stats.get::<u64>("max-batch-rows").unwrap(), 1);
    assert!(stats.get::<f64>("mean-step-ms").unwrap() > 0.0);
    assert!(stats.get::<f64>("max-step-ms").unwrap() >= stats.get::<f64>("mean-step-ms").unwrap());
    // The steps' time over the audio's, at the model's sample rate.
    let step_seconds = stats.get::<f64>("mean-step-ms").unwrap() * 17.0 / 1e3;
    let audio_seconds = fixture.audio.len() as f64 / fixture.sample_rate as f64;
    let real_time_factor = stats.get::<f64>("real-time-factor").unwrap();
    assert!(
        (real_time_factor / (step_seconds / audio_seconds) - 1.0).abs() < 1e-9,
        "{stats}"
    );
    assert!(stats.get::<u64>("state-bytes").unwrap() > 0);
    // On the CPU there is no graph, whatever cuda-graphs says (on by default).
    assert!(h.element().unwrap().property::<bool>("cuda-graphs"));
    assert!(!stats.get::<bool>("cuda-graph").unwrap());
}

#[test]
fn eight_decoders_in_one_pipeline_are_exact() {
    init();
    let fixture = Arc::new(load_fixture("gqa-bias"));
    let pipeline = gst::Pipeline::new();
    let mut branches = Vec::new();
    for chunk_frames in 1..=8u32 {
        let src = gst_app::AppSrc::builder()
            .caps(&fixture.caps())
            .format(gst::Format::Time)
            .build();
        let dec = decoder(&fixture.dir, &[("chunk-frames", &chunk_frames)]);
        let sink = gst_app::AppSink::builder().sync(false).build();
        pipeline
            .add_many([src.upcast_ref(), &dec, sink.upcast_ref()])
            .unwrap();
        gst::Element::link_many([src.upcast_ref(), &dec, sink.upcast_ref()]).unwrap();
        branches.push((src, sink));
    }
    pipeline.set_state(gst::State::Playing).unwrap();
    let feeders: Vec<_> = branches
        .iter()
        .map(|(src, _)| {
            let (src, fixture) = (src.clone(), fixture.clone());
            std::thread::spawn(move || {
                for frame in fixture.codes.chunks(fixture.codebooks) {
                    src.push_buffer(gst::Buffer::from_slice(code_bytes(frame)))
                        .unwrap();
                }
                src.end_of_stream().unwrap();
            })
        })
        .collect();
    for (index, (_, sink)) in branches.iter().enumerate() {
        let mut audio = Vec::new();
        while let Ok(sample) = sink.pull_sample() {
            audio.extend(samples(sample.buffer().unwrap()));
        }
        fixture.assert_matches(&audio, &format!("branch {index} of 8"));
    }
    for feeder in feeders {
        feeder.join().unwrap();
    }
    pipeline.set_state(gst::State::Null).unwrap();
}

#[test]
fn gst_launch_decodes_a_file_to_wav() {
    let fixture = load_fixture("release-tiny");
    let plugin_dir = common::build_dir();
    let out = tempfile::tempdir().unwrap();
    let wav = out.path().join("speech.wav");
    let status = std::process::Command::new("gst-launch-1.0")
        .env("GST_PLUGIN_PATH", &plugin_dir)
        .args(["-q", "filesrc"])
        .arg(format!("location={}", fixture.dir.join("codes.raw").display()))
        .args([
            "!",
            "audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2",
            "!",
            "qwencodecdec",
        ])
        .arg(format!("model-path={}", fixture.dir.display()))
        .args([
            "!",
            "audioconvert",
            "!",
            "audio/x-raw,format=F32LE",
            "!",
            "wavenc",
            "!",
            "filesink",
        ])
        .arg(format!("location={}", wav.display()))
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::read(&wav).unwrap();
    let (format, _) = common::wav_chunks(&bytes);
    assert_eq!(u32::from_le_bytes(format[4..8].try_into().unwrap()), 24000);
    let audio = common::wav_f32_samples(&wav);
    fixture.assert_matches(&audio, "gst-launch-1.0 to WAV");
}

#[test]
fn pipeline_scripts_run() {
    let fixture = load_fixture("gqa-bias");
    let out = tempfile::tempdir().unwrap();
    let wav = out.path().join("out.wav");
    let env = [("CODEBOOKS", "8"), ("FRAMERATE", "400/1"), ("DEVICE", "cpu")];
    let codes = fixture.dir.join("codes.raw");
    common::run_script(
        "examples/pipelines/codes-to-wav.sh",
        &[&codes, &wav, &fixture.dir],
        &env,
    );
    // 16-bit samples.
    let bytes = std::fs::read(&wav).unwrap();
    assert_eq!(common::wav_chunks(&bytes).1.len(), 2 * fixture.audio.len());

    let live_env = [env.as_slice(), &[("AUDIO_SINK", "fakesink sync=true")]].concat();
    common::run_script(
        "examples/pipelines/play-live.sh",
        &[&codes, &fixture.dir],
        &live_env,
    );
}
