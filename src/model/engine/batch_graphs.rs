//! CUDA graphs of batched steps, owned by the model and replayed by any cohort of its streams.
//!
//! A graph is recorded per bucket of rows ([`BUCKETS`]) and step size. It reads the rows of its
//! cohort from a device tensor of arena row indices, selects them from the arena, steps and
//! puts them back: the cohort changes from replay to replay by writing other indices. A batch
//! is padded up to its bucket with the arena's scratch row (codes of earlier batches in the
//! padding, audio dropped). All of a model's graphs take their memory from one pool (they are
//! replayed one at a time on the compute thread and their audio is read before the next
//! replay), and there are at most [`MAX_GRAPHS`] of them: graph memory is bounded whatever the
//! number of streams, and reported ([`BatchGraphs::bytes`]).

use std::collections::HashMap;

use tch::{Kind, Tensor};

use super::arena::{Arena, SCRATCH_ROW};
use super::cuda_graph::{self, CudaGraph};
use crate::model::error::GraphError;
use crate::model::log;
use crate::model::network::{Network, StepTables};

/// Rows a graph is recorded for; a batch runs in the smallest that holds it, and eagerly
/// beyond the largest.
pub const BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The most graphs of one model (buckets times step sizes); steps of further shapes run
/// eagerly.
pub const MAX_GRAPHS: usize = 32;

pub struct BatchGraphs {
    /// The CUDA device the graphs are recorded on; None: the CPU stand-in (see [`Replay`]).
    device: Option<usize>,
    /// By (bucket, frames).
    graphs: HashMap<(usize, usize), BatchGraph>,
    /// The arena generation the graphs were recorded on: they address its memory.
    arena_generation: u64,
    /// Why a capture failed: steps then run eagerly, and no capture is tried again.
    failure: Option<String>,
    bytes: u64,
    /// Graphs dropped because the arena moved.
    dropped: usize,
}

/// How a recorded step is replayed.
enum Replay {
    Cuda(CudaGraph),
    /// The CPU's stand-in for a graph: the recorded step run again at each replay, on the same
    /// input and output tensors. Everything around the graphs (buckets, padding with the
    /// scratch row, the rows as a tensor of arena indices, graphs dropped when the arena
    /// moves) then runs, and is tested, where no GPU is. It keeps where the arena's memory lay
    /// when it was recorded and refuses to replay elsewhere: a CUDA graph kept past a move
    /// would step on freed memory, which an eager step on the live arena would hide.
    Eager {
        recorded_on: Vec<usize>,
    },
}

struct BatchGraph {
    replay: Replay,
    /// Inputs, written before each replay: arena rows [bucket] and codes [bucket, frames, Q].
    rows: Tensor,
    codes: Tensor,
    /// Output, [bucket, frames * samples_per_frame], valid after a replay.
    audio: Tensor,
    _tables: StepTables,
}

impl BatchGraphs {
    /// Graphs recorded on CUDA device `device`.
    pub fn new(device: usize) -> Self {
        Self::on(Some(device))
    }

    /// The CPU stand-in: every step that would replay a graph runs eagerly through the same
    /// bookkeeping (see [`Replay::Eager`]).
    pub fn eager() -> Self {
        Self::on(None)
    }

    fn on(device: Option<usize>) -> Self {
        Self {
            device,
            graphs: HashMap::new(),
            arena_generation: 0,
            failure: None,
            bytes: 0,
            dropped: 0,
        }
    }

    /// Graphs dropped so far because the arena moved.
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// Device memory reserved while the graphs were recorded (their pool, mostly).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn count(&self) -> usize {
        self.graphs.len()
    }

    /// Why recording a graph failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Runs the step of arena `rows` over `codes` ([rows, frames, Q] on the device) by
    /// replaying its bucket's graph, recorded on first use; its audio, [rows, frames * S].
    /// `Ok(None)` when no graph serves this step (more rows than the largest bucket, the
    /// graph limit reached, a failed capture): the caller runs it eagerly.
    pub fn run(
        &mut self,
        network: &Network,
        arena: &mut Arena,
        tables: &StepTables,
        rows: &[i64],
        codes: &Tensor,
    ) -> Result<Option<Tensor>, GraphError> {
        if self.arena_generation != arena.generation() {
            // The arena moved: the graphs address its old memory.
            if !self.graphs.is_empty() {
                log::debug(format_args!(
                    "the state arena moved: {} CUDA graphs dropped, to be recorded again",
                    self.graphs.len()
                ));
            }
            self.dropped += self.graphs.len();
            self.graphs.clear();
            self.arena_generation = arena.generation();
        }
        let Some(&bucket) = BUCKETS.iter().find(|&&bucket| bucket >= rows.len()) else {
            return Ok(None);
        };
        let frames = tables.frames();
        let key = (bucket, frames);
        if !self.graphs.contains_key(&key) {
            if self.failure.is_some() || self.graphs.len() >= MAX_GRAPHS {
                return Ok(None);
            }
            match self.record(network, arena, tables, bucket) {
                Ok(graph) => {
                    self.graphs.insert(key, graph);
                    log::debug(format_args!(
                        "recorded the CUDA graph of {bucket} rows of {frames} frames ({} graphs, {} MB of graph memory)",
                        self.graphs.len(),
                        self.bytes / 1_000_000
                    ));
                }
                Err(err) => {
                    log::warning(format_args!(
                        "recording the CUDA graph of {bucket} rows of {frames} frames failed, steps of this model \
                         run without graphs from now on (the same audio, slower): {err}"
                    ));
                    self.failure = Some(err.to_string());
                    return Ok(None);
                }
            }
        }
        let graph = self.graphs.get_mut(&key).expect("recorded above");
        let mut padded = rows.to_vec();
        padded.resize(bucket, SCRATCH_ROW);
        graph.rows.f_copy_(&Tensor::f_from_slice(&padded)?)?;
        let used = rows.len() as i64;
        graph.codes.f_narrow(0, 0, used)?.f_copy_(codes)?;
        match &graph.replay {
            Replay::Cuda(cuda) => cuda.replay()?,
            Replay::Eager { recorded_on } => {
                if *recorded_on != arena.state().addresses() {
                    return Err(GraphError::Stale);
                }
                let audio = arena.step_rows(network, &graph.rows, &graph.codes, tables)?;
                graph.audio.f_copy_(&audio)?;
            }
        }
        Ok(Some(graph.audio.f_narrow(0, 0, used)?))
    }

    fn record(
        &mut self,
        network: &Network,
        arena: &mut Arena,
        tables: &StepTables,
        bucket: usize,
    ) -> Result<BatchGraph, GraphError> {
        let device = network.device();
        let codebooks = network.config().num_quantizers as i64;
        // Warm-up and capture touch the scratch row only.
        let rows = Tensor::f_full([bucket as i64], SCRATCH_ROW, (Kind::Int64, device))?;
        let codes = Tensor::f_zeros(
            [bucket as i64, tables.frames() as i64, codebooks],
            (Kind::Int64, device),
        )?;
        let Some(device) = self.device else {
            // The stand-in's output: the step run once on the scratch row, as a capture would.
            let audio = arena.step_rows(network, &rows, &codes, tables)?;
            return Ok(BatchGraph {
                replay: Replay::Eager {
                    recorded_on: arena.state().addresses(),
                },
                rows,
                codes,
                audio,
                _tables: tables.shallow_clone(),
            });
        };
        let before = cuda_graph::reserved_bytes(device)?;
        let share_pool_of = self.graphs.values().find_map(|graph| match &graph.replay {
            Replay::Cuda(cuda) => Some(cuda),
            Replay::Eager { .. } => None,
        });
        let (graph, audio) = CudaGraph::capture(
            device,
            share_pool_of,
            arena,
            |arena| {
                for _ in 0..2 {
                    _ = arena.step_rows(network, &rows, &codes, tables)?;
                }
                Ok(())
            },
            |arena| arena.step_rows(network, &rows, &codes, tables),
        )?;
        self.bytes += cuda_graph::reserved_bytes(device)?.saturating_sub(before);
        Ok(BatchGraph {
            replay: Replay::Cuda(graph),
            rows,
            codes,
            audio,
            _tables: tables.shallow_clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    /// An arena of `count` streams' rows (their numbers) besides the scratch row.
    fn arena_with(network: &Network, count: usize) -> (Arena, Vec<i64>) {
        let mut arena = Arena::default();
        let rows = (0..count)
            .map(|_| arena.allocate(network).unwrap().index())
            .collect();
        (arena, rows)
    }

    fn codes(network: &Network, rows: usize, frames: usize) -> Tensor {
        let codebooks = network.config().num_quantizers as i64;
        Tensor::zeros(
            [rows as i64, frames as i64, codebooks],
            (Kind::Int64, Device::Cpu),
        )
    }

    /// A batch replays the graph of the smallest bucket that holds it, none beyond the largest;
    /// a model records at most [`MAX_GRAPHS`], steps of further shapes then run eagerly while
    /// the shapes recorded go on replaying. The CPU engine's batches stop at 8 frames in all
    /// (`max_batch_frames`), so the larger buckets and the limit are reached here only.
    #[test]
    fn a_batch_takes_the_smallest_bucket_that_holds_it_and_graphs_stop_at_the_limit() {
        let network = Network::fixture("release-tiny");
        let (mut arena, rows) = arena_with(&network, 65);
        let mut graphs = BatchGraphs::eager();
        let one_frame = network.step_tables(1).unwrap();
        let mut run = |graphs: &mut BatchGraphs, tables: &StepTables, count: usize| {
            let codes = codes(&network, count, tables.frames());
            graphs
                .run(&network, &mut arena, tables, &rows[..count], &codes)
                .unwrap()
                .map(|audio| audio.size()[0] as usize)
        };
        for (count, bucket) in [
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 4),
            (5, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (33, 64),
            (64, 64),
        ] {
            assert_eq!(run(&mut graphs, &one_frame, count), Some(count), "{count} rows");
            assert!(
                graphs.graphs.contains_key(&(bucket, 1)),
                "{count} rows replay the bucket of {bucket}"
            );
        }
        assert_eq!(graphs.count(), BUCKETS.len());
        assert_eq!(
            run(&mut graphs, &one_frame, 65),
            None,
            "65 rows: beyond the largest bucket"
        );
        assert_eq!(graphs.count(), BUCKETS.len());

        // One row in steps of 2, 3, ... frames: a graph each until the limit.
        let recordable = MAX_GRAPHS - BUCKETS.len();
        for frames in 2..=recordable + 2 {
            let tables = network.step_tables(frames).unwrap();
            let replayed = run(&mut graphs, &tables, 1);
            if frames <= recordable + 1 {
                assert_eq!(replayed, Some(1), "steps of {frames} frames");
            } else {
                assert_eq!(replayed, None, "steps of {frames} frames, past the limit: eager");
            }
        }
        assert_eq!(graphs.count(), MAX_GRAPHS);
        assert_eq!(
            run(&mut graphs, &one_frame, 3),
            Some(3),
            "a shape recorded before the limit"
        );
    }

    /// A graph kept past a move of the arena would, on CUDA, step on the memory the arena left:
    /// the stand-in refuses to replay there, so that the CPU tests catch it. `run` drops the
    /// graphs when the arena moves, and records them again.
    #[test]
    fn the_stand_in_refuses_a_graph_recorded_on_memory_the_arena_left() {
        let network = Network::fixture("release-tiny");
        let (mut arena, mut rows) = arena_with(&network, 2);
        let mut graphs = BatchGraphs::eager();
        let tables = network.step_tables(1).unwrap();
        let codes = codes(&network, 2, 1);
        _ = graphs
            .run(&network, &mut arena, &tables, &rows, &codes)
            .unwrap()
            .unwrap();
        rows.push(arena.allocate(&network).unwrap().index());
        rows.push(arena.allocate(&network).unwrap().index());
        assert_eq!(arena.rows(), 8, "grown, in new memory");

        // As if the move had been missed.
        let generation = graphs.arena_generation;
        graphs.arena_generation = arena.generation();
        let stale = graphs.run(&network, &mut arena, &tables, &rows[..2], &codes);
        assert!(matches!(stale, Err(GraphError::Stale)), "a stale graph replayed");

        graphs.arena_generation = generation;
        _ = graphs
            .run(&network, &mut arena, &tables, &rows[..2], &codes)
            .unwrap()
            .unwrap();
        assert_eq!(
            (graphs.dropped(), graphs.count()),
            (1, 1),
            "dropped and recorded again"
        );
    }
}
