//! The network side never waits on a pipeline: sessions whose pipelines stall in their start
//! (the server's test seam `QWENCODEC_SERVER_STALL_STARTS`, built with its `test-stalls`
//! feature for these tests alone) hold up no other session's signalling, nor `/status`.

use std::time::{Duration, Instant};

use super::server::{self, Server};

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn stalled_pipelines_hold_up_no_other_sessions_signalling() {
    if !server::in_own_network("stalls::stalled_pipelines_hold_up_no_other_sessions_signalling") {
        return;
    }
    // More stalled starts than the server has threads to run its connections on: a start that
    // ran on one of them would leave none for the session that follows.
    let stalled = std::thread::available_parallelism().map_or(1, |cores| cores.get()) + 1;
    const STALL: Duration = Duration::from_secs(6);
    let server = Server::start_with_env(
        &[
            "--max-sessions",
            "64",
            "--max-sessions-per-address",
            "0",
            "--max-joins-per-minute",
            "0",
        ],
        &[(
            "QWENCODEC_SERVER_STALL_STARTS",
            &format!("{stalled},{}", STALL.as_millis()),
        )],
    );
    let started = Instant::now();
    let mut waiting: Vec<_> = (0..stalled)
        .map(|_| {
            let mut signalling = server.connect("/signal", None);
            signalling.send_text(r#"{"type":"join"}"#);
            signalling
        })
        .collect();
    // Their joins are in: the next session is the first whose pipeline does not stall.
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    assert_eq!(server.status().0, 0, "no stalled session is open yet");
    let status_took = asked.elapsed();
    let mut signalling = server.connect("/signal", None);
    signalling.send_text(r#"{"type":"join"}"#);
    let session = signalling.receive_json();
    let joined = asked.elapsed();
    println!(
        "{stalled} starts stalled for {STALL:?}: /status in {status_took:?}, another session joined in {joined:?}"
    );
    assert_eq!(session["type"], "session", "{session}");
    assert!(
        joined < Duration::from_secs(2),
        "a session joined in {joined:?} while {stalled} others' pipelines stalled"
    );
    assert!(
        started.elapsed() < STALL,
        "the stall ended before the check: {:?}",
        started.elapsed()
    );
    // The stalled ones start when their stall ends.
    for signalling in &mut waiting {
        assert_eq!(signalling.receive_json()["type"], "session");
    }
    assert!(
        started.elapsed() >= STALL,
        "the stalled sessions joined before their stall ended"
    );
}
