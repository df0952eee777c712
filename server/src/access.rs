//! Who may use the server's public side: the `Host` a request names (`--allow-host`, against DNS
//! rebinding), the page's `Origin` on `/signal`, who may join a session (a join token, see
//! `token`, and each client's caps, see `connections`), and who may feed one on the TTS side (a
//! sender token, or the operator's token). And client-supplied text as the log shows it, and a
//! WebSocket refused as the log, the metrics and the client see it.

use std::collections::HashSet;
use std::fmt::Display;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use crate::connections::{Client, JoinRate, SessionPlace, SessionsPerClient};
use crate::http::{self, Request, Socket, close};
use crate::metrics::Metrics;
use crate::refusal_log;
use qwencodec_protocol::token::{JoinSecret, JoinToken, Scope};

/// The most of a client's text that a log line or a refusal repeats.
const MOST_ESCAPED_CHARS: usize = 200;

/// `text` (a path, an id, an `Origin`, a `Host`: anything a client wrote) as the log may show
/// it: what is not printable ASCII escaped, so that it can neither start a line of its own nor
/// drive the terminal, and cut after [`MOST_ESCAPED_CHARS`].
pub fn escaped(text: &str) -> String {
    let mut shown = String::new();
    for (at, c) in text.chars().enumerate() {
        if at == MOST_ESCAPED_CHARS {
            shown.push('…');
            break;
        }
        match c {
            '\\' => shown.push_str("\\\\"),
            ' '..='~' => shown.push(c),
            _ => shown.extend(c.escape_default()),
        }
    }
    shown
}

/// The token of a request's `Authorization: Bearer <token>` header, if it has one.
fn bearer(request: &Request) -> Option<&str> {
    request
        .header("authorization")
        .and_then(|value| value.strip_prefix("Bearer "))
}

const NO_BEARER: &str = "no token: send the header Authorization: Bearer <token>";

/// Why a request for the operator's side (`/broadcast`) is refused for its bearer token, if it
/// is: the header `Authorization: Bearer <token>` must give the operator's token, which the
/// server has only where the operator gave or made one (`token`: None).
pub fn bearer_refusal(request: &Request, token: Option<&str>) -> Option<String> {
    match (bearer(request), token) {
        (None, _) => Some(NO_BEARER.into()),
        (Some(_), None) => Some(
            "this server has no operator token (give it --token-file FILE or $QWENCODEC_CODES_TOKEN)".into(),
        ),
        (Some(given), Some(token)) if !same_token(given, token) => Some("wrong token".into()),
        (Some(_), Some(_)) => None,
    }
}

/// Refuses `peer`'s WebSocket on `endpoint` (`/signal`, `/codes`, `/broadcast`): a line in the
/// log, the close code counted in the metrics, and the close frame.
pub async fn refuse(
    metrics: &Metrics,
    socket: Socket,
    endpoint: &str,
    peer: &(dyn Display + Sync),
    code: u16,
    reason: &str,
) {
    refusal_log::refused(code, || {
        format!("refused {peer} on {endpoint}: {code} {}", escaped(reason))
    });
    metrics.refused(code);
    http::close(socket, code, reason).await;
}

/// Compares in a time that does not tell how much of the token was right.
fn same_token(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// A `Host` header's host (lowercased, an IPv6 address in its brackets) and port, if it has one.
fn host_and_port(host: &str) -> (String, Option<&str>) {
    let (name, port) = if host.starts_with('[') {
        match host.split_once(']') {
            Some((name, rest)) => (&host[..=name.len()], rest.strip_prefix(':')),
            None => (host, None),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    (name.to_ascii_lowercase(), port)
}

/// Whether a request that names `host` (its `Host` header) may be served: a page whose name was
/// rebound to this server's address still names its own host, so with `--allow-host` given only
/// the names listed are served. An entry without a port allows its host at any port. An empty
/// list allows every host.
pub fn host_allowed(allowed: &[String], host: Option<&str>) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let Some(host) = host else {
        return false;
    };
    let (name, port) = host_and_port(host);
    allowed.iter().any(|entry| {
        let (allowed_name, allowed_port) = host_and_port(entry);
        allowed_name == name && allowed_port.is_none_or(|allowed_port| Some(allowed_port) == port)
    })
}

/// Why `/signal` is refused to a page of `origin`, if it is: browsers send the `Origin` of the
/// page that opens a WebSocket, and only the server's own page (the `host` it was asked for,
/// over http or https behind a proxy) and `allowed`'s may drive sessions. A client that is not a
/// browser sends none: it is taken unless `origin_required` (a server that takes join tokens
/// serves pages, and a token taken from one must not be replayed by a script).
pub fn origin_refusal(
    origin: Option<&str>,
    host: Option<&str>,
    allowed: &[String],
    origin_required: bool,
) -> Option<String> {
    let Some(origin) = origin else {
        return origin_required
            .then(|| "no Origin: a join token is taken from a browser's page only".to_owned());
    };
    let own =
        host.is_some_and(|host| origin == format!("http://{host}") || origin == format!("https://{host}"));
    if own || allowed.iter().any(|allowed| allowed == origin) {
        None
    } else {
        Some(format!(
            "origin {} is not allowed (--allow-origin)",
            escaped(origin)
        ))
    }
}

/// Who may join: with a join secret, a browser whose token it signed (the token names the
/// session), once per token, and a token that expires within `--max-token-ttl`; without one,
/// anyone (a demo). And every client at most so many sessions at once and so many joins a
/// minute.
pub struct JoinPolicy {
    secret: Option<Arc<JoinSecret>>,
    /// Seconds: a token expiring further ahead is refused (a leaked one would serve too long).
    max_token_ttl: u64,
    /// The tokens that joined (session id, expiry), each until it expires: a token opens one
    /// session, once.
    used: Mutex<HashSet<(String, u64)>>,
    rate: JoinRate,
    sessions_per_client: std::sync::Arc<SessionsPerClient>,
}

/// A join let through: the session id its token names (None: the server chooses one), when
/// the credentials it is given expire (its token's expiry; without one `--max-token-ttl` from
/// now), and the client's place for the session, which it holds as long as the session lasts.
pub struct Join {
    pub session: Option<String>,
    /// Unix seconds.
    pub expires: u64,
    _place: SessionPlace,
}

impl JoinPolicy {
    pub fn new(
        secret: Option<Arc<JoinSecret>>,
        max_token_ttl: u64,
        joins_per_minute: u32,
        sessions_per_client: usize,
    ) -> Self {
        Self {
            secret,
            max_token_ttl,
            used: Mutex::new(HashSet::new()),
            rate: JoinRate::new(joins_per_minute),
            sessions_per_client: SessionsPerClient::new(sessions_per_client),
        }
    }

    pub fn requires_token(&self) -> bool {
        self.secret.is_some()
    }

    /// Lets a join from `address` with `token` through, or says why not (a close code and
    /// reason, neither of which repeats the token). Every join counts against the client's
    /// rate, those refused too: a client that guesses tokens is slowed down as one that floods.
    pub fn admit(&self, token: Option<&str>, address: IpAddr) -> Result<Join, (u16, String)> {
        self.admit_at(token, address, unix_now())
    }

    /// [`admit`](Self::admit) at `now`, Unix seconds (None: the clock failed, and no token can
    /// be told from an expired one).
    fn admit_at(
        &self,
        token: Option<&str>,
        address: IpAddr,
        now: Option<u64>,
    ) -> Result<Join, (u16, String)> {
        let client = Client::of(address);
        self.rate
            .join(client, Instant::now())
            .map_err(|why| (close::TOO_MANY_SESSIONS, why))?;
        let token = match (&self.secret, token) {
            (Some(secret), Some(token)) => {
                let token = checked(secret, token, now, Scope::Listen, self.max_token_ttl)?;
                Some(token)
            }
            (Some(_), None) => {
                let reason = "a join token is required: {\"type\":\"join\",\"token\":\"...\"} \
                              (the page passes on #token= of its URL)";
                return Err((close::UNAUTHORIZED, reason.into()));
            }
            (None, Some(_)) => {
                let reason = "a join token, but this server takes none (it has no join secret)";
                return Err((close::BAD_MESSAGE, reason.into()));
            }
            (None, None) => None,
        };
        let place = self
            .sessions_per_client
            .take(client)
            .map_err(|why| (close::TOO_MANY_SESSIONS, why))?;
        let expires = match &token {
            Some((token, _)) => token.expires,
            // A failed clock's credentials are expired at once.
            None => now.map_or(0, |now| now.saturating_add(self.max_token_ttl)),
        };
        let session = match token {
            Some((token, now)) => {
                let mut used = self.used.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                // A token past its expiry is refused as expired: it need not be remembered.
                used.retain(|(_, expires)| *expires >= now);
                if !used.insert((token.session.clone(), token.expires)) {
                    let reason = "the join token was used already: each opens one session";
                    return Err((close::UNAUTHORIZED, reason.into()));
                }
                Some(token.session)
            }
            None => None,
        };
        Ok(Join {
            session,
            expires,
            _place: place,
        })
    }
}

/// What `token` says, if `secret` signed it for `scope` and it is good at `now` (Unix seconds;
/// None: the clock failed, and no token can be told from an expired one), expiring within
/// `max_token_ttl` seconds; or the close code and reason it is refused with, which do not repeat
/// it. With `now`, for the caller to remember the token until it expires.
fn checked(
    secret: &JoinSecret,
    token: &str,
    now: Option<u64>,
    scope: Scope,
    max_token_ttl: u64,
) -> Result<(JoinToken, u64), (u16, String)> {
    let noun = scope.noun();
    let Some(now) = now else {
        let reason = format!("the server's clock failed: no {noun} can be checked");
        return Err((close::SERVER_ERROR, reason));
    };
    let token = secret
        .verify(token, now, scope)
        .map_err(|err| (close::UNAUTHORIZED, err.to_string()))?;
    let ahead = token.expires - now.min(token.expires);
    if ahead > max_token_ttl {
        let reason = format!(
            "the {noun} expires in {ahead} s, more than this server takes ({max_token_ttl} s, \
             --max-token-ttl)"
        );
        return Err((close::UNAUTHORIZED, reason));
    }
    Ok((token, now))
}

/// Who may feed a session on `/codes`: with a join secret, a sender whose token it signed for
/// that session (`sender.<session-id>.<expiry>.<signature>`, expiring within `--max-token-ttl`);
/// and the operator's token, where the operator gave one (or, without a join secret, the server
/// made one), for any session. With a join secret, taking a session over from its sender
/// (`takeover=1`) takes the session's own sender token: the operator's token does not.
pub struct SenderPolicy {
    secret: Option<Arc<JoinSecret>>,
    operator_token: Option<String>,
    max_token_ttl: u64,
}

impl SenderPolicy {
    pub fn new(secret: Option<Arc<JoinSecret>>, operator_token: Option<String>, max_token_ttl: u64) -> Self {
        Self {
            secret,
            operator_token,
            max_token_ttl,
        }
    }

    /// The operator's token, for `/broadcast`.
    pub fn operator_token(&self) -> Option<&str> {
        self.operator_token.as_deref()
    }

    /// Lets a sender of `request` feed `session` (taking it over when `takeover`), or says why
    /// not: a close code and a reason that does not repeat the token.
    pub fn admit(&self, request: &Request, session: &str, takeover: bool) -> Result<(), (u16, String)> {
        self.admit_at(bearer(request), session, takeover, unix_now())
    }

    /// [`admit`](Self::admit) for the bearer token `given`, at `now` (Unix seconds; None: the
    /// clock failed).
    fn admit_at(
        &self,
        given: Option<&str>,
        session: &str,
        takeover: bool,
        now: Option<u64>,
    ) -> Result<(), (u16, String)> {
        let Some(given) = given else {
            return Err((close::UNAUTHORIZED, NO_BEARER.into()));
        };
        let operator = self
            .operator_token
            .as_deref()
            .is_some_and(|token| same_token(given, token));
        match (&self.secret, operator) {
            (None, true) => Ok(()),
            (None, false) => Err((close::UNAUTHORIZED, "wrong token".into())),
            (Some(_), true) if takeover => {
                let reason =
                    format!("takeover=1 takes session {session}'s sender token, not the operator's token");
                Err((close::UNAUTHORIZED, reason))
            }
            (Some(_), true) => Ok(()),
            (Some(secret), false) => {
                let (token, _) = checked(secret, given, now, Scope::Send, self.max_token_ttl)?;
                if token.session != session {
                    let reason = format!("the sender token is for another session than {session}");
                    return Err((close::FORBIDDEN, reason));
                }
                Ok(())
            }
        }
    }
}

/// Unix seconds now; None when the clock is before 1970 (it failed).
fn unix_now() -> Option<u64> {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|entry| entry.to_string()).collect()
    }

    #[test]
    fn client_text_is_escaped_and_cut_in_the_log() {
        assert_eq!(escaped("/codes?session=a1-b2"), "/codes?session=a1-b2");
        assert_eq!(
            escaped("x\nqwencodec-server: forged\u{1b}[2J\\"),
            "x\\nqwencodec-server: forged\\u{1b}[2J\\\\"
        );
        assert_eq!(escaped("é"), "\\u{e9}");
        // Printable ASCII as it is, quotes too (Rust's escape_default would escape them).
        assert_eq!(escaped(r#"say "hi", it's ~{}"#), r#"say "hi", it's ~{}"#);
        let long = escaped(&"a".repeat(1000));
        assert_eq!(long.chars().count(), MOST_ESCAPED_CHARS + 1);
        assert!(long.ends_with('…'));
    }

    /// A GET of /codes with `headers` (header lines, each ending in CRLF), as the handlers see
    /// it.
    fn request(headers: &str) -> Request {
        let mut map = axum::http::HeaderMap::new();
        map.insert("host", "tts".parse().unwrap());
        for line in headers.split_terminator("\r\n") {
            let (name, value) = line.split_once(':').unwrap();
            let name: axum::http::HeaderName = name.parse().unwrap();
            map.append(name, value.parse().unwrap());
        }
        Request::new(&"/codes".parse().unwrap(), &map)
    }

    #[test]
    fn the_tts_side_needs_the_servers_bearer_token_exactly() {
        let token = "the-tts-token";
        let refusal = |headers: &str| bearer_refusal(&request(headers), Some(token));
        assert_eq!(refusal("Authorization: Bearer the-tts-token\r\n"), None);
        assert_eq!(refusal("authorization:  Bearer the-tts-token \r\n"), None);
        assert_eq!(
            refusal(""),
            Some("no token: send the header Authorization: Bearer <token>".into())
        );
        assert_eq!(
            refusal("Authorization: Basic the-tts-token\r\n"),
            Some("no token: send the header Authorization: Bearer <token>".into())
        );
        // THe-: two letters whose differences cancel out in an XOR of XORs.
        for wrong in [
            "the-tts-tokeN",
            "THe-tts-token",
            "the-tts-token2",
            "the-tts-toke",
            "x",
        ] {
            assert_eq!(
                refusal(&format!("Authorization: Bearer {wrong}\r\n")),
                Some("wrong token".into()),
                "{wrong}"
            );
        }
        // A server without an operator token takes none, however it is written.
        assert_eq!(
            bearer_refusal(&request("Authorization: Bearer the-tts-token\r\n"), None),
            Some(
                "this server has no operator token (give it --token-file FILE or \
                 $QWENCODEC_CODES_TOKEN)"
                    .into()
            )
        );
    }

    #[test]
    fn hosts_are_allowed_by_name_at_any_port_or_by_name_and_port() {
        let allowed = list(&["tts.example.org", "127.0.0.1:8080", "[::1]"]);
        for host in [
            "tts.example.org",
            "TTS.example.org:443",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(host_allowed(&allowed, Some(host)), "{host}");
        }
        for host in [
            "evil.example",
            "tts.example.org.evil.example",
            "127.0.0.1",
            "127.0.0.1:8081",
            "[::2]:8080",
            "",
        ] {
            assert!(!host_allowed(&allowed, Some(host)), "{host}");
        }
        assert!(!host_allowed(&allowed, None), "a request with no Host");
        assert!(host_allowed(&[], None), "no list: every host");
    }

    #[test]
    fn origins_are_refused_unless_the_servers_own_or_allowed() {
        let allowed = list(&["https://app.example"]);
        let host = Some("tts.example.org");
        for origin in [
            "https://tts.example.org",
            "http://tts.example.org",
            "https://app.example",
        ] {
            assert_eq!(
                origin_refusal(Some(origin), host, &allowed, true),
                None,
                "{origin}"
            );
        }
        let refusal = origin_refusal(Some("https://evil.example\n"), host, &allowed, false).unwrap();
        assert_eq!(
            refusal,
            "origin https://evil.example\\n is not allowed (--allow-origin)"
        );
        assert_eq!(
            origin_refusal(None, host, &allowed, false),
            None,
            "not a browser, no token"
        );
        assert!(
            origin_refusal(None, host, &allowed, true)
                .unwrap()
                .starts_with("no Origin")
        );
    }

    const NOW: u64 = 1_800_000_000;

    fn secret() -> JoinSecret {
        JoinSecret::new(b"a join secret of the tests").unwrap()
    }

    #[test]
    fn joins_need_a_token_signed_with_the_secret_when_there_is_one() {
        let policy = JoinPolicy::new(Some(Arc::new(secret())), 120, 0, 0);
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        let now = unix_now().expect("the clock");
        let token = secret().sign(Scope::Listen, "from-the-backend", now + 60);
        assert_eq!(
            policy.admit(Some(&token), address).unwrap().session.as_deref(),
            Some("from-the-backend")
        );
        let (code, reason) = policy.admit(None, address).err().unwrap();
        assert_eq!(code, close::UNAUTHORIZED);
        assert!(reason.contains("a join token is required"), "{reason}");
        let expired = secret().sign(Scope::Listen, "from-the-backend", now - 10);
        let (code, reason) = policy.admit(Some(&expired), address).err().unwrap();
        assert_eq!(code, close::UNAUTHORIZED);
        assert!(reason.contains("expired"), "{reason}");

        assert!(policy.requires_token());

        let open = JoinPolicy::new(None, 120, 0, 0);
        assert!(!open.requires_token());
        assert_eq!(open.admit(None, address).unwrap().session, None);
        assert_eq!(
            open.admit(Some(&token), address).err().unwrap().0,
            close::BAD_MESSAGE
        );
    }

    #[test]
    fn a_token_that_expires_past_the_most_lifetime_is_refused() {
        let policy = JoinPolicy::new(Some(Arc::new(secret())), 120, 0, 0);
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        let at = |token: &str| policy.admit_at(Some(token), address, Some(NOW));
        let within = at(&secret().sign(Scope::Listen, "within", NOW + 120)).ok();
        assert_eq!(within.map(|join| join.expires), Some(NOW + 120), "120 s ahead");
        // Without a secret the join's credentials last --max-token-ttl.
        let open = JoinPolicy::new(None, 120, 0, 0);
        let join = open.admit_at(None, address, Some(NOW)).ok();
        assert_eq!(join.map(|join| join.expires), Some(NOW + 120));
        let (code, reason) = at(&secret().sign(Scope::Listen, "beyond", NOW + 121))
            .err()
            .unwrap();
        assert_eq!(code, close::UNAUTHORIZED);
        assert_eq!(
            reason,
            "the join token expires in 121 s, more than this server takes (120 s, --max-token-ttl)"
        );
        let (code, reason) = at(&secret().sign(Scope::Listen, "years", u64::MAX - 1))
            .err()
            .unwrap();
        assert_eq!(code, close::UNAUTHORIZED);
        assert!(reason.contains("--max-token-ttl"), "{reason}");
    }

    #[test]
    fn a_clock_that_fails_refuses_every_token() {
        let policy = JoinPolicy::new(Some(Arc::new(secret())), 120, 0, 0);
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        // A failed clock once read as 0, before which no token had expired.
        for expires in [NOW, 60] {
            let token = secret().sign(Scope::Listen, "s", expires);
            let (code, reason) = policy.admit_at(Some(&token), address, None).err().unwrap();
            assert_eq!(code, close::SERVER_ERROR);
            assert_eq!(reason, "the server's clock failed: no join token can be checked");
        }
    }

    #[test]
    fn a_token_opens_one_session_once_and_is_forgotten_when_it_expires() {
        let policy = JoinPolicy::new(Some(Arc::new(secret())), 120, 0, 0);
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        let token = secret().sign(Scope::Listen, "once", NOW + 60);
        let first = policy.admit_at(Some(&token), address, Some(NOW)).unwrap();
        // The session ended, and the same token comes again: still refused.
        drop(first);
        let (code, reason) = policy
            .admit_at(Some(&token), address, Some(NOW + 1))
            .err()
            .unwrap();
        assert_eq!(code, close::UNAUTHORIZED);
        assert_eq!(reason, "the join token was used already: each opens one session");
        // Another token for the same session (another expiry) is another token.
        let again = secret().sign(Scope::Listen, "once", NOW + 90);
        assert!(policy.admit_at(Some(&again), address, Some(NOW + 1)).is_ok());
        // Once expired, a token is forgotten (it is refused as expired from then on).
        let later = secret().sign(Scope::Listen, "later", NOW + 200);
        assert!(policy.admit_at(Some(&later), address, Some(NOW + 100)).is_ok());
        let remembered = policy.used.lock().unwrap().clone();
        assert_eq!(remembered, HashSet::from([("later".to_owned(), NOW + 200)]));
    }

    #[test]
    fn a_join_is_refused_a_sender_token() {
        let policy = JoinPolicy::new(Some(Arc::new(secret())), 120, 0, 0);
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        let sender = secret().sign(Scope::Send, "s", NOW + 60);
        let (code, reason) = policy.admit_at(Some(&sender), address, Some(NOW)).err().unwrap();
        assert_eq!(code, close::UNAUTHORIZED);
        assert_eq!(
            reason,
            "a sender token: a browser joins with a listener's join token"
        );
    }

    /// `policy`'s verdict on a sender of `session` with `token` at NOW.
    fn sender_verdict(
        policy: &SenderPolicy,
        token: Option<&str>,
        session: &str,
        takeover: bool,
    ) -> Result<(), (u16, String)> {
        policy.admit_at(token, session, takeover, Some(NOW))
    }

    #[test]
    fn a_sender_needs_a_sender_token_for_its_session_where_there_is_a_join_secret() {
        let policy = SenderPolicy::new(Some(Arc::new(secret())), None, 120);
        let token = secret().sign(Scope::Send, "alice", NOW + 60);
        let verdict =
            |token: &str, session, takeover| sender_verdict(&policy, Some(token), session, takeover);
        assert_eq!(verdict(&token, "alice", false), Ok(()));
        assert_eq!(
            verdict(&token, "alice", true),
            Ok(()),
            "its own token takes it over"
        );
        let refused = |token: &str, session| verdict(token, session, false).unwrap_err();
        assert_eq!(
            refused(&token, "bob"),
            (
                close::FORBIDDEN,
                "the sender token is for another session than bob".to_owned()
            )
        );
        let listener = secret().sign(Scope::Listen, "alice", NOW + 60);
        let (code, reason) = refused(&listener, "alice");
        assert_eq!(code, close::UNAUTHORIZED);
        assert!(
            reason.starts_with("a listener's join token: a sender needs a sender token"),
            "{reason}"
        );
        let expired = secret().sign(Scope::Send, "alice", NOW - 5);
        assert_eq!(
            refused(&expired, "alice"),
            (close::UNAUTHORIZED, "the sender token expired 5 s ago".to_owned())
        );
        let (code, reason) = refused(&secret().sign(Scope::Send, "alice", NOW + 121), "alice");
        assert_eq!(code, close::UNAUTHORIZED);
        assert_eq!(
            reason,
            "the sender token expires in 121 s, more than this server takes (120 s, --max-token-ttl)"
        );
        let other = JoinSecret::new(b"another secret, also long").unwrap();
        assert_eq!(
            refused(&other.sign(Scope::Send, "alice", NOW + 60), "alice"),
            (
                close::UNAUTHORIZED,
                "the sender token's signature is wrong".to_owned()
            )
        );
        // Without an operator token, a token of the old kind is one more malformed token.
        let (code, reason) = refused("the-tts-token", "alice");
        assert_eq!(code, close::UNAUTHORIZED);
        assert!(reason.starts_with("malformed sender token"), "{reason}");
        assert_eq!(
            sender_verdict(&policy, None, "alice", false),
            Err((close::UNAUTHORIZED, NO_BEARER.to_owned()))
        );
        assert_eq!(
            policy.admit_at(Some(&token), "alice", false, None),
            Err((
                close::SERVER_ERROR,
                "the server's clock failed: no sender token can be checked".to_owned()
            ))
        );
        assert_eq!(policy.operator_token(), None);
    }

    #[test]
    fn a_sender_is_admitted_by_its_requests_bearer_token_at_the_clocks_time() {
        let policy = SenderPolicy::new(Some(Arc::new(secret())), None, 120);
        let now = unix_now().unwrap();
        let token = secret().sign(Scope::Send, "alice", now + 60);
        let header = format!("Authorization: Bearer {token}\r\n");
        assert_eq!(policy.admit(&request(&header), "alice", false), Ok(()));
        assert_eq!(
            policy.admit(&request(""), "alice", false),
            Err((close::UNAUTHORIZED, NO_BEARER.to_owned()))
        );
        let (code, _) = policy.admit(&request(&header), "bob", false).unwrap_err();
        assert_eq!(code, close::FORBIDDEN);
        // Expired by the clock, not by a time the test gives.
        let old = secret().sign(Scope::Send, "alice", now - 1);
        let header = format!("Authorization: Bearer {old}\r\n");
        assert!(policy.admit(&request(&header), "alice", false).is_err());
    }

    #[test]
    fn the_operators_token_feeds_any_session_but_takes_none_over_where_there_is_a_join_secret() {
        let operator = Some("the-operators-token".to_owned());
        let signed = SenderPolicy::new(Some(Arc::new(secret())), operator.clone(), 120);
        let verdict = |policy, token, takeover| sender_verdict(policy, Some(token), "alice", takeover);
        assert_eq!(verdict(&signed, "the-operators-token", false), Ok(()));
        assert_eq!(
            verdict(&signed, "the-operators-token", true),
            Err((
                close::UNAUTHORIZED,
                "takeover=1 takes session alice's sender token, not the operator's token".to_owned()
            ))
        );
        let token = secret().sign(Scope::Send, "alice", NOW + 60);
        assert_eq!(verdict(&signed, &token, true), Ok(()));
        assert_eq!(signed.operator_token(), Some("the-operators-token"));
        // Without a join secret the operator's token is the only credential, takeovers too.
        let open = SenderPolicy::new(None, operator, 120);
        assert_eq!(verdict(&open, "the-operators-token", true), Ok(()));
        for wrong in ["the-operators-tokeN", token.as_str()] {
            assert_eq!(
                verdict(&open, wrong, false),
                Err((close::UNAUTHORIZED, "wrong token".to_owned())),
                "{wrong}"
            );
        }
    }

    #[test]
    fn joins_are_capped_per_client_and_a_left_session_gives_its_place_back() {
        let policy = JoinPolicy::new(None, 120, 4, 2);
        let address: IpAddr = "2001:db8::1".parse().unwrap();
        let neighbour: IpAddr = "2001:db8::2".parse().unwrap();
        let first = policy.admit(None, address).unwrap();
        let _second = policy.admit(None, neighbour).unwrap();
        let (code, reason) = policy.admit(None, address).err().unwrap();
        assert_eq!(
            (code, reason.as_str()),
            (
                close::TOO_MANY_SESSIONS,
                "2001:db8::/64 has its most sessions (2)"
            )
        );
        drop(first);
        let _third = policy.admit(None, address).unwrap();
        // Four joins a minute, the refused one counted.
        let (code, reason) = policy.admit(None, address).err().unwrap();
        assert_eq!(code, close::TOO_MANY_SESSIONS);
        assert_eq!(reason, "2001:db8::/64 joins too often (at most 4 a minute)");
    }

    /// The client is told the code and the reason in the close frame, and the metrics count the
    /// code.
    #[tokio::test]
    async fn a_refusal_closes_with_its_code_and_reason_and_is_counted() {
        use std::sync::Arc;
        use std::time::Duration;

        use futures_util::StreamExt;
        use gstqwencodec::model::{Dtype, Model, parse_device};
        use tungstenite::Message;

        use crate::admission::Capacity;

        let model = Model::load(
            &crate::config::default_model(),
            parse_device("cpu").unwrap(),
            Dtype::F32,
        )
        .unwrap();
        let capacity = Arc::new(Capacity::new(4, false, 0.2, Duration::from_millis(80)));
        let metrics = Metrics::new(Arc::new(model), capacity);
        let (server, mut client) = http::loopback().await;
        let refusing = tokio::spawn({
            let metrics = metrics.clone();
            async move {
                refuse(
                    &metrics,
                    server,
                    "/codes",
                    &"a peer",
                    close::BUSY,
                    "busy, try later",
                )
                .await
            }
        });
        let frame = loop {
            match client.next().await.unwrap().unwrap() {
                Message::Close(frame) => break frame.unwrap(),
                _ => continue,
            }
        };
        assert_eq!(
            (u16::from(frame.code), frame.reason.as_str()),
            (close::BUSY, "busy, try later")
        );
        // The close's answer, which ends the server's wait for it.
        drop(client);
        refusing.await.unwrap();
        let text = metrics.render(0, 0);
        assert!(
            text.lines()
                .any(|line| line == r#"qwencodec_refusals_total{code="4409"} 1"#),
            "{text}"
        );
    }
}
