/**
 * SECTION:element-rtpqwencodesdepay
 *
 * Takes Qwen3-TTS codec frames out of RTP packets of the private format `X-QWEN3-TTS-CODES`,
 * version 1 (`rtpqwencodespay`'s) as `audio/x-qwen3-tts-codes` for `qwencodecdec`.
 *
 * An utterance starts at a packet with the marker bit, or whose utterance number (in its
 * header) differs from the packet before it: so an utterance whose marked packet was lost still
 * starts where its next packet comes. That buffer is flagged DISCONT (the decoder starts
 * fresh, as the sender's did) and RESYNC, the start of a talk spurt as audio depayloaders mark
 * it (loss flags DISCONT alone). A receiver's first packet, and the first of another SSRC, start
 * an utterance too.
 *
 * A lost packet is lost frames, which no later packet repairs. Loss is what the sequence
 * numbers say; how many frames it took, the RTP time. Lost frames that the RTP time counts go
 * downstream as a GAP event of exactly their time (flagged missing data), before the packet
 * after them, which the base class flags DISCONT; `rtpjitterbuffer do-lost=true`'s lost-packet
 * events for that time are dropped, the others go on as the base class's GAP events. What the
 * decoder does with them is its `plc` property: `qwencodecdec plc=true` repeats the last frame
 * in their place and goes on, without it the decoder starts fresh after the loss. The figures
 * behind that choice: docs/rtp-codes.md.
 *
 * A bad packet (another version, a length that does not fit its frame count, a code outside
 * the codebook) is dropped, its frames lost; a warning names what was wrong, at most one a
 * second, counting those in between. `codes-stats` counts packets, frames, lost packets and frames, bad
 * packets and utterances.
 *
 * ```text
 * gst-launch-1.0 udpsrc port=5004 caps="application/x-rtp, media=audio, clock-rate=24000, \
 *     encoding-name=X-QWEN3-TTS-CODES, version=(string)1, codebooks=(string)16, \
 *     codebook-size=(string)2048, samples-per-frame=(string)1920" ! rtpjitterbuffer ! \
 *   rtpqwencodesdepay ! qwencodecdec plc=true model-path=/models/Qwen3-TTS-Tokenizer-12Hz ! \
 *   audioconvert ! autoaudiosink
 * ```
 */
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_rtp::prelude::*;
use gst_rtp::subclass::prelude::*;

use crate::caps::RefusedCaps;
use qwencodec_rtp_codes::{ENCODING_NAME, Layout, MAX_CODEBOOK_SIZE, Receiver, RtpPacket, VERSION};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "rtpqwencodesdepay",
        gst::DebugColorFlags::empty(),
        Some("RTP depayloader of Qwen3-TTS codec frames"),
    )
});

/// Bad packets are warned of at most this often; the others are counted into the next warning.
const WARNING_INTERVAL: Duration = Duration::from_secs(1);

struct State {
    receiver: Receiver,
    frame_duration: gst::ClockTime,
    /// The jitter buffer's lost-packet events, held until the next packet says whether it
    /// counts the frames lost (then one GAP of their time replaces them) or not (then they go
    /// on as the base class's GAP events).
    lost_events: Vec<gst::Event>,
    /// When the last bad packet was warned of, and those dropped since without a warning.
    warned_at: Option<Instant>,
    bad_unwarned: u64,
}

#[derive(Default)]
pub struct RtpQwenCodesDepay {
    state: Mutex<Option<State>>,
    refused_caps: RefusedCaps,
}

#[glib::object_subclass]
impl ObjectSubclass for RtpQwenCodesDepay {
    const NAME: &'static str = "GstRtpQwenCodesDepay";
    type Type = super::RtpQwenCodesDepay;
    type ParentType = gst_rtp::RTPBaseDepayload;
}

impl ObjectImpl for RtpQwenCodesDepay {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![crate::rtp_stats::pspec(
                "Packets and frames taken, packets and frames lost, bad packets and utterances \
                 since the element started",
            )]
        });
        PROPERTIES.as_ref()
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        match pspec.name() {
            crate::rtp_stats::PROPERTY => {
                let stats = self
                    .state
                    .lock()
                    .unwrap()
                    .as_ref()
                    .map(|state| state.receiver.stats())
                    .unwrap_or_default();
                crate::rtp_stats::structure(
                    "application/x-rtp-qwen3-tts-codes-depayload-stats",
                    &[
                        ("packets", stats.packets),
                        ("frames", stats.frames),
                        ("packets-lost", stats.packets_lost),
                        ("frames-lost", stats.frames_lost),
                        ("packets-bad", stats.packets_bad),
                        ("utterances", stats.utterances),
                    ],
                )
                .to_value()
            }
            _ => unimplemented!(),
        }
    }
}

impl GstObjectImpl for RtpQwenCodesDepay {}

impl ElementImpl for RtpQwenCodesDepay {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "RTP Qwen3-TTS codes depayloader",
                "Codec/Depayloader/Network/RTP",
                "Extracts Qwen3-TTS codec frames from RTP packets (X-QWEN3-TTS-CODES)",
                env!("CARGO_PKG_AUTHORS"),
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let sink_caps = gst::Caps::builder("application/x-rtp")
                .field("media", "audio")
                .field("clock-rate", gst::IntRange::new(1, i32::MAX))
                .field("encoding-name", ENCODING_NAME)
                .build();
            let src_caps = crate::caps::any_codes_caps().build();
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
            // Everything of the stream, the held lost events included.
            *self.state.lock().unwrap() = None;
            self.refused_caps.forget();
        }
        Ok(result)
    }
}

/// A caps field of the format, as a string (SDP's `a=fmtp` carries strings) or an integer;
/// `what` explains it in the error.
fn field(s: &gst::StructureRef, name: &str, what: &str) -> Result<u64, String> {
    let value = match (s.get::<&str>(name), s.get::<i32>(name)) {
        (Ok(text), _) => text.trim().parse::<u64>().ok(),
        (_, Ok(number)) => u64::try_from(number).ok(),
        _ => return Err(format!("the caps have no {name} ({what})")),
    };
    value
        .filter(|&value| value > 0)
        .ok_or_else(|| format!("{name} is not a positive whole number ({what})"))
}

/// The caps' payload version: `version`, which SDPs of version 0 did not have.
fn version(s: &gst::StructureRef) -> Result<(), String> {
    let said = match (s.get::<&str>("version"), s.get::<i32>("version")) {
        (Ok(text), _) => format!("version={}", text.trim()),
        (_, Ok(number)) => format!("version={number}"),
        _ if s.has_field("version") => "a version that is no number".to_owned(),
        _ => "no version, which is version 0".to_owned(),
    };
    if said == format!("version={VERSION}") {
        return Ok(());
    }
    Err(format!(
        "the caps say {said}; this receiver reads version {VERSION} \
         (version={VERSION} in the SDP's a=fmtp, docs/rtp-codes.md): send it with a newer rtpqwencodespay"
    ))
}

impl RTPBaseDepayloadImpl for RtpQwenCodesDepay {
    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let s = caps
            .structure(0)
            .ok_or_else(|| gst::loggable_error!(CAT, "Empty caps"))?;
        let read = || -> Result<(u64, u64, u64, u64), String> {
            version(s)?;
            let clock_rate = field(s, "clock-rate", "the audio's sample rate")?;
            let codebooks = field(s, "codebooks", "codes per frame")?;
            let codebook_size = field(s, "codebook-size", "codes run from 0 to it less one")?;
            let samples_per_frame = field(s, "samples-per-frame", "RTP clock ticks per frame")?;
            // A frame rate and a frame duration must come of them.
            if samples_per_frame > i32::MAX as u64 {
                return Err(format!(
                    "samples-per-frame {samples_per_frame} is beyond any frame's length (at most {})",
                    i32::MAX
                ));
            }
            if codebook_size > u64::from(MAX_CODEBOOK_SIZE) || codebooks > 1024 {
                return Err(format!(
                    "{codebooks} codebooks of {codebook_size} codes are beyond any codes' range"
                ));
            }
            Ok((clock_rate, codebooks, codebook_size, samples_per_frame))
        };
        let (clock_rate, codebooks, codebook_size, samples_per_frame) = read().map_err(|why| {
            if self.refused_caps.first_time(caps) {
                gst::element_imp_error!(self, gst::StreamError::Format, ["Caps {}: {}", caps, why]);
            }
            gst::loggable_error!(CAT, "{}", why)
        })?;
        self.refused_caps.forget();
        // framerate = clock-rate / samples-per-frame (a fraction reduces itself); the template
        // takes the clock rate as an int.
        let framerate = gst::Fraction::new(clock_rate as i32, samples_per_frame as i32);
        // With what the SDP says of the model, which a payloader after this one reads.
        let src_caps = gst::Caps::builder(crate::caps::CODES_MEDIA_TYPE)
            .field("codebooks", codebooks as i32)
            .field("framerate", framerate)
            .field(crate::caps::CODEBOOK_SIZE_FIELD, codebook_size as i32)
            .field(crate::caps::RATE_FIELD, clock_rate as i32)
            .build();
        let mut state = self.state.lock().unwrap();
        // New caps are a new stream; what it counted so far stays counted.
        let stats = state
            .as_ref()
            .map(|state| state.receiver.stats())
            .unwrap_or_default();
        let layout = Layout {
            codebooks: codebooks as usize,
            codebook_size: codebook_size as u32,
        };
        *state = Some(State {
            receiver: Receiver::new(layout, samples_per_frame as u32, stats),
            frame_duration: gst::ClockTime::SECOND
                .mul_div_floor(samples_per_frame, clock_rate)
                .expect("a frame lasts less than forever"),
            lost_events: Vec::new(),
            warned_at: None,
            bad_unwarned: 0,
        });
        drop(state);
        gst::debug!(CAT, imp = self, "Frames out as {}", src_caps);
        // A sticky event: stored on the pad, downstream's refusal shows as the next push's
        // NOT_NEGOTIATED.
        self.obj().src_pad().push_event(gst::event::Caps::new(&src_caps));
        Ok(())
    }

    fn handle_event(&self, event: gst::Event) -> bool {
        match event.view() {
            gst::EventView::FlushStop(_) => {
                if let Some(state) = self.state.lock().unwrap().as_mut() {
                    // A new position: nothing before it is lost.
                    state.receiver.forget_position();
                    state.lost_events.clear();
                }
            }
            gst::EventView::Eos(_) => {
                // No packet comes to fill the time lost last: it goes on as GAP events.
                self.forward_lost_events();
            }
            _ => (),
        }
        self.parent_handle_event(event)
    }

    /// A jitter buffer's word that packets are lost, held for the next packet: where it counts
    /// the frames lost, one GAP of their time goes instead (see `process_rtp_packet`).
    fn packet_lost(&self, event: &gst::EventRef) -> bool {
        if let Some(state) = self.state.lock().unwrap().as_mut() {
            state.lost_events.push(event.to_owned());
            return true;
        }
        self.parent_packet_lost(event)
    }

    fn process_rtp_packet(
        &self,
        rtp: &gst_rtp::RTPBuffer<gst_rtp::rtp_buffer::Readable>,
    ) -> Option<gst::Buffer> {
        let mut guard = self.state.lock().unwrap();
        let state = guard.as_mut()?;
        let seq = rtp.seq();
        // No payload is an empty one, a bad packet.
        let received = state.receiver.receive(RtpPacket {
            seq,
            timestamp: rtp.timestamp(),
            ssrc: rtp.ssrc(),
            marker: rtp.is_marker(),
            payload: rtp.payload().unwrap_or(&[]),
        });
        let received = match received {
            Ok(received) => received,
            Err(why) => {
                let now = Instant::now();
                let warn = state
                    .warned_at
                    .is_none_or(|at| now.duration_since(at) >= WARNING_INTERVAL);
                let (unwarned, total) = (state.bad_unwarned, state.receiver.stats().packets_bad);
                if warn {
                    state.warned_at = Some(now);
                    state.bad_unwarned = 0;
                } else {
                    state.bad_unwarned += 1;
                }
                drop(guard);
                if !warn {
                    gst::debug!(CAT, imp = self, "Packet {} dropped: {}", seq, why);
                } else if unwarned == 0 {
                    gst::element_imp_warning!(
                        self,
                        gst::StreamError::Decode,
                        ["Packet {} dropped: {}", seq, why]
                    );
                } else {
                    gst::element_imp_warning!(
                        self,
                        gst::StreamError::Decode,
                        [
                            "Packet {} dropped: {} ({} more bad packets dropped since the last \
                             warning, {} in all)",
                            seq,
                            why,
                            unwarned,
                            total
                        ]
                    );
                }
                return None;
            }
        };
        // A new utterance, a loss, or what upstream flagged: the buffer is a discontinuity (the
        // base class flags a gap in the sequence numbers too, but not bad packets).
        let discont = received.discont() || rtp.buffer().flags().contains(gst::BufferFlags::DISCONT);
        let (starts, frames, missing) = (received.starts, received.frames, received.missing_frames);
        if received.missing_packets > 0 {
            gst::debug!(
                CAT,
                imp = self,
                "{} packets lost before packet {} ({:?} frames)",
                received.missing_packets,
                seq,
                missing
            );
        }
        let out: Vec<u8> = received
            .packet
            .codes
            .iter()
            .flat_map(|code| code.to_le_bytes())
            .collect();
        let frame_duration = state.frame_duration;
        let pts = rtp.buffer().pts();
        // Lost frames that the RTP time counts: one GAP of exactly their time, where the jitter
        // buffer's events (if any) only guessed it.
        let counted_gap = missing.filter(|&missing| missing > 0).and_then(|missing| {
            let duration = frame_duration * missing;
            Some((pts?.checked_sub(duration)?, duration))
        });
        if counted_gap.is_some() {
            state.lost_events.clear();
        }
        drop(guard);
        self.forward_lost_events();
        if let Some((start, duration)) = counted_gap {
            self.push_lost_time(start, duration);
        }

        let mut buffer = gst::Buffer::from_mut_slice(out);
        {
            let buffer = buffer.get_mut().expect("a new buffer");
            buffer.set_duration(frame_duration * frames as u64);
            if discont {
                buffer.set_flags(gst::BufferFlags::DISCONT);
            }
            if starts {
                gst::debug!(
                    CAT,
                    imp = self,
                    "Packet {} starts utterance {}",
                    seq,
                    received.packet.utterance
                );
                // A talk spurt starts, as rtpL16depay marks one.
                buffer.set_flags(gst::BufferFlags::RESYNC);
            }
        }
        gst::trace!(CAT, imp = self, "Packet {}: {} frames", seq, frames);
        Some(buffer)
    }
}

impl RtpQwenCodesDepay {
    /// Lost frames' time as a lost-packet event of the jitter buffer's form, which the base
    /// class sends as a GAP flagged missing data.
    fn push_lost_time(&self, start: gst::ClockTime, duration: gst::ClockTime) {
        gst::debug!(CAT, imp = self, "Lost {} at {}: a GAP", duration, start);
        let lost = gst::event::CustomDownstream::new(
            gst::Structure::builder("GstRTPPacketLost")
                .field("timestamp", start.nseconds())
                .field("duration", duration.nseconds())
                .build(),
        );
        self.parent_packet_lost(&lost);
    }

    /// The lost-packet events held, as the base class sends them: GAP events.
    fn forward_lost_events(&self) {
        let events = self
            .state
            .lock()
            .unwrap()
            .as_mut()
            .map(|state| std::mem::take(&mut state.lost_events))
            .unwrap_or_default();
        for event in events {
            self.parent_packet_lost(&event);
        }
    }
}
