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
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use gst::glib;
use gst::glib::translate::ToGlibPtr;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_audio::prelude::*;
use gst_audio::subclass::prelude::*;

use super::settings::{Settings, Stats};
use super::stream::{Output, StepThread, Stream};
use crate::model::DecodeError;

const MAX_CHUNK_FRAMES: u32 = 4096;
const MAX_BATCH: u32 = 1024;

pub(super) static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "qwencodecdec",
        gst::DebugColorFlags::empty(),
        Some("Qwen3-TTS codec decoder"),
    )
});

/// A started element: its stream and the thread that decodes it.
struct State {
    stream: Arc<Stream>,
    /// Declared after `stream`'s users: stopping it waits for the step in flight.
    _steps: StepThread,
    model_path: PathBuf,
    /// Caps refused already: upstream sends them again before each buffer, and one error
    /// message is enough.
    refused_caps: Option<gst::Caps>,
}

/// The base class's stream lock (`GST_AUDIO_DECODER_STREAM_LOCK`, recursive), which
/// gstreamer-rs does not wrap. Audio goes downstream under it, from the step thread as from the
/// streaming thread, and the base class flushes under it: a flush falls between two pushes.
struct StreamLockGuard(*mut glib::ffi::GRecMutex);

impl Drop for StreamLockGuard {
    fn drop(&mut self) {
        // SAFETY: locked by this guard in `QwenCodecDec::stream_lock`, on this thread; the
        // element (and so the mutex) outlives the guard, which lives inside one of its methods.
        unsafe { glib::ffi::g_rec_mutex_unlock(self.0) }
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

    pub(super) fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats.lock().unwrap()
    }

    fn stream(&self) -> Option<Arc<Stream>> {
        self.state().as_ref().map(|state| state.stream.clone())
    }

    fn stream_lock(&self) -> StreamLockGuard {
        let decoder: *mut gst_audio::ffi::GstAudioDecoder = self
            .obj()
            .upcast_ref::<gst_audio::AudioDecoder>()
            .to_glib_none()
            .0;
        // SAFETY: `decoder` points to this live element's GstAudioDecoder instance, whose
        // `stream_lock` is a GRecMutex initialised by the base class for the element's life;
        // recursive, so taking it where the base class already holds it (handle_frame, flush)
        // is allowed.
        unsafe {
            let mutex = std::ptr::addr_of_mut!((*decoder).stream_lock);
            glib::ffi::g_rec_mutex_lock(mutex);
            StreamLockGuard(mutex)
        }
    }

    /// Pushes decoded audio downstream through the base class, which stamps it.
    fn push_output(
        &self,
        Output { input_buffers, audio }: Output,
        format: gst_audio::AudioFormat,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        if audio.is_empty() {
            return self.obj().finish_frame(None, input_buffers);
        }
        let buffer = output_buffer(&audio, format);
        self.stats().samples_out += audio.len() as u64;
        self.obj().finish_frame(Some(buffer), input_buffers)
    }

    /// Pushes the audio of the steps finished so far, in order, under the stream lock; a
    /// failed push is kept for the streaming thread to return.
    pub(super) fn push_outbox(&self, stream: &Stream) {
        let _lock = self.stream_lock();
        loop {
            let mut inner = stream.lock();
            let Some(output) = inner.next_output() else {
                return;
            };
            let format = inner.format;
            drop(inner);
            if let Err(err) = self.push_output(output, format) {
                gst::debug!(CAT, imp = self, "Pushing audio: {:?}", err);
                stream.lock().flow = Err(err);
                return;
            }
        }
    }

    /// Decodes what the stream still holds (after the step in flight), pushing each step's
    /// audio as it ends, and starts a fresh stream.
    fn drain(&self) -> Result<gst::FlowSuccess, gst::FlowError> {
        let Some(stream) = self.stream() else {
            return Ok(gst::FlowSuccess::Ok);
        };
        let _lock = self.stream_lock();
        stream.lock().set_draining(true);
        drop(stream.lock_idle());
        let result = self.drain_idle(&stream);
        let mut inner = stream.lock();
        let reset = inner.reset(&mut self.stats());
        inner.set_draining(false);
        drop(inner);
        stream.wake();
        let flow = result?;
        reset.map_err(|err| self.decode_error(err))?;
        Ok(flow)
    }

    /// The drain with the step thread idle: what it finished, then the remaining steps and the
    /// tail on this thread.
    fn drain_idle(&self, stream: &Stream) -> Result<gst::FlowSuccess, gst::FlowError> {
        self.push_outbox(stream);
        let mut flow = stream.lock().flow;
        loop {
            let mut inner = stream.lock();
            let format = inner.format;
            let step = inner.step_here();
            drop(inner);
            match step {
                None => break,
                Some(Ok(output)) => {
                    if let Some(output) = output {
                        flow = flow.and(self.push_output(output, format));
                    }
                }
                Some(Err(err)) => return Err(self.decode_error(err)),
            }
        }
        let mut inner = stream.lock();
        let format = inner.format;
        let finished = inner.finish();
        drop(inner);
        let (output, dropped) = finished.map_err(|err| self.decode_error(err))?;
        if let Some(output) = output {
            flow = flow.and(self.push_output(output, format));
        }
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
        flow
    }

    /// Drops everything of the current stream (flushing seek), once the step in flight is
    /// done; its audio is dropped too.
    fn reset_stream(&self) {
        let Some(stream) = self.stream() else { return };
        let mut inner = stream.lock_idle();
        if let Err(err) = inner.reset(&mut self.stats()) {
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

    pub(super) fn decode_error(&self, err: DecodeError) -> gst::FlowError {
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
                    .blurb(
                        "Precision of the decoder's computation: f32; f16 (float16 weights; on the CPU with \
                         float32 activations, the precise reduced mode); bf16 (bfloat16 weights and \
                         products, the fast one)",
                    )
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
                        "On CUDA, let this element's steps replay the CUDA graphs the model records per \
                         batch size and step size (one launch instead of hundreds; a batch replays one \
                         when all its streams allow it); off: launch each kernel",
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
        let (decoder, model_path) = self.load(&settings)?;
        let stream = Stream::new(decoder);
        let steps = stream.spawn_steps(self.obj().downgrade()).map_err(|err| {
            gst::error_msg!(
                gst::LibraryError::Init,
                ("Cannot start the decoding thread: {}", err)
            )
        })?;
        *self.state() = Some(State {
            stream,
            _steps: steps,
            model_path,
            refused_caps: None,
        });
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
        let config = state.stream.lock().model().config().clone();
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
        state.stream.lock().format = info.format();
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

        let stream = self.stream().ok_or(gst::FlowError::Flushing)?;
        let mut inner = stream.lock();
        // What the step thread met since the last buffer: a failed step or push.
        inner.flow?;
        let accepted = inner.accept(map.as_slice());
        drop(inner);
        match accepted {
            Ok(frames) => {
                self.stats().frames_in += frames;
                stream.wake();
                // The audio of steps finished meanwhile goes from here too: a streaming thread
                // handed buffer after buffer holds the stream lock nearly all the time, and the
                // step thread would wait for it until the buffers stop coming.
                self.push_outbox(&stream);
                stream.lock().flow
            }
            Err(err) => {
                // Push what the frames before the bad one give, then fail.
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
                let inner = state.stream.lock();
                let config = inner.model().config();
                let (num, den) = config.frame_rate();
                (2 * config.num_quantizers as u128, num as u128, den as u128)
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
