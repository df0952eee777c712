//! `rtpqwencodesdepay`: RTP packets of `X-QWEN3-TTS-CODES` in, codec frames out.

use gst::glib;
use gst::prelude::*;

mod imp;

glib::wrapper! {
    pub struct RtpQwenCodesDepay(ObjectSubclass<imp::RtpQwenCodesDepay>)
        @extends gst_rtp::RTPBaseDepayload, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    Loss::static_type().mark_as_plugin_api(gst::PluginAPIFlags::empty());
    gst::Element::register(
        Some(plugin),
        "rtpqwencodesdepay",
        gst::Rank::MARGINAL,
        RtpQwenCodesDepay::static_type(),
    )
}

/// Values of the `loss` property: what the depayloader does where packets were lost.
#[derive(Debug, Eq, PartialEq, Ord, PartialOrd, Hash, Clone, Copy, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstRtpQwenCodesDepayLoss")]
pub enum Loss {
    /// The lost frames replaced by copies of the last frame received; the decoder goes on.
    #[default]
    #[enum_value(
        name = "Repeat: the last frame received stands in for the lost ones",
        nick = "repeat"
    )]
    Repeat = 0,
    /// The decoder starts fresh at the next packet (its buffer flagged DISCONT).
    #[enum_value(
        name = "Restart: the decoder starts fresh at the next packet",
        nick = "restart"
    )]
    Restart = 1,
}
