//! Codes over RTP: `rtpqwencodespay` and `rtpqwencodesdepay` against the codes sent, upstream's
//! decode, lost and bad packets, and real UDP with reordering.

use qwencodec_testing as common;

use std::sync::{Arc, Mutex};

use gst::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

use common::{Fixture, code_bytes, load_fixture};

const FRAME: gst::ClockTime = gst::ClockTime::from_mseconds(80);

/// What passed the depayloader's sink pad: sequence number, RTP timestamp, marker.
type Packets = Arc<Mutex<Vec<(u16, u32, bool)>>>;

/// A harness around `pipeline` (a bin description whose depayloader is named `depay`) fed the
/// fixture's codes caps, with every packet into the depayloader recorded, and those whose
/// index `drop` says dropped before it.
fn rtp_harness(
    fixture: &Fixture,
    pipeline: &str,
    drop: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> (gst_check::Harness, Packets) {
    common::init();
    let mut h = gst_check::Harness::new_parse(pipeline);
    h.set_src_caps(fixture.caps());
    let packets: Packets = Arc::default();
    let depay = h
        .element()
        .unwrap()
        .downcast::<gst::Bin>()
        .unwrap()
        .by_name("depay")
        .unwrap();
    let seen = packets.clone();
    depay
        .static_pad("sink")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            let Some(buffer) = info.buffer() else {
                return gst::PadProbeReturn::Ok;
            };
            let rtp = gst_rtp::RTPBuffer::from_buffer_readable(buffer).unwrap();
            let mut seen = seen.lock().unwrap();
            let index = seen.len();
            seen.push((rtp.seq(), rtp.timestamp(), rtp.is_marker()));
            if drop(index) {
                // Handled: the probe consumed it (gstreamer-rs drops it), which Drop would leave
                // GStreamer 1.22 to unref again.
                gst::PadProbeReturn::Handled
            } else {
                gst::PadProbeReturn::Ok
            }
        });
    h.play();
    (h, packets)
}

/// `codes` in buffers cut at random (frames across buffers), each stamped with the time of
/// the frame its first byte belongs to, the first flagged DISCONT if `discont`.
fn push_codes(
    h: &mut gst_check::Harness,
    fixture: &Fixture,
    codes: &[i16],
    first_frame: usize,
    discont: bool,
    seed: u64,
) {
    let frame_bytes = fixture.codebooks * 2;
    let bytes = code_bytes(codes);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut at = 0;
    for (index, mut buffer) in common::random_buffers(&bytes, frame_bytes, &mut rng)
        .into_iter()
        .enumerate()
    {
        let size = buffer.size();
        {
            let buffer = buffer.get_mut().unwrap();
            buffer.set_pts(FRAME * (first_frame + at / frame_bytes) as u64);
            if discont && index == 0 {
                buffer.set_flags(gst::BufferFlags::DISCONT);
            }
        }
        at += size;
        h.push(buffer).unwrap();
    }
}

/// Codes of the buffers out of a depayloader, in order.
fn codes_of(buffers: &[gst::Buffer]) -> Vec<u8> {
    buffers
        .iter()
        .flat_map(|b| b.map_readable().unwrap().to_vec())
        .collect()
}

#[test]
fn codes_cross_bit_identical_with_exact_times_at_every_packet_size() {
    let fixture = load_fixture("release-tiny");
    // The MTU (1400 bytes) holds 63 release frames; 64 asks for more.
    for frames_per_packet in 1..=64usize {
        let (mut h, packets) = rtp_harness(
            &fixture,
            &format!("rtpqwencodespay frames-per-packet={frames_per_packet} ! rtpqwencodesdepay name=depay"),
            |_| false,
        );
        push_codes(
            &mut h,
            &fixture,
            &fixture.codes,
            0,
            false,
            frames_per_packet as u64,
        );
        h.push_event(gst::event::Eos::new());
        let buffers = common::pull_all(&mut h);
        assert_eq!(
            codes_of(&buffers),
            code_bytes(&fixture.codes),
            "{frames_per_packet} frames a packet"
        );
        let per_packet = frames_per_packet.min(63);
        let mut frame = 0;
        for (index, buffer) in buffers.iter().enumerate() {
            let frames = buffer.size() / (fixture.codebooks * 2);
            assert_eq!(frames, per_packet.min(fixture.frames - frame), "packet {index}");
            assert_eq!(buffer.pts(), Some(FRAME * frame as u64), "packet {index}'s time");
            assert_eq!(buffer.duration(), Some(FRAME * frames as u64));
            frame += frames;
        }
        let packets = packets.lock().unwrap();
        assert_eq!(packets.len(), buffers.len());
        for (index, pair) in packets.windows(2).enumerate() {
            assert_eq!(pair[1].0, pair[0].0.wrapping_add(1), "sequence numbers");
            // The RTP clock is the audio's: 1920 samples a frame at 24 kHz.
            let samples = (fixture.samples_per_frame * per_packet) as u32;
            assert_eq!(
                pair[1].1.wrapping_sub(pair[0].1),
                samples,
                "packet {index} to the next"
            );
        }
        assert!(packets[0].2, "the first packet starts the stream");
        assert!(packets[1..].iter().all(|p| !p.2), "no other marker");
    }
}

#[test]
fn audio_over_rtp_matches_upstream() {
    let fixture = load_fixture("release-tiny");
    let (mut h, _) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay frames-per-packet=3 ! rtpqwencodesdepay name=depay ! qwencodecdec device=cpu model-path={}",
            fixture.dir.display()
        ),
        |_| false,
    );
    push_codes(&mut h, &fixture, &fixture.codes, 0, false, 7);
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&common::audio_of(&common::pull_all(&mut h)), "over RTP");
}

/// A stream of two utterances: the marker starts the second, whose audio is a fresh decoder's.
#[test]
fn the_marker_starts_an_utterance_that_decodes_fresh() {
    let fixture = load_fixture("release-tiny");
    let (first, second) = (23, 40);
    let (mut h, packets) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay frames-per-packet=2 ! rtpqwencodesdepay name=depay ! qwencodecdec device=cpu model-path={}",
            fixture.dir.display()
        ),
        |_| false,
    );
    push_codes(&mut h, &fixture, fixture.prefix_codes(first), 0, false, 1);
    push_codes(&mut h, &fixture, fixture.prefix_codes(second), first, true, 2);
    h.push_event(gst::event::Eos::new());
    let audio = common::audio_of(&common::pull_all(&mut h));
    let split = first * fixture.samples_per_frame;
    fixture.assert_prefix_matches(&audio[..split], first, "the first utterance");
    fixture.assert_prefix_matches(&audio[split..], second, "the second utterance");
    let markers: Vec<usize> = packets
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .filter_map(|(index, p)| p.2.then_some(index))
        .collect();
    // 23 frames in packets of 2: the last of the first utterance holds one.
    assert_eq!(markers, [0, 12]);
}

/// A receiver that joins late starts with the first packet it gets, as a fresh decoder: here
/// after 9 packets of other codes, the fixture's codes decode as upstream's.
#[test]
fn a_receiver_joining_mid_stream_decodes_fresh_from_its_first_packet() {
    let fixture = load_fixture("release-tiny");
    let late = 9;
    let mut codes: Vec<i16> = fixture.codes[fixture.codes.len() - late * fixture.codebooks..].to_vec();
    codes.extend_from_slice(&fixture.codes);
    let (mut h, _) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay ! rtpqwencodesdepay name=depay ! qwencodecdec device=cpu model-path={}",
            fixture.dir.display()
        ),
        move |index| index < late,
    );
    push_codes(&mut h, &fixture, &codes, 0, false, 3);
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&common::audio_of(&common::pull_all(&mut h)), "joined late");
}

/// Without `plc` on the decoder a lost packet restarts it: the lost frame's GAP and the DISCONT
/// on the next buffer end the frames before the loss (exact), and the decoder starts fresh
/// after it; nothing stalls.
#[test]
fn after_a_lost_packet_the_decoder_can_start_fresh() {
    let fixture = load_fixture("release-tiny");
    let first = 31;
    let mut codes = fixture.prefix_codes(first).to_vec();
    codes.extend_from_slice(&fixture.codes);
    // One frame a packet: packet 30, the first utterance's last frame, is lost.
    let (mut h, _) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay ! rtpqwencodesdepay name=depay ! qwencodecdec device=cpu model-path={}",
            fixture.dir.display()
        ),
        move |index| index == first - 1,
    );
    push_codes(&mut h, &fixture, &codes, 0, false, 4);
    h.push_event(gst::event::Eos::new());
    let audio = common::audio_of(&common::pull_all(&mut h));
    let split = (first - 1) * fixture.samples_per_frame;
    fixture.assert_prefix_matches(&audio[..split], first - 1, "before the loss");
    fixture.assert_matches(&audio[split..], "after the loss");
}

/// The GAP events out of a harness so far: time and duration.
fn gaps(h: &mut gst_check::Harness) -> Vec<(gst::ClockTime, Option<gst::ClockTime>)> {
    std::iter::from_fn(|| h.try_pull_event())
        .filter_map(|event| match event.view() {
            gst::EventView::Gap(gap) => {
                assert!(
                    gap.gap_flags().contains(gst::GapFlags::DATA),
                    "a loss's GAP says missing data"
                );
                Some(gap.get())
            }
            _ => None,
        })
        .collect()
}

/// Lost packets go downstream as GAP events of exactly their frames' time, flagged missing
/// data, and the packet after them DISCONT (no RESYNC: no new utterance); no frame is made up.
#[test]
fn lost_frames_go_downstream_as_a_gap_of_their_time() {
    let fixture = load_fixture("release-tiny");
    let q = fixture.codebooks;
    // Packets of 2 frames: packet 3 (frames 6-7) lost, then packets 10 to 13 (frames 20-27).
    let lost = |index: usize| index == 3 || (10..14).contains(&index);
    let (mut h, _) = rtp_harness(
        &fixture,
        "rtpqwencodespay frames-per-packet=2 ! rtpqwencodesdepay name=depay",
        lost,
    );
    push_codes(&mut h, &fixture, &fixture.codes, 0, false, 6);
    h.push_event(gst::event::Eos::new());
    let buffers = common::pull_all(&mut h);
    let mut expected = Vec::new();
    for frame in 0..fixture.frames {
        if !lost(frame / 2) {
            expected.extend_from_slice(&fixture.codes[frame * q..(frame + 1) * q]);
        }
    }
    assert!(
        codes_of(&buffers) == code_bytes(&expected),
        "the codes received, no more"
    );
    assert_eq!(
        gaps(&mut h),
        [(FRAME * 6, Some(FRAME * 2)), (FRAME * 20, Some(FRAME * 8))]
    );
    let flagged: Vec<_> = buffers
        .iter()
        .filter(|b| !restart_flags(b).is_empty())
        .map(|b| (b.pts(), restart_flags(b)))
        .collect();
    let start = gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC;
    assert_eq!(
        flagged,
        [
            (Some(gst::ClockTime::ZERO), start),
            (Some(FRAME * 8), gst::BufferFlags::DISCONT),
            (Some(FRAME * 28), gst::BufferFlags::DISCONT),
        ]
    );
}

/// `qwencodecdec`'s audio of `codes`, as one stream.
fn element_decode(fixture: &Fixture, codes: &[i16]) -> Vec<f32> {
    let mut h = common::harness(fixture, &[]);
    h.push(common::buffer(&code_bytes(codes), Some(gst::ClockTime::ZERO)))
        .unwrap();
    h.push_event(gst::event::Eos::new());
    common::audio_of(&common::pull_all(&mut h))
}

/// With `plc=true` the decoder fills lost frames with copies of the last frame received and
/// goes on: its audio is the decode of the codes with those copies in place of the lost ones.
/// A loss longer than `max-plc-frames` restarts it: the frames after decode fresh.
#[test]
fn with_plc_the_decoder_fills_lost_frames_with_the_last_one_and_goes_on() {
    let fixture = load_fixture("release-tiny");
    let q = fixture.codebooks;
    // As above: frames 6-7 lost (filled with frame 5), then frames 20-27 (more than 6).
    let lost = |index: usize| index == 3 || (10..14).contains(&index);
    let (mut h, _) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay frames-per-packet=2 ! rtpqwencodesdepay name=depay ! \
             qwencodecdec name=dec device=cpu plc=true max-plc-frames=6 model-path={}",
            fixture.dir.display()
        ),
        lost,
    );
    push_codes(&mut h, &fixture, &fixture.codes, 0, false, 6);
    h.push_event(gst::event::Eos::new());
    let audio = common::audio_of(&common::pull_all(&mut h));

    let mut filled = fixture.codes[..20 * q].to_vec();
    let last_received = fixture.codes[5 * q..6 * q].to_vec();
    filled[6 * q..8 * q].copy_from_slice(&[last_received.clone(), last_received].concat());
    let mut expected = element_decode(&fixture, &filled);
    expected.extend(element_decode(&fixture, &fixture.codes[28 * q..]));
    assert_eq!(
        audio.len(),
        expected.len(),
        "the frames received and the two filled"
    );
    let error = common::relative_l2(&audio, &expected);
    assert!(
        error < fixture.tolerance(),
        "relative L2 {error:e} against the filled codes' decode"
    );
    // Not what a restart at the short loss would give either.
    let mut restarted = element_decode(&fixture, &fixture.codes[..6 * q]);
    restarted.extend(vec![0.0; 2 * fixture.samples_per_frame]);
    let restart_error = common::relative_l2(&audio[..restarted.len()], &restarted);
    assert!(
        restart_error > 10.0 * fixture.tolerance(),
        "{restart_error:e}: no fill"
    );
    let dec = h
        .element()
        .unwrap()
        .downcast::<gst::Bin>()
        .unwrap()
        .by_name("dec")
        .unwrap();
    let stats = dec.property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u64>("frames-concealed").unwrap(), 2, "{stats}");
}

/// An RTP packet of this format with `payload`, sequence number `seq` and RTP time `rtp_time`
/// (its PTS the same time), the marker bit set if `marker`.
fn packet(payload: &[u8], seq: u16, rtp_time: u32, marker: bool) -> gst::Buffer {
    use gst_rtp::prelude::RTPBufferExt;
    let mut buffer = gst::Buffer::new_rtp_with_sizes(payload.len() as u32, 0, 0).unwrap();
    {
        let buffer = buffer.get_mut().unwrap();
        buffer.set_pts(gst::ClockTime::from_nseconds(
            u64::from(rtp_time) * 1_000_000 / 24,
        ));
        let mut rtp = gst_rtp::RTPBuffer::from_buffer_writable(buffer).unwrap();
        rtp.set_seq(seq);
        rtp.set_payload_type(96);
        rtp.set_timestamp(rtp_time);
        rtp.set_marker(marker);
        rtp.payload_mut().unwrap().copy_from_slice(payload);
    }
    buffer
}

fn depay_caps(extra: &[(&str, &str)]) -> gst::Caps {
    let mut caps = gst::Caps::builder("application/x-rtp")
        .field("media", "audio")
        .field("clock-rate", 24_000i32)
        .field("encoding-name", "X-QWEN3-TTS-CODES")
        .field("payload", 96i32);
    for (name, value) in extra {
        caps = caps.field(*name, *value);
    }
    caps.build()
}

const RELEASE_FIELDS: [(&str, &str); 4] = [
    ("version", "1"),
    ("codebooks", "16"),
    ("codebook-size", "2048"),
    ("samples-per-frame", "1920"),
];

/// Frames of two 10-bit codes, a codebook of 1000: payloads small enough to write by hand.
const SMALL_FIELDS: [(&str, &str); 4] = [
    ("version", "1"),
    ("codebooks", "2"),
    ("codebook-size", "1000"),
    ("samples-per-frame", "1920"),
];

/// The payload of one SMALL frame, `codes`, in utterance `utterance`: the version and frame
/// count (0x40: version 1, one frame), the utterance number, then 2 codes of 10 bits and 4 zero
/// bits.
fn small_frame(utterance: u8, codes: [u16; 2]) -> Vec<u8> {
    let [a, b] = codes;
    vec![
        0x40,
        utterance,
        (a >> 2) as u8,
        ((a & 3) << 6 | b >> 4) as u8,
        ((b & 15) << 4) as u8,
    ]
}

/// A depayloader with `properties` fed SMALL packets, its messages on a bus of its own.
fn small_depay(properties: &[(&str, &str)]) -> (gst_check::Harness, gst::Bus) {
    common::init();
    let mut h = gst_check::Harness::new("rtpqwencodesdepay");
    let depay = h.element().unwrap();
    for (name, value) in properties {
        depay.set_property_from_str(name, value);
    }
    let bus = common::bus_for(&depay);
    h.set_src_caps(depay_caps(&SMALL_FIELDS));
    h.play();
    (h, bus)
}

/// A depayloader given `caps` and two packets of one release frame (the caps are sent again
/// before the second): whether a buffer came out, and the errors it posted.
fn depay_with_caps(caps: gst::Caps) -> (bool, Vec<String>) {
    common::init();
    let mut h = gst_check::Harness::new("rtpqwencodesdepay");
    let bus = common::bus_for(&h.element().unwrap());
    h.set_src_caps(caps);
    h.play();
    _ = h.push(packet(&[0x40; 24], 0, 0, true));
    _ = h.push(packet(&[0x40; 24], 1, 1920, false));
    (
        h.try_pull().is_some(),
        common::messages(&bus, gst::MessageType::Error),
    )
}

/// What a depayloaded buffer tells the decoder: DISCONT (start fresh) and RESYNC (a new
/// utterance).
fn restart_flags(buffer: &gst::BufferRef) -> gst::BufferFlags {
    buffer.flags() & (gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC | gst::BufferFlags::MARKER)
}

/// A field of an element's `codes-stats`.
fn stat(element: &gst::Element, name: &str) -> u64 {
    let stats = element.property::<gst::Structure>("codes-stats");
    stats
        .get::<u64>(name)
        .unwrap_or_else(|_| panic!("no {name} in {stats}"))
}

/// Each kind of bad packet (short, a frame count its bytes do not hold, another version, a code
/// outside a codebook of 1000) is dropped with a warning naming what was wrong.
#[test]
fn a_bad_packet_is_dropped_with_a_warning_naming_what_was_wrong() {
    let bad = [
        (vec![0x40u8, 0, 0, 0], "take 5 bytes, the payload has 4"),
        (vec![0x41u8, 0, 0, 0, 0], "2 frames"),
        (vec![0x00u8, 0, 0, 0], "version 0, this receiver reads version 1"),
        (vec![0x40u8], "shorter than the 2-byte header"),
        (vec![0x40u8, 0, 0xff, 0xc0, 0], "code 1023 is outside 0..1000"),
    ];
    for (payload, why) in bad {
        let (mut h, bus) = small_depay(&[]);
        h.push(packet(&payload, 0, 0, true)).unwrap();
        assert!(h.try_pull().is_none(), "{why}: a buffer out");
        let (errors, warnings) = common::errors_and_warnings(&bus);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains(why), "{warnings:?} should say {why:?}");
        assert_eq!(stat(&h.element().unwrap(), "packets-bad"), 1);
    }
}

/// Bad packets in a row: one warning, then none for a second, then one that counts those
/// dropped in between. Their frames are lost frames, a GAP of their time like any loss's, and
/// nothing else is lost.
#[test]
fn bad_packets_warn_at_most_once_a_second_with_a_count() {
    let (mut h, bus) = small_depay(&[]);
    let bad = [0x40u8, 0, 0xff, 0xc0, 0];
    h.push(packet(&small_frame(0, [1, 2]), 0, 0, true)).unwrap();
    for seq in 1..5u16 {
        h.push(packet(&bad, seq, 1920 * u32::from(seq), false)).unwrap();
    }
    h.push(packet(&small_frame(0, [3, 4]), 5, 1920 * 5, false))
        .unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(buffers.len(), 2);
    assert_eq!(&*buffers[0].map_readable().unwrap(), &code_bytes(&[1, 2])[..]);
    assert_eq!(&*buffers[1].map_readable().unwrap(), &code_bytes(&[3, 4])[..]);
    assert_eq!(gaps(&mut h), [(FRAME, Some(FRAME * 4))]);
    let (errors, warnings) = common::errors_and_warnings(&bus);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("Packet 1 dropped"), "{warnings:?}");

    // A second later, the next bad packet is warned of with the three in between.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    h.push(packet(&bad, 6, 1920 * 6, false)).unwrap();
    let (_, warnings) = common::errors_and_warnings(&bus);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("Packet 6 dropped")
            && warnings[0].contains("(3 more bad packets dropped since the last warning, 5 in all)"),
        "{warnings:?}"
    );
    let depay = h.element().unwrap();
    let counts =
        ["packets", "frames", "packets-bad", "frames-lost", "packets-lost"].map(|name| stat(&depay, name));
    assert_eq!(counts, [2, 2, 5, 4, 0]);
}

/// A bad packet's frames are lost frames like any: a GAP of their time, and the next good
/// packet flagged DISCONT (no RESYNC), although no sequence number is missing, so the base
/// class saw no gap to flag.
#[test]
fn after_a_bad_packet_the_next_is_a_discontinuity() {
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(0, [1, 2]), 0, 0, true)).unwrap();
    h.push(packet(&[0x40u8, 0, 0xff, 0xc0, 0], 1, 1920, false))
        .unwrap();
    h.push(packet(&small_frame(0, [3, 4]), 2, 1920 * 2, false))
        .unwrap();
    h.push(packet(&small_frame(0, [5, 6]), 3, 1920 * 3, false))
        .unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(
        codes_of(&buffers),
        code_bytes(&[1, 2, 3, 4, 5, 6]),
        "nothing made up"
    );
    assert_eq!(gaps(&mut h), [(FRAME, Some(FRAME))]);
    assert_eq!(
        buffers.iter().map(|b| restart_flags(b)).collect::<Vec<_>>(),
        [
            gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC,
            gst::BufferFlags::DISCONT,
            gst::BufferFlags::empty(),
        ]
    );
}

/// Caps without the format's fields are an error that names the missing one.
#[test]
fn caps_without_the_format_are_an_error_naming_what_is_missing() {
    common::init();
    for missing in RELEASE_FIELDS.map(|(name, _)| name) {
        let fields: Vec<_> = RELEASE_FIELDS
            .into_iter()
            .filter(|(name, _)| *name != missing)
            .collect();
        let (_, errors) = depay_with_caps(depay_caps(&fields));
        assert!(
            errors.len() == 1 && errors[0].contains(&format!("no {missing}")),
            "{missing}: {errors:?}"
        );
    }
}

/// Caps of another version of the payload format than 1 are an error that says which the
/// receiver reads.
#[test]
fn caps_of_another_version_are_an_error_naming_the_one_read() {
    common::init();
    for version in ["0", "2"] {
        let mut fields = RELEASE_FIELDS;
        fields[0] = ("version", version);
        let (out, errors) = depay_with_caps(depay_caps(&fields));
        assert!(!out);
        let said = format!("version={version}; this receiver reads version 1");
        assert!(errors.len() == 1 && errors[0].contains(&said), "{errors:?}");
    }
}

/// A frame length from an SDP too large for a frame rate is an error naming it, not a panic.
#[test]
fn a_frame_length_beyond_any_rate_is_an_error_naming_it() {
    common::init();
    let mut fields = RELEASE_FIELDS;
    fields[3] = ("samples-per-frame", "18446744073709551615");
    let (out, errors) = depay_with_caps(depay_caps(&fields));
    assert!(!out);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("samples-per-frame 18446744073709551615 is beyond")),
        "{errors:?}"
    );
}

/// The caps' fields at the edges of what the format takes: accepted up to each bound (1024
/// codebooks, a codebook of 32768, i32::MAX samples a frame, the version as an integer), an
/// error naming the field past it (0, or one more).
#[test]
fn caps_at_the_edges_of_the_format() {
    common::init();
    let cases: [(&str, &str, Option<&str>); 11] = [
        ("clock-rate", "int 2147483647", None),
        ("codebooks", "1024", None),
        (
            "codebooks",
            "1025",
            Some("1025 codebooks of 2048 codes are beyond any codes' range"),
        ),
        ("codebooks", "0", Some("codebooks is not a positive whole number")),
        ("codebook-size", "32768", None),
        (
            "codebook-size",
            "32769",
            Some("16 codebooks of 32769 codes are beyond any codes' range"),
        ),
        ("samples-per-frame", "2147483647", None),
        (
            "samples-per-frame",
            "2147483648",
            Some("samples-per-frame 2147483648 is beyond"),
        ),
        ("version", "int 1", None),
        ("version", "int 2", Some("the caps say version=2;")),
        (
            "version",
            "double 1",
            Some("the caps say a version that is no number;"),
        ),
    ];
    for (name, value, error) in cases {
        let mut caps =
            depay_caps(&RELEASE_FIELDS.map(|(field, text)| (field, if field == name { "" } else { text })));
        {
            let fields = caps.make_mut().structure_mut(0).unwrap();
            match value.split_once(' ') {
                Some(("int", number)) => fields.set(name, number.parse::<i32>().unwrap()),
                Some(("double", number)) => fields.set(name, number.parse::<f64>().unwrap()),
                _ => fields.set(name, value),
            }
        }
        let (_, errors) = depay_with_caps(caps.clone());
        match error {
            None => assert!(errors.is_empty(), "{caps}: {errors:?}"),
            Some(error) => assert!(
                errors.len() == 1 && errors[0].contains(error),
                "{caps}: {errors:?}"
            ),
        }
    }
}

/// Over real UDP on 127.0.0.1 through `rtpjitterbuffer`, packets sent out of order (pairs
/// swapped) come out in order, bit-identical.
#[test]
fn reordered_udp_packets_come_out_in_order() {
    let fixture = load_fixture("release-tiny");
    common::init();
    // The packets, as the payloader makes them.
    let mut pay = gst_check::Harness::new("rtpqwencodespay");
    pay.set_src_caps(fixture.caps());
    pay.play();
    push_codes(&mut pay, &fixture, &fixture.codes, 0, false, 5);
    pay.push_event(gst::event::Eos::new());
    let packets = common::pull_all(&mut pay);
    let caps = pay.sinkpad().unwrap().current_caps().unwrap();

    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pipeline = gst::parse::launch(&format!(
        "udpsrc address=127.0.0.1 port={port} ! rtpjitterbuffer latency=300 ! \
         rtpqwencodesdepay ! appsink name=sink sync=false"
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let udpsrc = pipeline.iterate_sources().next().unwrap().unwrap();
    udpsrc.set_property("caps", &caps);
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    pipeline.state(gst::ClockTime::from_seconds(5)).0.unwrap();

    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // After the first (a receiver starts with the first packet it gets), each pair swapped.
    let mut order: Vec<usize> = (0..packets.len()).collect();
    for pair in order[1..].chunks_mut(2) {
        pair.reverse();
    }
    for index in order {
        let map = packets[index].map_readable().unwrap();
        socket.send_to(&map, ("127.0.0.1", port)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut received = Vec::new();
    while received.len() < fixture.codes.len() * 2 {
        let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_seconds(5)) else {
            break;
        };
        received.extend_from_slice(&sample.buffer().unwrap().map_readable().unwrap());
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let sent = code_bytes(&fixture.codes);
    let frame_bytes = fixture.codebooks * 2;
    let missing: Vec<usize> = (0..fixture.frames)
        .filter(|f| {
            !received
                .chunks(frame_bytes)
                .any(|c| c == &sent[f * frame_bytes..(f + 1) * frame_bytes])
        })
        .collect();
    assert_eq!(
        received.len(),
        sent.len(),
        "bytes received; frames missing: {missing:?}"
    );
    assert!(received == sent, "the codes received differ from those sent");
}

/// The flags and frame counts of the buffers out of the depayloader named `depay` in `h`'s bin.
type Out = Arc<Mutex<Vec<(gst::BufferFlags, usize)>>>;

fn record_out(h: &gst_check::Harness, frame_bytes: usize) -> Out {
    let out: Out = Arc::default();
    let seen = out.clone();
    h.element()
        .unwrap()
        .downcast::<gst::Bin>()
        .unwrap()
        .by_name("depay")
        .unwrap()
        .static_pad("src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            if let Some(buffer) = info.buffer() {
                seen.lock()
                    .unwrap()
                    .push((restart_flags(buffer), buffer.size() / frame_bytes));
            }
            gst::PadProbeReturn::Ok
        });
    out
}

/// The second utterance's marked packet is lost: its next packet still starts it (the
/// utterance number changed), flagged DISCONT and RESYNC, no frames counted lost, and
/// the rest decodes as a fresh decoder's: upstream's decode of the codes after the one lost.
#[test]
fn a_lost_marked_packet_still_starts_the_next_utterance_fresh() {
    let fixture = load_fixture("release-tiny");
    let q = fixture.codebooks;
    let first = 23;
    // The second utterance: a frame that is lost, then the fixture's codes.
    let mut second = fixture.codes[5 * q..6 * q].to_vec();
    second.extend_from_slice(&fixture.codes);
    let (mut h, packets) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay ! rtpqwencodesdepay name=depay ! qwencodecdec device=cpu model-path={}",
            fixture.dir.display()
        ),
        move |index| index == first,
    );
    let out = record_out(&h, q * 2);
    push_codes(&mut h, &fixture, fixture.prefix_codes(first), 0, false, 8);
    push_codes(&mut h, &fixture, &second, first, true, 9);
    h.push_event(gst::event::Eos::new());
    let audio = common::audio_of(&common::pull_all(&mut h));
    assert!(packets.lock().unwrap()[first].2, "the lost packet had the marker");
    let split = first * fixture.samples_per_frame;
    fixture.assert_prefix_matches(&audio[..split], first, "the first utterance");
    fixture.assert_matches(
        &audio[split..],
        "the second utterance after its lost first packet",
    );
    let out = out.lock().unwrap();
    let flagged: Vec<_> = out
        .iter()
        .enumerate()
        .filter(|(_, (flags, _))| !flags.is_empty())
        .map(|(index, (flags, _))| (index, *flags))
        .collect();
    let start = gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC;
    assert_eq!(flagged, [(0, start), (first, start)]);
    assert_eq!(
        out.iter().map(|(_, frames)| frames).sum::<usize>(),
        first + fixture.frames
    );
    let depay = h
        .element()
        .unwrap()
        .downcast::<gst::Bin>()
        .unwrap()
        .by_name("depay")
        .unwrap();
    let counts = ["utterances", "packets-lost", "frames-lost"].map(|name| stat(&depay, name));
    assert_eq!(counts, [2, 1, 0]);
}

/// A lost packet held up to 64 frames: two lost packets whose RTP time says 80 frames (more
/// than one could hold) are 80 frames lost.
#[test]
fn two_lost_packets_may_have_held_more_frames_than_one_could() {
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(0, [1, 2]), 0, 0, true)).unwrap();
    // Packets 1 and 2 lost: 80 frames' time.
    h.push(packet(&small_frame(0, [3, 4]), 3, 1920 * 81, false))
        .unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(codes_of(&buffers), code_bytes(&[1, 2, 3, 4]));
    assert_eq!(gaps(&mut h), [(FRAME, Some(FRAME * 80))]);
    assert!(buffers[1].flags().contains(gst::BufferFlags::DISCONT));
    assert_eq!(stat(&h.element().unwrap(), "frames-lost"), 80);
}

/// Loss is what the sequence numbers say, its length what the RTP time says: a jump in RTP time
/// with no packet missing loses nothing and goes on; a packet missing between packets whose
/// times look contiguous (a sender whose timestamps restarted) is loss of unknown length: no
/// GAP, and the decoder restarts (DISCONT, no RESYNC: no new utterance).
#[test]
fn sequence_numbers_not_timestamps_say_what_was_lost() {
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(7, [1, 2]), 10, 0, true)).unwrap();
    h.push(packet(&small_frame(7, [3, 4]), 11, 1920, false)).unwrap();
    // Three frames' time skipped, no packet missing.
    h.push(packet(&small_frame(7, [5, 6]), 12, 1920 * 5, false))
        .unwrap();
    // Packet 13 lost; 14 where 12's frame ends.
    h.push(packet(&small_frame(7, [7, 8]), 14, 1920 * 6, false))
        .unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(
        codes_of(&buffers),
        code_bytes(&[1, 2, 3, 4, 5, 6, 7, 8]),
        "one frame a packet"
    );
    assert_eq!(gaps(&mut h), []);
    assert_eq!(
        buffers.iter().map(|b| restart_flags(b)).collect::<Vec<_>>(),
        [
            gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC,
            gst::BufferFlags::empty(),
            gst::BufferFlags::empty(),
            gst::BufferFlags::DISCONT,
        ]
    );
    let depay = h.element().unwrap();
    let counts = ["packets", "packets-lost", "frames-lost", "utterances"].map(|name| stat(&depay, name));
    assert_eq!(counts, [4, 1, 0, 1]);
}

/// `rtpjitterbuffer do-lost=true`'s event for packet `seq`, lost with `frames` frames' time.
fn lost_event(seq: u32, frames: u64) -> gst::Event {
    gst::event::CustomDownstream::new(
        gst::Structure::builder("GstRTPPacketLost")
            .field("timestamp", FRAME * u64::from(seq))
            .field("duration", FRAME * frames)
            .field("seqnum", seq)
            .field("retry", 0u32)
            .build(),
    )
}

/// The jitter buffer's lost-packet events (`rtpjitterbuffer do-lost=true`): where the next
/// packet's RTP time counts the frames lost, one GAP of exactly their time takes their place;
/// where it does not, they go on as the base class's GAP events, before the next buffer.
#[test]
fn lost_time_goes_downstream_as_the_counted_gap_or_the_jitter_buffers() {
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(0, [1, 2]), 0, 0, true)).unwrap();
    // The jitter buffer's guess of 2 frames; the RTP time says 1.
    h.push_event(lost_event(1, 2));
    h.push(packet(&small_frame(0, [3, 4]), 2, 1920 * 2, false))
        .unwrap();
    // Packet 3 lost, and packet 4's RTP time is no whole number of frames after packet 2's.
    h.push_event(lost_event(3, 1));
    h.push(packet(&small_frame(0, [5, 6]), 4, 1920 * 4 + 7, false))
        .unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(codes_of(&buffers), code_bytes(&[1, 2, 3, 4, 5, 6]));
    assert_eq!(gaps(&mut h), [(FRAME, Some(FRAME)), (FRAME * 3, Some(FRAME))]);
    assert!(buffers[1].flags().contains(gst::BufferFlags::DISCONT));
    assert!(buffers[2].flags().contains(gst::BufferFlags::DISCONT));
}

/// After a flush nothing before it counts: the next packet, whatever its sequence number and
/// time, starts an utterance (DISCONT and RESYNC) and no loss is counted.
#[test]
fn after_a_flush_the_next_packet_starts_fresh_with_no_loss() {
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(0, [1, 2]), 0, 0, true)).unwrap();
    h.push(packet(&small_frame(0, [3, 4]), 1, 1920, false)).unwrap();
    assert_eq!(common::pull_all(&mut h).len(), 2);
    h.push_event(gst::event::FlushStart::new());
    h.push_event(gst::event::FlushStop::new(true));
    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    h.push(packet(&small_frame(0, [5, 6]), 40, 1920 * 40, false))
        .unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(codes_of(&buffers), code_bytes(&[5, 6]));
    assert!(
        buffers[0]
            .flags()
            .contains(gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC)
    );
    let depay = h.element().unwrap();
    let counts = ["packets-lost", "frames-lost", "utterances"].map(|name| stat(&depay, name));
    assert_eq!(counts, [0, 0, 2]);
}

/// Lost time that no packet came to fill before the end goes downstream as a GAP, before EOS.
#[test]
fn a_loss_at_the_end_goes_downstream_as_a_gap_before_eos() {
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(0, [1, 2]), 0, 0, true)).unwrap();
    h.push_event(lost_event(1, 2));
    h.push_event(gst::event::Eos::new());
    let events: Vec<_> = std::iter::from_fn(|| h.try_pull_event())
        .filter_map(|event| match event.view() {
            gst::EventView::Gap(gap) => Some(format!("gap {:?}", gap.get())),
            gst::EventView::Eos(_) => Some("eos".to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(
        events,
        [format!("gap {:?}", (FRAME, Some(FRAME * 2))), "eos".to_owned()]
    );
}

/// A payloader alone, fed release frames (16 codes) at 12.5 frames a second, with
/// `properties` set.
fn payloader(properties: &[(&str, &str)]) -> gst_check::Harness {
    common::init();
    let mut h = gst_check::Harness::new("rtpqwencodespay");
    let pay = h.element().unwrap();
    for (name, value) in properties {
        pay.set_property_from_str(name, value);
    }
    h.set_src_caps(common::codes_caps(16, gst::Fraction::new(25, 2)));
    h.play();
    h
}

/// Release frames `frames` (each frame's 16 codes from `frame`), stamped at `pts`.
fn release_frames(frames: std::ops::Range<i16>, pts: Option<gst::ClockTime>) -> gst::Buffer {
    let codes: Vec<i16> = frames.flat_map(|frame| [frame; 16]).collect();
    common::buffer(&code_bytes(&codes), pts)
}

/// What a packet says: its RTP time, marker, frame count (from its header) and utterance number.
fn header_of(packet: &gst::Buffer) -> (u32, bool, usize, u8) {
    let rtp = gst_rtp::RTPBuffer::from_buffer_readable(packet).unwrap();
    let payload = rtp.payload().unwrap();
    assert_eq!(payload[0] >> 6, 1, "version 1");
    (
        rtp.timestamp(),
        rtp.is_marker(),
        (payload[0] & 0x3f) as usize + 1,
        payload[1],
    )
}

/// docs/rtp-codes.md's example frame sent as the sixth utterance: the packet's payload is the
/// documented one byte for byte (utterance 5: the first is 0), and each utterance's packet is
/// marked.
#[test]
fn the_payloader_sends_the_documented_payload() {
    let mut h = payloader(&[]);
    let codes: [i16; 16] = [2047, 0, 1365, 1, 1024, 2046, 682, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    for utterance in 0..6u64 {
        let mut buffer = common::buffer(&code_bytes(&codes), Some(FRAME * utterance));
        buffer.get_mut().unwrap().set_flags(gst::BufferFlags::DISCONT);
        h.push(buffer).unwrap();
    }
    let packets = common::pull_all(&mut h);
    let headers: Vec<_> = packets.iter().map(|p| (header_of(p).1, header_of(p).3)).collect();
    assert_eq!(headers, (0..6).map(|n| (true, n)).collect::<Vec<_>>());
    let golden = [
        0x40, 0x05, 0xff, 0xe0, 0x02, 0xaa, 0x80, 0x18, 0x01, 0xff, 0x95, 0x50, 0x03, 0x00, 0x80, 0x14, 0x03,
        0x00, 0x70, 0x10, 0x02, 0x40, 0x50, 0x0b,
    ];
    let rtp = gst_rtp::RTPBuffer::from_buffer_readable(&packets[5]).unwrap();
    assert_eq!(rtp.payload().unwrap(), golden);
}

/// Frames without timestamps are timed by their count: each packet's RTP time is 3 frames'
/// samples after the one before (perfect RTP time, not the previous packet's), and through the
/// depayloader and the decoder the audio is upstream's.
#[test]
fn input_without_timestamps_is_timed_by_its_frame_count() {
    let fixture = load_fixture("release-tiny");
    let (mut h, packets) = rtp_harness(
        &fixture,
        &format!(
            "rtpqwencodespay name=pay frames-per-packet=3 ! rtpqwencodesdepay name=depay ! \
             qwencodecdec device=cpu model-path={}",
            fixture.dir.display()
        ),
        |_| false,
    );
    let mut rng = StdRng::seed_from_u64(11);
    let bytes = code_bytes(&fixture.codes);
    for buffer in common::random_buffers(&bytes, fixture.codebooks * 2, &mut rng) {
        h.push(buffer).unwrap();
    }
    h.push_event(gst::event::Eos::new());
    fixture.assert_matches(&common::audio_of(&common::pull_all(&mut h)), "untimed input");
    let packets = packets.lock().unwrap();
    let steps: Vec<u32> = packets
        .windows(2)
        .map(|pair| pair[1].1.wrapping_sub(pair[0].1))
        .collect();
    let samples = 3 * fixture.samples_per_frame as u32;
    assert_eq!(steps, vec![samples; fixture.frames.div_ceil(3) - 1]);
    let pay = h
        .element()
        .unwrap()
        .downcast::<gst::Bin>()
        .unwrap()
        .by_name("pay")
        .unwrap();
    let counts = ["packets", "frames", "utterances"].map(|name| stat(&pay, name));
    assert_eq!(counts, [packets.len() as u64, fixture.frames as u64, 1]);
    // The base class's own fields are still there.
    let seqnum = pay
        .property::<gst::Structure>("stats")
        .get::<u32>("seqnum")
        .unwrap();
    assert_eq!(seqnum as u16, packets.last().unwrap().0);
}

/// A new user's pipeline: the codes file straight into the payloader, no qwencodecparse (a
/// BYTES segment, no timestamps). The payloader sends a time segment and times the frames by
/// their count; the decoder's audio is upstream's.
#[test]
fn a_file_straight_into_the_payloader_decodes_as_upstream() {
    let fixture = load_fixture("release-tiny");
    common::init();
    let pipeline = gst::parse::launch(&format!(
        "filesrc location={} ! audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 ! \
         rtpqwencodespay ! rtpqwencodesdepay ! qwencodecdec device=cpu model-path={} ! \
         appsink name=sink sync=false",
        fixture.dir.join("codes.raw").display(),
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
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut audio = Vec::new();
    while let Ok(sample) = sink.pull_sample() {
        audio.extend(common::samples(sample.buffer().unwrap()));
    }
    let bus = pipeline.bus().unwrap();
    let errors = common::messages(&bus, gst::MessageType::Error);
    pipeline.set_state(gst::State::Null).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    fixture.assert_matches(&audio, "from filesrc without qwencodecparse");
}

/// Each packet's payload size in bytes.
fn payload_sizes(packets: &[gst::Buffer]) -> Vec<u32> {
    packets
        .iter()
        .map(|packet| {
            gst_rtp::RTPBuffer::from_buffer_readable(packet)
                .unwrap()
                .payload_size()
        })
        .collect()
}

/// The three packets of three frames pushed to a payloader packing a 1024-code book at 48 kHz,
/// one frame a packet: its caps say so, and each packet holds 16 codes of 10 bits.
fn pull_three_frames_of_10_bits_at_48_khz(h: &mut gst_check::Harness) -> Vec<gst::Buffer> {
    let packets: Vec<_> = (0..3).map(|_| h.pull().unwrap()).collect();
    let caps = h.sinkpad().unwrap().current_caps().unwrap();
    let fields = caps.structure(0).unwrap();
    assert_eq!(fields.get::<i32>("clock-rate").unwrap(), 48_000, "{caps}");
    assert_eq!(fields.get::<&str>("codebook-size").unwrap(), "1024", "{caps}");
    assert_eq!(fields.get::<&str>("samples-per-frame").unwrap(), "3840", "{caps}");
    assert_eq!(
        payload_sizes(&packets),
        [22, 22, 22],
        "2 header bytes and 16 codes of 10 bits"
    );
    packets
}

/// `codebook-size` and `clock-rate` reach the packets: codes of a 1024-code book pack at 10
/// bits (a frame of 16 in 20 bytes, not the release's 22), the caps and the RTP clock run at
/// 48 kHz (3840 samples a frame at 12.5 frames a second), and a code of the release's book
/// beyond 1023 is an error naming it and its codebook.
#[test]
fn the_codebook_size_and_the_clock_rate_reach_the_packets() {
    let mut h = payloader(&[("codebook-size", "1024"), ("clock-rate", "48000")]);
    let pay = h.element().unwrap();
    assert_eq!(pay.property::<u32>("codebook-size"), 1024);
    assert_eq!(pay.property::<u32>("clock-rate"), 48_000);
    assert_eq!(pay.property::<u32>("frames-per-packet"), 1);
    let bus = common::bus_for(&pay);
    h.push(release_frames(1021..1024, Some(gst::ClockTime::ZERO)))
        .unwrap();
    let packets = pull_three_frames_of_10_bits_at_48_khz(&mut h);
    let first = header_of(&packets[0]).0;
    let rtp_times: Vec<_> = packets
        .iter()
        .map(|packet| header_of(packet).0.wrapping_sub(first))
        .collect();
    assert_eq!(rtp_times, [0, 3840, 7680]);
    // The second frame's codebook 5 holds 1024.
    let mut codes = [1000i16; 32];
    codes[16 + 5] = 1024;
    let buffer = common::buffer(&code_bytes(&codes), Some(FRAME * 3));
    assert_eq!(h.push(buffer), Err(gst::FlowError::Error));
    let errors = common::messages(&bus, gst::MessageType::Error);
    assert!(
        errors.len() == 1 && errors[0].contains("Code 1024 (codebook 5) is outside 0..1024"),
        "{errors:?}"
    );
}

/// What the model defines comes with the codes (`codebook-size` and `rate` in their caps): the
/// payloader packs and clocks by them with its properties at the release's, the properties
/// stand in only where the caps do not say, and a field out of range is an error naming it.
#[test]
fn the_codebook_size_and_the_clock_rate_come_from_the_codes_caps() {
    common::init();
    let caps_with = |codebook_size: i32, rate: i32| {
        let mut caps = common::codes_caps(16, gst::Fraction::new(25, 2));
        let fields = caps.make_mut().structure_mut(0).unwrap();
        fields.set("codebook-size", codebook_size);
        fields.set("rate", rate);
        caps
    };
    let mut h = gst_check::Harness::new("rtpqwencodespay");
    h.set_src_caps(caps_with(1024, 48_000));
    h.play();
    h.push(release_frames(1021..1024, Some(gst::ClockTime::ZERO)))
        .unwrap();
    pull_three_frames_of_10_bits_at_48_khz(&mut h);

    let clock_rate = h.element().unwrap().find_property("clock-rate").unwrap();
    let clock_rate = clock_rate.downcast_ref::<gst::glib::ParamSpecUInt>().unwrap();
    assert_eq!(clock_rate.maximum(), i32::MAX as u32, "RTP caps hold an int");

    for (codebook_size, rate, error) in [
        (1, 24_000, "codebook-size is 1, not an integer from 2 to 32768"),
        (
            32_769,
            24_000,
            "codebook-size is 32769, not an integer from 2 to 32768",
        ),
        (2048, 0, "rate is 0, not an integer from 1 to 2147483647"),
        (
            2048,
            -24_000,
            "rate is -24000, not an integer from 1 to 2147483647",
        ),
    ] {
        let mut h = gst_check::Harness::new("rtpqwencodespay");
        let bus = common::bus_for(&h.element().unwrap());
        h.set_src_caps(caps_with(codebook_size, rate));
        h.play();
        assert!(h.push(release_frames(0..1, Some(gst::ClockTime::ZERO))).is_err());
        let errors = common::messages(&bus, gst::MessageType::Error);
        assert!(errors.len() == 1 && errors[0].contains(error), "{errors:?}");
    }
}

/// The depayloader's codes caps carry what the SDP says of the model, so a payloader after it
/// (a relay) sends the packets it took, codes and utterance starts alike, with no property set
/// for a model that is not the release's.
#[test]
fn a_relay_sends_the_packets_it_took() {
    common::init();
    let mut h = gst_check::Harness::new_parse("rtpqwencodesdepay ! rtpqwencodespay");
    h.set_src_caps(depay_caps(&SMALL_FIELDS));
    h.play();
    let sent = [
        (small_frame(0, [1, 999]), true),
        (small_frame(0, [3, 4]), false),
        (small_frame(1, [5, 6]), true),
    ];
    for (seq, (payload, marker)) in sent.iter().enumerate() {
        h.push(packet(payload, seq as u16, 1920 * seq as u32, *marker))
            .unwrap();
    }
    h.push_event(gst::event::Eos::new());
    let relayed: Vec<_> = common::pull_all(&mut h)
        .iter()
        .map(|packet| {
            let rtp = gst_rtp::RTPBuffer::from_buffer_readable(packet).unwrap();
            (rtp.payload().unwrap().to_vec(), rtp.is_marker())
        })
        .collect();
    assert_eq!(relayed, sent);
    let caps = h.sinkpad().unwrap().current_caps().unwrap();
    let fields = caps.structure(0).unwrap();
    assert_eq!(fields.get::<&str>("codebook-size").unwrap(), "1000", "{caps}");
}

/// RTP caps that downstream does not take (another clock rate) are an error that says so,
/// posted once however often upstream sends the caps again.
#[test]
fn rtp_caps_that_downstream_refuses_are_an_error_naming_the_clock_rate() {
    common::init();
    let mut h =
        gst_check::Harness::new_parse("rtpqwencodespay ! capsfilter caps=application/x-rtp,clock-rate=8000");
    let bus = common::bus_for(&h.element().unwrap());
    h.set_src_caps(common::codes_caps(16, gst::Fraction::new(25, 2)));
    h.play();
    assert!(h.push(release_frames(0..1, Some(gst::ClockTime::ZERO))).is_err());
    assert!(h.push(release_frames(1..2, None)).is_err());
    let errors = common::messages(&bus, gst::MessageType::Error);
    assert!(
        errors.len() == 1
            && errors[0].contains("Downstream takes no RTP caps of X-QWEN3-TTS-CODES at clock-rate 24000"),
        "{errors:?}"
    );
}

/// Frames whose length is no whole number of RTP clock ticks (7 frames a second on a 24 kHz
/// clock) are refused with an error naming both, posted once however often upstream sends the
/// caps again.
#[test]
fn a_frame_rate_that_does_not_divide_the_clock_rate_is_an_error() {
    common::init();
    let mut h = gst_check::Harness::new("rtpqwencodespay");
    let bus = common::bus_for(&h.element().unwrap());
    h.set_src_caps(common::codes_caps(16, gst::Fraction::new(7, 1)));
    h.play();
    assert!(h.push(release_frames(0..1, Some(gst::ClockTime::ZERO))).is_err());
    // Again before the next buffer, the same caps are not posted again.
    assert!(h.push(release_frames(1..2, None)).is_err());
    let errors = common::messages(&bus, gst::MessageType::Error);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("A frame rate of 7 does not divide the clock rate 24000"),
        "{errors:?}"
    );
    // Caps accepted in between: the same refusal is posted again.
    h.set_src_caps(common::codes_caps(16, gst::Fraction::new(25, 2)));
    h.push(release_frames(1..2, None)).unwrap();
    h.set_src_caps(common::codes_caps(16, gst::Fraction::new(7, 1)));
    assert!(h.push(release_frames(2..3, None)).is_err());
    assert_eq!(common::messages(&bus, gst::MessageType::Error).len(), 1);
}

/// A DISCONT buffer is timed by its own timestamp, even one a little off the frame after the
/// last (10 ms, less than half a frame): its packet starts there, on the RTP clock too, and
/// starts an utterance.
#[test]
fn a_discont_buffer_takes_its_own_time() {
    let mut h = payloader(&[]);
    h.push(release_frames(0..2, Some(gst::ClockTime::ZERO))).unwrap();
    let own_time = FRAME * 2 + gst::ClockTime::from_mseconds(10);
    let mut buffer = release_frames(2..3, Some(own_time));
    buffer.get_mut().unwrap().set_flags(gst::BufferFlags::DISCONT);
    h.push(buffer).unwrap();
    let packets: Vec<_> = (0..3).map(|_| h.pull().unwrap()).collect();
    assert_eq!(packets[2].pts(), Some(own_time));
    let (first, (rtp_time, marker, _, utterance)) = (header_of(&packets[0]).0, header_of(&packets[2]));
    assert_eq!(rtp_time.wrapping_sub(first), 2 * 1920 + 240, "10 ms is 240 ticks");
    assert_eq!((marker, utterance), (true, 1));
}

/// A buffer flagged RESYNC (a talk spurt's start, as audio depayloaders flag it) starts an
/// utterance as DISCONT does: the frames pending go in a short packet, and the RESYNC frames'
/// packet has the marker and the next utterance number.
#[test]
fn a_resync_buffer_starts_an_utterance() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..3, Some(gst::ClockTime::ZERO))).unwrap();
    let mut buffer = release_frames(3..7, Some(FRAME * 3));
    buffer.get_mut().unwrap().set_flags(gst::BufferFlags::RESYNC);
    h.push(buffer).unwrap();
    let headers: Vec<_> = common::pull_all(&mut h).iter().map(header_of).collect();
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2, h.3)).collect::<Vec<_>>(),
        [(true, 3, 0), (true, 4, 1)]
    );
}

/// The frames a packet of 4 holds after 2 frames at 0 and 2 stamped `late` after their
/// place: within half a frame they continue the packet, beyond it they start another.
fn packets_after_a_late_buffer(late: gst::ClockTime) -> Vec<(u32, bool, usize, u8)> {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..2, Some(gst::ClockTime::ZERO))).unwrap();
    h.push(release_frames(2..4, Some(FRAME * 2 + late))).unwrap();
    h.push_event(gst::event::Eos::new());
    common::pull_all(&mut h).iter().map(header_of).collect()
}

/// Timestamps a little off their frames' place (up to half a frame, 40 ms) are jitter: the
/// packet goes on. Beyond half a frame (41 ms, far less than the second of the test above) the
/// time jumped: the packet before ends.
#[test]
fn timestamps_within_half_a_frame_of_their_place_continue_the_packet() {
    for late in [gst::ClockTime::from_nseconds(1), FRAME / 2] {
        let headers = packets_after_a_late_buffer(late);
        assert_eq!(
            headers.iter().map(|h| (h.1, h.2)).collect::<Vec<_>>(),
            [(true, 4)],
            "{late} late"
        );
    }
    let headers = packets_after_a_late_buffer(FRAME / 2 + gst::ClockTime::from_mseconds(1));
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2)).collect::<Vec<_>>(),
        [(true, 2), (false, 2)]
    );
    assert_eq!(headers[1].0.wrapping_sub(headers[0].0), 2 * 1920 + 24 * 41);
}

/// A flush drops the frame pending (it belongs to the old position) and the first packet after
/// it starts an utterance, of the new frames only.
#[test]
fn a_flush_drops_the_frames_pending_and_starts_an_utterance() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..5, Some(gst::ClockTime::ZERO))).unwrap();
    assert_eq!(
        header_of(&h.pull().unwrap()).2,
        4,
        "a packet of 4 went, 1 frame waits"
    );
    h.push_event(gst::event::FlushStart::new());
    h.push_event(gst::event::FlushStop::new(true));
    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    h.push(release_frames(10..14, Some(gst::ClockTime::ZERO)))
        .unwrap();
    let packets = common::pull_all(&mut h);
    let headers: Vec<_> = packets.iter().map(header_of).collect();
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2, h.3)).collect::<Vec<_>>(),
        [(true, 4, 1)]
    );
    let mut fresh = payloader(&[("frames-per-packet", "4")]);
    fresh
        .push(release_frames(10..14, Some(gst::ClockTime::ZERO)))
        .unwrap();
    let fresh = fresh.pull().unwrap();
    let expected = gst_rtp::RTPBuffer::from_buffer_readable(&fresh)
        .unwrap()
        .payload()
        .unwrap()[2..]
        .to_vec();
    let rtp = gst_rtp::RTPBuffer::from_buffer_readable(&packets[0]).unwrap();
    assert_eq!(
        rtp.payload().unwrap()[2..],
        expected,
        "the new frames' codes alone"
    );
}

/// `qwencodec-drain` (the end of an utterance) sends the frames pending in a short packet and
/// the next packet starts an utterance; another custom event leaves them waiting.
#[test]
fn the_drain_event_ends_an_utterance_and_no_other_event_does() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..3, Some(gst::ClockTime::ZERO))).unwrap();
    h.push_event(gst::event::CustomDownstream::new(gst::Structure::new_empty(
        "qwencodec-something-else",
    )));
    assert!(h.try_pull().is_none(), "3 frames of 4 still wait");
    h.push_event(gst::event::CustomDownstream::new(gst::Structure::new_empty(
        "qwencodec-drain",
    )));
    h.push(release_frames(3..7, Some(FRAME * 3))).unwrap();
    let headers: Vec<_> = common::pull_all(&mut h).iter().map(header_of).collect();
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2, h.3)).collect::<Vec<_>>(),
        [(true, 3, 0), (true, 4, 1)]
    );
}

/// New caps (here another model's codebook) send the frames held under the caps before, in a
/// short packet of their own layout, and the frames after them start an utterance.
#[test]
fn frames_held_at_a_caps_change_are_sent_under_their_own_caps() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..3, Some(gst::ClockTime::ZERO))).unwrap();
    assert!(h.try_pull().is_none(), "3 frames of 4 wait");
    let mut caps = common::codes_caps(16, gst::Fraction::new(25, 2));
    caps.make_mut()
        .structure_mut(0)
        .unwrap()
        .set("codebook-size", 1024i32);
    h.set_src_caps(caps);
    h.push(release_frames(3..7, Some(FRAME * 3))).unwrap();
    let packets = common::pull_all(&mut h);
    let headers: Vec<_> = packets.iter().map(header_of).collect();
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2, h.3)).collect::<Vec<_>>(),
        [(true, 3, 0), (true, 4, 1)]
    );
    assert_eq!(
        payload_sizes(&packets),
        [2 + 3 * 22, 2 + 4 * 20],
        "11 bits a code, then 10"
    );
}

/// `max-ptime` bounds a packet's frames by their time: 200 ms holds 2 frames of 80 ms, 0 one
/// (as the base class counts any frame as filling it), and unset (-1) leaves
/// `frames-per-packet`. Each packet lasts its frames.
#[test]
fn max_ptime_bounds_the_frames_in_a_packet() {
    for (max_ptime, frames) in [("200000000", 2), ("0", 1), ("-1", 4)] {
        let mut h = payloader(&[("frames-per-packet", "4"), ("max-ptime", max_ptime)]);
        h.push(release_frames(0..8, Some(gst::ClockTime::ZERO))).unwrap();
        h.push_event(gst::event::Eos::new());
        let packets = common::pull_all(&mut h);
        let counts: Vec<_> = packets.iter().map(|packet| header_of(packet).2).collect();
        assert_eq!(counts, vec![frames; 8 / frames], "max-ptime {max_ptime}");
        let durations: Vec<_> = packets.iter().map(|packet| packet.duration()).collect();
        assert_eq!(durations, vec![Some(FRAME * frames as u64); 8 / frames]);
    }
}

/// A partial frame at the end of a stream is dropped with a warning naming its bytes; an
/// utterance that ends on whole frames warns of nothing.
#[test]
fn a_partial_frame_at_the_end_is_dropped_with_a_warning() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    let bus = common::bus_for(&h.element().unwrap());
    h.push(release_frames(0..2, Some(gst::ClockTime::ZERO))).unwrap();
    h.push_event(gst::event::CustomDownstream::new(gst::Structure::new_empty(
        "qwencodec-drain",
    )));
    assert_eq!(common::errors_and_warnings(&bus), (vec![], vec![]));
    let mut bytes = code_bytes(&[2; 16]);
    bytes.extend([1, 0, 1, 0, 1]);
    h.push(common::buffer(&bytes, Some(FRAME * 2))).unwrap();
    h.push_event(gst::event::Eos::new());
    let headers: Vec<_> = common::pull_all(&mut h).iter().map(header_of).collect();
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2, h.3)).collect::<Vec<_>>(),
        [(true, 2, 0), (true, 1, 1)]
    );
    let (errors, warnings) = common::errors_and_warnings(&bus);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        warnings.len() == 1 && warnings[0].contains("5 bytes of a partial frame dropped"),
        "{warnings:?}"
    );
}

/// A new stream (STREAM_START) sends the frames pending, in a short packet, and its first
/// packet starts the next utterance.
#[test]
fn a_new_stream_sends_the_frames_pending_and_starts_an_utterance() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..3, Some(gst::ClockTime::ZERO))).unwrap();
    assert!(h.try_pull().is_none(), "3 frames of 4 wait");
    h.push_event(gst::event::StreamStart::new("the next"));
    h.push_event(gst::event::Segment::new(
        &gst::FormattedSegment::<gst::ClockTime>::new(),
    ));
    h.push(release_frames(3..5, Some(FRAME * 3))).unwrap();
    h.push_event(gst::event::Eos::new());
    let headers: Vec<_> = common::pull_all(&mut h).iter().map(header_of).collect();
    assert_eq!(headers.len(), 2, "{headers:?}");
    let (marker_count_utterance, rtp_times): (Vec<_>, Vec<_>) = headers
        .iter()
        .map(|&(rtp_time, marker, frames, utterance)| ((marker, frames, utterance), rtp_time))
        .unzip();
    assert_eq!(marker_count_utterance, [(true, 3, 0), (true, 2, 1)]);
    assert_eq!(rtp_times[1].wrapping_sub(rtp_times[0]), 3 * 1920);
}

/// Timestamps that jump forward without DISCONT end the packet before the jump; the next
/// starts at the new time, on the RTP clock too, in the same utterance.
#[test]
fn a_timestamp_jump_without_discont_starts_a_new_packet() {
    let mut h = payloader(&[("frames-per-packet", "4")]);
    h.push(release_frames(0..2, Some(gst::ClockTime::ZERO))).unwrap();
    let later = gst::ClockTime::from_seconds(1);
    h.push(release_frames(2..6, Some(later))).unwrap();
    h.push_event(gst::event::Eos::new());
    let packets = common::pull_all(&mut h);
    let headers: Vec<_> = packets.iter().map(header_of).collect();
    assert_eq!(
        headers.iter().map(|h| (h.1, h.2, h.3)).collect::<Vec<_>>(),
        [(true, 2, 0), (false, 4, 0)]
    );
    assert_eq!(headers[1].0.wrapping_sub(headers[0].0), 24_000, "a second later");
    assert_eq!(packets[1].pts(), Some(later));
}

/// With `source-info` the base class adds the input's sources as CSRCs (15 here, 60 bytes),
/// and a header extension (transport-wide CC, 8 bytes with its header): packets hold fewer
/// frames for them and stay within the MTU.
#[test]
fn packets_keep_within_the_mtu_with_csrcs_and_header_extensions() {
    // 12 + 60 + 8 bytes of header, 2 of payload header, 5 frames of 22 bytes: 192; a sixth
    // frame would make 214, and without the extension's 8 bytes counted it would seem to fit.
    let mtu = 210;
    let mut h = payloader(&[
        ("frames-per-packet", "64"),
        ("mtu", &mtu.to_string()),
        ("source-info", "true"),
    ]);
    let twcc = gst_rtp::RTPHeaderExtension::create_from_uri(
        "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
    )
    .expect("rtpmanager's transport-wide CC extension");
    gst_rtp::prelude::RTPHeaderExtensionExt::set_id(&twcc, 1);
    h.element().unwrap().emit_by_name::<()>("add-extension", &[&twcc]);
    let mut buffer = release_frames(0..12, Some(gst::ClockTime::ZERO));
    let csrcs: Vec<u32> = (1..15).collect();
    gst_rtp::RTPSourceMeta::add(buffer.get_mut().unwrap(), Some(99), &csrcs);
    h.push(buffer).unwrap();
    h.push_event(gst::event::Eos::new());
    let packets = common::pull_all(&mut h);
    let sizes: Vec<_> = packets
        .iter()
        .map(|packet| {
            let rtp = gst_rtp::RTPBuffer::from_buffer_readable(packet).unwrap();
            (
                packet.size(),
                rtp.csrc_count(),
                rtp.is_extension(),
                header_of(packet).2,
            )
        })
        .collect();
    // The last, sent at EOS, has no input buffer whose sources and extension data the base
    // class would add.
    assert_eq!(sizes, [(192, 15, true, 5), (192, 15, true, 5), (58, 0, false, 2)]);
}

/// A header extension of one byte that counts its instances, to tell how often the payloader
/// makes one from the registry.
mod counting_extension {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use gst::glib;
    use gst::subclass::prelude::*;
    use gst_rtp::subclass::prelude::*;

    pub const URI: &str = "urn:qwencodec:test:counting";
    pub static MADE: AtomicUsize = AtomicUsize::new(0);

    #[derive(Default)]
    pub struct Imp;

    #[glib::object_subclass]
    impl ObjectSubclass for Imp {
        const NAME: &'static str = "QwenTestCountingExtension";
        type Type = Extension;
        type ParentType = gst_rtp::RTPHeaderExtension;
    }

    impl ObjectImpl for Imp {
        fn constructed(&self) {
            self.parent_constructed();
            MADE.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl GstObjectImpl for Imp {}

    impl ElementImpl for Imp {
        fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
            static METADATA: std::sync::LazyLock<gst::subclass::ElementMetadata> =
                std::sync::LazyLock::new(|| {
                    gst::subclass::ElementMetadata::new(
                        "Counting test extension",
                        "Network/Extension/RTPHeader",
                        "Counts its instances",
                        "qwencodec developers",
                    )
                });
            Some(&*METADATA)
        }
    }

    impl RTPHeaderExtensionImpl for Imp {
        const URI: &'static str = URI;

        fn supported_flags(&self) -> gst_rtp::RTPHeaderExtensionFlags {
            gst_rtp::RTPHeaderExtensionFlags::ONE_BYTE
        }

        fn max_size(&self, _input: &gst::BufferRef) -> usize {
            1
        }

        fn write(
            &self,
            _input: &gst::BufferRef,
            _flags: gst_rtp::RTPHeaderExtensionFlags,
            _output: &gst::BufferRef,
            data: &mut [u8],
        ) -> Result<usize, gst::LoggableError> {
            data[0] = 0;
            Ok(1)
        }
    }

    glib::wrapper! {
        pub struct Extension(ObjectSubclass<Imp>)
            @extends gst_rtp::RTPHeaderExtension, gst::Element, gst::Object;
    }

    pub fn register() {
        use gst::prelude::*;
        gst::Element::register(
            None,
            "qwentestcountingext",
            gst::Rank::MARGINAL,
            Extension::static_type(),
        )
        .unwrap();
    }
}

/// The room the header extensions take is computed once for the src caps that name them, not
/// for each packet: 12 packets with an extension make one more extension from the registry.
#[test]
fn the_header_extensions_room_is_computed_once_per_caps() {
    use std::sync::atomic::Ordering;
    let mut h = payloader(&[("frames-per-packet", "1")]);
    counting_extension::register();
    let extension = gst_rtp::RTPHeaderExtension::create_from_uri(counting_extension::URI)
        .expect("the counting extension, registered");
    gst_rtp::prelude::RTPHeaderExtensionExt::set_id(&extension, 1);
    h.element()
        .unwrap()
        .emit_by_name::<()>("add-extension", &[&extension]);
    let before = counting_extension::MADE.load(Ordering::SeqCst);
    h.push(release_frames(0..12, Some(gst::ClockTime::ZERO))).unwrap();
    let packets = common::pull_all(&mut h);
    assert_eq!(packets.len(), 12);
    assert!(
        packets
            .iter()
            .all(|packet| gst_rtp::RTPBuffer::from_buffer_readable(packet)
                .unwrap()
                .is_extension()),
        "the extension is written"
    );
    assert_eq!(counting_extension::MADE.load(Ordering::SeqCst) - before, 1);
}

/// `stats` is each element's base class's own property (sequence number, RTP time, …, as RTSP
/// servers read it), and the element's counts are a property of its own, `codes-stats`.
#[test]
fn the_base_class_stats_are_its_own_and_the_counts_are_codes_stats() {
    common::init();
    for (name, base) in [
        ("rtpqwencodespay", gst_rtp::RTPBasePayload::static_type()),
        ("rtpqwencodesdepay", gst_rtp::RTPBaseDepayload::static_type()),
    ] {
        let element = gst::ElementFactory::make(name).build().unwrap();
        let stats = element.find_property("stats").unwrap();
        assert_eq!(stats.owner_type(), base, "{name}'s stats");
        let counts = element
            .find_property("codes-stats")
            .unwrap_or_else(|| panic!("{name} has no codes-stats"));
        assert_eq!(counts.owner_type(), element.type_(), "{name}'s codes-stats");
        assert!(!counts.flags().contains(gst::glib::ParamFlags::WRITABLE));
        let counts = element.property::<gst::Structure>("codes-stats");
        assert!(
            counts.iter().all(|(_, value)| value.get::<u64>() == Ok(0)),
            "{counts}"
        );
        assert!(
            counts.has_field("packets") && counts.has_field("utterances"),
            "{counts}"
        );
    }
    let (mut h, _bus) = small_depay(&[]);
    h.push(packet(&small_frame(0, [1, 2]), 7, 0, true)).unwrap();
    let depay = h.element().unwrap();
    let stats = depay.property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u32>("seqnum"), Ok(7), "{stats}");
    assert_eq!(stat(&depay, "packets"), 1);
}

/// With `plc=true`, a concealed loss followed by an utterance's start (DISCONT and RESYNC, after
/// which the base class does not flush): the filled frames end the first utterance, and the
/// second decodes fresh. A GAP that is not lost data (a silent live source) is not filled.
#[test]
fn with_plc_a_talk_spurt_after_a_concealed_loss_starts_fresh() {
    let fixture = load_fixture("release-tiny");
    let q = fixture.codebooks;
    let (first, second) = (fixture.prefix_codes(9), &fixture.codes[..]);
    let mut h = common::harness(&fixture, &[("plc", &true)]);
    h.push(common::buffer(&code_bytes(first), Some(gst::ClockTime::ZERO)))
        .unwrap();
    h.push_event(
        gst::event::Gap::builder(FRAME * 9)
            .duration(FRAME * 2)
            .gap_flags(gst::GapFlags::DATA)
            .build(),
    );
    let mut start = common::buffer(&code_bytes(second), Some(FRAME * 11));
    start
        .get_mut()
        .unwrap()
        .set_flags(gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC);
    h.push(start).unwrap();
    // Not lost data: the stream ends before it, nothing is filled.
    h.push_event(gst::event::Gap::builder(FRAME * 60).duration(FRAME * 2).build());
    h.push(common::buffer(&code_bytes(second), Some(FRAME * 62)))
        .unwrap();
    h.push_event(gst::event::Eos::new());
    let audio = common::audio_of(&common::pull_all(&mut h));

    let mut filled = first.to_vec();
    filled.extend_from_slice(&first[8 * q..].repeat(2));
    let mut expected = element_decode(&fixture, &filled);
    expected.extend(element_decode(&fixture, second));
    expected.extend(element_decode(&fixture, second));
    assert_eq!(audio.len(), expected.len());
    let error = common::relative_l2(&audio, &expected);
    assert!(error < fixture.tolerance(), "relative L2 {error:e}");
}
