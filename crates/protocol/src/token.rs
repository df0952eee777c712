//! Join tokens: the application's backend, which knows its users, says who may open which
//! session, and who may feed it, and the server checks it without asking anyone. A token is
//!
//! ```text
//! <session-id>.<expiry>.<signature>            a listener's: its browser joins the session
//! sender.<session-id>.<expiry>.<signature>     a sender's: it feeds the session on /codes
//! ```
//!
//! `session-id` 1 to 64 letters, digits, `-` and `_` (it becomes the session's id: the backend
//! gives the same id to its TTS sender); `expiry` the Unix time in seconds after which the token
//! is refused (never `u64::MAX`: every token expires); `signature` HMAC-SHA256, keyed with the
//! join secret, of what comes before it (`<session-id>.<expiry>`, or `sender.<session-id>.<expiry>`),
//! in hex. The two never sign the same text (a session id has no `.`), so neither scope's token
//! passes for the other's. Free of GStreamer and of the network, so that a fuzz target (`fuzz/`)
//! builds it.

use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable that may hold the join secret (`--join-secret-file` wins).
pub const SECRET_VARIABLE: &str = "QWENCODEC_JOIN_SECRET";
/// A shorter secret is refused at start: it could be guessed from a token offline.
pub const MIN_SECRET_BYTES: usize = 16;
pub const MAX_SESSION_ID_CHARS: usize = 64;
/// The most an expiry may take: every `u64` in decimal.
const MAX_EXPIRY_DIGITS: usize = 20;
const SIGNATURE_BYTES: usize = 32;

/// The key the backend signs join tokens with.
pub struct JoinSecret(Vec<u8>);

impl fmt::Debug for JoinSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinSecret(…)")
    }
}

/// What a token lets its holder do with its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Join it, from a browser (`/signal`).
    Listen,
    /// Feed it, and take it over from another sender (`/codes`).
    Send,
}

/// What a sender token starts with.
const SENDER_PREFIX: &str = "sender";

impl Scope {
    /// What a token of this scope is called in a refusal.
    pub fn noun(self) -> &'static str {
        match self {
            Scope::Listen => "join token",
            Scope::Send => "sender token",
        }
    }
}

/// What a token the server takes says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub session: String,
    /// Unix seconds.
    pub expires: u64,
}

/// Why a token is refused, for an endpoint that takes tokens of `wanted`'s scope. None of them
/// repeats the token: refusals are logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenError {
    pub wanted: Scope,
    pub kind: TokenErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenErrorKind {
    Malformed(&'static str),
    BadSignature,
    /// Well signed, for the other scope (a listener's token on `/codes`, a sender's on `/signal`).
    WrongScope,
    Expired {
        seconds_ago: u64,
    },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noun = self.wanted.noun();
        match self.kind {
            TokenErrorKind::Malformed(why) => write!(f, "malformed {noun}: {why}"),
            TokenErrorKind::BadSignature => write!(f, "the {noun}'s signature is wrong"),
            TokenErrorKind::WrongScope => match self.wanted {
                Scope::Listen => f.write_str("a sender token: a browser joins with a listener's join token"),
                Scope::Send => f.write_str(
                    "a listener's join token: a sender needs a sender token \
                     (sender.<session-id>.<expiry>.<signature>)",
                ),
            },
            TokenErrorKind::Expired { seconds_ago } => write!(f, "the {noun} expired {seconds_ago} s ago"),
        }
    }
}

/// A secret made by `make` from the bytes of `file` when given, else of the environment's
/// `variable`; None when neither says one. An error names where the bytes came from.
pub fn read_secret<T>(
    file: Option<&Path>,
    variable: &str,
    make: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let (bytes, source) = match file {
        Some(file) => (
            std::fs::read(file).map_err(|err| format!("{}: {err}", file.display()))?,
            file.display().to_string(),
        ),
        None => match std::env::var_os(variable) {
            Some(text) => (text.into_encoded_bytes(), format!("${variable}")),
            None => return Ok(None),
        },
    };
    make(&bytes).map(Some).map_err(|err| format!("{source}: {err}"))
}

/// Whether `text` may be a session id that a token names.
pub fn is_session_id(text: &str) -> bool {
    (1..=MAX_SESSION_ID_CHARS).contains(&text.len())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

impl JoinSecret {
    /// `bytes` less the white space around them (a file's newline).
    pub fn new(bytes: &[u8]) -> Result<Self, String> {
        let secret = bytes.trim_ascii();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the join secret has {} bytes, fewer than {MIN_SECRET_BYTES}",
                secret.len()
            ));
        }
        Ok(Self(secret.to_vec()))
    }

    /// From `file` when given, else from the environment's `QWENCODEC_JOIN_SECRET`; None when
    /// neither says one.
    pub fn read(file: Option<&Path>) -> Result<Option<Self>, String> {
        read_secret(file, SECRET_VARIABLE, Self::new)
    }

    fn mac(&self, signed: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(signed.as_bytes());
        mac
    }

    /// The token of `scope` for `session` until `expires`, as the backend makes it (the server
    /// only checks them; the tests and the fuzz target make their own).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn sign(&self, scope: Scope, session: &str, expires: u64) -> String {
        let signed = match scope {
            Scope::Listen => format!("{session}.{expires}"),
            Scope::Send => format!("{SENDER_PREFIX}.{session}.{expires}"),
        };
        let signature = data_encoding::HEXLOWER.encode(&self.mac(&signed).finalize().into_bytes());
        format!("{signed}.{signature}")
    }

    /// What `token` says, if this secret signed it for `wanted`'s scope and it has not expired
    /// at `now` (Unix seconds). The signature is compared in constant time, and before the scope
    /// and the expiry are looked at: a forged token learns nothing but that it is forged.
    pub fn verify(&self, token: &str, now: u64, wanted: Scope) -> Result<JoinToken, TokenError> {
        let refused = |kind| TokenError { wanted, kind };
        let malformed = |why| refused(TokenErrorKind::Malformed(why));
        let parts: Vec<&str> = token.splitn(5, '.').collect();
        let (scope, session, expiry, signature) = match parts[..] {
            [session, expiry, signature] => (Scope::Listen, session, expiry, signature),
            [SENDER_PREFIX, session, expiry, signature] => (Scope::Send, session, expiry, signature),
            _ => {
                return Err(malformed(match wanted {
                    Scope::Listen => "not <session-id>.<expiry>.<signature>",
                    Scope::Send => "not sender.<session-id>.<expiry>.<signature>",
                }));
            }
        };
        if !is_session_id(session) {
            return Err(malformed(
                "the session id is not 1 to 64 letters, digits, - and _",
            ));
        }
        if expiry.is_empty()
            || expiry.len() > MAX_EXPIRY_DIGITS
            || !expiry.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(malformed("the expiry is not Unix seconds"));
        }
        let expires: u64 = expiry
            .parse()
            .map_err(|_| malformed("the expiry is not Unix seconds"))?;
        // The largest u64 is what a backend writes for "never": a token must expire.
        if expires == u64::MAX {
            return Err(malformed("the expiry is never (u64::MAX)"));
        }
        let signature = data_encoding::HEXLOWER_PERMISSIVE
            .decode(signature.as_bytes())
            .ok()
            .filter(|bytes| bytes.len() == SIGNATURE_BYTES)
            .ok_or(malformed("the signature is not 64 hex digits"))?;
        self.mac(&token[..token.len() - 1 - SIGNATURE_BYTES * 2])
            .verify_slice(&signature)
            .map_err(|_| refused(TokenErrorKind::BadSignature))?;
        if scope != wanted {
            return Err(refused(TokenErrorKind::WrongScope));
        }
        if now > expires {
            return Err(refused(TokenErrorKind::Expired {
                seconds_ago: now - expires,
            }));
        }
        Ok(JoinToken {
            session: session.to_owned(),
            expires,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn secret() -> JoinSecret {
        JoinSecret::new(b"a join secret of the tests\n").unwrap()
    }

    /// A listener's token refused for `kind`.
    fn listen(kind: TokenErrorKind) -> TokenError {
        TokenError {
            wanted: Scope::Listen,
            kind,
        }
    }

    #[test]
    fn a_signed_token_is_taken_until_it_expires() {
        let token = secret().sign(Scope::Listen, "listener-7_a", NOW + 60);
        assert_eq!(
            secret().verify(&token, NOW, Scope::Listen),
            Ok(JoinToken {
                session: "listener-7_a".into(),
                expires: NOW + 60
            })
        );
        assert!(
            secret().verify(&token, NOW + 60, Scope::Listen).is_ok(),
            "valid through its expiry second"
        );
        assert_eq!(
            secret().verify(&token, NOW + 150, Scope::Listen),
            Err(listen(TokenErrorKind::Expired { seconds_ago: 90 }))
        );
        // The latest expiry a token may name, in its 20 digits; u64::MAX itself is "never".
        let latest = secret().sign(Scope::Listen, "s", u64::MAX - 1);
        assert_eq!(
            secret().verify(&latest, NOW, Scope::Listen).unwrap().expires,
            u64::MAX - 1
        );
        let forever = secret().sign(Scope::Listen, "s", u64::MAX);
        assert_eq!(
            secret().verify(&forever, NOW, Scope::Listen),
            Err(listen(TokenErrorKind::Malformed(
                "the expiry is never (u64::MAX)"
            )))
        );
        // The signature's hex in capitals is the same signature.
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let shouted = format!("{signed}.{}", signature.to_ascii_uppercase());
        assert!(secret().verify(&shouted, NOW, Scope::Listen).is_ok());
    }

    #[test]
    fn a_token_signed_as_the_docs_python_backend_signs_is_taken() {
        // docs/server-protocol.md's backend, hmac.new(secret, f"{session}.{expiry}".encode(),
        // hashlib.sha256).hexdigest(), with the secret read as open(...).read().strip(): this
        // token is what Python 3.11 printed for the tests' secret.
        let token = "abc123.1800000060.2e7bf9d46ed2a3fcb45f7ab230fefffc6766137f3bb5751bf2ef13806dad6d09";
        assert_eq!(secret().sign(Scope::Listen, "abc123", 1_800_000_060), token);
        assert_eq!(
            secret().verify(token, NOW, Scope::Listen).unwrap().session,
            "abc123"
        );
    }

    #[test]
    fn a_token_for_another_session_or_another_expiry_or_secret_is_refused() {
        let token = secret().sign(Scope::Listen, "alice", NOW + 60);
        let signature = token.rsplit_once('.').unwrap().1;
        for forged in [
            format!("bob.{}.{signature}", NOW + 60),
            format!("alice.{}.{signature}", NOW + 3600),
        ] {
            assert_eq!(
                secret().verify(&forged, NOW, Scope::Listen),
                Err(listen(TokenErrorKind::BadSignature)),
                "{forged}"
            );
        }
        let other = JoinSecret::new(b"another secret, also long").unwrap();
        assert_eq!(
            other.verify(&token, NOW, Scope::Listen),
            Err(listen(TokenErrorKind::BadSignature))
        );
        // A forged token that has expired is told it is forged, not that it expired.
        let expired = format!("alice.{}.{signature}", NOW - 5);
        assert_eq!(
            secret().verify(&expired, NOW, Scope::Listen),
            Err(listen(TokenErrorKind::BadSignature))
        );
    }

    #[test]
    fn a_sender_token_feeds_its_session_and_neither_scope_passes_for_the_other() {
        let sender = secret().sign(Scope::Send, "alice", NOW + 60);
        assert!(sender.starts_with("sender.alice."), "{sender}");
        assert_eq!(
            secret().verify(&sender, NOW, Scope::Send),
            Ok(JoinToken {
                session: "alice".into(),
                expires: NOW + 60
            })
        );
        let wrong_scope = |wanted| TokenError {
            wanted,
            kind: TokenErrorKind::WrongScope,
        };
        assert_eq!(
            secret().verify(&sender, NOW, Scope::Listen),
            Err(wrong_scope(Scope::Listen))
        );
        let listener = secret().sign(Scope::Listen, "alice", NOW + 60);
        assert_eq!(
            secret().verify(&listener, NOW, Scope::Send),
            Err(wrong_scope(Scope::Send))
        );
        assert_eq!(
            wrong_scope(Scope::Send).to_string(),
            "a listener's join token: a sender needs a sender token \
             (sender.<session-id>.<expiry>.<signature>)"
        );
        assert_eq!(
            wrong_scope(Scope::Listen).to_string(),
            "a sender token: a browser joins with a listener's join token"
        );
        // A scope changed in the text is a forgery: the signature covers it.
        let signature = listener.rsplit_once('.').unwrap().1;
        let promoted = format!("sender.alice.{}.{signature}", NOW + 60);
        let demoted = sender.strip_prefix("sender.").unwrap();
        let bad = |wanted| TokenError {
            wanted,
            kind: TokenErrorKind::BadSignature,
        };
        assert_eq!(
            secret().verify(&promoted, NOW, Scope::Send),
            Err(bad(Scope::Send))
        );
        assert_eq!(
            secret().verify(demoted, NOW, Scope::Listen),
            Err(bad(Scope::Listen))
        );
        // Expired, and malformed, in a sender's words.
        let expired = secret().sign(Scope::Send, "alice", NOW - 5);
        let err = secret().verify(&expired, NOW, Scope::Send).unwrap_err();
        assert_eq!(err.to_string(), "the sender token expired 5 s ago");
        let err = secret().verify("alice", NOW, Scope::Send).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed sender token: not sender.<session-id>.<expiry>.<signature>"
        );
        for malformed in [
            format!("sender.{sender}"),
            format!("senders.alice.{}.{signature}", NOW + 60),
        ] {
            let err = secret().verify(&malformed, NOW, Scope::Send).unwrap_err();
            assert!(
                matches!(err.kind, TokenErrorKind::Malformed(_)),
                "{malformed}: {err}"
            );
        }
        // A session named "sender" is a listener's like any other.
        let named = secret().sign(Scope::Listen, "sender", NOW + 60);
        assert!(secret().verify(&named, NOW, Scope::Listen).is_ok());
        assert_eq!(
            secret().verify(&named, NOW, Scope::Send),
            Err(wrong_scope(Scope::Send))
        );
    }

    #[test]
    fn a_sender_token_signed_as_the_docs_python_backend_signs_is_taken() {
        // docs/server-protocol.md's backend, hmac.new(secret, f"sender.{session}.{expiry}"
        // .encode(), hashlib.sha256).hexdigest(): what Python 3.11 printed for the tests' secret.
        let token = "sender.abc123.1800000060.\
                     e470ac93261a0581cfa0e028ed37ed66b91da6ddbda31ea5b4417a8c250542e4";
        assert_eq!(secret().sign(Scope::Send, "abc123", 1_800_000_060), token);
        let taken = secret().verify(token, NOW, Scope::Send).unwrap();
        assert_eq!(taken.session, "abc123");
    }

    #[test]
    fn malformed_tokens_are_refused_with_the_reason() {
        let token = secret().sign(Scope::Listen, "alice", NOW + 60);
        let signature = token.rsplit_once('.').unwrap().1.to_owned();
        let cases = [
            (String::new(), "not <session-id>"),
            ("alice".to_owned(), "not <session-id>"),
            (format!("{token}.more"), "not <session-id>"),
            (format!(".{}.{signature}", NOW), "session id"),
            (format!("al ice.{}.{signature}", NOW), "session id"),
            (format!("{}.{}.{signature}", "a".repeat(65), NOW), "session id"),
            (format!("alice..{signature}"), "expiry"),
            (format!("alice.-1.{signature}"), "expiry"),
            (format!("alice.99999999999999999999.{signature}"), "expiry"),
            (format!("alice.{}.{}", NOW, &signature[1..]), "64 hex digits"),
            (format!("alice.{}.{}", NOW, "zz".repeat(32)), "64 hex digits"),
            (format!("alice.{}.{signature}00", NOW), "64 hex digits"),
        ];
        // Expiries that Rust would parse but a backend never writes, signed as they stand: a
        // sign, and more than 20 digits (leading zeros).
        let signed_as_written = |expiry: &str| {
            let signed = format!("alice.{expiry}");
            let signature = secret().mac(&signed).finalize().into_bytes();
            (
                format!("{signed}.{}", data_encoding::HEXLOWER.encode(&signature)),
                "expiry",
            )
        };
        let cases = cases.into_iter().chain([
            signed_as_written(&format!("+{}", NOW + 60)),
            signed_as_written(&format!("{:021}", NOW + 60)),
        ]);
        for (token, reason) in cases {
            let err = secret().verify(&token, NOW, Scope::Listen).unwrap_err();
            assert!(
                matches!(err.kind, TokenErrorKind::Malformed(_)),
                "{token:?}: {err}"
            );
            assert!(err.to_string().contains(reason), "{token:?}: {err}");
            assert!(
                token.is_empty() || !err.to_string().contains(&token),
                "the refusal repeats the token"
            );
        }
    }

    #[test]
    fn a_secret_file_is_read_and_a_missing_or_short_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("join-secret");
        std::fs::write(&file, b"a join secret of the tests\n").unwrap();
        let read = JoinSecret::read(Some(&file)).unwrap().expect("the file's secret");
        let token = secret().sign(Scope::Listen, "s", NOW + 60);
        assert!(read.verify(&token, NOW, Scope::Listen).is_ok());
        std::fs::write(&file, b"short\n").unwrap();
        let err = JoinSecret::read(Some(&file)).unwrap_err();
        assert!(
            err.contains(&*file.to_string_lossy()) && err.contains("fewer than 16"),
            "{err}"
        );
        std::fs::remove_file(&file).unwrap();
        let err = JoinSecret::read(Some(&file)).unwrap_err();
        assert!(err.starts_with(&*file.to_string_lossy()), "{err}");
    }

    #[test]
    fn a_short_secret_is_refused_and_white_space_around_one_is_not_part_of_it() {
        assert!(
            JoinSecret::new(b"  short \n")
                .unwrap_err()
                .contains("fewer than 16")
        );
        let token = JoinSecret::new(b"a join secret of the tests")
            .unwrap()
            .sign(Scope::Listen, "s", NOW);
        assert!(
            JoinSecret::new(b"\ta join secret of the tests \r\n")
                .unwrap()
                .verify(&token, NOW, Scope::Listen)
                .is_ok()
        );
        assert_eq!(format!("{:?}", secret()), "JoinSecret(…)");
    }
}
