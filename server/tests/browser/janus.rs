//! A broadcast through an SFU: Debian's Janus on the server's host (`network`), the server
//! publishing a session's speech to a Streaming mountpoint of it (`--janus`), and listeners in
//! Chromium on the other host watching the mountpoint through Janus with janus.js (Debian's
//! libjs-janus-gateway). The speech is decoded once, whatever the listeners. Janus is secured as
//! its operators secure it (its API secret, signed tokens, the Streaming plugin's admin key):
//! the server's calls carry the secrets, its mountpoints are private, bound to the link's
//! address and named by no address, and a crashed run's mountpoints go at the next start.

use std::time::Duration;

use serde_json::{Value, json};

use hmac::{Hmac, Mac};

use super::network::{
    JANUS_ADMIN_KEY, JANUS_API_SECRET, JANUS_PORT, JANUS_TOKEN_SECRET, SERVER_ADDRESS, ServerHost,
};
use super::server::{self, Server, TOKEN, epoch_ms};
use super::webdriver::Browser;
use super::{Measure, Speech, assert_cancel_silences, assert_heard, hardening, wait_until};

/// Frames of speech each listener hears in full: 3.2 s.
const FRAMES: usize = 40;
/// A listener's first audio after the first frame through Janus: about twice the most measured
/// beside `make test`'s other work, and twice a direct session's bound (`FIRST_AUDIO_MS`), the
/// browser's jitter buffer for Janus's stream running deeper than for the server's own peer
/// connection.
const FIRST_AUDIO_THROUGH_JANUS_MS: f64 = 600.0;

/// Janus's HTTP API as the server and the pages reach it.
fn janus_api() -> String {
    format!("http://{SERVER_ADDRESS}:{JANUS_PORT}/janus")
}

/// One POST to Janus's HTTP API with its API secret (HTTP/1.0, so that the answer is its body
/// to the end, not chunked): its JSON answer.
fn janus_call(path: &str, message: Value) -> Value {
    janus_call_with(path, message, Some(JANUS_API_SECRET))
}

/// One POST to Janus's HTTP API, with `apisecret` if given.
fn janus_call_with(path: &str, mut message: Value, apisecret: Option<&str>) -> Value {
    use std::io::{Read, Write};
    message["transaction"] = json!("test");
    if let Some(apisecret) = apisecret {
        message["apisecret"] = json!(apisecret);
    }
    let body = message.to_string();
    let mut stream = std::net::TcpStream::connect((SERVER_ADDRESS, JANUS_PORT)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "POST /janus{path} HTTP/1.0\r\nHost: {SERVER_ADDRESS}:{JANUS_PORT}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(" 200 "), "Janus at {path}: {head}");
    serde_json::from_str(body).unwrap()
}

/// `body`, a request to Janus's Streaming plugin, in a Janus session of its own: the plugin's
/// answer.
fn streaming(body: Value) -> Value {
    let session = janus_call("", json!({"janus": "create"}))["data"]["id"]
        .as_u64()
        .unwrap();
    let handle = janus_call(
        &format!("/{session}"),
        json!({"janus": "attach", "plugin": "janus.plugin.streaming"}),
    )["data"]["id"]
        .as_u64()
        .unwrap();
    let answer = janus_call(
        &format!("/{session}/{handle}"),
        json!({"janus": "message", "body": body}),
    );
    janus_call(&format!("/{session}"), json!({"janus": "destroy"}));
    answer["plugindata"]["data"].clone()
}

/// The mountpoints Janus's Streaming plugin lists, by id: every one with the admin key, the
/// public ones alone without.
fn mountpoints_listed(admin: bool) -> Vec<u64> {
    let mut request = json!({"request": "list"});
    if admin {
        request["admin_key"] = json!(JANUS_ADMIN_KEY);
    }
    streaming(request)["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|mountpoint| mountpoint["id"].as_u64().unwrap())
        .collect()
}

fn mountpoints() -> Vec<u64> {
    mountpoints_listed(true)
}

/// Mountpoint `id`'s secret as the server derives it from the admin key (so that a later run
/// destroys what a crashed one left): HMAC-SHA256 of `qwencodec mountpoint ID`, in hex.
fn mountpoint_secret(id: u64) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(JANUS_ADMIN_KEY.as_bytes()).unwrap();
    mac.update(format!("qwencodec mountpoint {id}").as_bytes());
    data_encoding::HEXLOWER.encode(&mac.finalize().into_bytes())
}

/// The server's options for Janus as the test's runs it: its API, and its secrets in files in
/// `scratch`.
fn janus_options(scratch: &std::path::Path) -> Vec<String> {
    let mut options = vec!["--janus".to_owned(), janus_api()];
    for (option, secret) in [
        ("--janus-api-secret-file", JANUS_API_SECRET),
        ("--janus-admin-key-file", JANUS_ADMIN_KEY),
        ("--janus-token-secret-file", JANUS_TOKEN_SECRET),
    ] {
        let file = scratch.join(option.trim_start_matches("--"));
        std::fs::write(&file, format!("{secret}\n")).unwrap();
        options.extend([option.to_owned(), file.display().to_string()]);
    }
    options
}

/// The UDP addresses Janus's host has sockets bound to, as `ss` lists them (`ADDRESS:PORT`).
fn udp_bound(host: &ServerHost) -> Vec<String> {
    let listed = host.command("ss").args(["-Hunl"]).output().unwrap();
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3).map(str::to_owned))
        .collect()
}

/// Opens the broadcast page at `listen` (as the server named it) in the current window and
/// waits until its peer connection with Janus is up.
fn listen(browser: &Browser, server: &Server, listen: &str, speech: &Speech) {
    browser.open(&format!("{}{listen}", server.url().trim_end_matches('/')));
    browser.run(&format!(
        "speech.threshold = {}; document.getElementById('connect').click();",
        speech.sound_threshold()
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let state = browser.run("return [speech.state, speech.pc && speech.pc.connectionState];");
        if state[1] == "connected" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broadcast page did not connect through Janus: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn two_listeners_hear_one_broadcast_through_janus_decoded_once() {
    if !server::in_own_network("janus::two_listeners_hear_one_broadcast_through_janus_decoded_once") {
        return;
    }
    let host = ServerHost::start();
    let scratch = tempfile::tempdir().unwrap();
    let _janus = host.start_janus(scratch.path());
    let mut options = vec!["--chunk-frames".to_owned(), "1".to_owned()];
    options.extend(janus_options(scratch.path()));
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let server = Server::start_on(&host, &options);
    let speech = Speech::load();

    // The TTS client opens the broadcast: a session, and a mountpoint for it.
    let mut broadcast = server.connect("/broadcast", Some(TOKEN));
    let opened = broadcast.receive_json();
    assert_eq!(opened["type"], "broadcast", "{opened}");
    let (id, mountpoint) = (
        opened["id"].as_str().unwrap(),
        opened["mountpoint"].as_u64().unwrap(),
    );
    assert_eq!(opened["janus"], janus_api().as_str());
    assert_eq!(mountpoints(), [mountpoint], "Janus's mountpoints");
    // Private: listed with the admin key alone; bound to the link's address alone; its secret
    // the one derived from the admin key; named by no address.
    assert_eq!(mountpoints_listed(false), Vec::<u64>::new(), "public mountpoints");
    let info =
        streaming(json!({"request": "info", "id": mountpoint, "secret": mountpoint_secret(mountpoint)}));
    let info = &info["info"];
    assert_eq!(info["is_private"], true, "{info}");
    assert_eq!(info["description"], "qwencodec broadcast", "{info}");
    let port = info["media"][0]["port"]
        .as_u64()
        .expect("the secret shows the port");
    let bound = udp_bound(&host);
    assert!(
        bound.contains(&format!("{SERVER_ADDRESS}:{port}")),
        "the mountpoint's port {port} is not bound to {SERVER_ADDRESS}: {bound:?}"
    );
    let listen_path = opened["listen"].as_str().unwrap();
    assert!(listen_path.contains("#token="), "{listen_path}");

    // Two listeners, each a window of its own, watch it through Janus.
    let browser = Browser::start();
    let first = browser.window();
    listen(&browser, &server, opened["listen"].as_str().unwrap(), &speech);
    let second = browser.new_window();
    listen(&browser, &server, opened["listen"].as_str().unwrap(), &speech);
    let windows = [&first, &second];
    let measure_all = || -> Vec<Measure> {
        windows
            .iter()
            .map(|window| {
                browser.switch_to(window);
                Measure::take(&browser)
            })
            .collect()
    };

    // One utterance, live: both hear it in full, from one decode.
    let mut sender = server.sender(id);
    let before = measure_all();
    let first_sent = speech.send_live(&mut sender, FRAMES);
    sender.send_text(r#"{"type":"end"}"#);
    wait_until(first_sent, speech.seconds(FRAMES) * 1e3 + 1500.0);
    let after = measure_all();
    for (listener, (before, after)) in before.iter().zip(&after).enumerate() {
        let what = format!("listener {}", listener + 1);
        assert_heard(&what, &speech, before, after, first_sent, FRAMES);
        let first_audio = after.first_change(true, first_sent).expect("no sound") - first_sent;
        println!(
            "{what}: first audio {first_audio:.0} ms after the first frame, jitter buffer {:.1} ms",
            after.jitter_buffer_ms_since(before)
        );
        assert!(
            first_audio < FIRST_AUDIO_THROUGH_JANUS_MS,
            "{what}: first audio after {first_audio:.0} ms"
        );
    }
    let metrics = server.get("/metrics").1;
    let decoded = hardening::sample(&metrics, "qwencodec_audio_out_seconds_total");
    assert!(
        (decoded - speech.seconds(FRAMES)).abs() < 1e-6,
        "{decoded} s decoded for two listeners of {} s",
        speech.seconds(FRAMES)
    );
    assert_eq!(server.status(), (1, 1), "sessions and pipelines");

    // Barge-in: 4 s handed over at once, cancelled 1.5 s into playback; both fall silent.
    let sent_at = speech.send_burst(&mut sender, 50);
    wait_until(sent_at, 1500.0);
    let cancelled_at = epoch_ms();
    sender.cancel();
    for window in windows {
        browser.switch_to(window);
        assert_cancel_silences(&browser, cancelled_at);
    }

    // The broadcast ends with its connection: its session, and its mountpoint.
    broadcast.close();
    let (code, reason) = sender.close_reason();
    assert_eq!(code, 4410, "the sender of an ended broadcast: {reason}");
    assert_eq!(
        server.await_status((0, 0), Duration::from_secs(5)),
        (0, 0),
        "sessions and pipelines after the broadcast"
    );
    assert!(
        server.await_log(
            |line| line.contains("the broadcast ended"),
            Duration::from_secs(1)
        ),
        "the end is not in the log"
    );
    assert_eq!(
        mountpoints(),
        Vec::<u64>::new(),
        "Janus's mountpoints after the broadcast"
    );
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn broadcasts_need_the_token_and_janus() {
    if !server::in_own_network("janus::broadcasts_need_the_token_and_janus") {
        return;
    }
    // Without --janus: refused, saying why.
    let server = Server::start(&[]);
    let (code, reason) = server.connect("/broadcast", Some(TOKEN)).close_reason();
    assert_eq!(
        (code, reason.as_str()),
        (4404, "no broadcasts: the server was started without --janus")
    );
    // With a Janus that does not answer: refused, naming it; the token checked first.
    let server = Server::start(&["--janus", "http://127.0.0.1:9/janus"]);
    let (code, reason) = server.connect("/broadcast", Some("not-the-token")).close_reason();
    assert_eq!((code, reason.as_str()), (4401, "wrong token"));
    let (code, reason) = server.connect("/broadcast", Some(TOKEN)).close_reason();
    assert_eq!(code, 4500, "{reason}");
    assert!(
        reason.starts_with("no Janus mountpoint: Janus at http://127.0.0.1:9/janus"),
        "{reason}"
    );
    assert_eq!(server.status(), (0, 0), "sessions and pipelines");
}

/// Janus refuses a caller without its API secret, and the Streaming plugin a `create` without
/// its admin key: the server sends both, or makes no broadcast. A mountpoint a crashed run left
/// (described as the server's, private, its secret derived from the admin key) is gone once
/// the server has started; another's stays.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn a_secured_janus_needs_the_servers_secrets_and_leftovers_go_at_start() {
    if !server::in_own_network("janus::a_secured_janus_needs_the_servers_secrets_and_leftovers_go_at_start") {
        return;
    }
    let host = ServerHost::start();
    let scratch = tempfile::tempdir().unwrap();
    let _janus = host.start_janus(scratch.path());
    let refused = janus_call_with("", json!({"janus": "create"}), None);
    assert_eq!(
        refused["error"]["code"], 403,
        "Janus without its API secret: {refused}"
    );

    // Without the API secret, and then without the admin key: no broadcast.
    let options = janus_options(scratch.path());
    let without = |left_out: &str| -> Vec<String> {
        options
            .chunks(2)
            .filter(|pair| pair[0] != left_out)
            .flatten()
            .cloned()
            .collect()
    };
    for (left_out, says) in [
        ("--janus-api-secret-file", "Unauthorized request"),
        ("--janus-admin-key-file", "admin_key"),
    ] {
        let options = without(left_out);
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let server = Server::start_on(&host, &options);
        let (code, reason) = server.connect("/broadcast", Some(TOKEN)).close_reason();
        assert_eq!(code, 4500, "without {left_out}: {reason}");
        assert!(
            reason.starts_with("no Janus mountpoint: ") && reason.contains(says),
            "without {left_out}: {reason}"
        );
    }
    assert_eq!(
        mountpoints(),
        Vec::<u64>::new(),
        "mountpoints made without the secrets"
    );

    // What a crashed run left, and a mountpoint of someone else's.
    let create = |id: u64, description: &str, secret: &str| {
        let made = streaming(json!({
            "request": "create", "type": "rtp", "id": id, "description": description,
            "secret": secret, "is_private": true, "admin_key": JANUS_ADMIN_KEY,
            "media": [{"type": "audio", "mid": "a", "port": 0, "pt": 96, "codec": "opus"}],
        }));
        assert_eq!(made["stream"]["id"], id, "{made}");
    };
    create(4242, "qwencodec broadcast", &mountpoint_secret(4242));
    create(4343, "someone else's", "their-secret");
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let server = Server::start_on(&host, &options);
    assert!(
        server.await_log(
            |line| line.contains("Janus: 1 mountpoints an earlier run left destroyed"),
            Duration::from_secs(5)
        ),
        "the cleanup is not in the log"
    );
    assert_eq!(mountpoints(), [4343], "Janus's mountpoints after the start");
}
