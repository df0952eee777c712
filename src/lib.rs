//! GStreamer plugin `qwencodec`: decodes Qwen3-TTS speech-codec frames into audio.
//!
//! [`model`] is the streaming decoder itself, [`npy`] reads `.npy` files of codes and
//! [`rtp_codes`] is the RTP payload format of codes with its receiver, all free of GStreamer;
//! the elements and the typefinder adapt them. `rtp_stats` is the RTP elements' `codes-stats`.

use gst::glib;

mod caps;
mod drain_event;
pub mod model;
mod model_log;
mod qwencodecdec;
mod qwencodecparse;
mod rtp_stats;
mod rtpqwencodesdepay;
mod rtpqwencodespay;
mod typefind;

pub use drain_event::{DRAIN_EVENT, drain_event};
/// `.npy` headers of codec frames (a crate of its own, which the fuzz target takes alone).
pub use qwencodec_npy as npy;
/// Codes over RTP: the payload format and a receiver of its packets (a crate of its own, which
/// the fuzz target takes alone).
pub use qwencodec_rtp_codes as rtp_codes;
/// The RTP encoding name of codes over RTP (`rtpqwencodespay`, docs/rtp-codes.md), for an SDP.
pub use qwencodec_rtp_codes::ENCODING_NAME as RTP_CODES_ENCODING_NAME;
/// The version of that payload format that the elements send and read (the SDP's `version=`).
pub use qwencodec_rtp_codes::VERSION as RTP_CODES_VERSION;
#[doc(hidden)]
pub use qwencodecdec::plant_step_panic;

fn plugin_init(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    model_log::install();
    qwencodecdec::register(plugin)?;
    qwencodecparse::register(plugin)?;
    rtpqwencodespay::register(plugin)?;
    rtpqwencodesdepay::register(plugin)?;
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
    // The plugin is not published anywhere yet.
    "Unknown package origin",
    env!("BUILD_REL_DATE")
);
