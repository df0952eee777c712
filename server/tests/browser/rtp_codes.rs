//! A session's codes over RTP (`/codes?session=ID&transport=rtp`): the frames go as
//! `rtpqwencodespay` packets to the port the server names, the browser hears them as it hears
//! frames sent over the WebSocket, and the WebSocket's cancel still works, through loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gst::prelude::*;

use super::common;
use super::server::{self, Client, Server, TOKEN, epoch_ms};
use super::webdriver::Browser;
use super::{CANCEL_MS, Measure, Speech, assert_cancel_silences, assert_heard, connect_page, wait_until};

/// A TTS process sending its frames as RTP: `appsrc ! rtpqwencodespay ! udpsink`, on the
/// loopback interface.
pub(super) struct RtpSender {
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    /// The next frame's timestamp: the stream's timeline, continuous across utterances.
    next_pts: gst::ClockTime,
    frame: gst::ClockTime,
    /// While set, the packets are lost on their way (dropped after the payloader).
    losing: Arc<AtomicBool>,
}

impl RtpSender {
    pub(super) fn start(speech: &Speech, port: u16) -> Self {
        Self::start_from(speech, "127.0.0.1", port, 1)
    }

    /// A sender whose packets come from `source` (an address of the loopback interface: all of
    /// 127.0.0.0/8 is), to 127.0.0.1:`port`, `frames_per_packet` frames a packet.
    pub(super) fn start_from(speech: &Speech, source: &str, port: u16, frames_per_packet: u32) -> Self {
        Self::launch(
            speech,
            port,
            &format!("frames-per-packet={frames_per_packet}"),
            &format!("bind-address={source}"),
        )
    }

    /// A sender from 127.0.0.1:`source_port`, its packets of SSRC `ssrc`.
    fn start_as(speech: &Speech, port: u16, source_port: u16, ssrc: u32) -> Self {
        Self::launch(
            speech,
            port,
            &format!("ssrc={ssrc}"),
            &format!("bind-address=127.0.0.1 bind-port={source_port}"),
        )
    }

    /// A sender of SRTP (the server's suite, AES_CM_128_HMAC_SHA1_80) of `key` from 127.0.0.1.
    fn start_srtp(speech: &Speech, port: u16, key: &[u8]) -> Self {
        let sender = Self::launch(
            speech,
            port,
            "! srtpenc name=srtp rtp-cipher=aes-128-icm rtp-auth=hmac-sha1-80 \
             rtcp-cipher=aes-128-icm rtcp-auth=hmac-sha1-80",
            "bind-address=127.0.0.1",
        );
        sender
            .pipeline
            .by_name("srtp")
            .unwrap()
            .set_property("key", gst::Buffer::from_slice(key.to_vec()));
        sender.pipeline.set_state(gst::State::Playing).unwrap();
        sender
    }

    /// `rtpqwencodespay` with `payloader` properties (and elements after it) into `udpsink` to
    /// 127.0.0.1:`port` with `socket` properties; playing unless an `srtpenc` waits for its key.
    fn launch(speech: &Speech, port: u16, payloader: &str, socket: &str) -> Self {
        common::init();
        let pipeline = gst::parse::launch(&format!(
            "appsrc name=src is-live=true format=time \
             ! rtpqwencodespay name=pay {payloader} \
             ! udpsink host=127.0.0.1 port={port} {socket} sync=false"
        ))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
        let appsrc = pipeline
            .by_name("src")
            .unwrap()
            .downcast::<gst_app::AppSrc>()
            .unwrap();
        appsrc.set_caps(Some(&speech.fixture.caps()));
        let losing = Arc::new(AtomicBool::new(false));
        let lose = losing.clone();
        pipeline
            .by_name("pay")
            .unwrap()
            .static_pad("src")
            .unwrap()
            .add_probe(gst::PadProbeType::BUFFER, move |_, _| {
                if lose.load(Ordering::SeqCst) {
                    // Handled: the probe consumed it (see tests/rtp_codes.rs's rtp_harness).
                    gst::PadProbeReturn::Handled
                } else {
                    gst::PadProbeReturn::Ok
                }
            });
        if pipeline.by_name("srtp").is_none() {
            pipeline.set_state(gst::State::Playing).unwrap();
        }
        Self {
            pipeline,
            appsrc,
            next_pts: gst::ClockTime::ZERO,
            frame: gst::ClockTime::from_nseconds((speech.frame_ms * 1e6) as u64),
            losing,
        }
    }

    /// Frame `index` as one packet; the first frame of an utterance is flagged DISCONT, which
    /// the payloader marks.
    fn send(&mut self, speech: &Speech, index: usize, utterance_starts: bool) {
        let mut buffer = gst::Buffer::from_mut_slice(speech.frame(index));
        {
            let buffer = buffer.get_mut().unwrap();
            buffer.set_pts(self.next_pts);
            buffer.set_duration(self.frame);
            if utterance_starts {
                buffer.set_flags(gst::BufferFlags::DISCONT);
            }
        }
        self.next_pts += self.frame;
        self.appsrc.push_buffer(buffer).unwrap();
    }

    /// An utterance of `frames` in real time; when its first frame went.
    pub(super) fn send_live(&mut self, speech: &Speech, frames: usize) -> f64 {
        let start = Instant::now();
        let first = epoch_ms();
        for index in 0..frames {
            let due = Duration::from_secs_f64(index as f64 * speech.frame_ms / 1e3);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
            self.send(speech, index, index == 0);
        }
        first
    }

    /// An utterance of `frames` at once, as a TTS faster than real time sends it.
    pub(super) fn send_burst(&mut self, speech: &Speech, frames: usize) -> f64 {
        let at = epoch_ms();
        for index in 0..frames {
            self.send(speech, index, index == 0);
        }
        at
    }
}

impl Drop for RtpSender {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

/// The control connection of an RTP sender and the port its frames go to.
pub(super) fn rtp_sender_of(server: &Server, session: &str) -> (Client, u16) {
    let mut control = server.connect(&format!("/codes?session={session}&transport=rtp"), Some(TOKEN));
    let offer = control.receive_json();
    assert_eq!(offer["type"], "rtp", "{offer}");
    let port = offer["port"].as_u64().expect("the port of the session's RTP") as u16;
    let sdp = offer["sdp"].as_str().unwrap();
    for line in [
        format!("m=audio {port} RTP/AVP 96"),
        "a=rtpmap:96 X-QWEN3-TTS-CODES/24000".to_string(),
        "c=IN IP4 127.0.0.1".to_string(),
        "a=fmtp:96 version=1;codebooks=16;codebook-size=2048;samples-per-frame=1920".to_string(),
    ] {
        assert!(sdp.contains(&line), "no {line:?} in the SDP: {sdp}");
    }
    (control, port)
}

/// Speech over RTP heard in full; a burst cancelled; an utterance cancelled in real time with
/// its packets lost after the cancel and its last ones still coming, none of it heard after the
/// cancel; the next utterance heard in full.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn codes_over_rtp_are_heard_and_cancelled_as_over_the_websocket() {
    if !server::in_own_network("rtp_codes::codes_over_rtp_are_heard_and_cancelled_as_over_the_websocket") {
        return;
    }
    let speech = Speech::load();
    let server = Server::start(&[]);
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let (mut control, port) = rtp_sender_of(&server, &session);
    let mut sender = RtpSender::start(&speech, port);

    // 4 s in real time: heard in full.
    let frames = 50;
    let before = Measure::take(&browser);
    let first_sent = sender.send_live(&speech, frames);
    wait_until(first_sent, speech.seconds(frames) * 1e3 + 1500.0);
    let after = Measure::take(&browser);
    assert_heard(
        "4 s over RTP in real time",
        &speech,
        &before,
        &after,
        first_sent,
        frames,
    );
    let first_audio = after.first_change(true, first_sent).unwrap() - first_sent;
    println!("first audio in the browser {first_audio:.0} ms after the first packet was sent");
    assert!(
        first_audio < super::FIRST_AUDIO_MS,
        "first audio after {first_audio:.0} ms"
    );

    // Barge-in: 8 s sent at once, cancelled over the WebSocket 3 s into playback.
    let sent_at = sender.send_burst(&speech, 100);
    wait_until(sent_at, 3000.0);
    let cancelled_at = epoch_ms();
    control.cancel();
    assert_cancel_silences(&browser, cancelled_at);

    // An utterance in real time cancelled 2 s in, whose packets go on after the cancel: 35 of
    // them lost from the cancel on (more than the depayloader repeats: it restarts the decoder
    // there, DISCONT without RESYNC), then 20 more. None of it plays after the cancel.
    let start = Instant::now();
    let first_sent = epoch_ms();
    let mut cancelled_at = first_sent;
    let (cancel_at, lost, frames) = (25, 25..60, 80);
    for index in 0..frames {
        let due = Duration::from_secs_f64(index as f64 * speech.frame_ms / 1e3);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        if index == cancel_at {
            cancelled_at = epoch_ms();
            control.cancel();
        }
        sender.losing.store(lost.contains(&index), Ordering::SeqCst);
        sender.send(&speech, index, index == 0);
    }
    wait_until(first_sent, speech.seconds(frames) * 1e3 + 1500.0);
    let after = Measure::take(&browser);
    let sound_before_cancel = after.sound_seconds(cancelled_at - 1000.0, cancelled_at);
    assert!(
        sound_before_cancel > 0.8,
        "{sound_before_cancel:.3} s of sound in the second before the cancel"
    );
    // The packets after the loss come 2.8 s after the cancel: heard, they would end the silence.
    let cancel_ms = after.silent_for_good_since(cancelled_at) - cancelled_at;
    assert!(
        cancel_ms < CANCEL_MS,
        "the cancelled utterance played {cancel_ms:.0} ms after its cancel, past the loss that followed"
    );

    // The next utterance (a marked packet) is heard in full.
    let frames = 40;
    let before = Measure::take(&browser);
    let first_sent = sender.send_live(&speech, frames);
    wait_until(first_sent, speech.seconds(frames) * 1e3 + 1500.0);
    assert_heard(
        "over RTP after the cancel",
        &speech,
        &before,
        &Measure::take(&browser),
        first_sent,
        frames,
    );

    // Frames in a WebSocket message of an RTP sender are refused.
    control.send_binary(speech.frame(0));
    let (code, reason) = control.close_reason();
    assert_eq!(code, 4400, "{reason}");
    assert!(reason.contains("over RTP"), "{reason}");
    // The frames that went into the session: 50, the 100 cancelled, the 25 before the second
    // cancel (not the 20 that came after it), 40.
    let metrics = server.get("/metrics").1;
    assert_eq!(
        super::hardening::sample(&metrics, "qwencodec_frames_in_total"),
        215.0
    );
}

/// The decoder's steps so far (`/metrics`).
fn steps(server: &Server) -> f64 {
    super::hardening::sample(&server.get("/metrics").1, "qwencodec_decode_step_seconds_count")
}

/// The decoder's steps since `before` once `want` of them have run (or 5 s have passed) and the
/// count has held still for 300 ms: more than `want` shows too.
fn steps_since(server: &Server, before: f64, want: f64) -> f64 {
    let started = Instant::now();
    while steps(server) - before < want && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut last = steps(server);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = steps(server);
        if now == last {
            return now - before;
        }
        last = now;
    }
}

/// An utterance's first packet (marked) ends the utterance before it, as `{"type":"end"}` does:
/// the decoder decodes the frames it held back for a full step, then starts fresh. Counted in
/// steps at `--chunk-frames 4`, utterances of 5 frames: 1 step and 1 frame held; the next
/// utterance's mark drains that frame (a step), then its own 4 (another); the end drains its last.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn an_utterances_first_packet_ends_the_one_before_it() {
    if !server::in_own_network("rtp_codes::an_utterances_first_packet_ends_the_one_before_it") {
        return;
    }
    let speech = Speech::load();
    let server = Server::start(&["--chunk-frames", "4"]);
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let (mut control, port) = rtp_sender_of(&server, &session);
    let mut sender = RtpSender::start(&speech, port);
    let before = steps(&server);
    sender.send_burst(&speech, 5);
    assert_eq!(
        steps_since(&server, before, 1.0),
        1.0,
        "the first utterance's full step"
    );
    sender.send_burst(&speech, 5);
    assert_eq!(
        steps_since(&server, before, 3.0),
        3.0,
        "the first utterance's held frame, then the second's full step"
    );
    control.send_text(r#"{"type":"end"}"#);
    assert_eq!(
        steps_since(&server, before, 4.0),
        4.0,
        "the second utterance's held frame"
    );
}

/// A free UDP port of 127.0.0.1, for a sender to send from.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The frames taken from senders and the RTP packets dropped for `why` (`/metrics`).
fn frames_and_dropped(server: &Server, why: &str) -> (f64, f64) {
    let metrics = server.get("/metrics").1;
    let dropped = metrics
        .lines()
        .find_map(|line| line.strip_prefix(&format!("qwencodec_rtp_packets_dropped_total{{why=\"{why}\"}} ")))
        .map_or(0.0, |count| count.parse().unwrap());
    (
        super::hardening::sample(&metrics, "qwencodec_frames_in_total"),
        dropped,
    )
}

/// Sound a page may measure in a window where nothing is sent: the tail of the speech before
/// it (a quarter of an utterance of 10 frames, 0.8 s, which a page hears as 0.8 s of sound).
const NOT_HEARD_S: f64 = 0.2;

/// The port takes the first packet's source port and SSRC alone: packets from the sender's
/// address but another port, or its port and another SSRC, are dropped and counted, and not
/// heard; a marked packet of another SSRC does not end a cancel. The sender's own packets are
/// heard before and after.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn the_rtp_port_takes_its_first_packets_port_and_ssrc_alone() {
    if !server::in_own_network("rtp_codes::the_rtp_port_takes_its_first_packets_port_and_ssrc_alone") {
        return;
    }
    let speech = Speech::load();
    let server = Server::start(&[]);
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let (mut control, port) = rtp_sender_of(&server, &session);
    let frames = 10;
    let heard_within = speech.seconds(frames) * 1e3 + 1500.0;

    // The sender's first packets lock the port to 127.0.0.1:sender_port, SSRC 1111.
    let sender_port = free_udp_port();
    let mut sender = RtpSender::start_as(&speech, port, sender_port, 1111);
    let before = Measure::take(&browser);
    let first_sent = sender.send_burst(&speech, frames);
    wait_until(first_sent, heard_within);
    assert_heard(
        "the sender",
        &speech,
        &before,
        &Measure::take(&browser),
        first_sent,
        frames,
    );
    assert_eq!(frames_and_dropped(&server, "port"), (10.0, 0.0));
    assert!(server.await_log(
        |line| line.contains(&format!(
            "session {session}: RTP from 127.0.0.1 port {sender_port}, SSRC 1111: the port takes this source's alone"
        )),
        Duration::from_secs(2)
    ));

    // Another port of the same address, the same SSRC: dropped, not heard.
    let mut other_port = RtpSender::start_as(&speech, port, free_udp_port(), 1111);
    let sent = other_port.send_burst(&speech, frames);
    wait_until(sent, heard_within);
    let sound = Measure::take(&browser).sound_seconds(sent, epoch_ms());
    assert!(
        sound < NOT_HEARD_S,
        "packets from another port were heard: {sound:.3} s of sound"
    );
    assert_eq!(
        frames_and_dropped(&server, "port"),
        (10.0, 10.0),
        "frames taken, packets dropped from another port"
    );
    drop(other_port);

    // A cancel, then a new utterance (marked) from the sender's port with another SSRC:
    // dropped, not heard, and the cancel holds.
    control.cancel();
    drop(sender);
    let mut other_ssrc = RtpSender::start_as(&speech, port, sender_port, 2222);
    let sent = other_ssrc.send_burst(&speech, frames);
    wait_until(sent, heard_within);
    let sound = Measure::take(&browser).sound_seconds(sent, epoch_ms());
    assert!(
        sound < NOT_HEARD_S,
        "packets of another SSRC were heard: {sound:.3} s of sound"
    );
    assert_eq!(
        frames_and_dropped(&server, "ssrc"),
        (10.0, 10.0),
        "frames taken, packets dropped of another SSRC"
    );
    drop(other_ssrc);

    // The sender's next utterance is heard.
    let mut sender = RtpSender::start_as(&speech, port, sender_port, 1111);
    let before = Measure::take(&browser);
    let first_sent = sender.send_burst(&speech, frames);
    wait_until(first_sent, heard_within);
    assert_heard(
        "the sender again",
        &speech,
        &before,
        &Measure::take(&browser),
        first_sent,
        frames,
    );
    assert_eq!(frames_and_dropped(&server, "ssrc"), (20.0, 10.0));
    drop(control);
    assert!(server.await_log(
        |line| line.contains(&format!(
            "session {session}: from its sender's address, 10 RTP packets from another port and 10 of another SSRC than the first's dropped"
        )),
        Duration::from_secs(5)
    ));
}

/// With `srtp=1` the server's first message holds a key (and the SDP its `a=crypto`): an SRTP
/// sender of that key is heard as the plain path's is; plain RTP and SRTP of another key from the
/// sender's address are heard as nothing, and counted as failed authentication.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn srtp_of_the_sessions_key_is_heard_and_nothing_else() {
    if !server::in_own_network("rtp_codes::srtp_of_the_sessions_key_is_heard_and_nothing_else") {
        return;
    }
    let speech = Speech::load();
    let server = Server::start(&[]);
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let frames = 10;
    let heard_within = speech.seconds(frames) * 1e3 + 1500.0;

    // The plain path's utterance, what SRTP's is held to.
    let (control, port) = rtp_sender_of(&server, &session);
    let mut plain = RtpSender::start(&speech, port);
    let before = Measure::take(&browser);
    let first_sent = plain.send_burst(&speech, frames);
    wait_until(first_sent, heard_within);
    let after = Measure::take(&browser);
    assert_heard("plain RTP", &speech, &before, &after, first_sent, frames);
    let plain_sound = after.sound_seconds(first_sent, after.number("now"));
    drop(plain);
    control.close();

    // The key, in the first message and the SDP.
    let mut control = server.connect(
        &format!("/codes?session={session}&transport=rtp&srtp=1"),
        Some(TOKEN),
    );
    let offer = control.receive_json();
    let port = offer["port"].as_u64().unwrap() as u16;
    assert_eq!(offer["srtp"]["suite"], "AES_CM_128_HMAC_SHA1_80", "{offer}");
    let encoded = offer["srtp"]["key"].as_str().unwrap();
    let key = data_encoding::BASE64.decode(encoded.as_bytes()).unwrap();
    assert_eq!(key.len(), 30, "a master key and salt");
    let sdp = offer["sdp"].as_str().unwrap();
    for line in [
        format!("m=audio {port} RTP/SAVP 96"),
        format!("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{encoded}"),
    ] {
        assert!(sdp.contains(&line), "no {line:?} in the SDP: {sdp}");
    }

    // Plain RTP, and SRTP of another key, from the sender's address: heard as nothing.
    let mut plain = RtpSender::start(&speech, port);
    let other_key: Vec<u8> = key.iter().map(|byte| byte ^ 0x5a).collect();
    let mut forger = RtpSender::start_srtp(&speech, port, &other_key);
    let sent = plain.send_burst(&speech, frames);
    forger.send_burst(&speech, frames);
    wait_until(sent, heard_within);
    let sound = Measure::take(&browser).sound_seconds(sent, epoch_ms());
    assert!(
        sound < NOT_HEARD_S,
        "plain RTP or another key was heard: {sound:.3} s of sound"
    );
    assert_eq!(
        frames_and_dropped(&server, "srtp"),
        (10.0, 20.0),
        "frames taken, packets that failed authentication"
    );
    drop((plain, forger));

    // The key's sender: heard, as the plain path's.
    let mut sender = RtpSender::start_srtp(&speech, port, &key);
    let before = Measure::take(&browser);
    let first_sent = sender.send_burst(&speech, frames);
    wait_until(first_sent, heard_within);
    let after = Measure::take(&browser);
    assert_heard("SRTP", &speech, &before, &after, first_sent, frames);
    // Both held to the speech sent (assert_heard); the page's energy of the same speech varies
    // by a third from one utterance to the next, its sound's length by hundredths of a second.
    let sound = after.sound_seconds(first_sent, after.number("now"));
    println!("sound: plain RTP {plain_sound:.3} s, SRTP {sound:.3} s");
    assert!(
        (sound - plain_sound).abs() < 0.1,
        "SRTP {sound:.3} s of sound, plain {plain_sound:.3} s"
    );
    assert_eq!(frames_and_dropped(&server, "srtp"), (20.0, 20.0));
    drop(control);
    assert!(server.await_log(
        |line| line.contains(&format!(
            "session {session}: 20 RTP packets that failed SRTP authentication dropped"
        )),
        Duration::from_secs(5)
    ));
}

/// With `--rtp-srtp required` a sender of plain RTP is refused, saying how to ask for SRTP;
/// `srtp=1` is for RTP alone.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_server_that_requires_srtp_refuses_plain_rtp() {
    if !server::in_own_network("rtp_codes::a_server_that_requires_srtp_refuses_plain_rtp") {
        return;
    }
    let server = Server::start(&["--rtp-srtp", "required"]);
    let mut listener = server.connect_with("/signal", &[]);
    listener.send_text(r#"{"type":"join"}"#);
    let session = listener.receive_json()["id"].as_str().unwrap().to_owned();
    for (query, reason) in [
        (
            "&transport=rtp",
            "this server takes codes over RTP as SRTP alone (--rtp-srtp required): add srtp=1",
        ),
        ("&srtp=1", "srtp=1 is for transport=rtp"),
        ("&transport=rtp&srtp=yes", r#"srtp takes 1 or 0, not "yes""#),
    ] {
        let mut sender = server.connect(&format!("/codes?session={session}{query}"), Some(TOKEN));
        assert_eq!(sender.close_reason(), (4400, reason.to_owned()), "{query}");
    }
    let mut sender = server.connect(
        &format!("/codes?session={session}&transport=rtp&srtp=1"),
        Some(TOKEN),
    );
    let offer = sender.receive_json();
    assert_eq!(offer["srtp"]["suite"], "AES_CM_128_HMAC_SHA1_80", "{offer}");
    sender.close();
    listener.close();
}
