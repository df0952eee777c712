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
 * The model loads at NULL→READY (posted as progress messages) and stays loaded until
 * READY→NULL: `model-path`, `device` and `dtype` are read then, so a change takes effect at the
 * next NULL→READY. The other properties are read at READY→PAUSED.
 *
 * A code outside the codebook goes through the base class's error count (`max-errors`): let
 * pass (the default, -1), the buffer's frames from the bad one on are dropped with a warning
 * naming the code, and decoding starts afresh after it; past `max-errors` it is an error.
 */
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_audio::prelude::*;
use gst_audio::subclass::prelude::*;

use super::latency::Latency;
use super::settings::{
    DEFAULT_CHUNK_FRAMES, DEFAULT_COMPUTE_THREADS, DEFAULT_CUDA_GRAPHS, DEFAULT_DEVICE, DEFAULT_DTYPE,
    DEFAULT_MAX_BATCH, DEFAULT_MAX_PLC_FRAMES, DEFAULT_MAX_STEP_FRAMES, DEFAULT_PROCESSING_LATENCY,
    DEFAULT_TAIL_STRATEGY, Settings, Stats,
};
use super::step_thread::{Arrival, StepThread, Stream, read_ahead_frames};
use crate::caps::RefusedCaps;
use crate::model::Model;

/// The largest step: one of 256 frames needs about 1 GB at the released widths (4 MB a frame,
/// measured on the CPU), a batch of N such steps N times that.
const MAX_STEP_FRAMES: u32 = 256;
const MAX_BATCH: u32 = 1024;

/// The `audio-codec` tag of the audio out.
const CODEC_NAME: &str = "Qwen3-TTS speech codec";

/// The model as loaded at NULL→READY, kept until READY→NULL.
pub(super) struct LoadedModel {
    pub(super) model: Arc<Model>,
    pub(super) path: PathBuf,
}

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
    /// The input's last segment since the start or the last flush.
    segment: Option<gst::Segment>,
}

#[derive(Default)]
pub struct QwenCodecDec {
    settings: Mutex<Settings>,
    /// From NULL→READY to READY→NULL.
    model: Mutex<Option<LoadedModel>>,
    /// From READY→PAUSED to PAUSED→READY.
    state: Mutex<Option<State>>,
    stats: Mutex<Stats>,
    /// The latency reported, from READY→PAUSED on.
    latency: Mutex<Option<Latency>>,
    refused_caps: RefusedCaps,
    /// A test's request that the step thread panic in its next step (see `plant_step_panic`).
    planted_panic: std::sync::atomic::AtomicBool,
}

impl QwenCodecDec {
    pub(super) fn settings(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap()
    }

    fn state(&self) -> MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap()
    }

    /// The counters, also after a panic of the step thread while it held them.
    pub(super) fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn latency(&self) -> MutexGuard<'_, Option<Latency>> {
        self.latency.lock().unwrap()
    }

    pub(super) fn stream(&self) -> Option<Arc<Stream>> {
        self.state().as_ref().map(|state| state.stream.clone())
    }

    /// Has the step thread panic in its next step, holding the decoder: for tests of what a
    /// panic does.
    pub(super) fn plant_step_panic(&self) {
        self.planted_panic
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a test planted a panic for this step (see [`Self::plant_step_panic`]).
    pub(super) fn take_planted_panic(&self) -> bool {
        self.planted_panic
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// The running time now, if the element has a clock.
    pub(super) fn now(&self) -> Option<gst::ClockTime> {
        let obj = self.obj();
        obj.clock()?.time().checked_sub(obj.base_time()?)
    }

    /// The running time of an input timestamp, by the input's segment.
    pub(super) fn running_time(&self, pts: Option<gst::ClockTime>) -> Option<gst::ClockTime> {
        let state = self.state();
        let segment = state.as_ref()?.segment.as_ref()?;
        segment.downcast_ref::<gst::ClockTime>()?.to_running_time(pts?)
    }

    /// Keeps the input's segment; returns the one before.
    fn set_segment(&self, segment: Option<gst::Segment>) -> Option<gst::Segment> {
        let mut state = self.state();
        let state = state.as_mut()?;
        std::mem::replace(&mut state.segment, segment)
    }

    /// Posts the error for caps refused, once for the same caps (see [`RefusedCaps`]).
    fn refuse_caps(&self, caps: &gst::Caps, error: gst::ErrorMessage) -> gst::LoggableError {
        if self.refused_caps.first_time(caps) {
            self.post_error_message(error);
        }
        gst::loggable_error!(CAT, "Caps {} refused", caps)
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
        self.pace_upstream();
        self.obj().set_needs_format(true);
        // Accept-caps takes any caps of the template, also those the model cannot decode (which
        // the caps query leaves out): set_format then says why they do not fit, where a refusal
        // there would end the stream with a bare not-negotiated. The pad's ACCEPT_TEMPLATE flag
        // is how GStreamer says so.
        self.obj().set_use_default_pad_acceptcaps(true);
        self.obj()
            .sink_pad()
            .set_pad_flags(gst::PadFlags::ACCEPT_TEMPLATE);
    }

    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                glib::ParamSpecString::builder("model-path")
                    .nick("Model path")
                    .blurb(
                        "Folder of a Qwen3-TTS tokenizer checkpoint or of a full Qwen3-TTS checkpoint \
                         (unset: the QWENCODEC_MODEL_PATH environment variable)",
                    )
                    .build(),
                glib::ParamSpecString::builder("device")
                    .nick("Device")
                    .blurb("Device to decode on: auto, cpu, cuda or cuda:N")
                    .default_value(Some(DEFAULT_DEVICE))
                    .build(),
                glib::ParamSpecEnum::builder_with_default("dtype", DEFAULT_DTYPE)
                    .nick("Data type")
                    .blurb("Precision of the decoder's weights and computation")
                    .build(),
                glib::ParamSpecUInt::builder("chunk-frames")
                    .nick("Chunk frames")
                    .blurb("Frames per decode step, which a frame waits for before it is decoded")
                    .minimum(1)
                    .maximum(MAX_STEP_FRAMES)
                    .default_value(DEFAULT_CHUNK_FRAMES)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("tail-strategy", DEFAULT_TAIL_STRATEGY)
                    .nick("Tail strategy")
                    .blurb("How the frames left at the end of a stream, fewer than chunk-frames, are decoded")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("cuda-graphs")
                    .nick("CUDA graphs")
                    .blurb("Replay the CUDA graphs the model records for its steps, on CUDA")
                    .default_value(DEFAULT_CUDA_GRAPHS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("max-batch")
                    .nick("Max batch")
                    .blurb("Most streams of the model whose steps are computed together with this element's")
                    .minimum(1)
                    .maximum(MAX_BATCH)
                    .default_value(DEFAULT_MAX_BATCH)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("max-step-frames")
                    .nick("Max step frames")
                    .blurb("Most frames a decode step takes when more than one step's frames wait")
                    .minimum(1)
                    .maximum(MAX_STEP_FRAMES)
                    .default_value(DEFAULT_MAX_STEP_FRAMES)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt64::builder("processing-latency")
                    .nick("Processing latency")
                    .blurb("Time in ns a frame waits for its decode step, fixed (0: measured and raised as needed)")
                    .default_value(DEFAULT_PROCESSING_LATENCY)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("max-plc-frames")
                    .nick("Most frames concealed")
                    .blurb("Longest loss in frames that plc fills with the last frame, beyond which decoding restarts")
                    .maximum(10_000)
                    .default_value(DEFAULT_MAX_PLC_FRAMES)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt::builder("compute-threads")
                    .nick("Compute threads")
                    .blurb("CPU threads each decode op runs on, for every stream of the process (0: chosen from the steps' times)")
                    .maximum(1024)
                    .default_value(DEFAULT_COMPUTE_THREADS)
                    .build(),
                glib::ParamSpecBoxed::builder::<gst::Structure>("stats")
                    .nick("Statistics")
                    .blurb("Decoding statistics since the element started")
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
                    .unwrap_or_else(|| DEFAULT_DEVICE.into())
            }
            "dtype" => settings.dtype = value.get().unwrap(),
            "chunk-frames" => settings.chunk_frames = value.get().unwrap(),
            "tail-strategy" => settings.tail_strategy = value.get().unwrap(),
            "cuda-graphs" => settings.cuda_graphs = value.get().unwrap(),
            "max-batch" => settings.max_batch = value.get().unwrap(),
            "max-step-frames" => settings.max_step_frames = value.get().unwrap(),
            "compute-threads" => settings.compute_threads = value.get().unwrap(),
            "max-plc-frames" => {
                settings.max_plc_frames = value.get().unwrap();
                return;
            }
            "processing-latency" => {
                settings.processing_latency =
                    Some(gst::ClockTime::from_nseconds(value.get().unwrap())).filter(|l| !l.is_zero())
            }
            _ => unreachable!(),
        }
        drop(settings);
        let (read_at, in_use) = match pspec.name() {
            "model-path" | "device" | "dtype" | "compute-threads" => {
                ("NULL→READY", self.model.try_lock().map_or(true, |m| m.is_some()))
            }
            _ => (
                "READY→PAUSED",
                self.state.try_lock().map_or(true, |state| state.is_some()),
            ),
        };
        if in_use {
            gst::info!(
                CAT,
                imp = self,
                "{} changed while in use: it takes effect at the next {}",
                pspec.name(),
                read_at
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
            "max-plc-frames" => settings.max_plc_frames.to_value(),
            "compute-threads" => settings.compute_threads.to_value(),
            "processing-latency" => settings
                .processing_latency
                .map_or(DEFAULT_PROCESSING_LATENCY, gst::ClockTime::nseconds)
                .to_value(),
            "stats" => self.stats().to_structure().to_value(),
            _ => unreachable!(),
        }
    }
}

impl GstObjectImpl for QwenCodecDec {}

impl ElementImpl for QwenCodecDec {
    fn change_state(
        &self,
        transition: gst::StateChange,
    ) -> Result<gst::StateChangeSuccess, gst::StateChangeError> {
        // The pads are deactivated next, which waits for the streaming thread: it must stop
        // waiting for room or draining now, and no step start after the one in flight.
        if transition == gst::StateChange::PausedToReady
            && let Some(stream) = self.stream()
        {
            stream.set_flushing(true);
        }
        self.parent_change_state(transition)
    }

    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static ELEMENT_METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "Qwen3-TTS codec decoder",
                "Codec/Decoder/Audio",
                "Decodes Qwen3-TTS speech-codec frames into audio",
                env!("CARGO_PKG_AUTHORS"),
            )
        });
        Some(&*ELEMENT_METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static PAD_TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let sink_caps = crate::caps::any_codes_caps().build();
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
    fn open(&self) -> Result<(), gst::ErrorMessage> {
        let settings = self.settings.lock().unwrap().clone();
        *self.model.lock().unwrap() = Some(self.load_model(&settings)?);
        Ok(())
    }

    fn close(&self) -> Result<(), gst::ErrorMessage> {
        *self.model.lock().unwrap() = None;
        Ok(())
    }

    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = self.settings.lock().unwrap().clone();
        let (model, model_path) = match &*self.model.lock().unwrap() {
            Some(loaded) => (loaded.model.clone(), loaded.path.clone()),
            None => {
                return Err(gst::error_msg!(
                    gst::CoreError::StateChange,
                    ["Started without a model"]
                ));
            }
        };
        let decoder = self.start_decoder(&model, &settings)?;
        let read_ahead = read_ahead_frames(&decoder);
        gst::debug!(
            CAT,
            imp = self,
            "Reading up to {} frames ahead of the decoder",
            read_ahead
        );
        let stream = Stream::new(decoder, read_ahead);
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
            segment: None,
        });
        // Lets the base class turn a BYTES segment (e.g. straight from filesrc) into TIME
        // through the sink's convert query. Set here: the base class clears it on each start.
        self.obj().set_estimate_rate(true);
        // Lost time (a GAP) reaches `handle_frame` as an empty buffer when `plc` is set.
        self.obj().set_plc_aware(true);
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        // Dropped with the lock let go: that waits for the step in flight.
        let state = self.state().take();
        drop(state);
        *self.latency() = None;
        self.refused_caps.forget();
        self.forget_subframes();
        Ok(())
    }

    fn set_format(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        // Read under the state lock, which is let go before the peer is asked and any message
        // posted.
        let (stream, model_path) = self
            .state()
            .as_ref()
            .map(|state| (state.stream.clone(), state.model_path.clone()))
            .ok_or_else(|| gst::loggable_error!(CAT, "Caps before start"))?;
        let config = stream.lock().model().config().clone();
        let s = caps
            .structure(0)
            .ok_or_else(|| gst::loggable_error!(CAT, "Empty caps"))?;
        let model_rate = {
            let (num, den) = config.frame_rate();
            gst::Fraction::new(num as i32, den as i32)
        };
        let codebooks = s.get::<i32>("codebooks").ok();
        // Without a rate the codes are taken at the model's (timestamps come with the buffers).
        let framerate = s.get::<gst::Fraction>("framerate").ok();
        if codebooks != Some(config.num_quantizers as i32) || framerate.is_some_and(|rate| rate != model_rate)
        {
            let show = |v: Option<String>| v.unwrap_or_else(|| "none".into());
            let error = gst::error_msg!(
                gst::StreamError::Format,
                (
                    "Caps {} do not fit the model at {}: codebooks={} (model has {}), framerate={} (model has {})",
                    caps,
                    model_path.display(),
                    show(codebooks.map(|c| c.to_string())),
                    config.num_quantizers,
                    show(framerate.map(|f| f.to_string())),
                    model_rate
                )
            );
            return Err(self.refuse_caps(caps, error));
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
            return Err(self.refuse_caps(caps, error));
        }
        self.refused_caps.forget();
        output.fixate();
        let info = gst_audio::AudioInfo::from_caps(&output)
            .map_err(|_| gst::loggable_error!(CAT, "Cannot use output caps {}", output))?;
        gst::debug!(CAT, imp = self, "Input {}, output {}", caps, output);
        stream.lock().format = info.format();
        // So that players name what they play; the base class sends the tags with the audio.
        let mut tags = gst::TagList::new();
        tags.get_mut()
            .unwrap()
            .add::<gst::tags::AudioCodec>(&CODEC_NAME, gst::TagMergeMode::Replace);
        self.obj().merge_tags(Some(&tags), gst::TagMergeMode::Replace);
        self.obj()
            .set_output_format(&info)
            .map_err(|err| gst::loggable_error!(CAT, "Cannot set output format: {:?}", err))
    }

    fn handle_frame(&self, buffer: Option<&gst::Buffer>) -> Result<gst::FlowSuccess, gst::FlowError> {
        let Some(buffer) = buffer else {
            return self.drain();
        };
        // Only the base class's packet-loss concealment hands over an empty buffer: the time of
        // a GAP, with `plc` set.
        if buffer.size() == 0 {
            return self.conceal(buffer);
        }
        if buffer.flags().contains(gst::BufferFlags::RESYNC) {
            self.start_talk_spurt();
        }
        let map = buffer.map_readable().map_err(|_| {
            gst::element_imp_error!(self, gst::CoreError::Failed, ["Cannot map the input buffer"]);
            gst::FlowError::Error
        })?;

        let stream = self.stream().ok_or(gst::FlowError::Flushing)?;
        let arrival = Arrival {
            frames: 0,
            arrived: self.now(),
            due: self.running_time(buffer.pts()),
        };
        let mut inner = stream.lock();
        // What the step thread met since the last buffer: a failed step or push, a flush.
        if let Some(stop) = inner.drain_interrupted() {
            return Err(stop);
        }
        let accepted = inner.accept(map.as_slice(), arrival);
        drop(inner);
        drop(map);
        let frames = match accepted {
            Ok(frames) => frames,
            Err(refused) => return self.refuse_buffer(&stream, refused),
        };
        self.stats().frames_in += frames;
        stream.wake();
        // The audio of steps finished meanwhile goes from here too: a streaming thread handed
        // buffer after buffer holds the stream lock nearly all the time, and the step thread
        // would wait for it until the buffers stop coming.
        self.push_outbox(&stream);
        // Upstream waits for room before its next buffer, outside the base class's lock (see
        // `pace_upstream`).
        stream.lock().flow_now()
    }

    fn flush(&self, hard: bool) {
        gst::debug!(CAT, imp = self, "Flushing (hard: {})", hard);
        self.reset_stream();
    }

    /// The sink caps are the codes' own; the base class would otherwise copy the rate and
    /// channels that downstream wants onto them. Once the model is loaded, they are the codes
    /// it takes: its codebook count and frame rate, so that a parser can take the rate from here
    /// (a `.npy` file does not state it).
    fn caps(&self, filter: Option<&gst::Caps>) -> gst::Caps {
        let mut template = self.obj().sink_pad().pad_template_caps();
        let model = self.model.lock().unwrap();
        if let Some(config) = model.as_ref().map(|loaded| loaded.model.config()) {
            let (num, den) = config.frame_rate();
            let model_caps = gst::Caps::builder(crate::caps::CODES_MEDIA_TYPE)
                .field("codebooks", config.num_quantizers as i32)
                .field("framerate", gst::Fraction::new(num as i32, den as i32))
                .build();
            template = template.intersect_with_mode(&model_caps, gst::CapsIntersectMode::First);
        }
        drop(model);
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

    /// A seek backwards is refused here, where the application asks, as an element refuses a
    /// seek it cannot do: FALSE, and a debug log. A stateful decoder cannot decode backwards.
    fn src_event(&self, event: gst::Event) -> bool {
        if let gst::EventView::Seek(seek) = event.view()
            && seek.get().0 < 0.0
        {
            gst::debug!(
                CAT,
                imp = self,
                "Seek at rate {} refused: each frame's audio depends on the frames before it, so \
                 the decoder plays forwards only",
                seek.get().0
            );
            return false;
        }
        self.parent_src_event(event)
    }

    fn src_query(&self, query: &mut gst::QueryRef) -> bool {
        let answered = self.parent_src_query(query);
        if answered && let gst::QueryViewMut::Latency(latency) = query.view_mut() {
            self.note_upstream_live(latency.result().0);
        }
        answered
    }

    fn sink_event(&self, event: gst::Event) -> bool {
        if keeps_its_place(&event) {
            return self.queue_event(event);
        }
        match event.view() {
            // A new stream (e.g. from concat, without EOS in between) needs nothing here: the
            // base class drains the old one's frames and flushes, so the next decodes fresh.
            // Not serialized: the streaming thread may be waiting for room or draining, and the
            // step thread about to start a step; all stop now (the step in flight ends).
            gst::EventView::FlushStart(_) => {
                if let Some(stream) = self.stream() {
                    stream.set_flushing(true);
                }
            }
            // The base class calls flush() only once it has output something; frames still
            // waiting for a step must go too.
            gst::EventView::FlushStop(_) => {
                self.reset_stream();
                self.set_segment(None);
                if let Some(stream) = self.stream() {
                    stream.set_flushing(false);
                }
            }
            // An application's request to end the stream here without EOS (the end of an
            // utterance on a live stream): the waiting frames are decoded and their audio
            // pushed, then the event, at once, as the base class pushes EOS after its drain;
            // the next frame starts a fresh stream.
            gst::EventView::CustomDownstream(_) if crate::drain_event::is_drain_event(&event) => {
                gst::debug!(CAT, imp = self, "Drain asked for by an event");
                return self.drain_then_push(event);
            }
            gst::EventView::Gap(_) => return self.handle_gap(event),
            gst::EventView::Segment(segment) => {
                let segment = segment.segment().clone();
                if segment.rate() < 0.0 {
                    gst::element_imp_error!(
                        self,
                        gst::StreamError::Decode,
                        (
                            "Cannot decode backwards (a segment at rate {}): each frame's audio \
                             depends on the frames before it, so the decoder plays forwards only",
                            segment.rate()
                        )
                    );
                    return false;
                }
                if let Some(previous) = self.set_segment(Some(segment.clone()))
                    && !super::segment::continues(&previous, &segment)
                {
                    // Not the continuation of the frames before it (a non-flushing seek, a
                    // looping segment seek): their stream ends here, and the next frame
                    // decodes as on a fresh decoder.
                    gst::debug!(CAT, imp = self, "New timeline {:?}: a fresh stream", segment);
                    self.drain_for_event();
                }
            }
            _ => (),
        }
        self.parent_sink_event(event)
    }
}

/// A serialized event that goes downstream in its place among the audio, after the audio of
/// the frames before it (TAG, custom events, STREAM_GROUP_DONE, …): those the base class would
/// keep until its next output, that is before the audio of frames that came before them. The
/// others are the base class's own (it drains at EOS, SEGMENT_DONE and STREAM_START, applies
/// SEGMENT and CAPS, fills a GAP), or the drain event.
fn keeps_its_place(event: &gst::Event) -> bool {
    use gst::EventType;
    event.is_serialized()
        && !crate::drain_event::is_drain_event(event)
        && !matches!(
            event.type_(),
            EventType::StreamStart
                | EventType::Segment
                | EventType::Caps
                | EventType::Gap
                | EventType::FlushStop
                | EventType::SegmentDone
                | EventType::Eos
                | EventType::InstantRateChange
        )
}

/// The latency kept true while it plays (see [`Latency`]).
impl QwenCodecDec {
    /// After a step of the step thread whose oldest frame's audio was the element's to make from
    /// `start` (running time): when it came out later than the minimum allows, in too many
    /// steps (see [`Latency`]), the minimum rises and the pipeline is told.
    pub(super) fn check_latency(&self, start: gst::ClockTime) {
        let obj = self.obj();
        if obj.current_state() != gst::State::Playing {
            return;
        }
        let Some(now) = self.now() else { return };
        let delay = now.saturating_sub(start);
        let mut latency = self.latency();
        let Some(figures) = latency.as_mut() else { return };
        if !figures.after_step(delay, std::time::Instant::now()) {
            return;
        }
        let (min, max) = (figures.min, figures.max);
        drop(latency);
        gst::info!(
            CAT,
            imp = self,
            "Frames keep coming out late ({} after they came): the latency is now {} to {}",
            delay,
            min,
            max
        );
        // Posts the LATENCY message.
        obj.set_latency(min, max);
    }

    /// How long the next step, whose oldest frame has been the element's to decode `since`
    /// (running time), may wait for the model's other live streams: [`Latency::batch_hold`],
    /// less what the frame waited already (behind a step in flight, or in a backlog).
    pub(super) fn batch_hold(&self, since: Option<gst::ClockTime>) -> std::time::Duration {
        let hold = self
            .latency()
            .as_ref()
            .map_or(std::time::Duration::ZERO, |figures| figures.batch_hold());
        let waited = since
            .zip(self.now())
            .map_or(gst::ClockTime::ZERO, |(since, now)| now.saturating_sub(since));
        hold.saturating_sub(std::time::Duration::from_nanos(waited.nseconds()))
    }

    /// Keeps whether a latency query's answer says upstream is live.
    pub(super) fn note_upstream_live(&self, live: bool) {
        if let Some(figures) = self.latency().as_mut() {
            figures.note_query(live);
        }
    }
}
