//! `qwencodecparse`: `.npy` files or raw streams of codec frames in, timestamped frames out.

use gst::glib;
use gst::prelude::*;

mod imp;
mod layout;

glib::wrapper! {
    pub struct QwenCodecParse(ObjectSubclass<imp::QwenCodecParse>)
        @extends gst_base::BaseParse, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "qwencodecparse",
        gst::Rank::PRIMARY,
        QwenCodecParse::static_type(),
    )
}
