//! A session's codes over RTP (`/codes?session=ID&transport=rtp`): the sender's WebSocket stays
//! the control channel (the token, `end`, `cancel`, the refusals), and the frames come as
//! `X-QWEN3-TTS-CODES` RTP packets (docs/rtp-codes.md) to a UDP port of the session's own.
//!
//! ```text
//! udpsrc ! rtpjitterbuffer ! rtpqwencodesdepay ! appsink  --> Session::push, as WebSocket frames go
//! ```
//!
//! The frames take the WebSocket frames' way into the session (its timeline, pacing, limits and
//! cancel), so that both transports behave alike. An utterance starts where the depayloader
//! flags a buffer RESYNC (a marked packet, or one of a new utterance number when the marked one
//! was lost): the speech before it ends there, as `{"type":"end"}` ends it, and a cancel ends
//! there too. Lost frames that the depayloader counts (a GAP flagged missing data before the
//! packet after them) are filled with copies of the last frame received, as `qwencodecdec
//! plc=true` fills them, and the decoder goes on; any other loss (DISCONT alone) restarts the
//! decoder the same way as an utterance's start, but is no new utterance: what comes of a
//! cancelled utterance after it is still dropped.
//!
//! With `srtp=1` the packets are SRTP, of a key made for the session and told to the sender on
//! its WebSocket: `srtpdec` drops what fails authentication (a wrong key, plain RTP), and the
//! port locks to the first packet that passes.
//!
//! ```text
//! udpsrc ! srtpdec ! rtpjitterbuffer ! rtpqwencodesdepay ! appsink
//! ```
//!
//! The port takes packets from the sender's address alone (the address its WebSocket came
//! from), and of those only the source port and SSRC of the first it took
//! (`qwencodec_rtp_codes::source`): anyone else who finds the port, a host behind the same NAT
//! or a spoofed source among them, could otherwise speak into the session, unasked, or start an
//! utterance that ends a cancel.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gst::prelude::*;
use gst_net::gio;
use gst_net::gio::prelude::InetSocketAddressExt;
use gstqwencodec::model::DecoderConfig;
use qwencodec_rtp_codes::{SourceLock, Stranger};

use crate::log::log;
use crate::metrics::Metrics;
use crate::random::random_bytes;
use crate::session::Session;

/// How long the jitter buffer waits for a late or reordered packet: a frame is 80 ms, and a
/// packet later than this counts as lost (its frames filled with the frame before them).
const JITTER_BUFFER_MS: u32 = 40;
/// The longest loss filled with the last frame (two seconds at the release's rate), as
/// `qwencodecdec`'s `max-plc-frames`; a longer one restarts the decoder.
const MAX_CONCEALED_FRAMES: u64 = 25;
const PAYLOAD_TYPE: u32 = 96;

/// The SRTP crypto suite offered, by RFC 4568's name: AES in counter mode with a 128-bit key and
/// HMAC-SHA1 tags of 80 bits (`srtpdec`'s aes-128-icm and hmac-sha1-80), which every SRTP stack
/// has.
pub const SRTP_SUITE: &str = "AES_CM_128_HMAC_SHA1_80";
/// Its master key and salt: 16 bytes and 14.
const SRTP_KEY_BYTES: usize = 30;

/// A session's SRTP master key and salt, made for it and told its sender alone.
pub struct SrtpKey(Vec<u8>);

impl SrtpKey {
    fn new() -> Result<Self, String> {
        random_bytes(SRTP_KEY_BYTES).map(Self)
    }

    /// In base64, as SDP's `a=crypto` writes it (`inline:`).
    pub fn base64(&self) -> String {
        data_encoding::BASE64.encode(&self.0)
    }

    /// What `srtpdec` asks for each SSRC (its `request-key`).
    fn decoder_caps(&self) -> gst::Caps {
        gst::Caps::builder("application/x-srtp")
            .field("srtp-key", gst::Buffer::from_slice(self.0.clone()))
            .field("srtp-cipher", "aes-128-icm")
            .field("srtp-auth", "hmac-sha1-80")
            .field("srtcp-cipher", "aes-128-icm")
            .field("srtcp-auth", "hmac-sha1-80")
            .build()
    }
}

/// What the RTP caps and the SDP say about the codes.
#[derive(Clone)]
pub struct RtpFormat {
    clock_rate: u32,
    codebooks: usize,
    codebook_size: usize,
    samples_per_frame: usize,
}

impl RtpFormat {
    pub fn new(config: &DecoderConfig) -> Self {
        Self {
            clock_rate: config.sample_rate,
            codebooks: config.num_quantizers,
            codebook_size: config.codebook_size,
            samples_per_frame: config.samples_per_frame(),
        }
    }

    fn caps(&self, srtp: bool) -> gst::Caps {
        gst::Caps::builder(if srtp {
            "application/x-srtp"
        } else {
            "application/x-rtp"
        })
        .field("media", "audio")
        .field("encoding-name", gstqwencodec::RTP_CODES_ENCODING_NAME)
        .field("clock-rate", self.clock_rate as i32)
        .field("payload", PAYLOAD_TYPE as i32)
        .field("version", gstqwencodec::RTP_CODES_VERSION.to_string())
        .field("codebooks", self.codebooks.to_string())
        .field("codebook-size", self.codebook_size.to_string())
        .field("samples-per-frame", self.samples_per_frame.to_string())
        .build()
    }

    /// The SDP a sender needs: where to send and what, and with SRTP its key (RFC 4568's
    /// `a=crypto`).
    fn sdp(&self, address: IpAddr, port: u16, srtp: Option<&SrtpKey>) -> String {
        let family = if address.is_ipv4() { "IP4" } else { "IP6" };
        let (profile, crypto) = match srtp {
            Some(key) => (
                "RTP/SAVP",
                format!("a=crypto:1 {SRTP_SUITE} inline:{}\r\n", key.base64()),
            ),
            None => ("RTP/AVP", String::new()),
        };
        format!(
            "v=0\r\no=- 0 0 IN {family} {address}\r\ns=qwencodec codes\r\nc=IN {family} {address}\r\nt=0 0\r\n\
             m=audio {port} {profile} {PAYLOAD_TYPE}\r\na=rtpmap:{PAYLOAD_TYPE} {}/{}\r\n\
             a=fmtp:{PAYLOAD_TYPE} version={};codebooks={};codebook-size={};samples-per-frame={}\r\n{crypto}a=recvonly\r\n",
            gstqwencodec::RTP_CODES_ENCODING_NAME,
            self.clock_rate,
            gstqwencodec::RTP_CODES_VERSION,
            self.codebooks,
            self.codebook_size,
            self.samples_per_frame,
        )
    }
}

/// A session's RTP receiver; it stops when dropped.
pub struct RtpIngress {
    pipeline: gst::Pipeline,
    pub port: u16,
    pub sdp: String,
    /// The SRTP key the packets are protected with (`srtp=1`).
    pub srtp: Option<SrtpKey>,
    utterances: Arc<Utterances>,
    /// Why the frames stopped going into the session (a refusal of `Session::push`).
    refused: Arc<Mutex<Option<(u16, String)>>>,
    frames: Arc<Mutex<usize>>,
    /// The sender's lock, and the packets it dropped.
    gate: Arc<Gate>,
}

/// Where a session's RTP comes in: the local address the port is bound on, the address the
/// SDP names for it (the same, or a 1:1 NAT's public one), and the one address whose packets
/// are taken.
pub struct RtpAddresses {
    pub local: IpAddr,
    pub announced: IpAddr,
    pub sender: IpAddr,
}

impl RtpAddresses {
    /// The port on `local` (where the sender's WebSocket came in), named in the SDP as
    /// `public` (`--public-address`, behind a 1:1 NAT) when that is of the same family, for
    /// `sender`'s packets.
    pub fn new(local: IpAddr, public: Option<IpAddr>, sender: IpAddr) -> Self {
        let announced = public
            .filter(|public| public.is_ipv4() == local.to_canonical().is_ipv4())
            .unwrap_or(local);
        Self {
            local,
            announced,
            sender,
        }
    }
}

impl RtpIngress {
    /// Listens on a free UDP port of `addresses.local` and hands what comes from
    /// `addresses.sender` to `session`; with `srtp`, SRTP of a key made now.
    pub fn start(
        session: Arc<Session>,
        format: &RtpFormat,
        addresses: RtpAddresses,
        metrics: Arc<Metrics>,
        srtp: bool,
    ) -> Result<Self, String> {
        let key = srtp.then(SrtpKey::new).transpose()?;
        let id = session.id.clone();
        let pipeline = gst::Pipeline::with_name(&format!("rtp-{id}"));
        let make = |factory: &str| {
            gst::ElementFactory::make(factory)
                .build()
                .map_err(|err| format!("{factory}: {err}"))
        };
        let udpsrc = gst::ElementFactory::make("udpsrc")
            .property("address", addresses.local.to_string())
            .property("port", 0i32)
            .property("caps", format.caps(key.is_some()))
            .build()
            .map_err(|err| format!("udpsrc: {err}"))?;
        let jitterbuffer = gst::ElementFactory::make("rtpjitterbuffer")
            .property("latency", JITTER_BUFFER_MS)
            .build()
            .map_err(|err| format!("rtpjitterbuffer: {err}"))?;
        let appsink = gst_app::AppSink::builder().sync(false).build();
        let depayloader = make("rtpqwencodesdepay")?;
        let chain = [&jitterbuffer, &depayloader, appsink.upcast_ref()];
        pipeline.add_many(chain).map_err(|err| err.to_string())?;
        pipeline.add(&udpsrc).map_err(|err| err.to_string())?;
        gst::Element::link_many(chain).map_err(|err| err.to_string())?;
        let srtpdec = match &key {
            None => None,
            Some(key) => {
                let srtpdec = make("srtpdec")?;
                let caps = key.decoder_caps();
                srtpdec.connect("request-key", false, move |_| Some(caps.to_value()));
                Some(srtpdec)
            }
        };
        let gate = Arc::new(Gate::new(
            addresses.sender,
            &id,
            metrics.clone(),
            srtpdec.as_ref(),
        ));
        match &srtpdec {
            None => udpsrc.link(&jitterbuffer).map_err(|err| err.to_string())?,
            Some(srtpdec) => {
                pipeline.add(srtpdec).map_err(|err| err.to_string())?;
                udpsrc
                    .link_pads(Some("src"), srtpdec, Some("rtp_sink"))
                    .map_err(|err| err.to_string())?;
                srtpdec
                    .link_pads(Some("rtp_src"), &jitterbuffer, Some("sink"))
                    .map_err(|err| err.to_string())?;
                take_authenticated(srtpdec, gate.clone());
            }
        }
        take_only_from(&udpsrc, gate.clone());
        if gate.srtp.is_some() {
            SRTP_GATES.lock().unwrap().push(Arc::downgrade(&gate));
        }

        let utterances = Arc::new(Utterances::default());
        let concealment = Arc::new(Mutex::new(Concealment::new(format, frame_bytes_of(format))));
        watch_lost_time(&appsink, concealment.clone());
        let refused = Arc::new(Mutex::new(None));
        let frames = Arc::new(Mutex::new(0));
        let frame_bytes = frame_bytes_of(format);
        // An error wakes the sender's connection, which reads it (`RtpIngress::stopped`);
        // nothing else reads the bus.
        let waking = Arc::downgrade(&session);
        pipeline
            .bus()
            .unwrap()
            .set_sync_handler(move |_bus, message| match message.view() {
                gst::MessageView::Error(_) => {
                    if let Some(session) = waking.upgrade() {
                        session.wake();
                    }
                    gst::BusSyncReply::Pass
                }
                _ => gst::BusSyncReply::Drop,
            });
        appsink.set_callbacks(
            gst_app::AppSinkCallbacks::builder()
                .new_sample({
                    let (utterances, refused, frames, concealment) = (
                        utterances.clone(),
                        refused.clone(),
                        frames.clone(),
                        concealment.clone(),
                    );
                    move |appsink| {
                        let sample = appsink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                        let buffer = sample.buffer().ok_or(gst::FlowError::Error)?;
                        let map = buffer.map_readable().map_err(|_| gst::FlowError::Error)?;
                        let mut frames = frames.lock().unwrap();
                        let mut flags = buffer.flags();
                        let fill = concealment.lock().unwrap().fill(flags, &map);
                        if fill.is_some() {
                            // The loss is filled: the decoder goes on.
                            flags.remove(gst::BufferFlags::DISCONT);
                        }
                        match utterances.take(flags) {
                            Take::Drop => return Ok(gst::FlowSuccess::Ok),
                            Take::Push { restart } if restart && *frames > 0 => session.end(),
                            Take::Push { .. } => (),
                        }
                        for part in [fill.as_deref().unwrap_or_default(), &map[..]] {
                            let count = part.len() / frame_bytes;
                            if count == 0 {
                                continue;
                            }
                            if let Err(refusal) = session.push(part, count) {
                                refused.lock().unwrap().get_or_insert(refusal);
                                session.wake();
                                return Err(gst::FlowError::Error);
                            }
                            *frames += count;
                            metrics.frames_in.inc_by(count as u64);
                        }
                        Ok(gst::FlowSuccess::Ok)
                    }
                })
                .build(),
        );
        pipeline
            .set_state(gst::State::Playing)
            .map_err(|_| "the RTP receiver does not start".to_string())?;
        // Bound now (udpsrc opens its socket on the way to READY), to the port the system chose.
        let port = udpsrc.property::<i32>("port") as u16;
        if port == 0 {
            let _ = pipeline.set_state(gst::State::Null);
            return Err("udpsrc did not say the port it bound".into());
        }
        Ok(Self {
            pipeline,
            port,
            sdp: format.sdp(addresses.announced, port, key.as_ref()),
            srtp: key,
            utterances,
            refused,
            frames,
            gate,
        })
    }

    /// A cancel: what comes of the utterance cancelled is dropped until the next one starts.
    pub fn cancel(&self) {
        self.utterances.cancel();
    }

    /// The frames handed to the session so far.
    pub fn frames(&self) -> usize {
        *self.frames.lock().unwrap()
    }

    /// Why the receiver stopped, if it has: a refusal of the session, or the pipeline's error
    /// (caps that disagree with the model are the depayloader's error).
    pub fn stopped(&self) -> Option<(u16, String)> {
        if let Some(refusal) = self.refused.lock().unwrap().clone() {
            return Some(refusal);
        }
        let message = self.pipeline.bus()?.pop_filtered(&[gst::MessageType::Error])?;
        match message.view() {
            gst::MessageView::Error(err) => Some((
                crate::http::close::SERVER_ERROR,
                format!("the RTP receiver failed: {}", err.error()),
            )),
            _ => None,
        }
    }
}

impl Drop for RtpIngress {
    fn drop(&mut self) {
        self.gate.settle_srtp();
        let _ = self.pipeline.set_state(gst::State::Null);
        self.gate.log_dropped();
    }
}

/// What the receiver does with a buffer of frames out of the depayloader.
#[derive(Debug, PartialEq, Eq)]
enum Take {
    /// Into the session; with `restart` the decoder first ends what it has and starts fresh
    /// (an utterance starts, or the depayloader restarted after a loss), as at `end`.
    Push { restart: bool },
    /// Frames of a cancelled utterance.
    Drop,
}

/// The sender's utterances, as the depayloader flags their starts (RESYNC) and the restarts
/// after a loss (DISCONT alone): a cancel holds until the next utterance starts.
#[derive(Default)]
struct Utterances {
    cancelled: AtomicBool,
}

impl Utterances {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    fn take(&self, flags: gst::BufferFlags) -> Take {
        if flags.contains(gst::BufferFlags::RESYNC) {
            self.cancelled.store(false, Ordering::SeqCst);
        }
        if self.cancelled.load(Ordering::SeqCst) {
            return Take::Drop;
        }
        Take::Push {
            restart: flags.intersects(gst::BufferFlags::DISCONT | gst::BufferFlags::RESYNC),
        }
    }
}

fn frame_bytes_of(format: &RtpFormat) -> usize {
    2 * format.codebooks
}

/// The frames lost before the next buffer, as the depayloader counts them, and the last frame
/// received, which fills them.
struct Concealment {
    frame_duration: gst::ClockTime,
    frame_bytes: usize,
    /// Frames of the lost time since the last buffer.
    lost: Option<u64>,
    /// Lost time since the last buffer that was not whole frames.
    uncounted: bool,
    last_frame: Vec<u8>,
}

impl Concealment {
    fn new(format: &RtpFormat, frame_bytes: usize) -> Self {
        Self {
            frame_duration: gst::ClockTime::SECOND
                .mul_div_floor(format.samples_per_frame as u64, u64::from(format.clock_rate))
                .unwrap_or(gst::ClockTime::ZERO),
            frame_bytes,
            lost: None,
            uncounted: false,
            last_frame: Vec::new(),
        }
    }

    /// Lost time (a GAP flagged missing data) before the next buffer; time that is not whole
    /// frames leaves the loss uncounted.
    fn lost_time(&mut self, duration: Option<gst::ClockTime>) {
        let frame = self.frame_duration.nseconds();
        let frames = duration
            .map(|duration| duration.nseconds())
            .filter(|duration| frame > 0 && duration % frame == 0)
            .map(|duration| duration / frame);
        self.lost = match frames {
            Some(frames) if !self.uncounted => Some(self.lost.unwrap_or(0) + frames),
            _ => {
                self.uncounted = true;
                None
            }
        };
    }

    /// For a buffer of `flags` and frames `data`: the copies of the last frame that fill the
    /// frames lost before it, if it goes on from them (DISCONT, not RESYNC) and the loss is
    /// at most MAX_CONCEALED_FRAMES. Its last frame is kept for the next loss.
    fn fill(&mut self, flags: gst::BufferFlags, data: &[u8]) -> Option<Vec<u8>> {
        let lost = self.lost.take();
        self.uncounted = false;
        let fill = lost
            .filter(|lost| (1..=MAX_CONCEALED_FRAMES).contains(lost))
            .filter(|_| {
                flags.contains(gst::BufferFlags::DISCONT)
                    && !flags.contains(gst::BufferFlags::RESYNC)
                    && self.last_frame.len() == self.frame_bytes
            })
            .map(|lost| self.last_frame.repeat(lost as usize));
        if data.len() >= self.frame_bytes {
            self.last_frame = data[data.len() - self.frame_bytes..].to_vec();
        }
        fill
    }
}

/// Hands the depayloader's lost time (GAP events flagged missing data) to `concealment`.
fn watch_lost_time(appsink: &gst_app::AppSink, concealment: Arc<Mutex<Concealment>>) {
    appsink
        .static_pad("sink")
        .unwrap()
        .add_probe(gst::PadProbeType::EVENT_DOWNSTREAM, move |_, info| {
            if let Some(gst::PadProbeData::Event(event)) = &info.data
                && let gst::EventView::Gap(gap) = event.view()
                && gap.gap_flags().contains(gst::GapFlags::DATA)
            {
                concealment.lock().unwrap().lost_time(gap.get().1);
            }
            gst::PadProbeReturn::Ok
        });
}

/// The gates of the SRTP ports open now: `srtpdec` counts the packets that fail authentication
/// in its stats alone, which are read when the metrics are (`settle_srtp_failures`).
static SRTP_GATES: Mutex<Vec<std::sync::Weak<Gate>>> = Mutex::new(Vec::new());

/// Brings the metrics' count of packets that failed SRTP authentication up to what each open
/// port's `srtpdec` counted (a port that closes adds its own at the end): `/metrics` calls it
/// before it renders.
pub fn settle_srtp_failures() {
    let gates: Vec<Arc<Gate>> = {
        let mut gates = SRTP_GATES.lock().unwrap();
        gates.retain(|gate| gate.strong_count() > 0);
        gates.iter().filter_map(std::sync::Weak::upgrade).collect()
    };
    for gate in gates {
        gate.settle_srtp();
    }
}

/// The sender's lock on a port, and what it dropped: counted by why (and in the metrics), the
/// first of each kind logged.
struct Gate {
    lock: Mutex<SourceLock>,
    sender: IpAddr,
    /// By `Stranger`, in `STRANGERS`' order.
    dropped: [AtomicU64; 4],
    /// With SRTP: `srtpdec`, and the packets it dropped.
    srtp: Option<SrtpFailures>,
    metrics: Arc<Metrics>,
    session: String,
}

/// `srtpdec` (its stats count the packets that failed authentication: a wrong key, plain RTP,
/// a replay), and how many of those the metrics have.
struct SrtpFailures {
    /// Weak: the element's pad probe holds the gate.
    srtpdec: glib::WeakRef<gst::Element>,
    counted: AtomicU64,
}

const STRANGERS: [Stranger; 4] = [
    Stranger::Address,
    Stranger::Port,
    Stranger::Ssrc,
    Stranger::NotRtp,
];

impl Gate {
    fn new(sender: IpAddr, session: &str, metrics: Arc<Metrics>, srtpdec: Option<&gst::Element>) -> Self {
        Self {
            lock: Mutex::new(SourceLock::new(sender)),
            sender: sender.to_canonical(),
            dropped: Default::default(),
            srtp: srtpdec.map(|srtpdec| SrtpFailures {
                srtpdec: srtpdec.downgrade(),
                counted: AtomicU64::new(0),
            }),
            metrics,
            session: session.to_owned(),
        }
    }

    /// Whether `buffer` (an RTP packet, with udpsrc's net address meta) is the sender's; with
    /// `lock`, the first that is locks the port and SSRC.
    fn admit(&self, buffer: &gst::BufferRef, lock: bool) -> bool {
        let source = source_of(buffer);
        let Ok(map) = buffer.map_readable() else {
            return false;
        };
        let mut source_lock = self.lock.lock().unwrap();
        let before = source_lock.locked();
        let verdict = if lock {
            source_lock.admit(source, &map)
        } else {
            source_lock.check(source, &map).map(drop)
        };
        let lock = source_lock;
        match verdict {
            Ok(()) => {
                if let (None, Some((port, ssrc)), Some(source)) = (before, lock.locked(), source) {
                    log!(
                        "session {}: RTP from {} port {port}, SSRC {ssrc}: the port takes this source's alone",
                        self.session,
                        source.ip()
                    );
                }
                true
            }
            Err(why) => {
                let locked = lock.locked();
                drop(lock);
                self.dropped(why, source, locked);
                false
            }
        }
    }

    /// Counts the packets that `srtpdec` dropped since the last call (its stats'
    /// `recv-drop-count`).
    fn settle_srtp(&self) {
        let Some(srtp) = &self.srtp else {
            return;
        };
        let Some(srtpdec) = srtp.srtpdec.upgrade() else {
            return;
        };
        let failed = srtpdec
            .property::<gst::Structure>("stats")
            .get::<u32>("recv-drop-count")
            .map_or(0, u64::from);
        let counted = srtp.counted.fetch_max(failed, Ordering::SeqCst);
        if failed > counted {
            self.metrics.rtp_dropped("srtp", failed - counted);
            if counted == 0 {
                log!(
                    "session {}: dropped an RTP packet that failed SRTP authentication (another key, or plain RTP)",
                    self.session
                );
            }
        }
    }

    fn dropped(&self, why: Stranger, source: Option<SocketAddr>, locked: Option<(u16, u32)>) {
        self.metrics.rtp_dropped(why.label(), 1);
        let index = STRANGERS.iter().position(|&kind| kind == why).unwrap();
        if self.dropped[index].fetch_add(1, Ordering::SeqCst) > 0 {
            return;
        }
        let session = &self.session;
        let sender = self.sender;
        let from = source.map_or_else(
            || "an unknown address".to_owned(),
            |source| source.ip().to_string(),
        );
        let port = source.map_or(0, |source| source.port());
        match (why, locked) {
            (Stranger::Address, _) => log!(
                "session {session}: dropped an RTP packet from {from}: the port takes its sender's ({sender}) alone"
            ),
            (Stranger::NotRtp, _) => {
                log!("session {session}: dropped a packet from {from} port {port} that is not RTP")
            }
            (_, Some((locked_port, ssrc))) => log!(
                "session {session}: dropped an RTP packet from {from} port {port} ({}): the port takes port {locked_port}, SSRC {ssrc} alone",
                why.label()
            ),
            (_, None) => (),
        }
    }

    /// The packets dropped, by why, once the port closes.
    fn log_dropped(&self) {
        let count = |why: Stranger| {
            let index = STRANGERS.iter().position(|&kind| kind == why).unwrap();
            self.dropped[index].load(Ordering::SeqCst)
        };
        let session = &self.session;
        let addresses = count(Stranger::Address);
        if addresses > 0 {
            log!("session {session}: {addresses} RTP packets from other addresses than its sender's dropped");
        }
        if let Some(srtp) = &self.srtp {
            let failed = srtp.counted.load(Ordering::SeqCst);
            if failed > 0 {
                log!("session {session}: {failed} RTP packets that failed SRTP authentication dropped");
            }
        }
        let (ports, ssrcs, not_rtp) = (
            count(Stranger::Port),
            count(Stranger::Ssrc),
            count(Stranger::NotRtp),
        );
        if ports + ssrcs + not_rtp > 0 {
            log!(
                "session {session}: from its sender's address, {ports} RTP packets from another port and {ssrcs} of another SSRC than the first's dropped, and {not_rtp} packets not RTP"
            );
        }
    }
}

/// Where a packet udpsrc received came from (its buffer's net address meta).
fn source_of(buffer: &gst::BufferRef) -> Option<SocketAddr> {
    let address = buffer
        .meta::<gst_net::NetAddressMeta>()?
        .addr()
        .downcast::<gio::InetSocketAddress>()
        .ok()?;
    Some(SocketAddr::new(IpAddr::from(address.address()), address.port()))
}

/// Drops what reaches `udpsrc` that is not the sender's (`gate`). With SRTP the first to pass
/// `srtpdec` locks the port (`take_authenticated`), not the first to come.
fn take_only_from(udpsrc: &gst::Element, gate: Arc<Gate>) {
    udpsrc
        .static_pad("src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            let Some(gst::PadProbeData::Buffer(buffer)) = &info.data else {
                return gst::PadProbeReturn::Ok;
            };
            if gate.admit(buffer, gate.srtp.is_none()) {
                gst::PadProbeReturn::Ok
            } else {
                gst::PadProbeReturn::Drop
            }
        });
}

/// Locks the port to the first packet that passes `srtpdec` (authenticated).
fn take_authenticated(srtpdec: &gst::Element, gate: Arc<Gate>) {
    srtpdec
        .static_pad("rtp_src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            let Some(gst::PadProbeData::Buffer(buffer)) = &info.data else {
                return gst::PadProbeReturn::Ok;
            };
            if gate.admit(buffer, true) {
                gst::PadProbeReturn::Ok
            } else {
                gst::PadProbeReturn::Drop
            }
        });
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    const START: gst::BufferFlags = gst::BufferFlags::DISCONT.union(gst::BufferFlags::RESYNC);
    const LOSS: gst::BufferFlags = gst::BufferFlags::DISCONT;
    const GOING_ON: gst::BufferFlags = gst::BufferFlags::empty();

    /// Lost frames that the depayloader counted are filled with the last frame before them
    /// when the next buffer goes on from them; not at an utterance's start, nor past
    /// MAX_CONCEALED_FRAMES, nor when the lost time is not whole frames.
    #[test]
    fn counted_lost_frames_are_filled_with_the_last_frame() {
        let format = RtpFormat {
            clock_rate: 24_000,
            codebooks: 2,
            codebook_size: 2048,
            samples_per_frame: 1920,
        };
        let frame = gst::ClockTime::from_mseconds(80);
        let mut concealment = Concealment::new(&format, frame_bytes_of(&format));
        let (a, b) = ([1u8, 0, 2, 0], [3u8, 0, 4, 0]);
        assert_eq!(
            concealment.fill(START, &[a, b].concat()),
            None,
            "nothing lost yet"
        );
        concealment.lost_time(Some(frame * 2));
        assert_eq!(
            concealment.fill(LOSS, &a),
            Some([b, b].concat()),
            "two frames of b"
        );
        concealment.lost_time(Some(frame * 2));
        assert_eq!(concealment.fill(START, &b), None, "an utterance starts fresh");
        concealment.lost_time(Some(frame * (MAX_CONCEALED_FRAMES + 1)));
        assert_eq!(concealment.fill(LOSS, &a), None, "too long a loss");
        concealment.lost_time(Some(frame));
        concealment.lost_time(Some(frame / 2));
        concealment.lost_time(Some(frame));
        assert_eq!(concealment.fill(LOSS, &b), None, "lost time not whole frames");
        concealment.lost_time(Some(frame));
        concealment.lost_time(Some(frame));
        assert_eq!(
            concealment.fill(LOSS, &a),
            Some([b, b].concat()),
            "two GAPs add up"
        );
    }

    /// A cancel holds through a loss that restarts the decoder (DISCONT alone) and ends at the
    /// next utterance's start (RESYNC), whose frames go in.
    #[test]
    fn a_cancelled_utterance_stays_cancelled_through_loss_until_the_next_starts() {
        let utterances = Utterances::default();
        assert_eq!(utterances.take(START), Take::Push { restart: true });
        assert_eq!(utterances.take(GOING_ON), Take::Push { restart: false });
        utterances.cancel();
        assert_eq!(utterances.take(GOING_ON), Take::Drop);
        assert_eq!(utterances.take(LOSS), Take::Drop);
        assert_eq!(utterances.take(GOING_ON), Take::Drop);
        assert_eq!(utterances.take(START), Take::Push { restart: true });
        assert_eq!(utterances.take(GOING_ON), Take::Push { restart: false });
    }

    /// Without a cancel, a loss the depayloader did not fill restarts the decoder, as a new
    /// utterance does.
    #[test]
    fn an_unfilled_loss_restarts_the_decoder_and_speech_goes_on() {
        let utterances = Utterances::default();
        assert_eq!(utterances.take(START), Take::Push { restart: true });
        assert_eq!(utterances.take(LOSS), Take::Push { restart: true });
        assert_eq!(utterances.take(GOING_ON), Take::Push { restart: false });
    }

    /// The released model's codes.
    const RELEASED: RtpFormat = RtpFormat {
        clock_rate: 24_000,
        codebooks: 16,
        codebook_size: 2048,
        samples_per_frame: 1920,
    };

    #[test]
    fn the_sdp_names_the_port_its_address_and_the_codes() {
        let v4: IpAddr = "198.51.100.7".parse().unwrap();
        assert_eq!(
            RELEASED.sdp(v4, 50004, None),
            "v=0\r\no=- 0 0 IN IP4 198.51.100.7\r\ns=qwencodec codes\r\nc=IN IP4 198.51.100.7\r\nt=0 0\r\n\
             m=audio 50004 RTP/AVP 96\r\na=rtpmap:96 X-QWEN3-TTS-CODES/24000\r\n\
             a=fmtp:96 version=1;codebooks=16;codebook-size=2048;samples-per-frame=1920\r\na=recvonly\r\n"
        );
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        let sdp = RELEASED.sdp(v6, 9, None);
        assert!(sdp.contains("\r\nc=IN IP6 2001:db8::7\r\n"), "{sdp}");
        assert!(sdp.contains("\r\nm=audio 9 RTP/AVP 96\r\n"), "{sdp}");
    }

    /// With SRTP the profile is RTP/SAVP and the key is RFC 4568's `a=crypto`; each key is new.
    #[test]
    fn an_srtp_sdp_names_the_suite_and_its_key() {
        let key = SrtpKey((0..30).collect());
        let v4: IpAddr = "198.51.100.7".parse().unwrap();
        let sdp = RELEASED.sdp(v4, 50004, Some(&key));
        assert!(sdp.contains("\r\nm=audio 50004 RTP/SAVP 96\r\n"), "{sdp}");
        assert!(
            sdp.contains(
                "\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd\r\n"
            ),
            "{sdp}"
        );
        let (first, second) = (SrtpKey::new().unwrap(), SrtpKey::new().unwrap());
        assert_eq!(first.0.len(), 30);
        assert_ne!(first.0, second.0);
    }

    #[test]
    fn the_caps_are_the_depayloaders_for_the_models_codes() {
        gst::init().unwrap();
        let caps = RELEASED.caps(false);
        let expected = gst::Caps::from_str(
            "application/x-rtp, media=audio, encoding-name=X-QWEN3-TTS-CODES, clock-rate=24000, \
             payload=96, version=(string)1, codebooks=(string)16, codebook-size=(string)2048, \
             samples-per-frame=(string)1920",
        )
        .unwrap();
        assert_eq!(caps, expected);
        gstqwencodec::plugin_register_static().unwrap();
        let depayloader = gst::ElementFactory::make("rtpqwencodesdepay").build().unwrap();
        assert!(depayloader.static_pad("sink").unwrap().query_accept_caps(&caps));
    }

    #[test]
    fn the_sdp_names_the_public_address_only_of_the_local_ones_family() {
        let local: IpAddr = "10.0.0.5".parse().unwrap();
        let public_v4: IpAddr = "203.0.113.9".parse().unwrap();
        let public_v6: IpAddr = "2001:db8::9".parse().unwrap();
        let sender: IpAddr = "198.51.100.2".parse().unwrap();
        let announced = |local, public| RtpAddresses::new(local, public, sender).announced;
        assert_eq!(announced(local, None), local);
        assert_eq!(announced(local, Some(public_v4)), public_v4);
        assert_eq!(announced(local, Some(public_v6)), local);
        // A dual-stack socket's IPv4 peer comes as an IPv4-mapped IPv6 address.
        let mapped: IpAddr = "::ffff:10.0.0.5".parse().unwrap();
        assert_eq!(announced(mapped, Some(public_v4)), public_v4);
        let local_v6: IpAddr = "2001:db8::5".parse().unwrap();
        assert_eq!(announced(local_v6, Some(public_v6)), public_v6);
        assert_eq!(announced(local_v6, Some(public_v4)), local_v6);
        let addresses = RtpAddresses::new(local, Some(public_v4), sender);
        assert_eq!((addresses.local, addresses.sender), (local, sender));
    }
}
