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
        // The same segment again after a loop (its origins far from zero).
        let looped = time_segment(0, 5000, 0);
        assert!(continues(&looped, &looped.clone()));
    }

    /// The same timeline, moved on, at another rate, through an offset, backwards, or with an
    /// applied rate: each continues, and each with its running or stream times a second off
    /// does not.
    #[test]
    fn the_same_timeline_continues_at_any_rate() {
        gst::init().unwrap();
        let ms = gst::ClockTime::from_mseconds;
        let segment = |rate: f64,
                       applied: f64,
                       (start, stop): (u64, u64),
                       base: u64,
                       time: u64,
                       offset: u64|
         -> gst::Segment {
            let mut segment = gst::FormattedSegment::<gst::ClockTime>::new();
            segment.set_rate(rate);
            segment.set_applied_rate(applied);
            segment.set_start(ms(start));
            segment.set_stop(ms(stop));
            segment.set_base(ms(base));
            segment.set_time(ms(time));
            segment.set_offset(ms(offset));
            segment.upcast()
        };
        let pairs = [
            // Twice as fast: 2 s of positions played in 1 s.
            (segment(2.0, 1.0, (0, 9000), 0, 0, 0), [2000, 9000, 1000, 2000, 0]),
            // The running time offset by as much as the base moved.
            (segment(1.0, 1.0, (0, 9000), 0, 0, 0), [0, 9000, 1000, 0, 1000]),
            // Backwards from 10 s at twice the speed: 4 s of positions played in 2 s, and an
            // offset of 2 s taken from the base.
            (segment(-2.0, 1.0, (0, 10000), 0, 0, 0), [0, 6000, 3000, 0, 2000]),
            // Positions that are twice the stream time's (an applied rate of 2).
            (segment(1.0, 2.0, (0, 9000), 0, 0, 0), [2000, 9000, 2000, 4000, 0]),
            // Stream time counted back from the stop, twice as fast (an applied rate of -2).
            (segment(1.0, -2.0, (0, 10000), 0, 0, 0), [0, 8000, 0, 4000, 0]),
        ];
        for (first, [start, stop, base, time, offset]) in pairs {
            let (rate, applied) = (first.rate(), first.applied_rate());
            let next = segment(rate, applied, (start, stop), base, time, offset);
            assert!(
                continues(&first, &next),
                "rate {rate}, applied rate {applied}: {next:?}"
            );
            // Running times a second off, or stream times.
            for off in [
                segment(rate, applied, (start, stop), base + 1000, time, offset),
                segment(rate, applied, (start, stop), base, time + 1000, offset),
            ] {
                assert!(
                    !continues(&first, &off),
                    "rate {rate}, applied rate {applied}: {off:?}"
                );
            }
        }
    }

    /// Positions map to times in nanoseconds: a timeline one nanosecond off is another one.
    #[test]
    fn a_timeline_a_nanosecond_off_is_another() {
        gst::init().unwrap();
        let first = time_segment(0, 0, 0);
        let mut later = first.clone();
        later
            .downcast_mut::<gst::ClockTime>()
            .unwrap()
            .set_base(gst::ClockTime::from_nseconds(1));
        assert!(!continues(&first, &later));
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
