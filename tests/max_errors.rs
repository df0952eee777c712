//! A code outside the codebook through GstAudioDecoder's error path: an error by default
//! (max-errors 0), a dropped buffer and a fresh stream after it when max-errors allows.

mod common;

use common::{
    audio_of, buffer, bus_for, code_bytes, decoder, errors_and_warnings, init, load_fixture, pull_all,
};
use gst::prelude::*;

/// The fixture's first 5 frames, then 6 frames whose last has code 999 in codebook 3.
fn good_then_bad(fixture: &common::Fixture) -> (Vec<u8>, Vec<u8>) {
    let good = code_bytes(fixture.prefix_codes(5));
    let mut bad = fixture.codes[..6 * fixture.codebooks].to_vec();
    bad[5 * fixture.codebooks + 3] = 999;
    (good, code_bytes(&bad))
}

/// `element`'s bus, and a harness around it playing the fixture's caps.
fn playing(element: &gst::Element, fixture: &common::Fixture) -> (gst::Bus, gst_check::Harness) {
    let bus = bus_for(element);
    let mut h = gst_check::Harness::with_element(element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    (bus, h)
}

#[test]
fn an_invalid_code_is_an_error_by_default() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[]);
    assert_eq!(element.property::<i32>("max-errors"), 0);
    let (bus, mut h) = playing(&element, &fixture);
    let (good, bad) = good_then_bad(&fixture);
    h.push(buffer(&good, None)).unwrap();
    assert_eq!(h.push(buffer(&bad, None)), Err(gst::FlowError::Error));
    let (errors, _) = errors_and_warnings(&bus);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("code 999"), "{errors:?}");
}

#[test]
fn with_max_errors_a_buffer_with_an_invalid_code_is_dropped() {
    init();
    let fixture = load_fixture("gqa-bias");
    let element = decoder(&fixture.dir, &[("max-errors", &-1i32)]);
    let (bus, mut h) = playing(&element, &fixture);
    let (good, bad) = good_then_bad(&fixture);
    h.push(buffer(&good, None)).unwrap();
    h.push(buffer(&bad, None)).unwrap();
    // Decoding goes on after the dropped buffer, as a fresh stream.
    h.push(buffer(&code_bytes(&fixture.codes), None)).unwrap();
    h.push_event(gst::event::Eos::new());
    let audio = audio_of(&pull_all(&mut h));

    let (errors, warnings) = errors_and_warnings(&bus);
    assert_eq!(errors, Vec::<String>::new());
    let warnings = warnings.join("\n");
    // Frame 10 of the stream: the 6th of the buffer after 5 good frames.
    for part in ["Dropped a buffer", "frame 10", "codebook 3", "code 999"] {
        assert!(warnings.contains(part), "{warnings:?} lacks {part:?}");
    }
    let before = 5 * fixture.samples_per_frame;
    assert_eq!(
        audio.len(),
        before + fixture.audio.len(),
        "the bad buffer's frames are dropped"
    );
    fixture.assert_prefix_matches(&audio[..before], 5, "the frames before the dropped buffer");
    fixture.assert_matches(&audio[before..], "the stream after the dropped buffer");
}
