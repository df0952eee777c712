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
use crate::ice::{self, CandidateAddress};
use crate::liveness::Heartbeat;
use crate::log::log;
use crate::server::Server;
use crate::session::Egress;
use crate::session_loop::{Connection, Ending, Step};
use qwencodec_protocol::messages::{FromBrowser, read_browser_message};

/// The most ICE candidates a browser may send a session, in its answer and trickled together:
/// one has a few per interface, and each costs libnice its checks.
const MAX_CANDIDATES: usize = 100;

/// A session's candidates from its browser: how many it has sent, and how many named mDNS names
/// and were dropped (`ice::CandidateAddress`).
#[derive(Default)]
struct Candidates {
    sent: usize,
    mdns_dropped: usize,
}

impl Candidates {
    /// The answer's SDP as webrtcbin is given it (its mDNS candidates left out), its candidates
    /// counted; or why it is refused.
    fn answer(&mut self, sdp: &str) -> Result<String, String> {
        let (sdp, sent, dropped) = ice::answer_candidates(sdp)?;
        self.count(sent)?;
        self.mdns_dropped += dropped;
        Ok(sdp)
    }

    /// Whether a trickled candidate goes to webrtcbin (an empty one is the end of candidates, an
    /// mDNS one is dropped), counted; or why it is refused.
    fn trickled(&mut self, candidate: &str) -> Result<bool, String> {
        self.count(1)?;
        if candidate.is_empty() {
            return Ok(false);
        }
        match ice::candidate_address(candidate) {
            CandidateAddress::Ip => Ok(true),
            CandidateAddress::Mdns => {
                self.mdns_dropped += 1;
                Ok(false)
            }
            CandidateAddress::HostName => Err(ice::host_name_refusal(candidate)),
        }
    }

    fn count(&mut self, more: usize) -> Result<(), String> {
        self.sent += more;
        if self.sent > MAX_CANDIDATES {
            return Err(format!("more than {MAX_CANDIDATES} ICE candidates"));
        }
        Ok(())
    }
}

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
    let mut candidates = Candidates::default();
    let refused_candidates = |reason: String| Step::Refuse {
        code: close::BAD_MESSAGE,
        ending: reason.clone(),
        reason,
    };
    let ending = connection
        .serve(&session, outgoing, &first, |received| {
            match message(received).and_then(checked) {
                Ok(Some(FromBrowser::Answer { sdp })) => match candidates.answer(&sdp) {
                    Ok(sdp) => match session.set_answer(&sdp) {
                        Ok(()) => Step::Next,
                        Err(err) => Step::Refuse {
                            code: close::BAD_MESSAGE,
                            reason: format!("bad answer: {err}"),
                            ending: "bad answer".into(),
                        },
                    },
                    Err(reason) => refused_candidates(reason),
                },
                Ok(Some(FromBrowser::Ice {
                    candidate,
                    mline_index,
                })) => match candidates.trickled(&candidate) {
                    Ok(true) => {
                        session.add_ice_candidate(mline_index, &candidate);
                        Step::Next
                    }
                    Ok(false) => Step::Next,
                    Err(reason) => refused_candidates(reason),
                },
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
    let dropped = match candidates.mdns_dropped {
        0 => String::new(),
        dropped => format!("; {dropped} of its browser's candidates named mDNS names, dropped"),
    };
    log!(
        "session {id} left: {ending} ({} sessions){dropped}",
        server.sessions.count()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(n: usize, address: &str) -> String {
        format!("candidate:{n} 1 udp 2113937151 {address} {} typ host", 50000 + n)
    }

    #[test]
    fn the_candidates_in_an_answer_and_those_trickled_count_together() {
        let mut sdp = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\n".to_owned();
        for n in 0..60 {
            sdp += &format!("a={}\r\n", candidate(n, "198.51.100.2"));
        }
        let mut candidates = Candidates::default();
        assert_eq!(candidates.answer(&sdp), Ok(sdp.clone()));
        for n in 60..MAX_CANDIDATES {
            assert_eq!(candidates.trickled(&candidate(n, "198.51.100.2")), Ok(true));
        }
        assert_eq!(
            candidates.trickled(""),
            Err("more than 100 ICE candidates".into()),
            "the 101st, the end of candidates too"
        );
        // An answer alone past the cap.
        for n in 60..MAX_CANDIDATES + 1 {
            sdp += &format!("a={}\r\n", candidate(n, "198.51.100.2"));
        }
        assert_eq!(
            Candidates::default().answer(&sdp),
            Err("more than 100 ICE candidates".into())
        );
    }

    #[test]
    fn mdns_candidates_are_dropped_and_counted_and_host_names_refused() {
        let mut candidates = Candidates::default();
        assert_eq!(candidates.trickled(&candidate(1, "4f1c.local")), Ok(false));
        assert_eq!(candidates.trickled(""), Ok(false), "the end of candidates");
        let sdp = format!(
            "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\na={}\r\na={}\r\n",
            candidate(2, "9e2a.local"),
            candidate(3, "198.51.100.2")
        );
        let taken = candidates.answer(&sdp).unwrap();
        assert!(
            !taken.contains(".local") && taken.contains("198.51.100.2"),
            "{taken}"
        );
        assert_eq!((candidates.sent, candidates.mdns_dropped), (4, 2));
        let refused = candidates
            .trickled(&candidate(4, "metadata.google.internal"))
            .unwrap_err();
        assert!(refused.starts_with("an ICE candidate names the host \"metadata.google.internal\""));
    }
}
