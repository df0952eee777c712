//! The latency the element reports, from measured step times, and kept true while it plays.
//!
//! A frame waits for the rest of its step (`chunk-frames - 1` frames), then for the step. Alone
//! on its model that is one warm step. Where other streams of the model may batch with it, its
//! frame may come just after a batch started without it: it waits for that batch, then for its
//! own, so the minimum counts two steps of the batch it joins, half as much again for the
//! threads of many streams (see [`SCHEDULING`]), and the engine's rejoin grace.
//! That batch has as many rows as streams are open on the model at READY→PAUSED (at most
//! `max-batch`), rounded up to a power of two; its step is timed once per model and shape, so
//! elements with the same settings on one model report the same figures, and the last element
//! of a pipeline to start counts them all (a pipeline takes the largest minimum of its sinks).
//!
//! The maximum is what the element can hold on top: the frames that may wait for the decoder
//! before upstream waits (its read-ahead).
//!
//! Behind a live source, a step may wait in the engine for the model's other live streams as
//! long as one of the two steps the minimum counts, without their margin ([`Latency::batch_hold`]).
//!
//! While it plays behind a live source the minimum is kept true: when frames keep coming out
//! later than it allows after they reached the element (or after their time, for frames that
//! came early; in 3 of the last 8 steps: a busier machine,
//! more streams batching with it, other streams' backlogs in large steps), it rises to the
//! longest of those delays plus a quarter, and the pipeline is told with a LATENCY message, at
//! most once a second. It never falls while the element runs.
//!
//! With `processing-latency` set, that time stands for the measured steps and their margin: the
//! minimum is the frames a step waits for and it, and stays as it is.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use gst::prelude::*;

use crate::model::{DecodeError, Model, REJOIN_GRACE, StepLimits};

/// A step timed warm on an idle compute thread takes longer among the threads of many streams
/// (their pushes, their sinks; docs/element.md, "Latency", has the figures): the minimum counts
/// this part of it more.
const SCHEDULING: u32 = 2;

/// Raising the minimum to what a late frame took, plus this part of it, keeps the next
/// slightly later frame from raising it again.
const MARGIN: u32 = 4;

/// Overruns in the last steps that make a sustained one.
const OVERRUNS: usize = 3;
const OVERRUN_WINDOW: usize = 8;

const RAISE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(super) struct Latency {
    /// What a frame waits for the rest of its step.
    frames_waited: gst::ClockTime,
    /// The frames the element holds before upstream waits.
    read_ahead: gst::ClockTime,
    /// The rows of the batch that the minimum counts.
    rows: usize,
    pub(super) min: gst::ClockTime,
    pub(super) max: gst::ClockTime,
    /// Whether upstream is live (from the last latency query): only then do frames come in real
    /// time, and their delays say anything.
    live: bool,
    /// The delays of the last steps' oldest frames that went over the minimum (None: within).
    recent: VecDeque<Option<gst::ClockTime>>,
    /// When the figures last rose.
    raised: Option<Instant>,
    /// Set by `processing-latency`: the minimum never rises.
    fixed: bool,
}

/// What a frame waits for its step in a batch of `rows` whose step takes `step` when timed,
/// with the margin: alone, its step; else a batch without it and its own, and the grace.
fn step_delay(rows: usize, step: Duration) -> gst::ClockTime {
    let (steps, grace) = if rows == 1 {
        (step, Duration::ZERO)
    } else {
        (2 * step, REJOIN_GRACE)
    };
    clock_time(steps + steps / SCHEDULING + grace)
}

impl Latency {
    /// The figures for steps of `chunk_frames` under `limits`, holding `read_ahead_frames`, from
    /// warm steps of the model (timed now, or earlier for another element), or from
    /// `processing`, the time a frame waits for its step, where the application fixed it.
    pub(super) fn measure(
        model: &Model,
        chunk_frames: usize,
        limits: StepLimits,
        read_ahead_frames: usize,
        processing: Option<gst::ClockTime>,
    ) -> Result<Self, DecodeError> {
        let (num, den) = model.config().frame_rate();
        let frame = gst::ClockTime::SECOND
            .mul_div_floor(den as u64, num as u64)
            .unwrap();
        let rows = limits.latency_batch_rows(model.open_streams());
        if let Some(processing) = processing {
            return Ok(Self::fixed(
                frame,
                chunk_frames,
                read_ahead_frames,
                rows,
                processing,
            ));
        }
        let step = model.warm_step_time(rows, chunk_frames, limits.cuda_graphs)?;
        Ok(Self::new(frame, chunk_frames, read_ahead_frames, rows, step))
    }

    /// As [`Latency::new`], with the time a frame waits for its step fixed at `processing`.
    fn fixed(
        frame: gst::ClockTime,
        chunk_frames: usize,
        read_ahead_frames: usize,
        rows: usize,
        processing: gst::ClockTime,
    ) -> Self {
        let mut latency = Self::new(frame, chunk_frames, read_ahead_frames, rows, Duration::ZERO);
        latency.set_min(latency.frames_waited + processing);
        latency.fixed = true;
        latency
    }

    /// The figures for frames of `frame` in steps of `chunk_frames`, holding
    /// `read_ahead_frames`, in batches of `rows` whose step takes `step`.
    fn new(
        frame: gst::ClockTime,
        chunk_frames: usize,
        read_ahead_frames: usize,
        rows: usize,
        step: Duration,
    ) -> Self {
        let mut latency = Self {
            frames_waited: frame * (chunk_frames as u64 - 1),
            read_ahead: frame * read_ahead_frames as u64,
            rows,
            min: gst::ClockTime::ZERO,
            max: gst::ClockTime::ZERO,
            live: false,
            recent: VecDeque::new(),
            raised: None,
            fixed: false,
        };
        latency.set_min(latency.frames_waited + step_delay(rows, step));
        latency
    }

    /// The rows of the batch the minimum counts.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    fn set_min(&mut self, min: gst::ClockTime) {
        self.min = min;
        self.max = min + self.read_ahead;
    }

    /// After a step whose oldest frame's audio was out `delay` after the frame reached the
    /// element (or after its time, if later): whether the minimum rose.
    pub(super) fn after_step(&mut self, delay: gst::ClockTime, now: Instant) -> bool {
        if !self.live || self.fixed {
            return false;
        }
        self.recent.push_back((delay > self.min).then_some(delay));
        if self.recent.len() > OVERRUN_WINDOW {
            self.recent.pop_front();
        }
        if self.raised.is_some_and(|raised| now < raised + RAISE_INTERVAL) {
            return false;
        }
        let overruns: Vec<gst::ClockTime> = self.recent.iter().flatten().copied().collect();
        if overruns.len() < OVERRUNS {
            return false;
        }
        let longest = overruns.iter().max().copied().unwrap_or_default();
        self.set_min(longest + longest / MARGIN as u64);
        self.recent.clear();
        self.raised = Some(now);
        true
    }

    /// How long a step may wait in the engine for the steps of the model's other live streams
    /// (`StreamDecoder::set_batch_hold`): the minimum counts two steps of the batch a frame
    /// joins, one of them a batch in flight that it may come just after, and half as much again
    /// for scheduling; with none in flight, its step may wait one step for others to join its
    /// batch, the margin kept (held for one and a half steps, four sessions of the server
    /// underran more often than without a hold, while its pacing gave a step 20 ms before its
    /// audio was late: docs/many-streams.md). Nothing behind a source that is not live, whose
    /// frames come as fast as it can give them.
    pub(super) fn batch_hold(&self) -> Duration {
        if !self.live {
            return Duration::ZERO;
        }
        let steps = Duration::from_nanos(self.min.saturating_sub(self.frames_waited).nseconds());
        // Two steps and half as much again (`SCHEDULING`): one step is a third.
        steps.saturating_sub(REJOIN_GRACE) * SCHEDULING / (2 * (SCHEDULING + 1))
    }

    /// From a latency query's answer: whether upstream is live.
    pub(super) fn note_query(&mut self, live: bool) {
        self.live = live;
    }
}

fn clock_time(duration: Duration) -> gst::ClockTime {
    gst::ClockTime::from_nseconds(duration.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(value: u64) -> gst::ClockTime {
        gst::ClockTime::from_mseconds(value)
    }

    /// Steps of two 80 ms frames, alone on the model, 10 ms each: a minimum of 80 + 15 ms; 16
    /// frames read ahead.
    fn latency() -> Latency {
        let mut latency = Latency::new(ms(80), 2, 16, 1, Duration::from_millis(10));
        latency.note_query(true);
        latency
    }

    #[test]
    fn batches_count_two_steps_rounded_up_to_a_power_of_two_of_rows() {
        let batch_rows = |open, max_batch| {
            StepLimits {
                max_batch,
                ..StepLimits::default()
            }
            .latency_batch_rows(open)
        };
        assert_eq!(batch_rows(0, 16), 1);
        assert_eq!(batch_rows(1, 16), 1);
        assert_eq!(batch_rows(3, 16), 4);
        assert_eq!(batch_rows(8, 16), 8);
        assert_eq!(batch_rows(40, 16), 16);
        assert_eq!(batch_rows(40, 5), 5);
        assert_eq!(batch_rows(8, 1), 1);
        assert_eq!(step_delay(1, Duration::from_millis(10)), ms(15));
        assert_eq!(step_delay(8, Duration::from_millis(10)), ms(32));
        let latency = latency();
        assert_eq!(latency.min, ms(80 + 15), "the frame waited and the step");
        assert_eq!(latency.max, ms(95 + 1280), "the read-ahead held on top");
        assert_eq!(latency.rows(), 1);
        let batched = Latency::new(ms(80), 1, 8, batch_rows(3, 16), Duration::from_millis(10));
        assert_eq!(batched.rows(), 4);
        assert_eq!(
            batched.min,
            ms(30) + clock_time(REJOIN_GRACE),
            "two steps, half again, the grace"
        );
        assert_eq!(batched.max, batched.min + ms(640));
    }

    /// The edges of each rule: a delay at the minimum is within it; the window holds the last 8
    /// steps exactly; a second raise may come exactly a second after the first.
    #[test]
    fn each_rule_holds_at_its_edge() {
        let now = Instant::now();
        let mut at_min = latency();
        for _ in 0..OVERRUN_WINDOW {
            assert!(
                !at_min.after_step(at_min.min, now),
                "at the minimum is not over it"
            );
        }

        // Overruns at the first and the last two of 8 steps: three in the window.
        let mut in_window = latency();
        assert!(!in_window.after_step(ms(120), now));
        for _ in 0..OVERRUN_WINDOW - 3 {
            assert!(!in_window.after_step(ms(30), now));
        }
        assert!(!in_window.after_step(ms(120), now));
        assert!(in_window.after_step(ms(120), now), "three overruns in 8 steps");

        // Overruns at the first and the last two of 9 steps: the first has left the window.
        let mut past_window = latency();
        assert!(!past_window.after_step(ms(120), now));
        for _ in 0..OVERRUN_WINDOW - 2 {
            assert!(!past_window.after_step(ms(30), now));
        }
        assert!(!past_window.after_step(ms(120), now));
        assert!(
            !past_window.after_step(ms(120), now),
            "two overruns in the last 8 steps"
        );

        // Raised at `now`; again exactly a second later.
        let mut raised = latency();
        for _ in 0..OVERRUNS - 1 {
            assert!(!raised.after_step(ms(120), now));
        }
        assert!(raised.after_step(ms(120), now));
        for _ in 0..OVERRUNS - 1 {
            assert!(!raised.after_step(ms(300), now + Duration::from_millis(999)));
        }
        assert!(raised.after_step(ms(300), now + RAISE_INTERVAL));
        assert_eq!(raised.min, ms(375));
    }

    #[test]
    fn sustained_overruns_raise_the_minimum_once_a_second_at_most() {
        let mut latency = latency();
        let start = Instant::now();
        assert!(!latency.after_step(ms(120), start), "one late step");
        assert!(!latency.after_step(ms(85), start), "within the minimum");
        assert!(!latency.after_step(ms(120), start), "two late steps");
        assert!(latency.after_step(ms(200), start), "three of the last eight");
        // The longest, 200 ms of this element's, and a quarter.
        assert_eq!(latency.min, ms(250));
        assert_eq!(latency.max, ms(250 + 1280));
        let soon = start + Duration::from_millis(500);
        for _ in 0..4 {
            assert!(!latency.after_step(ms(400), soon), "not twice in a second");
        }
        let later = start + Duration::from_millis(1500);
        assert!(latency.after_step(ms(400), later));
        assert_eq!(latency.min, ms(500));
    }

    #[test]
    fn late_steps_scattered_among_many_on_time_do_not_raise_it() {
        let mut latency = latency();
        let now = Instant::now();
        for step in 0..40 {
            let delay = if step % 4 == 0 { 150 } else { 30 };
            assert!(!latency.after_step(ms(delay), now));
        }
        assert_eq!(latency.min, ms(95));
    }

    /// A live stream's step may wait one of the two steps its minimum counts (without their
    /// margin, the grace and the frames its step waits for), and follows a risen minimum.
    #[test]
    fn a_live_step_may_be_held_for_one_of_the_steps_its_minimum_counts() {
        let mut latency = Latency::new(ms(80), 2, 8, 4, Duration::from_millis(10));
        assert_eq!(latency.min, ms(80 + 30) + clock_time(REJOIN_GRACE));
        assert_eq!(latency.batch_hold(), Duration::ZERO, "not live: never held");
        latency.note_query(true);
        assert_eq!(latency.batch_hold(), Duration::from_millis(10), "the warm step");
        let now = Instant::now();
        for _ in 0..OVERRUNS {
            latency.after_step(ms(200), now);
        }
        assert_eq!(latency.min, ms(250));
        assert_eq!(
            latency.batch_hold(),
            (Duration::from_millis(170) - REJOIN_GRACE) / 3
        );
    }

    /// `processing-latency` stands for the step and its margin, and the minimum stays.
    #[test]
    fn a_fixed_processing_latency_is_the_minimum_and_never_rises() {
        let mut latency = Latency::fixed(ms(80), 2, 16, 4, ms(40));
        latency.note_query(true);
        assert_eq!(
            latency.min,
            ms(80 + 40),
            "the frame waited and the processing latency"
        );
        assert_eq!(latency.max, ms(120 + 1280), "the read-ahead held on top");
        let now = Instant::now();
        for _ in 0..2 * OVERRUN_WINDOW {
            assert!(!latency.after_step(gst::ClockTime::SECOND, now));
        }
        assert_eq!(latency.min, ms(120));
    }

    #[test]
    fn nothing_changes_behind_a_source_that_is_not_live() {
        let mut latency = latency();
        latency.note_query(false);
        let now = Instant::now();
        for _ in 0..8 {
            assert!(!latency.after_step(gst::ClockTime::SECOND, now));
        }
        assert_eq!(latency.min, ms(95));
    }
}
