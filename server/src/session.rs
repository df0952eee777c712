//! A session: its pipeline, from the codes the ingress pushes to the WebRTC peer that the
//! browser's signalling talks to (or, for a broadcast, to a Janus mountpoint), and the registry
//! of the sessions of the server.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use gst::glib;
use gst::prelude::*;
use gstqwencodec::model::{DecoderConfig, Dtype, Model};
use serde_json::json;

use crate::ice::Ice;
use crate::janus::Mountpoint;
use crate::liveness::{Gone, IceState, IceWatch, PeerTimes};
use crate::log::log;
use crate::metrics::Metrics;
use crate::opus::{self, OpusSettings};
use qwencodec_common::webrtc::{DtlsCertificate, SdpKind, description_from_sdp, opus_rtp_caps, sdp_of};
use qwencodec_protocol::messages::FrameLayout;

/// Frames that come later than the end of the speech before them by up to this much still
/// continue it (their audio is late by as much, and the browser's jitter buffer stretches);
/// later frames start new speech at the time they come.
const SLACK: gst::ClockTime = gst::ClockTime::from_mseconds(200);
/// The most speech a session may hold ahead of what it plays.
pub const MAX_AHEAD: gst::ClockTime = gst::ClockTime::from_seconds(60);
/// The custom downstream event that goes before the first frame of new speech (after a pause or
/// an end): at the Opus encoder it becomes a segment, which resets the encoder, so that the
/// first packet of the new speech is stamped with its own time and nothing of the speech before
/// leaves with it (see `reset_encoder_at_new_speech`).
const NEW_SPEECH: &str = "tts-server-new-speech";
/// Silence that goes before a session's first speech: a browser loses the start of the first
/// audio of a new peer connection (see `lead_in_silence`), and loses this instead.
const LEAD_IN: gst::ClockTime = gst::ClockTime::from_mseconds(60);

/// The codec frames the model takes, as caps and as a layout to check messages against.
#[derive(Clone)]
pub struct CodecFormat {
    pub caps: gst::Caps,
    pub layout: FrameLayout,
    pub frame_duration: gst::ClockTime,
}

impl CodecFormat {
    pub fn new(config: &DecoderConfig) -> Self {
        let (num, den) = config.frame_rate();
        Self {
            caps: gst::Caps::builder("audio/x-qwen3-tts-codes")
                .field("codebooks", config.num_quantizers as i32)
                .field("framerate", gst::Fraction::new(num as i32, den as i32))
                .build(),
            layout: FrameLayout {
                codebooks: config.num_quantizers,
                codebook_size: config.codebook_size,
            },
            frame_duration: gst::ClockTime::SECOND
                .mul_div_floor(den as u64, num as u64)
                .unwrap(),
        }
    }
}

/// What every session's pipeline is made with.
pub struct PipelineSettings {
    pub model: PathBuf,
    pub device: String,
    pub dtype: Dtype,
    pub chunk_frames: u32,
    pub format: CodecFormat,
    pub metrics: Arc<Metrics>,
    /// Goes before every session id, `NAME-`, so that a router in front of several servers
    /// sends a session's `/codes` to the server that holds it (see --instance).
    pub instance: Option<String>,
    /// The DTLS certificate every session presents (see `DtlsCertificate`).
    pub certificate: Arc<DtlsCertificate>,
    /// Where the candidates are gathered, what the browser is told of them.
    pub ice: Arc<Ice>,
    /// How the speech is encoded.
    pub opus: OpusSettings,
    /// Held so that the model stays loaded while no session runs.
    pub _model: Arc<Model>,
}

/// Every pipeline made, to count those still alive (not freed): a leak shows here.
static PIPELINES: Mutex<Vec<glib::WeakRef<gst::Pipeline>>> = Mutex::new(Vec::new());

pub fn live_pipelines() -> usize {
    let mut pipelines = PIPELINES.lock().unwrap();
    pipelines.retain(|pipeline| pipeline.upgrade().is_some());
    pipelines.len()
}

/// Where a session's speech stands in time.
#[derive(Default)]
struct Timeline {
    /// Where the audio of the next frames starts if they continue the speech before them.
    next_pts: Option<gst::ClockTime>,
    /// The sender said the speech before ended: the next frames start new speech.
    ended: bool,
    /// Speech was queued in this session before: no lead-in.
    spoke: bool,
}

pub struct Session {
    pub id: String,
    /// Dropped before `pipeline` (fields drop in order): a broadcast's mountpoint is gone from
    /// Janus once the pipeline is freed, which is what the `pipelines` gauge counts.
    peer: Peer,
    pipeline: gst::Pipeline,
    appsrc: gst_app::AppSrc,
    frame_duration: gst::ClockTime,
    timeline: Mutex<Timeline>,
    /// Which ingress connection feeds this session now.
    sender: Mutex<SenderSlot>,
    /// The browser's signalling connection (a broadcast's own connection), for what the
    /// server has to tell it.
    to_browser: UnboundedSender<serde_json::Value>,
    /// Why the session ended, once it has: its connections close with it.
    ended: Mutex<Option<String>>,
    /// Told whenever what its connections wait on changes (`Session::changes`).
    changes: watch::Sender<()>,
    /// When the last frames came in, from whichever sender: an RTP sender's sign of life.
    last_push: Mutex<Option<Instant>>,
    /// How long the clocksync holds each packet past its time (see `watch_bus`): the
    /// audio of a frame has left when its end plus this has passed.
    held_latency: Arc<AtomicU64>,
}

/// Who feeds a session: one sender at a time, each known by its number.
#[derive(Default)]
struct SenderSlot {
    holder: Option<u64>,
    /// Senders taken over that have not yet let go.
    leaving: usize,
    last: u64,
}

impl SenderSlot {
    fn hand_out(&mut self) -> SenderTicket {
        self.last += 1;
        self.holder = Some(self.last);
        SenderTicket(self.last)
    }
}

/// A sender's hold on its session's slot, from [`Session::attach_sender`] or
/// [`Session::take_over_sender`] until [`Session::detach_sender`].
pub struct SenderTicket(u64);

/// Where a session's speech goes.
pub enum Egress {
    /// To one browser's peer connection (webrtcbin), negotiated over its `/signal`.
    Browser,
    /// To a Janus Streaming mountpoint as plain RTP, for every listener that watches it: a
    /// broadcast (`broadcast`).
    Janus(Mountpoint),
}

/// What a session's egress holds while it runs.
enum Peer {
    Browser {
        webrtcbin: gst::Element,
        /// The browser's peer connection as its ICE state tells it.
        ice: Arc<Mutex<IceWatch>>,
    },
    Janus {
        /// Held to be destroyed with the session.
        _mountpoint: Mountpoint,
    },
}

impl Session {
    /// Builds the pipeline and starts it. What the session's connection needs to know (for a
    /// browser, webrtcbin's offer and ICE candidates; a sender joining or leaving) goes to
    /// `to_browser` as JSON messages.
    fn start(
        id: String,
        settings: &PipelineSettings,
        to_browser: UnboundedSender<serde_json::Value>,
        egress: Egress,
    ) -> Result<Self, String> {
        let changes = watch::Sender::new(());
        let pipeline = gst::Pipeline::with_name(&format!("session-{id}"));
        let appsrc = gst_app::AppSrc::builder()
            .caps(&settings.format.caps)
            .format(gst::Format::Time)
            .is_live(true)
            .build();
        let decoder = gst::ElementFactory::make("qwencodecdec")
            .property(
                "model-path",
                settings.model.to_str().ok_or("the model path is not UTF-8")?,
            )
            .property("device", &settings.device)
            .property_from_str("dtype", &settings.dtype.to_string())
            .property("chunk-frames", settings.chunk_frames)
            // Audio leaves in steps of chunk-frames even when frames pile up (a burst): a
            // larger step would leave for the browser whole, out of reach of a cancel.
            .property("max-step-frames", settings.chunk_frames)
            .build()
            .map_err(|err| err.to_string())?;
        // The TTS may hand over frames faster than real time: the audio leaves at its time, so
        // that the browser's jitter buffer is not flooded and a cancel still finds it here. It
        // is held packet by packet, after the payloader: a step's audio (80 ms a frame) held
        // whole would leave at the step's start, up to a step ahead, and in bursts that the
        // browser's jitter buffer answers by growing.
        let (pacing_queue, clocksync) = packet_pacing()?;
        let held_latency = Arc::new(AtomicU64::new(0));
        count_late_audio(
            &clocksync,
            held_latency.clone(),
            settings.metrics.clone(),
            id.clone(),
        );
        count_audio_out(&decoder, settings.metrics.clone());
        let opusenc = settings.opus.encoder()?;
        let payloader = gst::ElementFactory::make("rtpopuspay")
            .property("pt", 96u32)
            .build()
            .map_err(|err| err.to_string())?;
        reset_encoder_at_new_speech(&opusenc.static_pad("sink").unwrap());
        // After the decoder, whose audio the metrics count.
        let audioconvert = make("audioconvert")?;
        lead_in_silence(&audioconvert.static_pad("sink").unwrap());
        let chain = [
            appsrc.upcast_ref(),
            &decoder,
            &audioconvert,
            &make("audioresample")?,
            &opusenc,
            &payloader,
            &pacing_queue,
            &clocksync,
        ];
        pipeline.add_many(chain).map_err(|err| err.to_string())?;
        gst::Element::link_many(chain).map_err(|err| err.to_string())?;
        let peer = match egress {
            Egress::Browser => {
                let webrtcbin = to_browser_peer(&pipeline, &clocksync, &opusenc, settings, &to_browser)?;
                let ice = watch_ice(&webrtcbin, &id, changes.clone());
                Peer::Browser { webrtcbin, ice }
            }
            Egress::Janus(mountpoint) => {
                to_mountpoint(&pipeline, &clocksync, &mountpoint)?;
                Peer::Janus {
                    _mountpoint: mountpoint,
                }
            }
        };

        PIPELINES.lock().unwrap().push(pipeline.downgrade());
        let session = Self {
            id,
            pipeline,
            appsrc,
            peer,
            frame_duration: settings.format.frame_duration,
            timeline: Mutex::default(),
            sender: Mutex::default(),
            to_browser,
            ended: Mutex::new(None),
            changes,
            last_push: Mutex::new(None),
            held_latency,
        };
        #[cfg(feature = "test-stalls")]
        stall_for_tests();
        session.pipeline.set_state(gst::State::Playing).map_err(|_| {
            session
                .error()
                .unwrap_or_else(|| "the pipeline does not start".into())
        })?;
        // The decoder set its latency on its way to PAUSED.
        watch_bus(
            &session.pipeline,
            &clocksync,
            session.held_latency.clone(),
            session.changes.clone(),
        );
        Ok(session)
    }

    /// Queues `frames` whole, checked frames (`bytes`) for decoding. Their audio follows the speech before them
    /// without a gap, or, when the sender paused (see SLACK) or ended that speech, starts new
    /// speech now (after the speech before it has played).
    pub fn push(&self, bytes: &[u8], frames: usize) -> Result<(), (u16, String)> {
        use crate::http::close;
        let now = self.appsrc.current_running_time().unwrap_or(gst::ClockTime::ZERO);
        let duration = self.frame_duration * frames as u64;
        let pts = {
            let mut timeline = self.timeline.lock().unwrap();
            let (pts, new_speech) = match timeline.next_pts {
                Some(next) if !timeline.ended && next + SLACK >= now => (next, false),
                Some(next) => (next.max(now), true),
                None if timeline.spoke => (now, true),
                // The lead-in goes before `now`: it leaves as soon as it is decoded, and the
                // speech at its own time, not delayed by it.
                None => (now.max(LEAD_IN), true),
            };
            if pts > now + MAX_AHEAD {
                return Err((
                    close::TOO_LARGE,
                    format!("more than {} s of speech queued", MAX_AHEAD.seconds()),
                ));
            }
            if new_speech {
                self.appsrc
                    .send_event(gst::event::CustomDownstream::new(gst::Structure::new_empty(
                        NEW_SPEECH,
                    )));
            }
            *timeline = Timeline {
                next_pts: Some(pts + duration),
                ended: false,
                spoke: true,
            };
            pts
        };
        let mut buffer = gst::Buffer::from_slice(bytes.to_vec());
        {
            let buffer = buffer.get_mut().unwrap();
            buffer.set_pts(pts);
            buffer.set_duration(duration);
        }
        *self.last_push.lock().unwrap() = Some(Instant::now());
        self.appsrc.push_buffer(buffer).map(|_| ()).map_err(|flow| {
            let err = self
                .error()
                .unwrap_or_else(|| format!("the pipeline took no frames: {flow:?}"));
            (close::SERVER_ERROR, err)
        })
    }

    /// Barge-in: drops every frame and every sample not yet sent, and the decoder starts fresh.
    pub fn cancel(&self) {
        let mut timeline = self.timeline.lock().unwrap();
        self.appsrc.send_event(gst::event::FlushStart::new());
        self.appsrc.send_event(gst::event::FlushStop::new(false));
        *timeline = Timeline {
            spoke: timeline.spoke,
            ..Timeline::default()
        };
    }

    /// The sender says the speech so far is complete: the frames the decoder holds back for a
    /// full step are decoded and play at once, right after the rest, and the next frames start
    /// new speech, from a fresh decoder.
    pub fn end(&self) {
        let mut timeline = self.timeline.lock().unwrap();
        self.appsrc.send_event(gstqwencodec::drain_event());
        timeline.ended = true;
    }

    /// The sender left (it closed, its connection broke, it answered nothing, another took
    /// over): the speech it was sending ends. While that speech plays (or just did, see SLACK)
    /// the frames the decoder holds back for a full step play at once, after the rest, as at
    /// `end`; of speech long over (a sender silent until the peer timeout) they are dropped, as
    /// a cancel drops them: they would play late, cut off, stamped with their old time.
    pub fn sender_left(&self) {
        let now = self.appsrc.current_running_time().unwrap_or(gst::ClockTime::ZERO);
        let (speaking, playing) = {
            let timeline = self.timeline.lock().unwrap();
            match timeline.next_pts {
                Some(next) if !timeline.ended => (true, next + SLACK >= now),
                _ => (false, false),
            }
        };
        if playing {
            self.end();
        } else if speaking {
            self.cancel();
        }
    }

    /// Whether the session's speech is over and its audio has left `tail` ago: no speech yet
    /// (or cancelled), or the last frame's audio out of the clocksync, and its speech ended
    /// (`end`, or the sender left) or no frame came for [`SLACK`] past it (a frame then would
    /// start new speech). What a draining server waits for before it ends the session.
    pub fn speech_over(&self, tail: gst::ClockTime) -> bool {
        let now = self.appsrc.current_running_time().unwrap_or(gst::ClockTime::ZERO);
        let held = gst::ClockTime::from_nseconds(self.held_latency.load(Ordering::Relaxed));
        let timeline = self.timeline.lock().unwrap();
        let Some(speech_end) = timeline.next_pts else {
            return true;
        };
        let out = speech_end + held;
        let over = if timeline.ended {
            out
        } else {
            out.max(speech_end + SLACK)
        };
        now >= over + tail
    }

    /// A message for the browser, on its signalling connection.
    pub fn tell_browser(&self, message: serde_json::Value) {
        let _ = self.to_browser.send(message);
    }

    /// Whether the browser's peer connection is gone: its ICE failed, stayed disconnected, or
    /// never connected (see `IceWatch`). A broadcast's listeners are Janus's.
    pub fn peer_connection_gone(&self, times: &PeerTimes) -> Option<Gone> {
        match &self.peer {
            Peer::Browser { ice, .. } => ice.lock().unwrap().verdict(times, Instant::now()),
            Peer::Janus { .. } => None,
        }
    }

    /// When the peer connection's verdict may next change with no new ICE state (see
    /// `IceWatch::next_verdict`); None for a broadcast.
    pub fn peer_connection_deadline(&self, times: &PeerTimes) -> Option<Instant> {
        match &self.peer {
            Peer::Browser { ice, .. } => ice.lock().unwrap().next_verdict(times),
            Peer::Janus { .. } => None,
        }
    }

    /// What its connections wait on: the receiver is told when the session ends, its pipeline
    /// posts an error, its peer connection's ICE state changes, its sender slot changes hands,
    /// or the RTP receiver that feeds it stops (`Session::wake`).
    pub fn changes(&self) -> watch::Receiver<()> {
        self.changes.subscribe()
    }

    /// Tells the session's connections to look again at what they wait on.
    pub fn wake(&self) {
        self.changes.send_replace(());
    }

    /// When frames last came in.
    pub fn last_push(&self) -> Option<Instant> {
        *self.last_push.lock().unwrap()
    }

    /// The browser's answer to the offer.
    pub fn set_answer(&self, sdp: &str) -> Result<(), String> {
        let answer = description_from_sdp(SdpKind::Answer, sdp)?;
        self.webrtcbin()?
            .emit_by_name::<()>("set-remote-description", &[&answer, &None::<gst::Promise>]);
        Ok(())
    }

    /// One of the browser's ICE candidates.
    pub fn add_ice_candidate(&self, mline_index: u32, candidate: &str) {
        if let Ok(webrtcbin) = self.webrtcbin() {
            webrtcbin.emit_by_name::<()>("add-ice-candidate", &[&mline_index, &candidate]);
        }
    }

    fn webrtcbin(&self) -> Result<&gst::Element, String> {
        match &self.peer {
            Peer::Browser { webrtcbin, .. } => Ok(webrtcbin),
            Peer::Janus { .. } => Err("a broadcast has no peer connection of its own".into()),
        }
    }

    /// The first error the pipeline posted, if any.
    pub fn error(&self) -> Option<String> {
        let message = self.pipeline.bus()?.pop_filtered(&[gst::MessageType::Error])?;
        match message.view() {
            gst::MessageView::Error(err) => Some(format!(
                "{} (from {})",
                err.error(),
                err.src().map(|src| src.name().to_string()).unwrap_or_default()
            )),
            _ => None,
        }
    }

    /// Takes the session's one sender slot; None when another connection has it.
    pub fn attach_sender(&self) -> Option<SenderTicket> {
        let mut slot = self.sender.lock().unwrap();
        if slot.holder.is_some() || slot.leaving > 0 {
            return None;
        }
        Some(slot.hand_out())
    }

    /// Takes the slot from whoever has it (`takeover=1`), who is told so at its next look
    /// ([`Session::sender_replaced`]); and whether someone had it.
    pub fn take_over_sender(&self) -> (SenderTicket, bool) {
        let mut slot = self.sender.lock().unwrap();
        let took_over = slot.holder.is_some();
        if took_over {
            slot.leaving += 1;
        }
        let ticket = slot.hand_out();
        self.wake();
        (ticket, took_over)
    }

    /// Whether another sender took the slot from `ticket`'s.
    pub fn sender_replaced(&self, ticket: &SenderTicket) -> bool {
        self.sender.lock().unwrap().holder != Some(ticket.0)
    }

    /// Whether senders taken over are still on their way out (their last frames going in,
    /// their RTP port open).
    pub fn senders_leaving(&self) -> bool {
        self.sender.lock().unwrap().leaving > 0
    }

    pub fn detach_sender(&self, ticket: SenderTicket) {
        let mut slot = self.sender.lock().unwrap();
        if slot.holder == Some(ticket.0) {
            slot.holder = None;
        } else {
            slot.leaving -= 1;
        }
        drop(slot);
        self.wake();
    }

    /// Why the session ended, if it has.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap().clone()
    }

    fn stop(&self, why: &str) {
        self.ended.lock().unwrap().get_or_insert_with(|| why.to_owned());
        self.wake();
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

/// The tests' stalled pipelines, in a build with the `test-stalls` feature alone (the browser
/// tests' build): with `QWENCODEC_SERVER_STALL_STARTS=N,MS` in the environment, each of the
/// first N sessions' pipelines waits MS ms before it starts, as one whose state change stalls
/// would (`stalls.rs` shows that it holds up no other session).
#[cfg(feature = "test-stalls")]
fn stall_for_tests() {
    use std::sync::atomic::AtomicUsize;
    static STALLED: AtomicUsize = AtomicUsize::new(0);
    let Some((starts, ms)) = std::env::var("QWENCODEC_SERVER_STALL_STARTS")
        .ok()
        .and_then(|value| {
            let (starts, ms) = value.split_once(',')?;
            Some((starts.parse::<usize>().ok()?, ms.parse::<u64>().ok()?))
        })
    else {
        return;
    };
    if STALLED.fetch_add(1, Ordering::SeqCst) < starts {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// The browser's peer: webrtcbin after `clocksync`, its offer and candidates for the browser.
fn to_browser_peer(
    pipeline: &gst::Pipeline,
    clocksync: &gst::Element,
    opusenc: &gst::Element,
    settings: &PipelineSettings,
    to_browser: &UnboundedSender<serde_json::Value>,
) -> Result<gst::Element, String> {
    let rtp_caps = opus_rtp_caps();
    let capsfilter = gst::ElementFactory::make("capsfilter")
        .property("caps", &rtp_caps)
        .build()
        .map_err(|err| err.to_string())?;
    let webrtcbin = settings.ice.webrtcbin("webrtc")?;
    if settings.opus.fec {
        opus::follow_reported_loss(&webrtcbin, opusenc)?;
    }
    settings.certificate.install(&webrtcbin);
    pipeline
        .add_many([&capsfilter, &webrtcbin])
        .map_err(|err| err.to_string())?;
    clocksync.link(&capsfilter).map_err(|err| err.to_string())?;
    let sink = webrtcbin
        .request_pad_simple("sink_%u")
        .ok_or("webrtcbin gives no sink pad")?;
    let into_webrtcbin = capsfilter.static_pad("src").unwrap();
    into_webrtcbin.link(&sink).map_err(|err| err.to_string())?;
    // A cancel's flush ends here: webrtcbin holds nothing that waits to be sent, and its
    // RTP funnel takes no new segment after a flush (GStreamer 1.22).
    drop_flushes(&into_webrtcbin);
    // No caps reach webrtcbin before speech comes: the transceiver says what will be sent.
    let transceiver = sink.property::<glib::Object>("transceiver");
    transceiver.set_property("codec-preferences", &rtp_caps);
    transceiver.set_property_from_str("direction", "sendonly");
    connect_signalling(
        &webrtcbin,
        settings.certificate.clone(),
        settings.ice.clone(),
        to_browser.clone(),
    );
    Ok(webrtcbin)
}

/// A broadcast's RTP, after `clocksync` (which already holds each packet until its time), to
/// its Janus mountpoint.
fn to_mountpoint(
    pipeline: &gst::Pipeline,
    clocksync: &gst::Element,
    mountpoint: &Mountpoint,
) -> Result<(), String> {
    let udpsink = gst::ElementFactory::make("udpsink")
        .property("host", &mountpoint.host)
        .property("port", i32::from(mountpoint.port))
        .property("sync", false)
        .property("async", false)
        .build()
        .map_err(|err| err.to_string())?;
    pipeline.add(&udpsink).map_err(|err| err.to_string())?;
    clocksync.link(&udpsink).map_err(|err| err.to_string())
}

/// Drops the flush events that reach `pad`. Through the C API: gstreamer-rs's probe wrapper
/// takes a dropped event out of the probe's info, and GStreamer 1.22 then unrefs a NULL event
/// where the event was a flush (a GStreamer-CRITICAL).
fn drop_flushes(pad: &gst::Pad) {
    use gst::ffi;
    use gst::glib::translate::ToGlibPtr;
    unsafe extern "C" fn drop_flush(
        _pad: *mut ffi::GstPad,
        info: *mut ffi::GstPadProbeInfo,
        _data: glib::ffi::gpointer,
    ) -> ffi::GstPadProbeReturn {
        // SAFETY: an event probe's info holds the event, alive during the call.
        let event = unsafe { (*info).data } as *const ffi::GstEvent;
        if !event.is_null()
            && matches!(
                unsafe { (*event).type_ },
                ffi::GST_EVENT_FLUSH_START | ffi::GST_EVENT_FLUSH_STOP
            )
        {
            ffi::GST_PAD_PROBE_DROP
        } else {
            ffi::GST_PAD_PROBE_OK
        }
    }
    // SAFETY: a probe with no data to free on a live pad.
    unsafe {
        ffi::gst_pad_add_probe(
            pad.to_glib_none().0,
            ffi::GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM | ffi::GST_PAD_PROBE_TYPE_EVENT_FLUSH,
            Some(drop_flush),
            std::ptr::null_mut(),
            None,
        );
    }
}

/// A queue and the clocksync after it, which holds each packet until its time plus the latency
/// upstream of it ([`watch_bus`]). The queue takes a step's packets from the decoder's
/// step thread, which goes on to its next step while they wait for their time. Without it the
/// thread would wait in the clocksync until the step's last packet left, a frame less one Opus
/// packet after the first, and the next step would have one packet's time to be decoded before
/// its audio was late, whatever latency the decoder reported (docs/streaming-server.md, "How a
/// session's audio is paced").
fn packet_pacing() -> Result<(gst::Element, gst::Element), String> {
    Ok((make("queue")?, make("clocksync")?))
}

/// An element of `factory` with its defaults, or why there is none.
fn make(factory: &str) -> Result<gst::Element, String> {
    gst::ElementFactory::make(factory)
        .build()
        .map_err(|err| err.to_string())
}

/// Has `clocksync` hold each packet until its time plus the latency upstream of it, now and
/// whenever an element says its latency changed. clocksync learns that latency only from a
/// latency query through it, and the pipeline's own query never comes: it asks the sinks, and
/// webrtcbin's network sink does not sync. Without it, the audio of a step, which leaves the
/// decoder as late as the step's frames waited (240 ms at chunk-frames 4), would leave at once,
/// in a burst, and a new connection's browser would lose the start of its first speech. The
/// latency the clocksync holds packets by is kept in `held_latency`. The bus keeps errors alone,
/// for `Session::error`, and tells `changes` of each: nothing else reads it.
fn watch_bus(
    pipeline: &gst::Pipeline,
    clocksync: &gst::Element,
    held_latency: Arc<AtomicU64>,
    changes: watch::Sender<()>,
) {
    // One query at a time: of two at once, the one that asked first could pass the clocksync
    // last and leave it the older, lower latency (as two recalculations at once can leave the
    // sinks of tests/latency.rs's eight decoders).
    let asking = Arc::new(Mutex::new(()));
    let query = move |src: &gst::Pad| {
        let _one = asking.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut latency = gst::query::Latency::new();
        if src.query(&mut latency) {
            held_latency.store(latency.result().1.nseconds(), Ordering::Relaxed);
        } else {
            log!("no latency upstream of the clocksync");
        }
    };
    let src = clocksync.static_pad("src").unwrap();
    query(&src);
    let src = src.downgrade();
    pipeline
        .bus()
        .unwrap()
        .set_sync_handler(move |_bus, message| match message.view() {
            gst::MessageView::Error(_) => {
                changes.send_replace(());
                gst::BusSyncReply::Pass
            }
            gst::MessageView::Latency(_) => {
                if let Some(src) = src.upgrade() {
                    // Not on the thread that posted it, which may be streaming through the
                    // clocksync.
                    let query = query.clone();
                    std::thread::spawn(move || query(&src));
                }
                gst::BusSyncReply::Drop
            }
            _ => gst::BusSyncReply::Drop,
        });
}

/// How much later than the speech's first packet, against its schedule, a packet may reach
/// the sender: past it, the listener's jitter buffer (sized to how late packets come) runs dry.
const LATE: i64 = 100_000_000;

/// Counts the packets that reach `clocksync` later than their speech's schedule allows. The
/// clocksync holds each packet until its time plus `held_latency` (the latency upstream of it,
/// kept by [`watch_bus`]): a packet that comes before then is on time. Each speech (from
/// a new-speech segment or a flush on) sets its schedule by its first packet, which may come as
/// late as a decode step makes it; a packet [`LATE`] past that schedule is a gap the listener
/// hears. (Counted from the packet's time alone, without the latency, a burst's first packet,
/// decoded at once, would set a schedule that the clocksync's hold puts every later packet
/// behind.) The first late packet of each speech is logged with how late it came.
fn count_late_audio(
    clocksync: &gst::Element,
    held_latency: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    session: String,
) {
    let element = clocksync.downgrade();
    // The speech's schedule (how far past its release its first packet came), and whether a
    // packet of it was logged late.
    let schedule: Mutex<Option<(i64, bool)>> = Mutex::new(None);
    clocksync.static_pad("sink").unwrap().add_probe(
        gst::PadProbeType::BUFFER | gst::PadProbeType::EVENT_DOWNSTREAM | gst::PadProbeType::EVENT_FLUSH,
        move |pad, info| {
            match &info.data {
                Some(gst::PadProbeData::Event(event))
                    if matches!(event.type_(), gst::EventType::Segment | gst::EventType::FlushStop) =>
                {
                    *schedule.lock().unwrap() = None;
                }
                Some(gst::PadProbeData::Buffer(buffer)) => {
                    let due = pad.sticky_event::<gst::event::Segment>(0).and_then(|segment| {
                        segment
                            .segment()
                            .downcast_ref::<gst::ClockTime>()?
                            .to_running_time(buffer.pts()?)
                    });
                    let now = element
                        .upgrade()
                        .and_then(|element| element.current_running_time());
                    if let (Some(due), Some(now)) = (due, now) {
                        let release = due.nseconds() + held_latency.load(Ordering::Relaxed);
                        let past_release = (now.nseconds() as i64 - release as i64).max(0);
                        let mut schedule = schedule.lock().unwrap();
                        let (first, logged) = schedule.get_or_insert((past_release, false));
                        let behind = past_release - *first;
                        if behind > LATE {
                            metrics.late_audio.inc();
                            if !*logged {
                                *logged = true;
                                log!(
                                    "session {session}: audio {} ms behind its speech's schedule at the sender (a gap the listener hears; more of this speech are counted, not logged)",
                                    behind / 1_000_000
                                );
                            }
                        }
                    }
                }
                _ => (),
            }
            gst::PadProbeReturn::Ok
        },
    );
}

/// Counts the seconds of audio `decoder` hands on.
fn count_audio_out(decoder: &gst::Element, metrics: Arc<Metrics>) {
    decoder
        .static_pad("src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            if let Some(gst::PadProbeData::Buffer(buffer)) = &info.data
                && let Some(duration) = buffer.duration()
            {
                metrics.audio_seconds_out.inc_by(duration.nseconds() as f64 / 1e9);
            }
            gst::PadProbeReturn::Ok
        });
}

/// Turns the new-speech marker into a segment at the Opus encoder's input: the encoder drains
/// and resets on a segment. Without it, after a pause, the encoder's last few milliseconds of
/// the speech before (the rest of an Opus frame) would leave with the first packet of the new
/// speech, stamped as the old speech's continuation, and the packet after it would jump by the
/// whole pause: a browser's jitter buffer takes that for a late packet and grows by a second.
fn reset_encoder_at_new_speech(pad: &gst::Pad) {
    pad.add_probe(gst::PadProbeType::EVENT_DOWNSTREAM, |pad, info| {
        let Some(gst::PadProbeData::Event(event)) = &info.data else {
            return gst::PadProbeReturn::Ok;
        };
        if event.type_() == gst::EventType::CustomDownstream
            && event.structure().is_some_and(|s| s.name() == NEW_SPEECH)
        {
            info.data = pad
                .sticky_event::<gst::event::Segment>(0)
                .map(|segment| gst::PadProbeData::Event(gst::event::Segment::new(segment.segment())));
            if info.data.is_none() {
                // No audio yet: nothing to reset.
                return gst::PadProbeReturn::Drop;
            }
        }
        gst::PadProbeReturn::Ok
    });
}

/// Puts LEAD_IN of silence before the first audio of the session, stamped before it (`Session::push`
/// leaves room for it when a session's first speech comes at once): the browser loses the start
/// of a new peer connection's first audio, every packet received at its time, and what it loses
/// is then silence (docs/testing.md has how much).
fn lead_in_silence(pad: &gst::Pad) {
    pad.add_probe(gst::PadProbeType::BUFFER, |pad, info| {
        let Some(gst::PadProbeData::Buffer(audio)) = info.data.take() else {
            return gst::PadProbeReturn::Ok;
        };
        let format = pad
            .current_caps()
            .and_then(|caps| gst_audio::AudioInfo::from_caps(&caps).ok());
        let (Some(format), Some(pts)) = (format, audio.pts()) else {
            info.data = Some(gst::PadProbeData::Buffer(audio));
            return gst::PadProbeReturn::Remove;
        };
        let frames = LEAD_IN.nseconds() * format.rate() as u64 / gst::ClockTime::SECOND.nseconds();
        let mut silence = vec![0u8; frames as usize * format.bpf() as usize];
        format.format_info().fill_silence(&mut silence);
        let mut lead_in = gst::Buffer::from_mut_slice(silence);
        {
            let lead_in = lead_in.get_mut().unwrap();
            lead_in.set_pts(pts.saturating_sub(LEAD_IN));
            lead_in.set_duration(audio.duration().map(|duration| duration + LEAD_IN));
        }
        lead_in.append(audio);
        info.data = Some(gst::PadProbeData::Buffer(lead_in));
        gst::PadProbeReturn::Remove
    });
}

/// Follows webrtcbin's ICE connection state, into the log and the session's `IceWatch`. libnice
/// keeps the selected pair alive with STUN indications, which nothing answers, and so never
/// finds a peer that went away; with connectivity checks for keepalives it fails the pair once
/// they go unanswered (after its 50 s consent timeout, libnice 0.1.21).
fn watch_ice(webrtcbin: &gst::Element, id: &str, changes: watch::Sender<()>) -> Arc<Mutex<IceWatch>> {
    webrtcbin
        .property::<glib::Object>("ice-agent")
        .property::<glib::Object>("agent")
        .set_property("keepalive-conncheck", true);
    let watch = Arc::new(Mutex::new(IceWatch::new(Instant::now())));
    let (following, id) = (watch.clone(), id.to_owned());
    webrtcbin.connect_notify(Some("ice-connection-state"), move |webrtcbin, _| {
        let value = webrtcbin.property_value("ice-connection-state");
        let Some((_, state)) = glib::EnumValue::from_value(&value) else {
            return;
        };
        log!("session {id}: ICE {}", state.nick());
        if let Some(state) = IceState::from_nick(state.nick()) {
            following.lock().unwrap().observe(state, Instant::now());
            changes.send_replace(());
        }
    });
    watch
}

/// webrtcbin offers as soon as it wants to negotiate; its offer and its candidates go to the
/// browser.
fn connect_signalling(
    webrtcbin: &gst::Element,
    certificate: Arc<DtlsCertificate>,
    ice: Arc<Ice>,
    to_browser: UnboundedSender<serde_json::Value>,
) {
    let offers = to_browser.clone();
    webrtcbin.connect("on-negotiation-needed", false, move |values| {
        let webrtcbin = values[0].get::<gst::Element>().unwrap();
        let weak = webrtcbin.downgrade();
        let (offers, certificate) = (offers.clone(), certificate.clone());
        let promise = gst::Promise::with_change_func(move |reply| {
            let Some(webrtcbin) = weak.upgrade() else {
                return;
            };
            let offer = match reply {
                Ok(Some(reply)) => reply.value("offer").map_err(|_| reply.to_string()),
                other => Err(format!("{other:?}")),
            };
            match offer.and_then(|offer| {
                webrtcbin.emit_by_name::<()>("set-local-description", &[offer, &None::<gst::Promise>]);
                sdp_of(offer)
            }) {
                Ok(sdp) => {
                    let sdp = certificate.fix_fingerprint(&sdp);
                    let _ = offers.send(json!({"type": "offer", "sdp": sdp}));
                }
                Err(err) => log!("creating the offer failed: {err}"),
            }
        });
        webrtcbin.emit_by_name::<()>("create-offer", &[&None::<gst::Structure>, &promise]);
        None
    });
    webrtcbin.connect("on-ice-candidate", false, move |values| {
        let mline_index = values[1].get::<u32>().unwrap();
        let candidate = ice.announced(&values[2].get::<String>().unwrap());
        let _ = to_browser.send(json!({"type": "ice", "sdpMLineIndex": mline_index, "candidate": candidate}));
        None
    });
}

/// The sessions of the server, by id.
pub struct Sessions {
    settings: PipelineSettings,
    max: usize,
    registry: Mutex<Registry>,
}

/// What the sessions' lock guards.
#[derive(Default)]
struct Registry {
    open: HashMap<String, Arc<Session>>,
    /// Sessions whose pipelines are being built: their ids are taken, and they count against
    /// the cap.
    starting: HashSet<String>,
    /// Why no session opens any more (the server drains or shuts down), once that is so.
    closed: Option<String>,
}

impl Sessions {
    pub fn new(settings: PipelineSettings, max: usize) -> Self {
        Self {
            settings,
            max,
            registry: Mutex::default(),
        }
    }

    pub fn format(&self) -> &CodecFormat {
        &self.settings.format
    }

    /// A new session with its pipeline playing, unless the server has its most sessions; its id
    /// is `id` (a join token's) or one made here. The pipeline is built outside the lock, which
    /// every sender's lookup and every session's end take: a start takes tens of milliseconds,
    /// and a burst of joins would hold all of them up.
    pub fn open(
        &self,
        to_browser: UnboundedSender<serde_json::Value>,
        id: Option<String>,
        egress: Egress,
    ) -> Result<Arc<Session>, (u16, String)> {
        use crate::http::close;
        let id = match (id, &self.settings.instance) {
            (Some(id), Some(instance)) if !id.starts_with(&format!("{instance}-")) => {
                let reason = format!("session id {id} does not start with {instance}- (--instance)");
                return Err((close::FORBIDDEN, reason));
            }
            (Some(id), _) => id,
            (None, instance) => {
                let random = crate::random::random_hex(16).map_err(|err| (close::SERVER_ERROR, err))?;
                match instance {
                    Some(instance) => format!("{instance}-{random}"),
                    None => random,
                }
            }
        };
        {
            let mut registry = self.registry.lock().unwrap();
            if let Some(why) = &registry.closed {
                return Err((close::DRAINING, why.clone()));
            }
            let sessions = registry.open.len() + registry.starting.len();
            if sessions >= self.max {
                return Err((
                    close::TOO_MANY_SESSIONS,
                    format!("the server has its most sessions ({})", self.max),
                ));
            }
            // Behind now (`admission`): late audio, steps left waiting, too little margin.
            if let Some(why) = self.settings.metrics.capacity.refusal(sessions) {
                return Err((close::TOO_MANY_SESSIONS, why));
            }
            if registry.open.contains_key(&id) || !registry.starting.insert(id.clone()) {
                return Err((close::BUSY, format!("session {id} is open already")));
            }
        }
        let started = Session::start(id.clone(), &self.settings, to_browser, egress);
        let mut registry = self.registry.lock().unwrap();
        registry.starting.remove(&id);
        let session = Arc::new(
            started.map_err(|err| (close::SERVER_ERROR, format!("cannot start a pipeline: {err}")))?,
        );
        if let Some(why) = registry.closed.clone() {
            // The server began to drain while the pipeline was built.
            drop(registry);
            session.stop(&why);
            return Err((close::DRAINING, why));
        }
        registry.open.insert(id, session.clone());
        Ok(session)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.registry.lock().unwrap().open.get(id).cloned()
    }

    /// Ends a session: its pipeline stops, and its sender is told why at its next look.
    pub fn close(&self, id: &str, why: &str) {
        let session = self.registry.lock().unwrap().open.remove(id);
        if let Some(session) = session {
            session.stop(why);
        }
    }

    /// Opens no session from now on (the server drains: SIGTERM), a join refused with 4503
    /// `refusal`; `/status` and the metrics say it admits none.
    pub fn drain(&self, refusal: &str) {
        self.registry.lock().unwrap().closed = Some(refusal.to_owned());
        self.settings.metrics.capacity.drain(refusal);
    }

    /// Why a join is refused now that the server drains, if it does.
    pub fn draining(&self) -> Option<String> {
        self.registry.lock().unwrap().closed.clone()
    }

    /// Ends each session whose speech is over and whose audio left `tail` ago
    /// ([`Session::speech_over`]), saying why; the sessions left.
    pub fn close_where_speech_over(&self, tail: gst::ClockTime, why: &str) -> usize {
        let (over, left): (Vec<Arc<Session>>, usize) = {
            let mut registry = self.registry.lock().unwrap();
            let ids: Vec<String> = registry
                .open
                .iter()
                .filter(|(_, session)| session.speech_over(tail))
                .map(|(id, _)| id.clone())
                .collect();
            let over = ids.iter().filter_map(|id| registry.open.remove(id)).collect();
            (over, registry.open.len())
        };
        for session in over {
            log!("session {}: its speech is over, ended ({why})", session.id);
            session.stop(why);
        }
        left
    }

    /// Ends every session (the server shuts down), and opens none from now on: each one's
    /// connections close, saying why.
    pub fn close_all(&self, why: &str) {
        let sessions: Vec<Arc<Session>> = {
            let mut registry = self.registry.lock().unwrap();
            registry.closed.get_or_insert_with(|| why.to_owned());
            registry.open.values().cloned().collect()
        };
        for session in sessions {
            session.stop(why);
        }
    }

    pub fn count(&self) -> usize {
        self.registry.lock().unwrap().open.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// Counts the buffers that pass `pad`.
    fn count_buffers(pad: &gst::Pad, count: Arc<AtomicUsize>) {
        pad.add_probe(gst::PadProbeType::BUFFER, move |_, _| {
            count.fetch_add(1, Ordering::SeqCst);
            gst::PadProbeReturn::Ok
        });
    }

    /// Packets handed to the pacing all at once (a step's, or a burst's) are taken at once,
    /// while the clocksync lets them go one by one at their time: the thread that hands them
    /// over (the decoder's step thread) is free for its next step, where without the queue it
    /// would be held until the last but one of them had left.
    #[test]
    fn the_pacing_takes_a_steps_packets_at_once_and_lets_them_go_at_their_time() {
        gst::init().unwrap();
        const PACKETS: u64 = 20;
        // Opus packets of 20 ms: a burst's worth (the queue holds a second).
        const PACKET: gst::ClockTime = gst::ClockTime::from_mseconds(20);
        let pipeline = gst::Pipeline::new();
        let source = gst_app::AppSrc::builder()
            .format(gst::Format::Time)
            .is_live(true)
            .build();
        let (queue, clocksync) = packet_pacing().unwrap();
        let sink = gst::ElementFactory::make("fakesink")
            .property("sync", false)
            .property("async", false)
            .build()
            .unwrap();
        let chain = [source.upcast_ref(), &queue, &clocksync, &sink];
        pipeline.add_many(chain).unwrap();
        gst::Element::link_many(chain).unwrap();
        let (taken, left) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        count_buffers(&queue.static_pad("sink").unwrap(), taken.clone());
        count_buffers(&clocksync.static_pad("src").unwrap(), left.clone());
        pipeline.set_state(gst::State::Playing).unwrap();
        let (reached, _, _) = pipeline.state(gst::ClockTime::from_seconds(10));
        reached.unwrap();
        let start = pipeline.current_running_time().unwrap();
        for index in 0..PACKETS {
            let mut packet = gst::Buffer::with_size(8).unwrap();
            let packet_mut = packet.get_mut().unwrap();
            packet_mut.set_pts(start + PACKET * index);
            packet_mut.set_duration(PACKET);
            source.push_buffer(packet).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while taken.load(Ordering::SeqCst) < PACKETS as usize && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let left_when_taken = left.load(Ordering::SeqCst);
        assert_eq!(
            taken.load(Ordering::SeqCst),
            PACKETS as usize,
            "every packet taken"
        );
        assert!(
            left_when_taken <= PACKETS as usize / 4,
            "{left_when_taken} of {PACKETS} packets had left when the last was taken"
        );
        // And they leave at their time: the last 19 packets after the first.
        while left.load(Ordering::SeqCst) < PACKETS as usize && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(left.load(Ordering::SeqCst), PACKETS as usize, "every packet left");
        let elapsed = pipeline.current_running_time().unwrap().saturating_sub(start);
        assert!(
            elapsed >= PACKET * (PACKETS - 1),
            "they left at their time: {elapsed}"
        );
        pipeline.set_state(gst::State::Null).unwrap();
    }
}
