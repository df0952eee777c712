//! `make bench`, many streams on one model: batched steps against batching off, side by side in
//! one run (not a test: it asserts nothing), written to
//! `measurements/results/<cpu>/streams-<device>-<dtype>.{md,json}`.
//!
//! cargo bench --bench streams -- --model DIR [--out measurements/results] [--streams 1,2,4,8,16]
//!     [--step-frames 1] [--frames 40] [--bulk 1,2,4,8,16] [--bulk-frames 40] [--first-audio 8,16]
//!     [--probes 10] [--live 1,2,3,4] [--live-seconds 10] [--live-spacing-ms 300] [--live-runs 2]
//!     [--max-batch 16] [--max-step-frames 8] [--off-up-to N] [--unheld-up-to N] [--device cpu]
//!     [--dtype f32]
//!
//! - **Throughput**: N streams whose frames are all there from the start, each pushed a step at
//!   a time as fast as the decoder takes them (steps of a fixed size, by default one frame, so
//!   that only batching across streams differs between the two modes): aggregate audio seconds
//!   per second, the step time each stream sees (per step size and N: the cost of a batch of N
//!   rows of that many frames, as gpu-check.sh tabulates for the GPU's graph buckets), and the
//!   first audio of the last stream to get one.
//! - **Bulk**: N streams whose frames all come in one push each (a file's backlog): steps ramp up
//!   to max-step-frames; aggregate audio seconds per second against one stream's, the better of
//!   two alternated runs.
//! - **First audio into load**: N streams decoding backlogs; new streams start one by one and
//!   hand over a frame: the time from their start to their first audio, p50/p95/max.
//! - **Live**: streams that each push 12.5 frames a second in real time, started 300 ms apart
//!   (`--live-spacing-ms`),
//!   each decoded as the element decodes: one step at a time, taking the frames that fell due
//!   while the last step ran (as many as the next step takes: `frames_for_next_step`). Per
//!   frame: the time from when it fell due to its audio. The largest N whose p95 stays under
//!   400 ms, and whose compute needed (below) is at most 1, in every run (`--live-runs`, each
//!   reported), is the number of live streams served (f16, 6 streams: p95 302 ms over 10 s
//!   needing 1.06, 2.7 s over 60 s). Where the
//!   time went: the share of the run the model spent computing batches, a frame's cost in them,
//!   and the compute the streams' frames need at that cost (past 1, no schedule serves them: the
//!   machine is too slow). Batched live streams run twice: their steps held as the element holds
//!   them behind a live source (for the model's other live streams, `set_batch_hold`), and not
//!   held (from 2 streams up to `--unheld-up-to`).
//!
//! Each throughput and bulk measurement runs twice, the two modes alternating, and the better run
//! counts: the speed of these shared machines drifts by 15% and more within minutes. Live
//! streams must be served in every run, not the better. Batching off is measured up
//! to `--off-up-to` streams (beyond, on a GPU, it would take minutes to fall behind).
//!
//! Batching off: one frame per step, steps taking turns (`max_batch` 1, `max_step_frames` 1).
//! Batched: `--max-batch` and `--max-step-frames` (by default the element's defaults). On CUDA
//! both replay the model's graphs.

use qwencodec_testing::bench as common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{machine, percentile, read_codes};
use gstqwencodec::model::{Dtype, Model, StepLimits, StreamDecoder, TailStrategy, parse_device};
use serde_json::{Value, json};

const LIVE_P95_LIMIT_MS: f64 = 400.0;

struct Args {
    model: PathBuf,
    out: PathBuf,
    streams: Vec<usize>,
    step_frames: Vec<usize>,
    frames: usize,
    live: Vec<usize>,
    live_seconds: f64,
    live_spacing: Duration,
    /// Runs of each live row, modes taking turns; every one reported, and N served only if
    /// served in every run.
    live_runs: usize,
    bulk: Vec<usize>,
    bulk_frames: usize,
    first_audio: Vec<usize>,
    probes: usize,
    max_batch: usize,
    max_step_frames: usize,
    off_up_to: usize,
    /// Live streams are also run not held up to this many (`--unheld-up-to`).
    unheld_up_to: usize,
    device: String,
    dtype: Dtype,
}

/// The options, all of them read before any work (see `common::read_options`).
fn parse_args() -> Args {
    common::read_options(|options| {
        Ok(Args {
            model: options.take_required("--model")?.into(),
            out: options
                .take("--out")?
                .map_or_else(|| "measurements/results".into(), PathBuf::from),
            streams: options.take_list("--streams", &[1, 2, 4, 8, 16])?,
            step_frames: options.take_list("--step-frames", &[1])?,
            frames: options.take_parsed("--frames", 40)?,
            live: options.take_list("--live", &[1, 2, 3, 4])?,
            live_seconds: options.take_parsed("--live-seconds", 10.0)?,
            live_spacing: Duration::from_millis(options.take_parsed("--live-spacing-ms", 300)?),
            live_runs: options.take_parsed("--live-runs", 2)?,
            bulk: options.take_list("--bulk", &[1, 2, 4, 8, 16])?,
            bulk_frames: options.take_parsed("--bulk-frames", 40)?,
            first_audio: options.take_list("--first-audio", &[8, 16])?,
            probes: options.take_parsed("--probes", 10)?,
            max_batch: options.take_parsed("--max-batch", StepLimits::default().max_batch)?,
            max_step_frames: options
                .take_parsed("--max-step-frames", StepLimits::default().max_step_frames)?,
            off_up_to: options.take_parsed("--off-up-to", usize::MAX)?,
            unheld_up_to: options.take_parsed("--unheld-up-to", usize::MAX)?,
            device: options.take("--device")?.unwrap_or_else(|| "cpu".into()),
            dtype: options.take_parsed("--dtype", Dtype::F32)?,
        })
    })
}

#[derive(Clone, Copy)]
enum Mode {
    /// Up to this many rows and this many frames a step; live streams' steps held as the
    /// element holds them behind a live source.
    Batched(usize, usize),
    /// The same, live streams' steps never held: what holding them buys.
    NotHeld(usize, usize),
    Off,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Batched(..) => "batched",
            Mode::NotHeld(..) => "batched, not held",
            Mode::Off => "batching off",
        }
    }

    fn limits(self) -> StepLimits {
        match self {
            Mode::Batched(max_batch, max_step_frames) | Mode::NotHeld(max_batch, max_step_frames) => {
                StepLimits {
                    max_batch,
                    max_step_frames,
                    ..StepLimits::default()
                }
            }
            Mode::Off => StepLimits {
                max_batch: 1,
                max_step_frames: 1,
                ..StepLimits::default()
            },
        }
    }
}

/// Stream `index`'s `frames` frames: its own stretch of the checkpoint's codes, over and over.
fn stream_codes(codes: &[i16], codebooks: usize, index: usize, frames: usize) -> Vec<i16> {
    codes
        .chunks(codebooks)
        .cycle()
        .skip(index * 7)
        .take(frames)
        .flatten()
        .copied()
        .collect()
}

fn new_decoder(model: &Arc<Model>, chunk_frames: usize, limits: StepLimits) -> StreamDecoder {
    let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
    decoder.set_limits(limits);
    decoder
}

/// `decode` on a thread per stream, each with its own decoder (chunk-frames `chunk_frames`) and
/// its own `frames` frames of codes, made before all are released together: their results, in
/// order, and the seconds from the release until the last one ended.
fn decode_together<T: Send + 'static>(
    model: &Arc<Model>,
    codes: &[i16],
    streams: usize,
    frames: usize,
    chunk_frames: usize,
    limits: StepLimits,
    decode: impl Fn(&Model, StreamDecoder, Vec<i16>) -> T + Send + Copy + 'static,
) -> (Vec<T>, f64) {
    let codebooks = model.config().num_quantizers;
    let barrier = Arc::new(Barrier::new(streams + 1));
    let workers: Vec<_> = (0..streams)
        .map(|index| {
            let (model, barrier) = (model.clone(), barrier.clone());
            let codes = stream_codes(codes, codebooks, index, frames);
            std::thread::spawn(move || {
                let decoder = new_decoder(&model, chunk_frames, limits);
                barrier.wait();
                decode(&model, decoder, codes)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let results = workers.into_iter().map(|w| w.join().unwrap()).collect();
    (results, started.elapsed().as_secs_f64())
}

/// N streams decoding `frames` frames each (rounded up to whole steps) in steps of
/// `step_frames`, all started together.
fn throughput(
    model: &Arc<Model>,
    codes: &[i16],
    streams: usize,
    step_frames: usize,
    frames: usize,
    mode: Mode,
) -> Value {
    let codebooks = model.config().num_quantizers;
    let frames = frames.div_ceil(step_frames) * step_frames;
    let limits = StepLimits {
        max_step_frames: step_frames,
        ..mode.limits()
    };
    let (results, elapsed) = decode_together(
        model,
        codes,
        streams,
        frames,
        step_frames,
        limits,
        move |model, mut decoder, codes| {
            let started = Instant::now();
            let mut first_audio = None;
            let mut step_ms = Vec::with_capacity(frames);
            for step in codes.chunks(codebooks * step_frames) {
                let handed_over = Instant::now();
                let audio = decoder.push(step).unwrap();
                step_ms.push(handed_over.elapsed().as_secs_f64() * 1e3);
                first_audio.get_or_insert_with(|| started.elapsed());
                assert_eq!(audio.len(), step_frames * model.samples_per_frame());
            }
            let (rows, _) = decoder.batch_rows();
            (
                step_ms,
                first_audio.unwrap(),
                rows as f64 / decoder.steps() as f64,
            )
        },
    );
    let audio_seconds = (streams * frames * model.samples_per_frame()) as f64 / model.sample_rate() as f64;
    let step_ms: Vec<f64> = results
        .iter()
        .flat_map(|(steps, _, _)| steps.iter().copied())
        .collect();
    let last_first_audio = results.iter().map(|(_, first, _)| *first).max().unwrap();
    let mean_rows = results.iter().map(|(_, _, mean)| mean).sum::<f64>() / streams as f64;
    json!({
        "mode": mode.name(),
        "streams": streams,
        "step_frames": step_frames,
        "audio_seconds_per_second": audio_seconds / elapsed,
        "step_ms_p50": percentile(&step_ms, 0.5),
        "step_ms_p99": percentile(&step_ms, 0.99),
        "last_first_audio_ms": last_first_audio.as_secs_f64() * 1e3,
        "mean_batch_rows": mean_rows,
    })
}

/// N streams whose `frames` frames each come in one push, all started together: each decodes
/// its backlog in steps that ramp up to max-step-frames, as a file's frames are.
fn bulk(model: &Arc<Model>, codes: &[i16], streams: usize, frames: usize, limits: StepLimits) -> Value {
    let (rows, elapsed) = decode_together(
        model,
        codes,
        streams,
        frames,
        1,
        limits,
        move |model, mut decoder, codes| {
            let audio = decoder.push(&codes).unwrap();
            assert_eq!(audio.len(), frames * model.samples_per_frame());
            let (rows, _) = decoder.batch_rows();
            rows as f64 / decoder.steps() as f64
        },
    );
    let mean_rows = rows.iter().sum::<f64>() / streams as f64;
    let audio_seconds = (streams * frames * model.samples_per_frame()) as f64 / model.sample_rate() as f64;
    json!({
        "streams": streams,
        "frames": frames,
        "audio_seconds_per_second": audio_seconds / elapsed,
        "mean_batch_rows": mean_rows,
    })
}

/// The first audio of streams that start while `load` streams decode backlogs: `probes` new
/// streams, 300 ms apart, each handing over one frame; from the stream's start (its decoder
/// made, as an element makes it when its stream starts) to its audio.
fn first_audio_into_load(
    model: &Arc<Model>,
    codes: &[i16],
    load: usize,
    probes: usize,
    limits: StepLimits,
) -> Value {
    let codebooks = model.config().num_quantizers;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..load)
        .map(|index| {
            let (model, stop) = (model.clone(), stop.clone());
            let codes = stream_codes(codes, codebooks, index, 8);
            std::thread::spawn(move || {
                let mut decoder = new_decoder(&model, 1, limits);
                while !stop.load(Ordering::Relaxed) {
                    decoder.push(&codes).unwrap();
                }
            })
        })
        .collect();
    // The load's streams past their first steps, batching.
    std::thread::sleep(Duration::from_secs(2));
    let mut first_audio_ms = Vec::with_capacity(probes);
    for probe in 0..probes {
        let frame = stream_codes(codes, codebooks, load + probe, 1);
        let started = Instant::now();
        let mut decoder = new_decoder(model, 1, limits);
        decoder.push(&frame).unwrap();
        first_audio_ms.push(started.elapsed().as_secs_f64() * 1e3);
        drop(decoder);
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    json!({
        "load_streams": load,
        "probes": probes,
        "first_audio_ms_p50": percentile(&first_audio_ms, 0.5),
        "first_audio_ms_p95": percentile(&first_audio_ms, 0.95),
        "first_audio_ms_max": percentile(&first_audio_ms, 1.0),
    })
}

/// The model's batches, added up as they run, by (rows, frames a row): how many, their time in
/// ns (one observer for the whole benchmark: a model keeps its observers).
type Shapes = BTreeMap<(usize, usize), (u64, u64)>;

#[derive(Default)]
struct ComputeTotals {
    shapes: Mutex<Shapes>,
}

impl ComputeTotals {
    fn observe(model: &Model) -> Arc<Self> {
        let totals = Arc::new(Self::default());
        let observed = totals.clone();
        model.observe_batches(move |run| {
            let mut shapes = observed.shapes.lock().unwrap();
            let shape = shapes.entry((run.rows, run.frames)).or_default();
            shape.0 += 1;
            shape.1 += run.time.as_nanos() as u64;
        });
        totals
    }

    /// So far.
    fn now(&self) -> Shapes {
        self.shapes.lock().unwrap().clone()
    }

    /// The batches of each shape since `before` (an earlier [`Self::now`]).
    fn since(&self, before: &Shapes) -> Shapes {
        self.now()
            .into_iter()
            .map(|(shape, (count, ns))| {
                let (count_before, ns_before) = before.get(&shape).copied().unwrap_or_default();
                (shape, (count - count_before, ns - ns_before))
            })
            .filter(|&(_, (count, _))| count > 0)
            .collect()
    }
}

/// (busy ns, batches, frame-rows) of `shapes`.
fn compute_of(shapes: &Shapes) -> [u64; 3] {
    shapes.iter().fold(
        [0; 3],
        |[busy_ns, batches, frame_rows], (&(rows, frames), &(count, ns))| {
            [
                busy_ns + ns,
                batches + count,
                frame_rows + (rows * frames) as u64 * count,
            ]
        },
    )
}

/// `shapes`, the most common first: rows, frames, how many, ms each on average.
fn shapes_json(shapes: &Shapes) -> Value {
    let mut shapes: Vec<_> = shapes.iter().collect();
    shapes.sort_by_key(|&(_, &(count, _))| std::cmp::Reverse(count));
    shapes
        .into_iter()
        .map(|(&(rows, frames), &(count, ns))| {
            json!({"rows": rows, "frames": frames, "batches": count, "ms": ns as f64 / 1e6 / count as f64})
        })
        .collect()
}

/// N live streams, each `seconds` long, started `spacing` apart. Where the time went: the share
/// of the run's wall time that the model computed batches, and what a frame cost in them.
fn live(
    model: &Arc<Model>,
    totals: &ComputeTotals,
    codes: &[i16],
    streams: usize,
    seconds: f64,
    spacing: Duration,
    mode: Mode,
) -> Value {
    let codebooks = model.config().num_quantizers;
    let (num, den) = model.config().frame_rate();
    let period = Duration::from_secs_f64(den as f64 / num as f64);
    let frames = (seconds / period.as_secs_f64()).round() as usize;
    let limits = mode.limits();
    let hold = match mode {
        Mode::Batched(max_batch, _) => element_hold(model, streams, max_batch),
        _ => Duration::ZERO,
    };
    let before = totals.now();
    let start = Instant::now() + Duration::from_millis(50);
    let workers: Vec<_> = (0..streams)
        .map(|index| {
            let model = model.clone();
            let codes = stream_codes(codes, codebooks, index, frames);
            let begins = start + spacing * index as u32;
            std::thread::spawn(move || {
                let mut decoder = new_decoder(&model, 1, limits);
                decoder.set_batch_hold(hold);
                let due = |frame: usize| begins + period * frame as u32;
                let mut latencies_ms = Vec::with_capacity(frames);
                // Frames handed over and decoded so far.
                let (mut pushed, mut decoded) = (0, 0);
                while decoded < frames {
                    let now = Instant::now();
                    let arrived = (pushed..frames).find(|&f| due(f) > now).unwrap_or(frames);
                    // The next step takes what has arrived, as far as it goes.
                    let Some(take) = decoder.frames_for_next_step(arrived - pushed) else {
                        std::thread::sleep(due(arrived).saturating_duration_since(now));
                        continue;
                    };
                    let audio = decoder
                        .push(&codes[pushed * codebooks..(pushed + take) * codebooks])
                        .unwrap();
                    pushed += take;
                    let out = Instant::now();
                    let done = audio.len() / model.samples_per_frame();
                    latencies_ms
                        .extend((decoded..decoded + done).map(|f| (out - due(f)).as_secs_f64() * 1e3));
                    decoded += done;
                }
                (latencies_ms, decoder.batch_rows().1)
            })
        })
        .collect();
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let wall = start.elapsed();
    let shapes = totals.since(&before);
    let [busy_ns, batches, frame_rows] = compute_of(&shapes);
    let latencies: Vec<f64> = results.iter().flat_map(|(l, _)| l.iter().copied()).collect();
    let max_rows = results.iter().map(|(_, most)| *most).max().unwrap();
    json!({
        "mode": mode.name(),
        "streams": streams,
        "hold_ms": hold.as_secs_f64() * 1e3,
        "latency_ms_p50": percentile(&latencies, 0.5),
        "latency_ms_p95": percentile(&latencies, 0.95),
        "latency_ms_p99": percentile(&latencies, 0.99),
        "max_batch_rows": max_rows,
        "compute_busy": busy_ns as f64 / wall.as_nanos() as f64,
        "ms_per_frame_row": busy_ns as f64 / 1e6 / frame_rows.max(1) as f64,
        "mean_batch_frame_rows": frame_rows as f64 / batches.max(1) as f64,
        // The share of a second's compute that the streams' frames need at that cost.
        "compute_needed": streams as f64 * num as f64 / den as f64 * busy_ns as f64 / 1e9 / frame_rows.max(1) as f64,
        "batch_shapes": shapes_json(&shapes),
    })
}

/// The hold the element gives a live stream's steps with `streams` open on the model: one of
/// the two steps its minimum latency counts of a batch of the open streams rounded up to a
/// power of two (`qwencodecdec`'s latency.rs).
fn element_hold(model: &Model, streams: usize, max_batch: usize) -> Duration {
    if streams == 1 {
        return Duration::ZERO;
    }
    let limits = StepLimits {
        max_batch,
        ..StepLimits::default()
    };
    model
        .warm_step_time(limits.latency_batch_rows(streams), 1, true)
        .unwrap()
}

/// Each mode run twice, alternating (batched, off, batched, off); per mode, the run with the
/// higher `score`.
fn best_of_two(
    modes: &[Mode],
    mut run: impl FnMut(Mode) -> Value,
    score: impl Fn(&Value) -> f64,
) -> Vec<Value> {
    let first: Vec<Value> = modes.iter().map(|&mode| run(mode)).collect();
    let second: Vec<Value> = modes.iter().map(|&mode| run(mode)).collect();
    first
        .into_iter()
        .zip(second)
        .map(|(x, y)| if score(&y) > score(&x) { y } else { x })
        .collect()
}

/// The modes measured for `streams` streams.
fn modes(args: &Args, streams: usize) -> Vec<Mode> {
    let mut modes = vec![Mode::Batched(args.max_batch, args.max_step_frames)];
    if streams <= args.off_up_to {
        modes.push(Mode::Off);
    }
    modes
}

fn markdown(report: &Value) -> String {
    let m = &report["machine"];
    let mut md = format!(
        "# qwencodec benchmark, many streams, {}\n\nCPU: {} ({}), {} cores, {} torch threads; code {}; \
         device {}, dtype {}; {} of the released geometry with random weights. Batched: max-batch {}, max-step-frames {}; \
         off: max-batch 1, max-step-frames 1.{}\n\n",
        report["date"].as_str().unwrap(),
        m["cpu"].as_str().unwrap(),
        common::flags(m),
        m["cores"],
        m["torch_threads"],
        common::code(m),
        report["device"].as_str().unwrap(),
        report["dtype"].as_str().unwrap(),
        report["model"].as_str().unwrap(),
        report["max_batch"],
        report["max_step_frames"],
        match report["cuda_graphs"]["graphs"].as_u64() {
            Some(graphs) => format!(
                " CUDA graphs recorded by the model: {graphs}, {:.0} MiB{}.",
                report["cuda_graphs"]["bytes"].as_f64().unwrap() / 1048576.0,
                report["cuda_graphs"]["failure"]
                    .as_str()
                    .map_or(String::new(), |why| format!(" (a capture failed: {why})"))
            ),
            None => String::new(),
        }
    );
    md += &format!(
        "## Throughput: N streams, {} frames each, all there from the start, in steps of a fixed size\n\n\
         | streams | step frames | mode | audio s per s | vs 1 stream | step p50 ms | step p99 ms | first audio of \
         the last stream ms | mean batch rows |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        report["frames"]
    );
    let rows = report["throughput"].as_array().unwrap();
    for row in rows {
        let single = rows
            .iter()
            .find(|r| r["streams"] == 1 && r["mode"] == row["mode"] && r["step_frames"] == row["step_frames"])
            .map_or(f64::NAN, |r| r["audio_seconds_per_second"].as_f64().unwrap());
        let rate = row["audio_seconds_per_second"].as_f64().unwrap();
        md += &format!(
            "| {} | {} | {} | {:.2} | {:.2}x | {:.1} | {:.1} | {:.0} | {:.2} |\n",
            row["streams"],
            row["step_frames"],
            row["mode"].as_str().unwrap(),
            rate,
            rate / single,
            row["step_ms_p50"].as_f64().unwrap(),
            row["step_ms_p99"].as_f64().unwrap(),
            row["last_first_audio_ms"].as_f64().unwrap(),
            row["mean_batch_rows"].as_f64().unwrap(),
        );
    }
    md += &format!(
        "\n## Bulk: N streams, {} frames each in one push (steps ramp up to max-step-frames), all started together\n\n\
         | streams | audio s per s | vs 1 stream | mean batch rows |\n| ---: | ---: | ---: | ---: |\n",
        report["bulk_frames"]
    );
    let bulk_rows = report["bulk"].as_array().unwrap();
    let single = bulk_rows
        .iter()
        .find(|r| r["streams"] == 1)
        .map_or(f64::NAN, |r| r["audio_seconds_per_second"].as_f64().unwrap());
    for row in bulk_rows {
        let rate = row["audio_seconds_per_second"].as_f64().unwrap();
        md += &format!(
            "| {} | {:.2} | {:.2}x | {:.2} |\n",
            row["streams"],
            rate,
            rate / single,
            row["mean_batch_rows"].as_f64().unwrap(),
        );
    }
    md += "\n## First audio of a stream that starts into load: N streams decoding backlogs (8-frame steps), a new \
           stream hands over one frame; from its start (its decoder made) to its audio\n\n| load streams | probes | p50 ms | p95 ms | \
           max ms |\n| ---: | ---: | ---: | ---: | ---: |\n";
    for row in report["first_audio"].as_array().unwrap() {
        md += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} |\n",
            row["load_streams"],
            row["probes"],
            row["first_audio_ms_p50"].as_f64().unwrap(),
            row["first_audio_ms_p95"].as_f64().unwrap(),
            row["first_audio_ms_max"].as_f64().unwrap(),
        );
    }
    md += &format!(
        "\n## Live: streams pushing 12.5 frames a second, started {} ms apart, {} s each; per frame, from when \
         it fell due to its audio. Where the time went: the share of the run the model spent computing batches, \
         what a frame cost in them, and the compute the streams' frames need at that cost (past 1, no schedule \
         keeps up); each run of {} reported\n\n| streams | mode | run | p50 ms | p95 ms | p99 ms | largest batch | compute busy | ms per frame | \
         frames per batch | compute needed | most common batches (rows x frames: count, ms each) |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        report["live_spacing_ms"], report["live_seconds"], report["live_runs"]
    );
    for row in report["live"].as_array().unwrap() {
        md += &format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.0} % | {:.1} | {:.2} | {:.2} | {} |\n",
            row["streams"],
            match row["hold_ms"].as_f64().unwrap() {
                0.0 => row["mode"].as_str().unwrap().to_owned(),
                hold => format!("{} (held up to {hold:.0} ms)", row["mode"].as_str().unwrap()),
            },
            row["run"],
            row["latency_ms_p50"].as_f64().unwrap(),
            row["latency_ms_p95"].as_f64().unwrap(),
            row["latency_ms_p99"].as_f64().unwrap(),
            row["max_batch_rows"],
            row["compute_busy"].as_f64().unwrap() * 100.0,
            row["ms_per_frame_row"].as_f64().unwrap(),
            row["mean_batch_frame_rows"].as_f64().unwrap(),
            row["compute_needed"].as_f64().unwrap(),
            row["batch_shapes"]
                .as_array()
                .unwrap()
                .iter()
                .take(4)
                .map(|shape| format!(
                    "{}x{}: {}, {:.0}",
                    shape["rows"],
                    shape["frames"],
                    shape["batches"],
                    shape["ms"].as_f64().unwrap()
                ))
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    md += &format!(
        "\nLive streams served (largest N with p95 under {LIVE_P95_LIMIT_MS:.0} ms and compute needed at most 1 in \
         every run: past 1 the streams fall behind, only more slowly than a short run shows): batched {} (steps not \
         held: {}), batching off {}.\n",
        report["live_served"]["batched"],
        report["live_served"]["batched, not held"],
        report["live_served"]["batching off"]
    );
    md
}

fn main() {
    let args = parse_args();
    let device = parse_device(&args.device).unwrap();
    let model = Model::shared(&args.model, device, args.dtype).unwrap();
    let codes = read_codes(&args.model.join("codes.raw"));
    let totals = ComputeTotals::observe(&model);
    // Warm-up: the first steps of each size and batch pay one-off costs.
    throughput(&model, &codes, 2, 1, 4, modes(&args, 1)[0]);

    let mut throughput_rows = Vec::new();
    for &step_frames in &args.step_frames {
        for &streams in &args.streams {
            let rows = best_of_two(
                &modes(&args, streams),
                |mode| throughput(&model, &codes, streams, step_frames, args.frames, mode),
                |row| row["audio_seconds_per_second"].as_f64().unwrap(),
            );
            for row in rows {
                eprintln!("throughput {row}");
                throughput_rows.push(row);
            }
        }
    }
    let batched = Mode::Batched(args.max_batch, args.max_step_frames).limits();
    // Alternated, one stream against N, twice; the better of two runs for each N.
    let mut bulk_rows: Vec<Value> = Vec::new();
    for _ in 0..2 {
        for &streams in &args.bulk {
            let row = bulk(&model, &codes, streams, args.bulk_frames, batched);
            eprintln!("bulk {row}");
            let rate = |row: &Value| row["audio_seconds_per_second"].as_f64().unwrap();
            match bulk_rows.iter_mut().find(|r| r["streams"] == row["streams"]) {
                Some(best) if rate(best) < rate(&row) => *best = row,
                Some(_) => (),
                None => bulk_rows.push(row),
            }
        }
    }
    let mut first_audio_rows = Vec::new();
    for &load in &args.first_audio {
        let row = first_audio_into_load(&model, &codes, load, args.probes, batched);
        eprintln!("first audio {row}");
        first_audio_rows.push(row);
    }
    let mut live_rows = Vec::new();
    let mut served = json!({"batched": 0, "batched, not held": 0, "batching off": 0});
    for &streams in &args.live {
        let mut modes = modes(&args, streams);
        // A lone stream is never held: the two runs would be the same.
        if streams > 1 && streams <= args.unheld_up_to {
            modes.insert(1, Mode::NotHeld(args.max_batch, args.max_step_frames));
        }
        let mut runs: Vec<Vec<Value>> = vec![Vec::new(); modes.len()];
        for run in 0..args.live_runs {
            for (index, &mode) in modes.iter().enumerate() {
                let mut row = live(
                    &model,
                    &totals,
                    &codes,
                    streams,
                    args.live_seconds,
                    args.live_spacing,
                    mode,
                );
                row["run"] = json!(run + 1);
                eprintln!("live {row}");
                runs[index].push(row);
            }
        }
        for (rows, mode) in runs.into_iter().zip(modes) {
            let every_run = rows.iter().all(|row| {
                row["latency_ms_p95"].as_f64().unwrap() < LIVE_P95_LIMIT_MS
                    && row["compute_needed"].as_f64().unwrap() <= 1.0
            });
            if every_run {
                let best = &mut served[mode.name()];
                *best = json!(best.as_u64().unwrap().max(streams as u64));
            }
            live_rows.extend(rows);
        }
    }

    let machine = machine();
    let date = common::date();
    let graphs = model.cuda_graphs();
    let report = json!({
        "max_batch": args.max_batch,
        "max_step_frames": args.max_step_frames,
        "cuda_graphs": if device.is_cuda() {
            json!({"graphs": graphs.graphs, "bytes": graphs.bytes, "failure": graphs.failure})
        } else {
            Value::Null
        },
        "date": date,
        "machine": machine,
        "device": args.device,
        "dtype": args.dtype.to_string(),
        "model": args.model.file_name().unwrap().to_string_lossy(),
        "frames": args.frames,
        "live_seconds": args.live_seconds,
        "live_runs": args.live_runs,
        "live_spacing_ms": args.live_spacing.as_millis() as u64,
        "throughput": throughput_rows,
        "bulk_frames": args.bulk_frames,
        "bulk": bulk_rows,
        "first_audio": first_audio_rows,
        "live": live_rows,
        "live_served": served,
    });
    let md = markdown(&report);
    common::write_result(
        &args.out,
        &format!("streams-{}-{}", args.device, args.dtype),
        &report,
        &md,
    );
    print!("{md}");
}
