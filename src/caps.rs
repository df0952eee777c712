//! The caps of codec frames, which every element of the plugin takes or makes.

/// Media type of codec frames: `codebooks` codes (little-endian int16) per frame.
pub const CODES_MEDIA_TYPE: &str = "audio/x-qwen3-tts-codes";

/// Codec frames of any codebook count, with or without a frame rate (for pad templates: caps
/// without one are a subset, so that a parser that cannot know the rate before a decoder is
/// linked, as decodebin links it, still finds one).
pub fn any_codes_caps() -> gst::caps::Builder<gst::caps::NoFeature> {
    gst::Caps::builder(CODES_MEDIA_TYPE).field("codebooks", gst::IntRange::new(1, i32::MAX))
}
