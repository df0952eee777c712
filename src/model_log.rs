//! The model's messages (arena growth, batches, CUDA graph recordings) in a GStreamer debug
//! category of their own, `qwencodec-model`: `GST_DEBUG=qwencodec*:5` shows them beside the
//! elements'.

use std::sync::LazyLock;

use crate::model::log::{Level, Sink};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "qwencodec-model",
        gst::DebugColorFlags::empty(),
        Some("Qwen3-TTS decoder model: state arena, batches, CUDA graphs"),
    )
});

fn level(level: Level) -> gst::DebugLevel {
    match level {
        Level::Warning => gst::DebugLevel::Warning,
        Level::Debug => gst::DebugLevel::Debug,
    }
}

pub fn install() {
    crate::model::log::set_sink(Sink {
        enabled: |wanted| CAT.threshold() >= level(wanted),
        write: |wanted, message| {
            CAT.log(
                None::<&gst::Object>,
                level(wanted),
                glib::gstr!("src/model"),
                "qwencodec-model",
                line!(),
                message,
            )
        },
    });
}
