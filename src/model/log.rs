//! What the model has to say to whoever embeds it (arena growth, batches, CUDA graph
//! recordings and their failures): written to a sink the embedder installs, such as the
//! plugin's GStreamer debug category; nowhere without one. The model stays free of GStreamer.

use std::fmt;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Warning,
    Debug,
}

/// Where the model's messages go.
pub struct Sink {
    /// Whether messages of a level are wanted (they are not even formatted otherwise).
    pub enabled: fn(Level) -> bool,
    pub write: fn(Level, fmt::Arguments<'_>),
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Installs the sink for the process; the first one installed stays.
pub fn set_sink(sink: Sink) {
    let _ = SINK.set(sink);
}

fn write(level: Level, message: fmt::Arguments<'_>) {
    if let Some(sink) = SINK.get()
        && (sink.enabled)(level)
    {
        (sink.write)(level, message);
    }
}

pub(crate) fn warning(message: fmt::Arguments<'_>) {
    write(Level::Warning, message);
}

pub(crate) fn debug(message: fmt::Arguments<'_>) {
    write(Level::Debug, message);
}
