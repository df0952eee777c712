/**
 * SECTION:element-rtpqwencodespay
 *
 * Payloads Qwen3-TTS codec frames (`audio/x-qwen3-tts-codes`, as `qwencodecdec` takes them) into
 * RTP packets of the private format `X-QWEN3-TTS-CODES`, version 1: two header bytes (the frame
 * count, the utterance number), then the codes packed at the fewest bits that hold the codebook
 * (11 for the release: 2.2 kbit/s of codes).
 *
 * The codebook size and the RTP clock (the audio's sample rate) are the model's: the input
 * caps' `codebook-size` and `rate` where they state them (`rtpqwencodesdepay`'s do), else the
 * `codebook-size` and `clock-rate` properties. A packet's timestamp advances by the samples of
 * its frames, counted from the frames (perfect RTP time), so input without timestamps is timed by
 * its frame count from the segment's start. Input in a segment that is not in time (`filesrc`
 * straight into the payloader) goes out in a time segment from 0. A timestamp that jumps without
 * DISCONT ends the packet before it; the next starts at the new time.
 *
 * An utterance starts at the first packet of a stream, after a buffer flagged DISCONT or RESYNC
 * (a talk spurt's start, as audio depayloaders flag it), a `qwencodec-drain` event, a new
 * stream (STREAM_START, which sends the frames pending first) or a flush: that packet has the
 * marker bit, and the header's utterance number goes up by one, so that a receiver that lost it
 * still sees the next utterance start.
 *
 * Packets hold `frames-per-packet` frames, fewer where `max-ptime` or the MTU holds fewer (the
 * RTP header counted with its CSRCs and header extensions). `codes-stats` counts packets, frames
 * and utterances.
 *
 * ```text
 * gst-launch-1.0 filesrc location=codes.npy ! qwencodecparse ! rtpqwencodespay ! \
 *   udpsink host=127.0.0.1 port=5004
 * ```
 */
use std::sync::{LazyLock, Mutex};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_rtp::prelude::*;
use gst_rtp::subclass::prelude::*;

use crate::caps::{CODEBOOK_SIZE_FIELD, RATE_FIELD, RefusedCaps, bounded_field};
use qwencodec_rtp_codes::{ENCODING_NAME, Layout, MAX_CODEBOOK_SIZE, MAX_FRAMES, VERSION};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "rtpqwencodespay",
        gst::DebugColorFlags::empty(),
        Some("RTP payloader of Qwen3-TTS codec frames"),
    )
});

/// The released model's codebook and sample rate, for input whose caps do not state them.
const DEFAULT_CODEBOOK_SIZE: u32 = 2048;
const DEFAULT_CLOCK_RATE: u32 = 24_000;
/// RTP caps carry the clock rate as a (signed) int.
const MAX_CLOCK_RATE: u32 = i32::MAX as u32;
const DEFAULT_FRAMES_PER_PACKET: u32 = 1;
/// The RTP header without CSRCs and extensions, and a CSRC's bytes (at most 15 of them).
const RTP_HEADER_BYTES: usize = 12;
const CSRC_BYTES: usize = 4;
const MAX_CSRCS: usize = 15;

#[derive(Debug, Clone, Copy)]
struct Settings {
    frames_per_packet: u32,
    codebook_size: u32,
    clock_rate: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            frames_per_packet: DEFAULT_FRAMES_PER_PACKET,
            codebook_size: DEFAULT_CODEBOOK_SIZE,
            clock_rate: DEFAULT_CLOCK_RATE,
        }
    }
}

/// What `codes-stats` counts, since the element started.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    packets: u64,
    frames: u64,
    utterances: u64,
}

struct State {
    layout: Layout,
    frames_per_packet: usize,
    frame_duration: gst::ClockTime,
    samples_per_frame: u64,
    clock_rate: u64,
    /// The input's time segment (or the one that stands in for another format's).
    segment: gst::FormattedSegment<gst::ClockTime>,
    /// Bytes of frames not yet sent: whole frames and the start of the next.
    pending: Vec<u8>,
    /// The time of the first pending frame (of the next frame when none is pending): input
    /// without timestamps goes on from it.
    pending_pts: Option<gst::ClockTime>,
    /// Its place on the RTP clock in samples, as a buffer offset: the base class makes the RTP
    /// time from the offsets' difference (perfect-rtptime).
    pending_offset: u64,
    /// The next packet starts an utterance.
    starts_utterance: bool,
    /// The number of the utterance being sent (none before the first).
    utterance: Option<u8>,
    /// CSRCs that the base class adds from the input's source meta (`source-info`): room the
    /// MTU keeps for them.
    csrcs: usize,
    stats: Stats,
}

impl State {
    fn frame_bytes(&self) -> usize {
        self.layout.codebooks * 2
    }

    fn whole_frames(&self) -> usize {
        self.pending.len() / self.frame_bytes()
    }

    /// The RTP clock's place of `pts`: its running time in samples.
    fn offset_at(&self, pts: gst::ClockTime) -> Option<u64> {
        let running_time = self.segment.to_running_time(pts)?;
        running_time
            .nseconds()
            .mul_div_floor(self.clock_rate, gst::ClockTime::SECOND.nseconds())
    }

    /// The first pending frame, or the next, is at `pts`.
    fn place_at(&mut self, pts: gst::ClockTime) {
        self.pending_pts = Some(pts);
        if let Some(offset) = self.offset_at(pts) {
            self.pending_offset = offset;
        }
    }
}

#[derive(Default)]
pub struct RtpQwenCodesPay {
    settings: Mutex<Settings>,
    state: Mutex<Option<State>>,
    refused_caps: RefusedCaps,
    /// The src caps and the room their header extensions take: computed once per caps, as
    /// the extensions are made from the registry to tell their size.
    extension_room: Mutex<Option<(gst::Caps, usize)>>,
}

#[glib::object_subclass]
impl ObjectSubclass for RtpQwenCodesPay {
    const NAME: &'static str = "GstRtpQwenCodesPay";
    type Type = super::RtpQwenCodesPay;
    type ParentType = gst_rtp::RTPBasePayload;
}

impl ObjectImpl for RtpQwenCodesPay {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                glib::ParamSpecUInt::builder("frames-per-packet")
                    .nick("Frames per packet")
                    .blurb(
                        "Frames in a packet, fewer where max-ptime or the MTU holds fewer \
                         (1: the lowest latency)",
                    )
                    .minimum(1)
                    .maximum(MAX_FRAMES as u32)
                    .default_value(DEFAULT_FRAMES_PER_PACKET)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("codebook-size")
                    .nick("Codebook size")
                    .blurb("Codes run from 0 to codebook-size - 1, where the input caps do not say")
                    .minimum(2)
                    .maximum(MAX_CODEBOOK_SIZE)
                    .default_value(DEFAULT_CODEBOOK_SIZE)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("clock-rate")
                    .nick("Clock rate")
                    .blurb("The RTP clock, the model's sample rate, where the input caps do not say")
                    .minimum(1)
                    .maximum(MAX_CLOCK_RATE)
                    .default_value(DEFAULT_CLOCK_RATE)
                    .mutable_ready()
                    .build(),
                crate::rtp_stats::pspec("Packets, frames and utterances sent since the element started"),
            ]
        });
        PROPERTIES.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut settings = self.settings.lock().unwrap();
        match pspec.name() {
            "frames-per-packet" => settings.frames_per_packet = value.get().expect("type checked"),
            "codebook-size" => settings.codebook_size = value.get().expect("type checked"),
            "clock-rate" => settings.clock_rate = value.get().expect("type checked"),
            _ => unimplemented!(),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        let settings = *self.settings.lock().unwrap();
        match pspec.name() {
            "frames-per-packet" => settings.frames_per_packet.to_value(),
            "codebook-size" => settings.codebook_size.to_value(),
            "clock-rate" => settings.clock_rate.to_value(),
            crate::rtp_stats::PROPERTY => {
                let stats = self
                    .state
                    .lock()
                    .unwrap()
                    .as_ref()
                    .map(|state| state.stats)
                    .unwrap_or_default();
                crate::rtp_stats::structure(
                    "application/x-rtp-qwen3-tts-codes-payload-stats",
                    &[
                        ("packets", stats.packets),
                        ("frames", stats.frames),
                        ("utterances", stats.utterances),
                    ],
                )
                .to_value()
            }
            _ => unimplemented!(),
        }
    }
}

impl GstObjectImpl for RtpQwenCodesPay {}

impl ElementImpl for RtpQwenCodesPay {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "RTP Qwen3-TTS codes payloader",
                "Codec/Payloader/Network/RTP",
                "Payloads Qwen3-TTS codec frames into RTP packets (X-QWEN3-TTS-CODES)",
                env!("CARGO_PKG_AUTHORS"),
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let sink_caps = crate::caps::any_codes_caps()
                .field(
                    "framerate",
                    gst::FractionRange::new(gst::Fraction::new(1, i32::MAX), gst::Fraction::new(i32::MAX, 1)),
                )
                .build();
            let src_caps = gst::Caps::builder("application/x-rtp")
                .field("media", "audio")
                .field("payload", gst::IntRange::new(96, 127))
                .field("clock-rate", gst::IntRange::new(1, i32::MAX))
                .field("encoding-name", ENCODING_NAME)
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
        TEMPLATES.as_ref()
    }

    fn change_state(
        &self,
        transition: gst::StateChange,
    ) -> Result<gst::StateChangeSuccess, gst::StateChangeError> {
        let result = self.parent_change_state(transition)?;
        if transition == gst::StateChange::PausedToReady {
            *self.state.lock().unwrap() = None;
            *self.extension_room.lock().unwrap() = None;
            self.refused_caps.forget();
        }
        Ok(result)
    }
}

impl RTPBasePayloadImpl for RtpQwenCodesPay {
    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let s = caps
            .structure(0)
            .ok_or_else(|| gst::loggable_error!(CAT, "Empty caps"))?;
        let codebooks = s
            .get::<i32>("codebooks")
            .map_err(|_| gst::loggable_error!(CAT, "Caps {} have no codebooks", caps))?;
        let framerate = s.get::<gst::Fraction>("framerate").map_err(|_| {
            gst::loggable_error!(CAT, "Caps {} have no framerate: the RTP clock needs it", caps)
        })?;
        let settings = *self.settings.lock().unwrap();
        // What the model defines comes with the codes where their source knows it; the
        // properties stand in for caps that do not say.
        let model = || -> Result<(u32, u32, u64), String> {
            let codebook_size = bounded_field(s, CODEBOOK_SIZE_FIELD, 2..=MAX_CODEBOOK_SIZE)?
                .unwrap_or(settings.codebook_size);
            let clock_rate = bounded_field(s, RATE_FIELD, 1..=MAX_CLOCK_RATE)?.unwrap_or(settings.clock_rate);
            // Samples per frame = clock rate / frame rate, which must be whole: the RTP
            // timestamps step by it.
            let (num, den) = (framerate.numer() as u64, framerate.denom() as u64);
            let scaled = clock_rate as u64 * den;
            if num == 0 || !scaled.is_multiple_of(num) {
                return Err(format!(
                    "A frame rate of {framerate} does not divide the clock rate {clock_rate}"
                ));
            }
            Ok((codebook_size, clock_rate, scaled / num))
        };
        let (codebook_size, clock_rate, samples_per_frame) = model().map_err(|why| {
            if self.refused_caps.first_time(caps) {
                gst::element_imp_error!(self, gst::StreamError::Format, ["Caps {}: {}", caps, why]);
            }
            gst::loggable_error!(CAT, "{}", why)
        })?;
        let (num, den) = (framerate.numer() as u64, framerate.denom() as u64);
        let layout = Layout {
            codebooks: codebooks as usize,
            codebook_size,
        };
        let obj = self.obj();
        obj.set_options("audio", true, ENCODING_NAME, clock_rate);
        // Strings, as SDP's a=fmtp carries them.
        let fields = gst::Structure::builder("application/x-rtp")
            .field("version", VERSION.to_string())
            .field("codebooks", codebooks.to_string())
            .field("codebook-size", codebook_size.to_string())
            .field("samples-per-frame", samples_per_frame.to_string())
            .build();
        // Fails where downstream takes none of these RTP caps (another clock rate, say).
        obj.set_outcaps(Some(&fields)).map_err(|err| {
            if self.refused_caps.first_time(caps) {
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Negotiation,
                    [
                        "Downstream takes no RTP caps of {} at clock-rate {}: {}",
                        ENCODING_NAME,
                        clock_rate,
                        err
                    ]
                );
            }
            gst::loggable_error!(CAT, "Cannot set the RTP caps: {}", err)
        })?;
        self.refused_caps.forget();
        let mut state = self.state.lock().unwrap();
        // New caps start a new stream of packets (its first marked) in the same segment, and
        // the utterance numbers and counts go on; the frames of the caps before were sent
        // (`sink_event`).
        let (segment, utterance, stats) = state.take().map_or_else(
            || (gst::FormattedSegment::new(), None, Stats::default()),
            |old| (old.segment, old.utterance, old.stats),
        );
        *state = Some(State {
            layout,
            frames_per_packet: settings.frames_per_packet as usize,
            frame_duration: gst::ClockTime::SECOND
                .mul_div_floor(den, num)
                .expect("a frame lasts less than forever"),
            samples_per_frame,
            clock_rate: clock_rate as u64,
            segment,
            pending: Vec::new(),
            pending_pts: None,
            pending_offset: 0,
            starts_utterance: true,
            utterance,
            csrcs: 0,
            stats,
        });
        gst::debug!(
            CAT,
            imp = self,
            "{} codes a frame, {} samples a frame",
            codebooks,
            samples_per_frame
        );
        Ok(())
    }

    fn handle_buffer(&self, buffer: gst::Buffer) -> Result<gst::FlowSuccess, gst::FlowError> {
        // RESYNC is a talk spurt's start (an audio depayloader's marker): like DISCONT, the
        // frames take their own time and start an utterance.
        let discont = buffer
            .flags()
            .intersects(gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC);
        if discont {
            // What came before ends its packets; the next packet starts an utterance.
            self.send_pending(true)?;
        }
        let csrcs = (self.obj().source_count(&buffer) as usize).min(MAX_CSRCS);
        let mut guard = self.state.lock().unwrap();
        let Some(state) = guard.as_mut() else {
            gst::element_imp_error!(self, gst::CoreError::Negotiation, ["Frames before caps"]);
            return Err(gst::FlowError::NotNegotiated);
        };
        state.csrcs = csrcs;
        match (buffer.pts(), state.pending_pts) {
            (Some(pts), Some(pending_pts)) if !discont => {
                // The buffer's first byte belongs to the frame after the whole ones pending.
                let expected = pending_pts + state.frame_duration * state.whole_frames() as u64;
                if pts.absdiff(expected) > state.frame_duration / 2 {
                    gst::debug!(
                        CAT,
                        imp = self,
                        "Time jumps from {} to {}: a new packet there",
                        expected,
                        pts
                    );
                    drop(guard);
                    self.push_packets(true)?;
                    guard = self.state.lock().unwrap();
                    let state = guard.as_mut().ok_or(gst::FlowError::Flushing)?;
                    state.place_at(pts);
                }
            }
            (Some(pts), _) => {
                // The first frames, or an utterance's (the frames before it are sent): their own
                // time.
                state.place_at(pts);
            }
            (None, Some(_)) => (),
            (None, None) => {
                // No time at all: the frames count from the segment's start.
                let start = state.segment.start().unwrap_or(gst::ClockTime::ZERO);
                state.place_at(start);
            }
        }
        let state = guard.as_mut().ok_or(gst::FlowError::Flushing)?;
        let map = buffer.map_readable().map_err(|_| {
            gst::element_imp_error!(self, gst::CoreError::Failed, ["Cannot map the input buffer"]);
            gst::FlowError::Error
        })?;
        state.pending.extend_from_slice(&map);
        drop(map);
        drop(guard);
        self.push_packets(false)
    }

    fn sink_event(&self, event: gst::Event) -> bool {
        use gst::EventView;
        match event.view() {
            EventView::Eos(_) => {
                _ = self.send_pending(false);
            }
            EventView::CustomDownstream(_) if crate::drain_event::is_drain_event(&event) => {
                // The end of an utterance: its frames go now, the next starts a packet with the
                // marker.
                _ = self.send_pending(true);
            }
            EventView::Caps(caps)
                if self
                    .obj()
                    .sink_pad()
                    .current_caps()
                    .is_some_and(|current| current != *caps.caps()) =>
            {
                // Other frames from here: those pending go first, under the caps they came with.
                _ = self.send_pending(true);
            }
            EventView::StreamStart(_) => {
                // The stream before ends: its frames go, and the new one starts an utterance.
                _ = self.send_pending(true);
            }
            EventView::FlushStop(_) => {
                if let Some(state) = self.state.lock().unwrap().as_mut() {
                    state.pending.clear();
                    state.pending_pts = None;
                    state.starts_utterance = true;
                }
            }
            EventView::Segment(segment) => {
                let time = segment.segment().downcast_ref::<gst::ClockTime>().cloned();
                let replaced = time.is_none();
                let time = time.unwrap_or_else(|| {
                    // Straight from a file (filesrc's bytes): the RTP clock and the receiver's
                    // depayloader need time, which the frames' count gives.
                    gst::info!(
                        CAT,
                        imp = self,
                        "A {:?} segment: the frames are timed by their count, from 0",
                        segment.segment().format()
                    );
                    gst::FormattedSegment::new()
                });
                if let Some(state) = self.state.lock().unwrap().as_mut() {
                    state.segment = time.clone();
                }
                if replaced {
                    let event = gst::event::Segment::builder(&time).seqnum(event.seqnum()).build();
                    return self.parent_sink_event(event);
                }
            }
            _ => (),
        }
        self.parent_sink_event(event)
    }
}

/// The most bytes that the base class's header extensions take in a packet: those that `caps`
/// name (`extmap-<id>`, as the base class writes every extension it has into them) at their
/// largest, in RFC 8285's one-byte form where every one allows it, else the two-byte form.
fn extension_room(caps: &gst::Caps) -> usize {
    let Some(s) = caps.structure(0) else {
        return 0;
    };
    let (mut count, mut data, mut one_byte) = (0, 0, true);
    for (name, value) in s.iter() {
        let Some(id) = name.strip_prefix("extmap-").and_then(|id| id.parse::<u32>().ok()) else {
            continue;
        };
        // The URI alone, or (direction, URI, attributes).
        let uri = value.get::<String>().ok().or_else(|| {
            value
                .get::<gst::Array>()
                .ok()
                .and_then(|array| array.get(1).and_then(|uri| uri.get::<String>().ok()))
        });
        let Some(extension) = uri.and_then(|uri| gst_rtp::RTPHeaderExtension::create_from_uri(&uri)) else {
            continue;
        };
        extension.set_id(id);
        extension.set_attributes_from_caps(caps);
        let size = extension.max_size(&gst::Buffer::new());
        one_byte &= size <= 16
            && id <= 14
            && extension
                .supported_flags()
                .contains(gst_rtp::RTPHeaderExtensionFlags::ONE_BYTE);
        count += 1;
        data += size;
    }
    if count == 0 {
        return 0;
    }
    // The 4 bytes that say the form and length, and each one's 1 or 2 bytes of id and length,
    // in whole 32-bit words.
    4 + (count * if one_byte { 1 } else { 2 } + data).div_ceil(4) * 4
}

impl RtpQwenCodesPay {
    /// `frames-per-packet`, or fewer where `max-ptime` or the MTU holds fewer.
    fn frames_per_packet(&self, state: &State) -> usize {
        let obj = self.obj();
        // The header extensions that the src caps name, at the most bytes they take.
        let extension_bytes = obj.src_pad().current_caps().map_or(0, |caps| {
            let mut cached = self.extension_room.lock().unwrap();
            match cached.as_ref() {
                Some((known, room)) if known.as_ptr() == caps.as_ptr() => *room,
                _ => {
                    let room = extension_room(&caps);
                    *cached = Some((caps, room));
                    room
                }
            }
        });
        let header = RTP_HEADER_BYTES + CSRC_BYTES * state.csrcs + extension_bytes;
        let by_mtu = state
            .layout
            .frames_within((obj.mtu() as usize).saturating_sub(header));
        // -1 is no bound; 0 holds one frame, as the base class counts any frame as filling it.
        let by_ptime = u64::try_from(obj.max_ptime()).map_or(MAX_FRAMES, |max_ptime| {
            (max_ptime / state.frame_duration.nseconds()) as usize
        });
        state.frames_per_packet.min(by_mtu).min(by_ptime).max(1)
    }

    /// A packet of the first `frames` pending frames (at most as many as there are).
    fn take_packet(&self, state: &mut State, frames: usize) -> Result<gst::Buffer, gst::FlowError> {
        let frames = frames.min(state.whole_frames());
        let bytes: Vec<u8> = state.pending.drain(..frames * state.frame_bytes()).collect();
        let codes: Vec<i16> = bytes
            .chunks_exact(2)
            .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
            .collect();
        if let Some((index, code)) = codes
            .iter()
            .enumerate()
            .find(|&(_, &code)| code < 0 || code as u32 >= state.layout.codebook_size)
        {
            gst::element_imp_error!(
                self,
                gst::StreamError::Format,
                [
                    "Code {} (codebook {}) is outside 0..{}: not codes of this codebook-size",
                    code,
                    index % state.layout.codebooks,
                    state.layout.codebook_size
                ]
            );
            return Err(gst::FlowError::Error);
        }
        let marker = std::mem::take(&mut state.starts_utterance);
        if marker {
            state.utterance = Some(state.utterance.map_or(0, |number| number.wrapping_add(1)));
            state.stats.utterances += 1;
        }
        let utterance = state.utterance.expect("the first packet starts an utterance");
        let payload = state.layout.pack(utterance, &codes);
        let mut packet = self.obj().allocate_output_buffer(payload.len() as u32, 0, 0);
        {
            let packet = packet.get_mut().expect("a new buffer");
            packet.set_pts(state.pending_pts);
            packet.set_duration(state.frame_duration * frames as u64);
            packet.set_offset(state.pending_offset);
            let mut rtp =
                gst_rtp::RTPBuffer::from_buffer_writable(packet).map_err(|_| gst::FlowError::Error)?;
            rtp.payload_mut()
                .map_err(|_| gst::FlowError::Error)?
                .copy_from_slice(&payload);
            rtp.set_marker(marker);
        }
        state.pending_pts = state
            .pending_pts
            .map(|pts| pts + state.frame_duration * frames as u64);
        state.pending_offset += state.samples_per_frame * frames as u64;
        state.stats.packets += 1;
        state.stats.frames += frames as u64;
        gst::trace!(
            CAT,
            imp = self,
            "{} frames of utterance {}, {} samples",
            frames,
            utterance,
            state.samples_per_frame * frames as u64
        );
        Ok(packet)
    }

    /// Pushes packets of `frames_per_packet` pending frames while there are that many; with
    /// `all`, the rest too (the last packet may be short).
    fn push_packets(&self, all: bool) -> Result<gst::FlowSuccess, gst::FlowError> {
        loop {
            let mut guard = self.state.lock().unwrap();
            let state = guard.as_mut().ok_or(gst::FlowError::Flushing)?;
            let per_packet = self.frames_per_packet(state);
            if state.whole_frames() < if all { 1 } else { per_packet } {
                return Ok(gst::FlowSuccess::Ok);
            }
            let packet = self.take_packet(state, per_packet)?;
            drop(guard);
            self.obj().push(packet)?;
        }
    }

    /// Sends every whole pending frame (the last packet may be short); a partial frame left is
    /// dropped, with a warning. `starts_utterance`: the packet after these starts an utterance.
    fn send_pending(&self, starts_utterance: bool) -> Result<gst::FlowSuccess, gst::FlowError> {
        if self.state.lock().unwrap().is_none() {
            return Ok(gst::FlowSuccess::Ok);
        }
        self.push_packets(true)?;
        let mut guard = self.state.lock().unwrap();
        let Some(state) = guard.as_mut() else {
            return Ok(gst::FlowSuccess::Ok);
        };
        if !state.pending.is_empty() {
            let bytes = state.pending.len();
            state.pending.clear();
            drop(guard);
            gst::element_imp_warning!(
                self,
                gst::StreamError::Format,
                [
                    "{} bytes of a partial frame dropped at the end of an utterance or stream",
                    bytes
                ]
            );
            guard = self.state.lock().unwrap();
        }
        if let Some(state) = guard.as_mut() {
            state.starts_utterance |= starts_utterance;
        }
        Ok(gst::FlowSuccess::Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWCC: &str = "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01";

    /// Caps naming transport-wide CC (2 bytes of data) under each of `ids`.
    fn caps_with_twcc(ids: &[u32]) -> gst::Caps {
        let mut caps = gst::Caps::builder("application/x-rtp").field("clock-rate", 24_000i32);
        for id in ids {
            caps = caps.field(format!("extmap-{id}"), TWCC);
        }
        caps.build()
    }

    /// Four 2-byte extensions take 4 bytes of header and, in the one-byte form, 4 × 3 bytes;
    /// an id above 14 needs the two-byte form for all of them, 4 × 4 bytes. Fields that name
    /// no extension take nothing.
    #[test]
    fn extensions_take_the_room_of_their_form() {
        gst::init().unwrap();
        assert_eq!(extension_room(&caps_with_twcc(&[])), 0);
        assert_eq!(extension_room(&caps_with_twcc(&[1])), 4 + 4);
        assert_eq!(extension_room(&caps_with_twcc(&[1, 2, 3, 4])), 4 + 12);
        assert_eq!(extension_room(&caps_with_twcc(&[1, 2, 3, 15])), 4 + 16);
        let unknown = gst::Caps::builder("application/x-rtp")
            .field("extmap-1", "urn:example:no-such-extension")
            .field("extmap-x", TWCC)
            .build();
        assert_eq!(extension_room(&unknown), 0);
    }
}
