//! The latency the element reports, from measured step times, and kept true while it plays.
//!
//! A frame waits for the rest of its step (`chunk-frames - 1` frames), then for the step. The
//! minimum counts a warm step of this stream alone, measured once per model and step size (so
//! elements with the same settings on one model report the same figures). The maximum counts
//! a step of the largest batch this element may join, twice (a batch in flight ahead of it,
//! then its own), and the engine's rejoin grace; that step is estimated as `max-batch` steps
//! alone, as timing a batch of 16 at start would take seconds at the released widths (2.3 s for
//! one-frame steps on a 2-core EPYC). When a step in PLAYING takes longer than the maximum
//! allows, the maximum rises to what was seen and the pipeline is told (a LATENCY message), at
//! most once a second.

use std::time::{Duration, Instant};

use gst::prelude::*;

use crate::model::{DecodeError, Model, REJOIN_GRACE, StepLimits};

/// Raising the maximum to what a slow step took, plus this part of it, keeps the next slightly
/// slower step from raising it again.
const MARGIN: u32 = 4;

const RAISE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(super) struct Latency {
    /// What a frame waits for the rest of its step.
    frames_waited: gst::ClockTime,
    pub(super) min: gst::ClockTime,
    pub(super) max: gst::ClockTime,
    /// When the maximum was last raised.
    raised: Option<Instant>,
}

impl Latency {
    /// The figures for steps of `chunk_frames` under `limits`, from warm steps of the model
    /// (timed now, or earlier for another element).
    pub(super) fn measure(
        model: &Model,
        chunk_frames: usize,
        limits: StepLimits,
    ) -> Result<Self, DecodeError> {
        let (num, den) = model.config().frame_rate();
        let frame = gst::ClockTime::SECOND
            .mul_div_floor(den as u64, num as u64)
            .unwrap();
        let frames_waited = frame * (chunk_frames as u64 - 1);
        let alone = model.warm_step_time(1, chunk_frames, limits.cuda_graphs)?;
        let batch = alone * limits.max_batch as u32;
        let min = frames_waited + clock_time(alone);
        let max = frames_waited + clock_time(REJOIN_GRACE + 2 * batch);
        Ok(Self {
            frames_waited,
            min,
            max,
            raised: None,
        })
    }

    /// After a step that took `step_time` (its wait for other streams' batches included):
    /// whether the maximum rose, because the step went over it.
    pub(super) fn after_step(&mut self, step_time: Duration, now: Instant) -> bool {
        let seen = self.frames_waited + clock_time(step_time);
        if seen <= self.max || self.raised.is_some_and(|raised| now < raised + RAISE_INTERVAL) {
            return false;
        }
        self.max = self.frames_waited + clock_time(step_time + step_time / MARGIN);
        self.raised = Some(now);
        true
    }
}

fn clock_time(duration: Duration) -> gst::ClockTime {
    gst::ClockTime::from_nseconds(duration.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency() -> Latency {
        Latency {
            frames_waited: gst::ClockTime::from_mseconds(80),
            min: gst::ClockTime::from_mseconds(90),
            max: gst::ClockTime::from_mseconds(200),
            raised: None,
        }
    }

    #[test]
    fn a_step_over_the_maximum_raises_it_once_a_second_at_most() {
        let mut latency = latency();
        let start = Instant::now();
        assert!(
            !latency.after_step(Duration::from_millis(120), start),
            "within the maximum"
        );
        assert!(latency.after_step(Duration::from_millis(200), start));
        // 80 ms waited + 200 ms and a quarter.
        assert_eq!(latency.max, gst::ClockTime::from_mseconds(330));
        assert_eq!(
            latency.min,
            gst::ClockTime::from_mseconds(90),
            "the minimum stays"
        );
        let soon = start + Duration::from_millis(500);
        assert!(
            !latency.after_step(Duration::from_millis(400), soon),
            "not twice in a second"
        );
        let later = start + Duration::from_millis(1500);
        assert!(latency.after_step(Duration::from_millis(400), later));
        assert_eq!(latency.max, gst::ClockTime::from_mseconds(580));
    }
}
