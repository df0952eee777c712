//! the server (server/)'s `/codes` messages: text ones parse to a message or an error; binary
//! ones are whole frames of codes inside the codebook or an error that says which code where,
//! never a panic. The first byte chooses which (and, for frames, the codebook count).
#![no_main]

use libfuzzer_sys::fuzz_target;

use qwencodec_protocol::messages as protocol;

use protocol::{FrameError, FrameLayout};

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    if choice & 1 == 0 {
        if let Ok(text) = std::str::from_utf8(rest)
            && let Err(err) = protocol::sender_message(text)
        {
            assert!(err.starts_with("malformed message: "), "{err}");
        }
        return;
    }
    let layout = FrameLayout {
        codebooks: 1 + (choice >> 1) as usize % 16,
        codebook_size: 2048,
    };
    match layout.check(rest) {
        Ok(frames) => {
            assert_eq!(frames * layout.frame_bytes(), rest.len());
            assert!(
                rest.chunks_exact(2)
                    .all(|pair| (0..2048).contains(&i16::from_le_bytes([pair[0], pair[1]])))
            );
        }
        Err(FrameError::NotWholeFrames { bytes, .. }) => {
            assert!(bytes == 0 || bytes % layout.frame_bytes() != 0);
        }
        Err(
            err @ FrameError::OutsideCodebook {
                frame,
                codebook,
                code,
                ..
            },
        ) => {
            let at = 2 * (frame * layout.codebooks + codebook);
            assert_eq!(i16::from_le_bytes([rest[at], rest[at + 1]]), code, "{err}");
            assert!(!(0..2048).contains(&code));
        }
    }
});
