//! TURN REST credentials, as coturn checks them with `use-auth-secret` and `static-auth-secret`
//! (the TURN REST API draft's): the username `<expiry>:<who>`, the password the base64 of the
//! HMAC-SHA1 of the username keyed with the secret the server shares with coturn. coturn refuses
//! a username whose expiry (Unix seconds) has passed when an allocation is made, so a page's
//! credentials serve it only as long as its join token would; the secret never leaves the server.

use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha1::Sha1;

/// The environment variable that may hold the TURN secret (`--turn-secret-file` wins).
pub const SECRET_VARIABLE: &str = "QWENCODEC_TURN_SECRET";
/// A shorter secret is refused at start: it could be guessed offline from a page's password.
pub const MIN_SECRET_BYTES: usize = 16;

/// coturn's `static-auth-secret`.
pub struct TurnSecret(Vec<u8>);

impl fmt::Debug for TurnSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TurnSecret(…)")
    }
}

impl TurnSecret {
    /// `bytes` less the white space around them (a file's newline).
    pub fn new(bytes: &[u8]) -> Result<Self, String> {
        let secret = bytes.trim_ascii();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the TURN secret has {} bytes, fewer than {MIN_SECRET_BYTES}",
                secret.len()
            ));
        }
        Ok(Self(secret.to_vec()))
    }

    /// From `file` when given, else from the environment's `QWENCODEC_TURN_SECRET`; None when
    /// neither says one.
    pub fn read(file: Option<&Path>) -> Result<Option<Self>, String> {
        qwencodec_protocol::token::read_secret(file, SECRET_VARIABLE, Self::new)
    }

    /// The username and password of `who` (a session id) until `expires` (Unix seconds).
    pub fn credentials(&self, who: &str, expires: u64) -> (String, String) {
        let username = format!("{expires}:{who}");
        let mut mac = Hmac::<Sha1>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(username.as_bytes());
        let password = data_encoding::BASE64.encode(&mac.finalize().into_bytes());
        (username, password)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credentials_are_coturns_rest_ones() {
        let secret = TurnSecret::new(b"a TURN secret of the tests\n").unwrap();
        // What Python 3.11 printed for base64.b64encode(hmac.new(secret, username.encode(),
        // hashlib.sha1).digest()), as coturn's docs compute a REST password.
        assert_eq!(
            secret.credentials("abc123", 1_800_000_060),
            (
                "1800000060:abc123".to_owned(),
                "VJVhD81zQHIVhAeccW3dVxwGOsQ=".to_owned()
            )
        );
        let (_, later) = secret.credentials("abc123", 1_800_000_061);
        let (_, other) = secret.credentials("abc124", 1_800_000_060);
        assert!(later != "VJVhD81zQHIVhAeccW3dVxwGOsQ=" && other != later);
        assert_eq!(format!("{secret:?}"), "TurnSecret(…)");
    }

    #[test]
    fn a_secret_file_is_read_and_a_short_or_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("turn-secret");
        std::fs::write(&file, b"a TURN secret of the tests\n").unwrap();
        let read = TurnSecret::read(Some(&file)).unwrap().expect("the file's secret");
        assert_eq!(
            read.credentials("abc123", 1_800_000_060).1,
            "VJVhD81zQHIVhAeccW3dVxwGOsQ="
        );
        std::fs::write(&file, b"short\n").unwrap();
        let err = TurnSecret::read(Some(&file)).unwrap_err();
        assert!(
            err.contains("turn-secret") && err.contains("fewer than 16"),
            "{err}"
        );
        std::fs::remove_file(&file).unwrap();
        assert!(TurnSecret::read(Some(&file)).unwrap_err().contains("turn-secret"));
    }
}
