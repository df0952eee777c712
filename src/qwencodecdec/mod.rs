//! `qwencodecdec`: Qwen3-TTS codec frames in, audio out.

use gst::glib;
use gst::prelude::*;

use crate::model;

mod flow;
mod imp;
mod latency;
mod load;
mod segment;
mod settings;
mod step_thread;

/// The name of the custom downstream event that drains `qwencodecdec`: see [`drain_event`].
pub const DRAIN_EVENT: &str = "qwencodec-drain";

/// A serialized custom downstream event that makes `qwencodecdec` decode the frames it holds
/// (the tail, by its tail strategy) and push their audio at once, then decode the next frame as
/// a fresh stream: the end of an utterance on a live stream, without EOS. Other elements pass
/// it on.
pub fn drain_event() -> gst::Event {
    gst::event::CustomDownstream::new(gst::Structure::new_empty(DRAIN_EVENT))
}

/// Values of the `tail-strategy` property.
#[derive(Debug, Eq, PartialEq, Ord, PartialOrd, Hash, Clone, Copy, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstQwenCodecDecTailStrategy")]
pub enum TailStrategy {
    #[default]
    #[enum_value(name = "Eager: decode the last frames one at a time", nick = "eager")]
    Eager = 0,
    #[enum_value(name = "Pad: decode one padded step and trim its audio", nick = "pad")]
    Pad = 1,
}

/// Values of the `dtype` property.
#[derive(Debug, Eq, PartialEq, Ord, PartialOrd, Hash, Clone, Copy, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstQwenCodecDecDtype")]
pub enum Dtype {
    #[default]
    #[enum_value(name = "float32", nick = "f32")]
    F32 = 0,
    #[enum_value(name = "bfloat16", nick = "bf16")]
    Bf16 = 1,
    #[enum_value(name = "float16", nick = "f16")]
    F16 = 2,
}

impl From<TailStrategy> for model::TailStrategy {
    fn from(strategy: TailStrategy) -> Self {
        match strategy {
            TailStrategy::Eager => Self::Eager,
            TailStrategy::Pad => Self::Pad,
        }
    }
}

impl From<Dtype> for model::Dtype {
    fn from(dtype: Dtype) -> Self {
        match dtype {
            Dtype::F32 => Self::F32,
            Dtype::Bf16 => Self::Bf16,
            Dtype::F16 => Self::F16,
        }
    }
}

glib::wrapper! {
    pub struct QwenCodecDec(ObjectSubclass<imp::QwenCodecDec>)
        @extends gst_audio::AudioDecoder, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    #[cfg(feature = "doc")]
    {
        TailStrategy::static_type().mark_as_plugin_api(gst::PluginAPIFlags::empty());
        Dtype::static_type().mark_as_plugin_api(gst::PluginAPIFlags::empty());
    }
    gst::Element::register(
        Some(plugin),
        "qwencodecdec",
        gst::Rank::PRIMARY,
        QwenCodecDec::static_type(),
    )
}
