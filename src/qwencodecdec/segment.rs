//! When a new segment ends the stream. A segment that only updates the one before (the same
//! timeline: a live source sending it again, a new stop or position) continues the stream; one
//! that maps positions to other running or stream times (a non-flushing seek, a segment seek
//! looping a file) starts a new one: the frames after it do not follow the frames before.

/// Whether `next` keeps `previous`'s timeline: every position maps to the same running time
/// and the same stream time under both.
pub(super) fn continues(previous: &gst::Segment, next: &gst::Segment) -> bool {
    if previous.format() != next.format()
        || previous.rate() != next.rate()
        || previous.applied_rate() != next.applied_rate()
    {
        return false;
    }
    let same = |a: f64, b: f64| (a - b).abs() < 1.0;
    same(running_origin(previous), running_origin(next)) && same(stream_origin(previous), stream_origin(next))
}

fn raw(value: gst::GenericFormattedValue) -> f64 {
    value.value() as f64
}

/// The running time of position 0 (forward) or the position that maps to the base (reverse):
/// with the rate, it fixes the map from positions to running times.
fn running_origin(segment: &gst::Segment) -> f64 {
    let rate = segment.rate().abs();
    let offset = raw(segment.offset());
    if segment.rate() > 0.0 {
        raw(segment.base()) - (raw(segment.start()) + offset) / rate
    } else {
        raw(segment.base()) + (raw(segment.stop()) - offset) / rate
    }
}

/// The stream time of position 0 (forward) or the same for the stop (reverse).
fn stream_origin(segment: &gst::Segment) -> f64 {
    let applied = segment.applied_rate().abs();
    if segment.applied_rate() > 0.0 {
        raw(segment.time()) - raw(segment.start()) * applied
    } else {
        raw(segment.time()) + raw(segment.stop()) * applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time_segment(start: u64, base: u64, time: u64) -> gst::Segment {
        let mut segment = gst::FormattedSegment::<gst::ClockTime>::new();
        segment.set_start(gst::ClockTime::from_mseconds(start));
        segment.set_base(gst::ClockTime::from_mseconds(base));
        segment.set_time(gst::ClockTime::from_mseconds(time));
        segment.upcast()
    }

    #[test]
    fn the_same_segment_again_or_a_new_stop_continues() {
        gst::init().unwrap();
        let first = time_segment(0, 0, 0);
        assert!(continues(&first, &first.clone()));
        let mut longer = first.clone();
        longer
            .downcast_mut::<gst::ClockTime>()
            .unwrap()
            .set_stop(gst::ClockTime::from_seconds(9));
        assert!(continues(&first, &longer));
        // A later start on the same timeline: the base moved along with it.
        assert!(continues(&first, &time_segment(2000, 2000, 2000)));
    }

    #[test]
    fn a_loop_or_a_non_flushing_seek_is_a_new_timeline() {
        gst::init().unwrap();
        let first = time_segment(0, 0, 0);
        // A segment seek back to the start after 5 s played.
        assert!(!continues(&first, &time_segment(0, 5000, 0)));
        // A non-flushing seek from 3 s to 42 s.
        assert!(!continues(&first, &time_segment(42000, 3000, 42000)));
        // Another rate.
        let mut faster = first.clone();
        faster.downcast_mut::<gst::ClockTime>().unwrap().set_rate(2.0);
        assert!(!continues(&first, &faster));
        // Another format.
        let bytes = gst::FormattedSegment::<gst::format::Bytes>::new().upcast();
        assert!(!continues(&first, &bytes));
    }
}
