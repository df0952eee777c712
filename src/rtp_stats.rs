//! The `codes-stats` property of `rtpqwencodespay` and `rtpqwencodesdepay`: the element's own
//! counts, beside its base class's `stats` (sequence number, RTP time, clock rate, …).

use gst::glib;
use gst::prelude::*;

/// The property's name.
pub const PROPERTY: &str = "codes-stats";

/// The read-only `codes-stats` property, `blurb` naming what it counts.
pub fn pspec(blurb: &str) -> glib::ParamSpec {
    glib::ParamSpecBoxed::builder::<gst::Structure>(PROPERTY)
        .nick("Codes statistics")
        .blurb(blurb)
        .read_only()
        .build()
}

/// A structure named `name` of `counts`.
pub fn structure(name: &str, counts: &[(&str, u64)]) -> gst::Structure {
    let mut stats = gst::Structure::new_empty(name);
    for &(field, count) in counts {
        stats.set(field, count);
    }
    stats
}
