//! The latency qwencodecdec reports in a live pipeline: measured, the same for elements with
//! the same settings on one model, counting the batches its steps join, so that synchronised
//! sinks get every buffer in time, and raised (with a LATENCY message) when more streams join or
//! its frames keep coming out late. The tests take turns: the figures depend on the streams
//! open on a model.

use qwencodec_testing as common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{Fixture, code_bytes, init, load_fixture};
use gst::prelude::*;
use gst_base::prelude::*;

/// Held by each test: the streams open on a model change what its elements report.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `appsrc ! qwencodecdec ! fakesink`, the source live unless `bulk`.
struct Live {
    pipeline: gst::Pipeline,
    src: gst_app::AppSrc,
    decoder: gst::Element,
}

impl Live {
    fn new(fixture: &Fixture, properties: &[(&str, &dyn ToValue)], bulk: bool) -> Self {
        let live = Self::stopped(fixture, properties, bulk);
        // A live pipeline reaches PLAYING once data flows; the latency is set before, at
        // READY→PAUSED.
        live.pipeline.set_state(gst::State::Playing).unwrap();
        live
    }

    /// The pipeline built, in NULL.
    fn stopped(fixture: &Fixture, properties: &[(&str, &dyn ToValue)], bulk: bool) -> Self {
        init();
        let src = gst_app::AppSrc::builder()
            .caps(&fixture.caps())
            .format(gst::Format::Time)
            .is_live(!bulk)
            // A live source stamps what it pushes with the running time.
            .do_timestamp(!bulk)
            .block(true)
            .build();
        let decoder = common::decoder(&fixture.dir, properties);
        let sink = gst::ElementFactory::make("fakesink")
            .property("sync", false)
            .build()
            .unwrap();
        let pipeline = gst::Pipeline::new();
        pipeline.add_many([src.upcast_ref(), &decoder, &sink]).unwrap();
        gst::Element::link_many([src.upcast_ref(), &decoder, &sink]).unwrap();
        Self {
            pipeline,
            src,
            decoder,
        }
    }

    /// The decoder's answer to a latency query (upstream's, a live source's nothing, included).
    fn latency(&self) -> (bool, gst::ClockTime, Option<gst::ClockTime>) {
        let mut query = gst::query::Latency::new();
        assert!(self.decoder.static_pad("src").unwrap().query(&mut query));
        query.result()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

/// A step of `chunk_frames` frames of one stream on `model`, timed here: the second fastest of
/// 15 after 3 to warm up, as the model estimates its warm step.
fn timed_step(model: &Arc<gstqwencodec::model::Model>, fixture: &Fixture, chunk_frames: usize) -> Duration {
    use gstqwencodec::model::{StreamDecoder, TailStrategy};
    let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
    let codes = &fixture.codes[..chunk_frames * fixture.codebooks];
    for _ in 0..3 {
        decoder.push(codes).unwrap();
    }
    let mut times: Vec<Duration> = (0..15)
        .map(|_| {
            let started = Instant::now();
            decoder.push(codes).unwrap();
            started.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[1]
}

#[test]
fn the_latency_is_measured_and_the_same_for_the_same_settings() {
    let _turn = one_at_a_time();
    let fixture = load_fixture("gqa-bias");
    // Held, so that the model and its timed steps outlive each element.
    let model =
        gstqwencodec::model::Model::shared(&fixture.dir, tch::Device::Cpu, gstqwencodec::model::Dtype::F32)
            .unwrap();
    let frame =
        gst::ClockTime::SECOND.mul_div_floor(fixture.samples_per_frame as u64, fixture.sample_rate as u64);
    let frame = frame.unwrap();
    for chunk_frames in [1u32, 5] {
        let first = Live::new(&fixture, &[("chunk-frames", &chunk_frames)], false);
        let (live, min, max) = first.latency();
        assert!(live);
        let max = max.expect("a maximum");
        let waited = frame * (chunk_frames as u64 - 1);
        // Alone on its model: the frames it waits for, then its warm step, timed once per model
        // and shape (the figure the element measured), and half of it again for scheduling.
        let cuda_graphs = first.decoder.property::<bool>("cuda-graphs");
        let step = model
            .warm_step_time(1, chunk_frames as usize, cuda_graphs)
            .unwrap();
        // That figure against a clock: the same step timed here, by the same estimate (the
        // second fastest), within a factor of 4 either way (a load that comes and goes between
        // the two timings, not a figure in the wrong unit, or of another shape, or zero).
        let here = timed_step(&model, &fixture, chunk_frames as usize);
        let ratio = step.as_secs_f64() / here.as_secs_f64();
        assert!(
            (0.25..=4.0).contains(&ratio),
            "chunk-frames {chunk_frames}: the element's warm step {step:?}, {here:?} timed here"
        );
        let step = gst::ClockTime::from_nseconds((step + step / 2).as_nanos() as u64);
        assert_eq!(min, waited + step, "chunk-frames {chunk_frames}: the minimum");
        // On top, the read-ahead: two steps of max-step-frames (8), at least chunk-frames.
        let read_ahead = frame * 2 * 8u64.max(chunk_frames as u64);
        assert_eq!(max, min + read_ahead, "chunk-frames {chunk_frames}: the maximum");
        drop(first);
        // Another element on the same model with the same settings, alone on it as the first
        // was: the same figures.
        let second = Live::new(&fixture, &[("chunk-frames", &chunk_frames)], false);
        assert_eq!(second.latency(), (true, min, Some(max)));
    }
}

/// With `processing-latency` set, the latency query answers the frames a step waits for and
/// that time, measuring nothing, whatever the steps take.
#[test]
fn a_fixed_processing_latency_is_what_the_latency_query_answers() {
    let _turn = one_at_a_time();
    let fixture = load_fixture("gqa-bias");
    let frame =
        gst::ClockTime::SECOND.mul_div_floor(fixture.samples_per_frame as u64, fixture.sample_rate as u64);
    let frame = frame.unwrap();
    let processing = gst::ClockTime::from_mseconds(70);
    let chunk_frames = 3u32;
    let fixed = Live::new(
        &fixture,
        &[
            ("chunk-frames", &chunk_frames),
            ("processing-latency", &processing.nseconds()),
        ],
        false,
    );
    assert_eq!(
        fixed.decoder.property::<u64>("processing-latency"),
        processing.nseconds()
    );
    let (live, min, max) = fixed.latency();
    assert!(live);
    assert_eq!(
        min,
        frame * 2 + processing,
        "the frames waited and the processing latency"
    );
    assert_eq!(max, Some(min + frame * 2 * 8), "the read-ahead on top");
}

/// A live element stepping alone (max-batch 1) reports a step alone; once another element on
/// its model decodes a backlog in large steps, its frames wait behind those and come out later
/// than that: it raises the latency and posts LATENCY, at most once a second.
#[test]
fn late_frames_raise_the_latency_with_a_latency_message() {
    let _turn = one_at_a_time();
    let fixture = load_fixture("release-tiny");
    let live = Live::new(&fixture, &[("max-batch", &1u32)], false);
    let (_, before, _) = live.latency();
    let bus = live.pipeline.bus().unwrap();
    while bus.pop().is_some() {}

    let stop = Arc::new(AtomicBool::new(false));
    let feed = |src: gst_app::AppSrc, frames: usize, pause: Duration, stop: Arc<AtomicBool>| {
        let bytes: Vec<u8> = code_bytes(&fixture.codes)
            .iter()
            .copied()
            .cycle()
            .take(frames * 2 * fixture.codebooks)
            .collect();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if src.push_buffer(gst::Buffer::from_slice(bytes.clone())).is_err() {
                    break;
                }
                std::thread::sleep(pause);
            }
        })
    };
    let live_feeder = feed(live.src.clone(), 1, Duration::from_millis(20), stop.clone());
    let bulk = Live::new(&fixture, &[("max-step-frames", &256u32)], true);
    let bulk_feeder = feed(bulk.src.clone(), 1024, Duration::ZERO, stop.clone());

    let started = Instant::now();
    let mut messages = 0;
    while started.elapsed() < Duration::from_secs(3) {
        if let Some(message) =
            bus.timed_pop_filtered(gst::ClockTime::from_mseconds(100), &[gst::MessageType::Latency])
            && message.src() == Some(live.decoder.upcast_ref())
        {
            messages += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (_, after, _) = live.latency();
    drop(bulk);
    let _ = live.pipeline.set_state(gst::State::Null);
    live_feeder.join().unwrap();
    bulk_feeder.join().unwrap();
    assert!(
        messages >= 1,
        "no LATENCY message while steps waited behind 256-frame ones"
    );
    assert!(
        messages as f64 <= elapsed.ceil() + 1.0,
        "{messages} LATENCY messages in {elapsed:.1} s"
    );
    assert!(after > before, "the minimum stayed at {before}");
}

/// Frames sent ahead of their time (a talker faster than real time, stamping each frame with
/// the running time it plays at) are late only past their time: decoded before it, however long
/// their steps took, they do not raise the latency. Taken as due from their arrival, or from
/// running time 0 in a pipeline that has run for 100 s, the steps of a buffer of many frames,
/// up to 256 frames each, raised it.
#[test]
fn frames_sent_ahead_of_their_time_do_not_raise_the_latency() {
    let _turn = one_at_a_time();
    let fixture = load_fixture("release-tiny");
    // Steps of up to 256 frames, each far longer than the one-frame step the latency counts.
    let live = Live::stopped(&fixture, &[("max-step-frames", &256u32)], false);
    let (pipeline, src, decoder) = (&live.pipeline, &live.src, &live.decoder);
    // Stamped below, ahead of their time.
    src.set_property("do-timestamp", false);
    // A pipeline that has been playing for 100 s.
    let clock = gst::SystemClock::obtain();
    pipeline.use_clock(Some(&clock));
    pipeline.set_start_time(gst::ClockTime::NONE);
    pipeline.set_base_time(clock.time() - gst::ClockTime::from_seconds(100));
    pipeline.set_state(gst::State::Playing).unwrap();
    let (_, before, _) = live.latency();
    let bus = pipeline.bus().unwrap();
    // The start's own LATENCY message is not the test's.
    while bus.pop().is_some() {}

    let frames = 4000;
    let frame =
        gst::ClockTime::SECOND.mul_div_floor(fixture.samples_per_frame as u64, fixture.sample_rate as u64);
    let bytes: Vec<u8> = code_bytes(&fixture.codes)
        .iter()
        .copied()
        .cycle()
        .take(frames * 2 * fixture.codebooks)
        .collect();
    let mut buffer = gst::Buffer::from_slice(bytes);
    {
        let buffer = buffer.get_mut().unwrap();
        // The first frame plays a second from now.
        let now = pipeline.current_running_time().expect("a running time");
        assert!(now >= gst::ClockTime::from_seconds(100), "{now}");
        buffer.set_pts(now + gst::ClockTime::SECOND);
        buffer.set_duration(frame.unwrap() * frames as u64);
    }
    src.push_buffer(buffer).unwrap();
    src.end_of_stream().unwrap();
    let mut messages = 0;
    loop {
        let message = bus
            .timed_pop_filtered(
                gst::ClockTime::from_seconds(60),
                &[
                    gst::MessageType::Latency,
                    gst::MessageType::Eos,
                    gst::MessageType::Error,
                ],
            )
            .expect("EOS within a minute");
        match message.view() {
            gst::MessageView::Eos(_) => break,
            gst::MessageView::Error(error) => panic!("{error:?}"),
            _ if message.src() == Some(decoder.upcast_ref()) => messages += 1,
            _ => {}
        }
    }
    let (_, after, _) = live.latency();
    assert_eq!(
        (messages, after),
        (0, before),
        "LATENCY messages and the minimum, for frames decoded before their time"
    );
}

/// Behind a synchronised sink that holds each buffer until its time plus a latency longer than
/// a frame (its 400 ms processing deadline, as a WebRTC sender's clock-synchronised output
/// holds), the step thread waits in each push while the next frames come: that wait is
/// downstream's, and the element's latency does not follow it. Counted as the element's, it
/// raised the latency, which made the sink hold longer, and so on.
#[test]
fn a_sink_holding_audio_to_its_time_does_not_raise_the_latency() {
    let _turn = one_at_a_time();
    let fixture = load_fixture("release-tiny");
    init();
    let src = gst_app::AppSrc::builder()
        .caps(&fixture.caps())
        .format(gst::Format::Time)
        .is_live(true)
        .do_timestamp(true)
        .build();
    let decoder = common::decoder(&fixture.dir, &[]);
    let rendered = Arc::new(AtomicUsize::new(0));
    let sink = gst::ElementFactory::make("fakesink")
        .property("sync", true)
        .property("async", false)
        .property("processing-deadline", 400_000_000u64)
        .property("signal-handoffs", true)
        .build()
        .unwrap();
    let counter = rendered.clone();
    sink.connect("handoff", false, move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
        None
    });
    let pipeline = gst::Pipeline::new();
    pipeline.add_many([src.upcast_ref(), &decoder, &sink]).unwrap();
    gst::Element::link_many([src.upcast_ref(), &decoder, &sink]).unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let latency = || {
        let mut query = gst::query::Latency::new();
        assert!(decoder.static_pad("src").unwrap().query(&mut query));
        query.result().1
    };
    let before = latency();
    let bus = pipeline.bus().unwrap();

    // Frames in real time for 3 s: at least three chances (one a second) to raise the latency.
    let frame = Duration::from_secs_f64(fixture.samples_per_frame as f64 / fixture.sample_rate as f64);
    let bytes = code_bytes(&fixture.codes);
    let frame_bytes = 2 * fixture.codebooks;
    let started = Instant::now();
    let mut sent = 0u32;
    let mut messages = 0;
    for chunk in bytes.chunks(frame_bytes).cycle() {
        if started.elapsed() >= Duration::from_secs(3) {
            break;
        }
        src.push_buffer(gst::Buffer::from_slice(chunk.to_vec())).unwrap();
        sent += 1;
        let due = frame * sent;
        while let Some(wait) = due.checked_sub(started.elapsed()) {
            let wait = gst::ClockTime::from_nseconds(wait.as_nanos() as u64);
            match bus.timed_pop_filtered(wait, &[gst::MessageType::Latency]) {
                Some(message) if message.src() == Some(decoder.upcast_ref()) => messages += 1,
                Some(_) => {}
                None => break,
            }
        }
    }
    let after = latency();
    let _ = pipeline.set_state(gst::State::Null);
    let rendered = rendered.load(Ordering::Relaxed);
    // The audio flowed: the sink rendered most of it, all but the last 400 ms or so.
    assert!(
        rendered > sent as usize / 2,
        "{rendered} buffers rendered of {sent} frames sent"
    );
    // Scheduling on few cores may still raise a tiny model's few milliseconds (to 9-19 ms
    // measured); the hold counted as the element's took it from 3 ms to 207 and 428 ms in 3 s.
    println!("{messages} LATENCY messages; the minimum from {before} to {after}");
    assert!(
        after < before + gst::ClockTime::from_mseconds(100),
        "the minimum rose from {before} to {after} ({messages} LATENCY messages) behind a sink \
         that holds audio to its time"
    );
}

/// Live streams `appsrc is-live=true ! qwencodecdec ! fakesink sync=true qos=true`, all in one
/// pipeline, fed a frame each in real time on the pipeline's clock (stamped with the running
/// time at which it is pushed, as a live source stamps what it captures).
struct LiveStreams {
    pipeline: gst::Pipeline,
    srcs: Vec<gst_app::AppSrc>,
    decoders: Vec<gst::Element>,
    sinks: Vec<gst_base::BaseSink>,
    /// Buffers that reached their sink after their time (running time plus the latency the
    /// sink was given).
    late: Arc<AtomicUsize>,
    rendered: Arc<AtomicUsize>,
}

impl LiveStreams {
    fn new(fixture: &Fixture, streams: usize) -> Self {
        init();
        let pipeline = gst::Pipeline::new();
        let late = Arc::new(AtomicUsize::new(0));
        let rendered = Arc::new(AtomicUsize::new(0));
        let mut srcs = Vec::new();
        let mut decoders = Vec::new();
        let mut sinks = Vec::new();
        for _ in 0..streams {
            let src = gst_app::AppSrc::builder()
                .caps(&fixture.caps())
                .format(gst::Format::Time)
                .is_live(true)
                .build();
            let decoder = common::decoder(&fixture.dir, &[]);
            // With the sinks' own 20 ms for the scheduling of the many threads on few cores
            // (their processing deadline, which the pipeline's latency includes).
            let sink = gst::ElementFactory::make("fakesink")
                .property("sync", true)
                .property("qos", true)
                // Playing at once, without a first buffer: the pipeline configures its latency
                // before any is fed.
                .property("async", false)
                .build()
                .unwrap();
            pipeline.add_many([src.upcast_ref(), &decoder, &sink]).unwrap();
            gst::Element::link_many([src.upcast_ref(), &decoder, &sink]).unwrap();
            decoders.push(decoder);
            let (late, rendered) = (late.clone(), rendered.clone());
            let base_sink = sink.clone().downcast::<gst_base::BaseSink>().unwrap();
            sinks.push(base_sink.clone());
            sink.static_pad("sink")
                .unwrap()
                .add_probe(gst::PadProbeType::BUFFER, move |pad, info| {
                    let (Some(buffer), Some(clock), Some(base_time)) =
                        (info.buffer(), base_sink.clock(), base_sink.base_time())
                    else {
                        return gst::PadProbeReturn::Ok;
                    };
                    let segment = pad.sticky_event::<gst::event::Segment>(0).unwrap();
                    let segment = segment.segment().downcast_ref::<gst::ClockTime>().unwrap();
                    let running = segment.to_running_time(buffer.pts()).unwrap();
                    let now = clock.time() - base_time;
                    if now > running + base_sink.latency() {
                        late.fetch_add(1, Ordering::Relaxed);
                    }
                    rendered.fetch_add(1, Ordering::Relaxed);
                    gst::PadProbeReturn::Ok
                });
            srcs.push(src);
        }
        // As gst-launch does: a LATENCY message has the pipeline ask its elements again. One
        // recalculation at a time, as gst-launch's main loop runs them: the eight decoders post
        // theirs together, and call_async's threads ran two at once, the one that asked first
        // answering the sinks last, with a latency from before the last decoder's (on a busy
        // machine, the sinks then kept 40-47 ms while the pipeline answered 52-57 ms).
        let weak = pipeline.downgrade();
        let recalculating = Arc::new(Mutex::new(()));
        pipeline.bus().unwrap().set_sync_handler(move |_, message| {
            if message.type_() == gst::MessageType::Latency
                && let Some(pipeline) = weak.upgrade()
            {
                let recalculating = recalculating.clone();
                pipeline.call_async(move |pipeline| {
                    let _one = recalculating.lock().unwrap();
                    let _ = pipeline.recalculate_latency();
                });
            }
            gst::BusSyncReply::Pass
        });
        pipeline.set_state(gst::State::Playing).unwrap();
        pipeline.state(gst::ClockTime::from_seconds(10)).0.unwrap();
        Self {
            pipeline,
            srcs,
            decoders,
            sinks,
            late,
            rendered,
        }
    }

    /// Waits until every sink has been given `latency` at least. The pipeline gives its latency
    /// asynchronously, after the LATENCY messages of the decoders as their streams open on the
    /// model: a frame fed before would be held to an older figure (the sinks' 0 at the start),
    /// which is the bus's timing, not the decoder's.
    fn await_sinks_given(&self, latency: gst::ClockTime) {
        let started = Instant::now();
        while self.sinks.iter().any(|sink| sink.latency() < latency) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the sinks were not given the pipeline's latency {latency} within 5 s: they have {:?}, \
                 the pipeline answers {} now",
                self.sinks.iter().map(|sink| sink.latency()).collect::<Vec<_>>(),
                self.latency()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The pipeline's latency: the largest minimum of its sinks' paths, which it gives them.
    fn latency(&self) -> gst::ClockTime {
        let mut query = gst::query::Latency::new();
        assert!(self.pipeline.query(&mut query));
        query.result().1
    }

    /// Pushes `frames` frames to every stream, one every frame's time, from a thread.
    fn feed(&self, fixture: &Fixture, frames: usize) -> std::thread::JoinHandle<()> {
        let frame = gst::ClockTime::SECOND
            .mul_div_floor(fixture.samples_per_frame as u64, fixture.sample_rate as u64)
            .unwrap();
        let frame_bytes = 2 * fixture.codebooks;
        let bytes = code_bytes(&fixture.codes);
        let srcs = self.srcs.clone();
        let clock = self.pipeline.clock().unwrap();
        let base_time = self.pipeline.base_time().unwrap();
        std::thread::spawn(move || {
            let start = clock.time() - base_time;
            for index in 0..frames {
                let due = start + frame * index as u64;
                let _ = clock.new_single_shot_id(base_time + due).wait();
                let at = index % (bytes.len() / frame_bytes) * frame_bytes;
                for src in &srcs {
                    let mut buffer = gst::Buffer::from_slice(bytes[at..at + frame_bytes].to_vec());
                    let buffer_ref = buffer.get_mut().unwrap();
                    // Stamped when pushed, as a live source stamps what it captures: this thread
                    // coming late among the test's many on two cores is not the decoder's delay.
                    buffer_ref.set_pts(clock.time() - base_time);
                    buffer_ref.set_duration(frame);
                    if src.push_buffer(buffer).is_err() {
                        return;
                    }
                }
            }
        })
    }
}

impl Drop for LiveStreams {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

/// Eight live streams of one model batch their steps: a frame can wait for a batch without it
/// and then for its own. The pipeline's latency counts that, and every buffer reaches its
/// synchronised sink in time; a stream alone reports less. Their frames, pushed one stream
/// after another, run in one batch: a live stream's step waits, within what its latency allows
/// for, for the others (without that wait the first stream's step runs alone, and the rest after
/// it). Before the figures counted batches, the
/// eight reported one step alone (2.5 ms here against 10 ms for a batch of eight timed, 12-38
/// ms as they ran) and 99 to 258 of their 320 buffers came late.
#[test]
fn eight_live_streams_batching_reach_synchronised_sinks_in_time() {
    let _turn = one_at_a_time();
    let fixture = load_fixture("release-tiny");
    const FRAMES: usize = 40;
    // The batches the eight streams' model runs, timed by the engine as they run.
    let model =
        gstqwencodec::model::Model::shared(&fixture.dir, tch::Device::Cpu, gstqwencodec::model::Dtype::F32)
            .unwrap();
    let batch_times = Arc::new(Mutex::new(Vec::new()));
    model.observe_batches({
        let batch_times = batch_times.clone();
        move |run| {
            if run.rows == 8 {
                batch_times.lock().unwrap().push(run.time);
            }
        }
    });

    let alone = LiveStreams::new(&fixture, 1);
    let alone_latency = alone.latency();
    let alone_feeder = alone.feed(&fixture, 2 * FRAMES);

    let eight = LiveStreams::new(&fixture, 8);
    let eight_latency = eight.latency();
    // The decoders' own part of it, before any frame (the sinks add their processing deadline).
    let decoders_latency = eight
        .decoders
        .iter()
        .map(|decoder| {
            let mut query = gst::query::Latency::new();
            assert!(decoder.static_pad("src").unwrap().query(&mut query));
            query.result().1
        })
        .max()
        .unwrap();
    eight.await_sinks_given(eight_latency);
    eight.feed(&fixture, FRAMES).join().unwrap();
    // Every buffer reaches its sink (a busy machine may take longer than the last one's time).
    let started = Instant::now();
    while eight.rendered.load(Ordering::Relaxed) < 8 * FRAMES && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let rendered = eight.rendered.load(Ordering::Relaxed);
    let late = eight.late.load(Ordering::Relaxed);
    assert_eq!(rendered, 8 * FRAMES, "buffers at the sinks");
    // What this must catch: figures that leave the batches out, with which 99 to 258 of the 320
    // came late. What it tolerates: a machine whose two cores other processes keep busy (5 to 6
    // threads runnable: builds and browser tests beside it) made 0 to 32 late, the decoder
    // raising its latency after the first; on a quiet machine none is. A fifth lies between.
    assert!(
        late <= 8 * FRAMES / 5,
        "{late} of {rendered} buffers late at {eight_latency}: more than a fifth"
    );
    println!("{late} of {rendered} buffers late at {eight_latency}");
    // Without the hold, each frame's steps run as batches of 1 and 7 rows: 6.25 on average.
    // Held, 7.8-8.0; over the eight streams, not each, since a stream whose thread a busy
    // machine keeps from handing over its step within the hold (6 ms here) runs apart for that
    // frame, and which one varies: with two busy loops on the two cores 7.1-7.9 rows, one
    // stream's as few as 5.5.
    let rows: Vec<f64> = eight
        .decoders
        .iter()
        .map(|decoder| {
            let stats = decoder.property::<gst::Structure>("stats");
            stats.get::<f64>("mean-batch-rows").unwrap()
        })
        .collect();
    let mean_rows = rows.iter().sum::<f64>() / rows.len() as f64;
    println!("the streams' batches: {mean_rows} rows on average ({rows:?})");
    assert!(
        mean_rows >= 6.5,
        "batches of {mean_rows} rows on average; each stream's: {rows:?}"
    );
    assert!(
        eight_latency > alone_latency,
        "eight streams report {eight_latency}, one alone {alone_latency}"
    );
    // And from above: the minimum counts two batches of eight and half as much again, and the
    // rejoin grace (see src/qwencodecdec/latency.rs); against the batches of eight as they ran,
    // a figure over twice that is not what the streams wait for.
    let mut times = batch_times.lock().unwrap().clone();
    assert!(!times.is_empty(), "no batch of eight ran");
    times.sort_unstable();
    let median = times[times.len() / 2];
    let bound = 2 * (3 * median + gstqwencodec::model::REJOIN_GRACE);
    println!(
        "eight streams: the decoders report {decoders_latency}, batches of eight took {median:?} \
         (median of {})",
        times.len()
    );
    assert!(
        decoders_latency.nseconds() as u128 <= bound.as_nanos(),
        "eight streams' decoders report {decoders_latency}, over {bound:?}: twice three batches of \
         eight as they ran ({median:?}) and the grace"
    );

    drop(eight);
    drop(alone);
    alone_feeder.join().unwrap();
}
