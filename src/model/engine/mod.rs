//! Steps of many streams computed together. Every stream of a loaded model hands its steps to
//! the model's engine, which runs the steps waiting at that moment with the same frame count
//! as one batched step: one pass over the weights for all of them.
//!
//! The engine never waits for a batch to fill: the first stream to find it idle runs the steps
//! waiting then (its own at least), on the device's compute thread, while the steps that
//! arrive meanwhile queue; when it is done, one of their streams runs those. So a lone stream
//! runs at once, and batches form by themselves as load grows. One exception keeps them whole:
//! the streams of the batch that just ended are waited for, up to [`REJOIN_GRACE`], as they hand
//! over their next step. Streams that decode as fast as they can are back within microseconds;
//! without it, streams stepping together split into two cohorts that take turns, each batch
//! half as large. A lone stream is its own last batch, back at once: it never waits.
//!
//! Live streams hand over a step each frame (or chunk) at phases of their own: run as they
//! come, four such streams cost four one-row steps a frame where one batch of four would do.
//! A step may carry a hold ([`Step::hold`], the part of its stream's latency that allows for a
//! batch in flight): the next batch then waits, up to the earliest hold of its waiting steps,
//! until every stream that holds its steps has one waiting, and the streams fall into step.
//!
//! The streams' states are rows of one arena (see [`arena`]): a step runs on rows that follow
//! one another in place, and selects others and puts them back. On CUDA, batched steps
//! replay graphs that the engine records per bucket of rows and step size (see
//! [`batch_graphs`]).

mod arena;
mod batch_graphs;
mod cuda_graph;

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use super::executor;
use super::log;
use super::network::{Network, State, StepTables};
use super::threads;
use arena::{Arena, RowAssignment};
use batch_graphs::BatchGraphs;

pub use arena::Row;
pub use batch_graphs::MAX_GRAPHS;

/// One stream's step as the engine runs it.
pub struct Step {
    /// The stream's arena row, whose number the step reads when its batch runs (a shrink may
    /// move it while the step waits).
    pub row: Row,
    /// Codes of `frames` whole frames, frame-major, checked against the codebook size.
    pub codes: Vec<i16>,
    pub frames: usize,
    /// The largest batch this step may join (1: alone).
    pub max_rows: usize,
    /// Whether its batch may replay a CUDA graph (it does when every row allows it).
    pub cuda_graphs: bool,
    /// The stream's first step since it started: it goes ahead of the others, so that a new
    /// stream's first audio does not wait for other streams' backlog.
    pub first: bool,
    /// Whether the row is cleared first (silence in its contexts, an empty KV window): a new
    /// stream's row, or one reset, cleared on the compute thread as part of the step rather
    /// than in a wait of its own for the batch in flight.
    pub clear: bool,
    /// How long after it is handed over the step may wait for the steps of the model's other
    /// live streams, to run in one batch with them (zero: as soon as the engine is free). The
    /// stream is one the engine waits for while it hands over held steps.
    pub hold: Duration,
}

impl Step {
    /// Whether the step may be held for other streams' (a hold, and a batch it may share).
    fn holds(&self) -> bool {
        self.hold > Duration::ZERO && self.max_rows > 1
    }
}

/// What a step gives back: its audio, how many rows its batch had, and whether the batch
/// replayed a CUDA graph. A failed step may leave its row half updated.
pub struct StepDone {
    pub audio: Result<Vec<f32>, tch::TchError>,
    pub rows: usize,
    pub graph: bool,
}

/// A batch the engine ran, for whoever watches (see [`Engine::observe`]).
#[derive(Debug, Clone)]
pub struct BatchRun {
    pub rows: usize,
    /// The arena rows the batch stepped, in the batch's order (read on the compute thread as
    /// it ran; a later shrink may move them).
    pub arena_rows: Vec<i64>,
    pub frames: usize,
    /// The batch's step on the compute thread.
    pub time: Duration,
    /// Steps that waited for the next batch when this one started.
    pub waiting: usize,
    /// Whether it started when the rejoin grace ran out, before every stream of the batch
    /// before had handed over its next step (one had ended, or was late).
    pub grace_ran_out: bool,
    /// How long it waited, once the engine was free, for live streams' steps (see [`Step::hold`]).
    pub held: Duration,
}

type Observer = Box<dyn Fn(&BatchRun) + Send + Sync>;

/// The CUDA graphs a model holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphReport {
    pub graphs: usize,
    /// Device memory reserved while they were recorded.
    pub bytes: u64,
    /// Why recording one failed, if it did (steps then run eagerly).
    pub failure: Option<String>,
    /// Graphs dropped because the state arena moved (grew or shrank), to be recorded again.
    pub dropped: usize,
}

/// How long the next batch waits for the streams of the last one to hand over their next step.
pub const REJOIN_GRACE: Duration = Duration::from_millis(2);

/// The most frames, over all its rows, that one batch computes on `device`. On the CPU a batch
/// of more runs no faster per frame, and a stream that starts waits for the whole batch in
/// flight: 8 keep that wait at one 8-frame step (`docs/many-streams.md`
/// has the figures). On CUDA, where a step is launch-bound far beyond that, the cap is only a
/// guard.
pub fn max_batch_frames(device: tch::Device) -> usize {
    match device {
        tch::Device::Cuda(_) => 1024,
        _ => 8,
    }
}

/// How long after its last step a stream that holds its steps is still waited for: longer than
/// a step period of any usual chunk size (8 frames are 640 ms), so that a stream in a pause
/// between utterances costs the others at most their hold for a while.
const HELD_STREAM_WINDOW: Duration = Duration::from_secs(2);

/// Warm steps timed per shape by [`Engine::warm_step_time`] (after one that is not).
const TIMED_STEPS: usize = 5;

/// The warm step time from the `times` of [`TIMED_STEPS`] steps: the second fastest. A step
/// held by the scheduler (another process's threads, a page fault) only takes longer, so all
/// but two of them may be held without raising the figure, and one freak fast step does not
/// lower it.
fn settled_step_time(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[1.min(times.len() - 1)]
}

pub struct Engine {
    queue: Mutex<Queue>,
    /// Signalled when a step is handed over, for a batch waiting for the last one's streams.
    step_arrived: Condvar,
    /// Signalled when a batch ends: its streams take their results, and one of the streams
    /// still waiting runs the next batch.
    batch_done: Condvar,
    /// What steps compute with; used on the compute thread only.
    rows: Mutex<Rows>,
    /// Who holds which arena row: new streams take a free one without the compute thread.
    row_assignment: RowAssignment,
    /// Bytes of one stream's row, once the arena has rows.
    row_bytes: AtomicUsize,
    /// The rejoin grace in nanoseconds: [`REJOIN_GRACE`] unless a test sets it.
    rejoin_grace: AtomicU64,
    /// Warm step times measured, by (rows, frames, whether graphs may replay).
    step_times: Mutex<HashMap<(usize, usize, bool), Duration>>,
    /// Told of every batch run (a server's metrics).
    observers: Mutex<Vec<Observer>>,
}

struct Rows {
    arena: Arena,
    /// RoPE tables and masks per frame count, made on first use.
    tables: HashMap<usize, StepTables>,
    /// On CUDA.
    graphs: Option<BatchGraphs>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Job>,
    done: HashMap<u64, StepDone>,
    running: bool,
    next_id: u64,
    /// Rows of the batch that ended last, and the steps handed over since it ended.
    last_rows: usize,
    arrived_since: usize,
    /// The streams that hold their steps ([`Step::hold`]), by row id, and when each last
    /// handed one over.
    held_streams: HashMap<usize, Instant>,
}

struct Job {
    id: u64,
    step: Step,
    handed_over: Instant,
}

impl Engine {
    pub fn new(device: tch::Device) -> Self {
        let arena = Arena::default();
        Self {
            queue: Mutex::default(),
            step_arrived: Condvar::new(),
            batch_done: Condvar::new(),
            row_assignment: arena.row_assignment(),
            row_bytes: AtomicUsize::new(0),
            rejoin_grace: AtomicU64::new(REJOIN_GRACE.as_nanos() as u64),
            rows: Mutex::new(Rows {
                arena,
                tables: HashMap::new(),
                graphs: match device {
                    tch::Device::Cuda(index) => Some(BatchGraphs::new(index)),
                    _ => None,
                },
            }),
            step_times: Mutex::default(),
            observers: Mutex::default(),
        }
    }

    /// From now on, steps that would replay a CUDA graph run through the graphs' bookkeeping
    /// eagerly, on any device (see `BatchGraphs::eager`): for tests on a machine without a GPU.
    pub fn replay_graphs_eagerly(&self) {
        self.rows().graphs = Some(BatchGraphs::eager());
    }

    /// The rejoin grace from now on, in place of [`REJOIN_GRACE`]: for tests that need batches
    /// to stay whole by count, whatever the machine's timing.
    pub fn set_rejoin_grace(&self, grace: Duration) {
        self.rejoin_grace
            .store(grace.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Calls `observer` after every batch from now on, on the thread that ran it.
    pub fn observe(&self, observer: impl Fn(&BatchRun) + Send + Sync + 'static) {
        self.observers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(observer));
    }

    /// Steps handed over and not yet run.
    pub fn steps_waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// How long a warm step of `rows` streams of `frames` frames takes on this model: the
    /// second fastest of a few steps of silence (after one that pays first-use costs; see
    /// [`settled_step_time`]), through the path
    /// real batches take. Measured once per shape, so that every stream of the model sees the
    /// same figure.
    pub fn warm_step_time(
        &self,
        network: &Network,
        rows: usize,
        frames: usize,
        cuda_graphs: bool,
    ) -> Result<Duration, tch::TchError> {
        let key = (rows, frames, cuda_graphs);
        if let Some(&time) = self
            .step_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(time);
        }
        // Where no graph replays, a batch of streams on rows that follow one another (a server's
        // first sessions) steps on them in place: so does this one, on rows of its own, not on
        // the scratch row selected again and again. Graphs replay on the scratch row.
        let graphs = cuda_graphs && self.rows().graphs.is_some();
        if graphs && self.rows().arena.rows() == 0 {
            // The scratch row comes with the arena's first rows.
            let row = self.new_row(network)?;
            self.release_row(network, &row);
        }
        let codes = vec![0; frames * network.config().num_quantizers];
        let batch: Vec<Job> = (0..rows)
            .map(|_| Job {
                id: 0,
                step: Step {
                    row: Row::scratch(),
                    codes: codes.clone(),
                    frames,
                    max_rows: rows,
                    cuda_graphs,
                    first: false,
                    clear: false,
                    hold: Duration::ZERO,
                },
                handed_over: Instant::now(),
            })
            .collect();
        let time = executor::run(network.device(), || {
            let mut detached = match graphs {
                true => None,
                false => Some(network.new_state(rows as i64)?),
            };
            let mut timed = |threads: Option<usize>| {
                if let Some(threads) = threads {
                    threads::enter(threads);
                }
                let mut times = (0..=TIMED_STEPS)
                    .map(|_| {
                        let started = Instant::now();
                        self.compute_on(network, &batch, detached.as_mut())
                            .map(|_| started.elapsed())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                times.remove(0);
                Ok::<_, tch::TchError>(settled_step_time(times))
            };
            if network.device() != tch::Device::Cpu {
                return timed(None);
            }
            // Each thread count the policy may choose, most first, while fewer are faster: the
            // policy starts this shape at the fastest, and the figure is its time.
            let mut measured: Vec<(usize, Duration)> = Vec::new();
            for count in threads::counts() {
                let time = timed(Some(count))?;
                let slower = measured.last().is_some_and(|&(_, last)| time >= last);
                measured.push((count, time));
                if slower {
                    break;
                }
            }
            Ok(threads::seed((rows, frames), &measured))
        })?;
        log::debug(format_args!(
            "a warm step of {rows} rows of {frames} frames takes {:.1} ms",
            time.as_secs_f64() * 1e3
        ));
        self.step_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, time);
        Ok(time)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An arena row for a new stream, whose first step clears it ([`Step::clear`]). A free row
    /// is taken at once; only when none is free does the arena grow, on the compute thread
    /// (after the batch in flight).
    pub fn new_row(&self, network: &Network) -> Result<Row, tch::TchError> {
        if let Some(row) = self.row_assignment.take() {
            return Ok(row);
        }
        executor::run(network.device(), || {
            let mut rows = self.rows();
            let row = rows.arena.allocate(network)?;
            self.row_bytes.store(rows.arena.row_bytes(), Ordering::Relaxed);
            Ok(row)
        })
    }

    /// Gives a stream's row back when the stream ends (the arena may shrink, moving other
    /// streams' rows down).
    pub fn release_row(&self, network: &Network, row: &Row) {
        self.lock().held_streams.remove(&row.id());
        if let Err(err) = executor::run(network.device(), || self.rows().arena.release(row)) {
            // The rows stay as they were: only memory is not given back.
            log::warning(format_args!("cannot shrink the state arena: {err}"));
        }
    }

    pub fn state_rows(&self) -> usize {
        self.rows().arena.rows() as usize
    }

    /// Bytes of one stream's row (without waiting for the compute thread).
    pub fn row_bytes(&self) -> usize {
        self.row_bytes.load(Ordering::Relaxed)
    }

    pub fn graph_report(&self) -> GraphReport {
        match &self.rows().graphs {
            Some(graphs) => GraphReport {
                graphs: graphs.count(),
                bytes: graphs.bytes(),
                failure: graphs.failure().map(str::to_owned),
                dropped: graphs.dropped(),
            },
            None => GraphReport::default(),
        }
    }

    /// Runs `step`, batched with the steps of other streams that wait at the same time;
    /// returns when it is done. The step waits in the queue; whichever waiting thread finds no
    /// batch running leads the next one (its own step or not), then hands every row its result.
    pub fn run(&self, network: &Network, step: Step) -> StepDone {
        let (mut queue, id) = self.enqueue(step);
        loop {
            if let Some(done) = queue.done.remove(&id) {
                return done;
            }
            if queue.running {
                queue = self
                    .batch_done
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            queue.running = true;
            let (locked, grace_ran_out) = self.await_rejoin(queue);
            let free = Instant::now();
            let mut locked = self.await_held(locked, max_batch_frames(network.device()));
            let held = free.elapsed();
            let batch = take_batch(&mut locked.waiting, max_batch_frames(network.device()));
            let left_waiting = locked.waiting.len();
            drop(locked);
            let outcome = self.lead(network, id, &batch, left_waiting, grace_ran_out, held);
            queue = self.hand_out(batch, outcome);
        }
    }

    /// Queues `step`; the queue, still locked, and the step's id.
    fn enqueue(&self, step: Step) -> (MutexGuard<'_, Queue>, u64) {
        let mut queue = self.lock();
        let id = queue.next_id;
        queue.next_id += 1;
        let handed_over = Instant::now();
        if step.holds() {
            queue.held_streams.insert(step.row.id(), handed_over);
        } else {
            queue.held_streams.remove(&step.row.id());
        }
        queue.waiting.push_back(Job {
            id,
            step,
            handed_over,
        });
        queue.arrived_since += 1;
        self.step_arrived.notify_all();
        (queue, id)
    }

    /// Waits, up to the rejoin grace, until every stream of the last batch has handed over its
    /// next step (see [`REJOIN_GRACE`]); whether the grace ran out first.
    fn await_rejoin<'a>(&'a self, mut queue: MutexGuard<'a, Queue>) -> (MutexGuard<'a, Queue>, bool) {
        let deadline = Instant::now() + Duration::from_nanos(self.rejoin_grace.load(Ordering::Relaxed));
        while queue.arrived_since < queue.last_rows {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return (queue, true);
            };
            queue = self
                .step_arrived
                .wait_timeout(queue, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        (queue, false)
    }

    /// Waits while the steps waiting may be held (see [`Step::hold`]): until every stream that
    /// holds its steps has one waiting, a batch fills `max_frames`, a stream's first step waits
    /// (its first audio goes first), or the earliest hold of the waiting steps runs out.
    fn await_held<'a>(
        &'a self,
        mut queue: MutexGuard<'a, Queue>,
        max_frames: usize,
    ) -> MutexGuard<'a, Queue> {
        loop {
            let now = Instant::now();
            queue
                .held_streams
                .retain(|_, last| now.duration_since(*last) < HELD_STREAM_WINDOW);
            let Some(until) = hold_until(&queue.waiting) else {
                return queue;
            };
            let Some(left) = until.checked_duration_since(now) else {
                return queue;
            };
            let waiting_frames: usize = queue.waiting.iter().map(|job| job.step.frames).sum();
            let streams_waiting: std::collections::HashSet<usize> =
                queue.waiting.iter().map(|job| job.step.row.id()).collect();
            let all_there = queue
                .held_streams
                .keys()
                .all(|stream| streams_waiting.contains(stream));
            if all_there || waiting_frames >= max_frames {
                return queue;
            }
            queue = self
                .step_arrived
                .wait_timeout(queue, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Runs `batch` on the compute thread with the queue unlocked, on the thread of step `id`
    /// (a panic in the compute becomes every row's error), and tells the observers.
    fn lead(
        &self,
        network: &Network,
        id: u64,
        batch: &[Job],
        left_waiting: usize,
        grace_ran_out: bool,
        held: Duration,
    ) -> Result<(Vec<Vec<f32>>, bool), tch::TchError> {
        let leading = Leading {
            engine: self,
            rows: batch.len(),
            others: batch
                .iter()
                .map(|job| job.id)
                .filter(|&other| other != id)
                .collect(),
        };
        let started = Instant::now();
        let (arena_rows, outcome) = executor::run(network.device(), || {
            // Read where nothing moves them: the compute thread.
            let rows = batch.iter().map(|job| job.step.row.index()).collect();
            let shape = (batch.len(), batch[0].step.frames);
            let threads = (network.device() == tch::Device::Cpu).then(|| threads::enter_step(shape));
            let computing = Instant::now();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| self.compute(network, batch)))
                .unwrap_or_else(|_| Err(tch::TchError::Torch("a decode step panicked".into())));
            if let (Some(threads), Ok(_)) = (threads, &outcome) {
                threads::step_done(shape, threads, computing.elapsed());
            }
            (rows, outcome)
        });
        let run = BatchRun {
            rows: batch.len(),
            arena_rows,
            frames: batch[0].step.frames,
            time: started.elapsed(),
            waiting: left_waiting,
            grace_ran_out,
            held,
        };
        log::debug(format_args!(
            "batch of {} rows of {} frames in {:.1} ms{} (held {:.1} ms for live streams; {left_waiting} steps waiting)",
            run.rows,
            run.frames,
            run.time.as_secs_f64() * 1e3,
            if matches!(outcome, Ok((_, true))) {
                ", CUDA graph"
            } else {
                ""
            },
            held.as_secs_f64() * 1e3,
        ));
        for observer in self.observers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            observer(&run);
        }
        // Disarmed here, before the queue is locked again: a guard that unwound with the queue
        // locked would deadlock.
        drop(leading);
        outcome
    }

    /// Gives every row of `batch` its audio, or the batch's error, and lets the next batch
    /// start; the queue, locked.
    fn hand_out(
        &self,
        batch: Vec<Job>,
        outcome: Result<(Vec<Vec<f32>>, bool), tch::TchError>,
    ) -> MutexGuard<'_, Queue> {
        let mut queue = self.lock();
        queue.running = false;
        let rows = batch.len();
        queue.last_rows = rows;
        queue.arrived_since = 0;
        // Audio for every row, or the error for every row: a panic here, with the queue
        // locked, would leave the other streams waiting for this batch for ever.
        let outcome = outcome.and_then(|(audio, graph)| {
            if audio.len() == rows {
                Ok((audio, graph))
            } else {
                Err(tch::TchError::Torch(format!(
                    "a batch of {rows} rows gave audio for {}",
                    audio.len()
                )))
            }
        });
        let (audio, graph): (Vec<Result<Vec<f32>, tch::TchError>>, bool) = match outcome {
            Ok((audio, graph)) => (audio.into_iter().map(Ok).collect(), graph),
            Err(err) => (batch.iter().map(|_| Err(copy_error(&err))).collect(), false),
        };
        for (job, audio) in batch.into_iter().zip(audio) {
            queue.done.insert(job.id, StepDone { audio, rows, graph });
        }
        self.batch_done.notify_all();
        queue
    }

    /// On the compute thread: the batch's rows as one step; each row's audio, and whether a
    /// graph computed it.
    fn compute(&self, network: &Network, batch: &[Job]) -> Result<(Vec<Vec<f32>>, bool), tch::TchError> {
        self.compute_on(network, batch, None)
    }

    /// [`Self::compute`], on `detached` (a state of the batch's rows of its own) in place of
    /// the arena's rows where given.
    fn compute_on(
        &self,
        network: &Network,
        batch: &[Job],
        detached: Option<&mut State>,
    ) -> Result<(Vec<Vec<f32>>, bool), tch::TchError> {
        let rows = batch.len();
        let frames = batch[0].step.frames;
        let codebooks = network.config().num_quantizers;
        let device = network.device();
        let mut guard = self.rows();
        let Rows {
            arena,
            tables,
            graphs,
        } = &mut *guard;
        // The batch in the order of its arena rows, read with the arena locked (no shrink moves
        // them until the step is done): rows that follow one another step in place, as one
        // row does, where others are selected into a copy and put back.
        let mut order: Vec<usize> = (0..rows).collect();
        order.sort_by_key(|&position| batch[position].step.row.index());
        let arena_rows: Vec<i64> = order
            .iter()
            .map(|&position| batch[position].step.row.index())
            .collect();
        let codes = match batch {
            [job] => Tensor::f_from_slice(&job.step.codes)?,
            _ => Tensor::f_from_slice(
                &order
                    .iter()
                    .flat_map(|&position| batch[position].step.codes.iter().copied())
                    .collect::<Vec<i16>>(),
            )?,
        };
        let codes = codes
            .f_view([rows as i64, frames as i64, codebooks as i64])?
            .f_to_device(device)?
            .f_to_kind(Kind::Int64)?;
        for job in batch.iter().filter(|job| job.step.clear) {
            arena.state().rows_from(job.step.row.index(), 1)?.clear()?;
        }
        let tables = match tables.entry(frames) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(network.step_tables(frames)?),
        };
        let graphs = graphs
            .as_mut()
            .filter(|_| detached.is_none() && batch.iter().all(|job| job.step.cuda_graphs));
        let replayed = match graphs {
            Some(graphs) => graphs
                .run(network, arena, tables, &arena_rows, &codes)
                .map_err(|err| tch::TchError::Torch(err.to_string()))?,
            None => None,
        };
        let graph = replayed.is_some();
        let consecutive = arena_rows.windows(2).all(|pair| pair[1] == pair[0] + 1);
        let audio = match (replayed, detached) {
            (Some(audio), _) => audio,
            (None, Some(state)) => network.step(&codes, state, tables)?,
            (None, None) if consecutive => network.step(
                &codes,
                &mut arena.state().rows_from(arena_rows[0], rows as i64)?,
                tables,
            )?,
            (None, None) => {
                let index = Tensor::f_from_slice(&arena_rows)?.f_to_device(device)?;
                arena.step_rows(network, &index, &codes, tables)?
            }
        };
        // Copies to the host, one per row, before another replay of the graph overwrites its
        // audio; each to its step's place in the batch.
        let audio = audio.f_to_kind(Kind::Float)?.f_to_device(tch::Device::Cpu)?;
        let mut per_step = vec![Vec::new(); rows];
        for (row, &position) in order.iter().enumerate() {
            per_step[position] = Vec::<f32>::try_from(audio.f_get(row as i64)?)?;
        }
        Ok((per_step, graph))
    }
}

/// The next batch: the oldest waiting first step of a stream if there is one, else the oldest
/// step; then every later one of the same frame count, in arrival order, as many as the
/// smallest `max_rows` among them and `max_frames` frames in all allow. Steps that do not fit
/// wait for the next batch.
fn take_batch(waiting: &mut VecDeque<Job>, max_frames: usize) -> Vec<Job> {
    let lead = waiting.iter().position(|job| job.step.first).unwrap_or(0);
    let frames = waiting[lead].step.frames;
    let mut cap = (max_frames / frames).max(1);
    let mut batch = Vec::new();
    batch.extend(waiting.remove(lead));
    cap = cap.min(batch[0].step.max_rows);
    let mut index = 0;
    while index < waiting.len() {
        let step = &waiting[index].step;
        if step.frames == frames && batch.len() < cap.min(step.max_rows) {
            cap = cap.min(step.max_rows);
            batch.extend(waiting.remove(index));
        } else {
            index += 1;
        }
    }
    batch
}

/// Until when the waiting steps may be held: the earliest end of their holds; None when one
/// may not wait (a stream's first step, a step without a hold or alone by `max_rows`).
fn hold_until(waiting: &VecDeque<Job>) -> Option<Instant> {
    waiting
        .iter()
        .map(|job| {
            let step = &job.step;
            (!step.first && step.holds()).then(|| job.handed_over + step.hold)
        })
        .min()
        .flatten()
}

/// The thread that leads a batch, while it runs the batch with the queue unlocked. Should it
/// unwind there (an observer's panic: the compute's own are caught), the batch's other steps
/// get an error and another thread may lead; else `running` stayed set and every other stream
/// waited for ever.
struct Leading<'a> {
    engine: &'a Engine,
    rows: usize,
    /// The ids of the batch's steps but the leader's own (which no one would collect).
    others: Vec<u64>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut queue = self.engine.lock();
        queue.running = false;
        queue.last_rows = 0;
        let rows = self.rows;
        for id in self.others.drain(..) {
            let audio = Err(tch::TchError::Torch(
                "the thread running this batch panicked".into(),
            ));
            queue.done.insert(
                id,
                StepDone {
                    audio,
                    rows,
                    graph: false,
                },
            );
        }
        self.engine.batch_done.notify_all();
    }
}

/// tch's errors are not Clone: the same text for every row of a failed batch.
fn copy_error(err: &tch::TchError) -> tch::TchError {
    tch::TchError::Torch(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, frames: usize, max_rows: usize, first: bool) -> Job {
        Job {
            id,
            step: Step {
                row: Row::scratch(),
                codes: Vec::new(),
                frames,
                max_rows,
                cuda_graphs: false,
                first,
                clear: false,
                hold: Duration::ZERO,
            },
            handed_over: Instant::now(),
        }
    }

    fn ids<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Vec<u64> {
        jobs.into_iter().map(|job| job.id).collect()
    }

    /// Steps held by the scheduler while the warm step is timed (planted times: a 1 ms step,
    /// some held 165 ms) do not set the figure, up to all but two of them.
    #[test]
    fn held_steps_do_not_raise_the_warm_step_time() {
        let (fast, held) = (Duration::from_millis(1), Duration::from_millis(165));
        let planted = |held_steps: usize| {
            let mut times = vec![held; held_steps];
            times.resize(TIMED_STEPS, fast);
            times
        };
        assert_eq!(settled_step_time(planted(0)), fast);
        assert_eq!(settled_step_time(planted(1)), fast, "the first step held");
        assert_eq!(settled_step_time(planted(2)), fast, "the first two held");
        assert_eq!(
            settled_step_time(planted(TIMED_STEPS - 2)),
            fast,
            "all but the last two held"
        );
        let mut shuffled = planted(TIMED_STEPS - 2);
        shuffled.rotate_left(2);
        assert_eq!(settled_step_time(shuffled), fast, "wherever the fast steps fall");
        // One freak fast step does not lower it.
        let mut freak = planted(0);
        freak[3] = fast / 10;
        assert_eq!(settled_step_time(freak), fast);
    }

    /// The most frames a batch computes, by device: on CUDA too, whose arm no CPU run reaches.
    #[test]
    fn a_batch_is_capped_by_its_device() {
        assert_eq!(max_batch_frames(tch::Device::Cpu), 8);
        assert_eq!(max_batch_frames(tch::Device::Cuda(0)), 1024);
        assert_eq!(max_batch_frames(tch::Device::Cuda(3)), 1024);
    }

    #[test]
    fn a_batch_is_the_leading_step_and_every_later_one_of_its_size_within_the_caps() {
        // A stream's first step leads, whatever waits before it; steps of another size are passed
        // over, not stopped at.
        let mut waiting = VecDeque::from([
            job(0, 1, 16, false),
            job(1, 2, 16, false),
            job(2, 1, 16, true),
            job(3, 1, 16, false),
            job(4, 2, 16, false),
        ]);
        assert_eq!(ids(&take_batch(&mut waiting, 8)), [2, 0, 3]);
        assert_eq!(ids(&waiting), [1, 4]);
        // Then the oldest.
        assert_eq!(ids(&take_batch(&mut waiting, 8)), [1, 4]);
        assert!(waiting.is_empty());

        // At most `max_frames` frames in all, and a step of more alone.
        let mut waiting = VecDeque::from([job(0, 4, 16, false), job(1, 4, 16, false), job(2, 4, 16, false)]);
        assert_eq!(ids(&take_batch(&mut waiting, 8)), [0, 1]);
        assert_eq!(ids(&take_batch(&mut waiting, 2)), [2]);

        // At most the smallest max_rows among the batch's steps, the lead's or a later one's.
        let mut waiting = VecDeque::from([job(0, 1, 2, false), job(1, 1, 16, false), job(2, 1, 16, false)]);
        assert_eq!(ids(&take_batch(&mut waiting, 8)), [0, 1]);
        let mut waiting = VecDeque::from([
            job(0, 1, 16, false),
            job(1, 1, 2, false),
            job(2, 1, 16, false),
            job(3, 1, 16, false),
        ]);
        assert_eq!(ids(&take_batch(&mut waiting, 8)), [0, 1]);
        assert_eq!(ids(&waiting), [2, 3]);
    }
}
