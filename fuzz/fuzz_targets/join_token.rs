//! the server (server/)'s join tokens (`crates/protocol/src/token.rs`), listeners' and senders',
//! which anyone may send in a `join` or on `/codes`: any text is refused with a reason that does
//! not repeat it, never a panic, unless it is what the secret signed for the scope asked; and a
//! token signed for any scope, session and expiry is taken back as signed for its scope and
//! refused for the other, or refused for what it is (a session id off the grammar, an expiry
//! passed), and refused once a byte of its signature changes. The first byte chooses which, and
//! the scope.
#![no_main]

use libfuzzer_sys::fuzz_target;

use qwencodec_protocol::token;

use token::{JoinSecret, JoinToken, Scope, TokenErrorKind};

/// The fuzzing's "now", in Unix seconds.
const NOW: u64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    let secret = JoinSecret::new(b"the join secret of the fuzz target").unwrap();
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let (scope, other) = if choice & 2 == 0 {
        (Scope::Listen, Scope::Send)
    } else {
        (Scope::Send, Scope::Listen)
    };
    if choice & 1 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        match secret.verify(text, NOW, scope) {
            Ok(token) => assert_eq!(
                secret.sign(scope, &token.session, token.expires),
                text.to_ascii_lowercase()
            ),
            Err(err) => {
                let shown = err.to_string();
                assert!(shown.contains(" token"), "{shown}");
                // A malformed token's refusal is fixed words (its reason a `&'static str`): a
                // token that is a piece of them (`<expiry>.<sig`, `ed sender token`) is found in
                // them without being repeated.
                let in_the_wording = matches!(err.kind, TokenErrorKind::Malformed(_));
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
    let signed = secret.sign(scope, session, expires);
    let verdict = secret.verify(&signed, NOW, scope);
    let kind = verdict.as_ref().map_err(|err| err.kind.clone());
    if !token::is_session_id(session) {
        // A listener's "session" `sender.ID` signs the very text of ID's sender token (no
        // backend signs one: ids hold no `.`), which is taken for that and refused as such.
        let a_senders =
            scope == Scope::Listen && session.strip_prefix("sender.").is_some_and(token::is_session_id);
        if a_senders {
            assert_eq!(kind.err(), Some(TokenErrorKind::WrongScope), "{verdict:?}");
        } else {
            assert!(matches!(kind, Err(TokenErrorKind::Malformed(_))), "{verdict:?}");
        }
        return;
    }
    if expires < NOW {
        assert_eq!(
            kind.err(),
            Some(TokenErrorKind::Expired {
                seconds_ago: NOW - expires
            })
        );
    } else {
        let session = session.to_owned();
        assert_eq!(verdict, Ok(JoinToken { session, expires }));
    }
    // Well signed, for the other scope.
    let elsewhere = secret.verify(&signed, NOW, other).map_err(|err| err.kind);
    assert_eq!(elsewhere.err(), Some(TokenErrorKind::WrongScope));
    let last = signed.len() - 1;
    let changed = if signed.as_bytes()[last] == b'0' { '1' } else { '0' };
    let forged = format!("{}{changed}", &signed[..last]);
    let forged = secret.verify(&forged, NOW, scope).map_err(|err| err.kind);
    assert_eq!(forged.err(), Some(TokenErrorKind::BadSignature));
});
