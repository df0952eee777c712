//! One stream's decoder: frames in, exactly their audio out, in fixed-size steps.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use super::cuda_graph::{CudaGraph, GraphError};
use super::network::{StepTables, StreamState};
use super::{DecodeError, Model, executor};

/// How [`StreamDecoder::finish`] decodes frames that do not fill a whole step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TailStrategy {
    /// One frame per step: exact, a few more (small) steps.
    #[default]
    Eager,
    /// One full-size step with zero codes after the tail, whose audio is dropped. The tail's
    /// own audio is exact (the network is causal); the state is spoilt, so the stream ends.
    Pad,
}

impl FromStr for TailStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "eager" => Ok(TailStrategy::Eager),
            "pad" => Ok(TailStrategy::Pad),
            other => Err(format!("unknown tail strategy {other:?} (expected eager or pad)")),
        }
    }
}

/// Decodes one stream of frames incrementally. Its output, concatenated over calls, equals the
/// full-sequence decode of all frames pushed, whatever the split into calls. Frames wait until
/// `chunk_frames` of them make a step; [`Self::finish`] decodes the rest.
pub struct StreamDecoder {
    model: Arc<Model>,
    chunk_frames: usize,
    tail: TailStrategy,
    state: StreamState,
    /// The tables of a full step, made once.
    tables: StepTables,
    /// Full steps as a CUDA graph, where one was captured.
    graph: Option<StepGraph>,
    /// Codes of the frames waiting for a full step, frame-major.
    pending: Vec<i64>,
    frames_in: u64,
    steps: u64,
    step_time_total: Duration,
    step_time_max: Duration,
    finished: bool,
    broken: bool,
}

impl StreamDecoder {
    /// # Panics
    /// If `chunk_frames` is 0.
    pub fn new(model: Arc<Model>, chunk_frames: usize, tail: TailStrategy) -> Result<Self, DecodeError> {
        assert!(chunk_frames > 0, "chunk_frames must be positive");
        let network = model.network();
        let (state, tables) = executor::run(model.device(), || {
            Ok::<_, tch::TchError>((network.new_state()?, network.step_tables(chunk_frames)?))
        })?;
        Ok(Self {
            model,
            chunk_frames,
            tail,
            state,
            tables,
            graph: None,
            pending: Vec::new(),
            frames_in: 0,
            steps: 0,
            step_time_total: Duration::ZERO,
            step_time_max: Duration::ZERO,
            finished: false,
            broken: false,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn chunk_frames(&self) -> usize {
        self.chunk_frames
    }

    /// Frames accepted since the stream started.
    pub fn frames_in(&self) -> u64 {
        self.frames_in
    }

    /// Frames accepted but not decoded yet (waiting for a full step).
    pub fn pending_frames(&self) -> usize {
        self.pending.len() / self.codebooks()
    }

    /// Decode steps run since the stream started.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Wall-clock time of the decode steps since the stream started: (total, longest).
    pub fn step_times(&self) -> (Duration, Duration) {
        (self.step_time_total, self.step_time_max)
    }

    /// Bytes this stream holds besides the shared weights: convolution contexts, KV window
    /// and waiting codes.
    pub fn state_bytes(&self) -> usize {
        self.state.bytes() + self.pending.len() * std::mem::size_of::<i64>()
    }

    fn codebooks(&self) -> usize {
        self.model.config().num_quantizers
    }

    /// Accepts whole frames (`codes.len()` a multiple of the codebook count, frame-major) and
    /// returns the audio of every step they complete. Bad codes are refused before anything
    /// is accepted, so the stream stays usable after an error.
    pub fn push(&mut self, codes: &[i16]) -> Result<Vec<f32>, DecodeError> {
        self.check_usable()?;
        let codebooks = self.codebooks();
        if !codes.len().is_multiple_of(codebooks) {
            return Err(DecodeError::PartialFrame {
                codes: codes.len(),
                codebooks,
            });
        }
        let codebook_size = self.model.config().codebook_size;
        if let Some(index) = codes.iter().position(|&c| c < 0 || c as usize >= codebook_size) {
            return Err(DecodeError::InvalidCode {
                frame: self.frames_in + (index / codebooks) as u64,
                codebook: index % codebooks,
                value: codes[index].into(),
                codebook_size,
            });
        }
        self.pending.extend(codes.iter().map(|&c| i64::from(c)));
        self.frames_in += (codes.len() / codebooks) as u64;

        let step_codes = self.chunk_frames * codebooks;
        let full_steps = self.pending.len() / step_codes;
        let ready: Vec<i64> = self.pending.drain(..full_steps * step_codes).collect();
        let mut audio = Vec::with_capacity(full_steps * self.chunk_frames * self.model.samples_per_frame());
        for block in ready.chunks(step_codes) {
            audio.extend(self.run_step(block)?);
        }
        Ok(audio)
    }

    /// Decodes the frames still waiting (the residual tail) and ends the stream. Returns
    /// nothing on a finished stream.
    pub fn finish(&mut self) -> Result<Vec<f32>, DecodeError> {
        if self.finished {
            return Ok(Vec::new());
        }
        self.check_usable()?;
        let pending = std::mem::take(&mut self.pending);
        let tail_frames = pending.len() / self.codebooks();
        let mut audio = Vec::with_capacity(tail_frames * self.model.samples_per_frame());
        if tail_frames > 0 {
            match self.tail {
                TailStrategy::Eager => {
                    for frame in pending.chunks(self.codebooks()) {
                        audio.extend(self.run_step(frame)?);
                    }
                }
                TailStrategy::Pad => {
                    let mut block = pending;
                    block.resize(self.chunk_frames * self.codebooks(), 0);
                    audio = self.run_step(&block)?;
                    audio.truncate(tail_frames * self.model.samples_per_frame());
                }
            }
        }
        self.finished = true;
        Ok(audio)
    }

    /// Starts a new stream: the next frame decodes as on a fresh decoder.
    pub fn reset(&mut self) -> Result<(), DecodeError> {
        // In place, as a captured graph refers to the state's memory.
        executor::run(self.model.device(), || self.state.clear())?;
        self.pending.clear();
        self.frames_in = 0;
        self.steps = 0;
        self.step_time_total = Duration::ZERO;
        self.step_time_max = Duration::ZERO;
        self.finished = false;
        self.broken = false;
        Ok(())
    }

    fn check_usable(&self) -> Result<(), DecodeError> {
        if self.broken {
            Err(DecodeError::Broken)
        } else if self.finished {
            Err(DecodeError::Finished)
        } else {
            Ok(())
        }
    }

    /// One network step over `codes` (whole frames). A failing step may leave the state half
    /// updated, so the stream refuses further work until it is reset.
    fn run_step(&mut self, codes: &[i64]) -> Result<Vec<f32>, DecodeError> {
        let started = Instant::now();
        let result = executor::run(self.model.device(), || self.try_step(codes));
        let elapsed = started.elapsed();
        self.broken = result.is_err();
        self.steps += 1;
        self.step_time_total += elapsed;
        self.step_time_max = self.step_time_max.max(elapsed);
        result
    }

    fn try_step(&mut self, codes: &[i64]) -> Result<Vec<f32>, DecodeError> {
        let network = self.model.network();
        let frames = codes.len() / self.codebooks();
        let codes = Tensor::f_from_slice(codes)?.f_view([frames as i64, self.codebooks() as i64])?;
        let audio = match &mut self.graph {
            Some(graph) if frames == self.chunk_frames => {
                graph.codes.f_copy_(&codes)?;
                graph.graph.replay()?;
                graph.audio.shallow_clone()
            }
            _ => {
                let codes = codes.f_to_device(network.device())?;
                if frames == self.chunk_frames {
                    network.step(&codes, &mut self.state, &self.tables)?
                } else {
                    // Tail steps: rare, their tables made on the spot.
                    network.step(&codes, &mut self.state, &network.step_tables(frames)?)?
                }
            }
        };
        let audio = audio.f_to_kind(Kind::Float)?.f_to_device(tch::Device::Cpu)?;
        Ok(Vec::<f32>::try_from(&audio)?)
    }

    /// Records full steps as a CUDA graph, replayed from then on: one launch per step instead
    /// of hundreds, for a decoder on CUDA before its first frame. Warms up with two steps of
    /// silence (the state is cleared afterwards). Steps of other sizes (the tail) stay eager.
    pub fn capture_cuda_graph(&mut self) -> Result<(), GraphError> {
        let tch::Device::Cuda(index) = self.model.device() else {
            return Err(GraphError::Cuda("the decoder is not on a CUDA device".into()));
        };
        if self.frames_in > 0 || self.graph.is_some() {
            return Err(GraphError::Cuda(
                "a graph is captured on a fresh decoder, once".into(),
            ));
        }
        let graph = executor::run(self.model.device(), || self.record_step_graph(index))?;
        self.graph = Some(graph);
        Ok(())
    }

    fn record_step_graph(&mut self, device_index: usize) -> Result<StepGraph, GraphError> {
        let network = self.model.network();
        let codes = Tensor::f_zeros(
            [self.chunk_frames as i64, self.codebooks() as i64],
            (Kind::Int64, network.device()),
        )?;
        let tables = &self.tables;
        let (graph, audio) = CudaGraph::capture(
            device_index,
            &mut self.state,
            |state| {
                for _ in 0..2 {
                    _ = network.step(&codes, state, tables)?;
                }
                state.clear()
            },
            |state| network.step(&codes, state, tables),
        )?;
        Ok(StepGraph { graph, codes, audio })
    }

    /// Whether full steps replay a CUDA graph.
    pub fn uses_cuda_graph(&self) -> bool {
        self.graph.is_some()
    }
}

/// A full step captured as a CUDA graph, with the tensors it reads its codes from and writes
/// its audio to (on the device, the same memory at every replay).
struct StepGraph {
    graph: CudaGraph,
    codes: Tensor,
    audio: Tensor,
}
