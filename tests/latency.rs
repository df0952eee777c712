//! The latency qwencodecdec reports in a live pipeline: measured, the same for elements with
//! the same settings on one model, and raised (with a LATENCY message) when its steps slow down.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Fixture, code_bytes, init, load_fixture};
use gst::prelude::*;

/// `appsrc ! qwencodecdec ! fakesink`, the source live unless `bulk`.
struct Live {
    pipeline: gst::Pipeline,
    src: gst_app::AppSrc,
    decoder: gst::Element,
}

impl Live {
    fn new(fixture: &Fixture, properties: &[(&str, &dyn ToValue)], bulk: bool) -> Self {
        init();
        let src = gst_app::AppSrc::builder()
            .caps(&fixture.caps())
            .format(gst::Format::Time)
            .is_live(!bulk)
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
        // A live pipeline reaches PLAYING once data flows; the latency is set before, at
        // READY→PAUSED.
        pipeline.set_state(gst::State::Playing).unwrap();
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

#[test]
fn the_latency_is_measured_and_the_same_for_the_same_settings() {
    let fixture = load_fixture("gqa-bias");
    let frame =
        gst::ClockTime::SECOND.mul_div_floor(fixture.samples_per_frame as u64, fixture.sample_rate as u64);
    let frame = frame.unwrap();
    for chunk_frames in [1u32, 5] {
        let first = Live::new(&fixture, &[("chunk-frames", &chunk_frames)], false);
        let (live, min, max) = first.latency();
        assert!(live);
        let max = max.expect("a maximum");
        let waited = frame * (chunk_frames as u64 - 1);
        assert!(
            min > waited,
            "chunk-frames {chunk_frames}: {min} is no more than the {waited} waited"
        );
        assert!(max >= min, "{max} < {min}");
        // 16 streams may batch with it: a batch in flight and its own, each estimated as 16
        // steps alone, and the engine's rejoin grace.
        let alone = min - waited;
        assert!(max >= waited + alone * 32, "{max}: not the largest batch's");
        // Another element on the same model with the same settings: the same figures.
        let second = Live::new(&fixture, &[("chunk-frames", &chunk_frames)], false);
        assert_eq!(second.latency(), (true, min, Some(max)));
    }
}

/// A live element stepping alone (max-batch 1) reports a small maximum; once another element on
/// its model decodes a backlog in large steps, its steps wait behind those: it raises the
/// maximum and posts LATENCY, at most once a second.
#[test]
fn slower_steps_raise_the_latency_with_a_latency_message() {
    let fixture = load_fixture("release-tiny");
    let live = Live::new(&fixture, &[("max-batch", &1u32)], false);
    let (_, _, before) = live.latency();
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
    let (_, _, after) = live.latency();
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
    assert!(after > before, "the maximum stayed at {before:?}");
}
