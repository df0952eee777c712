//! The server against clients that are not its page: other origins, too many connections, a
//! request head that never ends; and SIGTERM. No browser: the server and plain sockets, in the
//! test's own network namespace.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::server::{self, Client, Server};

/// Reads what the server answers on a raw connection until it closes it (or `patience` runs
/// out: then None).
fn answer_until_closed(stream: &mut TcpStream, patience: Duration) -> Option<String> {
    stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let deadline = Instant::now() + patience;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while Instant::now() < deadline {
        match stream.read(&mut chunk) {
            Ok(0) => return Some(String::from_utf8_lossy(&answer).into_owned()),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(String::from_utf8_lossy(&answer).into_owned()),
        }
    }
    None
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn other_origins_too_many_connections_and_slow_heads_are_refused() {
    if !server::in_own_network("hardening::other_origins_too_many_connections_and_slow_heads_are_refused") {
        return;
    }
    let server = Server::start(&[
        "--allow-origin",
        "https://app.example",
        "--max-connections-per-address",
        "4",
        "--idle-timeout",
        "1",
    ]);
    // A page elsewhere may not drive sessions; the server's own page and the allowed one may,
    // and so may clients that are not browsers (no Origin).
    let own = format!("http://{}", server.address);
    for (origin, refused) in [
        (Some("http://elsewhere.example"), true),
        (Some("https://app.example"), false),
        (Some(own.as_str()), false),
        (None, false),
    ] {
        let headers: Vec<(&str, &str)> = origin.iter().map(|origin| ("Origin", *origin)).collect();
        let mut client = server.connect_with("/signal", &headers);
        if refused {
            let (code, reason) = client.close_reason();
            println!("origin {origin:?}: closed with {code} {reason}");
            assert_eq!(code, 4403, "{reason}");
            assert!(reason.contains("not allowed"), "{reason}");
        } else {
            client.send_text(r#"{"type":"join"}"#);
            assert_eq!(client.receive_json()["type"], "session", "origin {origin:?}");
        }
    }
    assert_eq!(server.await_status((0, 0), Duration::from_secs(5)), (0, 0));
    // The thread that answered the last status poll lets go of its place just after the
    // answer; on a busy machine (make test runs the browser tests side by side) that moment can
    // outlast the four connections' opening, which would refuse one of them and let the fifth
    // in. A moment for it, before the idle timeout's clock starts.
    std::thread::sleep(Duration::from_millis(500));

    // Four connections from one address that say nothing hold their threads; the fifth is
    // answered 503 at once. Their idle timeout frees them.
    let mut idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&server.address).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fifth = TcpStream::connect(&server.address).unwrap();
    let answer = answer_until_closed(&mut fifth, Duration::from_secs(2)).expect("the fifth was left open");
    println!("fifth connection: {}", answer.lines().next().unwrap_or_default());
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("has its most connections (4)"), "{answer:?}");
    for stream in &mut idle {
        assert!(
            answer_until_closed(stream, Duration::from_secs(3)).is_some(),
            "an idle connection outlived the idle timeout"
        );
    }

    // A request head sent a byte every 200 ms is cut off at the idle timeout, however alive.
    let mut slow = TcpStream::connect(&server.address).unwrap();
    let started = Instant::now();
    let head = b"GET /status HTTP/1.1\r\nHost: slow\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed_after = None;
    for byte in head {
        if slow.write_all(&[*byte]).is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        if let Some(answer) = answer_until_closed(&mut slow, Duration::from_millis(1)) {
            assert!(
                !answer.contains("200 OK"),
                "the slow head was answered: {answer:?}"
            );
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("a slow request head held its connection for good");
    println!("slow request head closed after {closed_after:?}");
    assert!(closed_after < Duration::from_secs(3), "{closed_after:?}");
    assert!(
        server.await_log(|line| line.contains("sent no request in"), Duration::from_secs(2)),
        "the slow head is not in the log"
    );
}

/// SIGTERM drains: no new session (a new `/signal` answered 503, a join 4503, `/status` says
/// so), an idle session ended at once, a speaking one once its speech has played, one with more
/// queued than `--drain-timeout` at the timeout; then the server exits 0.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn sigterm_drains_each_session_after_its_speech_and_exits_0() {
    if !server::in_own_network("hardening::sigterm_drains_each_session_after_its_speech_and_exits_0") {
        return;
    }
    const DRAIN_TIMEOUT_S: u64 = 4;
    let mut server = Server::start(&["--drain-timeout", &DRAIN_TIMEOUT_S.to_string()]);
    let speech = super::Speech::load();
    let join = || {
        let mut signalling = server.connect("/signal", None);
        signalling.send_text(r#"{"type":"join"}"#);
        let id = signalling.receive_json()["id"].as_str().unwrap().to_string();
        (signalling, id)
    };
    let (idle, _) = join();
    let (speaking, speaking_id) = join();
    let (long, long_id) = join();
    // Connected before the signal, joins after it.
    let mut late_join = server.connect("/signal", None);
    let mut speaking_sender = server.sender(&speaking_id);
    let mut long_sender = server.sender(&long_id);
    // 2 s of speech, ended; and 40 s, more than the drain waits for.
    let speaking_frames = 25;
    let speech_sent = Instant::now();
    speech.send_burst(&mut speaking_sender, speaking_frames);
    speaking_sender.send_text(r#"{"type":"end"}"#);
    long_sender.send_binary((0..500).flat_map(|index| speech.frame(index)).collect());
    std::thread::sleep(Duration::from_millis(300));

    server.send_sigterm();
    let signalled = Instant::now();
    // Each connection's close, and when it came, read on a thread of its own.
    let closed = |mut client: Client| {
        std::thread::spawn(move || {
            let (code, reason) = client.close_reason();
            (code, reason, Instant::now())
        })
    };
    let [idle, speaking, speaking_sender, long, long_sender] =
        [idle, speaking, speaking_sender, long, long_sender].map(closed);

    // Draining: /status says so, and no session is taken.
    assert!(
        server.await_log(|line| line.contains("draining"), Duration::from_secs(2)),
        "no draining in the log"
    );
    let status: serde_json::Value = serde_json::from_str(&server.get("/status").1).unwrap();
    println!("status while draining: {status}");
    assert_eq!(status["draining"], true, "{status}");
    assert_eq!(status["capacity"]["admitting"], false, "{status}");
    assert!(
        status["capacity"]["refusal"]
            .as_str()
            .is_some_and(|why| why.contains("draining")),
        "{status}"
    );
    let mut new_signal = TcpStream::connect(&server.address).unwrap();
    write!(
        new_signal,
        "GET /signal HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        server.address
    )
    .unwrap();
    let answer =
        answer_until_closed(&mut new_signal, Duration::from_secs(2)).expect("a new /signal left open");
    println!("a new /signal while draining: {:?}", answer.lines().next());
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("the server is draining"), "{answer:?}");
    late_join.send_text(r#"{"type":"join"}"#);
    let (code, reason) = late_join.close_reason();
    println!("a join while draining: {code} {reason}");
    assert_eq!(code, 4503, "{reason}");
    assert!(reason.contains("join another server"), "{reason}");

    let [idle, speaking, speaking_sender, long, long_sender] =
        [idle, speaking, speaking_sender, long, long_sender].map(|closed| closed.join().unwrap());
    let status = server.await_exit(Duration::from_secs(15));
    for (what, (code, reason, at)) in [
        ("idle browser", &idle),
        ("speaking browser", &speaking),
        ("speaking sender", &speaking_sender),
        ("browser of 40 s", &long),
        ("sender of 40 s", &long_sender),
    ] {
        println!(
            "{what}: {code} {reason}, {:.0} ms after the signal",
            at.duration_since(signalled).as_secs_f64() * 1e3
        );
    }
    // The idle session at once, before the speaking one: the old shutdown ended both at once.
    assert_eq!(idle.0, 1001, "{}", idle.1);
    assert!(idle.1.contains("the server is shutting down"), "{}", idle.1);
    assert!(
        idle.2 < speaking.2,
        "the idle session ended after the speaking one"
    );
    // The speaking one once its speech had played (the server plays it in real time).
    assert_eq!(speaking.0, 1001, "{}", speaking.1);
    assert_eq!(speaking_sender.0, 4410, "{}", speaking_sender.1);
    assert!(
        speaking_sender.1.contains("the server is shutting down"),
        "{}",
        speaking_sender.1
    );
    let speech_s = speech.seconds(speaking_frames);
    let played_for = speaking_sender.2.duration_since(speech_sent).as_secs_f64();
    assert!(
        played_for >= speech_s,
        "the speaking session ended {played_for:.3} s after its {speech_s:.3} s of speech was sent"
    );
    // The one with more speech than the drain waits for, at the drain timeout.
    assert_eq!(long.0, 1001, "{}", long.1);
    assert_eq!(long_sender.0, 4410, "{}", long_sender.1);
    assert!(long_sender.1.contains("--drain-timeout"), "{}", long_sender.1);
    assert!(
        long_sender.2.duration_since(signalled) >= Duration::from_secs(DRAIN_TIMEOUT_S),
        "the session of 40 s ended before the drain timeout"
    );
    assert!(status.success(), "the server exited with {status}");
}

/// A second SIGTERM while the server drains ends the sessions left at once.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_second_sigterm_ends_the_drain_at_once() {
    if !server::in_own_network("hardening::a_second_sigterm_ends_the_drain_at_once") {
        return;
    }
    let mut server = Server::start(&[]);
    let speech = super::Speech::load();
    let mut signalling = server.connect("/signal", None);
    signalling.send_text(r#"{"type":"join"}"#);
    let session = signalling.receive_json()["id"].as_str().unwrap().to_string();
    let mut sender = server.sender(&session);
    // 40 s queued: the first signal's drain would wait for it, up to its 30 s timeout.
    sender.send_binary((0..500).flat_map(|index| speech.frame(index)).collect());
    std::thread::sleep(Duration::from_millis(300));
    server.send_sigterm();
    assert!(
        server.await_log(|line| line.contains("draining"), Duration::from_secs(2)),
        "no draining in the log"
    );
    server.send_sigterm();
    let (code, reason) = sender.close_reason();
    println!("sender after the second signal: {code} {reason}");
    assert_eq!(code, 4410, "{reason}");
    assert!(reason.contains("a second signal"), "{reason}");
    let (code, reason) = signalling.close_reason();
    assert_eq!(code, 1001, "{reason}");
    let status = server.await_exit(Duration::from_secs(10));
    assert!(status.success(), "the server exited with {status}");
}

/// The value of the sample `name` (with its labels, as written) in OpenMetrics text.
pub fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn metrics_count_what_the_server_did() {
    if !server::in_own_network("hardening::metrics_count_what_the_server_did") {
        return;
    }
    let server = Server::start(&[]);
    let mut signalling = server.connect("/signal", None);
    signalling.send_text(r#"{"type":"join"}"#);
    let session = signalling.receive_json()["id"].as_str().unwrap().to_string();
    let mut sender = server.sender(&session);
    let codes = std::fs::read(super::common::fixture_dir("release-tiny").join("codes.raw")).unwrap();
    for frame in codes.chunks(32).take(10) {
        sender.send_binary(frame.to_vec());
    }
    sender.send_text(r#"{"type":"end"}"#);
    let (code, _) = server
        .connect("/codes?session=nope", Some("wrong"))
        .close_reason();
    assert_eq!(code, 4401);
    std::thread::sleep(Duration::from_millis(500));

    let (head, text) = server.get("/metrics");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    for (family, kind) in [
        ("qwencodec_sessions", "gauge"),
        ("qwencodec_pipelines", "gauge"),
        ("qwencodec_sessions_opened", "counter"),
        ("qwencodec_frames_in", "counter"),
        ("qwencodec_audio_out_seconds", "counter"),
        ("qwencodec_late_audio", "counter"),
        ("qwencodec_refusals", "counter"),
        ("qwencodec_decode_step_seconds", "histogram"),
        ("qwencodec_decode_batch_rows", "histogram"),
        ("qwencodec_decode_steps_waiting", "gauge"),
        ("qwencodec_sessions_most", "gauge"),
        ("qwencodec_sessions_headroom", "gauge"),
        ("qwencodec_admitting", "gauge"),
        ("qwencodec_decode_real_time_margin", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "no {kind} {family}:\n{text}"
        );
    }
    assert_eq!(sample(&text, "qwencodec_sessions"), 1.0);
    assert_eq!(sample(&text, "qwencodec_pipelines"), 1.0);
    assert_eq!(sample(&text, "qwencodec_sessions_opened_total"), 1.0);
    assert_eq!(sample(&text, "qwencodec_frames_in_total"), 10.0);
    // No browser takes the audio: it stops at webrtcbin after the first packets. (The browser
    // test checks the audio out and the late packets where a browser plays.)
    let audio = sample(&text, "qwencodec_audio_out_seconds_total");
    assert!(audio > 0.0 && audio <= 0.8 + 1e-6, "{audio} s of audio out");
    assert_eq!(sample(&text, r#"qwencodec_refusals_total{code="4401"}"#), 1.0);
    // The capacity: --max-sessions' 16 (the tests' --admission off), one of them taken.
    assert_eq!(sample(&text, "qwencodec_sessions_most"), 16.0);
    assert_eq!(sample(&text, "qwencodec_sessions_headroom"), 15.0);
    assert_eq!(sample(&text, "qwencodec_admitting"), 1.0);
    let margin = sample(&text, "qwencodec_decode_real_time_margin");
    assert!(margin <= 1.0, "a real-time margin of {margin}");
    let capacity = server.capacity();
    assert_eq!(
        (&capacity["sessions"], &capacity["most"], &capacity["headroom"]),
        (&1.into(), &16.into(), &15.into()),
        "{capacity}"
    );
    assert_eq!(capacity["admitting"], true, "{capacity}");
    assert!(capacity["refusal"].is_null(), "{capacity}");
    assert!(
        capacity["real_time_margin"].as_f64().unwrap() <= 1.0,
        "{capacity}"
    );
    // The steps' histogram: buckets that only grow, up to the count.
    let steps = sample(&text, "qwencodec_decode_step_seconds_count");
    assert!(steps >= 1.0, "{steps} decode steps");
    let buckets: Vec<f64> = text
        .lines()
        .filter(|line| line.starts_with("qwencodec_decode_step_seconds_bucket"))
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(buckets.windows(2).all(|pair| pair[0] <= pair[1]), "{buckets:?}");
    assert_eq!(buckets.last(), Some(&steps));
}

/// A browser's candidates as the server takes them: those in its SDP answer count against the
/// 100-candidate cap with those it trickles; a candidate naming an mDNS name (`.local`) is
/// dropped unresolved and counted in the log; one naming any other host name is refused.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn candidates_in_answers_count_and_host_names_are_not_resolved() {
    if !server::in_own_network("hardening::candidates_in_answers_count_and_host_names_are_not_resolved") {
        return;
    }
    let server = Server::start(&[]);
    let candidate =
        |n: usize, address: &str| format!("candidate:{n} 1 udp 2122252543 {address} {} typ host", 40000 + n);
    let join = || {
        let mut signalling = server.connect("/signal", None);
        signalling.send_text(r#"{"type":"join"}"#);
        let id = signalling.receive_json()["id"].as_str().unwrap().to_owned();
        (signalling, id)
    };
    let send = |signalling: &mut Client, kind: &str, mut message: serde_json::Value| {
        message["type"] = kind.into();
        signalling.send_text(&message.to_string());
    };

    // 60 in the answer, 41 trickled: the 101st is refused.
    let (mut signalling, _) = join();
    let mut sdp = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\n".to_owned();
    for n in 0..60 {
        sdp += &format!("a={}\r\n", candidate(n, "127.0.0.1"));
    }
    send(&mut signalling, "answer", serde_json::json!({"sdp": sdp}));
    for n in 60..=100 {
        let trickled = serde_json::json!({"candidate": candidate(n, "127.0.0.1"), "sdpMLineIndex": 0});
        send(&mut signalling, "ice", trickled);
    }
    let (code, reason) = signalling.close_reason();
    assert_eq!((code, reason.as_str()), (4400, "more than 100 ICE candidates"));

    // A host name: refused, unresolved.
    let (mut signalling, _) = join();
    let named =
        serde_json::json!({"candidate": candidate(1, "metadata.google.internal"), "sdpMLineIndex": 0});
    send(&mut signalling, "ice", named);
    let (code, reason) = signalling.close_reason();
    assert_eq!(code, 4400, "{reason}");
    assert!(
        reason.starts_with(r#"an ICE candidate names the host "metadata.google.internal""#),
        "{reason}"
    );

    // mDNS names, trickled and in the answer: dropped, and counted when the session ends.
    let (mut signalling, id) = join();
    let mdns = serde_json::json!({"candidate": candidate(1, "4f1c.local"), "sdpMLineIndex": 0});
    send(&mut signalling, "ice", mdns);
    let sdp = format!(
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\na={}\r\n",
        candidate(2, "9e2a.local")
    );
    send(&mut signalling, "answer", serde_json::json!({"sdp": sdp}));
    signalling.close();
    assert!(
        server.await_log(
            |line| line.contains(&format!("session {id} left"))
                && line.contains("2 of its browser's candidates named mDNS names, dropped"),
            Duration::from_secs(5)
        ),
        "the dropped mDNS candidates are not in the log"
    );
}
