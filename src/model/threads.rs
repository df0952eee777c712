//! How many threads the CPU's compute thread runs each op on, chosen from what the process
//! gets, not from the cores it sees.
//!
//! libtorch's ops and our kernels split each op over a team of threads that meet at a barrier
//! when it ends. Beside a busy neighbour the scheduler gives one of them to the neighbour, and
//! the others wait for it at every barrier of the hundreds in a step: two threads on two shared
//! cores ran a step several times slower than one (docs/performance.md, "Beside neighbours").
//! So the team size follows the steps' own times: the compute thread steps on its current
//! count and, for a few steps, tries the next count down when its steps slow down (a neighbour
//! came) or up when they speed up (one left), keeping the faster; on fewer threads than it has,
//! it also tries more now and then, backing off while the tries lose. On a quiet machine on
//! every core it tries nothing: a try is a slower step, late for a live stream. Counts are tried per step shape (rows
//! and frames: a wider step gains more from threads); a shape starts at the fastest count of its
//! warm steps (the engine times them on each count, most first, while fewer are faster), or
//! where the last shape went. A count given by the embedder (`OMP_NUM_THREADS`, the server's `--cores`, the
//! element's `compute-threads`) pins it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Steps at another count in a try; the first of them is not counted (the team changes size).
const TRY_STEPS: u32 = 3;
/// Steps between tries, at first and after a change; doubled after each try that lost.
const FIRST_INTERVAL: u32 = 16;
const MAX_INTERVAL: u32 = 256;
/// A tried count replaces the current one when its steps take this much less time.
const MARGIN: f64 = 0.1;
/// The current count's step time moving this far from what it was when chosen calls a try at
/// the next step (a neighbour came or went).
const DRIFT: f64 = 0.3;
/// Weight of a new step in the current count's running mean.
const SMOOTHING: f64 = 0.2;

/// A step's shape: rows and frames.
pub type Shape = (usize, usize);

/// The choice of thread count for each step shape, from the steps' times.
#[derive(Debug)]
pub struct ThreadPolicy {
    /// The counts that may be chosen, most first: the most threads, halved down to 1.
    ladder: Vec<usize>,
    pinned: Option<usize>,
    shapes: HashMap<Shape, ShapeChoice>,
    /// The rung chosen last, for shapes not seen yet.
    last_rung: usize,
}

#[derive(Debug, Clone)]
struct ShapeChoice {
    rung: usize,
    /// Running mean of the step time at each rung, in seconds, where measured.
    means: Vec<Option<f64>>,
    /// The current rung's mean when it was chosen or last confirmed.
    baseline: Option<f64>,
    /// The step time moved from the baseline: try this rung at the next step.
    due: Option<usize>,
    /// Not seeded, and no step of it taken yet: its first step pays one-off costs (a team of
    /// another size, fresh buffers) and is not counted.
    fresh: bool,
    since_try: u32,
    interval: u32,
    /// The rung on trial, the steps it has run, and the sum of the counted ones' times.
    trial: Option<(usize, u32, f64)>,
    /// The next try goes down (else up) where both are possible.
    try_down: bool,
}

impl ThreadPolicy {
    /// A policy over 1 to `most` threads, or pinned at `pinned`.
    pub fn new(most: usize, pinned: Option<usize>) -> Self {
        let mut ladder = vec![most.max(1)];
        while let Some(&last) = ladder.last()
            && last > 1
        {
            ladder.push(last / 2);
        }
        Self {
            ladder,
            pinned,
            shapes: HashMap::new(),
            last_rung: 0,
        }
    }

    /// Pins the count (`Some`), or lets the steps choose it again (`None`).
    pub fn pin(&mut self, threads: Option<usize>) {
        self.pinned = threads.map(|threads| threads.max(1));
    }

    pub fn pinned(&self) -> Option<usize> {
        self.pinned
    }

    /// The threads the next step of `shape` runs on.
    pub fn threads_for(&mut self, shape: Shape) -> usize {
        if let Some(pinned) = self.pinned {
            return pinned;
        }
        let rungs = self.ladder.len();
        let choice = self.shape(shape);
        let periodic = choice.rung > 0 && choice.since_try >= choice.interval;
        if choice.trial.is_none()
            && let Some(next) = choice.due.take()
        {
            choice.trial = Some((next, 0, 0.0));
        } else if choice.trial.is_none() && periodic && rungs > 1 {
            let down = choice.rung + 1 < rungs;
            let up = choice.rung > 0;
            let next = match (down, up) {
                (true, true) if choice.try_down => choice.rung + 1,
                (true, true) => choice.rung - 1,
                (true, false) => choice.rung + 1,
                _ => choice.rung - 1,
            };
            choice.try_down = !choice.try_down;
            choice.trial = Some((next, 0, 0.0));
        }
        let rung = choice.trial.map_or(choice.rung, |(rung, ..)| rung);
        self.ladder[rung]
    }

    /// The counts a step may run on, most first.
    pub fn counts(&self) -> Vec<usize> {
        match self.pinned {
            Some(pinned) => vec![pinned],
            None => self.ladder.clone(),
        }
    }

    /// Warm steps of `shape` took these times on these counts: its steps start on the fastest
    /// (where not pinned); that count and its time.
    pub fn seed(&mut self, shape: Shape, measured: &[(usize, Duration)]) -> (usize, Duration) {
        let &(fastest, time) = measured
            .iter()
            .min_by_key(|(_, time)| *time)
            .expect("a count timed");
        if self.pinned.is_some() {
            return (fastest, time);
        }
        let ladder = self.ladder.clone();
        let choice = self.shape(shape);
        for &(threads, time) in measured {
            if let Some(rung) = ladder.iter().position(|&count| count == threads) {
                choice.means[rung] = Some(time.as_secs_f64());
            }
        }
        if let Some(rung) = ladder.iter().position(|&count| count == fastest) {
            choice.rung = rung;
            choice.baseline = Some(time.as_secs_f64());
            choice.since_try = 0;
            choice.interval = FIRST_INTERVAL;
            choice.trial = None;
            choice.due = None;
            choice.fresh = false;
            self.last_rung = rung;
        }
        (fastest, time)
    }

    /// A step of `shape` on `threads` threads took `time`.
    pub fn record(&mut self, shape: Shape, threads: usize, time: Duration) {
        if self.pinned.is_some() {
            return;
        }
        let Some(rung) = self.ladder.iter().position(|&count| count == threads) else {
            return;
        };
        let seconds = time.as_secs_f64();
        let choice = self.shape(shape);
        let chosen = match choice.trial {
            Some((trial, steps, sum)) if trial == rung => {
                let (steps, sum) = (steps + 1, if steps == 0 { sum } else { sum + seconds });
                if steps < TRY_STEPS {
                    choice.trial = Some((trial, steps, sum));
                    return;
                }
                choice.trial = None;
                choice.since_try = 0;
                let tried = sum / f64::from(TRY_STEPS - 1);
                choice.means[trial] = Some(tried);
                match choice.means[choice.rung] {
                    Some(current) if tried >= current * (1.0 - MARGIN) => {
                        choice.interval = (choice.interval * 2).min(MAX_INTERVAL);
                        return;
                    }
                    _ => {
                        choice.rung = trial;
                        choice.baseline = Some(tried);
                        choice.interval = FIRST_INTERVAL;
                        trial
                    }
                }
            }
            _ if rung == choice.rung => {
                if std::mem::take(&mut choice.fresh) {
                    return;
                }
                let mean = match choice.means[rung] {
                    Some(mean) => mean + SMOOTHING * (seconds - mean),
                    None => seconds,
                };
                choice.means[rung] = Some(mean);
                choice.since_try += 1;
                let baseline = *choice.baseline.get_or_insert(mean);
                if (mean - baseline).abs() > DRIFT * baseline {
                    // Something changed beside us: a step that slowed down may go faster on
                    // fewer threads (a neighbour took a core), one that sped up on more (it left).
                    // Tried at the next step; the other way would only be slower.
                    let next = match mean > baseline {
                        true => Some(rung + 1).filter(|&next| next < choice.means.len()),
                        false => rung.checked_sub(1),
                    };
                    choice.baseline = Some(mean);
                    choice.interval = FIRST_INTERVAL;
                    choice.due = next;
                }
                return;
            }
            // A step at a count neither current nor on trial (the policy was pinned meanwhile).
            _ => return,
        };
        self.last_rung = chosen;
    }

    fn shape(&mut self, shape: Shape) -> &mut ShapeChoice {
        let (rungs, rung) = (self.ladder.len(), self.last_rung);
        self.shapes.entry(shape).or_insert_with(|| ShapeChoice {
            rung,
            means: vec![None; rungs],
            baseline: None,
            due: None,
            fresh: true,
            since_try: 0,
            interval: FIRST_INTERVAL,
            trial: None,
            try_down: true,
        })
    }
}

/// The CPU compute thread's policy, made at its first step from libtorch's thread count (the
/// cores, or `OMP_NUM_THREADS`, which pins it). Only the compute thread uses it.
static CPU: Mutex<Option<ThreadPolicy>> = Mutex::new(None);

fn cpu_policy() -> MutexGuard<'static, Option<ThreadPolicy>> {
    CPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn with_cpu_policy<R>(work: impl FnOnce(&mut ThreadPolicy) -> R) -> R {
    let mut policy = cpu_policy();
    let policy = policy.get_or_insert_with(|| {
        let most = tch::get_num_threads().max(1) as usize;
        let pinned = std::env::var_os("OMP_NUM_THREADS").is_some_and(|value| !value.is_empty());
        ThreadPolicy::new(most, pinned.then_some(most))
    });
    work(policy)
}

/// On the CPU's compute thread: has libtorch compute a step of `shape` on the threads the
/// policy gives it (a count on trial included); those threads, for [`step_done`].
pub fn enter_step(shape: Shape) -> usize {
    let threads = with_cpu_policy(|policy| policy.threads_for(shape));
    set(shape, threads);
    threads
}

/// On the CPU's compute thread: the thread counts a step may run on, most first (the pinned
/// one alone where pinned).
pub fn counts() -> Vec<usize> {
    with_cpu_policy(|policy| policy.counts())
}

unsafe extern "C" {
    fn qwencodec_set_thread_team(threads: i32);
}

/// On the CPU's compute thread: has libtorch compute on `threads` threads (this thread's team
/// only: see `executor.cpp`).
pub fn enter(threads: usize) {
    if tch::get_num_threads() as usize != threads {
        // SAFETY: sets the calling thread's OpenMP and MKL thread counts.
        unsafe { qwencodec_set_thread_team(threads.clamp(1, i32::MAX as usize) as i32) };
    }
}

/// On the CPU's compute thread: warm steps of `shape` took these times on these thread counts;
/// its steps start on the fastest, whose time this gives.
pub fn seed(shape: Shape, measured: &[(usize, Duration)]) -> Duration {
    let (threads, time) = with_cpu_policy(|policy| policy.seed(shape, measured));
    super::log::debug(format_args!(
        "steps of {} rows of {} frames start on {threads} threads (warm: {})",
        shape.0,
        shape.1,
        measured
            .iter()
            .map(|(threads, time)| format!("{:.1} ms on {threads}", time.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    time
}

fn set(shape: Shape, threads: usize) {
    if tch::get_num_threads() as usize != threads {
        super::log::debug(format_args!(
            "steps of {} rows of {} frames compute on {threads} threads",
            shape.0, shape.1
        ));
        enter(threads);
    }
}

/// On the CPU's compute thread: a step that [`enter_step`] set up took `time`.
pub fn step_done(shape: Shape, threads: usize, time: Duration) {
    with_cpu_policy(|policy| policy.record(shape, threads, time));
}

/// On the CPU's compute thread: pins its threads at `threads`; what it computes on now.
pub fn pin(threads: usize) -> usize {
    with_cpu_policy(|policy| policy.pin(Some(threads)));
    enter(threads);
    tch::get_num_threads() as usize
}

/// Whether the CPU's threads are pinned (else they follow the steps' times).
pub fn pinned() -> bool {
    with_cpu_policy(|policy| policy.pinned().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = (1, 1);

    /// Runs `steps` steps of `shape` whose time at each count `time` gives; the counts used.
    fn run(
        policy: &mut ThreadPolicy,
        shape: Shape,
        steps: usize,
        mut time: impl FnMut(usize) -> f64,
    ) -> Vec<usize> {
        (0..steps)
            .map(|_| {
                let threads = policy.threads_for(shape);
                policy.record(shape, threads, Duration::from_secs_f64(time(threads)));
                threads
            })
            .collect()
    }

    /// A quiet machine: two threads take 10 ms a step, one 17 ms.
    fn quiet(threads: usize) -> f64 {
        if threads == 2 { 0.010 } else { 0.017 }
    }

    /// Beside a busy neighbour: two threads wait at every barrier, one runs on.
    fn beside_a_neighbour(threads: usize) -> f64 {
        if threads == 2 { 0.027 } else { 0.015 }
    }

    #[test]
    fn the_ladder_halves_down_to_one_thread() {
        assert_eq!(ThreadPolicy::new(8, None).ladder, [8, 4, 2, 1]);
        assert_eq!(ThreadPolicy::new(6, None).ladder, [6, 3, 1]);
        assert_eq!(ThreadPolicy::new(1, None).ladder, [1]);
        assert_eq!(ThreadPolicy::new(0, None).ladder, [1]);
    }

    /// The engine's warm steps, on each count.
    fn seed(policy: &mut ThreadPolicy, time: impl Fn(usize) -> f64) {
        let measured = [2, 1].map(|threads| (threads, Duration::from_secs_f64(time(threads))));
        policy.seed(SHAPE, &measured);
    }

    #[test]
    fn on_a_quiet_machine_every_core_computes_and_nothing_is_tried() {
        let mut policy = ThreadPolicy::new(2, None);
        seed(&mut policy, quiet);
        let counts = run(&mut policy, SHAPE, 2000, quiet);
        assert!(counts.iter().all(|&threads| threads == 2));
        // Nor unseeded.
        let counts = run(&mut policy, (3, 1), 2000, quiet);
        assert!(counts.iter().all(|&threads| threads == 2));
    }

    #[test]
    fn beside_a_neighbour_one_thread_is_kept_with_tries_backing_off() {
        let mut policy = ThreadPolicy::new(2, None);
        seed(&mut policy, beside_a_neighbour);
        let counts = run(&mut policy, SHAPE, 2000, beside_a_neighbour);
        assert_eq!(counts[0], 1);
        let on_two = counts.iter().filter(|&&threads| threads == 2).count();
        // Tries after 16, 32, 64, 128 and then every 256 steps, 3 steps each.
        assert!((3..=3 * 12).contains(&on_two), "{on_two} steps on two threads");
        assert_eq!(*counts.last().unwrap(), 1);
    }

    #[test]
    fn when_the_neighbour_leaves_every_core_computes_again() {
        let mut policy = ThreadPolicy::new(2, None);
        seed(&mut policy, beside_a_neighbour);
        run(&mut policy, SHAPE, 1000, beside_a_neighbour);
        // Within one longest interval and a try.
        let counts = run(&mut policy, SHAPE, (MAX_INTERVAL + 2 * TRY_STEPS) as usize, quiet);
        assert_eq!(*counts.last().unwrap(), 2, "{counts:?}");
    }

    #[test]
    fn a_neighbour_that_comes_is_noticed_sooner_than_the_longest_interval() {
        let mut policy = ThreadPolicy::new(2, None);
        seed(&mut policy, quiet);
        run(&mut policy, SHAPE, 2000, quiet);
        // The running mean leaves the baseline by 30 % within a few steps, and a try follows.
        let counts = run(&mut policy, SHAPE, 40, beside_a_neighbour);
        assert!(
            counts.iter().rev().take(10).all(|&threads| threads == 1),
            "{counts:?}"
        );
    }

    #[test]
    fn a_new_shapes_slow_first_steps_call_no_try_on_a_quiet_machine() {
        let mut policy = ThreadPolicy::new(2, None);
        seed(&mut policy, quiet);
        // A batch shape no warm step timed: its first steps pay one-off costs, then it runs at
        // its speed, a speed-up on every core that fewer threads could only slow.
        let shape = (3, 1);
        let mut step = 0;
        let counts = run(&mut policy, shape, 200, |threads| {
            step += 1;
            quiet(threads) * [3.0, 1.5].get(step - 1).copied().unwrap_or(1.0)
        });
        assert!(counts.iter().all(|&threads| threads == 2), "{counts:?}");
    }

    #[test]
    fn on_one_thread_a_busier_neighbour_calls_no_try_of_more() {
        let mut policy = ThreadPolicy::new(2, None);
        seed(&mut policy, beside_a_neighbour);
        // Fewer steps than the first interval: only the slow-down could call a try.
        let mut step = 0;
        let counts = run(&mut policy, SHAPE, 12, |threads| {
            step += 1;
            beside_a_neighbour(threads) * if step > 4 { 3.0 } else { 1.0 }
        });
        assert!(counts.iter().all(|&threads| threads == 1), "{counts:?}");
    }

    #[test]
    fn a_new_shape_starts_where_the_last_choice_was() {
        let mut policy = ThreadPolicy::new(4, None);
        // Two threads are the fastest: four wait for each other, one computes alone.
        let time = |threads: usize| [0.0, 0.014, 0.011, 0.0, 0.030][threads];
        let measured = [4, 2, 1].map(|threads| (threads, Duration::from_secs_f64(time(threads))));
        policy.seed(SHAPE, &measured);
        run(&mut policy, SHAPE, 100, time);
        assert_eq!(policy.threads_for(SHAPE), 2);
        assert_eq!(policy.threads_for((4, 1)), 2);
    }

    #[test]
    fn warm_steps_seed_the_choice() {
        let mut policy = ThreadPolicy::new(2, None);
        assert_eq!(policy.counts(), [2, 1]);
        let ms = Duration::from_millis;
        assert_eq!(policy.seed(SHAPE, &[(2, ms(27)), (1, ms(15))]), (1, ms(15)));
        assert_eq!(policy.threads_for(SHAPE), 1);
        // A new shape starts where the last seeded one did.
        assert_eq!(policy.threads_for((2, 1)), 1);
        assert_eq!(policy.seed((1, 4), &[(2, ms(10)), (1, ms(17))]), (2, ms(10)));
        assert_eq!(policy.threads_for((1, 4)), 2);
        policy.pin(Some(1));
        assert_eq!(policy.counts(), [1]);
    }

    #[test]
    fn a_pinned_count_never_moves() {
        let mut policy = ThreadPolicy::new(2, Some(2));
        let counts = run(&mut policy, SHAPE, 500, beside_a_neighbour);
        assert!(counts.iter().all(|&threads| threads == 2));
        policy.pin(None);
        // On every core, a neighbour is noticed when the step time moves.
        run(&mut policy, SHAPE, 20, quiet);
        let counts = run(&mut policy, SHAPE, 100, beside_a_neighbour);
        assert_eq!(*counts.last().unwrap(), 1);
        policy.pin(Some(3));
        assert_eq!(policy.threads_for(SHAPE), 3);
    }
}
