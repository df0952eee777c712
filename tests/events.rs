//! Serialized events through qwencodecdec: each leaves in its place among the audio, after the
//! audio of the frames that came before it, and the drain event as soon as that audio has gone.

use qwencodec_testing as common;

use std::sync::{Arc, Mutex};

use common::{buffer, code_bytes, harness, load_fixture};
use gst::prelude::*;

/// What left the decoder's source pad, in order.
#[derive(Debug, Clone, PartialEq)]
enum Out {
    Samples(usize),
    /// An event's name (its structure's, for a custom one), with the samples that left before it.
    Event(String, usize),
}

/// Records the samples and the serialized events leaving `h`'s element, each event with the
/// samples before it.
fn record(h: &gst_check::Harness) -> Arc<Mutex<Vec<Out>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let src = h.element().unwrap().static_pad("src").unwrap();
    src.add_probe(
        gst::PadProbeType::BUFFER | gst::PadProbeType::EVENT_DOWNSTREAM,
        move |_, info| {
            let mut log = log.lock().unwrap();
            let before: usize = log
                .iter()
                .map(|out| match out {
                    Out::Samples(n) => *n,
                    Out::Event(..) => 0,
                })
                .sum();
            if let Some(buffer) = info.buffer() {
                log.push(Out::Samples(buffer.size() / 4));
            } else if let Some(event) = info.event()
                && event.is_serialized()
            {
                let name = match event.view() {
                    gst::EventView::CustomDownstream(custom) => {
                        custom.structure().unwrap().name().to_string()
                    }
                    gst::EventView::Tag(tag) => {
                        let title = tag.tag().get::<gst::tags::Title>();
                        format!("tag {}", title.map_or("-".into(), |t| t.get().to_string()))
                    }
                    _ => format!("{:?}", event.type_()),
                };
                log.push(Out::Event(name, before));
            }
            gst::PadProbeReturn::Ok
        },
    );
    seen
}

/// The samples that left before each event named `name`.
fn samples_before(seen: &Mutex<Vec<Out>>, name: &str) -> Vec<usize> {
    seen.lock()
        .unwrap()
        .iter()
        .filter_map(|out| match out {
            Out::Event(n, before) if n == name => Some(*before),
            _ => None,
        })
        .collect()
}

/// An utterance, then the drain event and no more frames: the event leaves as soon as the
/// utterance's last sample has, while the application that sent it waits, not with the next
/// utterance. (Before, the base class held it until its next audio, or EOS.)
#[test]
fn the_drain_event_leaves_after_the_last_sample_of_its_utterance() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    let seen = record(&h);
    // Six frames: one step of four, then a tail of two that only the drain decodes.
    h.push(buffer(&code_bytes(fixture.prefix_codes(6)), None))
        .unwrap();
    assert!(h.push_event(gstqwencodec::drain_event()));
    assert_eq!(
        samples_before(&seen, gstqwencodec::DRAIN_EVENT),
        [6 * fixture.samples_per_frame],
        "{:?}",
        seen.lock().unwrap()
    );
    // Nothing of the utterance after it.
    assert!(matches!(seen.lock().unwrap().last(), Some(Out::Event(..))));
}

/// Events between buffers (a custom event, a TAG, STREAM_GROUP_DONE) leave each after exactly
/// the audio of the frames that came before it, wherever the steps cut the audio. (Before, the
/// base class sent each with its next audio: before the audio of the frames before it.)
#[test]
fn events_leave_after_the_audio_of_the_frames_before_them() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    let seen = record(&h);
    let frame_bytes = 2 * fixture.codebooks;
    let bytes = code_bytes(&fixture.codes);
    let mut at = 0;
    let mut push_frames = |h: &mut gst_check::Harness, frames: usize| {
        h.push(buffer(&bytes[at..at + frames * frame_bytes], None))
            .unwrap();
        at += frames * frame_bytes;
    };
    let custom = |name: &str| gst::event::CustomDownstream::new(gst::Structure::new_empty(name));
    push_frames(&mut h, 3);
    assert!(h.push_event(custom("mark-3")));
    push_frames(&mut h, 2);
    let mut tags = gst::TagList::new();
    tags.get_mut()
        .unwrap()
        .add::<gst::tags::Title>(&"after-5", gst::TagMergeMode::Replace);
    assert!(h.push_event(gst::event::Tag::new(tags)));
    push_frames(&mut h, 5);
    assert!(h.push_event(gst::event::StreamGroupDone::new(gst::GroupId::next())));
    push_frames(&mut h, 1);
    assert!(h.push_event(custom("mark-11")));
    assert!(h.push_event(gst::event::Eos::new()));

    let spf = fixture.samples_per_frame;
    let what = format!("{:?}", seen.lock().unwrap());
    assert_eq!(samples_before(&seen, "mark-3"), [3 * spf], "{what}");
    assert_eq!(samples_before(&seen, "tag after-5"), [5 * spf], "{what}");
    assert_eq!(samples_before(&seen, "StreamGroupDone"), [10 * spf], "{what}");
    assert_eq!(samples_before(&seen, "mark-11"), [11 * spf], "{what}");
    assert_eq!(samples_before(&seen, "Eos"), [11 * spf], "{what}");
}

/// An event between two drain events, with no frame between: nothing waits to go downstream,
/// and it leaves in its place, after the first drain event and before the second. (Before, the
/// base class held it for its next audio, and the second drain event passed it.)
#[test]
fn an_event_between_drains_leaves_between_them() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[]);
    let seen = record(&h);
    h.push(buffer(&code_bytes(fixture.prefix_codes(3)), None))
        .unwrap();
    assert!(h.push_event(gstqwencodec::drain_event()));
    assert!(
        h.push_event(gst::event::CustomDownstream::new(gst::Structure::new_empty(
            "mark"
        )))
    );
    assert!(h.push_event(gstqwencodec::drain_event()));
    let events: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|out| match out {
            Out::Event(name, _) if name == "mark" || name == gstqwencodec::DRAIN_EVENT => Some(name.clone()),
            _ => None,
        })
        .collect();
    let drain = gstqwencodec::DRAIN_EVENT.to_string();
    assert_eq!(events, [drain.clone(), "mark".to_string(), drain]);
}
