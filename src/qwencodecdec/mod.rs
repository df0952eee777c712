//! `qwencodecdec`: Qwen3-TTS codec frames in, audio out.

use gst::glib;
use gst::prelude::*;

// The element's parts. `imp` is the subclass: properties, pads, caps, events, queries and the
// element's state; `load`, `flow` and `imp`'s own latency block extend it. The others know
// nothing of the subclass: each is one concern it uses.
/// Downstream: each step's audio pushed under the base class's stream lock, drains, resets.
mod flow;
mod imp;
/// The latency figures: measured from warm steps, raised when frames come out late.
mod latency;
/// The model loaded at NULL→READY; each READY→PAUSED's stream decoder, warmed up.
mod load;
/// When a new segment ends the stream (a new timeline) and when it continues it.
mod segment;
/// The properties' values and the `stats` counters.
mod settings;
/// The stream's step thread: frames queued from the streaming thread, decoded in steps.
mod step_thread;

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

impl From<TailStrategy> for crate::model::TailStrategy {
    fn from(strategy: TailStrategy) -> Self {
        match strategy {
            TailStrategy::Eager => Self::Eager,
            TailStrategy::Pad => Self::Pad,
        }
    }
}

impl From<Dtype> for crate::model::Dtype {
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
    TailStrategy::static_type().mark_as_plugin_api(gst::PluginAPIFlags::empty());
    Dtype::static_type().mark_as_plugin_api(gst::PluginAPIFlags::empty());
    gst::Element::register(
        Some(plugin),
        "qwencodecdec",
        gst::Rank::PRIMARY,
        QwenCodecDec::static_type(),
    )
}

/// Has `element`, a `qwencodecdec`, panic in its step thread's next step: for tests of what a
/// panic there does (an element error, no hang). Not for applications.
#[doc(hidden)]
pub fn plant_step_panic(element: &gst::Element) {
    use gst::subclass::prelude::ObjectSubclassIsExt;
    if let Some(element) = element.downcast_ref::<QwenCodecDec>() {
        element.imp().plant_step_panic();
    }
}
