//! The server's HTTP/1.1: one GET per connection (its head parsed by httparse, its query by
//! form_urlencoded), answered with a page or upgraded to a WebSocket (tungstenite).

use std::collections::HashMap;
use std::io::{ErrorKind, Read as _, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tungstenite::Message;
use tungstenite::protocol::frame::CloseFrame;
use tungstenite::protocol::{Role, WebSocket, WebSocketConfig};

use crate::log::log;
use crate::server::Server;

/// The most a request head may take, and its most header lines.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;
/// How often a WebSocket handler looks up from reading to do its other work.
pub const POLL: Duration = Duration::from_millis(20);

pub type Socket = WebSocket<TcpStream>;

pub struct Request {
    pub path: String,
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
    /// Bytes read past the head: the start of the first WebSocket frame.
    rest: Vec<u8>,
}

impl Request {
    /// Reads a GET request's head (parsed by httparse); the client has `timeout` to send it.
    pub fn read(mut stream: &TcpStream, timeout: Duration) -> Result<Self, String> {
        let deadline = Instant::now() + timeout;
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut head = httparse::Request::new(&mut headers);
            match head.parse(&bytes) {
                Ok(httparse::Status::Complete(length)) => return Self::from_head(&head, &bytes[length..]),
                Ok(httparse::Status::Partial) => (),
                Err(err) => return Err(format!("bad request head: {err}")),
            }
            if bytes.len() > MAX_HEAD_BYTES {
                return Err(format!("request head over {MAX_HEAD_BYTES} bytes, closed"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("sent no request in {timeout:?}, closed"));
            }
            stream
                .set_read_timeout(Some(left))
                .map_err(|err| err.to_string())?;
            match stream.read(&mut chunk) {
                Ok(0) => return Err("closed before sending a request".into()),
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => (),
                Err(err) => return Err(err.to_string()),
            }
        }
    }

    fn from_head(head: &httparse::Request, rest: &[u8]) -> Result<Self, String> {
        let (Some("GET"), Some(target)) = (head.method, head.path) else {
            return Err(format!("not a GET request: {:?} {:?}", head.method, head.path));
        };
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Ok(Self {
            path: path.to_string(),
            query: form_urlencoded::parse(query.as_bytes()).into_owned().collect(),
            headers: head
                .headers
                .iter()
                .map(|header| {
                    let value = String::from_utf8_lossy(header.value).trim().to_string();
                    (header.name.to_ascii_lowercase(), value)
                })
                .collect(),
            rest: rest.to_vec(),
        })
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

    /// Answers the upgrade; then the connection speaks WebSocket, its messages capped at the
    /// server's `max_message_bytes`.
    pub fn upgrade(&self, mut stream: TcpStream, server: &Server) -> Option<Socket> {
        let Some(key) = self.header("sec-websocket-key") else {
            respond(stream, "400 Bad Request", "text/plain", "no Sec-WebSocket-Key\n");
            return None;
        };
        let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
        let response = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\n\r\n"
        );
        stream.write_all(response.as_bytes()).ok()?;
        stream.set_read_timeout(Some(POLL)).ok()?;
        // A peer that reads nothing (stopped, its link down) cannot hold a write, and with it
        // the connection's thread, past the time it is given to answer.
        stream
            .set_write_timeout(Some(server.peer_times.peer_timeout))
            .ok()?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(server.max_message_bytes))
            .max_frame_size(Some(server.max_message_bytes));
        Some(WebSocket::from_partially_read(
            stream,
            self.rest.clone(),
            Role::Server,
            Some(config),
        ))
    }
}

/// A whole response, then the connection closes.
pub fn respond(mut stream: TcpStream, status: &str, content_type: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

/// What a read gave: a message, nothing yet, or the end of the connection.
pub enum Received {
    Message(Message),
    Nothing,
    Closed,
    /// Over the size cap: the message was not read.
    TooLarge(String),
    Failed(String),
}

pub fn read(socket: &mut Socket) -> Received {
    match socket.read() {
        Ok(Message::Close(_)) => {
            // The close's answer, which tungstenite queued: the closing handshake completes.
            let _ = socket.flush();
            Received::Closed
        }
        Ok(message) => Received::Message(message),
        Err(tungstenite::Error::Io(err))
            if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            Received::Nothing
        }
        Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => Received::Closed,
        Err(tungstenite::Error::Capacity(err)) => {
            Received::TooLarge(format!("message over the size cap: {err}"))
        }
        Err(err) => Received::Failed(err.to_string()),
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

/// Sends a close frame with `code` and `reason` (cut to what a close frame holds) and waits a
/// moment for the client's.
pub fn close(mut socket: Socket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code: code.into(),
        reason: cut_to_close_frame(reason).to_string().into(),
    };
    if socket.close(Some(frame)).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match read(&mut socket) {
            Received::Message(_) | Received::Nothing => (),
            _ => break,
        }
    }
}

/// Closes the connection of a peer that is gone (it answers nothing): the close frame goes out
/// if it can, at once, and no answer is waited for.
pub fn close_gone(mut socket: Socket, code: u16, reason: &str) {
    let _ = socket.get_ref().set_write_timeout(Some(POLL));
    let frame = CloseFrame {
        code: code.into(),
        reason: cut_to_close_frame(reason).to_string().into(),
    };
    let _ = socket.close(Some(frame));
}

/// `reason`, cut to what a close frame holds (123 bytes, on a character boundary).
fn cut_to_close_frame(reason: &str) -> &str {
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    &reason[..cut]
}

/// Sends a text message; false when the connection is gone.
pub fn send_text(socket: &mut Socket, text: String) -> bool {
    match socket.send(Message::text(text)) {
        Ok(()) => true,
        Err(err) => {
            log!("cannot send: {err}");
            false
        }
    }
}

/// A WebSocket over loopback, for tests: the server's end, and the client's, on which a message
/// that never comes fails the test in 10 s rather than hang it.
#[cfg(test)]
pub fn loopback() -> (Socket, Socket) {
    use std::net::TcpListener;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (
        WebSocket::from_raw_socket(server, Role::Server, None),
        WebSocket::from_raw_socket(client, Role::Client, None),
    )
}
