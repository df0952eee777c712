//! A broadcast: `/broadcast` on the TTS side (with `--janus`), with the header
//! `Authorization: Bearer <token>` (the operator's token), opens a session whose speech goes to
//! a Janus Streaming mountpoint (`janus`), decoded once for every listener Janus serves.
//!
//! server → client: `{"type":"broadcast","id":…,"mountpoint":…,"janus":…,"listen":…}` (the
//! session id, for `/codes?session=ID`; the mountpoint listeners watch; Janus's API as pages
//! reach it; this server's listener page for the broadcast), then
//! `{"type":"sender","state":"joined"|"left",…}` as for a browser. The client sends nothing
//! (the frames go to `/codes`). The broadcast ends when this connection does, or when its
//! client answers no ping within `--peer-timeout`; its mountpoint is destroyed then.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tungstenite::Message;

use crate::access;
use crate::http::{Received, Request, Socket, close};
use crate::liveness::Heartbeat;
use crate::log::log;
use crate::server::Server;
use crate::session::Egress;
use crate::session_loop::{Connection, Ending, Step};

/// How long a broadcast's end waits for its mountpoint to be destroyed.
const MOUNTPOINT_PATIENCE: Duration = Duration::from_secs(5);

/// Refuses the broadcaster's `/broadcast`.
async fn refuse(server: &Server, socket: Socket, peer: SocketAddr, code: u16, reason: String) {
    access::refuse(&server.metrics, socket, "/broadcast", &peer, code, &reason).await;
}

pub async fn serve(server: Arc<Server>, request: Request, socket: Socket, peer: SocketAddr) {
    if let Some(reason) = access::bearer_refusal(&request, server.senders.operator_token()) {
        return refuse(&server, socket, peer, close::UNAUTHORIZED, reason).await;
    }
    let Some(janus) = server.janus.clone() else {
        let reason = "no broadcasts: the server was started without --janus".into();
        return refuse(&server, socket, peer, close::NO_SUCH_SESSION, reason).await;
    };
    // The mountpoint first: a session whose listeners have nowhere to go is no broadcast. It is
    // destroyed with the session, or here if the session does not open. The pipeline's start
    // is waited on in the blocking pool.
    let mountpoint = match janus.create_mountpoint().await {
        Ok(mountpoint) => mountpoint,
        Err(err) => {
            let reason = format!("no Janus mountpoint: {err}");
            return refuse(&server, socket, peer, close::SERVER_ERROR, reason).await;
        }
    };
    let mountpoint_id = mountpoint.id;
    let listen = match janus.listen_path(mountpoint_id) {
        Ok(listen) => listen,
        Err(err) => return refuse(&server, socket, peer, close::SERVER_ERROR, err).await,
    };
    let (to_client, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let opened = tokio::task::spawn_blocking({
        let server = server.clone();
        move || server.sessions.open(to_client, None, Egress::Janus(mountpoint))
    })
    .await
    .unwrap_or_else(|err| Err((close::SERVER_ERROR, format!("cannot start a pipeline: {err}"))));
    let session = match opened {
        Ok(session) => session,
        Err((code, reason)) => return refuse(&server, socket, peer, code, reason).await,
    };
    server.metrics.sessions_opened.inc();
    let id = session.id.clone();
    log!(
        "session {id}: a broadcast from {peer} to Janus mountpoint {mountpoint_id} ({} sessions)",
        server.sessions.count()
    );
    let announced = json!({
        "type": "broadcast",
        "id": id,
        "mountpoint": mountpoint_id,
        "janus": janus.public,
        "listen": listen,
    });
    let connection = Connection {
        server: &server,
        socket,
        heartbeat: Heartbeat::new(server.peer_times),
        peer,
        endpoint: "/broadcast",
        role: "broadcaster",
    };
    let ending = connection
        .serve(&session, outgoing, &announced, |received| match received {
            Received::Message(Message::Text(_) | Message::Binary(_)) => {
                let reason =
                    format!("a broadcast's connection takes no messages: send frames to /codes?session={id}");
                Step::Refuse {
                    code: close::BAD_MESSAGE,
                    ending: reason.clone(),
                    reason,
                }
            }
            Received::TooLarge(reason) => Step::Refuse {
                code: close::TOO_LARGE,
                ending: reason.clone(),
                reason,
            },
            Received::Message(_) => Step::Next,
            Received::Closed => Step::Left("its client closed the connection".into()),
            Received::Failed(err) => Step::Left(format!("its connection failed: {err}")),
        })
        .await;
    let ending = match ending {
        Ending::Gone(gone) => format!("its client is gone: {}", gone.reason),
        Ending::Other(why) => why,
    };
    // Its pipeline stops on the blocking pool, and its mountpoint goes (as any other being
    // destroyed now) before the broadcast is said to have ended.
    let closing = server.clone();
    let closed = tokio::task::spawn_blocking(move || {
        drop(session);
        closing.sessions.close(&id, "its broadcast ended");
        id
    })
    .await;
    let id = closed.unwrap_or_default();
    janus.settle(MOUNTPOINT_PATIENCE).await;
    log!(
        "session {id}: the broadcast ended: {ending} ({} sessions)",
        server.sessions.count()
    );
}
