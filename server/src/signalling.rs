//! The browser's side of a session: `/signal`, JSON text messages.
//!
//! browser → server: `{"type":"join"}` first, `{"type":"join","token":…}` where the server
//! takes join tokens (`access`; a session and its pipeline start), then
//! `{"type":"answer","sdp":…}` and `{"type":"ice","candidate":…,"sdpMLineIndex":…}`.
//! server → browser: `{"type":"session","id":…,"iceServers":[…]}` (the `RTCIceServer`s for its
//! peer connection), `{"type":"offer","sdp":…}`, `{"type":"ice",…}`.
//! `{"type":"sender","state":"joined"}` and `{"type":"sender","state":"left","why":…}` when a
//! sender starts and stops feeding the session (see `ingress`).
//! The session ends when this connection does, or when the browser is gone (`liveness`: it
//! answers no ping, or its peer connection failed, stayed disconnected or never connected).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Instant;

use serde_json::json;
use tungstenite::Message;

use crate::access::escaped;
use crate::http::{self, Received, Socket, close};
use crate::liveness::Heartbeat;
use crate::protocol::{FromBrowser, browser_message};
use crate::session::Egress;
use crate::{Server, log};

/// The most ICE candidates a browser may send a session: one has a few per interface, and each
/// costs libnice its checks.
const MAX_CANDIDATES: usize = 100;

/// The next message, or why the connection ends: `Err(None)` when the browser closed it.
fn next_message(
    socket: &mut Socket,
    heartbeat: &mut Heartbeat,
) -> Result<Option<FromBrowser>, Option<(u16, String)>> {
    match heartbeat.read(socket) {
        Received::Message(Message::Text(text)) => browser_message(&text)
            .map(Some)
            .map_err(|err| Some((close::BAD_MESSAGE, err))),
        Received::Message(Message::Binary(_)) => Err(Some((
            close::BAD_MESSAGE,
            "signalling takes JSON text messages, not binary ones".into(),
        ))),
        Received::Message(_) | Received::Nothing => Ok(None),
        Received::TooLarge(err) => Err(Some((close::TOO_LARGE, err))),
        Received::Closed => Err(None),
        Received::Failed(err) => {
            log!("signalling connection failed: {err}");
            Err(None)
        }
    }
}

pub fn serve(server: &Server, socket: Option<Socket>, peer: SocketAddr) {
    let Some(mut socket) = socket else {
        return;
    };
    let refuse = |socket, (code, reason): (u16, String)| {
        log!("refused {peer} on /signal: {code} {}", escaped(&reason));
        server.metrics.refused(code);
        http::close(socket, code, &reason);
    };

    let connected = Instant::now();
    let mut heartbeat = Heartbeat::new(server.peer_times);
    let token = loop {
        match next_message(&mut socket, &mut heartbeat) {
            Ok(Some(FromBrowser::Join { token })) => break token,
            Ok(Some(_)) => return refuse(socket, (close::BAD_MESSAGE, "join first".into())),
            Ok(None) if connected.elapsed() > server.idle_timeout => {
                let reason = format!("no join within {:?}", server.idle_timeout);
                return refuse(socket, (close::TIMEOUT, reason));
            }
            Ok(None) => (),
            Err(Some(refusal)) => return refuse(socket, refusal),
            Err(None) => return,
        }
    };
    // Held until the session ends: the client's place among its sessions.
    let join = match server.joins.admit(token.as_deref(), peer.ip()) {
        Ok(join) => join,
        Err(refusal) => return refuse(socket, refusal),
    };
    let (to_browser, outgoing) = mpsc::channel();
    let session = match server
        .sessions
        .open(to_browser, join.session.clone(), Egress::Browser)
    {
        Ok(session) => session,
        Err(refusal) => return refuse(socket, refusal),
    };
    server.metrics.sessions_opened.inc();
    let id = session.id.clone();
    log!(
        "session {id} joined from {peer} ({} sessions)",
        server.sessions.count()
    );
    let mut ending = None;
    // What its sender is told when the session ends.
    let mut left = "its browser left".to_string();
    let mut candidates = 0;
    if !http::send_text(
        &mut socket,
        json!({"type": "session", "id": id, "iceServers": server.browser_ice_servers}).to_string(),
    ) {
        ending = Some("its connection failed".to_string());
    }

    while ending.is_none() {
        if let Some(why) = session.ended() {
            // The server shuts down.
            http::close(socket, close::GOING_AWAY, &why);
            ending = Some(why);
            break;
        }
        for message in outgoing.try_iter() {
            if !http::send_text(&mut socket, message.to_string()) {
                ending = Some("its connection failed".into());
            }
        }
        if let Some(err) = session.error() {
            log!("session {id}: pipeline error: {err}");
            http::close(socket, close::SERVER_ERROR, &format!("pipeline error: {err}"));
            ending = Some("pipeline error".into());
            break;
        }
        let gone = heartbeat
            .beat(&mut socket)
            .err()
            .or_else(|| session.peer_connection_gone(&server.peer_times));
        if let Some(gone) = gone {
            server.metrics.peer_lost("browser", gone.label);
            http::close_gone(socket, close::TIMEOUT, &gone.reason);
            left = format!("its browser is gone: {}", gone.reason);
            ending = Some(left.clone());
            break;
        }
        match next_message(&mut socket, &mut heartbeat) {
            Ok(Some(FromBrowser::Answer { sdp })) => {
                if let Err(err) = session.set_answer(&sdp) {
                    refuse(socket, (close::BAD_MESSAGE, format!("bad answer: {err}")));
                    ending = Some("bad answer".into());
                    break;
                }
            }
            Ok(Some(FromBrowser::Ice {
                candidate,
                mline_index,
            })) => {
                candidates += 1;
                if candidates > MAX_CANDIDATES {
                    let reason = format!("more than {MAX_CANDIDATES} ICE candidates");
                    refuse(socket, (close::BAD_MESSAGE, reason));
                    ending = Some("too many ICE candidates".into());
                    break;
                }
                // An empty candidate is the browser's end of candidates.
                if !candidate.is_empty() {
                    session.add_ice_candidate(mline_index, &candidate);
                }
            }
            Ok(Some(FromBrowser::Join { .. })) => {
                refuse(socket, (close::BAD_MESSAGE, "joined already".into()));
                ending = Some("joined twice".into());
                break;
            }
            Ok(None) => (),
            Err(Some(refusal)) => {
                ending = Some(refusal.1.clone());
                refuse(socket, refusal);
                break;
            }
            Err(None) => ending = Some("the browser closed the connection".into()),
        }
    }
    drop(session);
    // The client's place first: once `/status` counts the session gone, its client may join
    // again (the place, dropped at the return, came back after the count, and a join in between
    // was refused as one too many).
    drop(join);
    server.sessions.close(&id, &left);
    log!(
        "session {id} left: {} ({} sessions)",
        ending.unwrap_or_default(),
        server.sessions.count()
    );
}
