//! GAP events in a stateful stream: packets lost over RTP, which `rtpjitterbuffer do-lost=true`
//! reports and the depayloader turns into GAP events, reach `qwencodecdec` (without `plc`)
//! between frames. The frames before a gap are decoded and their audio goes out first, then the
//! gap, then the audio after it from a fresh decoder: time only goes forwards, and the audio and
//! the gaps together cover the whole stream.

use qwencodec_testing as common;

use std::sync::{Arc, Mutex};

use common::{code_bytes, errors_and_warnings, load_fixture, samples};
use gst::prelude::*;

/// What reached the sink, in order.
#[derive(Debug, Clone)]
enum Item {
    Audio {
        pts: gst::ClockTime,
        duration: gst::ClockTime,
        samples: Vec<f32>,
    },
    Gap {
        timestamp: gst::ClockTime,
        duration: gst::ClockTime,
    },
}

impl Item {
    fn start(&self) -> gst::ClockTime {
        match self {
            Item::Audio { pts, .. } => *pts,
            Item::Gap { timestamp, .. } => *timestamp,
        }
    }

    fn end(&self) -> gst::ClockTime {
        match self {
            Item::Audio { pts, duration, .. } => *pts + *duration,
            Item::Gap { timestamp, duration } => *timestamp + *duration,
        }
    }
}

/// Each item's kind and times, for messages.
fn summary(items: &[Item]) -> String {
    items
        .iter()
        .map(|item| {
            let kind = if matches!(item, Item::Gap { .. }) {
                "gap"
            } else {
                "audio"
            };
            format!("{kind} {}-{}", item.start(), item.end())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Packets of one frame each, fed in real time, the 7th and the 18th lost on the way to the
/// jitter buffer. The decoder steps 4 frames at a time, so that when each loss is seen, frames
/// before it still wait for a step (a GAP that passed them would put their audio after it,
/// stamped before it).
#[test]
fn lost_packets_become_gaps_after_the_audio_before_them() {
    let fixture = load_fixture("release-tiny");
    common::init();
    const FRAMES: usize = 30;
    const LOST: [usize; 2] = [6, 17];
    let frame = gst::ClockTime::SECOND
        .mul_div_floor(fixture.samples_per_frame as u64, fixture.sample_rate as u64)
        .unwrap();

    let pipeline = gst::parse::launch(&format!(
        "appsrc name=src is-live=true format=time ! rtpqwencodespay frames-per-packet=1 ! \
         rtpjitterbuffer name=jitter do-lost=true latency=100 ! rtpqwencodesdepay ! \
         qwencodecdec device=cpu chunk-frames=4 model-path={} ! fakesink name=sink sync=false async=false",
        fixture.dir.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let src = pipeline
        .by_name("src")
        .unwrap()
        .downcast::<gst_app::AppSrc>()
        .unwrap();
    src.set_caps(Some(&fixture.caps()));
    let packets = std::sync::atomic::AtomicUsize::new(0);
    pipeline
        .by_name("jitter")
        .unwrap()
        .static_pad("sink")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, _| {
            let index = packets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if LOST.contains(&index) {
                // Consumed (gstreamer-rs drops it): as lost on the network.
                gst::PadProbeReturn::Handled
            } else {
                gst::PadProbeReturn::Ok
            }
        });
    let items: Arc<Mutex<Vec<Item>>> = Arc::default();
    let seen = items.clone();
    pipeline
        .by_name("sink")
        .unwrap()
        .static_pad("sink")
        .unwrap()
        .add_probe(
            gst::PadProbeType::BUFFER | gst::PadProbeType::EVENT_DOWNSTREAM,
            move |_, info| {
                let item = match (info.buffer(), info.event().map(|event| event.view())) {
                    (Some(buffer), _) => Item::Audio {
                        pts: buffer.pts().unwrap(),
                        duration: buffer.duration().unwrap(),
                        samples: samples(buffer),
                    },
                    (_, Some(gst::EventView::Gap(gap))) => {
                        let (timestamp, duration) = gap.get();
                        Item::Gap {
                            timestamp,
                            duration: duration.unwrap(),
                        }
                    }
                    _ => return gst::PadProbeReturn::Ok,
                };
                seen.lock().unwrap().push(item);
                gst::PadProbeReturn::Ok
            },
        );
    let bus = pipeline.bus().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();

    // Each frame at its running time, as a live source pushes it.
    let clock = pipeline.clock().unwrap();
    let base_time = pipeline.base_time().unwrap();
    let start = clock.time() - base_time;
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes);
    for index in 0..FRAMES {
        let pts = start + frame * index as u64;
        let _ = clock.new_single_shot_id(base_time + pts).wait();
        let mut buffer =
            gst::Buffer::from_slice(bytes[index * frame_bytes..(index + 1) * frame_bytes].to_vec());
        let buffer_ref = buffer.get_mut().unwrap();
        buffer_ref.set_pts(pts);
        buffer_ref.set_duration(frame);
        src.push_buffer(buffer).unwrap();
    }
    src.end_of_stream().unwrap();
    let eos = bus.timed_pop_filtered(
        gst::ClockTime::from_seconds(10),
        &[gst::MessageType::Eos, gst::MessageType::Error],
    );
    assert_eq!(
        eos.map(|m| m.type_()),
        Some(gst::MessageType::Eos),
        "{}",
        summary(&items.lock().unwrap())
    );
    pipeline.set_state(gst::State::Null).unwrap();
    let (errors, warnings) = errors_and_warnings(&bus);
    assert!(
        errors.is_empty() && warnings.is_empty(),
        "{errors:?} {warnings:?}"
    );

    let items = items.lock().unwrap().clone();
    let gaps: Vec<&Item> = items
        .iter()
        .filter(|item| matches!(item, Item::Gap { .. }))
        .collect();
    assert_eq!(gaps.len(), LOST.len(), "GAP events: {}", summary(&items));
    // The jitter buffer stamps packets from their arrival: a few ms either way.
    let slack = gst::ClockTime::from_mseconds(10);
    for pair in items.windows(2) {
        assert!(
            pair[1].start() + slack >= pair[0].end(),
            "out of order or overlapping: {}",
            summary(pair)
        );
    }
    for gap in &gaps {
        // The lost frame's time, between the audio before it and the audio after it.
        let duration = gap.end() - gap.start();
        assert!(
            duration + slack >= frame && duration <= frame + slack,
            "{} for one lost frame of {frame}",
            summary(&[(*gap).clone()])
        );
    }
    let first = items.first().unwrap().start();
    let last = items.last().unwrap().end();
    let covered: gst::ClockTime = items.iter().map(|item| item.end() - item.start()).sum();
    let span = last - first;
    assert!(
        covered + slack * 2 >= span && covered <= span + slack * 2,
        "audio and gaps cover {covered} of {span}"
    );

    // The audio between the gaps: before the first loss, upstream's decode of the first
    // frames; after each loss, a fresh decoder's audio of the frames up to the next one.
    let mut pieces: Vec<Vec<f32>> = vec![Vec::new()];
    for item in &items {
        match item {
            Item::Audio { samples, .. } => pieces.last_mut().unwrap().extend_from_slice(samples),
            Item::Gap { .. } => pieces.push(Vec::new()),
        }
    }
    assert_eq!(pieces.len(), LOST.len() + 1, "{}", summary(&items));
    fixture.assert_prefix_matches(&pieces[0], LOST[0], "the audio before the first loss");
    let ends = LOST.iter().skip(1).copied().chain([FRAMES]);
    for ((piece, lost), end) in pieces[1..].iter().zip(LOST).zip(ends) {
        let fresh = fresh_decode(
            &fixture,
            &fixture.codes[(lost + 1) * fixture.codebooks..end * fixture.codebooks],
        );
        assert_eq!(
            piece.len(),
            fresh.len(),
            "the frames {}..{end} after a loss",
            lost + 1
        );
        let error = common::relative_l2(piece, &fresh);
        assert!(
            error <= fixture.tolerance(),
            "the frames {}..{end} after a loss: {error:e} from a fresh decoder's audio",
            lost + 1
        );
    }
}

/// A fresh `qwencodecdec`'s audio of `codes`, as one stream.
fn fresh_decode(fixture: &common::Fixture, codes: &[i16]) -> Vec<f32> {
    let mut h = common::harness(fixture, &[]);
    h.push(common::buffer(&code_bytes(codes), Some(gst::ClockTime::ZERO)))
        .unwrap();
    h.push_event(gst::event::Eos::new());
    common::audio_of(&common::pull_all(&mut h))
}
