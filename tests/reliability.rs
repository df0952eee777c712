//! What a media server running for weeks does to qwencodecdec: many elements at once on their
//! own threads, state changes and flushes at any moment, and every fault followed by reuse.
//! (The soak, thousands of streams in one process, is `examples/soak.rs`, run by
//! tests/examples.rs.)

use qwencodec_testing as common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::batching::StepHold;
use common::{
    Fixture, code_bytes, codes_caps, decoder, describe, errors_and_warnings, fixture_dir, init, load_fixture,
    messages, random_buffers, samples,
};
use gst::prelude::*;
use gstqwencodec::model::{Dtype, Model};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Longer than any of these runs takes on two busy cores: past it, something hangs.
const HANG: Duration = Duration::from_secs(120);

/// Runs `work` on a thread of its own and fails the test if it has not finished within HANG.
fn within_hang_limit<R: Send + 'static>(what: &str, work: impl FnOnce() -> R + Send + 'static) -> R {
    let thread = std::thread::spawn(work);
    let deadline = Instant::now() + HANG;
    while !thread.is_finished() {
        assert!(
            Instant::now() < deadline,
            "{what}: still not done after {HANG:?}: a deadlock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A copy of a committed fixture's checkpoint in a folder of its own: elements given it load a
/// model no other test of this binary shares, so that holding its steps holds theirs only.
fn private_checkpoint(name: &str) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
    }
    copy
}

/// Until `pad` is flushing: a flush-start or a deactivation has gone through it.
fn await_flushing(pad: &gst::Pad, what: &str) {
    let deadline = Instant::now() + HANG;
    while !pad.pad_flags().contains(gst::PadFlags::FLUSHING) {
        assert!(Instant::now() < deadline, "{what}: {} never flushing", pad.name());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `appsrc ! qwencodecdec ! appsink` in a pipeline.
struct Branch {
    pipeline: gst::Pipeline,
    src: gst_app::AppSrc,
    sink: gst_app::AppSink,
}

impl Branch {
    /// `middle` between the source and the sink; they leave the pipeline when it is dropped.
    fn new(middle: &[&gst::Element], caps: &gst::Caps) -> Self {
        let src = gst_app::AppSrc::builder()
            .caps(caps)
            .format(gst::Format::Time)
            // A feeder faster than the decoder waits instead of queueing without end.
            .block(true)
            .build();
        // EOS is posted when it arrives, not once every sample is pulled.
        let sink = gst_app::AppSink::builder().sync(false).wait_on_eos(false).build();
        let pipeline = gst::Pipeline::new();
        let chain: Vec<&gst::Element> = [src.upcast_ref()]
            .into_iter()
            .chain(middle.iter().copied())
            .chain([sink.upcast_ref()])
            .collect();
        pipeline.add_many(chain.iter().copied()).unwrap();
        gst::Element::link_many(chain).unwrap();
        Self { pipeline, src, sink }
    }

    /// Pushes the buffers and EOS, and returns the audio up to EOS.
    fn decode(&self, buffers: Vec<gst::Buffer>) -> Vec<f32> {
        for buffer in buffers {
            self.src.push_buffer(buffer).unwrap();
        }
        self.src.end_of_stream().unwrap();
        let mut audio = Vec::new();
        while let Ok(sample) = self.sink.pull_sample() {
            audio.extend(samples(sample.buffer().unwrap()));
        }
        audio
    }
}

impl Drop for Branch {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

#[test]
fn sixty_four_elements_on_their_own_threads_are_exact_and_share_one_model() {
    init();
    const ELEMENTS: usize = 64;
    // A folder of its own: no other test shares (or holds) this model.
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir("gqa-bias").join(file), dir.path().join(file)).unwrap();
    }
    let fixture = Arc::new(load_fixture("gqa-bias"));
    let started = Arc::new(Barrier::new(ELEMENTS + 1));
    let counted = Arc::new(Barrier::new(ELEMENTS + 1));
    let threads: Vec<_> = (0..ELEMENTS)
        .map(|index| {
            let (fixture, started, counted) = (fixture.clone(), started.clone(), counted.clone());
            let model = dir.path().to_owned();
            std::thread::spawn(move || {
                let element = decoder(&model, &[("chunk-frames", &(1 + index as u32 % 4))]);
                let branch = Branch::new(&[&element], &fixture.caps());
                branch.pipeline.set_state(gst::State::Playing).unwrap();
                started.wait();
                counted.wait();
                let mut rng = StdRng::seed_from_u64(index as u64);
                let bytes = code_bytes(&fixture.codes);
                let audio = branch.decode(random_buffers(&bytes, 2 * fixture.codebooks, &mut rng));
                fixture.assert_matches(&audio, &format!("element {index} of {ELEMENTS}"));
                let stats = element.property::<gst::Structure>("stats");
                stats.get::<u64>("max-batch-rows").unwrap()
            })
        })
        .collect();

    started.wait();
    let loaded = Model::shared(dir.path(), tch::Device::Cpu, Dtype::F32).unwrap();
    // Every element holds the one loaded model, as many times each (its decoder and its
    // stream), and so does this test.
    let held = Arc::strong_count(&loaded) - 1;
    assert!(
        held >= ELEMENTS && held.is_multiple_of(ELEMENTS),
        "{held} references to the loaded model from {ELEMENTS} elements"
    );
    let model = Arc::downgrade(&loaded);
    drop(loaded);
    counted.wait();
    let most_rows = threads.into_iter().map(|thread| thread.join().unwrap()).max();
    assert!(
        most_rows > Some(1),
        "64 elements decoding at once never shared a step: {most_rows:?}"
    );
    assert!(
        model.upgrade().is_none(),
        "the model is freed once the last element has stopped"
    );
}

/// PLAYING to NULL while a step is in flight, held there until the state change has reached
/// the element (its pads flushing), twelve times; then the element decodes a stream exactly.
#[test]
fn playing_to_null_in_the_middle_of_a_step_then_reuse() {
    init();
    let fixture = load_fixture("release-tiny");
    let checkpoint = private_checkpoint("release-tiny");
    let model = Model::shared(checkpoint.path(), tch::Device::Cpu, Dtype::F32).unwrap();
    let hold = StepHold::on(&model);
    let bytes = code_bytes(&fixture.codes);
    let mut rng = StdRng::seed_from_u64(7);
    let decoder = decoder(checkpoint.path(), &[("chunk-frames", &32u32)]);
    let branch = Arc::new(Branch::new(&[&decoder], &fixture.caps()));
    for round in 0..12 {
        // Once started: the start runs a warm-up step of its own.
        branch.pipeline.set_state(gst::State::Playing).unwrap();
        hold.arm();
        let feeder = {
            let (branch, bytes) = (branch.clone(), bytes.clone());
            std::thread::spawn(move || {
                // Frames without end, until the element stops taking them.
                for frame in bytes.chunks(32).cycle() {
                    if branch
                        .src
                        .push_buffer(gst::Buffer::from_slice(frame.to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            })
        };
        let drain = {
            let sink = branch.sink.clone();
            std::thread::spawn(move || while sink.pull_sample().is_ok() {})
        };
        let what = format!("round {round}: PLAYING to NULL");
        hold.wait_held(&what);
        let stopping = {
            let pipeline = branch.pipeline.clone();
            std::thread::spawn(move || pipeline.set_state(gst::State::Null).unwrap())
        };
        await_flushing(&decoder.static_pad("src").unwrap(), &what);
        hold.release();
        within_hang_limit(&what, move || stopping.join().unwrap());
        feeder.join().unwrap();
        drain.join().unwrap();
    }

    // The same element, started again, decodes a stream exactly.
    branch.pipeline.set_state(gst::State::Playing).unwrap();
    let audio = branch.decode(random_buffers(&bytes, 2 * fixture.codebooks, &mut rng));
    fixture.assert_matches(&audio, "after twelve stops in the middle of a stream");
}

/// What the element sent downstream, in order.
#[derive(Debug)]
enum Seen {
    Audio(Vec<f32>),
    FlushStop,
    Eos,
}

/// The decoder between two pads of the test's own, so that the test sends events itself.
struct Wired {
    decoder: gst::Element,
    feed: gst::Pad,
    seen: Arc<Mutex<Vec<Seen>>>,
    _collect: gst::Pad,
}

impl Wired {
    fn new(decoder: gst::Element, caps: &gst::Caps) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let collect = gst::Pad::builder(gst::PadDirection::Sink)
            .chain_function({
                let seen = seen.clone();
                move |_, _, buffer| {
                    seen.lock().unwrap().push(Seen::Audio(samples(&buffer)));
                    Ok(gst::FlowSuccess::Ok)
                }
            })
            .event_function({
                let seen = seen.clone();
                move |pad, parent, event| {
                    match event.type_() {
                        gst::EventType::FlushStop => seen.lock().unwrap().push(Seen::FlushStop),
                        gst::EventType::Eos => seen.lock().unwrap().push(Seen::Eos),
                        _ => (),
                    }
                    gst::Pad::event_default(pad, parent, event)
                }
            })
            .build();
        let feed = gst::Pad::builder(gst::PadDirection::Src).build();
        feed.link(&decoder.static_pad("sink").unwrap()).unwrap();
        decoder.static_pad("src").unwrap().link(&collect).unwrap();
        collect.set_active(true).unwrap();
        feed.set_active(true).unwrap();
        decoder.set_state(gst::State::Playing).unwrap();
        feed.push_event(gst::event::StreamStart::new("reliability"));
        feed.push_event(gst::event::Caps::new(caps));
        feed.push_event(gst::event::Segment::new(
            &gst::FormattedSegment::<gst::ClockTime>::new(),
        ));
        Self {
            decoder,
            feed,
            seen,
            _collect: collect,
        }
    }

    /// The audio sent after the last flush, and whether EOS followed it.
    fn after_last_flush(&self) -> (Vec<f32>, bool) {
        let seen = self.seen.lock().unwrap();
        let start = seen
            .iter()
            .rposition(|item| matches!(item, Seen::FlushStop))
            .expect("a flush-stop went through");
        let mut audio = Vec::new();
        let mut eos = false;
        for item in &seen[start + 1..] {
            match item {
                Seen::Audio(samples) => {
                    assert!(!eos, "audio after EOS");
                    audio.extend(samples)
                }
                Seen::Eos => eos = true,
                Seen::FlushStop => unreachable!(),
            }
        }
        (audio, eos)
    }
}

impl Drop for Wired {
    fn drop(&mut self) {
        let _ = self.decoder.set_state(gst::State::Null);
    }
}

/// A stream is fed from one thread while the test flushes from another with a step in flight,
/// held there until the flush-start has gone through the element (with `then_eos`, the feeder
/// asks for the hold as it sends EOS after the last frame, so that the flush meets the drain);
/// then the stream after the flush must come out exactly, with nothing of the one before.
fn flush_while_decoding(then_eos: bool, seed: u64) {
    init();
    let fixture = Arc::new(load_fixture("gqa-bias"));
    let checkpoint = private_checkpoint("gqa-bias");
    let model = Model::shared(checkpoint.path(), tch::Device::Cpu, Dtype::F32).unwrap();
    let hold = StepHold::on(&model);
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..8 {
        // With EOS, a frame short, so that every chunk size leaves a tail for the drain to
        // step on, and a step comes after the hold is asked for.
        let chunk_frames = if then_eos {
            [2u32, 4, 16, 64][round % 4]
        } else {
            [1u32, 4, 16, 64][round % 4]
        };
        let frames = fixture.frames - usize::from(then_eos);
        let wired = Arc::new(Wired::new(
            decoder(checkpoint.path(), &[("chunk-frames", &chunk_frames)]),
            &fixture.caps(),
        ));
        if !then_eos {
            hold.arm();
        }
        let feeder = {
            let (wired, fixture, armed) = (wired.clone(), fixture.clone(), hold.armed.clone());
            std::thread::spawn(move || {
                for frame in fixture.codes.chunks(fixture.codebooks).take(frames) {
                    if wired
                        .feed
                        .push(gst::Buffer::from_slice(code_bytes(frame)))
                        .is_err()
                    {
                        return;
                    }
                }
                if then_eos {
                    armed.store(true, Ordering::SeqCst);
                    wired.feed.push_event(gst::event::Eos::new());
                }
            })
        };
        let what = format!("round {round}: flush");
        hold.wait_held(&what);
        let flushing = {
            let (wired, fixture) = (wired.clone(), fixture.clone());
            let buffers = random_buffers(&code_bytes(&fixture.codes), 2 * fixture.codebooks, &mut rng);
            std::thread::spawn(move || {
                wired.feed.push_event(gst::event::FlushStart::new());
                feeder.join().unwrap();
                wired.feed.push_event(gst::event::FlushStop::new(true));
                wired.feed.push_event(gst::event::Segment::new(
                    &gst::FormattedSegment::<gst::ClockTime>::new(),
                ));
                for buffer in buffers {
                    wired.feed.push(buffer).unwrap();
                }
                wired.feed.push_event(gst::event::Eos::new());
                wired.after_last_flush()
            })
        };
        await_flushing(&wired.decoder.static_pad("src").unwrap(), &what);
        hold.release();
        let (audio, eos) = within_hang_limit(&what, move || flushing.join().unwrap());
        assert!(eos, "round {round}: EOS after the flush");
        fixture.assert_matches(
            &audio,
            &format!("round {round}, chunk-frames {chunk_frames}: the stream after the flush"),
        );
    }
}

#[test]
fn a_flush_in_the_middle_of_a_step_lets_nothing_stale_through() {
    flush_while_decoding(false, 11);
}

#[test]
fn eos_racing_a_flush_lets_nothing_stale_through() {
    flush_while_decoding(true, 12);
}

#[test]
fn caps_renegotiated_to_another_codebook_count_are_refused_once_and_clearly() {
    init();
    let fixture = load_fixture("gqa-bias");
    let bytes = code_bytes(&fixture.codes);
    // Frames wait for a full step when the caps change.
    let element = decoder(&fixture.dir, &[("chunk-frames", &4u32)]);
    let bus = gst::Bus::new();
    element.set_bus(Some(&bus));
    let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    let half = bytes.len() / 2 / (2 * fixture.codebooks) * (2 * fixture.codebooks);
    h.push(gst::Buffer::from_slice(bytes[..half].to_vec())).unwrap();

    h.set_src_caps(codes_caps(16, gst::Fraction::new(400, 1)));
    for _ in 0..3 {
        assert_eq!(
            h.push(gst::Buffer::from_slice(bytes[half..].to_vec())),
            Err(gst::FlowError::NotNegotiated)
        );
    }
    let errors = messages(&bus, gst::MessageType::Error);
    assert_eq!(errors.len(), 1, "one error for one caps event: {errors:#?}");
    assert!(errors[0].contains("codebooks=16 (model has 8)"), "{}", errors[0]);

    // The frames taken before the new caps were decoded, not lost (their audio leaves from
    // the element's step thread: wait for it).
    let frames = half / (2 * fixture.codebooks);
    let mut audio = Vec::new();
    while audio.len() < frames * fixture.samples_per_frame {
        audio.extend(samples(
            &h.pull().expect("the audio of the frames before the caps"),
        ));
    }
    assert!(h.try_pull().is_none(), "nothing more than those frames' audio");
    let error = common::relative_l2(&audio, &fixture.audio[..frames * fixture.samples_per_frame]);
    assert!(error <= fixture.tolerance(), "{error:.2e}");

    // Back to NULL, the same element takes the model's caps again.
    element.set_state(gst::State::Null).unwrap();
    drop(h);
    let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    h.push(gst::Buffer::from_slice(bytes)).unwrap();
    h.push_event(gst::event::Eos::new());
    let audio: Vec<f32> = std::iter::from_fn(|| h.try_pull())
        .flat_map(|buffer| samples(&buffer))
        .collect();
    fixture.assert_matches(&audio, "after refused caps and a restart");
}

#[test]
fn a_model_path_changed_between_runs_is_used_at_the_next_start() {
    init();
    let first = load_fixture("gqa-bias");
    let second = load_fixture("release-tiny");
    let element = decoder(&first.dir, &[("chunk-frames", &2u32)]);
    let mut rng = StdRng::seed_from_u64(5);
    for (fixture, next) in [(&first, &second), (&second, &first)] {
        let branch = Branch::new(&[&element], &fixture.caps());
        branch.pipeline.set_state(gst::State::Playing).unwrap();
        // Changed while running: stored for the next start, this run goes on unchanged.
        element.set_property("model-path", next.dir.to_str().unwrap());
        let audio = branch.decode(random_buffers(
            &code_bytes(&fixture.codes),
            2 * fixture.codebooks,
            &mut rng,
        ));
        fixture.assert_matches(&audio, "the model at start");
        // The element leaves its pipeline with it, for the next one.
        drop(branch);
        assert!(element.parent().is_none());
    }
}

/// A fault set up on a pipeline, and how to undo it.
struct Fault {
    what: &'static str,
    /// Makes it go wrong.
    inject: fn(&Setup),
    /// Puts it right again.
    repair: fn(&Setup, &Fixture),
    /// What the run posts, in an error or (with `warning`) a warning message.
    says: &'static str,
    warning: bool,
}

/// `appsrc ! qwencodecdec ! capsfilter ! appsink`, kept across runs.
struct Setup {
    decoder: gst::Element,
    filter: gst::Element,
    /// What the next run pushes, and its caps.
    codes: Mutex<Vec<u8>>,
    caps: Mutex<gst::Caps>,
}

fn good_output() -> gst::Caps {
    "audio/x-raw".parse().unwrap()
}

impl Setup {
    fn new(fixture: &Fixture) -> Self {
        Self {
            decoder: decoder(&fixture.dir, &[("chunk-frames", &2u32)]),
            filter: gst::ElementFactory::make("capsfilter")
                .property("caps", good_output())
                .build()
                .unwrap(),
            codes: Mutex::new(code_bytes(&fixture.codes)),
            caps: Mutex::new(fixture.caps()),
        }
    }

    /// Plays the codes to EOS or an error, in a pipeline made for the run around the same
    /// decoder; returns the audio, the errors and the warnings.
    fn run(&self) -> (Vec<f32>, Vec<String>, Vec<String>) {
        let branch = Branch::new(&[&self.decoder, &self.filter], &self.caps.lock().unwrap());
        let bus = branch.pipeline.bus().unwrap();
        let mut audio = Vec::new();
        let (mut errors, mut warnings) = (Vec::new(), Vec::new());
        if branch.pipeline.set_state(gst::State::Playing).is_ok() {
            let codes = self.codes.lock().unwrap().clone();
            let _ = branch.src.push_buffer(gst::Buffer::from_slice(codes));
            let _ = branch.src.end_of_stream();
            // Until EOS or an error; a filtered pop would drop the warnings.
            loop {
                let message = bus
                    .timed_pop(gst::ClockTime::from_seconds(HANG.as_secs()))
                    .expect("EOS or an error");
                match message.view() {
                    gst::MessageView::Eos(_) => break,
                    gst::MessageView::Error(_) => {
                        errors.extend(describe(&message));
                        break;
                    }
                    gst::MessageView::Warning(_) => warnings.extend(describe(&message)),
                    _ => (),
                }
            }
            while let Some(sample) = branch.sink.try_pull_sample(gst::ClockTime::ZERO) {
                audio.extend(samples(sample.buffer().unwrap()));
            }
        }
        // Read before NULL, which flushes the pipeline's bus.
        let (later_errors, later_warnings) = errors_and_warnings(&bus);
        errors.extend(later_errors);
        warnings.extend(later_warnings);
        (audio, errors, warnings)
    }
}

#[test]
fn after_every_fault_the_element_decodes_again_once_back_in_null() {
    init();
    let fixture = load_fixture("gqa-bias");
    let good_codes = code_bytes(&fixture.codes);
    let faults = [
        Fault {
            what: "no model",
            inject: |s| s.decoder.set_property("model-path", None::<&str>),
            repair: |s, f| s.decoder.set_property("model-path", f.dir.to_str().unwrap()),
            says: "No model: set the model-path property",
            warning: false,
        },
        Fault {
            what: "a model folder that does not exist",
            inject: |s| s.decoder.set_property("model-path", "/nonexistent/model"),
            repair: |s, f| s.decoder.set_property("model-path", f.dir.to_str().unwrap()),
            says: "/nonexistent/model",
            warning: false,
        },
        Fault {
            what: "a checkpoint of another geometry",
            inject: |s| {
                s.decoder
                    .set_property("model-path", fixture_dir("release-tiny").to_str().unwrap())
            },
            repair: |s, f| s.decoder.set_property("model-path", f.dir.to_str().unwrap()),
            says: "codebooks=8 (model has 16)",
            warning: false,
        },
        Fault {
            what: "an unknown device",
            inject: |s| s.decoder.set_property("device", "gpu7"),
            repair: |s, _| s.decoder.set_property("device", "cpu"),
            says: "\"gpu7\" is not a device",
            warning: false,
        },
        Fault {
            what: "caps with another codebook count",
            inject: |s| *s.caps.lock().unwrap() = codes_caps(16, gst::Fraction::new(400, 1)),
            repair: |s, f| *s.caps.lock().unwrap() = f.caps(),
            says: "codebooks=16 (model has 8)",
            warning: false,
        },
        Fault {
            what: "downstream that takes only 48 kHz",
            inject: |s| {
                s.filter
                    .set_property("caps", "audio/x-raw,rate=48000".parse::<gst::Caps>().unwrap())
            },
            repair: |s, _| s.filter.set_property("caps", good_output()),
            says: "Downstream takes neither F32LE nor S16LE mono at 16000 Hz",
            warning: false,
        },
        Fault {
            what: "a code outside the codebook",
            inject: |s| s.codes.lock().unwrap()[40..42].copy_from_slice(&999i16.to_le_bytes()),
            repair: |s, f| *s.codes.lock().unwrap() = code_bytes(&f.codes),
            // Let pass by the default max-errors (-1): the frames from it on are dropped.
            says: "code 999 is outside 0..64",
            warning: true,
        },
        Fault {
            what: "a frame cut short at EOS",
            inject: |s| s.codes.lock().unwrap().extend([1, 0, 2]),
            repair: |s, f| *s.codes.lock().unwrap() = code_bytes(&f.codes),
            says: "Dropped 3 bytes",
            warning: true,
        },
    ];

    let setup = Setup::new(&fixture);
    for fault in &faults {
        (fault.inject)(&setup);
        let (_, errors, warnings) = setup.run();
        let posted = if fault.warning { &warnings } else { &errors };
        assert!(
            posted.iter().any(|message| message.contains(fault.says)),
            "{}: expected {:?} in {posted:#?}",
            fault.what,
            fault.says
        );
        if fault.warning {
            assert!(errors.is_empty(), "{}: {errors:#?}", fault.what);
        }

        (fault.repair)(&setup, &fixture);
        assert_eq!(*setup.codes.lock().unwrap(), good_codes);
        let (audio, errors, warnings) = setup.run();
        assert!(
            errors.is_empty() && warnings.is_empty(),
            "{}: {errors:#?} {warnings:#?}",
            fault.what
        );
        fixture.assert_matches(&audio, &format!("the run after {}", fault.what));
    }
}

/// A drain that an event starts (here `qwencodec-drain`: the end of an utterance) pushes the
/// audio of the frames waiting; when downstream answers that push with EOS (a sink that is done,
/// a pad unlinked), the next buffer returns that flow, as it does when a step's push fails.
/// Before, the event's drain dropped it and the next buffer returned OK.
#[test]
fn a_flow_that_failed_during_an_event_drain_is_returned_with_the_next_buffer() {
    let fixture = load_fixture("gqa-bias");
    let mut h = common::harness(&fixture, &[("chunk-frames", &4u32)]);
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refusing = refuse.clone();
    h.element()
        .unwrap()
        .static_pad("src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            if !refusing.load(std::sync::atomic::Ordering::SeqCst) {
                return gst::PadProbeReturn::Ok;
            }
            info.flow_res = Err(gst::FlowError::Eos);
            gst::PadProbeReturn::Handled
        });
    // Two frames wait for a step of four.
    let bytes = code_bytes(fixture.prefix_codes(3));
    let frame_bytes = 2 * fixture.codebooks;
    h.push(gst::Buffer::from_slice(bytes[..2 * frame_bytes].to_vec()))
        .unwrap();
    refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    h.push_event(gstqwencodec::drain_event());
    assert_eq!(
        h.push(gst::Buffer::from_slice(bytes[2 * frame_bytes..].to_vec())),
        Err(gst::FlowError::Eos)
    );
}

/// A panic in the step thread (a bug: a lock poisoned, an unexpected `None`), planted behind
/// the library's hidden test hook while the thread holds the decoder: an element error naming
/// it, and every later buffer, flush, EOS and the stop returns instead of waiting for a decoder
/// that never comes back. (Before, nothing caught it: the decoder stayed taken and the flush,
/// the drain at EOS and the stop waited for it forever.)
#[test]
fn a_panic_in_the_step_thread_is_an_error_and_nothing_hangs() {
    let fixture = load_fixture("release-tiny");
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes);
    let (flows, errors) = within_hang_limit("after a panic", move || {
        let mut h = common::harness(&fixture, &[("chunk-frames", &1u32)]);
        let element = h.element().unwrap();
        let bus = common::bus_for(&element);
        gstqwencodec::plant_step_panic(&element);
        let first = h.push(gst::Buffer::from_slice(bytes[..frame_bytes].to_vec()));
        let error = bus
            .timed_pop_filtered(
                gst::ClockTime::from_nseconds(HANG.as_nanos() as u64),
                &[gst::MessageType::Error],
            )
            .expect("an error");
        let mut flows = vec![first.map(|_| ())];
        flows.push(
            h.push(gst::Buffer::from_slice(
                bytes[frame_bytes..2 * frame_bytes].to_vec(),
            ))
            .map(|_| ()),
        );
        h.push_event(gst::event::FlushStart::new());
        h.push_event(gst::event::FlushStop::new(true));
        h.push_event(gst::event::Segment::new(
            &gst::FormattedSegment::<gst::ClockTime>::new(),
        ));
        flows.push(
            h.push(gst::Buffer::from_slice(bytes[..frame_bytes].to_vec()))
                .map(|_| ()),
        );
        h.push_event(gst::event::Eos::new());
        element.set_state(gst::State::Null).unwrap();
        let mut errors = vec![describe(&error).unwrap()];
        errors.extend(messages(&bus, gst::MessageType::Error));
        (flows, errors)
    });
    assert!(
        errors[0].contains("The decoding thread failed") && errors[0].contains("a panic planted by a test"),
        "{errors:#?}"
    );
    // The buffer the step took may have gone before the panic; every one after it fails.
    assert_eq!(
        flows[1..],
        [Err(gst::FlowError::Error), Err(gst::FlowError::Error)],
        "{flows:?}"
    );
}

/// Upstream that waits for room does so before the base class takes its stream lock, and the
/// element never lets go of a hold on that lock that the base class took: a base-class path that
/// holds it twice around `handle_frame` (planted here by a probe that takes it once more before
/// the chain function) decodes on. A buffer of more frames than the read-ahead: before, the
/// streaming thread let go of the lock once in `handle_frame` to wait, the step thread waited
/// for the lock still held to push its first step's audio, and no second step ever started.
#[test]
fn a_stream_lock_held_twice_around_handle_frame_hangs_nothing() {
    let fixture = load_fixture("release-tiny");
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes);
    let audio = within_hang_limit("a buffer under a double hold", move || {
        // A read-ahead of two frames.
        let mut h = common::harness(&fixture, &[("chunk-frames", &1u32), ("max-step-frames", &1u32)]);
        let element = h.element().unwrap();
        let decoder = element.downcast_ref::<gst_audio::AudioDecoder>().unwrap();
        let mutex = {
            use gst::glib::translate::ToGlibPtr;
            let decoder: *mut gst_audio::ffi::GstAudioDecoder = decoder.to_glib_none().0;
            // SAFETY: the element's base-class instance, alive for the test.
            unsafe { std::ptr::addr_of_mut!((*decoder).stream_lock) as usize }
        };
        element
            .static_pad("sink")
            .unwrap()
            .add_probe(gst::PadProbeType::BUFFER, move |_, _| {
                // SAFETY: the base class's recursive stream lock, let go below on this thread.
                unsafe { gst::glib::ffi::g_rec_mutex_lock(mutex as *mut _) };
                gst::PadProbeReturn::Ok
            });
        for chunk in bytes.chunks(6 * frame_bytes) {
            let flow = h.push(gst::Buffer::from_slice(chunk.to_vec()));
            // SAFETY: taken once by the probe during the push, on this thread.
            unsafe { gst::glib::ffi::g_rec_mutex_unlock(mutex as *mut _) };
            flow.unwrap();
        }
        h.push_event(gst::event::Eos::new());
        common::audio_of(&common::pull_all(&mut h))
    });
    load_fixture("release-tiny").assert_matches(&audio, "a stream under a double hold");
}
