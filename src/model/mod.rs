//! The Qwen3-TTS 12 Hz tokenizer's decoder, streaming and exact, in libtorch. No GStreamer
//! here: the element only adapts [`StreamDecoder`] to buffers and caps.

mod checkpoint;
mod config;
mod dtype;
mod engine;
mod error;
mod executor;
mod kernels;
mod loaded;
pub mod log;
mod network;
mod op_profiler;
mod stream_decoder;
mod threads;

pub use checkpoint::CheckpointFiles;
pub use config::DecoderConfig;
pub use dtype::{Dtype, dtype_note};
pub use engine::{BatchRun, GraphReport, MAX_GRAPHS, REJOIN_GRACE, max_batch_frames};
pub use error::{DecodeError, GraphError, ModelError};
pub use executor::wait_policy;
pub use kernels::shim::{Allowed, CpuKernels, KERNELS_ENV, Kernel, cpu_kernels, widest_kernels};
pub use loaded::{Model, parse_device};
pub use op_profiler::OpProfiler;
pub use stream_decoder::{StepLimits, StreamDecoder, TailStrategy};
