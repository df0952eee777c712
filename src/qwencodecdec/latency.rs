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
//! While it plays behind a live source the figures are kept true, and the pipeline told with a
//! LATENCY message (at most once a second): when more streams open on the model than the
//! minimum counted, it rises to a batch of that many rows (its step as timed for another element,
//! else estimated in proportion to the rows timed: no step is timed while others play); and when frames keep coming out later
//! than the minimum (in 3 of the last 8 steps: a busier machine, other streams' large steps), it
//! rises to the longest of them plus a quarter. It never falls while the element runs.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_audio::prelude::*;

use super::imp::{CAT, QwenCodecDec};
use crate::model::{DecodeError, Model, REJOIN_GRACE, StepLimits};

/// A step timed warm on an idle compute thread takes longer among the threads of many streams
/// (their pushes, their sinks: batches of 8 rows of a small model took 12-38 ms on 2 cores
/// against 10 ms timed): the minimum counts this part of it more.
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
    max_batch: usize,
    /// The steps' shape, for step times measured on the model.
    chunk_frames: usize,
    cuda_graphs: bool,
    /// The rows of the batch that the minimum counts, and that batch's step.
    rows: usize,
    step: Duration,
    pub(super) min: gst::ClockTime,
    pub(super) max: gst::ClockTime,
    /// Whether upstream is live (from the last latency query): only then do frames come in
    /// real time, and their delays say anything.
    pub(super) live: bool,
    /// The delays of the last steps' oldest frames that went over the minimum (None: within).
    recent: VecDeque<Option<gst::ClockTime>>,
    /// When the figures last rose.
    raised: Option<Instant>,
}

/// The rows of the batch a step joins with `open` streams on the model.
fn batch_rows(open: usize, max_batch: usize) -> usize {
    open.max(1).next_power_of_two().min(max_batch.max(1))
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
    /// warm steps of the model (timed now, or earlier for another element).
    pub(super) fn measure(
        model: &Model,
        chunk_frames: usize,
        limits: StepLimits,
        read_ahead_frames: usize,
    ) -> Result<Self, DecodeError> {
        let (num, den) = model.config().frame_rate();
        let frame = gst::ClockTime::SECOND
            .mul_div_floor(den as u64, num as u64)
            .unwrap();
        let rows = batch_rows(model.open_streams(), limits.max_batch);
        let step = model.warm_step_time(rows, chunk_frames, limits.cuda_graphs)?;
        let mut latency = Self {
            frames_waited: frame * (chunk_frames as u64 - 1),
            read_ahead: frame * read_ahead_frames as u64,
            max_batch: limits.max_batch,
            chunk_frames,
            cuda_graphs: limits.cuda_graphs,
            rows,
            step,
            min: gst::ClockTime::ZERO,
            max: gst::ClockTime::ZERO,
            live: false,
            recent: VecDeque::new(),
            raised: None,
        };
        latency.set_min(latency.frames_waited + step_delay(rows, step));
        Ok(latency)
    }

    /// The rows of the batch the minimum counts.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    fn set_min(&mut self, min: gst::ClockTime) {
        self.min = min;
        self.max = min + self.read_ahead;
    }

    /// After a step whose oldest frame came out `delay` after it arrived, with `open_streams`
    /// on the model, whose step times measured so far `measured` tells (by rows, step frames
    /// and CUDA graphs): whether the figures rose.
    pub(super) fn after_step(
        &mut self,
        delay: Duration,
        open_streams: usize,
        measured: impl Fn(usize, usize, bool) -> Option<Duration>,
        now: Instant,
    ) -> bool {
        if !self.live {
            return false;
        }
        let delay = clock_time(delay);
        self.recent.push_back((delay > self.min).then_some(delay));
        if self.recent.len() > OVERRUN_WINDOW {
            self.recent.pop_front();
        }
        if self.raised.is_some_and(|raised| now < raised + RAISE_INTERVAL) {
            return false;
        }
        let mut wanted = self.min;
        let rows = batch_rows(open_streams, self.max_batch);
        let step = measured(rows, self.chunk_frames, self.cuda_graphs)
            .unwrap_or_else(|| self.step * rows as u32 / self.rows as u32);
        if rows > self.rows {
            wanted = wanted.max(self.frames_waited + step_delay(rows, step));
        }
        let overruns: Vec<gst::ClockTime> = self.recent.iter().flatten().copied().collect();
        if overruns.len() >= OVERRUNS {
            let longest = overruns.iter().max().copied().unwrap_or_default();
            wanted = wanted.max(longest + longest / MARGIN as u64);
        }
        if wanted <= self.min {
            return false;
        }
        if rows > self.rows {
            self.step = step;
            self.rows = rows;
        }
        self.set_min(wanted);
        self.recent.clear();
        self.raised = Some(now);
        true
    }
}

fn clock_time(duration: Duration) -> gst::ClockTime {
    gst::ClockTime::from_nseconds(duration.as_nanos() as u64)
}

impl QwenCodecDec {
    /// After a step of the step thread on `model` whose oldest frame came out `delay` after it
    /// arrived: when the figures rose (see [`Latency`]), the pipeline is told.
    pub(super) fn check_latency(&self, delay: Duration, model: &Model) {
        let open_streams = model.open_streams();
        let mut latency = self.latency();
        let Some(figures) = latency.as_mut() else { return };
        let measured = |rows, frames, graphs| model.measured_step_time(rows, frames, graphs);
        if !figures.after_step(delay, open_streams, measured, Instant::now()) {
            return;
        }
        let (min, max, rows) = (figures.min, figures.max, figures.rows());
        drop(latency);
        gst::info!(
            CAT,
            imp = self,
            "Frames came out {:.1} ms after they arrived, {} streams are open on the model: the \
             latency is now {} to {} (batches of {} rows)",
            delay.as_secs_f64() * 1e3,
            open_streams,
            min,
            max,
            rows
        );
        // Posts the LATENCY message.
        self.obj().set_latency(min, max);
    }

    /// Keeps whether upstream is live from a latency query's answer.
    pub(super) fn note_upstream_live(&self, live: bool) {
        if let Some(figures) = self.latency().as_mut() {
            figures.live = live;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency() -> Latency {
        let mut latency = Latency {
            frames_waited: gst::ClockTime::from_mseconds(80),
            read_ahead: gst::ClockTime::from_mseconds(1280),
            max_batch: 16,
            chunk_frames: 1,
            cuda_graphs: false,
            rows: 1,
            step: Duration::from_millis(10),
            min: gst::ClockTime::ZERO,
            max: gst::ClockTime::ZERO,
            live: true,
            recent: VecDeque::new(),
            raised: None,
        };
        latency.set_min(gst::ClockTime::from_mseconds(90));
        latency
    }

    /// No step time measured on the model.
    fn none(_: usize, _: usize, _: bool) -> Option<Duration> {
        None
    }

    #[test]
    fn batches_count_two_steps_rounded_up_to_a_power_of_two_of_rows() {
        assert_eq!(batch_rows(0, 16), 1);
        assert_eq!(batch_rows(1, 16), 1);
        assert_eq!(batch_rows(3, 16), 4);
        assert_eq!(batch_rows(8, 16), 8);
        assert_eq!(batch_rows(40, 16), 16);
        assert_eq!(batch_rows(40, 5), 5);
        assert_eq!(batch_rows(8, 1), 1);
        assert_eq!(
            step_delay(1, Duration::from_millis(10)),
            gst::ClockTime::from_mseconds(15)
        );
        assert_eq!(
            step_delay(8, Duration::from_millis(10)),
            gst::ClockTime::from_mseconds(32)
        );
        let latency = latency();
        assert_eq!(
            latency.max,
            gst::ClockTime::from_mseconds(90 + 1280),
            "the read-ahead held on top"
        );
    }

    #[test]
    fn sustained_overruns_raise_the_minimum_once_a_second_at_most() {
        let mut latency = latency();
        let start = Instant::now();
        let late = Duration::from_millis(120);
        assert!(!latency.after_step(late, 1, none, start), "one late step");
        assert!(
            !latency.after_step(Duration::from_millis(85), 1, none, start),
            "within the minimum"
        );
        assert!(!latency.after_step(late, 1, none, start), "two late steps");
        assert!(
            latency.after_step(Duration::from_millis(200), 1, none, start),
            "three of the last eight"
        );
        // The longest, 200 ms, and a quarter.
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(250));
        assert_eq!(latency.max, gst::ClockTime::from_mseconds(250 + 1280));
        let soon = start + Duration::from_millis(500);
        for _ in 0..4 {
            assert!(
                !latency.after_step(Duration::from_millis(400), 1, none, soon),
                "not twice in a second"
            );
        }
        let later = start + Duration::from_millis(1500);
        assert!(latency.after_step(Duration::from_millis(400), 1, none, later));
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(500));
    }

    #[test]
    fn late_steps_scattered_among_many_on_time_do_not_raise_it() {
        let mut latency = latency();
        let now = Instant::now();
        for step in 0..40 {
            let delay = if step % 4 == 0 { 150 } else { 30 };
            assert!(!latency.after_step(Duration::from_millis(delay), 1, none, now));
        }
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(90));
    }

    #[test]
    fn more_streams_on_the_model_raise_it_to_their_batch() {
        let mut latency = latency();
        let now = Instant::now();
        assert!(!latency.after_step(Duration::from_millis(20), 1, none, now));
        // 6 streams: a batch of 8 rows, its step estimated as 8 of one row (80 ms), two of them,
        // half as much again and the grace.
        assert!(latency.after_step(Duration::from_millis(20), 6, none, now));
        assert_eq!(latency.rows(), 8);
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(80 + 242));
        let later = now + Duration::from_secs(2);
        assert!(
            !latency.after_step(Duration::from_millis(20), 8, none, later),
            "the same batch"
        );
        // 9 streams: a batch of 16, as timed for another element (100 ms): 200, 100 and 2.
        let timed = |rows, _, _| (rows == 16).then_some(Duration::from_millis(100));
        assert!(latency.after_step(Duration::from_millis(20), 9, timed, later));
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(80 + 302));
        let later = later + Duration::from_secs(2);
        assert!(
            !latency.after_step(Duration::from_millis(20), 2, none, later),
            "never lower"
        );
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(382));
    }

    #[test]
    fn nothing_changes_behind_a_source_that_is_not_live() {
        let mut latency = latency();
        latency.live = false;
        let now = Instant::now();
        for _ in 0..8 {
            assert!(!latency.after_step(Duration::from_secs(1), 16, none, now));
        }
        assert_eq!(latency.min, gst::ClockTime::from_mseconds(90));
    }
}
