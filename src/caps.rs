//! The caps of codec frames, which every element of the plugin takes or makes.

use gst::prelude::*;

/// Media type of codec frames: `codebooks` codes (little-endian int16) per frame.
pub const CODES_MEDIA_TYPE: &str = "audio/x-qwen3-tts-codes";

/// Optional fields of codes caps for what the model defines, which a source that knows the model
/// states (the depayloader, from the SDP) so that `rtpqwencodespay` reads them from its input:
/// codes run from 0 to `codebook-size` less one, and `rate` is the audio's sample rate.
pub const CODEBOOK_SIZE_FIELD: &str = "codebook-size";
pub const RATE_FIELD: &str = "rate";

/// An optional integer field of `s` within `range`; an error that names it otherwise.
pub fn bounded_field(
    s: &gst::StructureRef,
    name: &str,
    range: std::ops::RangeInclusive<u32>,
) -> Result<Option<u32>, String> {
    if !s.has_field(name) {
        return Ok(None);
    }
    s.get::<i32>(name)
        .ok()
        .and_then(|value| u32::try_from(value).ok())
        .filter(|value| range.contains(value))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{name} is {}, not an integer from {} to {}",
                s.value(name)
                    .ok()
                    .and_then(|value| value.serialize().ok())
                    .map_or_else(|| "unreadable".into(), |value| value.to_string()),
                range.start(),
                range.end()
            )
        })
}

/// Codec frames of any codebook count, with or without a frame rate (for pad templates: caps
/// without one are a subset, so that a parser that cannot know the rate before a decoder is
/// linked, as decodebin links it, still finds one).
pub fn any_codes_caps() -> gst::caps::Builder<gst::caps::NoFeature> {
    gst::Caps::builder(CODES_MEDIA_TYPE).field("codebooks", gst::IntRange::new(1, i32::MAX))
}

/// The caps an element refused last. Upstream sends refused caps again before each buffer, and
/// the error that names what is wrong with them is posted once for the same caps.
#[derive(Debug, Default)]
pub struct RefusedCaps(std::sync::Mutex<Option<gst::Caps>>);

impl RefusedCaps {
    /// Whether `caps` are refused for the first time in a row: their error is still to post.
    pub fn first_time(&self, caps: &gst::Caps) -> bool {
        let mut refused = self.0.lock().unwrap();
        let first_time = refused.as_ref() != Some(caps);
        *refused = Some(caps.clone());
        first_time
    }

    /// Caps accepted, or the element stopped: the next refusal is posted again.
    pub fn forget(&self) {
        *self.0.lock().unwrap() = None;
    }
}
