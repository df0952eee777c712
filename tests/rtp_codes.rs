//! Codes over RTP: `rtpqwencodespay` and `rtpqwencodesdepay` against the codes sent, upstream's
//! decode, lost and bad packets, and real UDP with reordering.

mod common;

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

/// With `loss=restart` a lost packet flags the next buffer DISCONT: the decoder ends the frames
/// before the loss (exact) and starts fresh after it; nothing stalls.
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
            "rtpqwencodespay ! rtpqwencodesdepay name=depay loss=restart ! qwencodecdec device=cpu model-path={}",
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

/// With `loss=repeat` (the default) lost frames come out as copies of the last frame received,
/// in their place and time, without DISCONT (the decoder goes on); a loss longer than
/// `max-repeat-frames` restarts instead.
#[test]
fn lost_frames_are_filled_with_the_last_frame_received() {
    let fixture = load_fixture("release-tiny");
    let q = fixture.codebooks;
    // Packets of 2 frames: packet 3 (frames 6-7) lost, then packets 10 to 13 (frames 20-27),
    // longer than max-repeat-frames=6.
    let lost = |index: usize| index == 3 || (10..14).contains(&index);
    let (mut h, _) = rtp_harness(
        &fixture,
        "rtpqwencodespay frames-per-packet=2 ! rtpqwencodesdepay name=depay max-repeat-frames=6",
        lost,
    );
    push_codes(&mut h, &fixture, &fixture.codes, 0, false, 6);
    h.push_event(gst::event::Eos::new());
    let buffers = common::pull_all(&mut h);
    let mut expected = Vec::new();
    for frame in 0..fixture.frames {
        let packet = frame / 2;
        if (10..14).contains(&packet) {
            continue; // not filled: the decoder restarts at frame 28
        }
        let source = if packet == 3 { 5 } else { frame };
        expected.extend_from_slice(&fixture.codes[source * q..(source + 1) * q]);
    }
    assert!(codes_of(&buffers) == code_bytes(&expected), "the codes out");
    let filled = buffers
        .iter()
        .find(|b| b.size() == 4 * q * 2)
        .expect("the packet after the loss, with the two frames before it");
    assert_eq!(
        filled.pts(),
        Some(FRAME * 6),
        "the repeated frames where the lost ones were"
    );
    assert!(
        !filled.flags().contains(gst::BufferFlags::DISCONT),
        "the decoder goes on"
    );
    let restarted: Vec<_> = buffers
        .iter()
        .filter(|b| b.flags().contains(gst::BufferFlags::DISCONT))
        .map(|b| b.pts())
        .collect();
    // The first packet (its marker) and the one after the long loss.
    assert_eq!(restarted, [Some(gst::ClockTime::ZERO), Some(FRAME * 28)]);
}

/// An RTP packet of this format with `payload` and sequence number `seq`.
fn packet(payload: &[u8], seq: u16) -> gst::Buffer {
    use gst_rtp::prelude::RTPBufferExt;
    let mut buffer = gst::Buffer::new_rtp_with_sizes(payload.len() as u32, 0, 0).unwrap();
    {
        let buffer = buffer.get_mut().unwrap();
        buffer.set_pts(FRAME * u64::from(seq));
        let mut rtp = gst_rtp::RTPBuffer::from_buffer_writable(buffer).unwrap();
        rtp.set_seq(seq);
        rtp.set_payload_type(96);
        rtp.set_timestamp(1920 * u32::from(seq));
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

const RELEASE_FIELDS: [(&str, &str); 3] = [
    ("codebooks", "16"),
    ("codebook-size", "2048"),
    ("samples-per-frame", "1920"),
];

/// A short packet, a frame count its bytes do not hold, an unknown version and codes outside a
/// codebook of 1000 are each dropped with a warning naming what was wrong; the good packets
/// around them come out, and nothing errors.
#[test]
fn bad_packets_are_dropped_with_a_warning_and_nothing_else_is_lost() {
    common::init();
    let fields = [
        ("codebooks", "2"),
        ("codebook-size", "1000"),
        ("samples-per-frame", "1920"),
    ];
    let mut h = gst_check::Harness::new("rtpqwencodesdepay");
    let bus = common::bus_for(&h.element().unwrap());
    h.set_src_caps(depay_caps(&fields));
    h.play();
    // One frame of two 10-bit codes: 1 and 2.
    let good = [0u8, 0b0000_0000, 0b0100_0000, 0b0010_0000];
    let bad = [
        (&[0u8, 0, 0][..], "take 4 bytes, the payload has 3"),
        (&[1u8, 0, 0, 0][..], "2 frames"),
        (&[0x40u8, 0, 0, 0][..], "version 1"),
        (&[0u8, 0xff, 0xc0, 0][..], "code 1023 is outside 0..1000"),
    ];
    h.push(packet(&good, 0)).unwrap();
    for (seq, (payload, _)) in bad.iter().enumerate() {
        h.push(packet(payload, seq as u16 + 1)).unwrap();
    }
    h.push(packet(&good, 5)).unwrap();
    let buffers = common::pull_all(&mut h);
    assert_eq!(buffers.len(), 2);
    assert_eq!(&*buffers[0].map_readable().unwrap(), &code_bytes(&[1, 2])[..]);
    // The four refused packets' frames are lost frames, filled as loss=repeat fills them.
    assert_eq!(
        &*buffers[1].map_readable().unwrap(),
        &code_bytes(&[1, 2].repeat(5))[..]
    );
    let (errors, warnings) = common::errors_and_warnings(&bus);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(warnings.len(), bad.len(), "{warnings:?}");
    for ((_, why), warning) in bad.iter().zip(&warnings) {
        assert!(warning.contains(why), "{warning:?} should say {why:?}");
    }
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
        let mut h = gst_check::Harness::new("rtpqwencodesdepay");
        let bus = common::bus_for(&h.element().unwrap());
        h.set_src_caps(depay_caps(&fields));
        h.play();
        let good = common::code_bytes(&[0; 16]);
        _ = h.push(packet(&good, 0));
        let errors = common::messages(&bus, gst::MessageType::Error);
        assert!(
            errors.iter().any(|e| e.contains(&format!("no {missing}"))),
            "{missing}: {errors:?}"
        );
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
