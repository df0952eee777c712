//! the server (server/)'s join tokens (`crates/protocol/src/token.rs`), which anyone may send in a
//! `join`: any text is refused with a reason that does not repeat it, never a panic, unless it is
//! what the secret signed; and a token signed for any session and expiry is taken back as
//! signed, or refused for what it is (a session id off the grammar, an expiry passed), and
//! refused once a byte of its signature changes. The first byte chooses which.
#![no_main]

use libfuzzer_sys::fuzz_target;

use qwencodec_protocol::token;

use token::{JoinSecret, JoinToken, TokenError};

/// The fuzzing's "now", in Unix seconds.
const NOW: u64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    let secret = JoinSecret::new(b"the join secret of the fuzz target").unwrap();
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    if choice & 1 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        match secret.verify(text, NOW) {
            Ok(token) => assert_eq!(
                secret.sign(&token.session, token.expires),
                text.to_ascii_lowercase()
            ),
            Err(err) => {
                let shown = err.to_string();
                assert!(shown.contains("join token"), "{shown}");
                // A refusal's words are fixed: a token that is a piece of them (`<expiry>.<sig`)
                // is found in them without being repeated.
                let in_the_wording = matches!(err, TokenError::Malformed(why) if why.contains(text));
                assert!(
                    text.len() < 8 || in_the_wording || !shown.contains(text),
                    "the refusal repeats the token"
                );
            }
        }
        return;
    }
    // An expiry (8 bytes), then a session id.
    if rest.len() < 8 {
        return;
    }
    let expires = u64::from_le_bytes(rest[..8].try_into().unwrap()) % (2 * NOW);
    let Ok(session) = std::str::from_utf8(&rest[8..]) else {
        return;
    };
    let signed = secret.sign(session, expires);
    let verdict = secret.verify(&signed, NOW);
    if !token::is_session_id(session) {
        assert!(matches!(verdict, Err(TokenError::Malformed(_))), "{verdict:?}");
        return;
    }
    if expires < NOW {
        assert_eq!(
            verdict,
            Err(TokenError::Expired {
                seconds_ago: NOW - expires
            })
        );
    } else {
        let session = session.to_owned();
        assert_eq!(verdict, Ok(JoinToken { session, expires }));
    }
    let last = signed.len() - 1;
    let changed = if signed.as_bytes()[last] == b'0' { '1' } else { '0' };
    let forged = format!("{}{changed}", &signed[..last]);
    assert_eq!(secret.verify(&forged, NOW), Err(TokenError::BadSignature));
});
