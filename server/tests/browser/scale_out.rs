//! Two servers behind one address, with media: Debian's nginx in front routes each page's
//! `/signal` to the next server in turn and each `/codes?session=ID` to the server whose
//! `--instance` name starts the id (`map $arg_session`, as docs/streaming-server.md shows); a
//! browser window on each server hears its own session's speech and not the other's, and when
//! one server is stopped (SIGTERM) it drains: its page hears the utterance under way to its end,
//! then its session ends, while the other server's page plays on and new joins land there.
//! (WebRTC media goes between each browser and its server directly.)
//!
//! nginx rather than a router of the test's own: the test then shows the configuration the docs
//! give working, and a real load balancer's answer to a draining server (`proxy_next_upstream
//! http_503`: a join refused with 503 is retried on the other server), which a router of our
//! own would only show of itself.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::server::{self, Client, Server, TOKEN, connect_at};
use super::webdriver::Browser;
use super::{Measure, Speech, assert_heard, assert_silent, connect_page_at, wait_ms, wait_until};

/// nginx in front of `servers` (by `--instance` name), on this namespace's loopback; stopped
/// when dropped.
struct Router {
    process: Child,
    address: String,
}

impl Router {
    fn start(scratch: &Path, servers: &[(&str, &Server)]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let by_session: String = servers
            .iter()
            .map(|(name, server)| format!("~^{name}- {};", server.address))
            .collect();
        let every_server: String = servers
            .iter()
            .map(|(_, server)| format!("server {};", server.address))
            .collect();
        let websocket = "proxy_http_version 1.1;
                         proxy_set_header Upgrade $http_upgrade;
                         proxy_set_header Connection \"upgrade\";
                         proxy_set_header Host $http_host;
                         proxy_read_timeout 3600s;";
        let scratch_text = scratch.display();
        let config = format!(
            "daemon off;
             master_process off;
             pid {scratch_text}/nginx.pid;
             error_log stderr;
             events {{}}
             http {{
               access_log off;
               client_body_temp_path {scratch_text}/body;
               proxy_temp_path {scratch_text}/proxy;
               fastcgi_temp_path {scratch_text}/fastcgi;
               uwsgi_temp_path {scratch_text}/uwsgi;
               scgi_temp_path {scratch_text}/scgi;
               # A session's codes go to the server that holds it: its id starts with the
               # server's --instance name.
               map $arg_session $tts_backend {{ {by_session} }}
               # New sessions in turn. The pages have a turn of their own, or a page's own
               # requests would decide where its /signal goes.
               upstream tts_joins {{ {every_server} }}
               upstream tts_pages {{ {every_server} }}
               server {{
                 listen {address};
                 location = /codes {{ proxy_pass http://$tts_backend; {websocket} }}
                 # A draining server answers a new /signal 503, a stopped one not at all: the
                 # join goes to the next server.
                 location = /signal {{
                   proxy_pass http://tts_joins;
                   proxy_next_upstream error timeout http_503;
                   {websocket}
                 }}
                 location / {{ proxy_pass http://tts_pages; proxy_next_upstream error timeout http_503; }}
               }}
             }}"
        );
        let config_file = scratch.join("nginx.conf");
        std::fs::write(&config_file, config).unwrap();
        let process = Command::new("nginx")
            .arg("-c")
            .arg(&config_file)
            .arg("-p")
            .arg(scratch)
            .spawn()
            .expect("nginx (Debian's nginx-light) does not run: run tools/setup.sh");
        let started = Instant::now();
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nginx does not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { process, address }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.address)
    }

    /// The codes ingress of `session`, through the router.
    fn sender(&self, session: &str) -> Client {
        let bearer = format!("Bearer {TOKEN}");
        connect_at(
            &self.address,
            &format!("/codes?session={session}"),
            &[("Authorization", bearer.as_str())],
        )
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A page's session on one of the servers: its window, its sender through the router.
struct Page {
    window: String,
    session: String,
    sender: Client,
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn two_servers_behind_nginx_each_play_their_sessions_and_one_drains_alone() {
    if !server::in_own_network(
        "scale_out::two_servers_behind_nginx_each_play_their_sessions_and_one_drains_alone",
    ) {
        return;
    }
    let speech = Speech::load();
    let mut server_a = Server::start(&["--instance", "a"]);
    let server_b = Server::start(&["--instance", "b"]);
    let scratch = tempfile::tempdir().unwrap();
    let router = Router::start(scratch.path(), &[("a", &server_a), ("b", &server_b)]);

    // A window for each new session, through the router: one lands on each server.
    let browser = Browser::start();
    let mut pages = Vec::new();
    for index in 0..2 {
        let window = if index == 0 {
            browser.window()
        } else {
            browser.new_window()
        };
        let session = connect_page_at(&browser, &router.url(), &speech);
        let sender = router.sender(&session);
        pages.push(Page {
            window,
            session,
            sender,
        });
    }
    pages.sort_by(|one, other| one.session.cmp(&other.session));
    let sessions: Vec<&str> = pages.iter().map(|page| page.session.as_str()).collect();
    println!("sessions through the router: {sessions:?}");
    assert!(
        sessions[0].starts_with("a-") && sessions[1].starts_with("b-"),
        "{sessions:?}"
    );

    // Each page hears its own speech, sent through the router, and not the other's; each
    // server decoded the frames of its own session alone (30 and 20).
    for (speaking, frames) in [(0, 30), (1, 20)] {
        let silent = 1 - speaking;
        browser.switch_to(&pages[speaking].window);
        let before_speaking = Measure::take(&browser);
        browser.switch_to(&pages[silent].window);
        let before_silent = Measure::take(&browser);
        let sender = &mut pages[speaking].sender;
        let sent_at = speech.send_burst(sender, frames);
        sender.send_text(r#"{"type":"end"}"#);
        wait_until(sent_at, speech.seconds(frames) * 1e3 + 1500.0);
        let after_silent = Measure::take(&browser);
        browser.switch_to(&pages[speaking].window);
        let after_speaking = Measure::take(&browser);
        let which = &pages[speaking].session[..1];
        assert_heard(
            &format!("the page on server {which}, spoken to"),
            &speech,
            &before_speaking,
            &after_speaking,
            sent_at,
            frames,
        );
        assert_silent(
            &format!("the other page while the page on server {which} is spoken to"),
            &speech,
            &before_silent,
            &after_silent,
            sent_at,
        );
    }
    for (name, server, frames) in [("a", &server_a, 30.0), ("b", &server_b, 20.0)] {
        let metrics = server.get("/metrics").1;
        assert_eq!(
            super::hardening::sample(&metrics, "qwencodec_frames_in_total"),
            frames,
            "frames decoded by server {name}"
        );
    }

    let [page_a, mut page_b] = <[Page; 2]>::try_from(pages).ok().unwrap();

    // Server a is stopped 1 s into an utterance of 3.2 s in real time. It drains: the utterance
    // plays to its end, then the session ends; meanwhile a new join goes to server b, and the
    // page on b hears a new utterance in full.
    let (drained_frames, other_frames) = (40, 30);
    browser.switch_to(&page_a.window);
    let before_a = Measure::take(&browser);
    browser.switch_to(&page_b.window);
    let before_b = Measure::take(&browser);
    let speaking_to_a = {
        let speech = Speech::load();
        let mut sender = page_a.sender;
        std::thread::spawn(move || {
            let first_sent = speech.send_live(&mut sender, drained_frames);
            sender.send_text(r#"{"type":"end"}"#);
            (sender, first_sent)
        })
    };
    wait_ms(1000.0);
    server_a.send_sigterm();
    assert!(
        server_a.await_log(|line| line.contains("draining"), Duration::from_secs(2)),
        "server a does not drain"
    );
    let mut new_join = connect_at(&router.address, "/signal", &[]);
    new_join.send_text(r#"{"type":"join"}"#);
    let new_session = new_join.receive_json()["id"].as_str().unwrap().to_owned();
    println!("a join while server a drains: {new_session}");
    assert!(new_session.starts_with("b-"), "{new_session}");
    // It went to b because a refused it, not by turn: nginx's turn was a's (two joins so
    // far, one to each), and a answered 503.
    assert!(
        server_a.await_log(
            |line| line.contains("on /signal: 503 the server is draining"),
            Duration::from_secs(2)
        ),
        "server a did not refuse the join"
    );
    let other_sent = speech.send_burst(&mut page_b.sender, other_frames);
    page_b.sender.send_text(r#"{"type":"end"}"#);

    let (mut sender_a, first_sent) = speaking_to_a.join().unwrap();
    wait_until(first_sent, speech.seconds(drained_frames) * 1e3 + 1500.0);
    browser.switch_to(&page_a.window);
    assert_heard(
        "the page on server a, its utterance while a drains",
        &speech,
        &before_a,
        &Measure::take(&browser),
        first_sent,
        drained_frames,
    );
    let closed = browser.run("return speech.closed;");
    println!("the page on server a, its signalling: {closed}");
    assert_eq!(closed["code"], 1001, "{closed}");
    assert_eq!(closed["reason"], "the server is shutting down", "{closed}");
    let (code, reason) = sender_a.close_reason();
    println!("the sender of server a's session: {code} {reason}");
    assert_eq!(code, 4410, "{reason}");
    let exit = server_a.await_exit(Duration::from_secs(10));
    assert!(exit.success(), "server a exited with {exit}");

    wait_until(other_sent, speech.seconds(other_frames) * 1e3 + 1500.0);
    browser.switch_to(&page_b.window);
    assert_heard(
        "the page on server b while server a drains",
        &speech,
        &before_b,
        &Measure::take(&browser),
        other_sent,
        other_frames,
    );
    assert!(
        browser.run("return speech.closed;").is_null(),
        "the page on server b was closed"
    );
    assert_eq!(
        server_b.status(),
        (2, 2),
        "server b's sessions and pipelines: its page's and the new join's"
    );
}
