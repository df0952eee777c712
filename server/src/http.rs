//! What a connection's handler sees of HTTP and WebSocket: a request's path, query and headers,
//! a whole response, and a WebSocket (tokio-tungstenite on the connection hyper upgraded) read,
//! written and closed with the timeouts that keep a peer that reads nothing from holding it.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tungstenite::Message;
use tungstenite::protocol::frame::CloseFrame;

use crate::log::log;

/// How long a handler waits on a write that must not hold it (a ping, a close, the answer to a
/// close) before it goes on: a peer that reads nothing cannot keep it.
pub const SHORT_WRITE: Duration = Duration::from_millis(20);

/// A WebSocket's connection: hyper's upgraded one, or a loopback pair in the tests.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub type Socket = WebSocketStream<Box<dyn Io>>;

/// A request as the handlers read it.
pub struct Request {
    pub path: String,
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
}

impl Request {
    /// `uri`'s path and query (percent-decoded) and `headers` (their names in lower case).
    pub fn new(uri: &axum::http::Uri, headers: &axum::http::HeaderMap) -> Self {
        Self {
            path: uri.path().to_owned(),
            query: form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
            headers: headers
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).trim().to_owned();
                    (name.as_str().to_ascii_lowercase(), value)
                })
                .collect(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    pub fn is_websocket(&self) -> bool {
        self.header("upgrade")
            .is_some_and(|value| value.eq_ignore_ascii_case("websocket"))
    }
}

/// A whole response; then the connection closes.
pub fn respond(status: u16, content_type: &str, body: impl Into<Body>) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        // A page's links and requests name no URL of it (nor what a token in it would leak).
        .header("referrer-policy", "no-referrer")
        .header("connection", "close")
        .body(body.into())
        .expect("a response of a known status and headers")
}

/// What a read gave: a message, or the end of the connection.
pub enum Received {
    Message(Message),
    Closed,
    /// Over the size cap: the message was not read.
    TooLarge(String),
    Failed(String),
}

/// What `socket`'s next item (`next`, from its stream) is to a handler.
pub async fn received(socket: &mut Socket, next: Option<Result<Message, tungstenite::Error>>) -> Received {
    match next {
        // The close's answer goes out with the next flush: the closing handshake completes.
        Some(Ok(Message::Close(_))) => {
            let _ = tokio::time::timeout(SHORT_WRITE, socket.flush()).await;
            Received::Closed
        }
        Some(Ok(message)) => Received::Message(message),
        None | Some(Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed)) => {
            Received::Closed
        }
        Some(Err(tungstenite::Error::Capacity(err))) => {
            Received::TooLarge(format!("message over the size cap: {err}"))
        }
        Some(Err(err)) => Received::Failed(err.to_string()),
    }
}

/// Close codes: HTTP's statuses in the range for applications (RFC 6455 7.4.2), where one fits.
pub mod close {
    /// RFC 6455's own: the server goes away.
    pub const GOING_AWAY: u16 = 1001;
    pub const BAD_MESSAGE: u16 = 4400;
    pub const UNAUTHORIZED: u16 = 4401;
    pub const FORBIDDEN: u16 = 4403;
    pub const NO_SUCH_SESSION: u16 = 4404;
    pub const TIMEOUT: u16 = 4408;
    pub const BUSY: u16 = 4409;
    pub const SESSION_ENDED: u16 = 4410;
    pub const TOO_LARGE: u16 = 4413;
    pub const BAD_CODES: u16 = 4422;
    pub const TOO_MANY_SESSIONS: u16 = 4429;
    /// A join while the server drains (SIGTERM): it takes no new session, another server
    /// does. HTTP's 503, as a new `/signal` is answered then.
    pub const DRAINING: u16 = 4503;
    /// A sender whose session another sender took over (`takeover=1`): no HTTP status says
    /// that, and a sender told so must not come back and take the session back in turn.
    pub const REPLACED: u16 = 4490;
    pub const SERVER_ERROR: u16 = 4500;
}

fn close_frame(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code: code.into(),
        reason: cut_to_close_frame(reason).to_owned().into(),
    }))
}

/// Sends a close frame with `code` and `reason` (cut to what a close frame holds) and waits a
/// moment for the client's.
pub async fn close(mut socket: Socket, code: u16, reason: &str) {
    let sent = tokio::time::timeout(Duration::from_secs(1), socket.send(close_frame(code, reason))).await;
    if !matches!(sent, Ok(Ok(()))) {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
}

/// Closes the connection of a peer that is gone (it answers nothing): the close frame goes out
/// if it can, at once, and no answer is waited for.
pub async fn close_gone(mut socket: Socket, code: u16, reason: &str) {
    let _ = tokio::time::timeout(SHORT_WRITE, socket.send(close_frame(code, reason))).await;
}

/// `reason`, cut to what a close frame holds (123 bytes, on a character boundary).
fn cut_to_close_frame(reason: &str) -> &str {
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    &reason[..cut]
}

/// Sends a text message; false when the connection is gone, or the peer has taken nothing for
/// `patience`.
pub async fn send_text(socket: &mut Socket, text: String, patience: Duration) -> bool {
    match tokio::time::timeout(patience, socket.send(Message::text(text))).await {
        Ok(Ok(())) => true,
        Ok(Err(err)) => {
            log!("cannot send: {err}");
            false
        }
        Err(_) => {
            log!("cannot send: the peer took nothing for {patience:?}");
            false
        }
    }
}

/// A WebSocket over loopback, for tests: the server's end, and the client's.
#[cfg(test)]
pub async fn loopback() -> (Socket, WebSocketStream<tokio::net::TcpStream>) {
    use tungstenite::protocol::Role;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let server: Box<dyn Io> = Box::new(server);
    (
        WebSocketStream::from_raw_socket(server, Role::Server, None).await,
        WebSocketStream::from_raw_socket(client, Role::Client, None).await,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn responses_tell_browsers_to_send_no_referrer() {
        let response = super::respond(200, "text/html; charset=utf-8", "a page");
        assert_eq!(response.headers()["referrer-policy"], "no-referrer");
    }
}
