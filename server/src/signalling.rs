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
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use serde_json::json;
use tungstenite::Message;

use crate::access;
use crate::http::{Received, Socket, close};
use crate::liveness::Heartbeat;
use crate::log::log;
use crate::server::Server;
use crate::session::Egress;
use crate::session_loop::{Connection, Ending, Step};
use qwencodec_protocol::messages::{FromBrowser, read_browser_message};

/// The most ICE candidates a browser may send a session: one has a few per interface, and each
/// costs libnice its checks.
const MAX_CANDIDATES: usize = 100;

/// The browser's message in what was read, if any, or why the connection ends: `Err(None)` when
/// the browser closed it. What the message carries is not checked yet (see [`checked`]): a
/// message the session does not take now is refused for that first.
fn message(received: Received) -> Result<Option<FromBrowser>, Option<(u16, String)>> {
    match received {
        Received::Message(Message::Text(text)) => read_browser_message(&text)
            .map(Some)
            .map_err(|err| Some((close::BAD_MESSAGE, err))),
        Received::Message(Message::Binary(_)) => Err(Some((
            close::BAD_MESSAGE,
            "signalling takes JSON text messages, not binary ones".into(),
        ))),
        Received::Message(_) => Ok(None),
        Received::TooLarge(err) => Err(Some((close::TOO_LARGE, err))),
        Received::Closed => Err(None),
        Received::Failed(err) => {
            log!("signalling connection failed: {err}");
            Err(None)
        }
    }
}

/// A message the session takes now, once what it carries (an SDP, a candidate) is checked.
fn checked(message: Option<FromBrowser>) -> Result<Option<FromBrowser>, Option<(u16, String)>> {
    match message {
        Some(message) => match message.check() {
            Ok(()) => Ok(Some(message)),
            Err(err) => Err(Some((close::BAD_MESSAGE, err))),
        },
        None => Ok(None),
    }
}

/// Refuses the browser's `/signal`.
async fn refuse(server: &Server, socket: Socket, peer: SocketAddr, (code, reason): (u16, String)) {
    access::refuse(&server.metrics, socket, "/signal", &peer, code, &reason).await;
}

pub async fn serve(server: Arc<Server>, mut socket: Socket, peer: SocketAddr) {
    let joining_until = Instant::now() + server.idle_timeout;
    let mut heartbeat = Heartbeat::new(server.peer_times);
    let token = loop {
        let Ok(next) = tokio::time::timeout_at(joining_until.into(), socket.next()).await else {
            let refusal = (
                close::TIMEOUT,
                format!("no join within {:?}", server.idle_timeout),
            );
            return refuse(&server, socket, peer, refusal).await;
        };
        let refusal = match message(heartbeat.received(&mut socket, next).await) {
            // A join carries nothing to check but its token (`access`).
            Ok(Some(FromBrowser::Join { token })) => break token,
            // The state before the content: an answer or candidate before the join is refused
            // as such, whatever it carries.
            Ok(Some(_)) => (close::BAD_MESSAGE, "join first".into()),
            Ok(None) => continue,
            Err(Some(refusal)) => refusal,
            Err(None) => return,
        };
        return refuse(&server, socket, peer, refusal).await;
    };
    // Held until the session ends: the client's place among its sessions.
    let join = match server.joins.admit(token.as_deref(), peer.ip()) {
        Ok(join) => join,
        Err(refusal) => return refuse(&server, socket, peer, refusal).await,
    };
    let (to_browser, outgoing) = tokio::sync::mpsc::unbounded_channel();
    // Its pipeline starts on the blocking pool: a state change that stalls holds this session
    // alone.
    let opened = tokio::task::spawn_blocking({
        let server = server.clone();
        let id = join.session.clone();
        move || server.sessions.open(to_browser, id, Egress::Browser)
    })
    .await
    .unwrap_or_else(|err| Err((close::SERVER_ERROR, format!("cannot start a pipeline: {err}"))));
    let session = match opened {
        Ok(session) => session,
        Err(refusal) => return refuse(&server, socket, peer, refusal).await,
    };
    server.metrics.sessions_opened.inc();
    let id = session.id.clone();
    log!(
        "session {id} joined from {peer} ({} sessions)",
        server.sessions.count()
    );
    let connection = Connection {
        server: &server,
        socket,
        heartbeat,
        peer,
        endpoint: "/signal",
        role: "browser",
    };
    let ice_servers = server.ice.browser_servers(&id, join.expires);
    let first = json!({"type": "session", "id": id, "iceServers": ice_servers});
    let mut candidates = 0;
    let ending = connection
        .serve(&session, outgoing, &first, |received| {
            match message(received).and_then(checked) {
                Ok(Some(FromBrowser::Answer { sdp })) => match session.set_answer(&sdp) {
                    Ok(()) => Step::Next,
                    Err(err) => Step::Refuse {
                        code: close::BAD_MESSAGE,
                        reason: format!("bad answer: {err}"),
                        ending: "bad answer".into(),
                    },
                },
                Ok(Some(FromBrowser::Ice {
                    candidate,
                    mline_index,
                })) => {
                    candidates += 1;
                    if candidates > MAX_CANDIDATES {
                        return Step::Refuse {
                            code: close::BAD_MESSAGE,
                            reason: format!("more than {MAX_CANDIDATES} ICE candidates"),
                            ending: "too many ICE candidates".into(),
                        };
                    }
                    // An empty candidate is the browser's end of candidates.
                    if !candidate.is_empty() {
                        session.add_ice_candidate(mline_index, &candidate);
                    }
                    Step::Next
                }
                Ok(Some(FromBrowser::Join { .. })) => Step::Refuse {
                    code: close::BAD_MESSAGE,
                    reason: "joined already".into(),
                    ending: "joined twice".into(),
                },
                Ok(None) => Step::Next,
                Err(Some((code, reason))) => Step::Refuse {
                    code,
                    ending: reason.clone(),
                    reason,
                },
                Err(None) => Step::Left("the browser closed the connection".into()),
            }
        })
        .await;
    // What its sender is told when the session ends, and what the log says.
    let (left, ending) = match ending {
        Ending::Gone(gone) => {
            let left = format!("its browser is gone: {}", gone.reason);
            (left.clone(), left)
        }
        Ending::Other(why) => ("its browser left".to_string(), why),
    };
    // The client's place goes before the session does: once `/status` counts the session gone,
    // its client may join again.
    drop(join);
    // Its pipeline stops on the blocking pool.
    let closing = server.clone();
    let closed = tokio::task::spawn_blocking(move || {
        drop(session);
        closing.sessions.close(&id, &left);
        id
    })
    .await;
    let id = closed.unwrap_or_default();
    log!(
        "session {id} left: {ending} ({} sessions)",
        server.sessions.count()
    );
}
