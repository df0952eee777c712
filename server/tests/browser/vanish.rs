//! Peers that vanish (docs/streaming-server.md, "Peers that vanish"): a browser whose link goes
//! down or whose processes stop, a client that joins and never connects or never answers, a
//! sender that stops answering, one killed mid-utterance, an RTP sender whose WebSocket is
//! quiet, and listeners that never answer the offer while their senders send. Each session
//! ends, or its sender's slot frees, within the times the server is given, and `/status` and
//! `/metrics` agree.
//!
//! The server runs with short times: pings every `PING_INTERVAL_S`, a peer gone after
//! `PEER_TIMEOUT_S` unheard, a peer connection given `CONNECT_TIMEOUT_S`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::network::{self, ServerHost};
use super::rtp_codes::{RtpSender, rtp_sender_of};
use super::server::{self, Client, Server, TOKEN, epoch_ms};
use super::webdriver::Browser;
use super::{Measure, Speech, assert_heard, connect_page, speak_and_end, wait_ms};

const PING_INTERVAL_S: f64 = 0.5;
const PEER_TIMEOUT_S: f64 = 2.0;
const CONNECT_TIMEOUT_S: f64 = 5.0;
/// What a finding may take past its time on a loaded machine: its log comes through a pipe,
/// the test polls.
const SLACK_S: f64 = 1.0;

/// The server's options for these times (the constants above, as the command line gives them),
/// and `more` (which may give one again: the last counts).
fn options<'a>(more: &[&'a str]) -> Vec<&'a str> {
    let mut options = vec![
        "--ping-interval",
        "0.5",
        "--peer-timeout",
        "2",
        "--connect-timeout",
        "5",
    ];
    options.extend_from_slice(more);
    options
}

/// Asserts that `what` took `seconds`, between `least` and `most`.
fn assert_took(what: &str, seconds: f64, least: f64, most: f64) {
    println!("{what}: {seconds:.2} s");
    assert!(
        (least..=most).contains(&seconds),
        "{what}: {seconds:.2} s, not within {least:.2}-{most:.2} s"
    );
}

/// When (epoch ms) a line of the server's log that contains `needle` came; it must within
/// `within`.
fn await_log_line(server: &Server, needle: &str, within: Duration) -> f64 {
    assert!(
        server.await_log(|line| line.contains(needle), within),
        "no {needle:?} in the log within {within:?}"
    );
    epoch_ms()
}

/// What the page was told of its session's sender: `[state, why]` pairs and when each came.
fn sender_news(browser: &Browser) -> Vec<(String, Option<String>, f64)> {
    let news = browser.run("return speech.senders;");
    news.as_array()
        .unwrap()
        .iter()
        .map(|item| {
            (
                item["state"].as_str().unwrap().to_owned(),
                item["why"].as_str().map(str::to_owned),
                item["at"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Waits up to `within` for the page to have been told `count` things of its sender; what it
/// was told.
fn await_sender_news(
    browser: &Browser,
    count: usize,
    within: Duration,
) -> Vec<(String, Option<String>, f64)> {
    let start = Instant::now();
    loop {
        let news = sender_news(browser);
        if news.len() >= count {
            return news;
        }
        assert!(
            start.elapsed() < within,
            "the page was told {news:?} of its sender, not {count} things"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The states and whys the page was told, without their times.
fn states(news: &[(String, Option<String>, f64)]) -> Vec<(&str, Option<&str>)> {
    news.iter()
        .map(|(state, why, _)| (state.as_str(), why.as_deref()))
        .collect()
}

/// A sample of `/metrics` text, 0 when the family has none (a counter never raised).
fn count(metrics: &str, sample: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().unwrap())
}

fn lost(metrics: &str, peer: &str, why: &str) -> f64 {
    count(
        metrics,
        &format!("qwencodec_peers_lost_total{{peer=\"{peer}\",why=\"{why}\"}}"),
    )
}

/// `/status` and `/metrics`' sessions and pipelines, which must agree, once the status is
/// `wanted` (waiting up to 5 s); the metrics' text.
fn assert_status(server: &Server, wanted: (u64, u64)) -> String {
    let status = server.await_status(wanted, Duration::from_secs(5));
    assert_eq!(status, wanted, "sessions and pipelines");
    let metrics = server.get("/metrics").1;
    let from_metrics = (
        count(&metrics, "qwencodec_sessions") as u64,
        count(&metrics, "qwencodec_pipelines") as u64,
    );
    assert_eq!(from_metrics, status, "/metrics and /status disagree");
    metrics
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_browser_whose_link_goes_down_loses_its_session() {
    if !server::in_own_network("vanish::a_browser_whose_link_goes_down_loses_its_session") {
        return;
    }
    let host = ServerHost::start();
    let server = Server::start_on(&host, &options(&["--chunk-frames", "1"]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let mut sender = server.sender(&session);
    let frames = 25;
    let (before, first_sent, after) = speak_and_end(&browser, &mut sender, &speech, frames);
    assert_heard(
        "before the link went down",
        &speech,
        &before,
        &after,
        first_sent,
        frames,
    );
    // The sender, across the same link, leaves first: the page is told.
    sender.close();
    let news = await_sender_news(&browser, 2, Duration::from_secs(5));
    assert_eq!(states(&news), [("joined", None), ("left", Some("closed"))]);

    let down_at = epoch_ms();
    network::link_down();
    let gone = format!("session {session} left: its browser is gone: answered no ping within 2 s");
    let gone_at = await_log_line(&server, &gone, Duration::from_secs(10));
    // Heard last at most a ping interval before the link went down.
    assert_took(
        "the session of a browser whose link went down ended after",
        (gone_at - down_at) / 1e3,
        PEER_TIMEOUT_S - PING_INTERVAL_S - 0.1,
        PEER_TIMEOUT_S + SLACK_S,
    );
    network::link_up();
    let metrics = assert_status(&server, (0, 0));
    assert_eq!(lost(&metrics, "browser", "timeout"), 1.0, "{metrics}");
    assert_eq!(count(&metrics, "qwencodec_sessions_opened_total"), 1.0);
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_stopped_browser_loses_its_session_and_its_sender_is_told() {
    if !server::in_own_network("vanish::a_stopped_browser_loses_its_session_and_its_sender_is_told") {
        return;
    }
    let server = Server::start(&options(&["--chunk-frames", "1"]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let mut sender = server.sender(&session);
    let frames = 25;
    let (before, first_sent, after) = speak_and_end(&browser, &mut sender, &speech, frames);
    assert_heard(
        "before the browser stopped",
        &speech,
        &before,
        &after,
        first_sent,
        frames,
    );

    // Its processes stop, its connections open: it answers no ping. The sender, which does
    // answer, is told when the session ends, and why.
    let frozen = browser.freeze();
    let stopped_at = epoch_ms();
    let (code, reason) = sender.close_reason();
    let told_at = epoch_ms();
    println!("the sender: {code} {reason}");
    assert_eq!(code, 4410, "{reason}");
    assert!(
        reason.contains("its browser is gone: answered no ping within 2 s"),
        "{reason}"
    );
    assert_took(
        "the session of a stopped browser ended after",
        (told_at - stopped_at) / 1e3,
        PEER_TIMEOUT_S - PING_INTERVAL_S - 0.1,
        PEER_TIMEOUT_S + SLACK_S,
    );
    let metrics = assert_status(&server, (0, 0));
    assert_eq!(lost(&metrics, "browser", "timeout"), 1.0, "{metrics}");
    assert_eq!(lost(&metrics, "sender", "timeout"), 0.0, "{metrics}");

    // Going on, the page finds its signalling closed: with the server's 4408, or 1006 where its
    // library's pongs to the pings it had not read reached the closed connection first.
    drop(frozen);
    let start = Instant::now();
    loop {
        let closed = browser.run("return speech.closed;");
        if !closed.is_null() {
            println!("the page, going on, finds its signalling closed: {closed}");
            assert!(
                closed["code"] == 1006
                    || closed == serde_json::json!({"code": 4408, "reason": "answered no ping within 2 s"}),
                "{closed}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the page, going on, still has its signalling open"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn clients_that_join_and_never_connect_or_never_answer_are_let_go() {
    if !server::in_own_network("vanish::clients_that_join_and_never_connect_or_never_answer_are_let_go") {
        return;
    }
    let server = Server::start(&options(&[]));
    let join = |client: &mut Client| {
        client.send_text(r#"{"type":"join"}"#);
        client.receive_json()["id"].as_str().unwrap().to_owned()
    };
    // One reads (its WebSocket library answers the pings) but never answers the offer; the
    // other reads nothing after the session's id.
    let mut unconnected = server.connect("/signal", None);
    let mut silent = server.connect("/signal", None);
    let joined_at = epoch_ms();
    join(&mut unconnected);
    let silent_session = join(&mut silent);
    let reading = std::thread::spawn(move || {
        let (code, reason) = unconnected.close_reason();
        (code, reason, epoch_ms())
    });

    let gone = format!("session {silent_session} left: its browser is gone: answered no ping");
    let gone_at = await_log_line(&server, &gone, Duration::from_secs(10));
    // Heard last at its join.
    assert_took(
        "a client that answers nothing was let go after",
        (gone_at - joined_at) / 1e3,
        PEER_TIMEOUT_S - 0.1,
        PEER_TIMEOUT_S + SLACK_S,
    );
    // (The close frame it was sent, 4408, it cannot read: its library answers the pings
    // before it, into a connection closed.)
    drop(silent);

    let (code, reason, closed_at) = reading.join().unwrap();
    println!("the client that never connected: {code} {reason}");
    assert_eq!(
        (code, reason.as_str()),
        (4408, "its peer connection did not connect within 5 s")
    );
    assert_took(
        "a client that never connected was let go after",
        (closed_at - joined_at) / 1e3,
        CONNECT_TIMEOUT_S - 0.1,
        CONNECT_TIMEOUT_S + SLACK_S,
    );
    let metrics = assert_status(&server, (0, 0));
    assert_eq!(lost(&metrics, "browser", "timeout"), 1.0, "{metrics}");
    assert_eq!(lost(&metrics, "browser", "never_connected"), 1.0, "{metrics}");
}

/// A listener that joins and never answers the offer while its sender sends frames, then
/// leaves: its session's pipeline is torn down however far its handshake got. Twenty such
/// sessions leave no pipeline, no thread and no memory behind, and both closes are answered.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn listeners_that_never_answer_leave_no_pipeline_behind() {
    if !server::in_own_network("vanish::listeners_that_never_answer_leave_no_pipeline_behind") {
        return;
    }
    const SESSIONS: usize = 20;
    /// Rounds before the baseline is taken: the model's and the runtime's first allocations.
    const WARM: usize = 4;
    const FRAMES: usize = 40;
    let server = Server::start(&options(&["--max-joins-per-minute", "0"]));
    let speech = Speech::load();
    let mut baseline = None;
    for round in 0..SESSIONS {
        let mut listener = server.connect("/signal", None);
        listener.send_text(r#"{"type":"join"}"#);
        let session = listener.receive_json()["id"].as_str().unwrap().to_owned();
        // The offer came: webrtcbin waits for an answer that never comes.
        while listener.receive_json()["type"] != "offer" {}
        // Every other sender sends its frames over RTP. Seconds of speech at once: the
        // session still decodes them when it ends.
        let (mut sender, rtp) = if round % 2 == 0 {
            let mut sender = server.sender(&session);
            for index in 0..FRAMES {
                sender.send_binary(speech.frame(index));
            }
            (sender, None)
        } else {
            let (control, port) = rtp_sender_of(&server, &session);
            let mut rtp = RtpSender::start(&speech, port);
            rtp.send_burst(&speech, FRAMES);
            (control, Some(rtp))
        };
        // The first frames are decoded and their audio reaches webrtcbin.
        std::thread::sleep(Duration::from_millis(300));
        listener.close();
        let (code, reason) = sender.close_reason();
        assert_eq!(code, 4410, "session {round}: the sender was told {code} {reason}");
        drop(rtp);
        let status = server.await_status((0, 0), Duration::from_secs(5));
        assert_eq!(status, (0, 0), "session {round}: sessions and pipelines left");
        if round + 1 == WARM {
            baseline = Some(server.threads_and_rss());
        }
    }
    let (threads, rss) = baseline.unwrap();
    let (threads_after, rss_after) = server.threads_and_rss();
    println!("threads {threads} -> {threads_after}, resident {rss} kB -> {rss_after} kB");
    assert!(
        threads_after <= threads + 2,
        "threads grew from {threads} to {threads_after} over {} sessions",
        SESSIONS - WARM
    );
    assert!(
        rss_after <= rss + rss / 10,
        "resident memory grew from {rss} kB to {rss_after} kB over {} sessions",
        SESSIONS - WARM
    );
    assert_status(&server, (0, 0));
}

/// The peer timeout of the senders' test: the tests' senders (tungstenite) answer pings only
/// while they read, and may wait 1.5 s and more between their last frame and their next read.
const SENDER_PEER_TIMEOUT_S: f64 = 4.0;

/// A sender that stops answering (it reads nothing and sends nothing, its connection open)
/// loses its slot after the peer timeout; the frames it left waiting for a step are dropped,
/// their speech long over. The next sender takes the free slot; one with `takeover=1` takes it
/// from a sender that is there, which is closed with 4490; one without is refused.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_sender_that_stops_answering_loses_its_slot_and_another_takes_over() {
    if !server::in_own_network("vanish::a_sender_that_stops_answering_loses_its_slot_and_another_takes_over")
    {
        return;
    }
    let peer_timeout = SENDER_PEER_TIMEOUT_S.to_string();
    let server = Server::start(&options(&[
        "--chunk-frames",
        "4",
        "--peer-timeout",
        &peer_timeout,
    ]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    // The connection's first speech (after the lead-in), so that what follows is measured alone.
    let mut first = server.sender(&session);
    speak_and_end(&browser, &mut first, &speech, 8);
    first.close();
    wait_ms(500.0);
    let mut silent = server.sender(&session);

    // 10 frames in steps of 4: two wait for the next step when the sender goes quiet.
    let frames = 10;
    let before = Measure::take(&browser);
    let first_sent = speech.send_live(&mut silent, frames);
    let last_sent = epoch_ms();
    let news = await_sender_news(
        &browser,
        4,
        Duration::from_secs_f64(SENDER_PEER_TIMEOUT_S + SLACK_S + 2.0),
    );
    assert_eq!(states(&news)[3], ("left", Some("timeout")));
    // Heard last at its last frame: it never read, so never answered a ping.
    assert_took(
        "a sender that stopped answering lost its slot after",
        (news[3].2 - last_sent) / 1e3,
        SENDER_PEER_TIMEOUT_S - 0.1,
        SENDER_PEER_TIMEOUT_S + SLACK_S,
    );
    wait_ms(1000.0);
    assert_heard(
        "the quiet sender's speech: its two frames that waited dropped",
        &speech,
        &before,
        &Measure::take(&browser),
        first_sent,
        frames - 2,
    );
    assert!(
        server.await_log(
            |line| line.contains(&format!(
                "of session {session} is gone after 10 frames: answered no ping within 4 s"
            )),
            Duration::from_secs(1)
        ),
        "the quiet sender's end is not in the log"
    );
    drop(silent);

    // The slot is free: the next sender takes it without asking.
    let mut next = server.sender(&session);
    let (before, first_sent, after) = speak_and_end(&browser, &mut next, &speech, 6);
    assert_heard(
        "the next sender's speech",
        &speech,
        &before,
        &after,
        first_sent,
        6,
    );

    // A sender with takeover=1 takes the session from it; one without is refused.
    let mut taking = server.connect(&format!("/codes?session={session}&takeover=1"), Some(TOKEN));
    let (code, reason) = next.close_reason();
    println!("the sender taken over: {code} {reason}");
    assert_eq!(code, 4490, "{reason}");
    assert!(reason.contains("another sender took session"), "{reason}");
    let (before, first_sent, after) = speak_and_end(&browser, &mut taking, &speech, 6);
    assert_heard(
        "the speech of the sender that took over",
        &speech,
        &before,
        &after,
        first_sent,
        6,
    );
    let (code, reason) = server.sender(&session).close_reason();
    assert_eq!(code, 4409, "{reason}");
    assert!(reason.contains("has a sender already"), "{reason}");

    let news = await_sender_news(&browser, 7, Duration::from_secs(5));
    assert_eq!(
        states(&news),
        [
            ("joined", None),
            ("left", Some("closed")),
            ("joined", None),
            ("left", Some("timeout")),
            ("joined", None),
            ("left", Some("replaced")),
            ("joined", None),
        ]
    );
    let metrics = assert_status(&server, (1, 1));
    assert_eq!(lost(&metrics, "sender", "timeout"), 1.0, "{metrics}");
    assert_eq!(count(&metrics, "qwencodec_sender_takeovers_total"), 1.0);
    assert_eq!(
        count(&metrics, "qwencodec_frames_in_total"),
        8.0 + 10.0 + 6.0 + 6.0
    );
    assert_eq!(count(&metrics, "qwencodec_late_audio_total"), 0.0);
}

/// An RTP sender's packets show it is there, whatever its WebSocket says: its control
/// connection reads nothing, so answers no ping, and keeps the session's slot while the frames
/// come (three peer timeouts), then loses it a peer timeout after the last.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn an_rtp_sender_is_there_while_its_packets_come_though_its_websocket_is_quiet() {
    if !server::in_own_network(
        "vanish::an_rtp_sender_is_there_while_its_packets_come_though_its_websocket_is_quiet",
    ) {
        return;
    }
    let server = Server::start(&options(&[]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let (control, port) = rtp_sender_of(&server, &session);
    let mut sender = RtpSender::start(&speech, port);
    let frames = (3.0 * PEER_TIMEOUT_S * 1e3 / speech.frame_ms) as usize;
    sender.send_live(&speech, frames);
    let last_sent = epoch_ms();
    let metrics = server.get("/metrics").1;
    assert_eq!(lost(&metrics, "sender", "timeout"), 0.0, "{metrics}");
    let gone = await_log_line(
        &server,
        &format!("of session {session} is gone after {frames} frames: answered no ping within 2 s"),
        Duration::from_secs_f64(PEER_TIMEOUT_S + SLACK_S + 1.0),
    );
    assert_took(
        "the quiet RTP sender lost its slot after its last packet",
        (gone - last_sent) / 1e3,
        PEER_TIMEOUT_S - 0.1,
        PEER_TIMEOUT_S + SLACK_S,
    );
    // The session stays, its browser there.
    let metrics = assert_status(&server, (1, 1));
    assert_eq!(lost(&metrics, "sender", "timeout"), 1.0, "{metrics}");
    assert_eq!(count(&metrics, "qwencodec_frames_in_total"), frames as f64);
    drop(control);
}

/// A TTS sender as a process of its own (Debian's python3-websocket): sends the frames of the
/// file it is given in real time, says `sent`, and waits to be killed.
const SENDER_PROCESS: &str = r#"
import sys, time, websocket
url, token, path, frame_bytes, frame_s = sys.argv[1:6]
frame_bytes, frame_s = int(frame_bytes), float(frame_s)
data = open(path, "rb").read()
ws = websocket.create_connection(url, header=["Authorization: Bearer " + token])
start = time.monotonic()
for index in range(len(data) // frame_bytes):
    time.sleep(max(0.0, start + index * frame_s - time.monotonic()))
    ws.send_binary(data[index * frame_bytes:(index + 1) * frame_bytes])
print("sent", flush=True)
time.sleep(3600)
"#;

/// A sender killed mid-utterance at chunk-frames 4, its last frames short of a step: they play,
/// as an `end` would play them, and the page is told the sender left.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_sender_killed_mid_utterance_is_heard_to_its_last_frame() {
    if !server::in_own_network("vanish::a_sender_killed_mid_utterance_is_heard_to_its_last_frame") {
        return;
    }
    let server = Server::start(&options(&["--chunk-frames", "4"]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    // The connection's first speech (after the lead-in), from a sender that closes when done.
    let mut first = server.sender(&session);
    speak_and_end(&browser, &mut first, &speech, 8);
    first.close();
    wait_ms(500.0);

    // 10 frames: two steps of 4, and 2 that wait for a step when the process is killed.
    let frames = 10;
    let scratch = tempfile::tempdir().unwrap();
    let codes = scratch.path().join("codes.raw");
    std::fs::write(
        &codes,
        (0..frames)
            .flat_map(|index| speech.frame(index))
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let before = Measure::take(&browser);
    let started = epoch_ms();
    let mut process = Command::new("/usr/bin/python3")
        .args(["-c", SENDER_PROCESS])
        .arg(format!("ws://{}/codes?session={session}", server.address))
        .arg(TOKEN)
        .arg(&codes)
        .arg((2 * speech.fixture.codebooks).to_string())
        .arg((speech.frame_ms / 1e3).to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 does not run");
    let mut said = String::new();
    BufReader::new(process.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(
        said.trim(),
        "sent",
        "the sender process (python3-websocket: run tools/setup.sh)"
    );
    process.kill().unwrap();
    process.wait().unwrap();
    wait_ms(1500.0);
    assert_heard(
        "a sender killed mid-utterance",
        &speech,
        &before,
        &Measure::take(&browser),
        started,
        frames,
    );
    let news = await_sender_news(&browser, 4, Duration::from_secs(5));
    assert_eq!(
        states(&news),
        [
            ("joined", None),
            ("left", Some("closed")),
            ("joined", None),
            ("left", Some("broken")),
        ]
    );
    let metrics = assert_status(&server, (1, 1));
    assert_eq!(count(&metrics, "qwencodec_frames_in_total"), 8.0 + 10.0);
    assert_eq!(count(&metrics, "qwencodec_late_audio_total"), 0.0);
}

/// An outage shorter than the peer timeout (the link down 1 s, peer timeout 3 s) is ridden
/// out: the session stays, and speech after it is heard in full.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_browser_whose_link_comes_back_in_time_keeps_its_session() {
    if !server::in_own_network("vanish::a_browser_whose_link_comes_back_in_time_keeps_its_session") {
        return;
    }
    let host = ServerHost::start();
    let server = Server::start_on(&host, &options(&["--chunk-frames", "1", "--peer-timeout", "3"]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    network::link_down();
    wait_ms(1000.0);
    network::link_up();
    // Past the peer timeout from the outage's start.
    wait_ms(3000.0);
    let mut sender = server.sender(&session);
    let frames = 25;
    let (before, first_sent, after) = speak_and_end(&browser, &mut sender, &speech, frames);
    assert_heard(
        "after the link came back",
        &speech,
        &before,
        &after,
        first_sent,
        frames,
    );
    let metrics = assert_status(&server, (1, 1));
    assert_eq!(lost(&metrics, "browser", "timeout"), 0.0, "{metrics}");
    let state = browser.run("return [speech.closed, speech.pc.iceConnectionState];");
    assert!(state[0].is_null(), "the page's signalling closed: {state}");
    println!("the page's ICE after the outage: {}", state[1]);
}

/// The peer connection's path lost (no UDP across the link) while the page's signalling goes
/// on: the session ends once webrtcbin's ICE fails, which libnice 0.1.21 decides when its
/// keepalive checks have gone unanswered for 50 s (see `watch_ice` in session.rs).
#[test]
#[ignore = "takes a minute, libnice's consent timeout: run by hand (docs/streaming-server.md, Peers that vanish)"]
fn a_peer_connection_that_loses_its_path_ends_its_session() {
    if !server::in_own_network("vanish::a_peer_connection_that_loses_its_path_ends_its_session") {
        return;
    }
    let host = ServerHost::start();
    let server = Server::start_on(&host, &options(&["--chunk-frames", "1"]));
    let speech = Speech::load();
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let blocked_at = epoch_ms();
    network::block_udp();
    let gone = format!("session {session} left: its browser is gone: its peer connection");
    let gone_at = await_log_line(&server, &gone, Duration::from_secs(120));
    let ended = (gone_at - blocked_at) / 1e3;
    println!("the session whose peer connection lost its path ended after {ended:.1} s");
    network::unblock_udp();
    let metrics = assert_status(&server, (0, 0));
    assert_eq!(
        lost(&metrics, "browser", "ice_failed") + lost(&metrics, "browser", "ice_disconnected"),
        1.0,
        "{metrics}"
    );
    assert_eq!(lost(&metrics, "browser", "timeout"), 0.0, "{metrics}");
    assert!(ended < 70.0, "{ended:.1} s");
}
