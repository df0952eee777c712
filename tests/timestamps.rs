//! qwencodecdec's output timing: timestamps exact to the sample, and audio that leaves as each
//! step ends.

use qwencodec_testing as common;

use common::{audio_of, buffer, code_bytes, harness, load_fixture, pull_all, samples};
use gst::prelude::*;

/// Output timestamps are sample-exact from the first input PTS, with durations that tile.
fn check_timestamps(first_pts: gst::ClockTime, chunk_frames: u32) {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("chunk-frames", &chunk_frames)]);
    let frame = gst::ClockTime::SECOND / 400;
    let frame_bytes = fixture.codebooks * 2;
    let bytes = code_bytes(&fixture.codes);
    // Buffers of 1 to 3 whole frames, stamped as a parser would.
    let mut at = 0;
    let mut sizes = [1usize, 3, 2].into_iter().cycle();
    while at < fixture.frames {
        let frames = sizes.next().unwrap().min(fixture.frames - at);
        let pts = first_pts + frame * at as u64;
        h.push(buffer(
            &bytes[at * frame_bytes..(at + frames) * frame_bytes],
            Some(pts),
        ))
        .unwrap();
        at += frames;
    }
    h.push_event(gst::event::Eos::new());
    let buffers = pull_all(&mut h);
    let mut samples_before = 0u64;
    for buffer in &buffers {
        let expected_pts = first_pts
            + gst::ClockTime::SECOND
                .mul_div_floor(samples_before, 16000)
                .unwrap();
        assert_eq!(
            buffer.pts(),
            Some(expected_pts),
            "buffer after {samples_before} samples"
        );
        let count = samples(buffer).len() as u64;
        let end = first_pts
            + gst::ClockTime::SECOND
                .mul_div_floor(samples_before + count, 16000)
                .unwrap();
        assert_eq!(buffer.duration(), Some(end - expected_pts));
        samples_before += count;
    }
    assert_eq!(samples_before as usize, fixture.audio.len());
}

#[test]
fn timestamps_start_at_zero() {
    check_timestamps(gst::ClockTime::ZERO, 1);
    check_timestamps(gst::ClockTime::ZERO, 4);
}

#[test]
fn timestamps_start_at_the_first_input_pts() {
    check_timestamps(gst::ClockTime::from_seconds(10), 1);
    check_timestamps(gst::ClockTime::from_seconds(10), 3);
}

#[test]
fn untimestamped_input_starts_at_the_segment() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[]);
    let mut segment = gst::FormattedSegment::<gst::ClockTime>::new();
    segment.set_start(gst::ClockTime::from_seconds(5));
    segment.set_time(gst::ClockTime::from_seconds(5));
    h.push_event(gst::event::Segment::new(&segment));
    h.push(buffer(&code_bytes(&fixture.codes[..4 * fixture.codebooks]), None))
        .unwrap();
    let first = h.pull().unwrap();
    assert_eq!(first.pts(), Some(gst::ClockTime::from_seconds(5)));
}

/// Audio leaves as each step ends, not when the input buffer's last frame is decoded: one
/// buffer of 100 frames in one-frame steps gives 100 output buffers, the first alone.
#[test]
fn a_long_buffer_leaves_step_by_step() {
    let fixture = load_fixture("gqa-bias");
    let mut h = harness(&fixture, &[("max-step-frames", &1u32)]);
    let pts = gst::ClockTime::from_seconds(3);
    h.push(buffer(&code_bytes(fixture.prefix_codes(100)), Some(pts)))
        .unwrap();
    let first = h.pull().unwrap();
    assert_eq!(
        samples(&first).len(),
        fixture.samples_per_frame,
        "the first step's audio, alone"
    );
    assert_eq!(first.pts(), Some(pts));
    h.push_event(gst::event::Eos::new());
    let mut buffers = vec![first];
    buffers.extend(pull_all(&mut h));
    assert_eq!(buffers.len(), 100, "one output buffer per step");
    let mut samples_before = 0u64;
    for buffer in &buffers {
        let at = |count: u64| pts + gst::ClockTime::SECOND.mul_div_floor(count, 16000).unwrap();
        assert_eq!(
            buffer.pts(),
            Some(at(samples_before)),
            "after {samples_before} samples"
        );
        samples_before += samples(buffer).len() as u64;
        assert_eq!(
            buffer.pts().unwrap() + buffer.duration().unwrap(),
            at(samples_before)
        );
    }
    fixture.assert_prefix_matches(&audio_of(&buffers), 100, "100 frames in one-frame steps");
}

/// The drain event (the end of an utterance on a live stream, without EOS): the frames that wait
/// for a full step come out at once, and the next frame starts a fresh stream.
#[test]
fn the_drain_event_decodes_the_tail_and_starts_afresh() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    let six = code_bytes(fixture.prefix_codes(6));
    h.push(buffer(&six, None)).unwrap();
    assert!(h.push_event(gstqwencodec::drain_event()));
    let first = audio_of(&pull_all(&mut h));
    fixture.assert_prefix_matches(
        &first,
        6,
        "the frames before the drain, the 2-frame tail included",
    );
    h.push(buffer(&six, None)).unwrap();
    h.push_event(gst::event::Eos::new());
    let second = audio_of(&pull_all(&mut h));
    fixture.assert_prefix_matches(&second, 6, "after the drain, from a fresh decoder");
}

/// Other custom events pass through and end nothing: the stream decodes as one.
#[test]
fn another_custom_event_ends_nothing() {
    let fixture = load_fixture("release-tiny");
    let mut h = harness(&fixture, &[("chunk-frames", &4u32)]);
    let bytes = code_bytes(&fixture.codes);
    let six = 6 * 2 * fixture.codebooks;
    h.push(buffer(&bytes[..six], None)).unwrap();
    assert!(
        h.push_event(gst::event::CustomDownstream::new(gst::Structure::new_empty(
            "application-marker"
        )))
    );
    h.push(buffer(&bytes[six..], None)).unwrap();
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&audio_of(&pull_all(&mut h)), "a stream with another event in it");
}
