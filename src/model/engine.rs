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
//! State stays with its stream (a state of one row): a batched step gathers the rows of its
//! streams into one state and scatters them back afterwards. Streams then join and leave
//! between any two steps with nothing to allocate or free in a shared pool, and a reset or
//! error of one stream touches no other; the copies cost a small fraction of a step (the state
//! is a few MiB, the weights read by a step hundreds). A step of one row uses the stream's
//! state directly.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use super::executor;
use super::network::{Network, State, StepTables};

/// One stream's step as the engine runs it.
pub struct Step {
    /// Codes of `frames` whole frames, frame-major, checked against the codebook size.
    pub codes: Vec<i64>,
    pub frames: usize,
    /// The largest batch this step may join (1: alone).
    pub max_rows: usize,
}

/// What a step gives back: the stream's state (advanced, unless the step failed), its audio,
/// and how many rows its batch had.
pub struct StepDone {
    pub state: State,
    pub audio: Result<Vec<f32>, tch::TchError>,
    pub rows: usize,
}

/// How long the next batch waits for the streams of the last one to hand over their next step.
pub const REJOIN_GRACE: Duration = Duration::from_millis(2);

pub struct Engine {
    queue: Mutex<Queue>,
    /// Signalled when a step is handed over, for a batch waiting for the last one's streams.
    step_arrived: Condvar,
    /// Signalled when a batch ends: its streams take their results, and one of the streams
    /// still waiting runs the next batch.
    batch_done: Condvar,
    /// RoPE tables and masks per frame count, made on first use.
    tables: Mutex<HashMap<usize, StepTables>>,
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
}

struct Job {
    id: u64,
    step: Step,
    state: State,
}

impl Engine {
    pub fn new() -> Self {
        Self {
            queue: Mutex::default(),
            step_arrived: Condvar::new(),
            batch_done: Condvar::new(),
            tables: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `step` on `state`, batched with the steps of other streams that wait at the same
    /// time; returns when it is done.
    pub fn run(&self, network: &Network, step: Step, state: State) -> StepDone {
        let mut queue = self.lock();
        let id = queue.next_id;
        queue.next_id += 1;
        queue.waiting.push_back(Job { id, step, state });
        queue.arrived_since += 1;
        self.step_arrived.notify_all();
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
            let deadline = Instant::now() + REJOIN_GRACE;
            while queue.arrived_since < queue.last_rows {
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                queue = self
                    .step_arrived
                    .wait_timeout(queue, left)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
            let mut batch = take_batch(&mut queue.waiting);
            drop(queue);
            let outcome = executor::run(network.device(), || {
                std::panic::catch_unwind(AssertUnwindSafe(|| self.compute(network, &mut batch)))
                    .unwrap_or_else(|_| Err(tch::TchError::Torch("a decode step panicked".into())))
            });
            queue = self.lock();
            queue.running = false;
            let rows = batch.len();
            queue.last_rows = rows;
            queue.arrived_since = 0;
            let audio: Vec<Result<Vec<f32>, tch::TchError>> = match outcome {
                Ok(audio) => audio.into_iter().map(Ok).collect(),
                Err(err) => batch.iter().map(|_| Err(copy_error(&err))).collect(),
            };
            assert_eq!(audio.len(), rows, "audio for every row");
            for (job, audio) in batch.into_iter().zip(audio) {
                queue.done.insert(
                    job.id,
                    StepDone {
                        state: job.state,
                        audio,
                        rows,
                    },
                );
            }
            self.batch_done.notify_all();
        }
    }

    /// On the compute thread: the batch's rows as one step; each row's audio.
    fn compute(&self, network: &Network, batch: &mut [Job]) -> Result<Vec<Vec<f32>>, tch::TchError> {
        let rows = batch.len();
        let frames = batch[0].step.frames;
        let codebooks = network.config().num_quantizers;
        let codes: Vec<i64> = batch
            .iter()
            .flat_map(|job| job.step.codes.iter().copied())
            .collect();
        let codes = Tensor::f_from_slice(&codes)?
            .f_view([rows as i64, frames as i64, codebooks as i64])?
            .f_to_device(network.device())?;
        let mut tables = self
            .tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let tables = match tables.entry(frames) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(network.step_tables(frames)?),
        };
        let audio = if let [job] = batch {
            network.step(&codes, &mut job.state, tables)?
        } else {
            let mut state = State::gather(&batch.iter().map(|job| &job.state).collect::<Vec<_>>())?;
            let audio = network.step(&codes, &mut state, tables)?;
            state.scatter(&mut batch.iter_mut().map(|job| &mut job.state).collect::<Vec<_>>())?;
            audio
        };
        let audio = Vec::<f32>::try_from(
            audio
                .f_to_kind(Kind::Float)?
                .f_to_device(tch::Device::Cpu)?
                .f_flatten(0, -1)?,
        )?;
        let per_row = audio.len() / rows;
        Ok(audio.chunks_exact(per_row).map(<[f32]>::to_vec).collect())
    }
}

/// The oldest waiting step and every later one of the same frame count, in arrival order, as
/// many as the smallest `max_rows` among them allows. Steps that do not fit wait for the next
/// batch.
fn take_batch(waiting: &mut VecDeque<Job>) -> Vec<Job> {
    let frames = waiting[0].step.frames;
    let mut cap = usize::MAX;
    let mut batch = Vec::new();
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

/// tch's errors are not Clone: the same text for every row of a failed batch.
fn copy_error(err: &tch::TchError) -> tch::TchError {
    tch::TchError::Torch(err.to_string())
}
