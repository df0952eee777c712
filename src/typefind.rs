//! Recognises `.npy` files of codec frames, so that decodebin and playbin plug `qwencodecparse`.

use gst::glib;

use crate::npy::{self, HeaderRead};

/// The caps of a `.npy` file; `codebooks` is added when the header describes codes.
pub const NPY_MEDIA_TYPE: &str = "application/x-npy";

/// Suggests `application/x-npy, codebooks=Q` with certainty for the header of an integer array
/// of shape (T, Q) or (1, T, Q). Any other `.npy` file (floats, another shape) is suggested as
/// possible only, without `codebooks`, so that any other typefinder that knows such a file
/// takes it; where none does, the parser then says what is wrong with it rather than playback
/// failing with an unknown type.
fn find(typefind: &mut gst::TypeFind) {
    let mut wanted = 10;
    loop {
        let Some(bytes) = typefind.peek(0, wanted) else {
            return;
        };
        match npy::read_header(bytes) {
            Ok(HeaderRead::Complete(header)) => {
                let caps = gst::Caps::builder(NPY_MEDIA_TYPE)
                    .field("codebooks", header.format.codebooks as i32)
                    .build();
                typefind.suggest(gst::TypeFindProbability::Maximum, &caps);
                return;
            }
            // Each round asks for more bytes, at most the header length limit.
            Ok(HeaderRead::Incomplete { needed }) if needed as u32 > wanted => wanted = needed as u32,
            Ok(HeaderRead::Incomplete { .. }) | Err(npy::HeaderError::NotNpy) => return,
            Err(_) => {
                typefind.suggest(
                    gst::TypeFindProbability::Possible,
                    &gst::Caps::new_empty_simple(NPY_MEDIA_TYPE),
                );
                return;
            }
        }
    }
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::TypeFind::register(
        Some(plugin),
        "qwencodec_npy",
        // Files of codes are certain and end the search; others are only possible.
        gst::Rank::SECONDARY,
        Some("npy"),
        Some(&gst::Caps::new_empty_simple(NPY_MEDIA_TYPE)),
        find,
    )
}
