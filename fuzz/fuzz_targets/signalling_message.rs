//! the server (server/)'s `/signal` messages: any text parses to a message or an error, never a
//! panic, and an error says what was wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;

use qwencodec_protocol::messages as protocol;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(err) = protocol::browser_message(text) {
        assert!(err.starts_with("malformed signalling message: "), "{err}");
    }
});
