//! The server behind a proxy (`--trusted-proxy`): Debian's nginx on the server's host passes
//! `/signal` on with `X-Forwarded-For`, and two clients behind it, at two addresses of the
//! listener's host, are two clients to the per-address caps; without `--trusted-proxy` they are
//! one, the proxy's. A header from anyone but the trusted proxy names no one.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use super::network::{self, PROXY_PORT, SERVER_ADDRESS, ServerHost};
use super::server::{self, Client, Server};

/// A second address of the listener's host: a second client.
const SECOND_CLIENT: &str = "198.51.100.3";

/// A TCP connection to `address` from the listener's host's `local` address.
fn connect_from(local: &str, address: &str) -> TcpStream {
    let remote: SocketAddr = address.parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: IpAddr = local.parse().unwrap();
    socket.bind(&SocketAddr::new(local, 0).into()).unwrap();
    socket.connect(&remote.into()).unwrap();
    TcpStream::from(socket)
}

/// A WebSocket to `/signal` at `address` from the listener's host's `local` address, with these
/// request headers.
fn signal_from(local: &str, address: &str, headers: &[(&str, &str)]) -> Client {
    server::connect_over(connect_from(local, address), address, "/signal", headers)
}

/// A GET of `/status` at `address` from `local`, with this header line if any: the status line
/// and the body.
fn status_from(local: &str, address: &str, header: &str) -> (String, String) {
    let mut stream = connect_from(local, address);
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "GET /status HTTP/1.1\r\nHost: {address}\r\n{header}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// Joins a session on `client`: its id.
fn join(client: &mut Client) -> String {
    client.send_text(r#"{"type":"join"}"#);
    let session = client.receive_json();
    assert_eq!(session["type"], "session", "{session}");
    session["id"].as_str().unwrap().to_owned()
}

/// A join on `client` refused: the close's code and reason.
fn refused_join(client: &mut Client) -> (u16, String) {
    client.send_text(r#"{"type":"join"}"#);
    client.close_reason()
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn clients_behind_a_trusted_proxy_are_capped_each_at_their_own_address() {
    if !server::in_own_network("proxy::clients_behind_a_trusted_proxy_are_capped_each_at_their_own_address") {
        return;
    }
    let host = ServerHost::start();
    network::add_listener_address(SECOND_CLIENT);
    let scratch = tempfile::tempdir().unwrap();
    let listener = network::LISTENER_ADDRESS;
    let proxy = format!("{SERVER_ADDRESS}:{PROXY_PORT}");
    let one_session_each = ["--max-sessions-per-address", "1"];

    // Behind nginx, trusted: two addresses, a session each.
    let mut options = one_session_each.to_vec();
    options.extend(["--trusted-proxy", SERVER_ADDRESS]);
    let trusting = Server::start_on(&host, &options);
    let _nginx = host.start_proxy(scratch.path(), &trusting.address);
    let mut first = signal_from(listener, &proxy, &[]);
    let id = join(&mut first);
    let mut second = signal_from(SECOND_CLIENT, &proxy, &[]);
    join(&mut second);
    assert!(
        trusting.await_log(
            |line| line.contains(&format!("session {id} joined from {listener}:0")),
            Duration::from_secs(5)
        ),
        "the log does not name the client behind the proxy"
    );
    // The first client again, naming another address itself: nginx appends the one it came
    // from, the right-most, and the server takes that.
    let mut spoofing = signal_from(listener, &proxy, &[("X-Forwarded-For", "203.0.113.9")]);
    let (code, reason) = refused_join(&mut spoofing);
    assert_eq!(
        (code, reason.as_str()),
        (4429, format!("{listener} has its most sessions (1)").as_str())
    );
    // Straight to the server, not through the trusted proxy: its header names no one.
    let mut direct = signal_from(listener, &trusting.address, &[("X-Forwarded-For", "203.0.113.9")]);
    let (code, reason) = refused_join(&mut direct);
    assert_eq!(
        (code, reason.as_str()),
        (4429, format!("{listener} has its most sessions (1)").as_str())
    );
    drop((first, second, _nginx));
    drop(trusting);

    // Without --trusted-proxy the two are one client, the proxy.
    let proxied = Server::start_on(&host, &one_session_each);
    let _nginx = host.start_proxy(scratch.path(), &proxied.address);
    let mut first = signal_from(listener, &proxy, &[]);
    join(&mut first);
    let mut second = signal_from(SECOND_CLIENT, &proxy, &[]);
    let (code, reason) = refused_join(&mut second);
    assert_eq!(
        (code, reason.as_str()),
        (
            4429,
            format!("{SERVER_ADDRESS} has its most sessions (1)").as_str()
        )
    );
    drop((first, second, _nginx));
    drop(proxied);

    // The connection cap: a trusted proxy's connection counts against its client's once the
    // request names it. The second address is a trusted proxy too here, to send a header of
    // its own straight to the server.
    let mut options = vec!["--max-connections-per-address", "1", "--trusted-proxy"];
    let trusted = format!("{SERVER_ADDRESS},{SECOND_CLIENT}");
    options.push(&trusted);
    let capped = Server::start_on(&host, &options);
    let _nginx = host.start_proxy(scratch.path(), &capped.address);
    let held = signal_from(listener, &proxy, &[]);
    let (status, body) = status_from(listener, &proxy, "");
    assert_eq!(
        (status.as_str(), body.as_str()),
        (
            "HTTP/1.1 503 Service Unavailable",
            format!("{listener} has its most connections (1)\n").as_str()
        ),
        "the first client's second connection through the proxy"
    );
    let (status, _) = status_from(SECOND_CLIENT, &proxy, "");
    assert_eq!(status, "HTTP/1.1 200 OK", "another client through the proxy");
    let (status, body) = status_from(SECOND_CLIENT, &capped.address, "X-Forwarded-For: unknown\r\n");
    assert_eq!(
        (status.as_str(), body.trim_end()),
        (
            "HTTP/1.1 400 Bad Request",
            format!(
                "X-Forwarded-For from the trusted proxy {SECOND_CLIENT} names \"unknown\", not an address"
            )
            .as_str()
        ),
        "a trusted proxy's header that names no address"
    );
    drop(held);
}
