//! `make bench`: the streaming decoder against the upstream Python decoder, side by side on one
//! machine, written to `measurements/results/<cpu>/decode-<device>-<dtype>.md` (a markdown table)
//! and `.json`.
//!
//! cargo bench --bench decode -- --model DIR --upstream upstream.json --reference reference.f32
//!     [--out measurements/results] [--chunks 1,2,4,8] [--device cpu] [--dtype f32] [--alongside f32]
//!     [--repeats 5] [--steady-model DIR] [--steady-frames 20000] [--python python3]
//!     [--launch-dtypes f32,f16,bf16] [--launch-chunks 1,4]
//!
//! Both sides are measured alike: every decode runs once as a warm-up, then `--repeats` times,
//! and each row gives the best and the median of those runs. Upstream's full decode, the one
//! the goals compare with, runs in a Python process of its own (`benches/tools/bench_upstream.py
//! --serve`, started with `--python`), one decode before each round of this chunk size's runs:
//! the machine's speed drifts by 20% within minutes, so each row's ratio to upstream is taken
//! against upstream's runs of the same rounds. `upstream.json` (benches/tools/bench_upstream.py) gives
//! the errors and upstream's windowed row, timed before. "First audio" is, for every row, the
//! time from the first frame handed over to its audio when frames arrive at the talker's pace:
//! the wait for the frames of a full step (chunk-frames - 1 frame periods) plus the time from
//! handing over the frame that fills the step to its audio coming out (of `push` for the core,
//! of the pipeline's appsink for the element). At each chunk size the core's runs (in each
//! dtype) and the element's take turns, so that a drift in the machine's speed shows in all of
//! them alike.
//!
//! `--alongside DTYPE` times the core in that dtype too, its runs alternating with `--dtype`'s
//! (on a machine whose load changes, a ratio between dtypes is only fair from the same
//! moments), and reports the ratio.
//!
//! The element as a user runs it (`gst_launch.rs`): at each of `--launch-chunks`, for each of
//! `--launch-dtypes`, a `gst-launch-1.0 filesrc ! ... ! qwencodecdec ! fakesink` process per run,
//! its runs taking turns with the others of the same rounds; `--launch-dtypes ''` skips them.
//!
//! The cost of a frame late in a long stream: a stream `--steady-frames` frames in and a fresh
//! one take one-frame steps in turn, 1,000 each (alternated, so that the machine's drift, which
//! moved an end-against-start comparison by 0.65-1.48x, falls on both alike). By default those
//! streams decode the bundled release-tiny checkpoint (the released geometry at tiny widths),
//! not the released widths of `--model`: there a step costs tens of milliseconds on a few cores,
//! and 20,000 of them would take longer than the rest of the benchmark together, while at tiny
//! widths the per-step work outside the network's arithmetic (state bookkeeping, tables, copies),
//! which is what could grow with the stream, is most of a step and shows most. `--steady-model
//! DIR` runs it on another checkpoint (the released widths included), `--steady-frames 0` skips it.

use qwencodec_testing::bench as common;
mod element;
mod gst_launch;
mod report;
mod upstream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use common::{machine, mean, percentile, read_codes, relative_l2, sorted};
use element::ElementBench;
use gst_launch::{LaunchBench, LaunchFiles};
use gstqwencodec::model::{Dtype, Model, StepLimits, StreamDecoder, TailStrategy, parse_device};
use report::markdown;
use serde_json::{Value, json};
use upstream::{UpstreamFull, upstream_full_row, windowed_row};

/// Steps of the old and of the young stream whose times are compared.
const STEADY_WINDOW_STEPS: usize = 1000;

struct Args {
    model: PathBuf,
    upstream: PathBuf,
    reference: PathBuf,
    out: PathBuf,
    chunks: Vec<usize>,
    device: String,
    dtype: Dtype,
    alongside: Option<Dtype>,
    repeats: usize,
    steady_model: PathBuf,
    steady_frames: usize,
    python: String,
    launch_dtypes: Vec<Dtype>,
    launch_chunks: Vec<usize>,
}

/// The options, all of them read before any work (see `common::read_options`).
fn parse_args() -> Args {
    common::read_options(|options| {
        // The committed fixtures, where the test binaries find them (QWENCODEC_FIXTURES for a
        // bundle unpacked on another host).
        let fixtures = std::env::var_os("QWENCODEC_FIXTURES").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
            PathBuf::from,
        );
        let repeats = options.take_parsed("--repeats", 5)?;
        if repeats == 0 {
            return Err("--repeats must be at least 1".into());
        }
        Ok(Args {
            model: options.take_required("--model")?.into(),
            upstream: options.take_required("--upstream")?.into(),
            reference: options.take_required("--reference")?.into(),
            out: options
                .take("--out")?
                .map_or_else(|| "measurements/results".into(), PathBuf::from),
            chunks: options.take_list("--chunks", &[1, 2, 4, 8])?,
            device: options.take("--device")?.unwrap_or_else(|| "cpu".into()),
            dtype: options.take_parsed("--dtype", Dtype::F32)?,
            alongside: options.take_optional("--alongside")?,
            repeats,
            steady_model: options
                .take("--steady-model")?
                .map_or_else(|| fixtures.join("release-tiny"), PathBuf::from),
            steady_frames: options.take_parsed("--steady-frames", 20_000)?,
            python: options.take("--python")?.unwrap_or_else(|| "python3".into()),
            launch_dtypes: match options.take("--launch-dtypes")?.as_deref() {
                Some("") => Vec::new(),
                Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
                None => vec![Dtype::F32, Dtype::F16, Dtype::Bf16],
            },
            launch_chunks: options.take_list("--launch-chunks", &[1, 4])?,
        })
    })
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The statistic of every row: the best and the median of the timed runs.
fn best_and_median(values: &[f64]) -> Value {
    json!({"best": sorted(values)[0], "median": percentile(values, 0.5)})
}

/// One timed run of a streaming decode.
struct Run {
    seconds_per_audio_second: f64,
    first_audio_ms: f64,
    error: f64,
}

/// A row of the table from its timed runs; `steps` is what its step columns show.
fn row(method: &str, threads: Value, runs: &[Run], steps: Value) -> Value {
    let column = |f: fn(&Run) -> f64| best_and_median(&runs.iter().map(f).collect::<Vec<_>>());
    json!({
        "method": method,
        "threads": threads,
        "runs": runs.len(),
        "seconds_per_audio_second": column(|r| r.seconds_per_audio_second),
        "first_audio_ms": column(|r| r.first_audio_ms),
        "step_ms": steps,
        // Every run decodes the same codes: the worst of them.
        "relative_l2": runs.iter().map(|r| r.error).fold(0.0, f64::max),
    })
}

/// A streaming decoder of one model, timed run after run: frames handed over one at a time, as
/// from a talker; every push that completes a step is timed. With `cuda_graph`, steps replay
/// the model's CUDA graphs (recorded in the warm-up run).
struct CoreBench {
    model: Arc<Model>,
    decoder: StreamDecoder,
    chunk_frames: usize,
    cuda_graph: bool,
    runs: Vec<Run>,
    step_ms: Vec<f64>,
}

impl CoreBench {
    fn new(model: &Arc<Model>, chunk_frames: usize, cuda_graph: bool) -> Self {
        let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
        decoder.set_limits(StepLimits {
            cuda_graphs: cuda_graph,
            ..decoder.limits()
        });
        Self {
            model: model.clone(),
            decoder,
            chunk_frames,
            cuda_graph,
            runs: Vec::new(),
            step_ms: Vec::new(),
        }
    }

    /// One decode of `codes`, kept unless it is the warm-up.
    fn run(&mut self, codes: &[i16], reference: &[f32], warm_up: bool) {
        let codebooks = self.model.config().num_quantizers;
        self.decoder.reset().unwrap();
        let mut audio = Vec::with_capacity(reference.len());
        let mut run_steps = Vec::new();
        let started = Instant::now();
        for frame in codes.chunks(codebooks) {
            let handed_over = Instant::now();
            let out = self.decoder.push(frame).unwrap();
            if !out.is_empty() {
                run_steps.push(handed_over.elapsed().as_secs_f64() * 1e3);
            }
            audio.extend(out);
        }
        audio.extend(self.decoder.finish().unwrap());
        let total = started.elapsed().as_secs_f64();
        if warm_up {
            return;
        }
        let frame_period_ms = frame_period(&self.model) * 1e3;
        self.runs.push(Run {
            seconds_per_audio_second: total / (audio.len() as f64 / self.model.sample_rate() as f64),
            first_audio_ms: (self.chunk_frames - 1) as f64 * frame_period_ms + run_steps[0],
            error: relative_l2(&audio, reference),
        });
        self.step_ms.extend(run_steps);
    }

    /// The row of the timed runs; `dtype_label` names the dtype where it is not the report's.
    fn row(&self, dtype_label: &str) -> Value {
        assert!(
            !self.cuda_graph || self.decoder.graph_steps() > 0,
            "no step replayed a CUDA graph: {:?}",
            self.model.cuda_graphs().failure
        );
        let graph = if self.cuda_graph { " + CUDA graph" } else { "" };
        row(
            &format!(
                "qwencodec core{graph}{dtype_label}, chunk-frames {}",
                self.chunk_frames
            ),
            json!(tch::get_num_threads()),
            &self.runs,
            json!({"p50": percentile(&self.step_ms, 0.5), "p99": percentile(&self.step_ms, 0.99)}),
        )
    }
}

/// What every run decodes: the benchmark's codes, in memory and as files for `gst-launch-1.0`,
/// and upstream's float64 decode of them.
struct Input<'a> {
    codes: &'a [i16],
    files: &'a LaunchFiles,
    reference: &'a [f32],
}

/// The rows of one chunk size: the core for `model` (with and without CUDA graphs where the
/// device has them), for the `alongside` model (another dtype), and the element, their runs
/// taking turns with each other and with upstream's full decode so that all see the same load
/// on the machine (its speed drifts by 20% within minutes), and `gst-launch-1.0` where
/// `--launch-chunks` has this size; and the seconds of upstream's timed decodes. Each row's `vs_upstream_full` is its time over upstream's in those rounds.
fn bench_chunk(
    args: &Args,
    model: &Arc<Model>,
    alongside: Option<&Arc<Model>>,
    upstream: &mut UpstreamFull,
    input: &Input,
    chunk_frames: usize,
) -> (Vec<Value>, Vec<f64>) {
    let Input {
        codes,
        files,
        reference,
    } = *input;
    let graph_choices: &[bool] = if model.device().is_cuda() {
        &[false, true]
    } else {
        &[false]
    };
    let mut cores: Vec<CoreBench> = graph_choices
        .iter()
        .flat_map(|&cuda_graph| {
            std::iter::once(model)
                .chain(alongside)
                .map(move |model| CoreBench::new(model, chunk_frames, cuda_graph))
        })
        .collect();
    let mut element = ElementBench::default();
    let mut launches: Vec<LaunchBench> = if args.launch_chunks.contains(&chunk_frames) {
        args.launch_dtypes
            .iter()
            .map(|&dtype| LaunchBench::new(dtype))
            .collect()
    } else {
        Vec::new()
    };
    let mut upstream_seconds = Vec::new();
    // Run 0 is the warm-up.
    for run in 0..=args.repeats {
        let seconds = upstream.decode();
        if run > 0 {
            upstream_seconds.push(seconds);
        }
        for core in &mut cores {
            core.run(codes, reference, run == 0);
        }
        element.run(args, model, codes, chunk_frames, reference, run == 0);
        for launch in &mut launches {
            launch.run(args, files, model, chunk_frames, reference, run == 0);
        }
    }
    let mut rows: Vec<Value> = cores
        .iter()
        .map(|core| {
            let label = if Arc::ptr_eq(&core.model, model) {
                String::new()
            } else {
                format!(" in {} (alongside)", core.model.dtype())
            };
            core.row(&label)
        })
        .collect();
    rows.push(element.row(chunk_frames));
    rows.extend(
        launches
            .iter()
            .map(|launch| launch.row(model, chunk_frames, json!(tch::get_num_threads()))),
    );
    let audio_seconds = (codes.len() / model.config().num_quantizers) as f64 * frame_period(model);
    let upstream_speeds: Vec<f64> = upstream_seconds.iter().map(|s| s / audio_seconds).collect();
    let upstream_speed = best_and_median(&upstream_speeds);
    for row in &mut rows {
        let speed = &row["seconds_per_audio_second"];
        let ratio = |statistic: &str| {
            speed[statistic].as_f64().unwrap() / upstream_speed[statistic].as_f64().unwrap()
        };
        row["vs_upstream_full"] = json!({"best": ratio("best"), "median": ratio("median")});
    }
    (rows, upstream_seconds)
}

fn frame_period(model: &Model) -> f64 {
    let (num, den) = model.config().frame_rate();
    den as f64 / num as f64
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

/// The cost of a frame late in a long stream against early in one: an old stream, `frames`
/// frames in (reached in steps of 8, the same state as one frame a step), and a young one, fresh,
/// take one-frame steps in turn, [`STEADY_WINDOW_STEPS`] each, so that the machine's drift falls
/// on both alike.
fn steady_cost(args: &Args, frames: usize) -> Value {
    assert!(frames >= 1, "--steady-frames: at least 1, or 0 to skip");
    let device = parse_device(&args.device).unwrap();
    let model = Model::shared(&args.steady_model, device, args.dtype).unwrap();
    let codebooks = model.config().num_quantizers;
    let codes = read_codes(&args.steady_model.join("codes.raw"));
    let stream = |count: usize, skip: usize| -> Vec<i16> {
        codes
            .chunks(codebooks)
            .cycle()
            .skip(skip)
            .take(count)
            .flatten()
            .copied()
            .collect()
    };
    // On CUDA replaying graphs, as the element decodes there by default.
    let mut old = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    old.push(&stream(frames, 0)).unwrap();
    let mut young = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    let time_step = |decoder: &mut StreamDecoder, frame: &[i16]| {
        let handed_over = Instant::now();
        let audio = decoder.push(frame).unwrap();
        assert_eq!(audio.len(), model.samples_per_frame());
        handed_over.elapsed().as_secs_f64() * 1e3
    };
    let (old_codes, young_codes) = (
        stream(STEADY_WINDOW_STEPS, frames),
        stream(STEADY_WINDOW_STEPS, 0),
    );
    let (mut old_ms, mut young_ms) = (Vec::new(), Vec::new());
    for (old_frame, young_frame) in old_codes.chunks(codebooks).zip(young_codes.chunks(codebooks)) {
        old_ms.push(time_step(&mut old, old_frame));
        young_ms.push(time_step(&mut young, young_frame));
    }
    let window = STEADY_WINDOW_STEPS;
    let summary = |steps: &[f64]| json!({"p50": percentile(steps, 0.5), "mean": mean(steps), "p99": percentile(steps, 0.99)});
    let (first, last) = (&young_ms[..], &old_ms[..]);
    let config = model.config();
    let name = args.steady_model.file_name().unwrap().to_string_lossy();
    json!({
        "model": name,
        "geometry": format!(
            "{name}: {} layers, sliding window {}, hidden size {}, decoder width {}, {} samples per frame",
            config.num_hidden_layers,
            config.sliding_window,
            config.hidden_size,
            config.decoder_dim,
            model.samples_per_frame()
        ),
        "frames": frames,
        "steps_compared": window,
        "first": summary(first),
        "last": summary(last),
        "last_over_first_p50": percentile(last, 0.5) / percentile(first, 0.5),
        "last_over_first_mean": mean(last) / mean(first),
    })
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
    assert_eq!(
        upstream["repeats"].as_u64(),
        Some(args.repeats as u64),
        "{} was timed with another --repeats: both sides are to be measured alike",
        args.upstream.display()
    );

    // First, while the allocator has no freed memory to hand out again, which would hide growth.
    let rss_frames = 8;
    let rss = rss_per_100_streams(&model, &codes, rss_frames);

    let alongside = args
        .alongside
        .map(|dtype| Model::shared(&args.model, device, dtype).unwrap());
    let launch_files = LaunchFiles::write(
        &codes,
        config.num_quantizers,
        Path::new("measurements/cache/launch"),
    );
    let mut upstream_full = UpstreamFull::start(&args);
    let mut rows = Vec::new();
    let mut upstream_seconds = Vec::new();
    for &chunk_frames in &args.chunks {
        let (chunk_rows, seconds) = bench_chunk(
            &args,
            &model,
            alongside.as_ref(),
            &mut upstream_full,
            &Input {
                codes: &codes,
                files: &launch_files,
                reference: &reference,
            },
            chunk_frames,
        );
        for r in chunk_rows {
            eprintln!("{r}");
            rows.push(r);
        }
        upstream_seconds.extend(seconds);
    }
    drop(upstream_full);
    rows.insert(0, upstream_full_row(&upstream, &upstream_seconds, &model, frames));
    rows.insert(1, windowed_row(&upstream));

    let mut settled = StreamDecoder::new(model.clone(), 8, TailStrategy::Eager).unwrap();
    let window_frames = (config.sliding_window / 8 + 1) * 8;
    settled
        .push(&codes[..window_frames.min(frames) * config.num_quantizers])
        .unwrap();
    let state_bytes = settled.state_bytes();
    drop(settled);

    let steady = if args.steady_frames > 0 {
        let steady = steady_cost(&args, args.steady_frames);
        eprintln!("{steady}");
        steady
    } else {
        Value::Null
    };

    let date = common::date();
    let machine = machine();
    let report = json!({
        "date": date,
        "machine": machine,
        "device": args.device,
        "dtype": args.dtype.to_string(),
        "alongside": args.alongside.map(|dtype| dtype.to_string()),
        "frames": frames,
        "audio_seconds": frames as f64 * frame_period(&model),
        "repeats": args.repeats,
        "rows": rows,
        "state_bytes": state_bytes,
        "rss_per_100_streams": rss,
        "rss_streams_frames": rss_frames,
        "steady": steady,
    });
    let table = markdown(&report);
    common::write_result(
        &args.out,
        &format!("decode-{}-{}", args.device, args.dtype),
        &report,
        &table,
    );
    println!("{table}");
}
