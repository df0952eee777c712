/**
 * SECTION:element-qwencodecparse
 *
 * Frames Qwen3-TTS speech-codec codes for `qwencodecdec`: reads `.npy` files (an integer array
 * of shape [T, Q] or [1, T, Q], as `np.save` writes the talker's codes) or raw streams of
 * little-endian int16 frames, and pushes buffers of whole frames as S16LE codes with exact
 * timestamps. It answers duration and position queries and seeks: a seek starts
 * `seek-context-frames` frames before the target, so that the stateful decoder has warmed up
 * when the audio starts at the target (the decoder clips what comes before).
 *
 * ```text
 * gst-launch-1.0 filesrc location=codes.npy ! qwencodecparse ! \
 *   qwencodecdec model-path=/models/Qwen3-TTS-Tokenizer-12Hz ! \
 *   audioconvert ! wavenc ! filesink location=speech.wav
 * ```
 *
 * With the typefinder of this plugin, `decodebin` and `playbin` plug it for `.npy` files.
 */
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::prelude::*;

use super::layout::{Declared, Input, Layout};
use crate::caps::CODES_MEDIA_TYPE;
use crate::npy::{self, FrameFormat, HeaderRead, IntType};
use crate::typefind::NPY_MEDIA_TYPE;
/// Magic, version and length field of a version 1 `.npy` file: enough to learn the header's
/// length.
const NPY_PRELUDE_BYTES: u32 = 10;
const MAX_FRAMES_PER_BUFFER: u32 = 1024;
const MAX_SEEK_CONTEXT_FRAMES: u32 = 10_000;
/// The seek index gets an entry a second; on streams longer than this many seconds, fewer,
/// so that it stays small (but at least one every ten seconds).
const INDEX_ENTRIES_MAX: u64 = 8192;

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "qwencodecparse",
        gst::DebugColorFlags::empty(),
        Some("Qwen3-TTS codec frame parser"),
    )
});

#[derive(Debug, Clone, Copy)]
struct Settings {
    framerate: gst::Fraction,
    frames_per_buffer: u32,
    seek_context_frames: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            framerate: gst::Fraction::new(25, 2),
            frames_per_buffer: 1,
            seek_context_frames: 25,
        }
    }
}

struct State {
    settings: Settings,
    input: Input,
    layout: Option<Arc<Layout>>,
    /// The index after the last frame pushed.
    next_frame: u64,
    /// Whether a short stream was reported since the last flush, so that it is said once.
    end_reported: bool,
    /// Whether parsing failed (and said why) since the last flush: the base class offers the
    /// same bytes again on every new buffer and at EOS, and the error is posted once.
    failed: bool,
}

impl State {
    fn new(settings: Settings) -> Self {
        Self {
            settings,
            input: Input::Unknown,
            layout: None,
            next_frame: 0,
            end_reported: false,
            failed: false,
        }
    }

    /// The warning for the end of the data, once per run to the end.
    fn end_warning(&mut self, frames_end: u64, partial: u64) -> Option<String> {
        let warning = self.layout.as_ref()?.shortfall(frames_end, partial)?;
        (!std::mem::replace(&mut self.end_reported, true)).then_some(warning)
    }
}

/// What comes next for the bytes at hand while the layout is not known.
enum Next {
    /// Wait for more bytes.
    Wait,
    /// Skip this many bytes (the `.npy` header).
    Skip(u32),
    /// The layout is known: parse frames.
    Frames,
}

#[derive(Default)]
pub struct QwenCodecParse {
    settings: Mutex<Settings>,
    state: Mutex<Option<State>>,
}

impl QwenCodecParse {
    /// Turns the bytes at the frame's offset into one output buffer of whole frames, or says
    /// how many bytes to skip or wait for.
    fn parse_frame(
        &self,
        mut frame: gst_base::BaseParseFrame,
    ) -> Result<(gst::FlowSuccess, u32), gst::FlowError> {
        let offset = frame.offset();
        let input = frame.buffer().ok_or(gst::FlowError::Error)?.to_owned();
        let map = input.map_readable().map_err(|_| {
            gst::element_imp_error!(self, gst::CoreError::Failed, ["Cannot map the input buffer"]);
            gst::FlowError::Error
        })?;
        let data = map.as_slice();

        let (layout, settings) = {
            let guard = self.state();
            let state = guard.as_ref().ok_or(gst::FlowError::Flushing)?;
            (state.layout.clone(), state.settings)
        };
        let layout = match layout {
            Some(layout) => layout,
            None => match self.find_layout(offset, data)? {
                Next::Wait => return Ok((gst::FlowSuccess::Ok, 0)),
                Next::Skip(bytes) => return Ok((gst::FlowSuccess::Ok, bytes)),
                Next::Frames => self
                    .state()
                    .as_ref()
                    .and_then(|state| state.layout.clone())
                    .ok_or(gst::FlowError::Flushing)?,
            },
        };

        // Start on a frame: after the header, and on a frame boundary whatever offset the base
        // class resumes at.
        let frame_bytes = layout.frame_bytes();
        let Some(relative) = offset.checked_sub(layout.data_offset) else {
            return Ok((gst::FlowSuccess::Ok, (layout.data_offset - offset) as u32));
        };
        let misaligned = relative % frame_bytes;
        if misaligned != 0 {
            return Ok((gst::FlowSuccess::Ok, (frame_bytes - misaligned) as u32));
        }
        let first = relative / frame_bytes;
        let mut frames = (data.len() as u64 / frame_bytes).min(settings.frames_per_buffer as u64);
        if let Some(declared) = &layout.declared {
            if first >= declared.frames {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Format,
                    (
                        "The .npy header lies about the size: {} has {} bytes of data, but more follow it",
                        declared.description,
                        declared.frames * frame_bytes
                    )
                );
                return Err(gst::FlowError::Error);
            }
            frames = frames.min(declared.frames - first);
        }
        if frames == 0 {
            // Less than a frame: the base class gives that only when the stream ends.
            if self.obj().is_draining() {
                let warning = self
                    .state()
                    .as_mut()
                    .and_then(|state| state.end_warning(first, data.len() as u64));
                self.post_warning(warning);
                return Ok((gst::FlowSuccess::Ok, data.len() as u32));
            }
            return Ok((gst::FlowSuccess::Ok, 0));
        }

        let payload_bytes = (frames * frame_bytes) as usize;
        let codes = layout
            .format
            .to_codes(&data[..payload_bytes], first)
            .map_err(|err| {
                gst::element_imp_error!(self, gst::StreamError::Decode, ("Code out of range: {}", err));
                gst::FlowError::Error
            })?;
        let mut output = gst::Buffer::from_mut_slice(
            codes
                .iter()
                .flat_map(|code| code.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        {
            let output = output.make_mut();
            let start = layout.frame_time(first);
            output.set_pts(start);
            output.set_duration(
                layout
                    .frame_time(first + frames)
                    .zip(start)
                    .map(|(end, start)| end - start),
            );
            output.set_offset(first);
            output.set_offset_end(first + frames);
        }
        drop(map);
        frame.set_output_buffer(output);

        let frames_end = first + frames;
        if let Some(state) = self.state().as_mut() {
            state.next_frame = frames_end;
        }
        self.obj().finish_frame(frame, payload_bytes as u32)?;

        // With the input's size known, the last whole frame is the end: say now what is missing,
        // after its audio.
        if let Some((whole, partial)) = layout.present
            && frames_end == whole
        {
            let warning = self
                .state()
                .as_mut()
                .and_then(|state| state.end_warning(frames_end, partial));
            self.post_warning(warning);
        }
        Ok((gst::FlowSuccess::Ok, 0))
    }

    /// Held only briefly, never while calling into the base class or pushing: a query from
    /// downstream may come back to `convert` in the meantime.
    fn state(&self) -> MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap()
    }

    fn upstream_size(&self) -> Option<u64> {
        self.obj()
            .sink_pad()
            .peer_query_duration::<gst::format::Bytes>()
            .map(|bytes| *bytes)
    }

    /// What the input is when no caps said it: upstream's caps (in pull mode no caps event
    /// comes, but a capsfilter still answers), else the `.npy` magic.
    fn detect(&self, data: &[u8]) -> Result<Input, gst::FlowError> {
        let peer = self.obj().sink_pad().peer_query_caps(None);
        if let Some(input) = Input::from_caps(&peer) {
            return Ok(input);
        }
        if data.starts_with(npy::MAGIC) {
            return Ok(Input::Npy);
        }
        gst::element_imp_error!(
            self,
            gst::StreamError::WrongType,
            (
                "Cannot tell what the input is: it is not a .npy file, and no caps say {},codebooks=Q",
                CODES_MEDIA_TYPE
            )
        );
        Err(gst::FlowError::NotNegotiated)
    }

    /// Learns the layout from caps or the `.npy` header at the start of the stream.
    fn find_layout(&self, offset: u64, data: &[u8]) -> Result<Next, gst::FlowError> {
        let (mut input, settings) = {
            let guard = self.state();
            let state = guard.as_ref().ok_or(gst::FlowError::Flushing)?;
            (state.input, state.settings)
        };
        if input == Input::Unknown {
            input = self.detect(data)?;
        }
        let (layout, skip) = match input {
            Input::Raw { codebooks, framerate } => {
                let layout = Layout {
                    data_offset: 0,
                    format: FrameFormat {
                        dtype: IntType::I16_LE,
                        codebooks,
                    },
                    framerate: framerate.unwrap_or(settings.framerate),
                    framerate_stated: framerate.is_some(),
                    declared: None,
                    present: None,
                };
                (layout, None)
            }
            Input::Npy | Input::Unknown => {
                if offset != 0 {
                    gst::element_imp_error!(
                        self,
                        gst::StreamError::Format,
                        (
                            "The .npy data starts at byte {} of the stream, without its header",
                            offset
                        )
                    );
                    return Err(gst::FlowError::Error);
                }
                let header = match npy::read_header(data) {
                    Ok(HeaderRead::Complete(header)) => header,
                    Ok(HeaderRead::Incomplete { needed }) => {
                        let size = self.upstream_size();
                        if self.obj().is_draining() || size.is_some_and(|size| size < needed as u64) {
                            gst::element_imp_error!(
                                self,
                                gst::StreamError::Format,
                                (
                                    "The stream ends inside the .npy header: it holds {} bytes, the header needs {}",
                                    size.unwrap_or(data.len() as u64),
                                    needed
                                )
                            );
                            return Err(gst::FlowError::Error);
                        }
                        gst::debug!(CAT, imp = self, "Waiting for {} bytes of .npy header", needed);
                        self.obj().set_min_frame_size(needed as u32);
                        return Ok(Next::Wait);
                    }
                    Err(err) => {
                        let kind = match err {
                            npy::HeaderError::NotNpy => gst::StreamError::WrongType,
                            _ => gst::StreamError::Format,
                        };
                        gst::element_imp_error!(self, kind, ("Invalid .npy header: {}", err));
                        return Err(gst::FlowError::Error);
                    }
                };
                gst::debug!(CAT, imp = self, "{:?}", header);
                let description = format!(
                    "the .npy header (shape {}, dtype {})",
                    header.shape_string(),
                    header.format.dtype
                );
                let layout = Layout {
                    data_offset: header.data_offset as u64,
                    format: header.format,
                    framerate: settings.framerate,
                    framerate_stated: false,
                    declared: Some(Declared {
                        frames: header.frames,
                        description,
                    }),
                    present: None,
                };
                (layout, Some(header.data_offset as u32))
            }
        };
        let layout = self.configure(layout, &settings)?;
        if let Some(state) = self.state().as_mut() {
            state.input = input;
            state.layout = Some(layout);
        }
        Ok(skip.map_or(Next::Frames, Next::Skip))
    }

    /// Checks the layout against the input's size and sets up the base class and the caps.
    fn configure(&self, mut layout: Layout, settings: &Settings) -> Result<Arc<Layout>, gst::FlowError> {
        let frame_bytes = layout.frame_bytes();
        if let Some(size) = self.upstream_size()
            && let Some(data_bytes) = size.checked_sub(layout.data_offset)
        {
            layout.present = Some((data_bytes / frame_bytes, data_bytes % frame_bytes));
            if let Some(declared) = &layout.declared
                && data_bytes > declared.frames * frame_bytes
            {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Format,
                    (
                        "The .npy header lies about the size: {} has {} bytes of data, but {} bytes follow it",
                        declared.description,
                        declared.frames * frame_bytes,
                        data_bytes
                    )
                );
                return Err(gst::FlowError::Error);
            }
        }
        let obj = self.obj();
        let mut accepted = true;
        if !layout.framerate_stated {
            // The rate of the decoder downstream (its model's), where one is linked. decodebin
            // links one only once it has seen caps: first caps without a rate, then ask again.
            if self.downstream_framerate().is_none() {
                accepted = obj
                    .src_pad()
                    .push_event(gst::event::Caps::new(&layout.src_caps_without_rate()));
            }
            if let Some(rate) = self.downstream_framerate() {
                layout.framerate = rate;
            }
        }
        accepted &= obj
            .src_pad()
            .push_event(gst::event::Caps::new(&layout.src_caps()));
        gst::info!(
            CAT,
            imp = self,
            "{} codebooks of {} at {} frames/s from byte {}, {:?} frames",
            layout.format.codebooks,
            layout.format.dtype,
            layout.framerate,
            layout.data_offset,
            layout.playable_frames()
        );
        if !accepted {
            // Downstream says why (the decoder: caps that do not fit its model).
            gst::warning!(CAT, imp = self, "Downstream refuses {}", layout.src_caps());
            return Err(if obj.src_pad().pad_flags().contains(gst::PadFlags::FLUSHING) {
                gst::FlowError::Flushing
            } else {
                gst::FlowError::NotNegotiated
            });
        }
        // A decoder must warm up its state on frames before a seek target: the base class seeks
        // this many frames earlier and pushes them, while the segment starts at the target.
        obj.set_frame_rate(layout.framerate, settings.seek_context_frames, 0);
        obj.set_min_frame_size((frame_bytes * settings.frames_per_buffer as u64) as u32);
        if let Some(frames) = layout.playable_frames() {
            if let Some(duration) = layout.frame_time(frames) {
                obj.set_duration(duration, 0);
            }
            // Seeks go through the base class's index: with an entry every second or so, every
            // seek is accurate and starts at the lead-in before the target, never from the
            // start and never without lead-in.
            let second = (layout.framerate.numer() as u64).div_ceil(layout.framerate.denom() as u64);
            let stride = second
                .max(frames.div_ceil(INDEX_ENTRIES_MAX))
                .min(10 * second)
                .max(1);
            for index in (0..frames).step_by(stride as usize) {
                if let Some(time) = layout.frame_time(index) {
                    obj.add_index_entry(layout.data_offset + index * frame_bytes, time, true, true);
                }
            }
        }
        Ok(Arc::new(layout))
    }

    /// The frame rate downstream takes, where it takes one only (a decoder with its model).
    fn downstream_framerate(&self) -> Option<gst::Fraction> {
        let caps = self.obj().src_pad().peer_query_caps(None);
        let s = caps.structure(0).filter(|_| caps.size() == 1)?;
        s.get::<gst::Fraction>("framerate")
            .ok()
            .filter(|f| f.numer() > 0 && f.denom() > 0)
    }

    fn post_warning(&self, warning: Option<String>) {
        if let Some(warning) = warning {
            gst::element_imp_warning!(self, gst::StreamError::Decode, ("{}", warning));
        }
    }
}

#[glib::object_subclass]
impl ObjectSubclass for QwenCodecParse {
    const NAME: &'static str = "GstQwenCodecParse";
    type Type = super::QwenCodecParse;
    type ParentType = gst_base::BaseParse;
}

impl ObjectImpl for QwenCodecParse {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            let defaults = Settings::default();
            vec![
                gst::ParamSpecFraction::builder("framerate")
                    .nick("Frame rate")
                    .blurb(
                        "Codec frames per second where the input does not say, as in .npy files \
                         (25/2 for the released 12 Hz tokenizer)",
                    )
                    .minimum(gst::Fraction::new(1, i32::MAX))
                    .maximum(gst::Fraction::new(i32::MAX, 1))
                    .default_value(defaults.framerate)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("frames-per-buffer")
                    .nick("Frames per buffer")
                    .blurb("Codec frames in each output buffer (the last one may hold fewer)")
                    .minimum(1)
                    .maximum(MAX_FRAMES_PER_BUFFER)
                    .default_value(defaults.frames_per_buffer)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("seek-context-frames")
                    .nick("Seek context frames")
                    .blurb(
                        "After a seek, frames pushed before the target so that the decoder's state has \
                         warmed up when the audio starts at the target",
                    )
                    .maximum(MAX_SEEK_CONTEXT_FRAMES)
                    .default_value(defaults.seek_context_frames)
                    .mutable_ready()
                    .build(),
            ]
        });
        PROPERTIES.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut settings = self.settings.lock().unwrap();
        match pspec.name() {
            "framerate" => settings.framerate = value.get().unwrap(),
            "frames-per-buffer" => settings.frames_per_buffer = value.get().unwrap(),
            "seek-context-frames" => settings.seek_context_frames = value.get().unwrap(),
            _ => unreachable!(),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        let settings = self.settings.lock().unwrap();
        match pspec.name() {
            "framerate" => settings.framerate.to_value(),
            "frames-per-buffer" => settings.frames_per_buffer.to_value(),
            "seek-context-frames" => settings.seek_context_frames.to_value(),
            _ => unreachable!(),
        }
    }
}

impl GstObjectImpl for QwenCodecParse {}

impl ElementImpl for QwenCodecParse {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static ELEMENT_METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "Qwen3-TTS codec frame parser",
                "Codec/Parser/Audio",
                "Parses Qwen3-TTS codec frames from .npy files or raw int16 codes",
                env!("CARGO_PKG_AUTHORS"),
            )
        });
        Some(&*ELEMENT_METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static PAD_TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let sink_caps = gst::Caps::builder_full()
                .structure(gst::Structure::new_empty(NPY_MEDIA_TYPE))
                .structure(
                    gst::Structure::builder(CODES_MEDIA_TYPE)
                        .field("codebooks", gst::IntRange::new(1, i32::MAX))
                        .build(),
                )
                .build();
            let src_caps = crate::caps::any_codes_caps().field("parsed", true).build();
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

impl BaseParseImpl for QwenCodecParse {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = *self.settings.lock().unwrap();
        *self.state() = Some(State::new(settings));
        self.obj().set_min_frame_size(NPY_PRELUDE_BYTES);
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        *self.state() = None;
        Ok(())
    }

    fn set_sink_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let input =
            Input::from_caps(caps).ok_or_else(|| gst::loggable_error!(CAT, "Cannot parse caps {}", caps))?;
        let mut guard = self.state();
        let state = guard
            .as_mut()
            .ok_or_else(|| gst::loggable_error!(CAT, "Caps before start"))?;
        if state.input != input {
            gst::debug!(CAT, imp = self, "Input {:?}", input);
            state.input = input;
            state.layout = None;
        }
        Ok(())
    }

    fn handle_frame(
        &self,
        frame: gst_base::BaseParseFrame,
    ) -> Result<(gst::FlowSuccess, u32), gst::FlowError> {
        if self.state().as_ref().is_some_and(|state| state.failed) {
            return Err(gst::FlowError::Error);
        }
        let result = self.parse_frame(frame);
        if result == Err(gst::FlowError::Error)
            && let Some(state) = self.state().as_mut()
        {
            state.failed = true;
        }
        result
    }

    /// Exact: a frame is a fixed number of bytes (after the header) and of nanoseconds.
    /// DEFAULT counts frames.
    fn convert(
        &self,
        src_val: impl gst::format::FormattedValue,
        dest_format: gst::Format,
    ) -> Option<gst::GenericFormattedValue> {
        let src_val = src_val.into();
        if src_val.format() == dest_format {
            return Some(src_val);
        }
        // -1 is "none" in every format.
        if src_val.value() == -1 {
            return Some(gst::GenericFormattedValue::new(dest_format, -1));
        }
        let Some(layout) = self.state().as_ref().and_then(|state| state.layout.clone()) else {
            // The stream's start is the start in every format. (The base class converts a
            // BYTES segment before any data came.)
            return (src_val.value() == 0).then(|| gst::GenericFormattedValue::new(dest_format, 0));
        };
        let value = u64::try_from(src_val.value()).ok()?;
        let frame_bytes = layout.frame_bytes();
        let frame = match src_val.format() {
            gst::Format::Bytes => value.saturating_sub(layout.data_offset) / frame_bytes,
            gst::Format::Time => layout.frame_at(gst::ClockTime::from_nseconds(value))?,
            gst::Format::Default => value,
            _ => return None,
        };
        let converted = match dest_format {
            gst::Format::Bytes => frame.checked_mul(frame_bytes)?.checked_add(layout.data_offset)?,
            gst::Format::Time => layout.frame_time(frame)?.nseconds(),
            gst::Format::Default => frame,
            _ => return None,
        };
        Some(gst::GenericFormattedValue::new(
            dest_format,
            i64::try_from(converted).ok()?,
        ))
    }

    fn sink_event(&self, event: gst::Event) -> bool {
        match event.view() {
            gst::EventView::FlushStop(_) => {
                if let Some(state) = self.state().as_mut() {
                    state.end_reported = false;
                    state.failed = false;
                }
            }
            // A new stream (e.g. from concat) has its own header.
            gst::EventView::StreamStart(_) => {
                let restarted = self.state().as_mut().is_some_and(|state| {
                    let started = state.layout.is_some();
                    if started {
                        *state = State::new(state.settings);
                    }
                    started
                });
                if restarted {
                    self.obj().set_min_frame_size(NPY_PRELUDE_BYTES);
                }
            }
            // Where the input's size is unknown, its end is known here, once the frames still
            // held are pushed. (Where it is known, the last frame told, and an EOS may also
            // come from a segment's stop.)
            gst::EventView::Eos(_) => {
                self.obj().drain();
                let warning = self.state().as_mut().and_then(|state| {
                    let size_unknown = state.layout.as_ref()?.present.is_none();
                    let frames_end = state.next_frame;
                    size_unknown.then(|| state.end_warning(frames_end, 0))?
                });
                self.post_warning(warning);
            }
            _ => (),
        }
        self.parent_sink_event(event)
    }
}
