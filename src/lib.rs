//! GStreamer plugin `qwencodec`: decodes Qwen3-TTS speech-codec frames into audio.
//!
//! [`model`] is the streaming decoder itself and [`npy`] reads `.npy` files of codes, both free
//! of GStreamer; the elements and the typefinder adapt them.

use gst::glib;

pub mod model;
pub mod npy;
mod qwencodecdec;
mod qwencodecparse;
mod typefind;

fn plugin_init(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    qwencodecdec::register(plugin)?;
    qwencodecparse::register(plugin)?;
    typefind::register(plugin)
}

gst::plugin_define!(
    qwencodec,
    env!("CARGO_PKG_DESCRIPTION"),
    plugin_init,
    concat!(env!("CARGO_PKG_VERSION"), "-", env!("COMMIT_ID")),
    "MIT/X11",
    env!("CARGO_PKG_NAME"),
    env!("CARGO_PKG_NAME"),
    env!("CARGO_PKG_REPOSITORY"),
    env!("BUILD_REL_DATE")
);
