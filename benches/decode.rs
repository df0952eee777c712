//! `make bench`: the streaming decoder against the upstream Python decoder, side by side on one
//! machine, written to `bench/results/` as a markdown table and JSON.
//!
//! cargo bench --bench decode -- --model DIR --upstream upstream.json --reference reference.f32
//!     [--out bench/results] [--chunks 1,2,4,8] [--streams 1,2,4,8] [--device cpu] [--dtype f32]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use gst::prelude::*;
use gstqwencodec::model::{Dtype, Model, StreamDecoder, TailStrategy, parse_device};
use serde_json::{Value, json};

struct Args {
    model: PathBuf,
    upstream: PathBuf,
    reference: PathBuf,
    out: PathBuf,
    chunks: Vec<usize>,
    streams: Vec<usize>,
    device: String,
    dtype: Dtype,
}

fn parse_args() -> Args {
    let mut values = BTreeMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(name) = args.next() {
        if let Some(name) = name.strip_prefix("--") {
            if name == "bench" {
                continue; // cargo bench passes --bench to harness-less benches
            }
            values.insert(
                name.to_owned(),
                args.next().unwrap_or_else(|| panic!("--{name} needs a value")),
            );
        }
    }
    let list = |name: &str, default: &str| -> Vec<usize> {
        values
            .get(name)
            .map_or(default, String::as_str)
            .split(',')
            .map(|n| n.parse().unwrap())
            .collect()
    };
    let path = |name: &str| PathBuf::from(values.get(name).unwrap_or_else(|| panic!("--{name} is required")));
    Args {
        model: path("model"),
        upstream: path("upstream"),
        reference: path("reference"),
        out: values
            .get("out")
            .map_or_else(|| PathBuf::from("bench/results"), PathBuf::from),
        chunks: list("chunks", "1,2,4,8"),
        streams: list("streams", "1,2,4,8"),
        device: values.get("device").cloned().unwrap_or_else(|| "cpu".into()),
        dtype: values.get("dtype").map_or(Dtype::F32, |d| d.parse().unwrap()),
    }
}

fn read_codes(path: &Path) -> Vec<i16> {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect()
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn relative_l2(actual: &[f32], expected: &[f32]) -> f64 {
    assert_eq!(actual.len(), expected.len());
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &e) in actual.iter().zip(expected) {
        diff += (a as f64 - e as f64).powi(2);
        norm += (e as f64).powi(2);
    }
    (diff / norm).sqrt()
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    let index = ((sorted_ms.len() - 1) as f64 * p).round() as usize;
    sorted_ms[index]
}

/// One method's row of the table.
fn row(
    name: &str,
    seconds_per_audio_second: f64,
    mut step_ms: Vec<f64>,
    first_audio_ms: f64,
    error: f64,
) -> Value {
    step_ms.sort_by(f64::total_cmp);
    json!({
        "method": name,
        "seconds_per_audio_second": seconds_per_audio_second,
        "step_ms_p50": percentile(&step_ms, 0.5),
        "step_ms_p99": percentile(&step_ms, 0.99),
        "first_audio_ms": first_audio_ms,
        "relative_l2": error,
    })
}

/// Frames arrive one at a time, as from a talker; every push that completes a step is timed.
/// With `cuda_graph`, full steps replay a graph captured before the first frame.
fn bench_core(
    model: &Arc<Model>,
    codes: &[i16],
    chunk_frames: usize,
    cuda_graph: bool,
    reference: &[f32],
    frame_period: f64,
) -> Value {
    let codebooks = model.config().num_quantizers;
    let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
    if cuda_graph {
        decoder.capture_cuda_graph().unwrap();
    }
    decoder.push(&codes[..chunk_frames * codebooks]).unwrap(); // warm-up
    decoder.reset().unwrap();

    let mut audio = Vec::with_capacity(reference.len());
    let mut step_ms = Vec::new();
    let started = Instant::now();
    for frame in codes.chunks(codebooks) {
        let pushed = Instant::now();
        let out = decoder.push(frame).unwrap();
        if !out.is_empty() {
            step_ms.push(pushed.elapsed().as_secs_f64() * 1e3);
        }
        audio.extend(out);
    }
    audio.extend(decoder.finish().unwrap());
    let total = started.elapsed().as_secs_f64();
    let audio_seconds = audio.len() as f64 / model.sample_rate() as f64;
    let first_audio_ms = (chunk_frames - 1) as f64 * frame_period * 1e3 + step_ms[0];
    let graph = if cuda_graph { " + CUDA graph" } else { "" };
    row(
        &format!("qwencodec core{graph}, chunk-frames {chunk_frames}"),
        total / audio_seconds,
        step_ms,
        first_audio_ms,
        relative_l2(&audio, reference),
    )
}

/// The element in a pipeline, fed one frame per buffer as fast as it takes them.
fn bench_element(args: &Args, model: &Model, codes: &[i16], chunk_frames: usize, reference: &[f32]) -> Value {
    let config = model.config();
    let (num, den) = config.frame_rate();
    let caps = gst::Caps::builder("audio/x-qwen3-tts-codes")
        .field("codebooks", config.num_quantizers as i32)
        .field("framerate", gst::Fraction::new(num as i32, den as i32))
        .build();
    let pipeline = gst::Pipeline::new();
    let src = gst_app::AppSrc::builder()
        .caps(&caps)
        .format(gst::Format::Time)
        .build();
    let decoder = gst::ElementFactory::make("qwencodecdec")
        .property("model-path", args.model.to_str().unwrap())
        .property("device", &args.device)
        .property("chunk-frames", chunk_frames as u32)
        .build()
        .unwrap();
    decoder.set_property_from_str("dtype", &args.dtype.to_string());
    let sink = gst_app::AppSink::builder().sync(false).build();
    pipeline
        .add_many([src.upcast_ref(), &decoder, sink.upcast_ref()])
        .unwrap();
    gst::Element::link_many([src.upcast_ref(), &decoder, sink.upcast_ref()]).unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();

    let started = Instant::now();
    let mut first_audio = None;
    let feeder = {
        let (src, codes, codebooks) = (src.clone(), codes.to_vec(), config.num_quantizers);
        std::thread::spawn(move || {
            for frame in codes.chunks(codebooks) {
                let bytes: Vec<u8> = frame.iter().flat_map(|c| c.to_le_bytes()).collect();
                src.push_buffer(gst::Buffer::from_slice(bytes)).unwrap();
            }
            src.end_of_stream().unwrap();
        })
    };
    let mut audio = Vec::with_capacity(reference.len());
    while let Ok(sample) = sink.pull_sample() {
        first_audio.get_or_insert_with(|| started.elapsed());
        let map = sample.buffer().unwrap().map_readable().unwrap();
        audio.extend(
            map.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap())),
        );
    }
    let total = started.elapsed().as_secs_f64();
    feeder.join().unwrap();
    let stats = decoder.property::<gst::Structure>("stats");
    pipeline.set_state(gst::State::Null).unwrap();

    let audio_seconds = audio.len() as f64 / model.sample_rate() as f64;
    let mean = stats.get::<f64>("mean-step-ms").unwrap();
    let max = stats.get::<f64>("max-step-ms").unwrap();
    let graph = if stats.get::<bool>("cuda-graph").unwrap() {
        " + CUDA graph"
    } else {
        ""
    };
    json!({
        "method": format!("qwencodecdec in a pipeline{graph}, chunk-frames {chunk_frames}"),
        "seconds_per_audio_second": total / audio_seconds,
        "step_ms_p50": Value::Null,
        "step_ms_mean": mean,
        "step_ms_max": max,
        // Frames were pushed at once, so this is compute and pipeline overhead only.
        "first_audio_ms": first_audio.unwrap_or_default().as_secs_f64() * 1e3,
        "relative_l2": relative_l2(&audio, reference),
    })
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Resident memory added by 100 open streams, each having decoded `frames` frames.
fn rss_per_100_streams(model: &Arc<Model>, codes: &[i16], frames: usize) -> u64 {
    let codebooks = model.config().num_quantizers;
    let before = rss_bytes();
    let streams: Vec<_> = (0..100)
        .map(|_| {
            let mut decoder = StreamDecoder::new(model.clone(), frames, TailStrategy::Eager).unwrap();
            decoder.push(&codes[..frames * codebooks]).unwrap();
            decoder
        })
        .collect();
    let after = rss_bytes();
    drop(streams);
    after.saturating_sub(before)
}

/// Streams decoding the whole utterance at once on separate threads: audio seconds per second.
fn throughput(model: &Arc<Model>, codes: &[i16], streams: usize, chunk_frames: usize) -> f64 {
    let started = Instant::now();
    let workers: Vec<_> = (0..streams)
        .map(|_| {
            let (model, codes) = (model.clone(), codes.to_vec());
            std::thread::spawn(move || {
                let codebooks = model.config().num_quantizers;
                let mut decoder = StreamDecoder::new(model, chunk_frames, TailStrategy::Eager).unwrap();
                let mut samples = 0;
                for frame in codes.chunks(codebooks) {
                    samples += decoder.push(frame).unwrap().len();
                }
                samples + decoder.finish().unwrap().len()
            })
        })
        .collect();
    let samples: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    samples as f64 / model.sample_rate() as f64 / started.elapsed().as_secs_f64()
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "torch_threads": tch::get_num_threads(),
        "cuda": tch::Cuda::is_available(),
    })
}

fn fmt(value: &Value, digits: usize) -> String {
    value
        .as_f64()
        .map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

fn markdown(report: &Value) -> String {
    let mut md = String::new();
    let m = &report["machine"];
    md += &format!(
        "# qwencodec benchmark, {}\n\nMachine: {}, {} cores, {} torch threads; device {}, dtype {}; {} frames \
         ({:.2} s of audio) of the released geometry with random weights.\n\n",
        report["date"].as_str().unwrap(),
        m["cpu"].as_str().unwrap(),
        m["cores"],
        m["torch_threads"],
        report["device"].as_str().unwrap(),
        report["dtype"].as_str().unwrap(),
        report["frames"],
        report["audio_seconds"].as_f64().unwrap(),
    );
    md += "| method | s per audio s | vs upstream full | step p50 ms | step p99 ms | first audio ms | rel. L2 vs float64 |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    let full = report["rows"][0]["seconds_per_audio_second"].as_f64().unwrap();
    for r in report["rows"].as_array().unwrap() {
        let ratio = r["seconds_per_audio_second"].as_f64().unwrap() / full;
        let (p50, p99) = if r["step_ms_p50"].is_null() {
            (
                format!("mean {}", fmt(&r["step_ms_mean"], 1)),
                format!("max {}", fmt(&r["step_ms_max"], 1)),
            )
        } else {
            (fmt(&r["step_ms_p50"], 1), fmt(&r["step_ms_p99"], 1))
        };
        md += &format!(
            "| {} | {} | {:.2}x | {} | {} | {} | {:.2e} |\n",
            r["method"].as_str().unwrap(),
            fmt(&r["seconds_per_audio_second"], 3),
            ratio,
            p50,
            p99,
            fmt(&r["first_audio_ms"], 1),
            r["relative_l2"].as_f64().unwrap(),
        );
    }
    md += &format!(
        "\nState per stream (window full): {:.2} MiB. Process RSS growth per 100 open streams (each after \
         {} frames): {:.1} MiB. Weights are loaded once per process.\n\n",
        report["state_bytes"].as_f64().unwrap() / 1048576.0,
        report["rss_streams_frames"],
        report["rss_per_100_streams"].as_f64().unwrap() / 1048576.0,
    );
    md += "| concurrent streams (chunk-frames 4) | aggregate audio s per s |\n| ---: | ---: |\n";
    for t in report["throughput"].as_array().unwrap() {
        md += &format!(
            "| {} | {} |\n",
            t["streams"],
            fmt(&t["audio_seconds_per_second"], 2)
        );
    }
    md
}

fn main() {
    let args = parse_args();
    gst::init().unwrap();
    gstqwencodec::plugin_register_static().unwrap();
    let device = parse_device(&args.device).unwrap();
    let model = Model::shared(&args.model, device, args.dtype).unwrap();
    let codes = read_codes(&args.model.join("codes.raw"));
    let reference = read_f32(&args.reference);
    let upstream: Value = serde_json::from_str(&std::fs::read_to_string(&args.upstream).unwrap()).unwrap();
    let config = model.config();
    let frames = codes.len() / config.num_quantizers;
    let (num, den) = config.frame_rate();
    let frame_period = den as f64 / num as f64;

    // First, while the allocator has no freed memory to hand out again, which would hide growth.
    let rss_frames = 8;
    let rss = rss_per_100_streams(&model, &codes, rss_frames);

    let mut rows = Vec::new();
    for (key, name) in [
        ("full", "upstream PyTorch, full sequence"),
        ("windowed", "upstream PyTorch, windowed (8 + 25 context)"),
    ] {
        let u = &upstream[key];
        let steps: Vec<f64> = u["step_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        rows.push(row(
            name,
            u["seconds_per_audio_second"].as_f64().unwrap(),
            steps,
            u["first_audio_ms"].as_f64().unwrap(),
            u["relative_l2"].as_f64().unwrap(),
        ));
    }
    let graph_choices: &[bool] = if device.is_cuda() {
        &[false, true]
    } else {
        &[false]
    };
    for &chunk_frames in &args.chunks {
        for &cuda_graph in graph_choices {
            let r = bench_core(&model, &codes, chunk_frames, cuda_graph, &reference, frame_period);
            eprintln!("{}", r);
            rows.push(r);
        }
    }
    for &chunk_frames in &args.chunks {
        let r = bench_element(&args, &model, &codes, chunk_frames, &reference);
        eprintln!("{}", r);
        rows.push(r);
    }

    let mut settled = StreamDecoder::new(model.clone(), 8, TailStrategy::Eager).unwrap();
    let window_frames = (config.sliding_window / 8 + 1) * 8;
    settled
        .push(&codes[..window_frames.min(frames) * config.num_quantizers])
        .unwrap();
    let state_bytes = settled.state_bytes();
    drop(settled);

    let throughput: Vec<Value> = args
        .streams
        .iter()
        .map(|&n| {
            let t = throughput(&model, &codes, n, 4);
            eprintln!("{n} streams: {t:.2} audio s per s");
            json!({"streams": n, "audio_seconds_per_second": t})
        })
        .collect();

    let date = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .unwrap();
    let date = String::from_utf8_lossy(&date.stdout).trim().to_owned();
    let report = json!({
        "date": date,
        "machine": machine(),
        "device": args.device,
        "dtype": args.dtype.to_string(),
        "frames": frames,
        "audio_seconds": frames as f64 * frame_period,
        "upstream_threads": upstream["threads"],
        "rows": rows,
        "state_bytes": state_bytes,
        "rss_per_100_streams": rss,
        "rss_streams_frames": rss_frames,
        "throughput": throughput,
    });
    std::fs::create_dir_all(&args.out).unwrap();
    let stem = format!("{date}-{}-{}", args.device.replace(':', ""), args.dtype);
    std::fs::write(
        args.out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&report).unwrap(),
    )
    .unwrap();
    let table = markdown(&report);
    std::fs::write(args.out.join(format!("{stem}.md")), &table).unwrap();
    println!("{table}");
}
