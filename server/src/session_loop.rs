//! The loop of a session's own connection (a browser's `/signal`, a broadcaster's `/broadcast`):
//! the session's messages go out to its client, the client is watched for a sign of life
//! (`liveness`), and what it sends goes to the connection's handler, until one of them ends the
//! connection: the server shuts down (1001), the pipeline fails (4500), the client is gone
//! (4408), the handler refuses what it sent, or it leaves. It sleeps until one of those may
//! have happened: a message either way, a change of the session (`Session::changes`), or the
//! time a ping or a verdict on the peer is due.

use std::net::SocketAddr;
use std::time::Instant;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::access;
use crate::http::{self, Received, Socket, close};
use crate::liveness::{Gone, Heartbeat};
use crate::log::log;
use crate::server::Server;
use crate::session::Session;

/// What a connection's handler makes of a read.
pub enum Step {
    /// Nothing that ends the connection.
    Next,
    /// The client closed the connection, or it broke: why the session ends.
    Left(String),
    /// What the client sent is refused: the close code and reason, and why the session ends.
    Refuse {
        code: u16,
        reason: String,
        ending: String,
    },
}

/// Why a session's connection ended.
pub enum Ending {
    /// Its client is gone (`liveness`), and the connection was closed for that.
    Gone(Gone),
    /// Anything else: why, for the log.
    Other(String),
}

/// A session's client on its own connection.
pub struct Connection<'a> {
    pub server: &'a Server,
    pub socket: Socket,
    /// The client's pings, from when its connection opened.
    pub heartbeat: Heartbeat,
    pub peer: SocketAddr,
    /// Where the client connected, as its refusals are logged: `/signal`, `/broadcast`.
    pub endpoint: &'static str,
    /// What the metric of peers lost calls the client: `browser`, `broadcaster`.
    pub role: &'static str,
}

impl Connection<'_> {
    /// Sends `first`, then serves `session` until the connection ends, handing each read to
    /// `handle`; why it ended.
    pub async fn serve(
        self,
        session: &Session,
        mut outgoing: UnboundedReceiver<Value>,
        first: &Value,
        mut handle: impl FnMut(Received) -> Step,
    ) -> Ending {
        let Self {
            server,
            mut socket,
            mut heartbeat,
            peer,
            endpoint,
            role,
        } = self;
        let failed = || Ending::Other("its connection failed".into());
        let patience = server.peer_times.peer_timeout;
        let mut ending = (!http::send_text(&mut socket, first.to_string(), patience).await).then(failed);
        let mut changes = session.changes();
        loop {
            if let Some(ending) = ending {
                return ending;
            }
            if let Some(why) = session.ended() {
                // The server shuts down.
                http::close(socket, close::GOING_AWAY, &why).await;
                return Ending::Other(why);
            }
            while let Ok(message) = outgoing.try_recv() {
                if !http::send_text(&mut socket, message.to_string(), patience).await {
                    ending = Some(failed());
                    break;
                }
            }
            if ending.is_some() {
                continue;
            }
            if let Some(err) = session.error() {
                log!("session {}: pipeline error: {err}", session.id);
                http::close(socket, close::SERVER_ERROR, &format!("pipeline error: {err}")).await;
                return Ending::Other("pipeline error".into());
            }
            // A broadcast has no peer connection of its own: its heartbeat alone tells.
            let gone = heartbeat
                .beat(&mut socket)
                .await
                .err()
                .or_else(|| session.peer_connection_gone(&server.peer_times));
            if let Some(gone) = gone {
                server.metrics.peer_lost(role, gone.label);
                http::close_gone(socket, close::TIMEOUT, &gone.reason).await;
                return Ending::Gone(gone);
            }
            let due = [
                Some(heartbeat.next_due()),
                session.peer_connection_deadline(&server.peer_times),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(Instant::now);
            let next = tokio::select! {
                next = socket.next() => next,
                // A message for the client: sent at the top of the loop.
                Some(message) = outgoing.recv() => {
                    if !http::send_text(&mut socket, message.to_string(), patience).await {
                        ending = Some(failed());
                    }
                    continue;
                }
                Ok(()) = changes.changed() => continue,
                () = tokio::time::sleep_until(due.into()) => continue,
            };
            match handle(heartbeat.received(&mut socket, next).await) {
                Step::Next => (),
                Step::Left(why) => ending = Some(Ending::Other(why)),
                Step::Refuse { code, reason, ending } => {
                    access::refuse(&server.metrics, socket, endpoint, &peer, code, &reason).await;
                    return Ending::Other(ending);
                }
            }
        }
    }
}
