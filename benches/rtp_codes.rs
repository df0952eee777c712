//! Codes over RTP (not a test: it asserts nothing): what a stream costs on the wire, and what a
//! lost packet costs the audio. Written to `measurements/results/<cpu>/rtp-codes.{md,json}`.
//!
//! cargo bench --bench rtp_codes -- --model DIR [--out measurements/results] [--runs 5]
//!
//! - **Bitrate**: the codes of `DIR/codes.raw` through `rtpqwencodespay` at 1, 2 and 4 frames a
//!   packet, and their decoded audio through `opusenc audio-type=voice ! rtpopuspay` as the
//!   WebRTC example and the media server send it; every packet counted with its RTP, UDP and
//!   IPv4 headers (12 + 8 + 20 bytes).
//! - **Loss**: packets of one frame dropped before `rtpqwencodesdepay` (1 %, 5 %, 10 % at random,
//!   `--runs` seeds each, and one burst of 5), decoded by `qwencodecdec`, the audio placed on the
//!   timeline by its timestamps (silence where none came, as a sink plays it), against the
//!   lossless decode: relative L2 error, for each of the decoder's two ways with the
//!   depayloader's GAP of the lost frames: **restart** (`plc=false`: the decoder starts fresh
//!   at the next packet) and **repeat** (`plc=true`: the lost frames replaced by copies of the
//!   last frame received, the decoder's state carried on).

use qwencodec_testing::bench as common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::{machine, relative_l2};
use gst::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// RTP, UDP and IPv4 headers of a packet.
const HEADER_BYTES: usize = 12 + 8 + 20;

struct Args {
    model: PathBuf,
    out: PathBuf,
    runs: u64,
}

/// The codes of a checkpoint folder's `codes.raw` and its codebook count.
fn codes_of(model: &std::path::Path) -> (Vec<i16>, usize) {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let decoder = &config["decoder_config"];
    let codebooks = decoder["num_quantizers"].as_u64().expect("num_quantizers") as usize;
    (common::read_codes(&model.join("codes.raw")), codebooks)
}

/// Says of each packet (its index, the buffer) whether it arrives.
type Arrives = Box<dyn Fn(usize, &gst::BufferRef) -> bool + Send + Sync>;

/// Runs `description` (its source fed `codes` through a codes caps filter and a parser, its
/// sink an appsink named `sink`) to EOS; calls `packet` on every buffer reaching the element
/// named `watch` (if any), dropping those it says to drop; returns the sink's buffers.
fn run(
    description: &str,
    codes: &[i16],
    codebooks: usize,
    watch: Option<(&str, Arrives)>,
) -> Vec<gst::Buffer> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = codes.iter().flat_map(|c| c.to_le_bytes()).collect();
    std::fs::write(file.path(), bytes).unwrap();
    let pipeline = gst::parse::launch(&format!(
        "filesrc location={} ! audio/x-qwen3-tts-codes,codebooks={codebooks},framerate=25/2 ! \
         qwencodecparse ! {description} ! appsink name=sink sync=false",
        file.path().display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    if let Some((name, decide)) = watch {
        let count = Mutex::new(0usize);
        pipeline
            .by_name(name)
            .unwrap()
            .static_pad("sink")
            .unwrap()
            .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
                let Some(buffer) = info.buffer() else {
                    return gst::PadProbeReturn::Ok;
                };
                let mut count = count.lock().unwrap();
                *count += 1;
                if decide(*count - 1, buffer) {
                    gst::PadProbeReturn::Ok
                } else {
                    // Consumed here (gstreamer-rs drops it); Drop would leave GStreamer to
                    // unref it again.
                    gst::PadProbeReturn::Handled
                }
            });
    }
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    let buffers = Arc::new(Mutex::new(Vec::new()));
    let collected = buffers.clone();
    sink.set_callbacks(
        gst_app::AppSinkCallbacks::builder()
            .new_sample(move |sink| {
                let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                collected.lock().unwrap().push(sample.buffer_owned().unwrap());
                Ok(gst::FlowSuccess::Ok)
            })
            .build(),
    );
    pipeline.set_state(gst::State::Playing).unwrap();
    let bus = pipeline.bus().unwrap();
    for message in bus.iter_timed(gst::ClockTime::NONE) {
        match message.view() {
            gst::MessageView::Eos(_) => break,
            gst::MessageView::Error(err) => panic!("{description}: {} ({:?})", err.error(), err.debug()),
            _ => (),
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
    std::mem::take(&mut *buffers.lock().unwrap())
}

/// Bits per second on the wire of the packets in `buffers` (RTP packets, headers added) over
/// `seconds` of audio.
fn bitrate(packets: &[gst::Buffer], seconds: f64) -> (f64, f64) {
    let bytes: usize = packets.iter().map(|p| p.size() - 12 + HEADER_BYTES).sum();
    let payload: usize = packets.iter().map(|p| p.size() - 12).sum();
    (bytes as f64 * 8.0 / seconds, payload as f64 * 8.0 / seconds)
}

/// The decoder's audio laid on a timeline of `samples` samples by the buffers' timestamps:
/// silence where no audio came.
fn timeline(buffers: &[gst::Buffer], samples: usize, rate: u64) -> Vec<f32> {
    let mut audio = vec![0f32; samples];
    for buffer in buffers {
        let start = (buffer.pts().unwrap().nseconds() * rate).div_ceil(1_000_000_000) as usize;
        let map = buffer.map_readable().unwrap();
        for (i, pair) in map.chunks_exact(4).enumerate() {
            if let Some(sample) = audio.get_mut(start + i) {
                *sample = f32::from_le_bytes(pair.try_into().unwrap());
            }
        }
    }
    audio
}

fn main() {
    let args = common::read_options(|o| {
        Ok(Args {
            model: o.take_required("--model")?.into(),
            out: o.take_parsed("--out", PathBuf::from("measurements/results"))?,
            runs: o.take_parsed("--runs", 5)?,
        })
    });
    gst::init().unwrap();
    gstqwencodec::plugin_register_static().unwrap();
    let (codes, codebooks) = codes_of(&args.model);
    let frames = codes.len() / codebooks;
    let seconds = frames as f64 * 0.08;
    let machine = machine();
    let decoder_with = |plc: bool| {
        format!(
            "qwencodecdec model-path={} device=cpu plc={plc} ! audio/x-raw,format=F32LE",
            args.model.display()
        )
    };
    let decoder = decoder_with(false);

    // Bitrate.
    let mut rates = Vec::new();
    for frames_per_packet in [1, 2, 4] {
        let packets = run(
            &format!("rtpqwencodespay frames-per-packet={frames_per_packet}"),
            &codes,
            codebooks,
            None,
        );
        let (wire, payload) = bitrate(&packets, seconds);
        rates.push(
            json!({"what": format!("codes, {frames_per_packet} frame(s) a packet"),
            "packet_ms": 80 * frames_per_packet, "wire_bps": wire, "payload_bps": payload}),
        );
    }
    let opus = run(
        &format!("{decoder} ! audioconvert ! audioresample ! opusenc audio-type=voice ! rtpopuspay pt=96"),
        &codes,
        codebooks,
        None,
    );
    let (wire, payload) = bitrate(&opus, seconds);
    rates.push(
        json!({"what": "Opus (opusenc audio-type=voice, its default bitrate), 20 ms a packet",
        "packet_ms": 20, "wire_bps": wire, "payload_bps": payload}),
    );

    // Loss.
    let lossless = run(
        &format!("rtpqwencodespay ! rtpqwencodesdepay name=depay ! {decoder}"),
        &codes,
        codebooks,
        None,
    );
    let rate = 24_000u64;
    let samples = frames * (rate as usize * 2 / 25);
    let reference = timeline(&lossless, samples, rate);
    let patterns: Vec<(String, Vec<Vec<bool>>)> = {
        let random = |p: f64| -> Vec<Vec<bool>> {
            (0..args.runs)
                .map(|seed| {
                    let mut rng = StdRng::seed_from_u64(seed);
                    // The first packet always arrives: a receiver starts with one.
                    (0..frames).map(|i| i == 0 || rng.random::<f64>() >= p).collect()
                })
                .collect()
        };
        let burst: Vec<bool> = (0..frames)
            .map(|i| !(frames / 2..frames / 2 + 5).contains(&i))
            .collect();
        vec![
            ("1 % at random".into(), random(0.01)),
            ("5 % at random".into(), random(0.05)),
            ("10 % at random".into(), random(0.10)),
            ("a burst of 5 packets".into(), vec![burst]),
        ]
    };
    let mut losses = Vec::new();
    for (what, runs) in &patterns {
        let (mut restart, mut repeat, mut lost) = (Vec::new(), Vec::new(), Vec::new());
        for arrived in runs {
            let arrived = Arc::new(arrived.clone());
            for (plc, errors) in [(false, &mut restart), (true, &mut repeat)] {
                let keep = arrived.clone();
                let decoded = run(
                    &format!(
                        "rtpqwencodespay ! rtpqwencodesdepay name=depay ! {}",
                        decoder_with(plc)
                    ),
                    &codes,
                    codebooks,
                    Some(("depay", Box::new(move |index, _| keep[index]))),
                );
                errors.push(relative_l2(&timeline(&decoded, samples, rate), &reference));
            }
            lost.push(arrived.iter().filter(|&&came| !came).count() as f64 / frames as f64);
        }
        let median = |values: &[f64]| common::percentile(values, 0.5);
        losses.push(
            json!({"what": what, "runs": runs.len(), "lost_share": median(&lost),
            "restart_median": median(&restart), "restart_max": common::sorted(&restart).last(),
            "repeat_median": median(&repeat), "repeat_max": common::sorted(&repeat).last()}),
        );
    }

    let date = common::date();
    let report = json!({"date": date, "machine": machine, "model": args.model.display().to_string(), "frames": frames,
        "bitrate": rates, "loss": losses});
    let mut md = format!(
        "# Codes over RTP: bitrate and loss\n\n{date}, {} ({} cores), code {}, checkpoint `{}` ({} frames, {:.1} s), \
         `cargo bench --bench rtp_codes`.\n\n## Bitrate per stream\n\nEvery packet with its RTP, UDP and IPv4 \
         headers (40 bytes).\n\n| stream | packet | on the wire, kbit/s | payload, kbit/s |\n| --- | ---: | ---: | ---: |\n",
        machine["cpu"].as_str().unwrap(),
        machine["cores"],
        common::code(&machine),
        args.model.display(),
        frames,
        seconds
    );
    for r in &rates {
        md += &format!(
            "| {} | {} ms | {:.1} | {:.1} |\n",
            r["what"].as_str().unwrap(),
            r["packet_ms"],
            r["wire_bps"].as_f64().unwrap() / 1e3,
            r["payload_bps"].as_f64().unwrap() / 1e3
        );
    }
    md += "\n## Loss\n\nOne frame a packet. Relative L2 error of the audio against the lossless decode, \
           silence where no audio came; median (max) over the runs.\n\n| loss | runs | packets lost | restart (`plc=false`) | repeat (`plc=true`) |\n| --- | ---: | ---: | ---: | ---: |\n";
    for l in &losses {
        md += &format!(
            "| {} | {} | {:.1} % | {:.3} ({:.3}) | {:.3} ({:.3}) |\n",
            l["what"].as_str().unwrap(),
            l["runs"],
            l["lost_share"].as_f64().unwrap() * 100.0,
            l["restart_median"].as_f64().unwrap(),
            l["restart_max"].as_f64().unwrap(),
            l["repeat_median"].as_f64().unwrap(),
            l["repeat_max"].as_f64().unwrap()
        );
    }
    common::write_result(&args.out, "rtp-codes", &report, &md);
    print!("{md}");
}
