//! the server (server/)'s checks of what a browser's signalling hands webrtcbin: an SDP answer
//! and ICE candidates (`crates/protocol/src/messages.rs`). Any text is taken or refused with a reason,
//! never a panic, and what is taken holds to the grammar the checks promise (libgstsdp and
//! libnice then parse only that). The first byte chooses which, and the candidate's
//! sdpMLineIndex.
#![no_main]

use libfuzzer_sys::fuzz_target;

use qwencodec_protocol::messages as protocol;

use protocol::{MAX_CANDIDATE_BYTES, MAX_SDP_BYTES};

/// Printable ASCII, or a tab.
fn printable(byte: u8) -> bool {
    byte == b'\t' || (b' '..=b'~').contains(&byte)
}

fn assert_candidate_grammar(candidate: &str) {
    assert!(candidate.len() <= MAX_CANDIDATE_BYTES);
    let fields: Vec<&str> = candidate
        .strip_prefix("candidate:")
        .expect("candidate:")
        .split(' ')
        .collect();
    assert!(fields.len() >= 8 && fields.len() % 2 == 0, "{candidate:?}");
    assert!(
        fields
            .iter()
            .all(|field| !field.is_empty() && field.bytes().all(|byte| byte.is_ascii_graphic()))
    );
    assert!(fields[5].parse::<u16>().is_ok());
    assert_eq!(fields[6], "typ");
    assert!(matches!(fields[7], "host" | "srflx" | "prflx" | "relay"));
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let message = if choice & 1 == 0 {
        match protocol::check_answer_sdp(text) {
            Ok(()) => {
                assert!(text.len() <= MAX_SDP_BYTES);
                let lines: Vec<&str> = text
                    .strip_suffix('\n')
                    .unwrap_or(text)
                    .split('\n')
                    .map(|line| line.strip_suffix('\r').unwrap_or(line))
                    .collect();
                assert_eq!(lines[0], "v=0");
                for line in &lines {
                    let bytes = line.as_bytes();
                    assert!(
                        bytes.len() >= 2 && bytes[0].is_ascii_lowercase() && bytes[1] == b'=',
                        "{line:?}"
                    );
                    assert!(bytes.iter().all(|&byte| printable(byte)), "{line:?}");
                    if let Some(candidate) = line.strip_prefix("a=")
                        && candidate.starts_with("candidate:")
                    {
                        assert_candidate_grammar(candidate);
                    }
                }
                let media = lines.iter().filter(|line| line.starts_with("m=")).count();
                assert_eq!(media, protocol::MEDIA_SECTIONS as usize);
            }
            Err(err) => assert!(err.starts_with("the SDP") || err.starts_with("SDP line"), "{err}"),
        }
        serde_json::json!({"type": "answer", "sdp": text})
    } else {
        match protocol::check_ice_candidate(text) {
            Ok(()) => assert_candidate_grammar(text),
            Err(err) => assert!(err.starts_with("the ICE candidate"), "{err}"),
        }
        serde_json::json!({"type": "ice", "candidate": text, "sdpMLineIndex": (choice >> 1) & 1})
    };
    // As /signal takes it, in its JSON message.
    if let Err(err) = protocol::browser_message(&message.to_string()) {
        assert!(err.starts_with("malformed signalling message: "), "{err}");
    }
});
