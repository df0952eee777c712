//! One connection: its request read, refused or answered (a page, the status, the metrics), or
//! upgraded to one of the WebSocket endpoints.

use std::net::{SocketAddr, TcpStream};

use crate::log::log;
use crate::server::Server;
use crate::{access, broadcast, http, ingress, metrics, session, signalling};

/// What a listener serves: with `--codes-bind`, the public side (the page, `/signal`, the
/// status) on `--bind` and the TTS side (`/codes`) on its own; else both on the one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Public,
    Codes,
    Both,
}

/// One connection: a page, the status, or one of the two WebSocket endpoints, as `side` serves
/// them.
pub fn serve(server: &Server, stream: TcpStream, peer: SocketAddr, side: Side) {
    let request = match http::Request::read(&stream, server.idle_timeout) {
        Ok(request) => request,
        Err(err) => {
            log!("{peer}: {err}");
            return;
        }
    };
    let path = access::escaped(&request.path);
    // The TTS side: its paths carry their bearer token, which no page can put on a WebSocket.
    let codes = matches!(request.path.as_str(), "/codes" | "/broadcast");
    if codes && side == Side::Public || !codes && side == Side::Codes {
        log!("{peer}: no {path} on this listener (--codes-bind)");
        return http::respond(stream, "404 Not Found", "text/plain", "not found\n");
    }
    if !codes && !access::host_allowed(&server.allowed_hosts, request.header("host")) {
        let why = match request.header("host") {
            Some(host) => format!("host {} is not allowed (--allow-host)", access::escaped(host)),
            None => "no Host: --allow-host needs one".to_owned(),
        };
        log!("refused {peer} on {path}: 403 {why}");
        server.metrics.refused(403);
        return http::respond(stream, "403 Forbidden", "text/plain", &format!("{why}\n"));
    }
    match (request.path.as_str(), request.is_websocket()) {
        ("/signal", true) => {
            // Refused before the upgrade: a load balancer retries a 503 on another server
            // (nginx's proxy_next_upstream http_503), which a close after it cannot do.
            if let Some(why) = server.sessions.draining() {
                log!("refused {peer} on /signal: 503 {why}");
                server.metrics.refused(503);
                return http::respond(
                    stream,
                    "503 Service Unavailable",
                    "text/plain",
                    &format!("{why}\n"),
                );
            }
            match access::origin_refusal(
                request.header("origin"),
                request.header("host"),
                &server.allowed_origins,
                server.joins.requires_token(),
            ) {
                None => signalling::serve(server, request.upgrade(stream, server), peer),
                Some(why) => {
                    log!("refused {peer} on /signal: {} {why}", http::close::FORBIDDEN);
                    server.metrics.refused(http::close::FORBIDDEN);
                    if let Some(socket) = request.upgrade(stream, server) {
                        http::close(socket, http::close::FORBIDDEN, &why);
                    }
                }
            }
        }
        ("/codes", true) => ingress::serve(
            server,
            &request,
            request.upgrade(stream, server),
            &peer.to_string(),
        ),
        ("/broadcast", true) => broadcast::serve(server, &request, request.upgrade(stream, server), peer),
        ("/broadcast.html", false) => http::respond(
            stream,
            "200 OK",
            "text/html; charset=utf-8",
            include_str!("../page/broadcast.html"),
        ),
        ("/broadcast.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("../page/broadcast.js"),
        ),
        ("/meter.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("../page/meter.js"),
        ),
        ("/janus.js", false) if server.janus_js.is_some() => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            server.janus_js.as_deref().unwrap_or_default(),
        ),
        ("/", false) | ("/index.html", false) => http::respond(
            stream,
            "200 OK",
            "text/html; charset=utf-8",
            include_str!("../page/index.html"),
        ),
        ("/app.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("../page/app.js"),
        ),
        ("/metrics", false) => {
            let text = server
                .metrics
                .render(server.sessions.count(), session::live_pipelines());
            http::respond(stream, "200 OK", metrics::CONTENT_TYPE, &text)
        }
        ("/status", false) => {
            let sessions = server.sessions.count();
            let status = serde_json::json!({
                "sessions": sessions,
                "pipelines": session::live_pipelines(),
                "draining": server.sessions.draining().is_some(),
                "capacity": server.metrics.capacity.report(sessions),
            });
            http::respond(stream, "200 OK", "application/json", &status.to_string())
        }
        _ => {
            log!("{peer}: no {path}");
            http::respond(stream, "404 Not Found", "text/plain", "not found\n")
        }
    }
}
