//! Speech over WebRTC: two `webrtcbin` peers in one process, the first sending what
//! `qwencodecdec` decodes, the second receiving it. Signalling is in memory: the SDP offer and
//! answer and the ICE candidates go from one peer to the other through their signals, where a
//! real application would carry them over its signalling channel.
//!
//! ```text
//! sender:   appsrc (codes, live) ! qwencodecdec ! audioconvert ! audioresample ! opusenc
//!             ! rtpopuspay ! webrtcbin
//! receiver: webrtcbin ! rtpopusdepay ! opusdec ! audioconvert ! audioresample ! appsink
//!
//! cargo run --release --example webrtc -- [--model DIR] [--codes FILE] [--timeout SECONDS]
//!     [--device auto|cpu|cuda]
//! ```
//!
//! Once the peers are connected, the codes are pushed in real time, a few frames at a time, as a
//! TTS model hands them over. Exits 0 once all the speech sent has arrived (and is not
//! silence), 1 when it has not after the timeout (default 30 s).
//!
//! Both peers are in this process, so ICE is held to the loopback interface (with no STUN or
//! TURN server and no UPnP): nothing leaves the machine.

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Codes, ms};
use gst::glib;
use gst::prelude::*;
use qwencodec_common::Options;
use qwencodec_common::webrtc::{loopback_webrtcbin, opus_rtp_caps};

/// Rate of the audio counted at the receiver.
const RECEIVED_RATE: u32 = 48_000;
/// Below this RMS the received audio counts as silence.
const SILENCE_RMS: f64 = 1e-3;
/// Once all the audio sent has arrived, how long nothing more must come before the count ends:
/// more than the receiver's jitter buffer holds packets (200 ms).
const QUIET: Duration = Duration::from_millis(400);

/// What the receiving peer got so far.
#[derive(Default)]
struct Received {
    samples: u64,
    sum_of_squares: f64,
    first_at: Option<Instant>,
}

impl Received {
    fn seconds(&self) -> f64 {
        self.samples as f64 / RECEIVED_RATE as f64
    }

    fn rms(&self) -> f64 {
        (self.sum_of_squares / self.samples.max(1) as f64).sqrt()
    }
}

fn main() -> ExitCode {
    common::exit_status("webrtc", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut options = Options::from_env();
    let (model, codes_path) = common::take_model_and_codes(&mut options)?;
    let timeout = Duration::from_secs(options.take_parsed("--timeout", 30)?);
    let device = options.take("--device")?.unwrap_or_else(|| "auto".into());
    options.finish()?;
    let deadline = Instant::now() + timeout;

    gst::init()?;
    gstqwencodec::plugin_register_static()?;
    let codes = Codes::load(&codes_path, &model)?;

    let pipeline = gst::Pipeline::new();
    let appsrc = codes.appsrc();
    let decoder = gst::ElementFactory::make("qwencodecdec")
        .property("model-path", model.to_str().ok_or("the model path is not UTF-8")?)
        .property("device", &device)
        .build()?;
    let rtp_caps = opus_rtp_caps();
    let send_chain = [
        appsrc.upcast_ref(),
        &decoder,
        &gst::ElementFactory::make("audioconvert").build()?,
        &gst::ElementFactory::make("audioresample").build()?,
        &gst::ElementFactory::make("opusenc")
            .property_from_str("audio-type", "voice")
            .build()?,
        &gst::ElementFactory::make("rtpopuspay")
            .property("pt", 96u32)
            .build()?,
        &gst::ElementFactory::make("capsfilter")
            .property("caps", &rtp_caps)
            .build()?,
    ];
    let sender = loopback_webrtcbin("sender")?;
    let receiver = loopback_webrtcbin("receiver")?;
    pipeline.add_many(send_chain)?;
    pipeline.add_many([&sender, &receiver])?;
    gst::Element::link_many(send_chain)?;
    let sender_pad = sender
        .request_pad_simple("sink_%u")
        .ok_or("webrtcbin gives no sink pad")?;
    send_chain
        .last()
        .unwrap()
        .static_pad("src")
        .unwrap()
        .link(&sender_pad)?;
    // No caps reach webrtcbin before the codes start, which waits for the connection: the
    // transceiver's codec preferences say what will be sent, so that negotiation can start.
    sender_pad
        .property::<glib::Object>("transceiver")
        .set_property("codec-preferences", &rtp_caps);

    // The receiver only receives, Opus as the sender sends it.
    let recvonly =
        glib::EnumClass::with_type(glib::Type::from_name("GstWebRTCRTPTransceiverDirection").unwrap())
            .unwrap()
            .to_value_by_nick("recvonly")
            .unwrap();
    receiver.emit_by_name::<glib::Object>("add-transceiver", &[&recvonly, &rtp_caps]);
    connect_signalling(&sender, &receiver);
    let received = Arc::new(Mutex::new(Received::default()));
    receiver.connect_pad_added({
        let pipeline = pipeline.downgrade();
        let received = received.clone();
        move |_, pad| {
            if let Some(pipeline) = pipeline.upgrade()
                && let Err(err) = decode_incoming(&pipeline, pad, received.clone())
            {
                eprintln!("webrtc: cannot decode what arrives: {err}");
            }
        }
    });
    let (connected_tx, connected_rx) = mpsc::channel();
    sender.connect_notify(Some("connection-state"), move |sender, _| {
        let state = sender.property_value("connection-state");
        if let Some((_, value)) = glib::EnumValue::from_value(&state) {
            let _ = connected_tx.send(value.nick().to_string());
        }
    });

    // The model loads here (READY to PAUSED); negotiation starts once the peers are PLAYING.
    let bus = pipeline.bus().unwrap();
    let pipeline = common::StopOnDrop(pipeline);
    let starting = Instant::now();
    if pipeline.set_state(gst::State::Playing).is_err() {
        return Err(error_on(&bus).unwrap_or_else(|| "the pipeline does not start".into()));
    }
    loop {
        match connected_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(state) if state == "connected" => break,
            Ok(state) if state == "failed" => return Err("the peers failed to connect".into()),
            _ => (),
        }
        if let Some(err) = error_on(&bus) {
            return Err(err);
        }
        if Instant::now() >= deadline {
            return Err(format!("the peers did not connect within {timeout:?}").into());
        }
    }
    let connected_after = starting.elapsed();

    let mut first_push = None;
    let pushed = codes.push_live(&appsrc, 4, |_, at| {
        first_push.get_or_insert(at);
    });
    if let Err(flow) = pushed {
        return Err(error_on(&bus).unwrap_or_else(|| format!("pushing the codes failed: {flow:?}").into()));
    }

    // RTP has no end of stream: wait until all of the speech sent has come out at the receiver
    // (Opus works in 20 ms frames, so the last one may be partly filled) and nothing more comes.
    let sent = codes.duration().seconds_f64();
    let mut last_count = (0, Instant::now());
    let arrived = loop {
        let samples = received.lock().unwrap().samples;
        if samples != last_count.0 {
            last_count = (samples, Instant::now());
        }
        let complete = samples as f64 / RECEIVED_RATE as f64 >= sent - 0.02;
        if complete && last_count.1.elapsed() >= QUIET {
            break true;
        }
        if let Some(err) = error_on(&bus) {
            return Err(err);
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    pipeline.set_state(gst::State::Null)?;

    let received = received.lock().unwrap();
    let first_audio = received
        .first_at
        .zip(first_push)
        .map(|(received, pushed)| format!("{:.1} ms", ms(received - pushed)))
        .unwrap_or_else(|| "never".into());
    println!(
        "connected {:.1} ms after the start (the model load included)",
        ms(connected_after)
    );
    println!("first audio at the receiver {first_audio} after the first frame was pushed");
    println!(
        "received {:.3} s of audio of {:.3} s sent, RMS {:.4}",
        received.seconds(),
        sent,
        received.rms()
    );
    if !arrived {
        return Err(format!("not all of the speech arrived within {timeout:?}").into());
    }
    if received.rms() < SILENCE_RMS {
        return Err("what arrived is silence".into());
    }
    Ok(())
}

/// The in-memory signalling: the sender offers, the receiver answers, and each peer's ICE
/// candidates go to the other.
fn connect_signalling(sender: &gst::Element, receiver: &gst::Element) {
    sender.connect("on-negotiation-needed", false, {
        let receiver = receiver.downgrade();
        move |values| {
            let sender = values[0].get::<gst::Element>().unwrap();
            if let Some(receiver) = receiver.upgrade() {
                offer(&sender, &receiver);
            }
            None
        }
    });
    for (from, to) in [(sender, receiver), (receiver, sender)] {
        let to = to.downgrade();
        from.connect("on-ice-candidate", false, move |values| {
            let mline_index = values[1].get::<u32>().unwrap();
            let candidate = values[2].get::<String>().unwrap();
            if let Some(to) = to.upgrade() {
                to.emit_by_name::<()>("add-ice-candidate", &[&mline_index, &candidate]);
            }
            None
        });
    }
}

/// Offer from the sender, answer from the receiver. The descriptions stay
/// `GstWebRTCSessionDescription` values throughout: nothing here needs to read them.
fn offer(sender: &gst::Element, receiver: &gst::Element) {
    let (sender_weak, receiver_weak) = (sender.downgrade(), receiver.downgrade());
    let promise = gst::Promise::with_change_func(move |reply| {
        let (Some(sender), Some(receiver)) = (sender_weak.upgrade(), receiver_weak.upgrade()) else {
            return;
        };
        let Some(offer) = description(reply, "offer") else {
            return;
        };
        sender.emit_by_name::<()>("set-local-description", &[&offer, &None::<gst::Promise>]);
        receiver.emit_by_name::<()>("set-remote-description", &[&offer, &None::<gst::Promise>]);

        let receiver_weak = receiver.downgrade();
        let promise = gst::Promise::with_change_func(move |reply| {
            let Some(receiver) = receiver_weak.upgrade() else {
                return;
            };
            if let Some(answer) = description(reply, "answer") {
                receiver.emit_by_name::<()>("set-local-description", &[&answer, &None::<gst::Promise>]);
                sender.emit_by_name::<()>("set-remote-description", &[&answer, &None::<gst::Promise>]);
            }
        });
        receiver.emit_by_name::<()>("create-answer", &[&None::<gst::Structure>, &promise]);
    });
    sender.emit_by_name::<()>("create-offer", &[&None::<gst::Structure>, &promise]);
}

/// The `offer` or `answer` of a `create-offer` / `create-answer` reply.
fn description(
    reply: Result<Option<&gst::StructureRef>, gst::PromiseError>,
    kind: &str,
) -> Option<glib::SendValue> {
    match reply {
        Ok(Some(reply)) => match reply.value(kind) {
            Ok(value) => Some(value.clone()),
            Err(_) => {
                eprintln!("webrtc: creating the {kind} failed: {reply}");
                None
            }
        },
        other => {
            eprintln!("webrtc: creating the {kind} failed: {other:?}");
            None
        }
    }
}

/// Links what the receiving peer outputs to a decoder whose audio is counted.
fn decode_incoming(
    pipeline: &gst::Pipeline,
    pad: &gst::Pad,
    received: Arc<Mutex<Received>>,
) -> Result<(), Box<dyn Error>> {
    if pad.direction() != gst::PadDirection::Src {
        return Ok(());
    }
    let decode = gst::parse::bin_from_description(
        &format!(
            "rtpopusdepay ! opusdec ! audioconvert ! audioresample \
             ! audio/x-raw,format=F32LE,channels=1,rate={RECEIVED_RATE} ! appsink name=audio sync=false"
        ),
        true,
    )?;
    let appsink = decode
        .by_name("audio")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    appsink.set_callbacks(
        gst_app::AppSinkCallbacks::builder()
            .new_sample(move |appsink| {
                let sample = appsink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                let map = sample
                    .buffer()
                    .ok_or(gst::FlowError::Error)?
                    .map_readable()
                    .map_err(|_| gst::FlowError::Error)?;
                let mut received = received.lock().unwrap();
                received.first_at.get_or_insert_with(Instant::now);
                for bytes in map.chunks_exact(4) {
                    let sample = f32::from_le_bytes(bytes.try_into().unwrap()) as f64;
                    received.sum_of_squares += sample * sample;
                    received.samples += 1;
                }
                Ok(gst::FlowSuccess::Ok)
            })
            .build(),
    );
    pipeline.add(&decode)?;
    decode.sync_state_with_parent()?;
    pad.link(&decode.static_pad("sink").unwrap())?;
    Ok(())
}

/// The first error posted on the bus, if any.
fn error_on(bus: &gst::Bus) -> Option<Box<dyn Error>> {
    let message = bus.pop_filtered(&[gst::MessageType::Error])?;
    match message.view() {
        gst::MessageView::Error(err) => Some(
            format!(
                "{} (from {})",
                err.error(),
                err.src()
                    .map(|src| src.path_string().to_string())
                    .unwrap_or_default()
            )
            .into(),
        ),
        _ => None,
    }
}
