//! The model loaded (or shared) at NULL→READY, with progress messages; at each READY→PAUSED
//! the stream's decoder made from it and warmed up, and the latency set.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_audio::prelude::*;

use super::imp::{CAT, LoadedModel, QwenCodecDec};
use super::latency::Latency;
use super::settings::{Settings, Stats};
use super::step_thread::read_ahead_frames;
use crate::model::{self, DecodeError, Model, ModelError, StepLimits, StreamDecoder};

/// Read when `model-path` is unset, so that decodebin and playbin can plug the decoder.
const MODEL_PATH_ENV: &str = "QWENCODEC_MODEL_PATH";

/// The progress messages' code for the model load.
const PROGRESS_CODE: &str = "load-model";

/// What the properties read at NULL→READY ask for.
struct ModelSettings {
    path: PathBuf,
    device: tch::Device,
    dtype: model::Dtype,
}

impl ModelSettings {
    fn from_settings(settings: &Settings) -> Result<Self, gst::ErrorMessage> {
        let path = settings
            .model_path
            .clone()
            .or_else(|| std::env::var(MODEL_PATH_ENV).ok())
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| {
                gst::error_msg!(
                    gst::LibraryError::Settings,
                    (
                        "No model: set the model-path property or the {} environment variable",
                        MODEL_PATH_ENV
                    )
                )
            })?;
        let device = model::parse_device(&settings.device)
            .map_err(|err| gst::error_msg!(gst::LibraryError::Settings, ("{}", err)))?;
        Ok(Self {
            path,
            device,
            dtype: settings.dtype.into(),
        })
    }
}

fn load_error(path: &std::path::Path, err: ModelError) -> gst::ErrorMessage {
    let message = format!("Cannot load the model from {}: {err}", path.display());
    match err {
        ModelError::Io { .. } | ModelError::Checkpoint(_) | ModelError::MissingTensor { .. } => {
            gst::error_msg!(gst::ResourceError::OpenRead, ("{}", message))
        }
        ModelError::Config(_) | ModelError::ShapeMismatch { .. } => {
            gst::error_msg!(gst::StreamError::Format, ("{}", message))
        }
        ModelError::Device(_) | ModelError::Torch(_) => {
            gst::error_msg!(gst::LibraryError::Init, ("{}", message))
        }
    }
}

fn decoder_error(err: DecodeError) -> gst::ErrorMessage {
    gst::error_msg!(gst::LibraryError::Init, ("{}", err))
}

impl QwenCodecDec {
    fn post_progress(&self, kind: gst::ProgressType, text: &str) {
        let message = gst::message::Progress::builder(kind, PROGRESS_CODE, text)
            .src(&*self.obj())
            .build();
        let _ = self.obj().post_message(message);
    }

    /// NULL→READY: loads the model (or shares the one loaded by another element), posting the
    /// load as progress messages.
    pub(super) fn load_model(&self, settings: &Settings) -> Result<LoadedModel, gst::ErrorMessage> {
        self.post_progress(gst::ProgressType::Start, "Loading the Qwen3-TTS decoder");
        let loaded = ModelSettings::from_settings(settings)
            .and_then(|wanted| self.load_checkpoint(&wanted, settings.compute_threads));
        match &loaded {
            Ok(loaded) => self.post_progress(
                gst::ProgressType::Complete,
                &format!("Loaded the Qwen3-TTS decoder from {}", loaded.path.display()),
            ),
            Err(err) => self.post_progress(gst::ProgressType::Error, &err.to_string()),
        }
        loaded
    }

    fn load_checkpoint(
        &self,
        wanted: &ModelSettings,
        compute_threads: u32,
    ) -> Result<LoadedModel, gst::ErrorMessage> {
        gst::info!(
            CAT,
            imp = self,
            "Loading {} on {:?} ({})",
            wanted.path.display(),
            wanted.device,
            wanted.dtype
        );
        let loading = Instant::now();
        let model = Model::shared(&wanted.path, wanted.device, wanted.dtype)
            .map_err(|err| load_error(&wanted.path, err))?;
        let config = model.config();
        gst::info!(
            CAT,
            imp = self,
            "Loaded {} in {:.2} s: {} codebooks, {} Hz, {} samples per frame",
            wanted.path.display(),
            loading.elapsed().as_secs_f64(),
            config.num_quantizers,
            config.sample_rate,
            model.samples_per_frame()
        );
        if compute_threads > 0 {
            // The compute thread is the process's: every stream on this device computes so.
            model.limit_compute_threads(compute_threads as usize);
        }
        gst::info!(
            CAT,
            imp = self,
            "Computing on {} threads{}; {}",
            model.compute_threads(),
            if model.compute_threads_pinned() {
                ""
            } else {
                ", or fewer while fewer are faster (a busy machine)"
            },
            model::wait_policy()
        );
        if let Some(note) = model::dtype_note(wanted.dtype, model.device()) {
            gst::info!(CAT, imp = self, "{}", note);
        }
        Ok(LoadedModel {
            model,
            path: wanted.path.clone(),
        })
    }

    /// READY→PAUSED: the stream's decoder, by the current settings, warmed up; the latency set.
    pub(super) fn start_decoder(
        &self,
        model: &Arc<Model>,
        settings: &Settings,
    ) -> Result<StreamDecoder, gst::ErrorMessage> {
        let mut decoder = self.stream_decoder(model, settings)?;
        let (step_time, cuda_graph) = warm_up(&mut decoder)?;
        if model.device().is_cuda() && settings.cuda_graphs {
            self.check_cuda_graphs(model, cuda_graph);
        }
        let latency = Latency::measure(
            model,
            decoder.chunk_frames(),
            decoder.limits(),
            read_ahead_frames(&decoder),
            settings.processing_latency,
        )
        .map_err(decoder_error)?;
        gst::info!(
            CAT,
            imp = self,
            "Latency: {} to {} (chunk-frames {}, batches of {} rows: {} streams open on the model, \
             max-batch {})",
            latency.min,
            latency.max,
            decoder.chunk_frames(),
            latency.rows(),
            model.open_streams(),
            decoder.limits().max_batch
        );
        self.obj().set_latency(latency.min, latency.max);
        gst::element_imp_info!(
            self,
            gst::LibraryError::Init,
            (
                "Qwen3-TTS decoder ready on {:?} ({}){}, warm-up step {:.1} ms, latency {} to {}",
                model.device(),
                model.dtype(),
                if cuda_graph { ", CUDA graphs" } else { "" },
                step_time.as_secs_f64() * 1e3,
                latency.min,
                latency.max
            )
        );
        *self.latency() = Some(latency);
        *self.stats() = Stats {
            sample_rate: model.config().sample_rate,
            state_bytes: decoder.state_bytes() as u64,
            cuda_graph,
            ..Stats::default()
        };
        Ok(decoder)
    }

    fn stream_decoder(
        &self,
        model: &Arc<Model>,
        settings: &Settings,
    ) -> Result<StreamDecoder, gst::ErrorMessage> {
        let mut decoder = StreamDecoder::new(
            model.clone(),
            settings.chunk_frames as usize,
            settings.tail_strategy.into(),
        )
        .map_err(decoder_error)?;
        decoder.set_limits(StepLimits {
            max_batch: settings.max_batch as usize,
            max_step_frames: settings.max_step_frames as usize,
            cuda_graphs: settings.cuda_graphs,
        });
        let limits = decoder.limits();
        if limits.max_batch > 1 {
            gst::info!(
                CAT,
                imp = self,
                "Batching on: steps join those of other streams of the model, up to {} rows; \
                 waiting frames join into steps of up to {} frames",
                limits.max_batch,
                limits.max_step_frames
            );
        } else {
            gst::info!(
                CAT,
                imp = self,
                "Batching off (max-batch 1); waiting frames join into steps of up to {} frames",
                limits.max_step_frames
            );
        }
        Ok(decoder)
    }

    /// Warns when the warm-up step, which was to replay one of the model's CUDA graphs, ran
    /// eagerly: the same audio, only slower.
    fn check_cuda_graphs(&self, model: &Model, replayed: bool) {
        if replayed {
            return;
        }
        let why = model
            .cuda_graphs()
            .failure
            .unwrap_or_else(|| "none was recorded".into());
        gst::element_imp_warning!(
            self,
            gst::LibraryError::Init,
            ("Decoding without CUDA graphs: {}", why)
        );
    }
}

/// One step of silence-codes checks the samples per frame and pays the first step's one-off
/// costs (on CUDA, recording the model's graph for it) before real buffers arrive; returns the
/// step's time and whether it replayed a CUDA graph.
fn warm_up(decoder: &mut StreamDecoder) -> Result<(Duration, bool), gst::ErrorMessage> {
    let model = decoder.model().clone();
    let chunk_frames = decoder.chunk_frames();
    let started = Instant::now();
    let audio = decoder
        .push(&vec![0; chunk_frames * model.config().num_quantizers])
        .map_err(decoder_error)?;
    let step_time = started.elapsed();
    let expected = chunk_frames * model.samples_per_frame();
    if audio.len() != expected {
        return Err(gst::error_msg!(
            gst::LibraryError::Init,
            (
                "Warm-up step gave {} samples instead of {}",
                audio.len(),
                expected
            )
        ));
    }
    let cuda_graph = decoder.graph_steps() > 0;
    decoder.reset().map_err(decoder_error)?;
    Ok((step_time, cuda_graph))
}
