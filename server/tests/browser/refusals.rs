//! The refusals of docs/server-protocol.md that no browser is needed to provoke, each on a
//! connection of its own and each the documented close code and reason (or HTTP status and
//! body). The refusals a playing browser or a sender provokes are `bad_input_is_refused_while_a_
//! browser_plays`'s; those of tokens, hosts and caps are in `access`, those of a drain in
//! `hardening`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use super::server::{self, Client, Server};

/// An SDP answer whose only fault is its media sections: two, where the offer has one.
const TWO_SECTIONS: &str = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n\
                            m=audio 9 UDP/TLS/RTP/SAVPF 96\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\n";
/// One with none: before the join it must be refused for coming before the join.
const NO_SECTION: &str = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n";
/// A candidate as a browser writes one, on this host.
const CANDIDATE: &str = "candidate:1 1 udp 2122252543 127.0.0.1 49761 typ host";

/// `/signal` joined: the client and its session's id.
fn joined(server: &Server) -> (Client, String) {
    let mut signalling = server.connect("/signal", None);
    signalling.send_text(r#"{"type":"join"}"#);
    let id = signalling.receive_json()["id"].as_str().unwrap().to_owned();
    (signalling, id)
}

/// `client`'s close: `code`, and a reason that is `reason` (or starts with it, when `reason`
/// ends in `…`), logged as a refusal.
fn assert_closed(server: &Server, what: &str, client: &mut Client, code: u16, reason: &str) {
    let (closed_with, because) = client.close_reason();
    println!("{what}: closed with {closed_with} {because}");
    assert_eq!(closed_with, code, "{what}: {because}");
    match reason.strip_suffix('…') {
        Some(start) => assert!(because.starts_with(start), "{what}: {because:?}, not {reason:?}"),
        None => assert_eq!(because, reason, "{what}"),
    }
    let line = format!("{code} {because}");
    assert!(
        server.await_log(
            |logged| logged.contains("refused") && logged.contains(&line),
            Duration::from_secs(2)
        ),
        "{what} is not in the log"
    );
}

/// A request of `head` (its request line and headers) on a connection of its own: the
/// response's status line and body.
fn request(server: &Server, head: &str) -> (String, String) {
    let mut stream = TcpStream::connect(&server.address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "{head}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn every_refusal_a_client_provokes_is_the_documented_one() {
    if !server::in_own_network("refusals::every_refusal_a_client_provokes_is_the_documented_one") {
        return;
    }
    let server = Server::start(&["--allow-host", "127.0.0.1"]);

    // Signalling: the state is checked before the content.
    let message = |kind: &str, body: serde_json::Value| {
        let mut message = body;
        message["type"] = json!(kind);
        message.to_string()
    };
    let answer = |sdp: &str| message("answer", json!({"sdp": sdp}));
    let ice = |candidate: &str| message("ice", json!({"candidate": candidate, "sdpMLineIndex": 0}));
    for (what, text) in [
        ("an answer before the join", answer(NO_SECTION)),
        ("a candidate before the join", ice("candidate:x")),
    ] {
        let mut signalling = server.connect("/signal", None);
        signalling.send_text(&text);
        assert_closed(&server, what, &mut signalling, 4400, "join first");
    }
    let cases = [
        ("a second join", r#"{"type":"join"}"#.to_owned(), "joined already"),
        (
            "an answer of two media sections",
            answer(TWO_SECTIONS),
            "malformed signalling message: the SDP has 2 media sections, the offer 1",
        ),
        (
            "a candidate whose address is malformed",
            ice("candidate:1 1 udp 1 198.51.100.2/24 1 typ host"),
            "malformed signalling message: the ICE candidate's address is malformed",
        ),
    ];
    for (what, text, reason) in cases {
        let (mut signalling, _) = joined(&server);
        signalling.send_text(&text);
        assert_closed(&server, what, &mut signalling, 4400, reason);
    }
    let (mut signalling, _) = joined(&server);
    for _ in 0..=100 {
        signalling.send_text(&ice(CANDIDATE));
    }
    assert_closed(
        &server,
        "101 candidates",
        &mut signalling,
        4400,
        "more than 100 ICE candidates",
    );
    let mut signalling = server.connect("/signal", None);
    signalling.send_text(r#"{"type":"join","token":"session.1.00"}"#);
    assert_closed(
        &server,
        "a join token on a server without a join secret",
        &mut signalling,
        4400,
        "a join token, but this server takes none (it has no join secret)",
    );
    let mut signalling = server.connect_with("/signal", &[("Origin", "http://elsewhere.example")]);
    assert_closed(
        &server,
        "a page of another origin",
        &mut signalling,
        4403,
        "origin http://elsewhere.example is not allowed (--allow-origin)",
    );

    // HTTP: the Host (--allow-host), an unknown path.
    assert_eq!(
        request(&server, "GET /status HTTP/1.1"),
        (
            "HTTP/1.1 403 Forbidden".to_owned(),
            "no Host: --allow-host needs one\n".to_owned()
        ),
        "a request without a Host"
    );
    assert_eq!(
        request(&server, "GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1"),
        ("HTTP/1.1 404 Not Found".to_owned(), "not found\n".to_owned()),
        "an unknown path"
    );

    // The codes ingress: its query, an RTP sender's messages, its session's end.
    let (signalling, id) = joined(&server);
    let token = Some(server::TOKEN);
    let cases = [
        ("/codes".to_owned(), 4404, "no session=ID in the URL".to_owned()),
        (
            format!("/codes?session={id}&takeover=yes"),
            4400,
            r#"takeover takes 1 or 0, not "yes""#.to_owned(),
        ),
        (
            format!("/codes?session={id}&transport=quic"),
            4400,
            r#"transport takes websocket or rtp, not "quic""#.to_owned(),
        ),
    ];
    for (path, code, reason) in cases {
        let mut sender = server.connect(&path, token);
        assert_closed(&server, &path, &mut sender, code, &reason);
    }
    let mut sender = server.connect(&format!("/codes?session={id}&transport=rtp"), token);
    let port = sender.receive_json();
    println!("the RTP sender's port: {port}");
    sender.send_binary(vec![0; 32]);
    assert_closed(
        &server,
        "frames in a message from an RTP sender",
        &mut sender,
        4400,
        "this sender's frames come over RTP (transport=rtp), not in messages",
    );
    drop(signalling);
    let (signalling, id) = joined(&server);
    let mut sender = server.sender(&id);
    signalling.close();
    assert_closed(
        &server,
        "the session's browser left",
        &mut sender,
        4410,
        &format!("session {id} ended: its browser left"),
    );
}
