//! A code outside the codebook: the frames before it are decoded (nothing taken is lost), the
//! bad frame and those after it in its buffer are dropped. The base class counts the errors
//! since audio last went out (or a flush): within `max-errors` (by default -1, all) a warning
//! and a fresh stream, past it an error. Frames cut across buffers stay aligned across a
//! refused buffer.

use qwencodec_testing as common;

use common::{
    Fixture, audio_of, buffer, bus_for, code_bytes, decoder, errors_and_warnings, init, load_fixture,
    pull_all, unclosed_input_buffers,
};
use gst::prelude::*;

/// The fixture's first 5 frames, then its frames 5 to 10 with code 999 in codebook 3 of the
/// last (frame 10 of the stream).
fn good_then_bad(fixture: &Fixture) -> (Vec<u8>, Vec<u8>) {
    let good = code_bytes(fixture.prefix_codes(5));
    let mut bad = fixture.codes[5 * fixture.codebooks..11 * fixture.codebooks].to_vec();
    bad[5 * fixture.codebooks + 3] = 999;
    (good, code_bytes(&bad))
}

/// `element`'s bus, and a harness around it playing the fixture's caps.
fn playing(element: &gst::Element, fixture: &Fixture) -> (gst::Bus, gst_check::Harness) {
    let bus = bus_for(element);
    let mut h = gst_check::Harness::with_element(element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    (bus, h)
}

/// What gst-inspect-1.0 shows as the default is what a new element holds: the base class's -1.
#[test]
fn max_errors_is_the_base_classs_default() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[]);
    let pspec = element.find_property("max-errors").unwrap();
    let default = pspec.default_value().get::<i32>().unwrap();
    assert_eq!(default, -1, "the base class's default");
    assert_eq!(element.property::<i32>("max-errors"), default);
}

#[test]
fn with_max_errors_0_an_invalid_code_is_an_error_after_the_audio_before_it() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[("max-errors", &0i32)]);
    let (bus, mut h) = playing(&element, &fixture);
    let (good, bad) = good_then_bad(&fixture);
    h.push(buffer(&good, None)).unwrap();
    assert_eq!(h.push(buffer(&bad, None)), Err(gst::FlowError::Error));
    let audio = audio_of(&pull_all(&mut h));
    fixture.assert_prefix_matches(&audio, 10, "the frames before the bad one");
    let (errors, warnings) = errors_and_warnings(&bus);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("frame 10, codebook 3: code 999"), "{errors:?}");
    assert_eq!(warnings, Vec::<String>::new(), "no bytes were dropped at the end");
}

#[test]
fn by_default_the_frames_from_a_bad_code_on_are_dropped_with_a_warning() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[]);
    let (bus, mut h) = playing(&element, &fixture);
    let (good, bad) = good_then_bad(&fixture);
    h.push(buffer(&good, None)).unwrap();
    h.push(buffer(&bad, None)).unwrap();
    // Decoding goes on after the refused buffer, as a fresh stream.
    h.push(buffer(&code_bytes(&fixture.codes), None)).unwrap();
    h.push_event(gst::event::Eos::new());
    let audio = audio_of(&pull_all(&mut h));

    let (errors, warnings) = errors_and_warnings(&bus);
    assert_eq!(errors, Vec::<String>::new());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for part in ["frame 10, codebook 3: code 999", "max-errors -1 lets it pass"] {
        assert!(warnings[0].contains(part), "{warnings:?} lacks {part:?}");
    }
    let before = 10 * fixture.samples_per_frame;
    assert_eq!(
        audio.len(),
        before + fixture.audio.len(),
        "the bad frame is dropped, nothing else"
    );
    fixture.assert_prefix_matches(&audio[..before], 10, "the frames before the bad one");
    fixture.assert_matches(&audio[before..], "the stream after the refused buffer");
    // The frames taken from the refused buffer (those before its bad one) count as taken.
    let stats = element.property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u64>("frames-in").unwrap(), 10 + fixture.frames as u64);
}

/// Buffers that cut frames: `good` holds frames 0-4 and half of frame 5; `refused` completes
/// frame 5, then holds a bad frame and the first 3 bytes of frame 0; `bad_cut` completes that
/// frame with a bad code in it, and holds frame 0's first 3 bytes again; `good_after` completes
/// frame 0 and holds frames 1-5.
struct CutBuffers {
    good: Vec<u8>,
    refused: Vec<u8>,
    bad_cut: Vec<u8>,
    good_after: Vec<u8>,
    /// A whole bad frame.
    bad_frame: Vec<u8>,
}

impl CutBuffers {
    fn new(fixture: &Fixture) -> Self {
        let frame =
            |index: usize| code_bytes(&fixture.codes[index * fixture.codebooks..][..fixture.codebooks]);
        let mut bad_codes = fixture.codes[..fixture.codebooks].to_vec();
        bad_codes[5] = 30000;
        let bad_frame = code_bytes(&bad_codes);
        let half = frame(0).len() / 2;
        let good = [code_bytes(fixture.prefix_codes(5)), frame(5)[..half].to_vec()].concat();
        let refused = [&frame(5)[half..], &bad_frame[..], &frame(0)[..3]].concat();
        let bad_cut = [&bad_frame[3..], &frame(0)[..3]].concat();
        let good_after = [
            frame(0)[3..].to_vec(),
            code_bytes(&fixture.codes[fixture.codebooks..6 * fixture.codebooks]),
        ]
        .concat();
        Self {
            good,
            refused,
            bad_cut,
            good_after,
            bad_frame,
        }
    }
}

#[test]
fn max_errors_lets_that_many_refused_buffers_in_a_row_pass() {
    init();
    let fixture = load_fixture("release-tiny");
    let element = decoder(&fixture.dir, &[("max-errors", &2i32)]);
    let (bus, mut h) = playing(&element, &fixture);
    let cut = CutBuffers::new(&fixture);
    h.push(buffer(&cut.good, None)).unwrap();
    assert_eq!(h.push(buffer(&cut.refused, None)), Ok(gst::FlowSuccess::Ok));
    assert_eq!(h.push(buffer(&cut.bad_cut, None)), Ok(gst::FlowSuccess::Ok));
    assert_eq!(h.push(buffer(&cut.bad_cut, None)), Err(gst::FlowError::Error));
    // Frame 5 was completed by the refused buffer before its bad frame: decoded, not lost.
    fixture.assert_prefix_matches(&audio_of(&pull_all(&mut h)), 6, "the frames before the bad one");
    let (errors, warnings) = errors_and_warnings(&bus);
    // The first refused buffer's frame 5 went out before it was counted; none after.
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .all(|warning| warning.contains("max-errors 2 lets it pass")),
        "{warnings:?}"
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("code 30000"), "{errors:?}");
}

#[test]
fn a_buffer_taken_resets_the_count_and_cut_frames_stay_aligned() {
    init();
    let fixture = load_fixture("release-tiny");
    let element = decoder(&fixture.dir, &[("max-errors", &2i32)]);
    let (bus, mut h) = playing(&element, &fixture);
    let cut = CutBuffers::new(&fixture);
    for data in [
        &cut.good,
        &cut.refused,
        &cut.bad_cut,
        &cut.good_after,
        &cut.bad_frame,
        &cut.bad_frame,
    ] {
        assert_eq!(h.push(buffer(data, None)), Ok(gst::FlowSuccess::Ok));
    }
    h.push_event(gst::event::Eos::new());
    let audio = audio_of(&pull_all(&mut h));
    let (errors, warnings) = errors_and_warnings(&bus);
    assert_eq!(errors, Vec::<String>::new());
    // Two, then two again after the good buffer's audio went out: never three without audio
    // between them; no bytes dropped at the end.
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    // The frame whose first bytes the second refused buffer held is whole again with the good
    // buffer's: the fresh stream is frames 0-5, as the first was.
    let six = 6 * fixture.samples_per_frame;
    assert_eq!(audio.len(), 2 * six);
    fixture.assert_prefix_matches(&audio[..six], 6, "the stream before the refused buffers");
    fixture.assert_prefix_matches(&audio[six..], 6, "the stream after them");
}

/// The start of a frame that a refused buffer left (its bytes after its last whole frame) is
/// completed by the next buffer, which counts that frame as its own: its audio goes out with
/// that buffer's, none of it dropped as belonging to no buffer.
#[test]
fn a_cut_frame_left_by_a_refused_buffer_counts_as_the_next_buffers() {
    init();
    let fixture = load_fixture("release-tiny");
    let element = decoder(&fixture.dir, &[("max-errors", &1i32)]);
    let (_bus, mut h) = playing(&element, &fixture);
    let cut = CutBuffers::new(&fixture);
    for data in [&cut.good, &cut.refused, &cut.good_after] {
        assert_eq!(h.push(buffer(data, None)), Ok(gst::FlowSuccess::Ok));
    }
    h.push_event(gst::event::Eos::new());
    let audio = audio_of(&pull_all(&mut h));
    let six = 6 * fixture.samples_per_frame;
    assert_eq!(audio.len(), 2 * six, "frames 0-5, then frames 0-5 again");
    fixture.assert_prefix_matches(&audio[..six], 6, "the stream before the refused buffer");
    fixture.assert_prefix_matches(&audio[six..], 6, "the stream after it");
    assert_eq!(
        unclosed_input_buffers(&element),
        0,
        "input buffers left unclosed at EOS"
    );
}

/// A flush forgets the errors counted (the base class's count): with `max-errors` 1, a refused
/// buffer, a flush, and another refused buffer are two warnings, no error.
#[test]
fn a_flush_forgets_the_refused_buffers_counted() {
    init();
    let fixture = load_fixture("release-tiny");
    let element = decoder(&fixture.dir, &[("max-errors", &1i32)]);
    let (bus, mut h) = playing(&element, &fixture);
    let cut = CutBuffers::new(&fixture);
    assert_eq!(h.push(buffer(&cut.bad_frame, None)), Ok(gst::FlowSuccess::Ok));
    h.push_event(gst::event::FlushStart::new());
    h.push_event(gst::event::FlushStop::new(true));
    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    assert_eq!(h.push(buffer(&cut.bad_frame, None)), Ok(gst::FlowSuccess::Ok));
    let (errors, warnings) = errors_and_warnings(&bus);
    assert_eq!(errors, Vec::<String>::new());
    assert_eq!(warnings.len(), 2, "{warnings:?}");
}
