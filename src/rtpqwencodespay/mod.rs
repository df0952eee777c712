//! `rtpqwencodespay`: codec frames in, RTP packets of `X-QWEN3-TTS-CODES` out.

use gst::glib;
use gst::prelude::*;

mod imp;

glib::wrapper! {
    pub struct RtpQwenCodesPay(ObjectSubclass<imp::RtpQwenCodesPay>)
        @extends gst_rtp::RTPBasePayload, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "rtpqwencodespay",
        gst::Rank::MARGINAL,
        RtpQwenCodesPay::static_type(),
    )
}
