/**
 * SECTION:element-rtpqwencodesdepay
 *
 * Takes Qwen3-TTS codec frames out of RTP packets of the private format `X-QWEN3-TTS-CODES`
 * (`rtpqwencodespay`'s) as `audio/x-qwen3-tts-codes` for `qwencodecdec`. A packet with the
 * marker bit starts an utterance: its buffer is flagged DISCONT, and the decoder starts fresh
 * there, as the sender's did. A lost packet is lost frames, which no later packet repairs.
 * `loss=repeat` (the default) puts copies of the last frame received in their place, up to
 * `max-repeat-frames`, and the decoder goes on; `loss=restart`, and a longer loss, flags the
 * next buffer DISCONT: the decoder starts fresh at the next packet that arrives (with
 * `rtpjitterbuffer do-lost=true` the lost time then goes downstream as a GAP event). The
 * figures that chose the default: docs/rtp-codes.md. A bad packet (a length that does not fit its frame count, a code outside the codebook) is
 * dropped with a warning; nothing else is lost.
 *
 * ```text
 * gst-launch-1.0 udpsrc port=5004 caps="application/x-rtp, media=audio, clock-rate=24000, \
 *     encoding-name=X-QWEN3-TTS-CODES, codebooks=(string)16, codebook-size=(string)2048, \
 *     samples-per-frame=(string)1920" ! rtpjitterbuffer ! rtpqwencodesdepay ! \
 *   qwencodecdec model-path=/models/Qwen3-TTS-Tokenizer-12Hz ! audioconvert ! autoaudiosink
 * ```
 */
use std::sync::{LazyLock, Mutex};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_rtp::prelude::*;
use gst_rtp::subclass::prelude::*;

use super::Loss;
use crate::codes_payload::{ENCODING_NAME, Layout};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "rtpqwencodesdepay",
        gst::DebugColorFlags::empty(),
        Some("RTP depayloader of Qwen3-TTS codec frames"),
    )
});

/// Two seconds of frames at the release's rate.
const DEFAULT_MAX_REPEAT_FRAMES: u32 = 25;

#[derive(Debug, Clone, Copy)]
struct Settings {
    loss: Loss,
    max_repeat_frames: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            loss: Loss::default(),
            max_repeat_frames: DEFAULT_MAX_REPEAT_FRAMES,
        }
    }
}

struct State {
    layout: Layout,
    frame_duration: gst::ClockTime,
    samples_per_frame: u32,
    /// The last packet's frame, and the RTP time just after its frames: where the next packet
    /// starts if none was lost.
    last_frame: Option<Vec<i16>>,
    next_rtp_time: Option<u32>,
}

#[derive(Default)]
pub struct RtpQwenCodesDepay {
    settings: Mutex<Settings>,
    state: Mutex<Option<State>>,
    /// The next buffer out carries repeated frames in place of lost ones: the base class's
    /// DISCONT (for the gap it saw) comes off it, so that the decoder goes on.
    concealed: std::sync::atomic::AtomicBool,
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
            vec![
                glib::ParamSpecEnum::builder_with_default("loss", Loss::default())
                    .nick("Loss")
                    .blurb("Where packets were lost: repeat the last frame received, or restart the decoder")
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt::builder("max-repeat-frames")
                    .nick("Most frames repeated")
                    .blurb("The longest loss, in frames, that loss=repeat fills; a longer one restarts")
                    .maximum(10_000)
                    .default_value(DEFAULT_MAX_REPEAT_FRAMES)
                    .mutable_playing()
                    .build(),
            ]
        });
        PROPERTIES.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut settings = self.settings.lock().unwrap();
        match pspec.name() {
            "loss" => settings.loss = value.get().expect("type checked"),
            "max-repeat-frames" => settings.max_repeat_frames = value.get().expect("type checked"),
            _ => unimplemented!(),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        let settings = self.settings.lock().unwrap();
        match pspec.name() {
            "loss" => settings.loss.to_value(),
            "max-repeat-frames" => settings.max_repeat_frames.to_value(),
            _ => unimplemented!(),
        }
    }

    fn constructed(&self) {
        self.parent_constructed();
        // The base class flags the buffer after a gap DISCONT as it pushes it; a buffer whose
        // gap was filled takes it off here.
        let depay = self.downgrade();
        self.obj()
            .src_pad()
            .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
                let Some(depay) = depay.upgrade() else {
                    return gst::PadProbeReturn::Ok;
                };
                if depay.concealed.swap(false, std::sync::atomic::Ordering::SeqCst)
                    && let Some(buffer) = info.buffer_mut()
                {
                    buffer.make_mut().unset_flags(gst::BufferFlags::DISCONT);
                }
                gst::PadProbeReturn::Ok
            });
    }
}

impl GstObjectImpl for RtpQwenCodesDepay {}

impl ElementImpl for RtpQwenCodesDepay {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "RTP Qwen3-TTS codes depayloader",
                "Codec/Depayloader/Network/RTP",
                "Takes Qwen3-TTS codec frames out of RTP packets (X-QWEN3-TTS-CODES)",
                "qwencodec developers",
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
            let src_caps = crate::any_codes_caps().build();
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

impl RTPBaseDepayloadImpl for RtpQwenCodesDepay {
    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let s = caps
            .structure(0)
            .ok_or_else(|| gst::loggable_error!(CAT, "Empty caps"))?;
        let read = || -> Result<(u64, u64, u64, u64), String> {
            Ok((
                field(s, "clock-rate", "the audio's sample rate")?,
                field(s, "codebooks", "codes per frame")?,
                field(s, "codebook-size", "codes run from 0 to it less one")?,
                field(s, "samples-per-frame", "RTP clock ticks per frame")?,
            ))
        };
        let (clock_rate, codebooks, codebook_size, samples_per_frame) = read().map_err(|why| {
            gst::element_imp_error!(self, gst::StreamError::Format, ["Caps {}: {}", caps, why]);
            gst::loggable_error!(CAT, "{}", why)
        })?;
        if codebook_size > 1 << 15 || codebooks > 1024 {
            gst::element_imp_error!(
                self,
                gst::StreamError::Format,
                [
                    "Caps {}: {} codebooks of {} codes are beyond any codes' range",
                    caps,
                    codebooks,
                    codebook_size
                ]
            );
            return Err(gst::loggable_error!(CAT, "Codes out of range"));
        }
        // framerate = clock-rate / samples-per-frame, reduced.
        let divisor = gcd(clock_rate, samples_per_frame);
        let framerate = gst::Fraction::new(
            (clock_rate / divisor) as i32,
            (samples_per_frame / divisor) as i32,
        );
        let src_caps = gst::Caps::builder(crate::CODES_MEDIA_TYPE)
            .field("codebooks", codebooks as i32)
            .field("framerate", framerate)
            .build();
        *self.state.lock().unwrap() = Some(State {
            layout: Layout {
                codebooks: codebooks as usize,
                codebook_size: codebook_size as u32,
            },
            frame_duration: gst::ClockTime::SECOND
                .mul_div_floor(samples_per_frame, clock_rate)
                .expect("a frame lasts less than forever"),
            samples_per_frame: samples_per_frame as u32,
            last_frame: None,
            next_rtp_time: None,
        });
        gst::debug!(CAT, imp = self, "Frames out as {}", src_caps);
        if self.obj().src_pad().push_event(gst::event::Caps::new(&src_caps)) {
            Ok(())
        } else {
            Err(gst::loggable_error!(CAT, "Downstream refused {}", src_caps))
        }
    }

    fn handle_event(&self, event: gst::Event) -> bool {
        if let gst::EventView::FlushStop(_) = event.view()
            && let Some(state) = self.state.lock().unwrap().as_mut()
        {
            // A new position: nothing before it is lost.
            state.last_frame = None;
            state.next_rtp_time = None;
        }
        self.parent_handle_event(event)
    }

    /// A jitter buffer's word that packets are lost: with `loss=repeat` the frames are filled
    /// in when the next packet comes, so no GAP goes downstream for that time; with `restart`,
    /// the base class's GAP.
    fn packet_lost(&self, event: &gst::EventRef) -> bool {
        if self.settings.lock().unwrap().loss == Loss::Repeat {
            return true;
        }
        self.parent_packet_lost(event)
    }

    fn process_rtp_packet(
        &self,
        rtp: &gst_rtp::RTPBuffer<gst_rtp::rtp_buffer::Readable>,
    ) -> Option<gst::Buffer> {
        let settings = *self.settings.lock().unwrap();
        let mut guard = self.state.lock().unwrap();
        let state = guard.as_mut()?;
        let payload = rtp.payload().ok()?;
        let codes = match state.layout.unpack(payload) {
            Ok(codes) => codes,
            Err(why) => {
                drop(guard);
                gst::element_imp_warning!(
                    self,
                    gst::StreamError::Decode,
                    ["Packet {} dropped: {}", rtp.seq(), why]
                );
                return None;
            }
        };
        let codebooks = state.layout.codebooks;
        let frames = codes.len() / codebooks;
        // Frames lost just before this packet, by the RTP clock (the sequence numbers only say
        // packets), where the stream goes on (no marker).
        let missing = match (state.next_rtp_time, &state.last_frame) {
            (Some(expected), Some(_)) if !rtp.is_marker() => {
                let ahead = rtp.timestamp().wrapping_sub(expected);
                // Behind (reordered, a restarted sender) reads as a huge gap: no repeat.
                ahead
                    .is_multiple_of(state.samples_per_frame)
                    .then(|| (ahead / state.samples_per_frame) as usize)
            }
            _ => None,
        };
        let repeat = match missing {
            Some(missing)
                if missing > 0
                    && settings.loss == Loss::Repeat
                    && missing <= settings.max_repeat_frames as usize =>
            {
                missing
            }
            _ => 0,
        };
        let mut out = Vec::with_capacity((repeat + frames) * codebooks * 2);
        if repeat > 0 {
            let last = state.last_frame.as_ref().expect("matched above");
            for _ in 0..repeat {
                out.extend(last.iter().flat_map(|code| code.to_le_bytes()));
            }
            gst::debug!(
                CAT,
                imp = self,
                "{} frames lost before packet {}: the last frame repeated",
                repeat,
                rtp.seq()
            );
        }
        out.extend(codes.iter().flat_map(|code| code.to_le_bytes()));
        state.last_frame = Some(codes[codes.len() - codebooks..].to_vec());
        state.next_rtp_time = Some(
            rtp.timestamp()
                .wrapping_add(state.samples_per_frame.wrapping_mul(frames as u32)),
        );
        let frame_duration = state.frame_duration;
        drop(guard);

        let mut buffer = gst::Buffer::from_mut_slice(out);
        {
            let buffer = buffer.get_mut().expect("a new buffer");
            buffer.set_duration(frame_duration * (repeat + frames) as u64);
            if rtp.is_marker() {
                // The sender started a stream or an utterance here.
                buffer.set_flags(gst::BufferFlags::DISCONT);
            }
            if repeat > 0 {
                // The repeated frames come first, where the lost ones were.
                let pts = rtp.buffer().pts();
                buffer.set_pts(pts.and_then(|pts| pts.checked_sub(frame_duration * repeat as u64)));
                self.concealed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        gst::trace!(CAT, imp = self, "Packet {}: {} frames", rtp.seq(), frames);
        Some(buffer)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}
