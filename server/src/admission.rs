//! How many sessions this machine serves in real time, and whether it keeps up now.
//!
//! At start: the sessions served, measured from the decoder's own steps ([`real_time_capacity`]),
//! so that a session past that is refused (4429) instead of every session falling behind
//! together. While it runs: [`Capacity`] watches the decoder's batches and the late audio, and
//! refuses a new session while the server is measurably behind (see [`Capacity::refusal`]).
//!
//! A live session at `--chunk-frames` C hands the decoder C frames every C frame durations; N
//! sessions speaking at once are one batched step of N rows. N are served while that step,
//! measured alone, takes at most [`STEP_BUDGET`] of the C frames' time: the rest goes to Opus,
//! RTP and the server's threads, and to what they cost the decoder's threads on shared cores.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gstqwencodec::model::{BatchRun, DecodeError, Model, StepLimits};

/// The part of its frames' time that a step of every session, measured alone, may take: beside
/// the sessions' pipelines (Opus, RTP, WebRTC on the same cores) the decoder's steps run slower
/// than alone, and a budget of the whole frame admits sessions whose audio then comes late. Set
/// against the server's capacity runs with real WebRTC peers (`measurements/README.md`).
pub const STEP_BUDGET: f64 = 0.75;

/// How far back the live signals look: long enough to hold a few steps at any `--chunk-frames`
/// (8 frames are 640 ms), short enough that a server that caught up admits again soon.
pub const WINDOW: Duration = Duration::from_secs(3);

/// The real-time margin below which a new session is refused, unless `--admission-margin`
/// says otherwise: a step of every session taking 80 % of its frames' time leaves too little
/// for one more session's row and its pipeline.
pub const DEFAULT_MARGIN_FLOOR: f64 = 0.2;

/// The sessions served in real time (at least 1, at most `most`), and the warm step time of
/// each batch size measured on the way.
pub fn real_time_capacity(
    model: &Model,
    chunk_frames: usize,
    frame: Duration,
    most: usize,
) -> Result<(usize, Vec<Duration>), DecodeError> {
    let budget = frame.mul_f64(chunk_frames as f64 * STEP_BUDGET);
    let mut steps = Vec::new();
    for rows in 1..=most {
        let step = model.warm_step_time(rows, chunk_frames, true)?;
        steps.push(step);
        if step > budget {
            break;
        }
    }
    let served = steps.iter().take_while(|&&step| step <= budget).count();
    Ok((served.max(1), steps))
}

/// Times, before any session, the batches that the sessions' decoders time as they start, and
/// gives their rows and times: each decoder's latency counts a batch of the streams open on the
/// model rounded up to a power of two (at most its `max-batch`), timed once per shape on the
/// compute thread. Timed while other sessions play, such a batch's steps (several frames' time
/// on a small CPU) would hold up their audio; timed before any, they hold up none.
pub fn time_session_batches(
    model: &Model,
    chunk_frames: usize,
    most: usize,
) -> Result<Vec<(usize, Duration)>, DecodeError> {
    session_batch_rows(most)
        .into_iter()
        .map(|rows| Ok((rows, model.warm_step_time(rows, chunk_frames, true)?)))
        .collect()
}

/// The batches, in rows, that the decoders of up to `most` sessions (the element's limits, which
/// the server leaves as they are) count in their latency.
fn session_batch_rows(most: usize) -> Vec<usize> {
    let limits = StepLimits::default();
    let mut rows: Vec<usize> = (1..=most.max(1))
        .map(|open| limits.latency_batch_rows(open))
        .collect();
    rows.dedup();
    rows
}

/// The server's capacity: the most sessions it admits (measured at start, or `--max-sessions`),
/// and what the decoder and the sessions' audio say of the load now.
pub struct Capacity {
    /// The most sessions admitted.
    pub most: usize,
    /// Whether a session is refused while the server is behind (`--admission measured`).
    live: bool,
    /// The real-time margin below which the server is behind.
    margin_floor: f64,
    /// One frame's audio.
    frame: Duration,
    recent: Mutex<Recent>,
    /// Why no session is admitted any more, once the server drains (SIGTERM).
    draining: Mutex<Option<String>>,
}

/// What `/status` says of the capacity.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub sessions: usize,
    pub most: usize,
    pub headroom: usize,
    /// 1 with the decoder idle, 0 when it takes as long as the audio it makes, below 0 behind.
    pub real_time_margin: f64,
    /// Whether a join now would be admitted (room, and not behind).
    pub admitting: bool,
    /// Why a join now would be refused, if it would.
    pub refusal: Option<String>,
}

impl Capacity {
    /// `live`: refuse while behind (`--admission measured`), not only past `most`.
    pub fn new(most: usize, live: bool, margin_floor: f64, frame: Duration) -> Self {
        Self {
            most,
            live,
            margin_floor,
            frame,
            recent: Mutex::default(),
            draining: Mutex::default(),
        }
    }

    /// Admits no session from now on: the server drains, `why`.
    pub fn drain(&self, why: &str) {
        *self.draining.lock().unwrap() = Some(why.to_owned());
    }

    /// A batch of the decoder's steps that has just ended (`Model::observe_batches`).
    pub fn batch_ran(&self, run: &BatchRun) {
        let now = Instant::now();
        self.lock().batch_ran(now, run, self.frame);
    }

    /// A packet of audio late at the sender (`session::count_late_audio`).
    pub fn audio_late(&self) {
        let now = Instant::now();
        self.lock().audio_late(now);
    }

    /// The decoder's real-time margin now (see [`Recent::margin`]).
    pub fn real_time_margin(&self) -> f64 {
        self.lock().margin(Instant::now())
    }

    /// Why a new session is refused now, with `sessions` open: the server drains, past the
    /// most, or (when live) behind by one of the live signals, named in the reason.
    pub fn refusal(&self, sessions: usize) -> Option<String> {
        if let Some(why) = self.draining.lock().unwrap().clone() {
            return Some(why);
        }
        if sessions >= self.most {
            return Some(format!("the server has its most sessions ({})", self.most));
        }
        if !self.live {
            return None;
        }
        self.lock()
            .behind(Instant::now(), self.margin_floor)
            .map(|why| format!("the server is behind now: {why}"))
    }

    pub fn report(&self, sessions: usize) -> Report {
        let refusal = self.refusal(sessions);
        Report {
            sessions,
            most: self.most,
            headroom: self.most.saturating_sub(sessions),
            real_time_margin: self.real_time_margin(),
            admitting: refusal.is_none(),
            refusal,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The decoder's batches and the late packets of the last [`WINDOW`].
#[derive(Default)]
struct Recent {
    batches: VecDeque<Batch>,
    late: VecDeque<Instant>,
}

struct Batch {
    started: Instant,
    time: Duration,
    /// The audio each of its rows made.
    audio: Duration,
    /// Whether steps were left waiting when it started (more than a batch takes).
    left_steps_waiting: bool,
}

impl Recent {
    fn batch_ran(&mut self, now: Instant, run: &BatchRun, frame: Duration) {
        self.forget_before(now);
        self.batches.push_back(Batch {
            started: now.checked_sub(run.time).unwrap_or(now),
            time: run.time,
            audio: frame * run.frames as u32,
            left_steps_waiting: run.waiting > 0,
        });
    }

    fn audio_late(&mut self, now: Instant) {
        self.forget_before(now);
        self.late.push_back(now);
    }

    fn forget_before(&mut self, now: Instant) {
        let Some(since) = now.checked_sub(WINDOW) else {
            return;
        };
        while self.batches.front().is_some_and(|batch| batch.started < since) {
            self.batches.pop_front();
        }
        while self.late.front().is_some_and(|&late| late < since) {
            self.late.pop_front();
        }
    }

    /// 1 less the decoder's load over the window: the larger of its busy share (the steps' time
    /// over the time since the first of them began, at least one step's audio: its one compute
    /// thread serves every session) and its steps' time over the audio they made (a session
    /// whose steps take longer than their audio falls behind). 1 with no steps in the window.
    fn margin(&mut self, now: Instant) -> f64 {
        self.forget_before(now);
        let Some(first) = self.batches.front() else {
            return 1.0;
        };
        let busy: Duration = self.batches.iter().map(|batch| batch.time).sum();
        let audio: Duration = self.batches.iter().map(|batch| batch.audio).sum();
        let span = now.duration_since(first.started).max(first.audio);
        let busy_share = busy.as_secs_f64() / span.as_secs_f64();
        let per_audio = busy.as_secs_f64() / audio.as_secs_f64();
        1.0 - busy_share.max(per_audio)
    }

    /// Why the server is behind now, if it is: late audio in the window, steps left waiting at
    /// the start of most of the window's batches (at least two), or the margin below `floor`.
    fn behind(&mut self, now: Instant, floor: f64) -> Option<String> {
        let margin = self.margin(now);
        let seconds = WINDOW.as_secs();
        if !self.late.is_empty() {
            return Some(format!(
                "late audio at the sender ({} packets in the last {seconds} s)",
                self.late.len()
            ));
        }
        let waited = self
            .batches
            .iter()
            .filter(|batch| batch.left_steps_waiting)
            .count();
        if waited >= 2 && waited * 2 > self.batches.len() {
            return Some(format!(
                "decode steps left waiting beyond a batch (at {waited} of {} batches in the last {seconds} s)",
                self.batches.len()
            ));
        }
        if margin < floor {
            return Some(format!(
                "the decoder's real-time margin is {margin:.3}, below {floor} (--admission-margin)"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: Duration = Duration::from_millis(80);

    #[test]
    fn the_sessions_decoders_count_batches_of_powers_of_two_up_to_their_max_batch() {
        assert_eq!(session_batch_rows(0), [1]);
        assert_eq!(session_batch_rows(1), [1]);
        assert_eq!(session_batch_rows(5), [1, 2, 4, 8]);
        assert_eq!(session_batch_rows(8), [1, 2, 4, 8]);
        assert_eq!(session_batch_rows(40), [1, 2, 4, 8, 16]);
    }

    fn run(rows: usize, frames: usize, ms: u64, waiting: usize) -> BatchRun {
        BatchRun {
            rows,
            arena_rows: (1..=rows as i64).collect(),
            frames,
            time: Duration::from_millis(ms),
            waiting,
            grace_ran_out: false,
            held: Duration::ZERO,
        }
    }

    /// `recent` after a session's steps of one frame taking `ms`, one every frame for `count`
    /// frames, the last ending at `end`.
    fn speaking(recent: &mut Recent, end: Instant, count: u32, ms: u64, waiting: usize) {
        for index in (0..count).rev() {
            recent.batch_ran(end - FRAME * index, &run(1, 1, ms, waiting), FRAME);
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_margin_is_one_less_the_share_of_real_time_the_steps_take() {
        let start = Instant::now();
        let mut recent = Recent::default();
        assert_eq!(recent.margin(start), 1.0, "no steps: all the room there is");
        // 20 ms steps, one every 80 ms frame: a quarter of real time.
        speaking(&mut recent, start + Duration::from_secs(2), 20, 20, 0);
        let margin = recent.margin(start + Duration::from_secs(2));
        assert!((margin - 0.75).abs() < 0.02, "{margin}");
        // The speech ended: once its steps are out of the window, the room is back.
        assert_eq!(
            recent.margin(start + Duration::from_secs(2) + WINDOW + FRAME),
            1.0
        );
    }

    #[test]
    fn one_step_counts_against_its_own_audio_not_the_whole_window() {
        let start = Instant::now() + WINDOW;
        let mut recent = Recent::default();
        recent.batch_ran(start, &run(1, 4, 160, 0), FRAME);
        // 160 ms for 320 ms of audio, just now.
        assert!(close(recent.margin(start), 0.5), "{}", recent.margin(start));
        // 2 s on, its busy share is small, but its steps still took half their audio's time.
        let later = start + Duration::from_secs(2);
        assert!(close(recent.margin(later), 0.5), "{}", recent.margin(later));
    }

    #[test]
    fn the_window_holds_what_began_within_it_to_its_last_instant() {
        let start = Instant::now() + WINDOW;
        let mut recent = Recent::default();
        // A step of 40 ms that began at `start`, and a packet late at `start`.
        recent.batch_ran(start + Duration::from_millis(40), &run(1, 1, 40, 0), FRAME);
        recent.audio_late(start);
        let edge = start + WINDOW;
        assert!(recent.margin(edge) < 1.0, "the step, a window old, still counts");
        assert!(recent.behind(edge, 0.0).unwrap().contains("late audio"));
        let past = edge + Duration::from_nanos(1);
        assert_eq!(recent.margin(past), 1.0, "past the window: forgotten");
        assert_eq!(recent.behind(past, 0.0), None);
    }

    #[test]
    fn steps_split_into_batches_count_by_the_time_the_decoder_is_busy() {
        let start = Instant::now();
        let mut recent = Recent::default();
        // Two sessions whose steps run apart: 2 steps of 30 ms every 80 ms. Each step took only
        // 3/8 of its audio, but the one compute thread was busy 3/4 of the time.
        let end = start + Duration::from_secs(2);
        for index in (0..20).rev() {
            recent.batch_ran(end - FRAME * index - FRAME / 2, &run(1, 1, 30, 0), FRAME);
            recent.batch_ran(end - FRAME * index, &run(1, 1, 30, 0), FRAME);
        }
        let margin = recent.margin(end);
        assert!((margin - 0.25).abs() < 0.03, "{margin}");
    }

    #[test]
    fn a_decoder_slower_than_real_time_has_a_margin_below_zero() {
        let start = Instant::now();
        let mut recent = Recent::default();
        speaking(&mut recent, start + Duration::from_secs(1), 10, 120, 0);
        assert!(recent.margin(start + Duration::from_secs(1)) < -0.4);
    }

    fn capacity(most: usize, live: bool, floor: f64) -> Capacity {
        Capacity::new(most, live, floor, FRAME)
    }

    /// The bundled test checkpoint, on the CPU in f32.
    fn bundled_model() -> Model {
        let cpu = gstqwencodec::model::parse_device("cpu").unwrap();
        Model::load(
            &crate::config::default_model(),
            cpu,
            gstqwencodec::model::Dtype::F32,
        )
        .unwrap()
    }

    /// The bundled test checkpoint's steps on the CPU: the budget is set against its measured
    /// one-row step, which the model keeps (the same figure at each call), not against a clock.
    #[test]
    fn the_capacity_is_the_rows_whose_measured_step_fits_the_budget_of_their_frames_time() {
        let model = bundled_model();
        let chunk_frames = 2;
        // Frames of an hour: every row count up to the most fits, however busy the machine.
        let hour = Duration::from_secs(3600);
        let (served, steps) = real_time_capacity(&model, chunk_frames, hour, 3).unwrap();
        assert_eq!((served, steps.len()), (3, 3), "{steps:?}");
        for (rows, step) in (1..).zip(&steps) {
            assert_eq!(*step, model.warm_step_time(rows, chunk_frames, true).unwrap());
        }
        // Frames of half the one-row step: the budget of two frames' time is 0.75 of a step (and
        // one of 1.25 or more would hold it). The measuring stops at the first step over the
        // budget, and one session is served all the same.
        let frame = steps[0] / 2;
        let (served, steps) = real_time_capacity(&model, chunk_frames, frame, 3).unwrap();
        assert_eq!((served, steps.len()), (1, 1), "{steps:?}");
    }

    /// The batches timed at start are those the sessions' decoders count in their latency (the
    /// streams open rounded up to a power of two), each with the time the model keeps for it.
    #[test]
    fn the_batches_timed_at_start_are_the_sessions_latency_batches() {
        assert_eq!(session_batch_rows(0), [1]);
        assert_eq!(session_batch_rows(5), [1, 2, 4, 8]);
        let model = bundled_model();
        let timed = time_session_batches(&model, 1, 3).unwrap();
        assert_eq!(timed.iter().map(|&(rows, _)| rows).collect::<Vec<_>>(), [1, 2, 4]);
        for &(rows, time) in &timed {
            assert!(time > Duration::ZERO);
            assert_eq!(time, model.warm_step_time(rows, 1, true).unwrap());
        }
    }

    #[test]
    fn a_draining_server_refuses_every_session_saying_why() {
        let capacity = capacity(2, false, DEFAULT_MARGIN_FLOOR);
        capacity.drain("the server is shutting down");
        assert_eq!(
            capacity.refusal(0).as_deref(),
            Some("the server is shutting down")
        );
        assert!(!capacity.report(0).admitting);
    }

    #[test]
    fn admits_with_room_and_refuses_past_the_most() {
        let capacity = capacity(2, true, DEFAULT_MARGIN_FLOOR);
        assert_eq!(capacity.refusal(0), None);
        assert_eq!(capacity.refusal(1), None);
        assert_eq!(
            capacity.refusal(2).as_deref(),
            Some("the server has its most sessions (2)")
        );
        let report = capacity.report(1);
        assert_eq!((report.sessions, report.most, report.headroom), (1, 2, 1));
        assert!(report.admitting && report.refusal.is_none());
        assert_eq!(report.real_time_margin, 1.0);
        let full = capacity.report(2);
        assert_eq!(full.headroom, 0);
        assert!(!full.admitting);
    }

    #[test]
    fn refuses_while_behind_by_late_audio_and_admits_once_it_is_past() {
        let now = Instant::now() + WINDOW;
        let mut recent = Recent::default();
        recent.audio_late(now);
        recent.audio_late(now);
        assert_eq!(
            recent.behind(now, DEFAULT_MARGIN_FLOOR).as_deref(),
            Some("late audio at the sender (2 packets in the last 3 s)")
        );
        assert_eq!(recent.behind(now + WINDOW + FRAME, DEFAULT_MARGIN_FLOOR), None);
    }

    #[test]
    fn refuses_while_steps_wait_beyond_a_batch_at_most_batches_not_at_one() {
        let end = Instant::now() + WINDOW;
        let mut recent = Recent::default();
        speaking(&mut recent, end, 10, 10, 0);
        // One batch that left a step waiting (a stream's last, shorter step, say): not behind.
        recent.batch_ran(end, &run(1, 1, 10, 1), FRAME);
        assert_eq!(recent.behind(end, DEFAULT_MARGIN_FLOOR), None);
        // The last `waited` of `batches` left steps waiting.
        let left_waiting = |waited: u32, batches: u32| {
            let mut recent = Recent::default();
            for index in (0..batches).rev() {
                let waiting = usize::from(index < waited);
                recent.batch_ran(end - FRAME * index, &run(1, 1, 10, waiting), FRAME);
            }
            recent.behind(end, DEFAULT_MARGIN_FLOOR)
        };
        // The only batch in the window: most batches, but one is not two. Half of them is not
        // most; five of nine is.
        assert_eq!(left_waiting(1, 1), None);
        assert_eq!(left_waiting(2, 4), None);
        assert!(left_waiting(5, 9).unwrap().contains("at 5 of 9 batches"));
        let mut recent = Recent::default();
        speaking(&mut recent, end, 10, 10, 3);
        let why = recent.behind(end, DEFAULT_MARGIN_FLOOR).unwrap();
        assert_eq!(
            why,
            "decode steps left waiting beyond a batch (at 10 of 10 batches in the last 3 s)"
        );
    }

    #[test]
    fn refuses_below_the_margin_floor_and_names_it() {
        let end = Instant::now() + WINDOW;
        let mut recent = Recent::default();
        speaking(&mut recent, end, 20, 20, 0);
        assert_eq!(recent.behind(end, 0.5), None, "a margin of 0.75");
        let why = recent.behind(end, 0.9).unwrap();
        assert!(
            why.starts_with("the decoder's real-time margin is 0.7")
                && why.ends_with("below 0.9 (--admission-margin)"),
            "{why}"
        );
        // One step of 20 ms for a frame of 80 ms, just ended: a margin of exactly 0.75 (a
        // quarter is exact in binary), which a floor of 0.75 does not refuse.
        let mut recent = Recent::default();
        recent.batch_ran(end, &run(1, 1, 20, 0), FRAME);
        assert_eq!(recent.margin(end), 0.75);
        assert_eq!(recent.behind(end, 0.75), None);
    }

    #[test]
    fn without_live_admission_only_the_most_refuses() {
        let capacity = capacity(2, false, 0.99);
        capacity.audio_late();
        capacity.batch_ran(&run(1, 1, 200, 5));
        assert_eq!(capacity.refusal(1), None);
        assert!(capacity.real_time_margin() < 0.0);
        let live = self::capacity(2, true, 0.99);
        live.audio_late();
        assert!(
            live.refusal(1)
                .unwrap()
                .starts_with("the server is behind now: late audio")
        );
    }
}
