//! `rtpqwencodesdepay`: RTP packets of `X-QWEN3-TTS-CODES` in, codec frames out.

use gst::glib;
use gst::prelude::*;

mod imp;

glib::wrapper! {
    pub struct RtpQwenCodesDepay(ObjectSubclass<imp::RtpQwenCodesDepay>)
        @extends gst_rtp::RTPBaseDepayload, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "rtpqwencodesdepay",
        gst::Rank::MARGINAL,
        RtpQwenCodesDepay::static_type(),
    )
}
