//! One stream's decoder: frames in, exactly their audio out, in fixed-size steps.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::engine::{Row, Step};
use super::error::DecodeError;
use super::loaded::Model;

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

/// How a stream's steps may be grouped: with other streams' (batching) and with its own
/// waiting frames (larger steps under a backlog).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// The largest batch of streams this stream's steps may join; 1 runs them alone.
    pub max_batch: usize,
    /// The largest step, in frames, that frames waiting for the decoder are joined into (at
    /// least `chunk_frames`): when more than one step's frames wait, they run as one step of
    /// `chunk_frames` times a power of two, up to this.
    pub max_step_frames: usize,
    /// On CUDA, whether this stream's steps may replay the model's CUDA graphs (a batch does
    /// when all of its streams allow it); the same audio either way, graphs launch faster.
    pub cuda_graphs: bool,
}

impl Default for StepLimits {
    fn default() -> Self {
        Self {
            max_batch: 16,
            max_step_frames: 8,
            cuda_graphs: true,
        }
    }
}

impl StepLimits {
    /// The rows of the batch that a live stream's latency counts (the element's) with
    /// `open_streams` open on the model: rounded up to a power of two, at most `max_batch`, so
    /// that few shapes are timed and streams of the same settings count the same.
    pub fn latency_batch_rows(&self, open_streams: usize) -> usize {
        open_streams.max(1).next_power_of_two().min(self.max_batch.max(1))
    }
}

/// Decodes one stream of frames incrementally. Its output, concatenated over calls, equals the
/// full-sequence decode of all frames pushed, whatever the split into calls. Frames wait until
/// `chunk_frames` of them make a step; [`Self::finish`] decodes the rest. Steps go through the
/// model's engine, which batches them with the steps of the model's other streams.
pub struct StreamDecoder {
    model: Arc<Model>,
    chunk_frames: usize,
    tail: TailStrategy,
    limits: StepLimits,
    /// How long each step may wait for the model's other live streams (see [`Self::set_batch_hold`]).
    batch_hold: Duration,
    /// This stream's row of the model's state arena (which the arena may move), and its size.
    row: Row,
    /// Whether the next step clears the row first: a new stream's, or one reset.
    clear_row: bool,
    row_bytes: usize,
    /// Codes of the frames waiting for a full step, frame-major.
    pending: Vec<i16>,
    frames_in: u64,
    steps: u64,
    step_time_total: Duration,
    step_time_max: Duration,
    batch_rows_total: u64,
    batch_rows_max: usize,
    graph_steps: u64,
    finished: bool,
    broken: bool,
}

impl StreamDecoder {
    /// # Panics
    /// If `chunk_frames` is 0.
    pub fn new(model: Arc<Model>, chunk_frames: usize, tail: TailStrategy) -> Result<Self, DecodeError> {
        assert!(chunk_frames > 0, "chunk_frames must be positive");
        let row = model.engine().new_row(model.network())?;
        let row_bytes = model.engine().row_bytes();
        model.count_stream(true);
        Ok(Self {
            model,
            chunk_frames,
            tail,
            limits: StepLimits::default(),
            batch_hold: Duration::ZERO,
            row,
            clear_row: true,
            row_bytes,
            pending: Vec::new(),
            frames_in: 0,
            steps: 0,
            step_time_total: Duration::ZERO,
            step_time_max: Duration::ZERO,
            batch_rows_total: 0,
            batch_rows_max: 0,
            graph_steps: 0,
            finished: false,
            broken: false,
        })
    }

    /// How long each step from now on may wait, once the engine is free, for the steps of the
    /// model's other streams that hold theirs, to run in one batch with them (zero, the
    /// default: at once). For a live stream, whose latency allows for a batch in flight: live
    /// streams at phases of their own then fall into one batch a frame instead of one each.
    pub fn set_batch_hold(&mut self, hold: Duration) {
        self.batch_hold = hold;
    }

    /// Sets how this stream's steps may be grouped (see [`StepLimits`]; values below 1, or a
    /// step limit below `chunk_frames`, count as the least).
    pub fn set_limits(&mut self, limits: StepLimits) {
        self.limits = StepLimits {
            max_batch: limits.max_batch.max(1),
            max_step_frames: limits.max_step_frames.max(self.chunk_frames),
            ..limits
        };
    }

    pub fn limits(&self) -> StepLimits {
        self.limits
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

    /// The batches this stream's steps ran in since it started: (their rows added up over the
    /// steps, the most rows of one); the mean is the first over [`Self::steps`].
    pub fn batch_rows(&self) -> (u64, usize) {
        (self.batch_rows_total, self.batch_rows_max)
    }

    /// Steps since the stream started that replayed a CUDA graph.
    pub fn graph_steps(&self) -> u64 {
        self.graph_steps
    }

    /// Bytes this stream holds besides the shared weights: its row of convolution contexts and
    /// KV window, and waiting codes.
    pub fn state_bytes(&self) -> usize {
        self.row_bytes + std::mem::size_of_val(self.pending.as_slice())
    }

    fn codebooks(&self) -> usize {
        self.model.config().num_quantizers
    }

    /// Accepts whole frames (`codes.len()` a multiple of the codebook count, frame-major) and
    /// returns the audio of every step they complete. Bad codes are refused before anything
    /// is accepted, so the stream stays usable after an error.
    pub fn push(&mut self, codes: &[i16]) -> Result<Vec<f32>, DecodeError> {
        self.check_usable()?;
        self.model.check_codes(codes, self.frames_in)?;
        let codebooks = self.codebooks();
        self.pending.extend_from_slice(codes);
        self.frames_in += (codes.len() / codebooks) as u64;

        let chunk_codes = self.chunk_frames * codebooks;
        let mut chunks = self.pending.len() / chunk_codes;
        let mut audio = Vec::new();
        let mut taken = 0;
        while chunks > 0 {
            let step_chunks = self.step_chunks(chunks);
            let end = taken + step_chunks * chunk_codes;
            let step_audio = self.run_step(self.pending[taken..end].to_vec())?;
            // One step's audio (the usual case) is handed on as it came.
            if audio.is_empty() {
                audio = step_audio;
            } else {
                audio.extend(step_audio);
            }
            taken = end;
            chunks -= step_chunks;
        }
        self.pending.drain(..taken);
        Ok(audio)
    }

    /// Of `waiting` frames not pushed yet, how many the next step would take if they were
    /// pushed (with the frames already pending); none while they do not complete a chunk.
    pub fn frames_for_next_step(&self, waiting: usize) -> Option<usize> {
        let chunks = (self.pending_frames() + waiting) / self.chunk_frames;
        (chunks > 0).then(|| self.step_chunks(chunks) * self.chunk_frames - self.pending_frames())
    }

    /// How many of `waiting` full chunks the next step takes: the largest power of two that
    /// the step limit allows (powers of two keep the step sizes few, so that streams with a
    /// backlog still find each other's steps to batch with), ramping up from one chunk at the
    /// stream's start (1, 2, 4, ...: the first audio comes after the smallest step).
    fn step_chunks(&self, waiting: usize) -> usize {
        let ramp = 1usize << self.steps.min(16);
        let most = (self.limits.max_step_frames / self.chunk_frames)
            .min(ramp)
            .clamp(1, waiting);
        1 << most.ilog2()
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
                        audio.extend(self.run_step(frame.to_vec())?);
                    }
                }
                TailStrategy::Pad => {
                    let mut block = pending;
                    block.resize(self.chunk_frames * self.codebooks(), 0);
                    audio = self.run_step(block)?;
                    audio.truncate(tail_frames * self.model.samples_per_frame());
                }
            }
        }
        self.finished = true;
        Ok(audio)
    }

    /// Starts a new stream: the next frame decodes as on a fresh decoder.
    pub fn reset(&mut self) -> Result<(), DecodeError> {
        self.clear_row = true;
        self.pending.clear();
        self.frames_in = 0;
        self.steps = 0;
        self.step_time_total = Duration::ZERO;
        self.step_time_max = Duration::ZERO;
        self.batch_rows_total = 0;
        self.batch_rows_max = 0;
        self.graph_steps = 0;
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
    fn run_step(&mut self, codes: Vec<i16>) -> Result<Vec<f32>, DecodeError> {
        let started = Instant::now();
        let step = Step {
            row: self.row.clone(),
            frames: codes.len() / self.codebooks(),
            codes,
            max_rows: self.limits.max_batch,
            cuda_graphs: self.limits.cuda_graphs,
            first: self.steps == 0,
            clear: self.clear_row,
            hold: self.batch_hold,
        };
        let done = self.model.engine().run(self.model.network(), step);
        // Cleared or not (a failed step leaves the stream broken until a reset clears it).
        self.clear_row = false;
        let result = done.audio.map_err(DecodeError::from);
        let rows = done.rows;
        self.graph_steps += u64::from(done.graph);
        let elapsed = started.elapsed();
        self.broken = result.is_err();
        self.steps += 1;
        self.step_time_total += elapsed;
        self.step_time_max = self.step_time_max.max(elapsed);
        self.batch_rows_total += rows as u64;
        self.batch_rows_max = self.batch_rows_max.max(rows);
        result
    }
}

impl Drop for StreamDecoder {
    fn drop(&mut self) {
        self.model.engine().release_row(self.model.network(), &self.row);
        self.model.count_stream(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_strategy_reads_from_its_name() {
        assert_eq!("eager".parse::<TailStrategy>(), Ok(TailStrategy::Eager));
        assert_eq!("pad".parse::<TailStrategy>(), Ok(TailStrategy::Pad));
        let err = "padded".parse::<TailStrategy>().unwrap_err();
        assert!(err.contains("\"padded\""), "{err}");
    }
}
