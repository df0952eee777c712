//! Who may listen, and who may speak: join tokens that the application's backend signs and that
//! name the session, sender tokens that feed it alone, the Origin a token needs, the Host allow-list, each client's caps on
//! sessions and joins, the RTP codes port that takes its sender's packets alone, the codes
//! listener apart from the public one, and the secrets kept out of the log. In the test's own
//! network namespace; one test with Chromium, the others with plain sockets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use hmac::{Hmac, Mac};

use super::hardening::sample;
use super::rtp_codes::RtpSender;
use super::server::{self, Client, Server, TOKEN, connect_at};
use super::webdriver::Browser;
use super::{Speech, assert_heard, speak_and_end};

/// The join secret the tests' backend shares with the server.
const SECRET: &str = "the join secret of the access tests";

/// A join token as docs/server-protocol.md's backend makes one, with `secret`.
fn join_token(secret: &str, session: &str, expires: u64) -> String {
    signed_token(secret, format!("{session}.{expires}"))
}

/// A sender token as docs/server-protocol.md's backend makes one, with `secret`.
fn sender_token(secret: &str, session: &str, expires: u64) -> String {
    signed_token(secret, format!("sender.{session}.{expires}"))
}

/// `signed` and its signature with `secret`.
fn signed_token(secret: &str, signed: String) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(signed.as_bytes());
    let signature: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{signed}.{signature}")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `text` in a file of `folder`, as a deployment keeps a secret; its path.
fn secret_file(folder: &Path, name: &str, text: &str) -> PathBuf {
    let path = folder.join(name);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    path
}

/// Joins on `/signal` with `token` (when given), from a page of `origin` (when given).
fn join(server: &Server, origin: Option<&str>, token: Option<&str>) -> Client {
    let headers: Vec<(&str, &str)> = origin.iter().map(|origin| ("Origin", *origin)).collect();
    let mut client = server.connect_with("/signal", &headers);
    let join = match token {
        Some(token) => serde_json::json!({"type": "join", "token": token}),
        None => serde_json::json!({"type": "join"}),
    };
    client.send_text(&join.to_string());
    client
}

/// Asserts the server closes `client` with `code` and a reason that says `reason`.
fn assert_refused(what: &str, client: &mut Client, code: u16, reason: &str) {
    let (closed_with, because) = client.close_reason();
    println!("{what}: closed with {closed_with} {because}");
    assert_eq!(closed_with, code, "{what}: {because}");
    assert!(
        because.contains(reason),
        "{what}: {because:?} does not say {reason:?}"
    );
}

/// The first line of the server's log that `matches`, waiting up to 5 s for it.
fn log_line(server: &Server, matches: impl Fn(&str) -> bool) -> String {
    let found = Mutex::new(None);
    let seen = server.await_log(
        |line| {
            let hit = matches(line);
            if hit {
                found.lock().unwrap().get_or_insert_with(|| line.to_owned());
            }
            hit
        },
        Duration::from_secs(5),
    );
    assert!(seen, "no such line in the log");
    found.into_inner().unwrap().unwrap()
}

/// A raw HTTP request: the head of what the server answers.
fn raw_request(address: &str, head: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !answer.windows(4).any(|window| window == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// `request`'s answer, asked again while it is the server's connection cap refusing it: a
/// connection's slot comes back when the server's task for it ends, a moment after the client
/// saw it closed, which on a loaded machine can be after the next request. The retries are
/// printed; more than [`MOST_RETRIES`] (5 s of them) would be a slot that never came back.
fn past_closed_connections(request: impl Fn() -> String) -> String {
    let mut retries = 0;
    loop {
        let answer = request();
        if !answer.contains("has its most connections") {
            println!("asked again {retries} times while the connection cap refused");
            return answer;
        }
        retries += 1;
        assert!(
            retries <= MOST_RETRIES,
            "the connection cap still refused after {retries} retries: {answer}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Retries of [`past_closed_connections`], 50 ms apart.
const MOST_RETRIES: u32 = 100;

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn join_tokens_decide_who_joins_and_name_the_session() {
    if !server::in_own_network("access::join_tokens_decide_who_joins_and_name_the_session") {
        return;
    }
    let folder = tempfile::tempdir().unwrap();
    let codes_token = "a-codes-token-kept-in-a-file-0123";
    let server = Server::start(&[
        "--join-secret-file",
        secret_file(folder.path(), "join-secret", SECRET)
            .to_str()
            .unwrap(),
        "--token-file",
        secret_file(folder.path(), "codes-token", codes_token)
            .to_str()
            .unwrap(),
    ]);
    let own = format!("http://{}", server.address);
    let origin = Some(own.as_str());
    let now = unix_now();
    let valid = join_token(SECRET, "listener-1", now + 60);

    let refusals = [
        ("a join without a token", None, 4401, "a join token is required"),
        (
            "a token that is not one",
            Some("listener-1".to_owned()),
            4401,
            "malformed join token",
        ),
        (
            "a token another secret signed",
            Some(join_token(
                "another secret, guessed wrong",
                "listener-1",
                now + 60,
            )),
            4401,
            "signature is wrong",
        ),
        (
            "a token for another session",
            Some(valid.replacen("listener-1", "listener-2", 1)),
            4401,
            "signature is wrong",
        ),
        (
            "an expired token",
            Some(join_token(SECRET, "listener-1", now - 5)),
            4401,
            "expired",
        ),
        (
            "a token that expires past --max-token-ttl",
            Some(join_token(SECRET, "listener-1", now + 121)),
            4401,
            "--max-token-ttl",
        ),
        (
            "a sender token",
            Some(sender_token(SECRET, "listener-1", now + 60)),
            4401,
            "a sender token: a browser joins with a listener's join token",
        ),
    ];
    for (what, token, code, reason) in refusals {
        assert_refused(what, &mut join(&server, origin, token.as_deref()), code, reason);
    }
    // A valid token, but not from a page: a script that took a token from one may not use it.
    assert_refused(
        "a valid token without an Origin",
        &mut server.connect_with("/signal", &[]),
        4403,
        "no Origin",
    );

    // A valid one joins, and the session has the id the backend chose: its sender finds it.
    let mut listener = join(&server, origin, Some(&valid));
    let session = listener.receive_json();
    assert_eq!(session["type"], "session", "{session}");
    assert_eq!(session["id"], "listener-1", "{session}");
    let mut sender = server.connect("/codes?session=listener-1", Some(codes_token));
    let speech = Speech::load();
    for index in 0..3 {
        sender.send_binary(speech.frame(index));
    }
    let started = Instant::now();
    while sample(&server.get("/metrics").1, "qwencodec_frames_in_total") < 3.0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the sender's frames did not arrive"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The operator's token feeds any session, but takes none over where senders have tokens:
    // the session's sender token does, and the sender it replaces is told.
    let takeover = "/codes?session=listener-1&takeover=1";
    assert_refused(
        "a takeover with the operator's token",
        &mut server.connect(takeover, Some(codes_token)),
        4401,
        "takeover=1 takes session listener-1's sender token, not the operator's token",
    );
    let own = sender_token(SECRET, "listener-1", now + 60);
    let _taken_over_by = server.connect(takeover, Some(&own));
    assert_refused(
        "the sender taken over",
        &mut sender,
        4490,
        "another sender took session listener-1 over",
    );
    // A token opens one session, once.
    assert_refused(
        "a token used already",
        &mut join(&server, origin, Some(&valid)),
        4401,
        "used already",
    );
    // Another token for the session while it is open opens nothing.
    assert_refused(
        "a token for a session open",
        &mut join(&server, origin, Some(&join_token(SECRET, "listener-1", now + 59))),
        4409,
        "session listener-1 is open already",
    );

    // A second listener's browser sends an ICE candidate off the grammar: its session ends
    // with 4400, before webrtcbin sees it; the first plays on.
    let mut second = join(&server, origin, Some(&join_token(SECRET, "listener-2", now + 60)));
    assert_eq!(second.receive_json()["id"], "listener-2");
    second
        .send_text(r#"{"type":"ice","candidate":"candidate:1 1 udp 1 \u0000 1 typ host","sdpMLineIndex":0}"#);
    assert_refused(
        "a malformed candidate",
        &mut second,
        4400,
        "the ICE candidate's address",
    );
    assert_eq!(server.await_status((1, 1), Duration::from_secs(5)), (1, 1));

    // Neither secret, nor a token, is in the log.
    std::thread::sleep(Duration::from_millis(300));
    let signature = valid.rsplit_once('.').unwrap().1;
    for (what, secret) in [
        ("the codes token", codes_token),
        ("the join secret", SECRET),
        ("a join token's signature", signature),
    ] {
        assert!(
            !server.await_log(|line| line.contains(secret), Duration::ZERO),
            "{what} is in the log"
        );
    }
    let announced = log_line(&server, |line| line.contains("codes ingress:"));
    assert!(announced.contains("<the token of --token-file>"), "{announced}");
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_sender_token_feeds_its_own_session_alone() {
    if !server::in_own_network("access::a_sender_token_feeds_its_own_session_alone") {
        return;
    }
    let folder = tempfile::tempdir().unwrap();
    let secret = secret_file(folder.path(), "join-secret", SECRET);
    // No operator token: with a join secret none is made, and senders have their own alone.
    let server = Server::start_without_operator_token(&["--join-secret-file", secret.to_str().unwrap()]);
    let announced = log_line(&server, |line| line.contains("codes ingress:"));
    assert!(
        announced.ends_with("\"Authorization: Bearer <the session's sender token>\" (no operator token)"),
        "{announced}"
    );
    // No --codes-bind: the start says the TTS side shares the public listener, and how not to.
    let warned = log_line(&server, |line| {
        line.contains("warning: /codes and /broadcast share")
    });
    assert!(warned.contains("--codes-bind ADDRESS:PORT"), "{warned}");
    let own = format!("http://{}", server.address);
    let now = unix_now();
    let mut alice = join(&server, Some(&own), Some(&join_token(SECRET, "alice", now + 60)));
    assert_eq!(alice.receive_json()["id"], "alice");
    let mut bob = join(&server, Some(&own), Some(&join_token(SECRET, "bob", now + 60)));
    assert_eq!(bob.receive_json()["id"], "bob");

    let refusals = [
        (
            "a listener's join token",
            "alice",
            join_token(SECRET, "alice", now + 60),
            4401,
            "a listener's join token: a sender needs a sender token",
        ),
        (
            "alice's sender token for bob",
            "bob",
            sender_token(SECRET, "alice", now + 60),
            4403,
            "the sender token is for another session than bob",
        ),
        (
            "an expired sender token",
            "alice",
            sender_token(SECRET, "alice", now - 5),
            4401,
            "the sender token expired",
        ),
        (
            "a sender token another secret signed",
            "alice",
            sender_token("another secret, guessed wrong", "alice", now + 60),
            4401,
            "the sender token's signature is wrong",
        ),
        (
            "the tests' operator token, which this server does not have",
            "alice",
            TOKEN.to_owned(),
            4401,
            "malformed sender token",
        ),
    ];
    for (what, session, token, code, reason) in refusals {
        let mut sender = server.connect(&format!("/codes?session={session}"), Some(&token));
        assert_refused(what, &mut sender, code, reason);
    }
    // Refused before the session is looked up: a session that does not exist is not told.
    let mut sender = server.connect(
        "/codes?session=carol",
        Some(&sender_token(SECRET, "alice", now + 60)),
    );
    assert_refused(
        "a guess at a session",
        &mut sender,
        4403,
        "another session than carol",
    );

    // Its own token feeds alice, whose browser is told; bob hears of no sender.
    let mut sender = server.connect(
        "/codes?session=alice",
        Some(&sender_token(SECRET, "alice", now + 60)),
    );
    // After the offer and the server's candidates.
    let told = (0..100)
        .map(|_| alice.receive_json())
        .find(|message| message["type"] == "sender");
    assert_eq!(
        told,
        Some(serde_json::json!({"type": "sender", "state": "joined"}))
    );
    let speech = Speech::load();
    for index in 0..3 {
        sender.send_binary(speech.frame(index));
    }
    let started = Instant::now();
    while sample(&server.get("/metrics").1, "qwencodec_frames_in_total") < 3.0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the sender's frames did not arrive"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.status(), (2, 2));
    // No token is in the log.
    std::thread::sleep(Duration::from_millis(300));
    let signature = sender_token(SECRET, "alice", now + 60);
    let signature = signature.rsplit_once('.').unwrap().1;
    assert!(
        !server.await_log(|line| line.contains(signature), Duration::ZERO),
        "a sender token's signature is in the log"
    );
    drop(bob);
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn requests_naming_a_host_not_allowed_are_refused() {
    if !server::in_own_network("access::requests_naming_a_host_not_allowed_are_refused") {
        return;
    }
    // A page elsewhere whose name was rebound to this server's address (DNS rebinding) still
    // names its own host.
    let server = Server::start(&["--allow-host", "tts.example.org,127.0.0.1"]);
    let get = |host: Option<&str>| {
        let host = host.map_or_else(String::new, |host| format!("Host: {host}\r\n"));
        raw_request(&server.address, &format!("GET / HTTP/1.1\r\n{host}\r\n"))
    };
    for (host, allowed) in [
        (Some("rebound.example:8080"), false),
        (None, false),
        (Some("tts.example.org"), true),
        (Some("TTS.example.org:443"), true),
        (Some(server.address.as_str()), true),
    ] {
        let answer = get(host);
        println!("Host {host:?}: {}", answer.lines().next().unwrap_or_default());
        let expected = if allowed { "HTTP/1.1 200" } else { "HTTP/1.1 403" };
        assert!(answer.starts_with(expected), "Host {host:?}: {answer}");
    }
    assert!(get(Some("rebound.example:8080")).contains("host rebound.example:8080 is not allowed"));
    let upgrade = "GET /signal HTTP/1.1\r\nHost: rebound.example\r\nUpgrade: websocket\r\n\
                   Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let answer = raw_request(&server.address, upgrade);
    assert!(
        answer.starts_with("HTTP/1.1 403"),
        "/signal from a rebound page: {answer}"
    );
    assert!(server.await_log(
        |line| line.contains("refused") && line.contains("403 host rebound.example is not allowed"),
        Duration::from_secs(2)
    ));
    // The server's own name joins; the codes ingress has its bearer token whatever the Host.
    let mut listener = join(&server, None, None);
    assert_eq!(listener.receive_json()["type"], "session");
    let bearer = format!("Bearer {TOKEN}");
    let mut sender = server.connect_with(
        "/codes?session=nope",
        &[("Host", "tts-farm.internal"), ("Authorization", &bearer)],
    );
    assert_refused(
        "a sender naming another host",
        &mut sender,
        4404,
        "no session nope",
    );
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn sessions_and_joins_are_capped_per_client() {
    if !server::in_own_network("access::sessions_and_joins_are_capped_per_client") {
        return;
    }
    let server = Server::start(&["--max-sessions-per-address", "2", "--max-joins-per-minute", "5"]);
    // Without a join secret a token is a mistake of the deployment, not something to ignore.
    let token = join_token(SECRET, "listener-1", unix_now() + 60);
    assert_refused(
        "a token where the server takes none",
        &mut join(&server, None, Some(&token)),
        4400,
        "takes none",
    );
    let mut first = join(&server, None, None);
    assert_eq!(first.receive_json()["type"], "session");
    let mut second = join(&server, None, None);
    assert_eq!(second.receive_json()["type"], "session");
    assert_refused(
        "a third session from one address",
        &mut join(&server, None, None),
        4429,
        "127.0.0.1 has its most sessions (2)",
    );
    // A session that ends gives its place back.
    drop(first);
    assert_eq!(server.await_status((1, 1), Duration::from_secs(5)), (1, 1));
    let mut third = join(&server, None, None);
    assert_eq!(third.receive_json()["type"], "session");
    // Five joins a minute: the token, the three sessions and the refused one. (The bucket gives
    // one back every 12 s.)
    assert_refused(
        "a sixth join within the minute",
        &mut join(&server, None, None),
        4429,
        "127.0.0.1 joins too often (at most 5 a minute)",
    );
    assert_eq!(server.status(), (2, 2));
    drop((second, third));
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn the_rtp_port_takes_its_senders_packets_alone() {
    if !server::in_own_network("access::the_rtp_port_takes_its_senders_packets_alone") {
        return;
    }
    // Behind a 1:1 NAT the sender is told the public address.
    let server = Server::start(&["--public-address", "203.0.113.7"]);
    let mut listener = join(&server, None, None);
    let session = listener.receive_json()["id"].as_str().unwrap().to_owned();
    let mut control = server.connect(&format!("/codes?session={session}&transport=rtp"), Some(TOKEN));
    let offer = control.receive_json();
    let port = offer["port"].as_u64().unwrap() as u16;
    let sdp = offer["sdp"].as_str().unwrap();
    assert!(sdp.contains("c=IN IP4 203.0.113.7\r\n"), "{sdp}");

    // The control connection came from 127.0.0.1: packets from 127.0.0.2 are dropped, however
    // well formed.
    let speech = Speech::load();
    let frames_in = || sample(&server.get("/metrics").1, "qwencodec_frames_in_total");
    let mut stranger = RtpSender::start_from(&speech, "127.0.0.2", port, 1);
    stranger.send_burst(&speech, 10);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(frames_in(), 0.0, "frames from another address went in");
    assert!(server.await_log(
        |line| line.contains(&format!(
            "session {session}: dropped an RTP packet from 127.0.0.2"
        )),
        Duration::from_secs(2)
    ));
    // In packets of 5 frames, as a sender may pack them: each counts as its frames.
    let mut sender = RtpSender::start_from(&speech, "127.0.0.1", port, 5);
    sender.send_burst(&speech, 10);
    let started = Instant::now();
    while frames_in() < 10.0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the sender's frames did not arrive"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(frames_in(), 10.0);
    // More than a minute of speech at once (12.5 frames a second): the session refuses it, and
    // the sender's control connection is closed saying why.
    sender.send_burst(&speech, 60 * 25 / 2 + 10);
    let (code, reason) = control.close_reason();
    assert_eq!(code, 4413, "{reason}");
    assert!(reason.contains("more than 60 s of speech queued"), "{reason}");
    drop(control);
    assert!(server.await_log(
        |line| line.contains(&format!(
            "session {session}: 10 RTP packets from other addresses than its sender's dropped"
        )),
        Duration::from_secs(5)
    ));
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn senders_have_a_listener_and_connections_of_their_own() {
    if !server::in_own_network("access::senders_have_a_listener_and_connections_of_their_own") {
        return;
    }
    let server = Server::start(&[
        "--codes-bind",
        "127.0.0.1:0",
        "--max-connections",
        "2",
        "--max-connections-per-address",
        "2",
    ]);
    let announced = log_line(&server, |line| line.contains("codes ingress: ws://"));
    assert!(
        !server.await_log(|line| line.contains("warning: /codes"), Duration::ZERO),
        "a warning of a shared listener where the TTS side has its own"
    );
    let codes_address = announced
        .split("ws://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    assert_ne!(codes_address, server.address);

    // The public side full: a session and an idle connection.
    let mut listener = join(&server, None, None);
    let session = listener.receive_json()["id"].as_str().unwrap().to_owned();
    let idle = TcpStream::connect(&server.address).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let answer = raw_request(&server.address, "GET /status HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "a third public connection: {answer}"
    );
    // The sender still gets in, on its own listener.
    let bearer = format!("Bearer {TOKEN}");
    let mut sender = connect_at(
        &codes_address,
        &format!("/codes?session={session}"),
        &[("Authorization", &bearer)],
    );
    let speech = Speech::load();
    sender.send_binary(speech.frame(0));
    drop(idle);
    std::thread::sleep(Duration::from_millis(300));
    let metrics = past_closed_connections(|| server.get("/metrics").1);
    assert_eq!(sample(&metrics, "qwencodec_frames_in_total"), 1.0);

    // Each listener serves its own side alone.
    let upgrade = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    };
    let answer = past_closed_connections(|| {
        raw_request(&server.address, &upgrade(&format!("/codes?session={session}")))
    });
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "/codes on the public side: {answer}"
    );
    let answer = raw_request(&codes_address, &upgrade("/signal"));
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "/signal on the codes side: {answer}"
    );
    let answer = raw_request(&codes_address, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "the page on the codes side: {answer}"
    );
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_page_joins_with_the_token_in_its_url_fragment_and_hears_its_speech() {
    if !server::in_own_network("access::a_page_joins_with_the_token_in_its_url_fragment_and_hears_its_speech")
    {
        return;
    }
    let folder = tempfile::tempdir().unwrap();
    let server = Server::start(&[
        "--join-secret-file",
        secret_file(folder.path(), "join-secret", SECRET)
            .to_str()
            .unwrap(),
    ]);
    let speech = Speech::load();
    let browser = Browser::start();
    let token = join_token(SECRET, "listener-7", unix_now() + 60);
    browser.open(&format!("{}#token={token}", server.url()));
    // The page took the token out of its URL (and its history) as it loaded.
    let href = browser.run("return location.href;");
    assert_eq!(href, server.url(), "the page's URL");
    browser.run(&format!(
        "speech.threshold = {}; document.getElementById('connect').click();",
        speech.sound_threshold()
    ));
    // Chromium's answer and candidates pass the server's checks, and the peer connection comes
    // up.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state =
            browser.run("return [speech.session, speech.pc && speech.pc.connectionState, speech.state];");
        if state[1] == "connected" {
            assert_eq!(state[0], "listener-7", "{state}");
            break;
        }
        assert!(Instant::now() < deadline, "the page did not connect: {state}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut sender = server.sender("listener-7");
    let frames = 25;
    let (before, first_sent, after) = speak_and_end(&browser, &mut sender, &speech, frames);
    assert_heard(
        "speech to the page that joined with a token",
        &speech,
        &before,
        &after,
        first_sent,
        frames,
    );
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn the_metrics_and_status_have_a_private_listener_of_their_own() {
    if !server::in_own_network("access::the_metrics_and_status_have_a_private_listener_of_their_own") {
        return;
    }
    let server = Server::start(&["--metrics-bind", "127.0.0.1:0", "--allow-host", "tts.example.org"]);
    let announced = log_line(&server, |line| line.contains("monitoring: http://"));
    let monitoring = announced
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    assert_ne!(monitoring, server.address);
    let get = |address: &str, path: &str, host: &str| {
        past_closed_connections(|| {
            raw_request(address, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n"))
        })
    };
    // On the public side: not there, whatever the Host.
    for path in ["/metrics", "/status"] {
        let answer = get(&server.address, path, "tts.example.org");
        assert!(answer.starts_with("HTTP/1.1 404"), "{path} on --bind: {answer}");
    }
    assert!(get(&server.address, "/", "tts.example.org").starts_with("HTTP/1.1 200"));
    // On the monitoring side, by its own address (not one --allow-host lists), and nothing else.
    for path in ["/metrics", "/status"] {
        let answer = get(&monitoring, path, &monitoring);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{path} on --metrics-bind: {answer}"
        );
    }
    for path in ["/", "/app.js", "/signal", "/codes"] {
        let answer = get(&monitoring, path, &monitoring);
        assert!(
            answer.starts_with("HTTP/1.1 404"),
            "{path} on --metrics-bind: {answer}"
        );
    }
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_flood_of_refusals_logs_a_burst_and_then_a_line_a_second_that_counts_the_rest() {
    if !server::in_own_network(
        "access::a_flood_of_refusals_logs_a_burst_and_then_a_line_a_second_that_counts_the_rest",
    ) {
        return;
    }
    let server = Server::start(&["--allow-host", "tts.example.org"]);
    let refused = |n: usize| {
        for index in 0..n {
            let host = format!("flood-{index}.example");
            let answer = past_closed_connections(|| {
                raw_request(
                    &server.address,
                    &format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n"),
                )
            });
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        }
    };
    let lines = |matches: &dyn Fn(&str) -> bool| {
        let count = std::cell::Cell::new(0);
        server.await_log(
            |line| {
                if line.contains("refused") && line.contains(": 403 host flood-") && matches(line) {
                    count.set(count.get() + 1);
                }
                false
            },
            Duration::ZERO,
        );
        count.get()
    };
    let started = Instant::now();
    let flood = 200;
    refused(flood);
    let took = started.elapsed().as_secs() as usize;
    std::thread::sleep(Duration::from_millis(300));
    // The burst of 10, and a line for each second the flood took at most.
    let logged = lines(&|_| true);
    assert!(
        (10..=11 + took).contains(&logged),
        "{logged} lines for {flood} refusals in {took} s"
    );
    // A second later, the next refusal's line counts those not logged.
    std::thread::sleep(Duration::from_millis(1100));
    refused(1);
    let counted = |line: &str| line.contains("refusals with 403 before it not logged");
    assert!(
        server.await_log(
            |line| line.contains("refused") && counted(line),
            Duration::from_secs(2)
        ),
        "no line counts the refusals not logged"
    );
    // Every refusal is in the metrics.
    let metrics = past_closed_connections(|| {
        let mut stream = TcpStream::connect(&server.address).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: tts.example.org\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    });
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert_eq!(
        sample(&metrics, r#"qwencodec_refusals_total{code="403"}"#),
        (flood + 1) as f64
    );
}

/// `qwencodec-server` run with `args` (and `env`) until it exits, or killed after 20 s (it
/// started serving): its exit's success and what it wrote on stderr.
fn exit_of(args: &[&str], env: &[(&str, &str)]) -> (Option<bool>, String) {
    use std::process::{Command, Stdio};
    let mut process = Command::new(env!("CARGO_BIN_EXE_qwencodec-server"))
        .args(args)
        .env_remove("QWENCODEC_JOIN_SECRET")
        .env_remove("QWENCODEC_CODES_TOKEN")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = process.try_wait().unwrap() {
            break Some(status.success());
        }
        if Instant::now() > deadline {
            process.kill().unwrap();
            process.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    process
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn a_server_others_reach_does_not_start_open_and_takes_no_secret_on_its_command_line() {
    let (exited, stderr) = exit_of(&["--bind", "0.0.0.0:0", "--device", "cpu"], &[]);
    assert_eq!(
        exited,
        Some(false),
        "bound to 0.0.0.0 without a join secret: {stderr}"
    );
    assert!(
        stderr.contains("--bind 0.0.0.0:0 is reachable from other hosts")
            && stderr.contains("head -c 32 /dev/urandom")
            && stderr.contains("--insecure-open"),
        "{stderr}"
    );
    // With a join secret no operator token is made, and broadcasts need one.
    let (exited, stderr) = exit_of(
        &["--janus", "http://127.0.0.1:1/janus", "--device", "cpu"],
        &[("QWENCODEC_JOIN_SECRET", SECRET)],
    );
    assert_eq!(exited, Some(false), "--janus without an operator token: {stderr}");
    assert!(
        stderr.contains("--janus: /broadcast takes the operator's token"),
        "{stderr}"
    );
    let (exited, stderr) = exit_of(&["--token", "a-codes-token", "--device", "cpu"], &[]);
    assert_eq!(exited, Some(false), "a token on the command line: {stderr}");
    assert!(
        stderr.contains("--token: a secret on the command line shows in ps"),
        "{stderr}"
    );
    // With --insecure-open, or a secret from the environment, the bind passes: the check
    // after it (--drain-timeout's) is the one that stops these.
    let secret = ("QWENCODEC_JOIN_SECRET", SECRET);
    for (args, env) in [
        (
            &["--bind", "0.0.0.0:0", "--insecure-open", "--drain-timeout", "-1"][..],
            &[][..],
        ),
        (
            &["--bind", "0.0.0.0:0", "--drain-timeout", "-1"][..],
            &[secret][..],
        ),
    ] {
        let (exited, stderr) = exit_of(args, env);
        assert_eq!(exited, Some(false), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--drain-timeout must be 0 or above"),
            "{args:?}: {stderr}"
        );
    }
}
