//! The TTS side of a session: `/codes?session=ID`, with the header
//! `Authorization: Bearer <token>`.
//!
//! Binary messages are whole frames (S16LE codes, frame-major); the text message
//! `{"type":"end"}` says the speech so far is complete (its last frames play at once, whatever
//! `--chunk-frames`), `{"type":"cancel"}` drops what is queued and not yet heard (barge-in). One connection feeds a
//! session at a time, for as many utterances as it likes; it ends when the session does.
//!
//! With `&transport=rtp` the frames come as RTP packets instead (`rtp_ingress`): the server's
//! first message names the port and the SDP, `{"type":"rtp","port":…,"sdp":…}`, and the
//! connection carries the rest (`end`, `cancel`, the refusals); binary messages are refused.

use std::time::{Duration, Instant};

use serde_json::json;
use tungstenite::Message;

use crate::access::escaped;
use crate::http::{self, Received, Request, Socket, close};
use crate::protocol::{FrameError, FromSender, sender_message};
use crate::rtp_ingress::{RtpAddresses, RtpIngress};
use crate::{Server, log};

/// Compares in a time that does not tell how much of the token was right.
fn same_token(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0, |diff, (a, b)| diff | (a ^ b))
            == 0
}

pub fn serve(server: &Server, request: &Request, socket: Option<Socket>, peer: &str) {
    let Some(mut socket) = socket else {
        return;
    };
    let refuse = |socket, code: u16, reason: String| {
        log!("refused {peer} on /codes: {code} {}", escaped(&reason));
        server.metrics.refused(code);
        http::close(socket, code, &reason);
    };
    match request
        .header("authorization")
        .and_then(|value| value.strip_prefix("Bearer "))
    {
        None => {
            let reason = "no token: send the header Authorization: Bearer <token>".into();
            return refuse(socket, close::UNAUTHORIZED, reason);
        }
        Some(given) if !same_token(given, &server.token) => {
            return refuse(socket, close::UNAUTHORIZED, "wrong token".into());
        }
        Some(_) => (),
    }
    let Some(id) = request.query("session") else {
        return refuse(socket, close::NO_SUCH_SESSION, "no session=ID in the URL".into());
    };
    let over_rtp = match request.query("transport") {
        None | Some("websocket") => false,
        Some("rtp") => true,
        Some(other) => {
            let reason = format!("transport takes websocket or rtp, not {other:?}");
            return refuse(socket, close::BAD_MESSAGE, reason);
        }
    };
    let Some(session) = server.sessions.get(id) else {
        return refuse(socket, close::NO_SUCH_SESSION, format!("no session {id}"));
    };
    // A sender that just closed may still be on its way out.
    let asked = Instant::now();
    let mut attached = session.attach_sender();
    while !attached && asked.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(http::POLL);
        attached = session.attach_sender();
    }
    if !attached {
        return refuse(socket, close::BUSY, format!("session {id} has a sender already"));
    }
    let rtp = if over_rtp {
        // The port is bound where this connection came in, and takes packets from where it
        // came from alone.
        let connection = socket.get_ref();
        let started = connection
            .local_addr()
            .and_then(|local| Ok((local.ip(), connection.peer_addr()?.ip())))
            .map_err(|err| err.to_string())
            .and_then(|(local, sender)| {
                RtpIngress::start(
                    session.clone(),
                    &server.rtp_format,
                    RtpAddresses::new(local, server.public_address, sender),
                    server.metrics.clone(),
                )
            });
        match started {
            Ok(rtp) => {
                log!("sender {peer} feeds session {id} over RTP, port {}", rtp.port);
                http::send_text(
                    &mut socket,
                    json!({"type": "rtp", "port": rtp.port, "sdp": rtp.sdp}).to_string(),
                );
                Some(rtp)
            }
            Err(err) => {
                session.detach_sender();
                return refuse(socket, close::SERVER_ERROR, format!("cannot receive RTP: {err}"));
            }
        }
    } else {
        log!("sender {peer} feeds session {id}");
        None
    };
    let format = server.sessions.format();
    let connected = Instant::now();
    // Asking for RTP is speaking: the frames then come elsewhere.
    let mut spoke = rtp.is_some();
    let mut frames = 0;
    let ending = loop {
        if let Some(why) = session.ended() {
            break Some((close::SESSION_ENDED, format!("session {id} ended: {why}")));
        }
        if let Some(stopped) = rtp.as_ref().and_then(RtpIngress::stopped) {
            break Some(stopped);
        }
        match http::read(&mut socket) {
            Received::Message(Message::Binary(_)) if rtp.is_some() => {
                let reason = "this sender's frames come over RTP (transport=rtp), not in messages";
                break Some((close::BAD_MESSAGE, reason.into()));
            }
            Received::Message(Message::Binary(bytes)) => {
                spoke = true;
                let count = match format.layout.check(&bytes) {
                    Ok(count) => count,
                    Err(err @ FrameError::NotWholeFrames { .. }) => {
                        break Some((close::BAD_MESSAGE, err.to_string()));
                    }
                    Err(err @ FrameError::OutsideCodebook { .. }) => {
                        break Some((close::BAD_CODES, err.to_string()));
                    }
                };
                if let Err(refusal) = session.push(&bytes, count) {
                    break Some(refusal);
                }
                frames += count;
                server.metrics.frames_in.inc_by(count as u64);
            }
            Received::Message(Message::Text(text)) => {
                spoke = true;
                match sender_message(&text) {
                    Ok(FromSender::Cancel) => {
                        if let Some(rtp) = &rtp {
                            rtp.cancel();
                        }
                        session.cancel();
                        let frames = frames + rtp.as_ref().map_or(0, RtpIngress::frames);
                        log!("session {id}: cancelled after {frames} frames in all");
                    }
                    Ok(FromSender::End) => session.end(),
                    Err(err) => break Some((close::BAD_MESSAGE, err)),
                }
            }
            Received::Message(_) => spoke = true,
            Received::Nothing if !spoke && connected.elapsed() > server.idle_timeout => {
                let reason = format!("sent nothing within {:?}", server.idle_timeout);
                break Some((close::TIMEOUT, reason));
            }
            Received::Nothing => (),
            Received::TooLarge(err) => break Some((close::TOO_LARGE, err)),
            Received::Closed => break None,
            Received::Failed(err) => {
                log!("sender {peer} of session {id} failed: {err}");
                break None;
            }
        }
    };
    frames += rtp.as_ref().map_or(0, RtpIngress::frames);
    // The port closes before another sender may take the session.
    drop(rtp);
    session.detach_sender();
    match ending {
        Some((code, reason)) => refuse(socket, code, reason),
        None => log!("sender {peer} of session {id} left after {frames} frames"),
    }
}
