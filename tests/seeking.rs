//! What a player does: seek and stop while a file plays in real time. The decoder paces its
//! upstream (it reads a few steps ahead, not the whole file), and a flush or a stop ends its
//! work after the step in flight: counted in decode steps, never timed. Segments: a new
//! timeline (a looping segment seek) starts a fresh stream; a segment that continues the
//! timeline does not.

use qwencodec_testing as common;

use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{
    Fixture, audio_of, buffer, code_bytes, errors_and_warnings, harness, init, load_fixture, pull_all,
    samples,
};
use gst::prelude::*;

/// Frames in the file played: 4.8 s at 12.5 frames a second. Before the decoder paced its
/// upstream, the whole file was queued in it within the first second, EOS with it, and a seek
/// or a stop waited for every frame left (see each test for the counts then).
const FILE_FRAMES: usize = 60;

/// Longer than anything here takes: past it, something hangs.
const PATIENCE: Duration = Duration::from_secs(60);

/// `filesrc ! capsfilter ! qwencodecparse ! qwencodecdec ! fakesink sync=true` on a file of
/// the fixture's codes over and over, with the decoder's steps counted where a seek or a stop
/// reaches it and where the sink gets its first buffer after a flush.
struct Playback {
    pipeline: gst::Pipeline,
    decoder: gst::Element,
    _file: tempfile::NamedTempFile,
    /// Decode steps when the flush-start left the decoder (no step starts after it).
    steps_at_flush: Arc<Mutex<Option<u64>>>,
    /// Decode steps when the sink got the first buffer after a flush-stop.
    first_buffer_after_flush: mpsc::Receiver<u64>,
    /// EOS reached the decoder's sink pad.
    eos_at_decoder: mpsc::Receiver<()>,
}

fn decode_steps(decoder: &gst::Element) -> u64 {
    decoder
        .property::<gst::Structure>("stats")
        .get("decode-steps")
        .unwrap()
}

impl Playback {
    fn new(fixture: &Fixture) -> Self {
        init();
        let codes: Vec<i16> = fixture
            .codes
            .iter()
            .copied()
            .cycle()
            .take(FILE_FRAMES * fixture.codebooks)
            .collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), code_bytes(&codes)).unwrap();
        let caps = fixture.caps();
        let pipeline = gst::parse::launch(&format!(
            "filesrc location={} ! {caps} ! qwencodecparse seek-context-frames=0 \
             ! qwencodecdec name=decoder device=cpu model-path={} ! fakesink name=sink sync=true",
            file.path().display(),
            fixture.dir.display()
        ))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
        let decoder = pipeline.by_name("decoder").unwrap();
        let sink = pipeline.by_name("sink").unwrap();

        let steps_at_flush = Arc::new(Mutex::new(None));
        decoder
            .static_pad("src")
            .unwrap()
            .add_probe(gst::PadProbeType::EVENT_FLUSH, {
                let (steps_at_flush, decoder) = (steps_at_flush.clone(), decoder.downgrade());
                move |_, info| {
                    if let Some(gst::PadProbeData::Event(event)) = &info.data
                        && event.type_() == gst::EventType::FlushStart
                        && let Some(decoder) = decoder.upgrade()
                    {
                        *steps_at_flush.lock().unwrap() = Some(decode_steps(&decoder));
                    }
                    gst::PadProbeReturn::Ok
                }
            });
        let (first_buffer, first_buffer_after_flush) = mpsc::channel();
        let flushed = Arc::new(Mutex::new(false));
        sink.static_pad("sink").unwrap().add_probe(
            gst::PadProbeType::BUFFER | gst::PadProbeType::EVENT_FLUSH,
            {
                let decoder = decoder.downgrade();
                move |_, info| {
                    match &info.data {
                        Some(gst::PadProbeData::Event(event))
                            if event.type_() == gst::EventType::FlushStop =>
                        {
                            *flushed.lock().unwrap() = true;
                        }
                        Some(gst::PadProbeData::Buffer(_))
                            if std::mem::take(&mut *flushed.lock().unwrap()) =>
                        {
                            if let Some(decoder) = decoder.upgrade() {
                                let _ = first_buffer.send(decode_steps(&decoder));
                            }
                        }
                        _ => (),
                    }
                    gst::PadProbeReturn::Ok
                }
            },
        );
        let (eos, eos_at_decoder) = mpsc::channel();
        decoder
            .static_pad("sink")
            .unwrap()
            .add_probe(gst::PadProbeType::EVENT_DOWNSTREAM, move |_, info| {
                if let Some(gst::PadProbeData::Event(event)) = &info.data
                    && event.type_() == gst::EventType::Eos
                {
                    let _ = eos.send(());
                }
                gst::PadProbeReturn::Ok
            });
        pipeline.set_state(gst::State::Playing).unwrap();
        Self {
            pipeline,
            decoder,
            _file: file,
            steps_at_flush,
            first_buffer_after_flush,
            eos_at_decoder,
        }
    }

    /// Waits until the sink's position reaches `position`.
    fn play_until(&self, position: gst::ClockTime) {
        let deadline = Instant::now() + PATIENCE;
        while self.pipeline.query_position::<gst::ClockTime>() < Some(position) {
            assert!(Instant::now() < deadline, "playback never reached {position}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A flushing seek to `target`; returns the decode steps run from the flush-start leaving
    /// the decoder to the sink's first buffer after the seek.
    fn steps_to_first_buffer_after_seek(&self, target: gst::ClockTime) -> u64 {
        self.pipeline
            .seek_simple(gst::SeekFlags::FLUSH | gst::SeekFlags::ACCURATE, target)
            .unwrap();
        let at_first_buffer = self
            .first_buffer_after_flush
            .recv_timeout(PATIENCE)
            .expect("no buffer after the seek");
        let at_flush = self
            .steps_at_flush
            .lock()
            .unwrap()
            .expect("the flush reached the decoder");
        at_first_buffer - at_flush
    }
}

impl Playback {
    /// Neither an error nor a warning on the bus: a seek or a stop is neither.
    fn assert_nothing_posted(&self) {
        let (errors, warnings) = errors_and_warnings(&self.pipeline.bus().unwrap());
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(warnings, Vec::<String>::new());
    }
}

impl Drop for Playback {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

/// Before the decoder paced its upstream: 7 steps (the rest of the file, queued with EOS in the
/// first second, decoded first).
#[test]
fn a_seek_during_playback_costs_at_most_the_step_in_flight() {
    let playback = Playback::new(&load_fixture("release-tiny"));
    playback.play_until(gst::ClockTime::from_mseconds(800));
    let steps = playback.steps_to_first_buffer_after_seek(gst::ClockTime::from_seconds(3));
    eprintln!("seek during playback: {steps} steps from the flush to the first buffer after it");
    assert!(
        steps <= 2,
        "{steps} decode steps between the seek and its first audio"
    );
    playback.assert_nothing_posted();
}

/// Before: 10 steps (EOS came with the whole file in the first second).
#[test]
fn a_seek_after_eos_reached_the_decoder_costs_at_most_the_step_in_flight() {
    let playback = Playback::new(&load_fixture("release-tiny"));
    playback
        .eos_at_decoder
        .recv_timeout(PATIENCE)
        .expect("EOS never reached the decoder");
    // The decoder is draining what it read ahead, paced by the sink.
    let steps = playback.steps_to_first_buffer_after_seek(gst::ClockTime::from_seconds(1));
    eprintln!("seek after EOS: {steps} steps from the flush to the first buffer after it");
    assert!(
        steps <= 2,
        "{steps} decode steps between the seek and its first audio"
    );
    playback.assert_nothing_posted();
}

/// Before: 8 steps.
#[test]
fn a_stop_during_playback_costs_at_most_the_step_in_flight() {
    let playback = Playback::new(&load_fixture("release-tiny"));
    playback.play_until(gst::ClockTime::from_mseconds(800));
    let before = decode_steps(&playback.decoder);
    playback.pipeline.set_state(gst::State::Null).unwrap();
    let steps = decode_steps(&playback.decoder) - before;
    eprintln!("PLAYING to NULL: {steps} steps");
    assert!(
        steps <= 2,
        "{steps} decode steps between PLAYING→NULL and its return"
    );
    playback.assert_nothing_posted();
}

/// Upstream waits for the decoder: what the decoder has taken stays within its read-ahead
/// (two steps of max-step-frames) of what it has decoded, however fast upstream could go (the
/// whole file is there to read), and it has taken frames ahead of its audio. Sampled until the
/// sink has played 8 frames, every 50 ms.
#[test]
fn a_fast_upstream_waits_for_the_decoder() {
    let fixture = load_fixture("release-tiny");
    let playback = Playback::new(&fixture);
    let samples_per_frame = fixture.samples_per_frame as u64;
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let stats = playback.decoder.property::<gst::Structure>("stats");
        let taken = stats.get::<u64>("frames-in").unwrap();
        let decoded = stats.get::<u64>("samples-out").unwrap() / samples_per_frame;
        seen.push((taken, decoded));
        // 16 waiting, a step of 8 in flight, and the buffer that went over the read-ahead.
        assert!(
            taken <= decoded + 16 + 8 + 1,
            "{taken} frames taken, {decoded} decoded: upstream was not held back"
        );
        if decoded >= 8 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the file never played: (taken, decoded) {seen:?}"
        );
    }
    assert!(
        seen.iter().any(|(taken, decoded)| taken > decoded),
        "the decoder never read ahead of its audio: (taken, decoded) {seen:?}"
    );
    assert!(
        seen.last().unwrap().0 < FILE_FRAMES as u64,
        "the whole file was taken: {seen:?}"
    );
}

/// A segment seek looping the file: after the loop point, the frames are not the continuation
/// of those before it, and the decoder starts afresh there: both passes are upstream's decode.
#[test]
fn a_looping_segment_seek_starts_a_fresh_stream_at_the_loop() {
    init();
    let fixture = load_fixture("release-tiny");
    let pipeline = gst::parse::launch(&format!(
        "filesrc location={} ! {} ! qwencodecparse seek-context-frames=0 \
         ! qwencodecdec device=cpu model-path={} ! appsink name=sink sync=false",
        fixture.dir.join("codes.raw").display(),
        fixture.caps(),
        fixture.dir.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    pipeline.set_state(gst::State::Paused).unwrap();
    pipeline.state(gst::ClockTime::from_seconds(60)).0.unwrap();
    pipeline
        .seek_simple(
            gst::SeekFlags::FLUSH | gst::SeekFlags::SEGMENT,
            gst::ClockTime::ZERO,
        )
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    // A seek takes the pipeline's state lock: made while the sink still prerolls, it would wait
    // for a streaming thread that waits for the state change.
    pipeline.state(gst::ClockTime::from_seconds(60)).0.unwrap();
    let bus = pipeline.bus().unwrap();
    let mut loops = 0;
    while loops < 2 {
        let message = bus
            .timed_pop_filtered(
                gst::ClockTime::from_seconds(60),
                &[gst::MessageType::SegmentDone, gst::MessageType::Error],
            )
            .expect("no segment-done");
        assert_eq!(message.type_(), gst::MessageType::SegmentDone, "{message:?}");
        loops += 1;
        // The loop: back to the start without a flush, once; then to the end as usual.
        let flags = if loops == 1 {
            gst::SeekFlags::SEGMENT
        } else {
            gst::SeekFlags::empty()
        };
        pipeline.seek_simple(flags, gst::ClockTime::ZERO).unwrap();
    }
    let mut audio = Vec::new();
    while let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_seconds(60)) {
        audio.extend(samples(sample.buffer().unwrap()));
        if sink.is_eos() {
            break;
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let pass = fixture.audio.len();
    assert_eq!(
        audio.len(),
        3 * pass,
        "the file three times: played, looped, played again"
    );
    for (index, name) in ["first pass", "after the loop", "after the second seek"]
        .iter()
        .enumerate()
    {
        fixture.assert_matches(&audio[index * pass..(index + 1) * pass], name);
    }
}

fn time_segment(base: gst::ClockTime) -> gst::Event {
    let mut segment = gst::FormattedSegment::<gst::ClockTime>::new();
    segment.set_base(base);
    gst::event::Segment::new(&segment)
}

/// The same segment sent again (as live sources do) keeps the stream going; one that starts a
/// new timeline, without a flush, starts a fresh stream after the frames before it are out.
#[test]
fn a_new_timeline_starts_a_fresh_stream_and_the_same_one_does_not() {
    let fixture = load_fixture("gqa-bias");
    let half = fixture.frames / 2;
    let first_half = code_bytes(fixture.prefix_codes(half));
    let second_half = code_bytes(&fixture.codes[half * fixture.codebooks..]);

    let mut h = harness(&fixture, &[("chunk-frames", &3u32)]);
    h.push(buffer(&first_half, None)).unwrap();
    assert!(h.push_event(time_segment(gst::ClockTime::ZERO)));
    h.push(buffer(&second_half, None)).unwrap();
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&audio_of(&pull_all(&mut h)), "across the same segment again");

    let mut h = harness(&fixture, &[("chunk-frames", &3u32)]);
    h.push(buffer(&first_half, None)).unwrap();
    assert!(h.push_event(time_segment(gst::ClockTime::from_seconds(10))));
    h.push(buffer(&first_half, None)).unwrap();
    h.push_event(gst::event::Eos::new());
    let audio = audio_of(&pull_all(&mut h));
    let half_audio = half * fixture.samples_per_frame;
    assert_eq!(audio.len(), 2 * half_audio);
    fixture.assert_prefix_matches(
        &audio[..half_audio],
        half,
        "before the new timeline (its tail too)",
    );
    fixture.assert_prefix_matches(&audio[half_audio..], half, "after it, from a fresh decoder");
}

/// A stateful decoder cannot decode backwards: a seek at a negative rate is refused where the
/// application asks, quietly (FALSE, as any element refuses a seek it cannot do: nothing on the
/// bus), and a segment at a negative rate (upstream seeked without asking the decoder) is an
/// error naming it. Before, the seek went upstream and the decoder decoded the frames of each
/// reverse chunk as one stream, wrong at every chunk.
#[test]
fn playing_backwards_is_refused_quietly_and_a_backwards_segment_is_an_error() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[]);
    let bus = common::bus_for(&h.element().unwrap());
    h.push(buffer(
        &code_bytes(fixture.prefix_codes(2)),
        Some(gst::ClockTime::ZERO),
    ))
    .unwrap();
    // Seeks that leave the decoder upstream.
    let upstream_seeks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = upstream_seeks.clone();
    h.element().unwrap().static_pad("sink").unwrap().add_probe(
        gst::PadProbeType::EVENT_UPSTREAM,
        move |_, info| {
            if let Some(gst::PadProbeData::Event(event)) = &info.data
                && event.type_() == gst::EventType::Seek
            {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            gst::PadProbeReturn::Ok
        },
    );
    let seek = gst::event::Seek::new(
        -1.0,
        gst::SeekFlags::FLUSH,
        gst::SeekType::Set,
        gst::ClockTime::ZERO,
        gst::SeekType::Set,
        gst::ClockTime::from_seconds(1),
    );
    assert!(
        !h.element().unwrap().send_event(seek),
        "a seek backwards was taken"
    );
    let (errors, warnings) = errors_and_warnings(&bus);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(warnings.is_empty(), "a refused seek posted {warnings:?}");
    assert_eq!(
        upstream_seeks.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "refused by the decoder, not upstream"
    );

    let mut backwards = gst::FormattedSegment::<gst::ClockTime>::new();
    backwards.set_rate(-1.0);
    backwards.set_stop(gst::ClockTime::from_seconds(1));
    // A sticky event counts as pushed once stored; the refusal is the error.
    h.push_event(gst::event::Segment::new(&backwards));
    let (errors, _) = errors_and_warnings(&bus);
    assert!(
        errors.len() == 1 && errors[0].contains("Cannot decode backwards"),
        "{errors:?}"
    );
}
