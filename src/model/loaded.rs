//! A loaded decoder, shared by every stream that decodes with it, and the devices it loads on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use tch::{Device, Kind};

use super::checkpoint::{CheckpointFiles, WeightFile};
use super::config::DecoderConfig;
use super::dtype::Dtype;
use super::engine::{BatchRun, Engine, GraphReport};
use super::error::{DecodeError, ModelError};
use super::executor;
use super::network::Network;

/// Parses `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when libtorch sees a GPU, else CPU) and
/// checks that the device exists.
pub fn parse_device(name: &str) -> Result<Device, ModelError> {
    let device = match name {
        "cpu" => return Ok(Device::Cpu),
        "auto" => return Ok(Device::cuda_if_available()),
        "cuda" => Device::Cuda(0),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(index) => Device::Cuda(index),
            None => {
                return Err(ModelError::Device(format!(
                    "{other:?} is not a device (expected cpu, cuda, cuda:N or auto)"
                )));
            }
        },
    };
    let Device::Cuda(index) = device else {
        unreachable!()
    };
    if !tch::Cuda::is_available() {
        return Err(ModelError::Device(format!(
            "{name} was asked for, but libtorch sees no CUDA device on this machine"
        )));
    }
    let count = tch::Cuda::device_count();
    if index as i64 >= count {
        return Err(ModelError::Device(format!(
            "{name} was asked for, but libtorch sees only {count} CUDA device(s)"
        )));
    }
    Ok(device)
}

/// A loaded decoder: its geometry and weights on one device, in one dtype. Shared by every
/// stream that decodes with it (wrap it in an `Arc`), whose steps its engine batches.
pub struct Model {
    network: Network,
    engine: Engine,
    dtype: Dtype,
    /// Stream decoders alive, whose steps may share a batch.
    streams: AtomicUsize,
}

impl Model {
    /// Loads a tokenizer checkpoint folder or a full Qwen3-TTS checkpoint root.
    pub fn load(path: &Path, device: Device, dtype: Dtype) -> Result<Self, ModelError> {
        let files = CheckpointFiles::locate(path)?;
        let config = DecoderConfig::from_file(&files.config)?;
        executor::run(device, || {
            // f16 and bf16 on the CPU round only the large product weights, which the network
            // does itself: everything is read in float32.
            let weight_rounding = (device == Device::Cpu && dtype != Dtype::F32).then(|| dtype.kind());
            let kind = if weight_rounding.is_some() {
                Kind::Float
            } else {
                dtype.kind()
            };
            let weights = WeightFile::open(&files.weights, device, kind, weight_rounding)?;
            Ok(Self {
                network: Network::load(&weights, &config)?,
                engine: Engine::new(device),
                dtype,
                streams: AtomicUsize::new(0),
            })
        })
    }

    /// The process-wide copy of a checkpoint on a device in a dtype: loaded by the first
    /// caller, shared by every later one, freed when the last user drops it.
    pub fn shared(path: &Path, device: Device, dtype: Dtype) -> Result<Arc<Self>, ModelError> {
        type Key = (PathBuf, Device, Dtype);
        static LOADED: LazyLock<Mutex<HashMap<Key, Weak<Model>>>> = LazyLock::new(Default::default);

        // The same folder reached by another spelling is the same model.
        let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
        // Held while loading, so that concurrent starts load a checkpoint once.
        let mut loaded = LOADED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loaded.retain(|_, model| model.strong_count() > 0);
        let key = (path, device, dtype);
        if let Some(model) = loaded.get(&key).and_then(Weak::upgrade) {
            return Ok(model);
        }
        let model = Arc::new(Self::load(&key.0, device, dtype)?);
        loaded.insert(key, Arc::downgrade(&model));
        Ok(model)
    }

    /// How many stream decoders of this model are alive: the most steps a batch can hold now.
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Counts a stream decoder in (`true`, when it starts) or out (when it ends).
    pub(crate) fn count_stream(&self, started: bool) {
        if started {
            self.streams.fetch_add(1, Ordering::Relaxed);
        } else {
            self.streams.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn config(&self) -> &DecoderConfig {
        self.network.config()
    }

    pub fn device(&self) -> Device {
        self.network.device()
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn samples_per_frame(&self) -> usize {
        self.config().samples_per_frame()
    }

    pub fn sample_rate(&self) -> u32 {
        self.config().sample_rate
    }

    /// Checks whole frames of codes (frame-major) against the codebook size; `first_frame` is
    /// the stream's index of the first of them, for the error.
    pub fn check_codes(&self, codes: &[i16], first_frame: u64) -> Result<(), DecodeError> {
        let codebooks = self.config().num_quantizers;
        if !codes.len().is_multiple_of(codebooks) {
            return Err(DecodeError::PartialFrame {
                codes: codes.len(),
                codebooks,
            });
        }
        let codebook_size = self.config().codebook_size;
        match codes.iter().position(|&c| c < 0 || c as usize >= codebook_size) {
            Some(index) => Err(DecodeError::InvalidCode {
                frame: first_frame + (index / codebooks) as u64,
                codebook: index % codebooks,
                value: codes[index].into(),
                codebook_size,
            }),
            None => Ok(()),
        }
    }

    /// How long a warm step of `rows` streams of `frames` frames takes, measured once per
    /// shape (a few steps of silence on the arena's scratch row, through the path batches take)
    /// and kept.
    pub fn warm_step_time(
        &self,
        rows: usize,
        frames: usize,
        cuda_graphs: bool,
    ) -> Result<std::time::Duration, DecodeError> {
        Ok(self
            .engine
            .warm_step_time(&self.network, rows, frames, cuda_graphs)?)
    }

    /// Has this model's device's compute thread run each CPU op on `threads` threads (libtorch's
    /// intra-op threads, OpenMP's team), e.g. for a server that may take only a share of the
    /// host's cores; the threads it runs on now. The setting belongs to the compute thread,
    /// which every model on the device shares (see `executor`).
    pub fn limit_compute_threads(&self, threads: usize) -> usize {
        executor::run(self.device(), || match self.device() {
            tch::Device::Cpu => super::threads::pin(threads),
            _ => {
                tch::set_num_threads(threads.clamp(1, i32::MAX as usize) as i32);
                tch::get_num_threads() as usize
            }
        })
    }

    /// Whether this model's compute threads are pinned (by [`Self::limit_compute_threads`] or
    /// `OMP_NUM_THREADS`) rather than following the steps' times (CPU only).
    pub fn compute_threads_pinned(&self) -> bool {
        self.device() != tch::Device::Cpu || executor::run(self.device(), super::threads::pinned)
    }

    /// The threads this model's compute thread runs each CPU op on.
    pub fn compute_threads(&self) -> usize {
        executor::run(self.device(), || tch::get_num_threads() as usize)
    }

    /// Calls `observer` after every batch of steps this model runs from now on (on the thread
    /// that ran it: keep it short), e.g. for a server's metrics.
    pub fn observe_batches(&self, observer: impl Fn(&BatchRun) + Send + Sync + 'static) {
        self.engine.observe(observer);
    }

    /// Has the steps that would replay a CUDA graph run through the graphs' bookkeeping
    /// (buckets of rows padded with the scratch row, rows as a tensor of arena indices, graphs
    /// dropped when the arena moves) eagerly, on any device: for tests where no GPU is.
    #[doc(hidden)]
    pub fn replay_graphs_eagerly(&self) {
        self.engine.replay_graphs_eagerly();
    }

    /// How long the next batch waits for the streams of the batch before to hand over their
    /// next steps, in place of [`REJOIN_GRACE`]: for tests where batches must stay whole by
    /// count, whatever the machine's timing.
    #[doc(hidden)]
    pub fn set_rejoin_grace(&self, grace: std::time::Duration) {
        self.engine.set_rejoin_grace(grace);
    }

    /// Steps of this model's streams handed over and not yet run.
    pub fn steps_waiting(&self) -> usize {
        self.engine.steps_waiting()
    }

    /// Rows of the state arena that holds every stream's state (the scratch row included; 0
    /// before the first stream): it grows with the streams open and shrinks as they end.
    pub fn state_rows(&self) -> usize {
        self.engine.state_rows()
    }

    /// The CUDA graphs this model's engine recorded for batched steps (none off CUDA).
    pub fn cuda_graphs(&self) -> GraphReport {
        self.engine.graph_report()
    }

    pub(super) fn network(&self) -> &Network {
        &self.network
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.engine
    }
}
