//! The TTS side of a session: `/codes?session=ID`, with the header
//! `Authorization: Bearer <token>`: the session's sender token, or the operator's token
//! (`access::SenderPolicy`).
//!
//! Binary messages are whole frames (S16LE codes, frame-major); the text message
//! `{"type":"end"}` says the speech so far is complete (its last frames play at once, whatever
//! `--chunk-frames`), `{"type":"cancel"}` drops what is queued and not yet heard (barge-in). One connection feeds a
//! session at a time, for as many utterances as it likes; it ends when the session does.
//!
//! A sender that leaves, however it leaves (it closes, its connection breaks, it answers no
//! ping within `--peer-timeout`, another takes over), ends the speech it was sending: its last
//! frames play, as at `end` (`Session::sender_left`), and the browser is told,
//! `{"type":"sender","state":"left","why":…}`; a new sender, `{"type":"sender","state":"joined"}`.
//! With `&takeover=1` a new sender takes the session from the one feeding it (a TTS process
//! restarted while its old connection is not yet known gone), which is closed with 4490.
//!
//! With `&transport=rtp` the frames come as RTP packets instead (`rtp_ingress`): the server's
//! first message names the port and the SDP, `{"type":"rtp","port":…,"sdp":…}`, and the
//! connection carries the rest (`end`, `cancel`, the refusals); binary messages are refused.
//! With `&srtp=1` too the packets are SRTP, and the first message holds the key,
//! `"srtp":{"suite":…,"key":…}` (`--rtp-srtp required` refuses RTP without it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::watch;
use tungstenite::Message;

use crate::access;
use crate::http::{self, Received, Request, Socket, close};
use crate::liveness::{Gone, Heartbeat};
use crate::log::log;
use crate::rtp_ingress::{RtpAddresses, RtpIngress, SRTP_SUITE};
use crate::server::Server;
use qwencodec_protocol::messages::{FrameError, FromSender, sender_message};

/// Refuses the sender's `/codes`.
async fn refuse(server: &Server, socket: Socket, peer: &str, code: u16, reason: String) {
    access::refuse(&server.metrics, socket, "/codes", &peer, code, &reason).await;
}

/// A sender's connection; `local` is where it came in (an RTP port is bound there).
pub async fn serve(
    server: Arc<Server>,
    request: Request,
    mut socket: Socket,
    peer: SocketAddr,
    local: SocketAddr,
) {
    let server = &*server;
    let peer_address = peer;
    let peer = &peer.to_string();
    let Some(id) = request.query("session") else {
        return refuse(
            server,
            socket,
            peer,
            close::NO_SUCH_SESSION,
            "no session=ID in the URL".into(),
        )
        .await;
    };
    let takeover = match request.query("takeover") {
        None | Some("0") => false,
        Some("1") => true,
        Some(other) => {
            let reason = format!("takeover takes 1 or 0, not {other:?}");
            return refuse(server, socket, peer, close::BAD_MESSAGE, reason).await;
        }
    };
    // Before the session is looked up: whether a session exists is told only to its senders.
    if let Err((code, reason)) = server.senders.admit(&request, id, takeover) {
        return refuse(server, socket, peer, code, reason).await;
    }
    let over_rtp = match request.query("transport") {
        None | Some("websocket") => false,
        Some("rtp") => true,
        Some(other) => {
            let reason = format!("transport takes websocket or rtp, not {other:?}");
            return refuse(server, socket, peer, close::BAD_MESSAGE, reason).await;
        }
    };
    let srtp = match request.query("srtp") {
        None | Some("0") => false,
        Some("1") if over_rtp => true,
        Some("1") => {
            let reason = "srtp=1 is for transport=rtp".to_owned();
            return refuse(server, socket, peer, close::BAD_MESSAGE, reason).await;
        }
        Some(other) => {
            let reason = format!("srtp takes 1 or 0, not {other:?}");
            return refuse(server, socket, peer, close::BAD_MESSAGE, reason).await;
        }
    };
    if over_rtp && !srtp && server.rtp_srtp_required {
        let reason =
            "this server takes codes over RTP as SRTP alone (--rtp-srtp required): add srtp=1".to_owned();
        return refuse(server, socket, peer, close::BAD_MESSAGE, reason).await;
    }
    let Some(session) = server.sessions.get(id) else {
        return refuse(
            server,
            socket,
            peer,
            close::NO_SUCH_SESSION,
            format!("no session {id}"),
        )
        .await;
    };
    let ticket = if takeover {
        let (ticket, took_over) = session.take_over_sender();
        if took_over {
            server.metrics.sender_takeovers.inc();
            log!("sender {peer} takes session {id} over");
        }
        // The sender taken over lets go first: its last frames go in, its RTP port closes.
        let mut changes = session.changes();
        let by = Instant::now() + LET_GO;
        while session.senders_leaving() && changed_by(&mut changes, by).await {}
        ticket
    } else {
        // A sender that just closed may still be on its way out.
        let mut changes = session.changes();
        let by = Instant::now() + LET_GO;
        let mut attached = session.attach_sender();
        while attached.is_none() && changed_by(&mut changes, by).await {
            attached = session.attach_sender();
        }
        match attached {
            Some(ticket) => ticket,
            None => {
                let reason = format!("session {id} has a sender already (takeover=1 replaces it)");
                return refuse(server, socket, peer, close::BUSY, reason).await;
            }
        }
    };
    let rtp = if over_rtp {
        // The port is bound where this connection came in, and takes packets from where it
        // came from alone. Its pipeline starts on the blocking pool.
        let addresses = RtpAddresses::new(local.ip(), server.public_address, peer_address.ip());
        let started = tokio::task::spawn_blocking({
            let session = session.clone();
            let format = server.rtp_format.clone();
            let metrics = server.metrics.clone();
            move || RtpIngress::start(session, &format, addresses, metrics, srtp)
        })
        .await
        .unwrap_or_else(|err| Err(err.to_string()));
        match started {
            Ok(rtp) => {
                let over = if srtp { "SRTP" } else { "RTP" };
                log!("sender {peer} feeds session {id} over {over}, port {}", rtp.port);
                let mut port = json!({"type": "rtp", "port": rtp.port, "sdp": rtp.sdp});
                if let Some(key) = &rtp.srtp {
                    port["srtp"] = json!({"suite": SRTP_SUITE, "key": key.base64()});
                }
                http::send_text(&mut socket, port.to_string(), server.peer_times.peer_timeout).await;
                Some(rtp)
            }
            Err(err) => {
                session.detach_sender(ticket);
                let reason = format!("cannot receive RTP: {err}");
                return refuse(server, socket, peer, close::SERVER_ERROR, reason).await;
            }
        }
    } else {
        log!("sender {peer} feeds session {id}");
        None
    };
    session.tell_browser(json!({"type": "sender", "state": "joined"}));
    let format = server.sessions.format();
    let idle_until = Instant::now() + server.idle_timeout;
    let mut heartbeat = Heartbeat::new(server.peer_times);
    // Asking for RTP is speaking: the frames then come elsewhere.
    let mut spoke = rtp.is_some();
    let mut frames = 0;
    let mut changes = session.changes();
    let leaving = loop {
        if let Some(why) = session.ended() {
            break Leaving::SessionEnded(format!("session {id} ended: {why}"));
        }
        if session.sender_replaced(&ticket) {
            break Leaving::Replaced;
        }
        if let Some(rtp) = &rtp {
            if let Some((code, reason)) = rtp.stopped() {
                break Leaving::Refused(code, reason);
            }
            // Its packets show an RTP sender is there, whatever its WebSocket says.
            if let Some(at) = session.last_push() {
                heartbeat.heard_at(at);
            }
        }
        if let Err(gone) = heartbeat.beat(&mut socket).await {
            break Leaving::Gone(gone);
        }
        if !spoke && Instant::now() >= idle_until {
            let reason = format!("sent nothing within {:?}", server.idle_timeout);
            break Leaving::Refused(close::TIMEOUT, reason);
        }
        let due = match spoke {
            true => heartbeat.next_due(),
            false => heartbeat.next_due().min(idle_until),
        };
        let next = tokio::select! {
            next = socket.next() => next,
            Ok(()) = changes.changed() => continue,
            () = tokio::time::sleep_until(due.into()) => continue,
        };
        match heartbeat.received(&mut socket, next).await {
            Received::Message(Message::Binary(_)) if rtp.is_some() => {
                let reason = "this sender's frames come over RTP (transport=rtp), not in messages";
                break Leaving::Refused(close::BAD_MESSAGE, reason.into());
            }
            Received::Message(Message::Binary(bytes)) => {
                spoke = true;
                let count = match format.layout.check(&bytes) {
                    Ok(count) => count,
                    Err(err @ FrameError::NotWholeFrames { .. }) => {
                        break Leaving::Refused(close::BAD_MESSAGE, err.to_string());
                    }
                    Err(err @ FrameError::OutsideCodebook { .. }) => {
                        break Leaving::Refused(close::BAD_CODES, err.to_string());
                    }
                };
                if let Err((code, reason)) = session.push(&bytes, count) {
                    break Leaving::Refused(code, reason);
                }
                frames += count;
                server.metrics.frames_in.inc_by(count as u64);
            }
            Received::Message(Message::Text(text)) => {
                spoke = true;
                match sender_message(&text) {
                    Ok(FromSender::Cancel {}) => {
                        if let Some(rtp) = &rtp {
                            rtp.cancel();
                        }
                        session.cancel();
                        let frames = frames + rtp.as_ref().map_or(0, RtpIngress::frames);
                        log!("session {id}: cancelled after {frames} frames in all");
                    }
                    Ok(FromSender::End {}) => session.end(),
                    Err(err) => break Leaving::Refused(close::BAD_MESSAGE, err),
                }
            }
            // Its library answering pings, or pinging: there, not speaking.
            Received::Message(Message::Ping(_) | Message::Pong(_)) => (),
            Received::Message(_) => spoke = true,
            Received::TooLarge(err) => break Leaving::Refused(close::TOO_LARGE, err),
            Received::Closed => break Leaving::Closed,
            Received::Failed(err) => break Leaving::Broken(err),
        }
    };
    frames += rtp.as_ref().map_or(0, RtpIngress::frames);
    // The port closes (its pipeline stops, on the blocking pool) before another sender may take
    // the session.
    if let Some(rtp) = rtp {
        let _ = tokio::task::spawn_blocking(move || drop(rtp)).await;
    }
    if let Some(why) = leaving.why() {
        session.sender_left();
        session.tell_browser(json!({"type": "sender", "state": "left", "why": why}));
    }
    session.detach_sender(ticket);
    match leaving {
        Leaving::Closed => log!("sender {peer} of session {id} left after {frames} frames"),
        Leaving::Broken(err) => {
            log!("sender {peer} of session {id} broke off after {frames} frames: {err}")
        }
        Leaving::Gone(gone) => {
            log!(
                "sender {peer} of session {id} is gone after {frames} frames: {}",
                gone.reason
            );
            server.metrics.peer_lost("sender", gone.label);
            http::close_gone(socket, close::TIMEOUT, &gone.reason).await;
        }
        Leaving::Replaced => {
            log!("sender {peer} of session {id} was taken over after {frames} frames");
            let reason = format!("another sender took session {id} over (takeover=1)");
            http::close(socket, close::REPLACED, &reason).await;
        }
        Leaving::SessionEnded(reason) => refuse(server, socket, peer, close::SESSION_ENDED, reason).await,
        Leaving::Refused(code, reason) => refuse(server, socket, peer, code, reason).await,
    }
}

/// How long a new sender waits for the one before it to let go of the session.
const LET_GO: Duration = Duration::from_millis(500);

/// Waits until the session changes (`Session::changes`), but not past `by`; whether it did.
async fn changed_by(changes: &mut watch::Receiver<()>, by: Instant) -> bool {
    matches!(
        tokio::time::timeout_at(by.into(), changes.changed()).await,
        Ok(Ok(()))
    )
}

/// Why a sender's connection ends.
enum Leaving {
    /// It closed the connection.
    Closed,
    /// The connection broke without a close (the process killed, the connection reset).
    Broken(String),
    /// It answered no ping within the peer timeout.
    Gone(Gone),
    /// Another sender took the session over.
    Replaced,
    /// The server closes it for what it sent (close code and reason).
    Refused(u16, String),
    SessionEnded(String),
}

impl Leaving {
    /// What the browser is told of the sender's leaving (`why`); nothing when the session
    /// itself ended.
    fn why(&self) -> Option<&'static str> {
        match self {
            Leaving::Closed => Some("closed"),
            Leaving::Broken(_) => Some("broken"),
            Leaving::Gone(_) => Some("timeout"),
            Leaving::Replaced => Some("replaced"),
            Leaving::Refused(..) => Some("refused"),
            Leaving::SessionEnded(_) => None,
        }
    }
}
