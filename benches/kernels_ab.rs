//! `make kernels-ab`: each CPU kernel of ours against libtorch's ops in its place, the two
//! alternated on one machine, in the released geometry's steps (not a test: it asserts nothing).
//! Written to `measurements/results/<cpu>/kernels-ab-cpu-<dtype>-c<frames>[-s<streams>].{md,json}`.
//!
//! cargo bench --bench kernels_ab -- --model DIR [--out measurements/results] [--dtype f32]
//!     [--chunk-frames 1] [--streams 1] [--steps 100] [--rounds 4] [--kernels skinny_gemm,winograd,...]
//!
//! The environment chooses the kernels once per process, and the model lays its weights out for
//! them when it loads, so the two sides run in processes of their own (this program again, with
//! `--child`). A round starts one child with the kernel and one without; each loads the model and
//! takes 10 steps to warm up. Then the two take turns step by step, `--steps` times each, the
//! one that goes first swapped from pair to pair; a pair's ratio is its two steps' times. The
//! machine's speed moves by a third within minutes but little from one step to the next, so pairs
//! resolve what whole runs taken in turns could not (a round's ratio was good to about ±10%).
//! The step that goes second runs beside the first child's OpenMP workers, still spinning, and
//! is slower for it: the ratio is the geometric mean of the two orders' medians (see
//! [`Pairs::order_free`]).
//! The rounds repeat this with fresh processes (the weights land elsewhere in memory). The runs
//! start from `QWENCODEC_CPU_KERNELS` as this program finds it (`avx2` to measure the AVX2
//! kernels; hold libtorch's libraries to AVX2 alike, as `make bench` documents), and hold the
//! kernel back by name (`,-winograd`). A kernel that does not run here (an AVX-512 one held to
//! AVX2) is listed as such.
//!
//! The first row is an A/A: the same kernels on both sides, to show how far a ratio strays by
//! chance.
//!
//! `--streams N` times batches: N streams on one model, each on a thread of its own, hand over a
//! step at the same moment, so that the engine runs them as one batch of N rows (the shapes live
//! streams form); a step's time is then the batch's, from the hand-over until every stream has
//! its audio.

use qwencodec_testing::bench as common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::{machine, percentile, read_codes};
use gstqwencodec::model::{
    Allowed, Dtype, KERNELS_ENV, Kernel, Model, StreamDecoder, TailStrategy, widest_kernels,
};
use serde_json::{Value, json};

const WARM_UP_STEPS: usize = 10;

/// The first row: both sides with the same kernels (an A/A).
const CONTROL: &str = "none (A/A)";

struct Args {
    model: PathBuf,
    out: PathBuf,
    dtype: Dtype,
    chunk_frames: usize,
    streams: usize,
    steps: usize,
    rounds: usize,
    kernels: Vec<Kernel>,
    /// Set in a child: step when told to, with the environment as it is.
    child: bool,
}

fn parse_args() -> Args {
    common::read_options(|options| {
        Ok(Args {
            model: PathBuf::from(options.take_required("--model")?),
            out: options
                .take("--out")?
                .map_or_else(|| PathBuf::from("measurements/results"), PathBuf::from),
            dtype: options.take_parsed("--dtype", Dtype::F32)?,
            chunk_frames: options.take_parsed("--chunk-frames", 1)?,
            streams: options.take_parsed("--streams", 1)?,
            steps: options.take_parsed("--steps", 100)?,
            rounds: options.take_parsed("--rounds", 4)?,
            kernels: options.take_list("--kernels", &Kernel::ALL)?,
            child: options.take_parsed("--child", false)?,
        })
    })
}

/// `--streams` decoders on one model, stepping together: one batch per step.
struct Streams {
    /// Every stream's thread and this one meet at `start` to begin a step and at `done` when
    /// every stream has its audio.
    start: Arc<Barrier>,
    done: Arc<Barrier>,
    threads: Vec<std::thread::JoinHandle<f64>>,
}

impl Streams {
    fn new(args: &Args, steps: usize) -> Self {
        let model = Arc::new(Model::load(&args.model, tch::Device::Cpu, args.dtype).unwrap());
        let codes = Arc::new(read_codes(&args.model.join("codes.raw")));
        let codebooks = model.config().num_quantizers;
        let start = Arc::new(Barrier::new(args.streams + 1));
        let done = Arc::new(Barrier::new(args.streams + 1));
        let threads = (0..args.streams)
            .map(|_| {
                let mut decoder =
                    StreamDecoder::new(model.clone(), args.chunk_frames, TailStrategy::Eager).unwrap();
                let (codes, start, done) = (codes.clone(), start.clone(), done.clone());
                std::thread::spawn(move || {
                    let step_codes = codebooks * decoder.chunk_frames();
                    let mut frames = codes.chunks_exact(step_codes).cycle();
                    for _ in 0..steps {
                        start.wait();
                        let audio = decoder.push(frames.next().unwrap()).unwrap();
                        assert!(!audio.is_empty(), "a step gives audio");
                        done.wait();
                    }
                    // The rows of a step's batch, on average: N when the streams batched.
                    decoder.batch_rows().0 as f64 / decoder.steps() as f64
                })
            })
            .collect();
        Self { start, done, threads }
    }

    /// One step of every stream: its wall time in ms.
    fn step(&self) -> f64 {
        self.start.wait();
        let started = Instant::now();
        self.done.wait();
        started.elapsed().as_secs_f64() * 1e3
    }

    /// The mean rows of a step's batch, once every step is taken.
    fn batch_rows(self) -> f64 {
        let rows: Vec<f64> = self
            .threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect();
        common::mean(&rows)
    }
}

/// In a child: warm up, say `ready`, then take a step per line read (answering its ms), and at
/// the end of the input answer the mean batch rows.
fn serve_steps(args: &Args) {
    let streams = Streams::new(args, WARM_UP_STEPS + args.steps);
    for _ in 0..WARM_UP_STEPS {
        streams.step();
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        line.unwrap();
        writeln!(out, "{}", streams.step()).unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "{}", streams.batch_rows()).unwrap();
}

/// One side of a round: a child with `kernels` as [`KERNELS_ENV`], stepping when told.
struct Side {
    kernels: String,
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Side {
    fn start(args: &Args, kernels: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(KERNELS_ENV, kernels)
            .args(["--child", "true", "--model"])
            .arg(&args.model)
            .args(["--dtype", &args.dtype.to_string()])
            .args(["--chunk-frames", &args.chunk_frames.to_string()])
            .args(["--streams", &args.streams.to_string()])
            .args(["--steps", &args.steps.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run this benchmark as a child");
        let input = child.stdin.take();
        let output = BufReader::new(child.stdout.take().unwrap());
        Self {
            kernels: kernels.to_owned(),
            child,
            input,
            output,
        }
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        assert!(
            !line.is_empty(),
            "the child with {KERNELS_ENV}={} ended early (its error is above)",
            self.kernels
        );
        line.trim().to_owned()
    }

    fn ready(&mut self) {
        assert_eq!(self.answer(), "ready");
    }

    /// One step: its ms.
    fn step(&mut self) -> f64 {
        writeln!(self.input.as_mut().unwrap(), "step").unwrap();
        let answer = self.answer();
        answer
            .parse()
            .unwrap_or_else(|_| panic!("the child's step: {answer:?}"))
    }

    /// The end: the mean rows of its steps' batches.
    fn finish(mut self) -> f64 {
        drop(self.input.take());
        let rows = self.answer().parse().unwrap();
        assert!(self.child.wait().unwrap().success());
        rows
    }
}

/// One kernel's A/B: steps from `base` with it and without it, in turns.
fn kernel_ab(args: &Args, base: &str, kernel: Kernel) -> Value {
    let without = format!("{base},-{}", kernel.name());
    let allowed = Allowed::parse(base).expect("the kernels' environment");
    if !kernel.runs_in(allowed.kernel(kernel, widest_kernels())) {
        return json!({ "kernel": kernel.name(), "with": base, "runs_here": false });
    }
    ab(args, kernel.name(), base, &without)
}

/// Pairs' ratios (with / without) by which side stepped first.
#[derive(Default)]
struct Pairs {
    with_first: Vec<f64>,
    without_first: Vec<f64>,
}

impl Pairs {
    fn push(&mut self, with_went_first: bool, ratio: f64) {
        if with_went_first {
            self.with_first.push(ratio);
        } else {
            self.without_first.push(ratio);
        }
    }

    /// The ratio of pairs whose order sways them, and each order's median: the geometric mean
    /// of the medians of the pairs where `with` stepped first and of those where `without` did.
    /// The second step of a pair runs beside the first child's OpenMP workers, still spinning
    /// between its ops, and takes longer, so a median over every pair falls on the edge of one
    /// order's cluster; an order's slowdown multiplies both alike and cancels in the geometric
    /// mean (docs/performance.md#each-kernel-today-on-and-off-make-kernels-ab).
    fn order_free(&self) -> (f64, f64, f64) {
        let (a, b) = (
            percentile(&self.with_first, 0.5),
            percentile(&self.without_first, 0.5),
        );
        ((a * b).sqrt(), a, b)
    }
}

/// The steps of `with` and `without` in turns, round after round; `name` labels them.
fn ab(args: &Args, name: &str, with: &str, without: &str) -> Value {
    assert!(args.steps >= 2, "--steps 2 at least: a pair of each order");
    let (mut with_ms, mut without_ms, mut ratios, mut round_ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut pairs = Pairs::default();
    let mut rows_lowest = f64::INFINITY;
    for round in 0..args.rounds {
        let (mut a, mut b) = (Side::start(args, with), Side::start(args, without));
        a.ready();
        b.ready();
        let mut round_pairs = Pairs::default();
        for pair in 0..args.steps {
            let with_first = pair % 2 == 0;
            let (a_ms, b_ms) = if with_first {
                let a_ms = a.step();
                (a_ms, b.step())
            } else {
                let b_ms = b.step();
                (a.step(), b_ms)
            };
            let ratio = a_ms / b_ms;
            with_ms.push(a_ms);
            without_ms.push(b_ms);
            ratios.push(ratio);
            pairs.push(with_first, ratio);
            round_pairs.push(with_first, ratio);
        }
        rows_lowest = rows_lowest.min(a.finish()).min(b.finish());
        let (ratio, with_first, without_first) = round_pairs.order_free();
        eprintln!(
            "{name}: round {round}: with / without {ratio:.3} (with first {with_first:.3}, \
             without first {without_first:.3})"
        );
        round_ratios.push(ratio);
    }
    let (ratio, with_first, without_first) = pairs.order_free();
    json!({
        "kernel": name,
        "with": with,
        "without": without,
        "runs_here": true,
        "with_ms_p50": percentile(&with_ms, 0.5),
        "without_ms_p50": percentile(&without_ms, 0.5),
        "pair_ratios": ratios,
        "ratio": ratio,
        "ratio_with_first": with_first,
        "ratio_without_first": without_first,
        "round_ratios": round_ratios,
        "batch_rows_lowest": rows_lowest,
    })
}

fn markdown(report: &Value) -> String {
    let machine = &report["machine"];
    let mut text = format!(
        "# qwencodec, each CPU kernel A/B, {}\n\nCPU: {} ({}), {} cores, {} torch threads; code {}; dtype {}; \
         {} of the released geometry with random weights; {} stream(s) stepping together (one batch), \
         steps of {} frames. Per round, two processes (with the kernel, without it) warm up with {} steps, \
         then take {} steps each in turns, the one that goes first swapped from pair to pair; {} rounds \
         per kernel, each with fresh processes.\n\n\
         A ratio under 1 means the step is faster with the kernel. The first row runs the same \
         kernels on both sides: how far a ratio strays by chance. A pair's ratio is the two steps' \
         times, taken one after the other. The step that goes second runs beside the other \
         process's OpenMP workers, still spinning, and is slower for it: the table gives the \
         geometric mean of the median over the pairs where the kernel's side went first and of the \
         median over those where the other did (each given beside it), and each round's.\n\n\
         | kernel | with ({}) | step p50 ms with | step p50 ms without | with / without | its side first / the other first, medians | each round's | batch rows, lowest side's mean |\n\
         | --- | --- | ---: | ---: | ---: | ---: | --- | ---: |\n",
        report["date"].as_str().unwrap(),
        machine["cpu"].as_str().unwrap_or("?"),
        common::flags(machine),
        machine["cores"],
        machine["torch_threads"],
        common::code(machine),
        report["dtype"].as_str().unwrap(),
        report["model"].as_str().unwrap(),
        report["streams"],
        report["chunk_frames"],
        WARM_UP_STEPS,
        report["steps"],
        report["rounds"],
        KERNELS_ENV,
    );
    for row in report["kernels"].as_array().unwrap() {
        let kernel = match row["kernel"].as_str().unwrap() {
            CONTROL => CONTROL.to_owned(),
            name => format!("`{name}`"),
        };
        let with = row["with"].as_str().unwrap();
        if row["runs_here"] != json!(true) {
            text += &format!("| {kernel} | `{with}` | does not run here | | | | | |\n");
            continue;
        }
        let rounds: Vec<String> = row["round_ratios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ratio| format!("{:.3}", ratio.as_f64().unwrap()))
            .collect();
        text += &format!(
            "| {kernel} | `{with}` | {:.2} | {:.2} | {:.3}x | {:.3} / {:.3} | {} | {:.2} |\n",
            row["with_ms_p50"].as_f64().unwrap(),
            row["without_ms_p50"].as_f64().unwrap(),
            row["ratio"].as_f64().unwrap(),
            row["ratio_with_first"].as_f64().unwrap(),
            row["ratio_without_first"].as_f64().unwrap(),
            rounds.join(", "),
            row["batch_rows_lowest"].as_f64().unwrap(),
        );
    }
    text
}

fn main() {
    let args = parse_args();
    if args.child {
        serve_steps(&args);
        return;
    }
    let base = std::env::var(KERNELS_ENV).unwrap_or_else(|_| "on".into());
    // First the same kernels on both sides: how far a ratio strays by chance.
    let rows: Vec<Value> = std::iter::once(ab(&args, CONTROL, &base, &base))
        .chain(args.kernels.iter().map(|&kernel| kernel_ab(&args, &base, kernel)))
        .collect();
    let machine = machine();
    let date = common::date();
    let report = json!({
        "date": date,
        "machine": machine,
        "dtype": args.dtype.to_string(),
        "model": args.model.file_name().unwrap().to_string_lossy(),
        "chunk_frames": args.chunk_frames,
        "streams": args.streams,
        "steps": args.steps,
        "rounds": args.rounds,
        "kernels": rows,
    });
    let markdown = markdown(&report);
    let streams = if args.streams > 1 {
        format!("-s{}", args.streams)
    } else {
        String::new()
    };
    common::write_result(
        &args.out,
        &format!("kernels-ab-cpu-{}-c{}{streams}", args.dtype, args.chunk_frames),
        &report,
        &markdown,
    );
    print!("{markdown}");
}
