//! Join tokens: the application's backend, which knows its users, says who may open which
//! session, and the server checks it without asking anyone. A token is
//!
//! ```text
//! <session-id>.<expiry>.<signature>
//! ```
//!
//! `session-id` 1 to 64 letters, digits, `-` and `_` (it becomes the session's id: the backend
//! gives the same id to its TTS sender); `expiry` the Unix time in seconds after which the token
//! is refused (never `u64::MAX`: every token expires); `signature` HMAC-SHA256, keyed with the join secret, of `<session-id>.<expiry>`,
//! in hex. Free of GStreamer and of the network, so that a fuzz target (`fuzz/`) builds it.

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

/// What a token the server takes says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub session: String,
    /// Unix seconds.
    pub expires: u64,
}

/// Why a token is refused. None of them repeats the token: refusals are logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    Malformed(&'static str),
    BadSignature,
    Expired { seconds_ago: u64 },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Malformed(why) => write!(f, "malformed join token: {why}"),
            TokenError::BadSignature => f.write_str("the join token's signature is wrong"),
            TokenError::Expired { seconds_ago } => write!(f, "the join token expired {seconds_ago} s ago"),
        }
    }
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
        if let Some(file) = file {
            let bytes = std::fs::read(file).map_err(|err| format!("{}: {err}", file.display()))?;
            return Self::new(&bytes)
                .map(Some)
                .map_err(|err| format!("{}: {err}", file.display()));
        }
        match std::env::var_os(SECRET_VARIABLE) {
            Some(text) => Self::new(text.as_encoded_bytes())
                .map(Some)
                .map_err(|err| format!("${SECRET_VARIABLE}: {err}")),
            None => Ok(None),
        }
    }

    fn mac(&self, signed: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(signed.as_bytes());
        mac
    }

    /// The token for `session` until `expires`, as the backend makes it (the server only
    /// checks them; the tests and the fuzz target make their own).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn sign(&self, session: &str, expires: u64) -> String {
        let signed = format!("{session}.{expires}");
        let signature = data_encoding::HEXLOWER.encode(&self.mac(&signed).finalize().into_bytes());
        format!("{signed}.{signature}")
    }

    /// What `token` says, if this secret signed it and it has not expired at `now` (Unix
    /// seconds). The signature is compared in constant time, and before the expiry is looked
    /// at: a forged token learns nothing but that it is forged.
    pub fn verify(&self, token: &str, now: u64) -> Result<JoinToken, TokenError> {
        let mut parts = token.split('.');
        let (Some(session), Some(expiry), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("not <session-id>.<expiry>.<signature>"));
        };
        if !is_session_id(session) {
            return Err(TokenError::Malformed(
                "the session id is not 1 to 64 letters, digits, - and _",
            ));
        }
        if expiry.is_empty()
            || expiry.len() > MAX_EXPIRY_DIGITS
            || !expiry.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(TokenError::Malformed("the expiry is not Unix seconds"));
        }
        let expires: u64 = expiry
            .parse()
            .map_err(|_| TokenError::Malformed("the expiry is not Unix seconds"))?;
        // The largest u64 is what a backend writes for "never": a token must expire.
        if expires == u64::MAX {
            return Err(TokenError::Malformed("the expiry is never (u64::MAX)"));
        }
        let signature = data_encoding::HEXLOWER_PERMISSIVE
            .decode(signature.as_bytes())
            .ok()
            .filter(|bytes| bytes.len() == SIGNATURE_BYTES)
            .ok_or(TokenError::Malformed("the signature is not 64 hex digits"))?;
        self.mac(&token[..session.len() + 1 + expiry.len()])
            .verify_slice(&signature)
            .map_err(|_| TokenError::BadSignature)?;
        if now > expires {
            return Err(TokenError::Expired {
                seconds_ago: now - expires,
            });
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

    #[test]
    fn a_signed_token_is_taken_until_it_expires() {
        let token = secret().sign("listener-7_a", NOW + 60);
        assert_eq!(
            secret().verify(&token, NOW),
            Ok(JoinToken {
                session: "listener-7_a".into(),
                expires: NOW + 60
            })
        );
        assert!(
            secret().verify(&token, NOW + 60).is_ok(),
            "valid through its expiry second"
        );
        assert_eq!(
            secret().verify(&token, NOW + 150),
            Err(TokenError::Expired { seconds_ago: 90 })
        );
        // The latest expiry a token may name, in its 20 digits; u64::MAX itself is "never".
        let latest = secret().sign("s", u64::MAX - 1);
        assert_eq!(secret().verify(&latest, NOW).unwrap().expires, u64::MAX - 1);
        let forever = secret().sign("s", u64::MAX);
        assert_eq!(
            secret().verify(&forever, NOW),
            Err(TokenError::Malformed("the expiry is never (u64::MAX)"))
        );
        // The signature's hex in capitals is the same signature.
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let shouted = format!("{signed}.{}", signature.to_ascii_uppercase());
        assert!(secret().verify(&shouted, NOW).is_ok());
    }

    #[test]
    fn a_token_signed_as_the_docs_python_backend_signs_is_taken() {
        // docs/server-protocol.md's backend, hmac.new(secret, f"{session}.{expiry}".encode(),
        // hashlib.sha256).hexdigest(), with the secret read as open(...).read().strip(): this
        // token is what Python 3.11 printed for the tests' secret.
        let token = "abc123.1800000060.2e7bf9d46ed2a3fcb45f7ab230fefffc6766137f3bb5751bf2ef13806dad6d09";
        assert_eq!(secret().sign("abc123", 1_800_000_060), token);
        assert_eq!(secret().verify(token, NOW).unwrap().session, "abc123");
    }

    #[test]
    fn a_token_for_another_session_or_another_expiry_or_secret_is_refused() {
        let token = secret().sign("alice", NOW + 60);
        let signature = token.rsplit_once('.').unwrap().1;
        for forged in [
            format!("bob.{}.{signature}", NOW + 60),
            format!("alice.{}.{signature}", NOW + 3600),
        ] {
            assert_eq!(
                secret().verify(&forged, NOW),
                Err(TokenError::BadSignature),
                "{forged}"
            );
        }
        let other = JoinSecret::new(b"another secret, also long").unwrap();
        assert_eq!(other.verify(&token, NOW), Err(TokenError::BadSignature));
        // A forged token that has expired is told it is forged, not that it expired.
        let expired = format!("alice.{}.{signature}", NOW - 5);
        assert_eq!(secret().verify(&expired, NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn malformed_tokens_are_refused_with_the_reason() {
        let token = secret().sign("alice", NOW + 60);
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
            let err = secret().verify(&token, NOW).unwrap_err();
            assert!(matches!(err, TokenError::Malformed(_)), "{token:?}: {err}");
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
        let token = secret().sign("s", NOW + 60);
        assert!(read.verify(&token, NOW).is_ok());
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
            .sign("s", NOW);
        assert!(
            JoinSecret::new(b"\ta join secret of the tests \r\n")
                .unwrap()
                .verify(&token, NOW)
                .is_ok()
        );
        assert_eq!(format!("{:?}", secret()), "JoinSecret(…)");
    }
}
