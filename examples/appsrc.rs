//! Feeds `qwencodecdec` from an application, as a TTS server does: the talker's codec frames go
//! into an `appsrc` a few at a time, live and timestamped, and the decoder pushes each buffer's
//! audio as soon as it is decoded. Reports the wall-clock latency from a buffer of frames pushed
//! to its audio leaving the decoder, for the first buffer (the time to first audio) and for all.
//!
//! ```text
//! cargo run --release --example appsrc -- [--model DIR] [--codes FILE] [--frames-per-push N]
//!     [--sink auto|fake|wav:OUT.wav] [--device auto|cpu|cuda]
//! ```
//!
//! Defaults: the bundled test checkpoint and its codes, 4 frames per push, `autoaudiosink`.
//! `fake` is a synchronised `fakesink` (paced like a sound card, silent); `wav:` writes a file.

mod common;

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Codes, ms};
use gst::prelude::*;
use qwencodec_common::Options;

/// When each buffer was pushed, and how long its audio took to come out.
#[derive(Default)]
struct Latencies {
    pushed: BTreeMap<gst::ClockTime, Instant>,
    measured: Vec<Duration>,
}

fn main() -> ExitCode {
    common::exit_status("appsrc", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut options = Options::from_env();
    let (model, codes_path) = common::take_model_and_codes(&mut options)?;
    let frames_per_push: usize = options.take_parsed("--frames-per-push", 4)?;
    let sink = options.take("--sink")?.unwrap_or_else(|| "auto".into());
    let device = options.take("--device")?.unwrap_or_else(|| "auto".into());
    options.finish()?;

    gst::init()?;
    gstqwencodec::plugin_register_static()?;
    let codes = Codes::load(&codes_path, &model)?;

    let sink_description = match sink.as_str() {
        "auto" => "audioconvert ! audioresample ! autoaudiosink".to_string(),
        "fake" => "fakesink sync=true".to_string(),
        other => match other.strip_prefix("wav:") {
            Some(path) => format!(
                "audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location=\"{}\"",
                path.replace('"', "\\\"")
            ),
            None => return Err(format!("--sink {other}: expected auto, fake or wav:FILE").into()),
        },
    };
    let pipeline = gst::Pipeline::new();
    let appsrc = codes.appsrc();
    let decoder = gst::ElementFactory::make("qwencodecdec")
        .property("model-path", model.to_str().ok_or("the model path is not UTF-8")?)
        .property("device", &device)
        .build()?;
    let sink = gst::parse::bin_from_description(&sink_description, true)?;
    pipeline.add_many([appsrc.upcast_ref(), &decoder, sink.upcast_ref()])?;
    gst::Element::link_many([appsrc.upcast_ref(), &decoder, sink.upcast_ref()])?;

    // Each output buffer of the decoder carries the timestamp of the first input buffer it
    // decodes, so the timestamp finds the push it answers.
    let latencies = Arc::new(Mutex::new(Latencies::default()));
    decoder
        .static_pad("src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, {
            let latencies = latencies.clone();
            move |_, info| {
                let out = Instant::now();
                if let Some(pts) = info.buffer().and_then(|buffer| buffer.pts()) {
                    let mut latencies = latencies.lock().unwrap();
                    if let Some(&pushed) = latencies.pushed.get(&pts) {
                        latencies.measured.push(out - pushed);
                    }
                }
                gst::PadProbeReturn::Ok
            }
        });

    // The model loads here (READY to PAUSED), before the call returns; a live pipeline then
    // goes on to PLAYING without waiting for the sink to preroll.
    let bus = pipeline.bus().unwrap();
    let pipeline = common::StopOnDrop(pipeline);
    if pipeline.set_state(gst::State::Playing).is_err() {
        return Err(error_on(&bus).unwrap_or_else(|| "the pipeline does not start".into()));
    }

    let pushing = Instant::now();
    let pushed = codes.push_live(&appsrc, frames_per_push, |pts, at| {
        latencies.lock().unwrap().pushed.insert(pts, at);
    });
    let result = match pushed {
        Ok(()) => wait_for_eos(&bus, codes.duration() + gst::ClockTime::from_seconds(30)),
        Err(flow) => {
            Err(error_on(&bus).unwrap_or_else(|| format!("pushing the codes failed: {flow:?}").into()))
        }
    };
    let stats = decoder.property::<gst::Structure>("stats");
    pipeline.set_state(gst::State::Null)?;
    result?;

    let latencies = latencies.lock().unwrap();
    let Some(first) = latencies.measured.first() else {
        return Err("no audio came out of the decoder".into());
    };
    let mean = latencies.measured.iter().sum::<Duration>() / latencies.measured.len() as u32;
    let worst = latencies.measured.iter().max().unwrap();
    println!(
        "pushed {} frames ({:.2} s of speech) in {} buffers of up to {} frames, live, in {:.2} s",
        codes.frames(),
        codes.duration().seconds_f64(),
        latencies.pushed.len(),
        frames_per_push,
        pushing.elapsed().as_secs_f64()
    );
    println!(
        "first audio after {:.1} ms (from the first frame pushed to its audio leaving qwencodecdec)",
        ms(*first)
    );
    println!(
        "push to audio, per buffer: mean {:.1} ms, max {:.1} ms over {} buffers",
        ms(mean),
        ms(*worst),
        latencies.measured.len()
    );
    println!(
        "decoder: {} samples out, mean step {:.2} ms, real-time factor {:.3}",
        stats.get::<u64>("samples-out")?,
        stats.get::<f64>("mean-step-ms")?,
        stats.get::<f64>("real-time-factor")?
    );
    Ok(())
}

fn wait_for_eos(bus: &gst::Bus, timeout: gst::ClockTime) -> Result<(), Box<dyn Error>> {
    let message = bus
        .timed_pop_filtered(timeout, &[gst::MessageType::Eos, gst::MessageType::Error])
        .ok_or_else(|| format!("no end of stream within {timeout}"))?;
    match message.view() {
        gst::MessageView::Error(err) => Err(describe(err).into()),
        _ => Ok(()),
    }
}

/// The first error posted on the bus, if any.
fn error_on(bus: &gst::Bus) -> Option<Box<dyn Error>> {
    let message = bus.pop_filtered(&[gst::MessageType::Error])?;
    match message.view() {
        gst::MessageView::Error(err) => Some(describe(err).into()),
        _ => None,
    }
}

fn describe(err: &gst::message::Error) -> String {
    format!(
        "{} (from {})",
        err.error(),
        err.src()
            .map(|src| src.path_string().to_string())
            .unwrap_or_default()
    )
}
