//! One request: refused, answered (a page, the status, the metrics), or upgraded to one of the
//! WebSocket endpoints, whose handler then runs as a task of its own.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tungstenite::protocol::{Role, WebSocketConfig};

use crate::connections::Admitted;
use crate::http::{self, Io, Socket};
use crate::log::log;
use crate::server::Server;
use crate::{access, broadcast, ingress, metrics, refusal_log, rtp_ingress, session, signalling};

/// What a listener serves: with `--codes-bind`, the public side (the page, `/signal`, the
/// status) on `--bind` and the TTS side (`/codes`) on its own; else both on the one. With
/// `--metrics-bind`, `/metrics` and `/status` on a listener of their own and on no other.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Public,
    Codes,
    Both,
    Monitoring,
}

/// Whether a listener of `side` serves `path`; `monitoring_apart`: `--metrics-bind` was given.
fn serves(side: Side, path: &str, monitoring_apart: bool) -> bool {
    let codes = matches!(path, "/codes" | "/broadcast");
    let monitoring = matches!(path, "/metrics" | "/status");
    match side {
        Side::Monitoring => monitoring,
        _ if monitoring && monitoring_apart => false,
        Side::Public => !codes,
        Side::Codes => codes,
        Side::Both => true,
    }
}

/// Where a request's connection came from and came in, and its place among the connections
/// (held by a WebSocket's task while it runs): put in each request by the accept loop.
#[derive(Clone)]
pub struct Connection {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub admitted: Arc<Admitted>,
}

#[derive(Clone)]
struct Listener {
    server: Arc<Server>,
    side: Side,
}

/// Every path of `side`, answered by [`handle`].
pub fn router(server: Arc<Server>, side: Side) -> Router {
    Router::new()
        .fallback(handle)
        .with_state(Listener { server, side })
}

async fn handle(
    State(Listener { server, side }): State<Listener>,
    request: axum::extract::Request,
) -> Response {
    let connection = request
        .extensions()
        .get::<Connection>()
        .cloned()
        .expect("the accept loop names each request's connection");
    let peer = connection.peer;
    if request.method() != axum::http::Method::GET {
        log!("{peer}: not a GET request: {}", request.method());
        return http::respond(405, "text/plain", "only GET\n");
    }
    let read = http::Request::new(request.uri(), request.headers());
    let path = access::escaped(&read.path);
    if !serves(side, &read.path, server.monitoring_apart) {
        log!("{peer}: no {path} on this listener (--codes-bind, --metrics-bind)");
        return http::respond(404, "text/plain", "not found\n");
    }
    // The TTS side: its paths carry their bearer token, which no page can put on a WebSocket.
    // The monitoring listener is private, asked for by the address a scraper knows.
    let codes = matches!(read.path.as_str(), "/codes" | "/broadcast");
    if !codes && side != Side::Monitoring && !access::host_allowed(&server.allowed_hosts, read.header("host"))
    {
        let why = match read.header("host") {
            Some(host) => format!("host {} is not allowed (--allow-host)", access::escaped(host)),
            None => "no Host: --allow-host needs one".to_owned(),
        };
        refusal_log::refused(403, || format!("refused {peer} on {path}: 403 {why}"));
        server.metrics.refused(403);
        return http::respond(403, "text/plain", format!("{why}\n"));
    }
    const HTML: &str = "text/html; charset=utf-8";
    const SCRIPT: &str = "text/javascript; charset=utf-8";
    let route = (read.path.clone(), read.is_websocket());
    match (route.0.as_str(), route.1) {
        ("/signal", true) => {
            // Refused before the upgrade: a load balancer retries a 503 on another server
            // (nginx's proxy_next_upstream http_503), which a close after it cannot do.
            if let Some(why) = server.sessions.draining() {
                refusal_log::refused(503, || format!("refused {peer} on /signal: 503 {why}"));
                server.metrics.refused(503);
                return http::respond(503, "text/plain", format!("{why}\n"));
            }
            let refusal = access::origin_refusal(
                read.header("origin"),
                read.header("host"),
                &server.allowed_origins,
                server.joins.requires_token(),
            );
            let upgrading = server.clone();
            upgrade(request, &upgrading, connection, move |socket| async move {
                match refusal {
                    None => signalling::serve(server, socket, peer).await,
                    Some(why) => {
                        let code = http::close::FORBIDDEN;
                        refusal_log::refused(code, || format!("refused {peer} on /signal: {code} {why}"));
                        server.metrics.refused(http::close::FORBIDDEN);
                        http::close(socket, http::close::FORBIDDEN, &why).await;
                    }
                }
            })
        }
        ("/codes", true) => {
            let upgrading = server.clone();
            let local = connection.local;
            upgrade(request, &upgrading, connection, move |socket| {
                ingress::serve(server, read, socket, peer, local)
            })
        }
        ("/broadcast", true) => {
            let upgrading = server.clone();
            upgrade(request, &upgrading, connection, move |socket| {
                broadcast::serve(server, read, socket, peer)
            })
        }
        ("/broadcast.html", false) => http::respond(200, HTML, include_str!("../page/broadcast.html")),
        ("/broadcast.js", false) => http::respond(200, SCRIPT, include_str!("../page/broadcast.js")),
        ("/meter.js", false) => http::respond(200, SCRIPT, include_str!("../page/meter.js")),
        ("/janus.js", false) if server.janus_js.is_some() => {
            http::respond(200, SCRIPT, server.janus_js.clone().unwrap_or_default())
        }
        ("/", false) | ("/index.html", false) => http::respond(200, HTML, include_str!("../page/index.html")),
        ("/app.js", false) => http::respond(200, SCRIPT, include_str!("../page/app.js")),
        ("/metrics", false) => {
            rtp_ingress::settle_srtp_failures();
            let text = server
                .metrics
                .render(server.sessions.count(), session::live_pipelines());
            http::respond(200, metrics::CONTENT_TYPE, text)
        }
        ("/status", false) => {
            let sessions = server.sessions.count();
            let status = serde_json::json!({
                "sessions": sessions,
                "pipelines": session::live_pipelines(),
                "draining": server.sessions.draining().is_some(),
                "capacity": server.metrics.capacity.report(sessions),
            });
            http::respond(200, "application/json", status.to_string())
        }
        _ => {
            log!("{peer}: no {path}");
            http::respond(404, "text/plain", "not found\n")
        }
    }
}

/// Answers the upgrade (101); then `serve` runs on the connection as a task of its own, which
/// holds the connection's place among the connections while it runs. Messages are capped at
/// `--max-message-bytes`.
fn upgrade<F, Fut>(
    mut request: axum::extract::Request,
    server: &Server,
    connection: Connection,
    serve: F,
) -> Response
where
    F: FnOnce(Socket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(key) = request.headers().get("sec-websocket-key") else {
        return http::respond(400, "text/plain", "no Sec-WebSocket-Key\n");
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgraded = hyper::upgrade::on(&mut request);
    let config = WebSocketConfig::default()
        .max_message_size(Some(server.max_message_bytes))
        .max_frame_size(Some(server.max_message_bytes));
    tokio::spawn(async move {
        let held = connection.admitted;
        match upgraded.await {
            Ok(upgraded) => {
                let io: Box<dyn Io> = Box::new(TokioIo::new(upgraded));
                serve(WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await).await;
            }
            Err(err) => log!("{}: the WebSocket upgrade failed: {err}", connection.peer),
        }
        drop(held);
    });
    Response::builder()
        .status(101)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(axum::body::Body::empty())
        .expect("a response of a known status and headers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listener_serves_its_own_paths_and_the_monitoring_ones_go_apart() {
        let paths = ["/", "/signal", "/codes", "/broadcast", "/metrics", "/status"];
        let served = |side, apart| {
            paths
                .into_iter()
                .filter(|path| serves(side, path, apart))
                .collect::<Vec<_>>()
        };
        assert_eq!(served(Side::Both, false), paths);
        assert_eq!(
            served(Side::Public, false),
            ["/", "/signal", "/metrics", "/status"]
        );
        assert_eq!(served(Side::Codes, false), ["/codes", "/broadcast"]);
        // With --metrics-bind, on its listener alone.
        assert_eq!(served(Side::Both, true), ["/", "/signal", "/codes", "/broadcast"]);
        assert_eq!(served(Side::Public, true), ["/", "/signal"]);
        assert_eq!(served(Side::Codes, true), ["/codes", "/broadcast"]);
        assert_eq!(served(Side::Monitoring, true), ["/metrics", "/status"]);
    }
}
