//! The element's settings (its properties) and statistics.

use std::time::Duration;

pub(super) const DEFAULT_DEVICE: &str = "auto";
pub(super) const DEFAULT_DTYPE: super::Dtype = super::Dtype::F32;
pub(super) const DEFAULT_CHUNK_FRAMES: u32 = 1;
pub(super) const DEFAULT_TAIL_STRATEGY: super::TailStrategy = super::TailStrategy::Eager;
pub(super) const DEFAULT_CUDA_GRAPHS: bool = true;
/// The model's own defaults (`StepLimits::default()`).
pub(super) const DEFAULT_MAX_BATCH: u32 = 16;
pub(super) const DEFAULT_MAX_STEP_FRAMES: u32 = 8;
/// Two seconds of frames at the release's rate: the longest loss that `plc` conceals.
pub(super) const DEFAULT_MAX_PLC_FRAMES: u32 = 25;
/// `compute-threads`' "follow the machine" (docs/element.md, "Threads").
pub(super) const DEFAULT_COMPUTE_THREADS: u32 = 0;
/// `processing-latency`'s "measured".
pub(super) const DEFAULT_PROCESSING_LATENCY: u64 = 0;

#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) model_path: Option<String>,
    pub(super) device: String,
    pub(super) dtype: super::Dtype,
    pub(super) chunk_frames: u32,
    pub(super) tail_strategy: super::TailStrategy,
    pub(super) cuda_graphs: bool,
    pub(super) max_batch: u32,
    pub(super) max_step_frames: u32,
    /// What a frame waits for its step, fixed; None: measured at start and raised when
    /// frames keep coming out late (see `Latency`).
    pub(super) processing_latency: Option<gst::ClockTime>,
    pub(super) max_plc_frames: u32,
    /// The CPU threads each op runs on, pinned; 0: chosen from the steps' times.
    pub(super) compute_threads: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            model_path: None,
            device: DEFAULT_DEVICE.into(),
            dtype: DEFAULT_DTYPE,
            chunk_frames: DEFAULT_CHUNK_FRAMES,
            tail_strategy: DEFAULT_TAIL_STRATEGY,
            cuda_graphs: DEFAULT_CUDA_GRAPHS,
            max_batch: DEFAULT_MAX_BATCH,
            max_step_frames: DEFAULT_MAX_STEP_FRAMES,
            processing_latency: None,
            max_plc_frames: DEFAULT_MAX_PLC_FRAMES,
            compute_threads: DEFAULT_COMPUTE_THREADS,
        }
    }
}

/// Counters behind the `stats` property, kept apart from the state so that reading them
/// never waits for a decode step.
#[derive(Debug, Default, Clone)]
pub(super) struct Stats {
    pub(super) frames_in: u64,
    /// Lost frames that `plc` filled with the last frame.
    pub(super) frames_concealed: u64,
    pub(super) samples_out: u64,
    pub(super) steps: u64,
    pub(super) step_time: Duration,
    pub(super) max_step_time: Duration,
    pub(super) state_bytes: u64,
    pub(super) sample_rate: u32,
    pub(super) cuda_graph: bool,
    /// Rows of the batches of the steps, added up over the steps.
    pub(super) batch_rows: u64,
    pub(super) max_batch_rows: u64,
}

impl Stats {
    pub(super) fn to_structure(&self) -> gst::Structure {
        let mean_step_ms = if self.steps > 0 {
            self.step_time.as_secs_f64() * 1e3 / self.steps as f64
        } else {
            0.0
        };
        let mean_batch_rows = if self.steps > 0 {
            self.batch_rows as f64 / self.steps as f64
        } else {
            0.0
        };
        let audio_seconds = self.samples_out as f64 / self.sample_rate.max(1) as f64;
        let real_time_factor = if audio_seconds > 0.0 {
            self.step_time.as_secs_f64() / audio_seconds
        } else {
            0.0
        };
        gst::Structure::builder("qwencodecdec-stats")
            .field("frames-in", self.frames_in)
            .field("frames-concealed", self.frames_concealed)
            .field("samples-out", self.samples_out)
            .field("decode-steps", self.steps)
            .field("mean-step-ms", mean_step_ms)
            .field("max-step-ms", self.max_step_time.as_secs_f64() * 1e3)
            .field("real-time-factor", real_time_factor)
            .field("state-bytes", self.state_bytes)
            .field("cuda-graph", self.cuda_graph)
            .field("mean-batch-rows", mean_batch_rows)
            .field("max-batch-rows", self.max_batch_rows)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StepLimits;

    #[test]
    fn the_defaults_are_the_models_and_the_enums() {
        let limits = StepLimits::default();
        assert_eq!(DEFAULT_MAX_BATCH as usize, limits.max_batch);
        assert_eq!(DEFAULT_MAX_STEP_FRAMES as usize, limits.max_step_frames);
        assert_eq!(DEFAULT_CUDA_GRAPHS, limits.cuda_graphs);
        assert_eq!(DEFAULT_DTYPE, super::super::Dtype::default());
        assert_eq!(DEFAULT_TAIL_STRATEGY, super::super::TailStrategy::default());
    }
}
