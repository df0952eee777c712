//! Admission by measured capacity: a join refused (4429) while the decoder's real-time margin,
//! measured from its steps, is below `--admission-margin`, and admitted again once the speech
//! is over; `/status` and `/metrics` say the same.

use std::time::Duration;

use super::hardening::sample;
use super::server::{self, Server};
use super::webdriver::Browser;
use super::{Speech, connect_page};

/// How far back the server's live signals look (`admission::WINDOW`).
const WINDOW: Duration = Duration::from_secs(3);

/// The capacity's invariants, in `/status` and `/metrics` read one after the other.
fn assert_capacity_sane(server: &Server) -> serde_json::Value {
    let capacity = server.capacity();
    let (sessions, most, headroom) = (
        capacity["sessions"].as_u64().unwrap(),
        capacity["most"].as_u64().unwrap(),
        capacity["headroom"].as_u64().unwrap(),
    );
    assert!(most >= sessions && headroom == most - sessions, "{capacity}");
    let margin = capacity["real_time_margin"].as_f64().unwrap();
    assert!(margin <= 1.0, "{capacity}");
    assert_eq!(capacity["admitting"], capacity["refusal"].is_null(), "{capacity}");
    let text = server.get("/metrics").1;
    assert_eq!(sample(&text, "qwencodec_sessions_most"), most as f64);
    let (sessions, headroom) = (
        sample(&text, "qwencodec_sessions"),
        sample(&text, "qwencodec_sessions_headroom"),
    );
    assert_eq!(headroom, most as f64 - sessions, "{text}");
    assert!(sample(&text, "qwencodec_decode_real_time_margin") <= 1.0);
    let admitting = sample(&text, "qwencodec_admitting");
    assert!(admitting == 0.0 || admitting == 1.0, "{admitting}");
    capacity
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_join_is_refused_while_the_margin_is_below_the_floor_and_admitted_after() {
    if !server::in_own_network(
        "capacity::a_join_is_refused_while_the_margin_is_below_the_floor_and_admitted_after",
    ) {
        return;
    }
    let speech = Speech::load();
    // The server's default admission, measured. A floor no decoder at work reaches: any speech
    // puts the server behind it. --cores 1: the start-up capacity measured on one thread, as a
    // server given half this host would.
    let server = Server::start_with_default_admission(&[
        "--admission-margin",
        "0.999",
        "--cores",
        "1",
        "--max-sessions",
        "4",
    ]);
    assert!(
        server.await_log(
            |line| line.contains("the decoder computes on 1 threads (--cores 1 of"),
            Duration::from_secs(2)
        ),
        "--cores 1 not taken"
    );
    for measured in [
        "sessions served in real time (warm steps of 1, 2, ... rows:",
        "admission: no session while the server is behind",
    ] {
        assert!(
            server.await_log(|line| line.contains(measured), Duration::from_secs(2)),
            "the default admission is not the measured one: no \"{measured}\""
        );
    }
    let idle = assert_capacity_sane(&server);
    println!("idle: {idle}");
    assert_eq!(idle["sessions"], 0);
    assert_eq!(idle["real_time_margin"], 1.0, "no steps yet");
    assert_eq!(idle["admitting"], true);
    let most = idle["most"].as_u64().unwrap();
    assert!(
        most >= 2,
        "the machine measured room for {most} session of the tiny checkpoint: too loaded for this test"
    );

    // Room, and nothing decoded: admitted.
    let browser = Browser::start();
    let session = connect_page(&browser, &server, &speech);
    let mut sender = server.sender(&session);
    let frames = 50;
    let speaking = std::thread::spawn(move || {
        speech.send_live(&mut sender, frames);
        sender
    });

    // While it speaks, the margin measured from its steps is below the floor.
    let behind = server.await_admitting(false, Duration::from_secs(3));
    println!("speaking: {behind}");
    assert_eq!(behind["admitting"], false, "{behind}");
    assert_eq!(behind["sessions"], 1);
    let margin = behind["real_time_margin"].as_f64().unwrap();
    assert!(margin < 0.999, "{behind}");
    let mut refused = server.connect("/signal", None);
    refused.send_text(r#"{"type":"join"}"#);
    let (code, reason) = refused.close_reason();
    println!("refused: {code} {reason}");
    assert_eq!(code, 4429, "{reason}");
    assert!(
        reason.starts_with("the server is behind now: the decoder's real-time margin is")
            && reason.ends_with("below 0.999 (--admission-margin)"),
        "{reason}"
    );
    assert_capacity_sane(&server);

    // The speech over and out of the window: admitted again, beside the first session.
    let sender = speaking.join().unwrap();
    let after = server.await_admitting(true, WINDOW + Duration::from_secs(5));
    println!("after: {after}");
    assert_eq!(after["admitting"], true, "{after}");
    assert_eq!(after["real_time_margin"], 1.0, "{after}");
    let mut admitted = server.connect("/signal", None);
    admitted.send_text(r#"{"type":"join"}"#);
    let joined = admitted.receive_json();
    assert_eq!(joined["type"], "session", "{joined}");
    let both = assert_capacity_sane(&server);
    assert_eq!(both["sessions"], 2, "{both}");

    let text = server.get("/metrics").1;
    assert_eq!(sample(&text, r#"qwencodec_refusals_total{code="4429"}"#), 1.0);
    drop(sender);
    admitted.close();
    browser.close_window();
}
