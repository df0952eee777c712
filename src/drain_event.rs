//! The plugin's custom event that ends an utterance without EOS: `qwencodecdec` decodes what it
//! holds, and `rtpqwencodespay` marks the next packet as an utterance's first.

/// The name of the custom downstream event that drains `qwencodecdec`: see [`drain_event`].
pub const DRAIN_EVENT: &str = "qwencodec-drain";

/// A serialized custom downstream event that makes `qwencodecdec` decode the frames it holds
/// (the tail, by its tail strategy) and push their audio at once, then decode the next frame as
/// a fresh stream: the end of an utterance on a live stream, without EOS. Other elements pass
/// it on.
pub fn drain_event() -> gst::Event {
    gst::event::CustomDownstream::new(gst::Structure::new_empty(DRAIN_EVENT))
}

/// Whether `event` is the plugin's drain event ([`drain_event`]).
pub fn is_drain_event(event: &gst::EventRef) -> bool {
    event.type_() == gst::EventType::CustomDownstream
        && event.structure().is_some_and(|s| s.name() == DRAIN_EVENT)
}
