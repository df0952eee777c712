//! The server behind a proxy (`--trusted-proxy`): Debian's nginx on the server's host passes
//! `/signal` on with `X-Forwarded-For`, and two clients behind it, at two addresses of the
//! listener's host, are two clients to the per-address caps; without `--trusted-proxy` they are
//! one, the proxy's. A header from anyone but the trusted proxy names no one.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use super::network::{self, PROXY_PORT, SERVER_ADDRESS, ServerHost};
use super::server::{self, Client, Server};

/// A second address of the listener's host: a second client.
const SECOND_CLIENT: &str = "198.51.100.3";

/// A WebSocket to `/signal` at `address` from the listener's host's `local` address, with these
/// request headers.
fn signal_from(local: &str, address: &str, headers: &[(&str, &str)]) -> Client {
    let remote: SocketAddr = address.parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: IpAddr = local.parse().unwrap();
    socket.bind(&SocketAddr::new(local, 0).into()).unwrap();
    socket.connect(&remote.into()).unwrap();
    server::connect_over(TcpStream::from(socket), address, "/signal", headers)
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
}
