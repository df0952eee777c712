//! qwencodecdec's model lifecycle: loaded at NULL→READY with progress messages, kept through
//! READY↔PAUSED cycles and flushes, let go at READY→NULL.

use qwencodec_testing as common;

use common::{bus_for, decoder, fixture_dir, init};
use gst::prelude::*;
use gst_audio::prelude::*;
use gstqwencodec::model::{Dtype, Model};

/// The load-model progress messages waiting on a bus, as (type, text).
fn progress(bus: &gst::Bus) -> Vec<(gst::ProgressType, String)> {
    std::iter::from_fn(|| bus.pop_filtered(&[gst::MessageType::Progress]))
        .filter_map(|message| match message.view() {
            gst::MessageView::Progress(progress) => {
                let (kind, code, text) = progress.get();
                (code == "load-model").then(|| (kind, text.to_string()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn the_model_loads_once_from_null_to_null() {
    init();
    let element = decoder(&fixture_dir("gqa-bias"), &[]);
    let bus = bus_for(&element);
    element.set_state(gst::State::Ready).unwrap();
    let loaded = progress(&bus);
    assert_eq!(loaded.len(), 2, "{loaded:?}");
    assert_eq!(loaded[0].0, gst::ProgressType::Start);
    assert_eq!(loaded[1].0, gst::ProgressType::Complete);
    assert!(loaded[1].1.contains("gqa-bias"), "{loaded:?}");

    // The latency follows chunk-frames: 199 frames of 1/400 s wait for a step of 200.
    let min_latency = || {
        element
            .downcast_ref::<gst_audio::AudioDecoder>()
            .unwrap()
            .latency()
            .0
    };
    let waiting = gst::ClockTime::SECOND / 400 * 199;
    element.set_state(gst::State::Paused).unwrap();
    assert!(min_latency() < waiting / 2, "{}", min_latency());
    // Started, before any event or frame: the stats show the state the stream holds.
    let stats = element.property::<gst::Structure>("stats");
    assert!(stats.get::<u64>("state-bytes").unwrap() > 0, "{stats}");
    element.set_state(gst::State::Ready).unwrap();

    // A property read at READY→PAUSED changes in READY; the model-path change waits for NULL.
    element.set_property("chunk-frames", 200u32);
    element.set_property("model-path", "/nonexistent/model");
    let sink = element.static_pad("sink").unwrap();
    for _ in 0..3 {
        element.set_state(gst::State::Paused).unwrap();
        assert!(min_latency() >= waiting, "{}", min_latency());
        // Unlinked, the flush goes nowhere downstream; the element still flushes its stream.
        sink.send_event(gst::event::FlushStart::new());
        sink.send_event(gst::event::FlushStop::new(true));
        element.set_state(gst::State::Ready).unwrap();
    }
    assert_eq!(progress(&bus), [], "READY↔PAUSED cycles and flushes load nothing");

    element.set_state(gst::State::Null).unwrap();
    // Now the new path is read, and its load fails with a progress error.
    assert!(element.set_state(gst::State::Ready).is_err());
    let failed = progress(&bus);
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert_eq!(failed[0].0, gst::ProgressType::Start);
    assert_eq!(failed[1].0, gst::ProgressType::Error);
    assert!(failed[1].1.contains("/nonexistent/model"), "{failed:?}");
    element.set_state(gst::State::Null).unwrap();
}

#[test]
fn properties_read_at_null_to_ready_say_so() {
    init();
    let element = gst::ElementFactory::make("qwencodecdec").build().unwrap();
    for name in ["model-path", "device", "dtype", "compute-threads"] {
        let flags = element.find_property(name).unwrap().flags();
        assert!(!flags.contains(gst::PARAM_FLAG_MUTABLE_READY), "{name}");
    }
    for name in [
        "chunk-frames",
        "tail-strategy",
        "cuda-graphs",
        "max-batch",
        "max-step-frames",
    ] {
        let flags = element.find_property(name).unwrap().flags();
        assert!(flags.contains(gst::PARAM_FLAG_MUTABLE_READY), "{name}");
    }
}

/// Each property reads back what was set, each set away from its default; `device` set to
/// nothing reads `auto`.
#[test]
fn each_property_reads_back_what_was_set() {
    init();
    let element = gst::ElementFactory::make("qwencodecdec").build().unwrap();
    let nick = |name: &str| {
        let value = element.property_value(name);
        glib::EnumValue::from_value(&value).unwrap().1.nick().to_owned()
    };
    assert_eq!(element.property::<Option<String>>("model-path"), None);
    element.set_property("model-path", "/models/qwen3-tts-tokenizer");
    assert_eq!(
        element.property::<Option<String>>("model-path").as_deref(),
        Some("/models/qwen3-tts-tokenizer")
    );
    assert_eq!(element.property::<String>("device"), "auto");
    element.set_property("device", "cpu");
    assert_eq!(element.property::<String>("device"), "cpu");
    element.set_property("device", None::<&str>);
    assert_eq!(element.property::<String>("device"), "auto");
    for (name, value) in [("dtype", "f16"), ("tail-strategy", "pad")] {
        assert_ne!(nick(name), value, "{name}'s default");
        element.set_property_from_str(name, value);
        assert_eq!(nick(name), value, "{name}");
    }
    for (name, value) in [
        ("chunk-frames", 3u32),
        ("max-batch", 5),
        ("max-step-frames", 12),
        ("compute-threads", 2),
    ] {
        assert_ne!(element.property::<u32>(name), value, "{name}'s default");
        element.set_property(name, value);
        assert_eq!(element.property::<u32>(name), value, "{name}");
    }
    assert!(element.property::<bool>("cuda-graphs"));
    element.set_property("cuda-graphs", false);
    assert!(!element.property::<bool>("cuda-graphs"));
}

/// `compute-threads` pins the threads of the CPU's compute thread, which every stream of the
/// process shares, at NULL→READY (unset, they follow the steps' times: docs/element.md,
/// "Threads"). Pinned at the count it has, so that the other tests of this process keep theirs.
#[test]
fn compute_threads_pin_the_cpus_threads() {
    init();
    let dir = fixture_dir("gqa-bias");
    let model = Model::shared(&dir, tch::Device::Cpu, Dtype::F32).unwrap();
    let threads = model.compute_threads();
    // Unset (0), it pins nothing: only OMP_NUM_THREADS in the environment would have.
    let unset = decoder(&dir, &[]);
    unset.set_state(gst::State::Ready).unwrap();
    let pinned = model.compute_threads_pinned();
    unset.set_state(gst::State::Null).unwrap();
    let from_environment = std::env::var_os("OMP_NUM_THREADS").is_some_and(|value| !value.is_empty());
    assert_eq!(pinned, from_environment);
    let element = decoder(&dir, &[("compute-threads", &(threads as u32))]);
    element.set_state(gst::State::Ready).unwrap();
    assert!(model.compute_threads_pinned());
    assert_eq!(model.compute_threads(), threads);
    element.set_state(gst::State::Null).unwrap();
}
