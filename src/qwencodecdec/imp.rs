/**
 * SECTION:element-qwencodecdec
 *
 * Decodes Qwen3-TTS speech-codec frames (`audio/x-qwen3-tts-codes`: per frame, one signed
 * 16-bit little-endian code per codebook) into mono audio, as they arrive. Each stream keeps
 * the decoder's state from buffer to buffer, so the audio equals the upstream model's decode
 * of the whole sequence.
 *
 * ```text
 * gst-launch-1.0 filesrc location=codes.raw ! \
 *   audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 ! \
 *   qwencodecdec model-path=/models/Qwen3-TTS-Tokenizer-12Hz ! \
 *   audioconvert ! wavenc ! filesink location=speech.wav
 * ```
 *
 * Properties are read when the element starts (READY→PAUSED): a change while it runs takes
 * effect at the next start.
 */
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_audio::prelude::*;
use gst_audio::subclass::prelude::*;

use crate::model::{self, DecodeError, Model, ModelError, StepLimits, StreamDecoder};

/// Read when `model-path` is unset, so that decodebin and playbin can plug the decoder.
const MODEL_PATH_ENV: &str = "QWENCODEC_MODEL_PATH";
const MAX_CHUNK_FRAMES: u32 = 4096;
const MAX_BATCH: u32 = 1024;

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "qwencodecdec",
        gst::DebugColorFlags::empty(),
        Some("Qwen3-TTS codec decoder"),
    )
});

#[derive(Debug, Clone)]
struct Settings {
    model_path: Option<String>,
    device: String,
    dtype: super::Dtype,
    chunk_frames: u32,
    tail_strategy: super::TailStrategy,
    cuda_graphs: bool,
    max_batch: u32,
    max_step_frames: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            model_path: None,
            device: "auto".into(),
            dtype: super::Dtype::default(),
            chunk_frames: 1,
            tail_strategy: super::TailStrategy::default(),
            cuda_graphs: true,
            max_batch: StepLimits::default().max_batch as u32,
            max_step_frames: StepLimits::default().max_step_frames as u32,
        }
    }
}

/// Counters behind the `stats` property, kept apart from the state so that reading them
/// never waits for a decode step.
#[derive(Debug, Default, Clone)]
struct Stats {
    frames_in: u64,
    samples_out: u64,
    steps: u64,
    step_time: Duration,
    max_step_time: Duration,
    state_bytes: u64,
    sample_rate: u32,
    cuda_graph: bool,
    mean_batch_rows: f64,
    max_batch_rows: u64,
}

impl Stats {
    fn to_structure(&self) -> gst::Structure {
        let mean_step_ms = if self.steps > 0 {
            self.step_time.as_secs_f64() * 1e3 / self.steps as f64
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
            .field("samples-out", self.samples_out)
            .field("decode-steps", self.steps)
            .field("mean-step-ms", mean_step_ms)
            .field("max-step-ms", self.max_step_time.as_secs_f64() * 1e3)
            .field("real-time-factor", real_time_factor)
            .field("state-bytes", self.state_bytes)
            .field("cuda-graph", self.cuda_graph)
            .field("mean-batch-rows", self.mean_batch_rows)
            .field("max-batch-rows", self.max_batch_rows)
            .build()
    }
}

/// Audio ready to go downstream, for `input_buffers` input buffers of the base class queue.
struct Output {
    input_buffers: i32,
    audio: Vec<f32>,
}

struct State {
    decoder: StreamDecoder,
    model_path: PathBuf,
    /// Negotiated output sample format (F32LE or S16LE).
    format: gst_audio::AudioFormat,
    /// Bytes of a frame cut by a buffer boundary, waiting for the rest.
    partial_frame: Vec<u8>,
    /// Per input buffer not yet finished, oldest first: how many frames start in it. A buffer
    /// is finished, and its audio pushed, once all of them are decoded, so every output buffer
    /// starts where an input buffer's frames start and takes that buffer's timestamp.
    frames_per_input: VecDeque<usize>,
    /// Decoded audio of the unfinished input buffers.
    audio: Vec<f32>,
    /// Caps refused already: upstream sends them again before each buffer, and one error
    /// message is enough.
    refused_caps: Option<gst::Caps>,
    /// Decoder counters already added to the stats (the decoder's restart with each stream).
    counted_steps: u64,
    counted_step_time: Duration,
    /// Rows of the batches of the steps counted before this stream began.
    counted_batch_rows: f64,
}

impl State {
    fn model(&self) -> &Arc<Model> {
        self.decoder.model()
    }

    fn frame_bytes(&self) -> usize {
        2 * self.model().config().num_quantizers
    }

    fn samples_per_frame(&self) -> usize {
        self.model().samples_per_frame()
    }

    /// Takes one input buffer and decodes the whole frames it completes. On bad codes, the
    /// frames before the bad one are still decoded.
    fn push_bytes(&mut self, data: &[u8]) -> Result<(), DecodeError> {
        let frame_bytes = self.frame_bytes();
        let carried = self.partial_frame.len();
        let starting_here = (carried + data.len()).div_ceil(frame_bytes) - carried.div_ceil(frame_bytes);
        self.frames_per_input.push_back(starting_here);

        self.partial_frame.extend_from_slice(data);
        let whole = self.partial_frame.len() / frame_bytes * frame_bytes;
        let codes: Vec<i16> = self
            .partial_frame
            .drain(..whole)
            .as_slice()
            .chunks_exact(2)
            .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
            .collect();
        let frames_before = self.decoder.frames_in();
        match self.decoder.push(&codes) {
            Ok(audio) => {
                self.audio.extend(audio);
                Ok(())
            }
            Err(err @ DecodeError::InvalidCode { frame, .. }) => {
                let valid = (frame - frames_before) as usize * (frame_bytes / 2);
                self.audio.extend(self.decoder.push(&codes[..valid])?);
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// The input buffers whose frames are all decoded, with their audio.
    fn finished_buffers(&mut self) -> Option<Output> {
        let samples_per_frame = self.samples_per_frame();
        let mut decoded_frames = self.audio.len() / samples_per_frame;
        let mut frames = 0;
        let mut input_buffers = 0;
        while let Some(&starting) = self.frames_per_input.front() {
            if starting > decoded_frames {
                break;
            }
            decoded_frames -= starting;
            frames += starting;
            input_buffers += 1;
            self.frames_per_input.pop_front();
        }
        (input_buffers > 0).then(|| Output {
            input_buffers,
            audio: self.audio.drain(..frames * samples_per_frame).collect(),
        })
    }

    /// Ends the stream: decodes the frames still waiting and hands out everything decoded, for
    /// every queued input buffer. Returns the output and the bytes of a cut frame dropped.
    fn drain(&mut self) -> Result<(Option<Output>, usize), DecodeError> {
        let tail = self.decoder.finish()?;
        self.audio.extend(tail);
        let dropped = std::mem::take(&mut self.partial_frame).len();
        let input_buffers = std::mem::take(&mut self.frames_per_input).len();
        let output = (input_buffers > 0).then(|| Output {
            input_buffers: input_buffers as i32,
            audio: std::mem::take(&mut self.audio),
        });
        Ok((output, dropped))
    }

    /// Forgets the stream: the next frame decodes as on a fresh decoder.
    fn reset(&mut self, stats: &mut Stats) -> Result<(), DecodeError> {
        self.count(stats);
        self.decoder.reset()?;
        self.partial_frame.clear();
        self.frames_per_input.clear();
        self.audio.clear();
        self.counted_batch_rows = stats.mean_batch_rows * stats.steps as f64;
        self.counted_steps = 0;
        self.counted_step_time = Duration::ZERO;
        Ok(())
    }

    /// Adds the decoder's new steps to the stats.
    fn count(&mut self, stats: &mut Stats) {
        let (step_time, max_step_time) = self.decoder.step_times();
        stats.steps += self.decoder.steps() - self.counted_steps;
        stats.step_time += step_time - self.counted_step_time;
        stats.max_step_time = stats.max_step_time.max(max_step_time);
        stats.state_bytes = self.decoder.state_bytes() as u64;
        let (mean_rows, max_rows) = self.decoder.batch_rows();
        if stats.steps > 0 {
            stats.mean_batch_rows =
                (self.counted_batch_rows + mean_rows * self.decoder.steps() as f64) / stats.steps as f64;
        }
        stats.max_batch_rows = stats.max_batch_rows.max(max_rows as u64);
        self.counted_steps = self.decoder.steps();
        self.counted_step_time = step_time;
    }
}

/// Audio in the negotiated sample format.
fn output_buffer(audio: &[f32], format: gst_audio::AudioFormat) -> gst::Buffer {
    let bytes: Vec<u8> = match format {
        gst_audio::AudioFormat::S16le => audio
            .iter()
            .flat_map(|&sample| ((sample * 32767.0).round() as i16).to_le_bytes())
            .collect(),
        _ => audio.iter().flat_map(|sample| sample.to_le_bytes()).collect(),
    };
    gst::Buffer::from_mut_slice(bytes)
}

#[derive(Default)]
pub struct QwenCodecDec {
    settings: Mutex<Settings>,
    state: Mutex<Option<State>>,
    stats: Mutex<Stats>,
}

impl QwenCodecDec {
    fn state(&self) -> MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap()
    }

    fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats.lock().unwrap()
    }

    fn load(&self, settings: &Settings) -> Result<State, gst::ErrorMessage> {
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
        if model.device().is_cuda() && settings.cuda_graphs {
            // Eager steps give the same audio, only slower: a failed capture is not fatal.
            if let Err(err) = decoder.capture_cuda_graph() {
                gst::element_imp_warning!(
                    self,
                    gst::LibraryError::Init,
                    ("Decoding without a CUDA graph: {}", err)
                );
            }
        }

        // Warm-up: one step of silence-codes checks the samples per frame and pays the first
        // step's one-off costs before real buffers arrive.
        let config = model.config();
        let warm_up = Instant::now();
        let audio = decoder
            .push(&vec![0; settings.chunk_frames as usize * config.num_quantizers])
            .map_err(decoder_error)?;
        let step_time = warm_up.elapsed();
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
                if decoder.uses_cuda_graph() {
                    ", CUDA graph"
                } else {
                    ""
                },
                step_time.as_secs_f64() * 1e3,
                latency
            )
        );

        *self.stats() = Stats {
            sample_rate: config.sample_rate,
            state_bytes: decoder.state_bytes() as u64,
            cuda_graph: decoder.uses_cuda_graph(),
            ..Stats::default()
        };
        Ok(State {
            decoder,
            model_path,
            format: gst_audio::AudioFormat::F32le,
            partial_frame: Vec::new(),
            frames_per_input: VecDeque::new(),
            audio: Vec::new(),
            refused_caps: None,
            counted_steps: 0,
            counted_step_time: Duration::ZERO,
            counted_batch_rows: 0.0,
        })
    }

    /// Pushes decoded audio downstream through the base class, which stamps it.
    fn push_output(
        &self,
        output: Option<Output>,
        format: gst_audio::AudioFormat,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let Some(Output { input_buffers, audio }) = output else {
            return Ok(gst::FlowSuccess::Ok);
        };
        if audio.is_empty() {
            return self.obj().finish_frame(None, input_buffers);
        }
        let buffer = output_buffer(&audio, format);
        self.stats().samples_out += audio.len() as u64;
        self.obj().finish_frame(Some(buffer), input_buffers)
    }

    /// Decodes what the stream still holds, pushes it, and starts a fresh stream.
    fn drain(&self) -> Result<gst::FlowSuccess, gst::FlowError> {
        let mut guard = self.state();
        let Some(state) = guard.as_mut() else {
            return Ok(gst::FlowSuccess::Ok);
        };
        let drained = state.drain();
        let mut stats = self.stats();
        let reset = state.reset(&mut stats);
        drop(stats);
        let format = state.format;
        drop(guard);

        let (output, dropped) = drained.map_err(|err| self.decode_error(err))?;
        reset.map_err(|err| self.decode_error(err))?;
        if dropped > 0 {
            gst::element_imp_warning!(
                self,
                gst::StreamError::Decode,
                (
                    "Dropped {} bytes at the end of the stream: an incomplete frame",
                    dropped
                )
            );
        }
        self.push_output(output, format)
    }

    /// Drops everything of the current stream (flushing seek).
    fn reset_stream(&self) {
        if let Some(state) = self.state().as_mut()
            && let Err(err) = state.reset(&mut self.stats())
        {
            gst::warning!(CAT, imp = self, "Cannot reset the decoder: {}", err);
        }
    }

    /// Posts the error for caps refused, once for the same caps: upstream sends them again
    /// before each buffer.
    fn refuse_caps(
        &self,
        state: &mut State,
        caps: &gst::Caps,
        error: gst::ErrorMessage,
    ) -> gst::LoggableError {
        if state.refused_caps.as_ref() != Some(caps) {
            state.refused_caps = Some(caps.clone());
            self.post_error_message(error);
        }
        gst::loggable_error!(CAT, "Caps {} refused", caps)
    }

    fn decode_error(&self, err: DecodeError) -> gst::FlowError {
        match err {
            DecodeError::InvalidCode { .. } | DecodeError::PartialFrame { .. } => {
                gst::element_imp_error!(self, gst::StreamError::Decode, ("Invalid codec frame: {}", err));
            }
            _ => {
                gst::element_imp_error!(self, gst::LibraryError::Failed, ("Decoding failed: {}", err));
            }
        }
        gst::FlowError::Error
    }
}

#[glib::object_subclass]
impl ObjectSubclass for QwenCodecDec {
    const NAME: &'static str = "GstQwenCodecDec";
    type Type = super::QwenCodecDec;
    type ParentType = gst_audio::AudioDecoder;
}

impl ObjectImpl for QwenCodecDec {
    fn constructed(&self) {
        self.parent_constructed();
        self.obj().set_needs_format(true);
    }

    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                glib::ParamSpecString::builder("model-path")
                    .nick("Model path")
                    .blurb(
                        "Qwen3-TTS tokenizer checkpoint folder (config.json + model.safetensors) or the root \
                         of a full Qwen3-TTS checkpoint (its speech_tokenizer/ folder is used); when unset, \
                         the QWENCODEC_MODEL_PATH environment variable",
                    )
                    .build(),
                glib::ParamSpecString::builder("device")
                    .nick("Device")
                    .blurb("Where to decode: auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
                    .default_value(Some("auto"))
                    .build(),
                glib::ParamSpecEnum::builder_with_default("dtype", Settings::default().dtype)
                    .nick("Data type")
                    .blurb("Precision of the decoder's computation")
                    .build(),
                glib::ParamSpecUInt::builder("chunk-frames")
                    .nick("Chunk frames")
                    .blurb(
                        "Frames per decode step; frames wait until a step is full, so the latency grows \
                         by (chunk-frames - 1) frames",
                    )
                    .minimum(1)
                    .maximum(MAX_CHUNK_FRAMES)
                    .default_value(Settings::default().chunk_frames)
                    .build(),
                glib::ParamSpecEnum::builder_with_default("tail-strategy", Settings::default().tail_strategy)
                    .nick("Tail strategy")
                    .blurb("How the frames left over at the end of a stream (fewer than chunk-frames) are decoded")
                    .build(),
                glib::ParamSpecBoolean::builder("cuda-graphs")
                    .nick("CUDA graphs")
                    .blurb(
                        "On CUDA, record a full decode step as a CUDA graph at start and replay it for \
                         every full step (one launch instead of hundreds); off: launch each kernel",
                    )
                    .default_value(Settings::default().cuda_graphs)
                    .build(),
                glib::ParamSpecUInt::builder("max-batch")
                    .nick("Max batch")
                    .blurb(
                        "The most streams whose steps this element's steps may be computed with: the \
                         elements of a process that decode with the same model (path, device, dtype) have \
                         the steps that wait at the same moment computed together, and a batch holds at \
                         most the smallest max-batch of its streams; 1 computes this element's steps alone",
                    )
                    .minimum(1)
                    .maximum(MAX_BATCH)
                    .default_value(Settings::default().max_batch)
                    .build(),
                glib::ParamSpecUInt::builder("max-step-frames")
                    .nick("Max step frames")
                    .blurb(
                        "When more than one step's frames wait (a buffer of many frames, or a backlog), \
                         they are decoded in steps of chunk-frames times a power of two, up to this many \
                         frames (at least chunk-frames): fewer, cheaper steps, the same audio",
                    )
                    .minimum(1)
                    .maximum(MAX_CHUNK_FRAMES)
                    .default_value(Settings::default().max_step_frames)
                    .build(),
                glib::ParamSpecBoxed::builder::<gst::Structure>("stats")
                    .nick("Statistics")
                    .blurb(
                        "Since start: frames-in, samples-out, decode-steps, mean-step-ms, max-step-ms, \
                         real-time-factor (decode time / audio time), state-bytes of the stream, \
                         cuda-graph (whether full steps replay a CUDA graph), mean-batch-rows and \
                         max-batch-rows (the streams computed together in this element's steps)",
                    )
                    .read_only()
                    .build(),
            ]
        });
        PROPERTIES.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut settings = self.settings.lock().unwrap();
        match pspec.name() {
            "model-path" => settings.model_path = value.get().unwrap(),
            "device" => {
                settings.device = value
                    .get::<Option<String>>()
                    .unwrap()
                    .unwrap_or_else(|| "auto".into())
            }
            "dtype" => settings.dtype = value.get().unwrap(),
            "chunk-frames" => settings.chunk_frames = value.get().unwrap(),
            "tail-strategy" => settings.tail_strategy = value.get().unwrap(),
            "cuda-graphs" => settings.cuda_graphs = value.get().unwrap(),
            "max-batch" => settings.max_batch = value.get().unwrap(),
            "max-step-frames" => settings.max_step_frames = value.get().unwrap(),
            _ => unreachable!(),
        }
        if self.state.try_lock().map_or(true, |state| state.is_some()) {
            gst::info!(
                CAT,
                imp = self,
                "{} changed while running: it takes effect at the next start",
                pspec.name()
            );
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        let settings = self.settings.lock().unwrap();
        match pspec.name() {
            "model-path" => settings.model_path.to_value(),
            "device" => settings.device.to_value(),
            "dtype" => settings.dtype.to_value(),
            "chunk-frames" => settings.chunk_frames.to_value(),
            "tail-strategy" => settings.tail_strategy.to_value(),
            "cuda-graphs" => settings.cuda_graphs.to_value(),
            "max-batch" => settings.max_batch.to_value(),
            "max-step-frames" => settings.max_step_frames.to_value(),
            "stats" => self.stats().to_structure().to_value(),
            _ => unreachable!(),
        }
    }
}

impl GstObjectImpl for QwenCodecDec {}

impl ElementImpl for QwenCodecDec {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static ELEMENT_METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "Qwen3-TTS codec decoder",
                "Codec/Decoder/Audio",
                "Decodes Qwen3-TTS speech-codec frames into audio, streaming, exactly as the full-sequence \
                 decode. Example: filesrc location=codes.raw ! \
                 audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 ! qwencodecdec model-path=MODEL ! \
                 audioconvert ! wavenc ! filesink location=speech.wav",
                "qwencodec developers",
            )
        });
        Some(&*ELEMENT_METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static PAD_TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let sink_caps = crate::any_codes_caps().build();
            let src_caps = gst_audio::AudioCapsBuilder::new_interleaved()
                .format_list([gst_audio::AudioFormat::F32le, gst_audio::AudioFormat::S16le])
                .channels(1)
                .build();
            vec![
                gst::PadTemplate::new(
                    "sink",
                    gst::PadDirection::Sink,
                    gst::PadPresence::Always,
                    &sink_caps,
                )
                .unwrap(),
                gst::PadTemplate::new("src", gst::PadDirection::Src, gst::PadPresence::Always, &src_caps)
                    .unwrap(),
            ]
        });
        PAD_TEMPLATES.as_ref()
    }
}

impl AudioDecoderImpl for QwenCodecDec {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = self.settings.lock().unwrap().clone();
        let state = self.load(&settings)?;
        *self.state() = Some(state);
        // Lets the base class turn a BYTES segment (e.g. straight from filesrc) into TIME
        // through the sink's convert query. Set here: the base class clears it on each start.
        self.obj().set_estimate_rate(true);
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        *self.state() = None;
        Ok(())
    }

    fn set_format(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let mut guard = self.state();
        let state = guard
            .as_mut()
            .ok_or_else(|| gst::loggable_error!(CAT, "Caps before start"))?;
        let config = state.model().config().clone();
        let s = caps
            .structure(0)
            .ok_or_else(|| gst::loggable_error!(CAT, "Empty caps"))?;
        let model_rate = {
            let (num, den) = config.frame_rate();
            gst::Fraction::new(num as i32, den as i32)
        };
        let codebooks = s.get::<i32>("codebooks").ok();
        let framerate = s.get::<gst::Fraction>("framerate").ok();
        if codebooks != Some(config.num_quantizers as i32) || framerate != Some(model_rate) {
            let show = |v: Option<String>| v.unwrap_or_else(|| "none".into());
            let error = gst::error_msg!(
                gst::StreamError::Format,
                (
                    "Caps {} do not fit the model at {}: codebooks={} (model has {}), framerate={} (model has {})",
                    caps,
                    state.model_path.display(),
                    show(codebooks.map(|c| c.to_string())),
                    config.num_quantizers,
                    show(framerate.map(|f| f.to_string())),
                    model_rate
                )
            );
            return Err(self.refuse_caps(state, caps, error));
        }

        let wanted = gst_audio::AudioCapsBuilder::new_interleaved()
            .format_list([gst_audio::AudioFormat::F32le, gst_audio::AudioFormat::S16le])
            .rate(config.sample_rate as i32)
            .channels(1)
            .build();
        let peer = self.obj().src_pad().peer_query_caps(None);
        let mut output = wanted.intersect_with_mode(&peer, gst::CapsIntersectMode::First);
        if output.is_empty() {
            let error = gst::error_msg!(
                gst::CoreError::Negotiation,
                (
                    "Downstream takes neither F32LE nor S16LE mono at {} Hz, the model's rate: it takes {}",
                    config.sample_rate,
                    peer
                )
            );
            return Err(self.refuse_caps(state, caps, error));
        }
        state.refused_caps = None;
        output.fixate();
        let info = gst_audio::AudioInfo::from_caps(&output)
            .map_err(|_| gst::loggable_error!(CAT, "Cannot use output caps {}", output))?;
        gst::debug!(CAT, imp = self, "Input {}, output {}", caps, output);
        state.format = info.format();
        drop(guard);
        self.obj()
            .set_output_format(&info)
            .map_err(|err| gst::loggable_error!(CAT, "Cannot set output format: {:?}", err))
    }

    fn handle_frame(&self, buffer: Option<&gst::Buffer>) -> Result<gst::FlowSuccess, gst::FlowError> {
        let Some(buffer) = buffer else {
            return self.drain();
        };
        let map = buffer.map_readable().map_err(|_| {
            gst::element_imp_error!(self, gst::CoreError::Failed, ["Cannot map the input buffer"]);
            gst::FlowError::Error
        })?;

        let mut guard = self.state();
        let state = guard.as_mut().ok_or(gst::FlowError::Flushing)?;
        let frames_before = state.decoder.frames_in();
        let pushed = state.push_bytes(map.as_slice());
        let mut stats = self.stats();
        stats.frames_in += state.decoder.frames_in() - frames_before;
        state.count(&mut stats);
        drop(stats);
        let format = state.format;
        match pushed {
            Ok(()) => {
                let output = state.finished_buffers();
                drop(guard);
                self.push_output(output, format)
            }
            Err(err) => {
                // Push what the frames before the bad one gave, then fail.
                drop(guard);
                let _ = self.drain();
                Err(self.decode_error(err))
            }
        }
    }

    fn flush(&self, hard: bool) {
        gst::debug!(CAT, imp = self, "Flushing (hard: {})", hard);
        self.reset_stream();
    }

    /// The sink caps are the codes' own; the base class would otherwise copy the rate and
    /// channels that downstream wants onto them.
    fn caps(&self, filter: Option<&gst::Caps>) -> gst::Caps {
        let template = self.obj().sink_pad().pad_template_caps();
        match filter {
            Some(filter) => filter.intersect_with_mode(&template, gst::CapsIntersectMode::First),
            None => template,
        }
    }

    /// Bytes and time convert exactly: a frame is a fixed number of bytes and of nanoseconds.
    /// This also lets the base class take a BYTES segment (e.g. straight from filesrc).
    fn sink_query(&self, query: &mut gst::QueryRef) -> bool {
        if let gst::QueryViewMut::Convert(convert) = query.view_mut() {
            let (source, destination) = convert.get();
            let geometry = self.state().as_ref().map(|state| {
                let (num, den) = state.model().config().frame_rate();
                (state.frame_bytes() as u128, num as u128, den as u128)
            });
            if let (Some((frame_bytes, num, den)), Some(value)) = (geometry, source.value().try_into().ok()) {
                let value: u64 = value;
                let second = gst::ClockTime::SECOND.nseconds() as u128;
                let converted = match (source.format(), destination) {
                    (gst::Format::Bytes, gst::Format::Time) => {
                        Some(value as u128 * den * second / (frame_bytes * num))
                    }
                    (gst::Format::Time, gst::Format::Bytes) => {
                        Some(value as u128 * num / (den * second) * frame_bytes)
                    }
                    _ => None,
                };
                if let Some(converted) = converted.and_then(|v| u64::try_from(v).ok()) {
                    convert.set(
                        source,
                        gst::GenericFormattedValue::new(destination, converted as i64),
                    );
                    return true;
                }
            }
        }
        self.parent_sink_query(query)
    }

    fn sink_event(&self, event: gst::Event) -> bool {
        // A new stream (e.g. from concat, without EOS in between) starts from a fresh decoder,
        // after the old one's frames are out.
        match event.view() {
            gst::EventView::StreamStart(_) => {
                let _ = self.drain();
            }
            // The base class calls flush() only once it has output something; frames still
            // waiting for a step must go too.
            gst::EventView::FlushStop(_) => self.reset_stream(),
            _ => (),
        }
        self.parent_sink_event(event)
    }
}
