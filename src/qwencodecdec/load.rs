//! Starting the element: the model loaded (or shared), the stream's decoder made and warmed up,
//! the latency set.

use std::path::PathBuf;
use std::time::Instant;

use gst::subclass::prelude::*;
use gst_audio::prelude::*;

use super::imp::{CAT, QwenCodecDec};
use super::settings::{Settings, Stats};
use crate::model::{self, DecodeError, Model, ModelError, StepLimits, StreamDecoder};

/// Read when `model-path` is unset, so that decodebin and playbin can plug the decoder.
const MODEL_PATH_ENV: &str = "QWENCODEC_MODEL_PATH";

impl QwenCodecDec {
    /// Loads (or shares) the model and makes the stream's decoder, warmed up.
    pub(super) fn load(&self, settings: &Settings) -> Result<(StreamDecoder, PathBuf), gst::ErrorMessage> {
        let model_path = settings
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
        let dtype = match settings.dtype {
            super::Dtype::F32 => model::Dtype::F32,
            super::Dtype::Bf16 => model::Dtype::Bf16,
            super::Dtype::F16 => model::Dtype::F16,
        };
        gst::info!(
            CAT,
            imp = self,
            "Loading {} on {:?} ({}), device {:?} asked for",
            model_path.display(),
            device,
            dtype,
            settings.device
        );
        gst::element_imp_info!(
            self,
            gst::LibraryError::Init,
            (
                "Loading the Qwen3-TTS decoder from {} on {:?} ({})",
                model_path.display(),
                device,
                dtype
            )
        );
        let loading = Instant::now();
        let model = Model::shared(&model_path, device, dtype).map_err(|err| {
            let message = format!("Cannot load the model from {}: {err}", model_path.display());
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
        })?;
        let tail = match settings.tail_strategy {
            super::TailStrategy::Eager => model::TailStrategy::Eager,
            super::TailStrategy::Pad => model::TailStrategy::Pad,
        };
        let decoder_error = |err: DecodeError| gst::error_msg!(gst::LibraryError::Init, ("{}", err));
        let mut decoder =
            StreamDecoder::new(model.clone(), settings.chunk_frames as usize, tail).map_err(decoder_error)?;
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
        // Warm-up: one step of silence-codes checks the samples per frame and pays the first
        // step's one-off costs before real buffers arrive.
        let config = model.config();
        let warm_up = Instant::now();
        let audio = decoder
            .push(&vec![0; settings.chunk_frames as usize * config.num_quantizers])
            .map_err(decoder_error)?;
        let step_time = warm_up.elapsed();
        let cuda_graph = decoder.graph_steps() > 0;
        if model.device().is_cuda() && settings.cuda_graphs && !cuda_graph {
            // Eager steps give the same audio, only slower: a failed capture is not fatal.
            let why = model
                .cuda_graphs()
                .failure
                .unwrap_or_else(|| "none recorded".into());
            gst::element_imp_warning!(
                self,
                gst::LibraryError::Init,
                ("Decoding without CUDA graphs: {}", why)
            );
        }
        let expected = settings.chunk_frames as usize * model.samples_per_frame();
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
        decoder.reset().map_err(decoder_error)?;

        let (num, den) = config.frame_rate();
        let frame = gst::ClockTime::SECOND
            .mul_div_floor(den as u64, num as u64)
            .unwrap();
        let latency =
            frame * (settings.chunk_frames as u64 - 1) + gst::ClockTime::try_from(step_time).unwrap();
        self.obj().set_latency(latency, Some(latency));
        gst::element_imp_info!(
            self,
            gst::LibraryError::Init,
            (
                "Loaded the Qwen3-TTS decoder from {} in {:.2} s: {} codebooks, {} Hz, {} samples per frame, \
                 on {:?} ({}){}, warm-up step {:.1} ms, latency {}",
                model_path.display(),
                loading.elapsed().as_secs_f64(),
                config.num_quantizers,
                config.sample_rate,
                model.samples_per_frame(),
                model.device(),
                model.dtype(),
                if cuda_graph { ", CUDA graphs" } else { "" },
                step_time.as_secs_f64() * 1e3,
                latency
            )
        );

        *self.stats() = Stats {
            sample_rate: config.sample_rate,
            state_bytes: decoder.state_bytes() as u64,
            cuda_graph,
            ..Stats::default()
        };
        Ok((decoder, model_path))
    }
}
