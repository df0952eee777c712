//! Several servers behind one address: a router of the test's own sends each new `/signal` to
//! the next server in turn and each `/codes?session=ID` to the server whose `--instance` name
//! starts the id. (WebRTC media goes between the browser and its server directly.)

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::hardening::sample;
use super::server::{self, Server, TOKEN, connect_at};

/// Routes by the request head's path and forwards the bytes both ways.
struct Router {
    address: String,
}

impl Router {
    /// In front of `backends`, by instance name.
    fn start(backends: HashMap<String, String>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let names: Vec<String> = {
            let mut names: Vec<String> = backends.keys().cloned().collect();
            names.sort();
            names
        };
        let next = Arc::new(AtomicUsize::new(0));
        let backends = Arc::new(backends);
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let (backends, names, next) = (backends.clone(), names.clone(), next.clone());
                std::thread::spawn(move || {
                    let _ = route(client, &backends, &names, &next);
                });
            }
        });
        Self { address }
    }
}

fn route(
    mut client: TcpStream,
    backends: &HashMap<String, String>,
    names: &[String],
    next: &AtomicUsize,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let target = text.split(' ').nth(1).unwrap_or_default().to_owned();
    let instance = match target.split_once("session=") {
        // The session's server: its instance name starts the id.
        Some((_, id)) => id.split('-').next().unwrap_or_default().to_owned(),
        None => names[next.fetch_add(1, Ordering::SeqCst) % names.len()].clone(),
    };
    let Some(backend) = backends.get(&instance) else {
        client.write_all(b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n")?;
        return Ok(());
    };
    let mut server = TcpStream::connect(backend)?;
    server.write_all(&head)?;
    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
    std::thread::spawn(move || std::io::copy(&mut from_server, &mut to_client));
    std::io::copy(&mut client, &mut server)?;
    Ok(())
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn two_servers_behind_a_router_keep_each_session_on_its_server() {
    if !server::in_own_network("scale_out::two_servers_behind_a_router_keep_each_session_on_its_server") {
        return;
    }
    let servers: Vec<(String, Server)> = ["a", "b"]
        .into_iter()
        .map(|name| (name.to_owned(), Server::start(&["--instance", name])))
        .collect();
    let router = Router::start(
        servers
            .iter()
            .map(|(name, server)| (name.clone(), server.address.clone()))
            .collect(),
    );
    let codes = std::fs::read(super::common::fixture_dir("release-tiny").join("codes.raw")).unwrap();
    let mut signalling = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let mut browser = connect_at(&router.address, "/signal", &[]);
        browser.send_text(r#"{"type":"join"}"#);
        sessions.push(browser.receive_json()["id"].as_str().unwrap().to_owned());
        signalling.push(browser);
    }
    println!("sessions through the router: {sessions:?}");
    assert!(
        sessions[0].starts_with("a-") && sessions[1].starts_with("b-"),
        "{sessions:?}"
    );
    // Each sender reaches its session's server through the router: 3 and 5 frames.
    let bearer = format!("Bearer {TOKEN}");
    for (session, frames) in sessions.iter().zip([3, 5]) {
        let mut sender = connect_at(
            &router.address,
            &format!("/codes?session={session}"),
            &[("Authorization", bearer.as_str())],
        );
        for frame in codes.chunks(32).take(frames) {
            sender.send_binary(frame.to_vec());
        }
        sender.send_text(r#"{"type":"end"}"#);
    }
    std::thread::sleep(Duration::from_millis(500));
    for ((name, server), frames) in servers.iter().zip([3.0, 5.0]) {
        let metrics = server.get("/metrics").1;
        assert_eq!(sample(&metrics, "qwencodec_sessions"), 1.0, "server {name}");
        assert_eq!(
            sample(&metrics, "qwencodec_frames_in_total"),
            frames,
            "server {name}"
        );
    }
}
