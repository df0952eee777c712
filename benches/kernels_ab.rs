//! `make kernels-ab`: each CPU kernel of ours against libtorch's ops in its place, the two
//! alternated on one machine, in one stream's steps of the released geometry (not a test: it
//! asserts nothing). Written to `bench/results/` as markdown and JSON.
//!
//! cargo bench --bench kernels_ab -- --model DIR [--out bench/results] [--dtype f32]
//!     [--chunk-frames 1] [--steps 60] [--rounds 4] [--kernels skinny_gemm,winograd,...]
//!
//! The environment chooses the kernels once per process, and the model lays its weights out for
//! them when it loads, so every run is a process of its own (this program again, with `--child`):
//! it loads the model, takes 10 steps to warm up and times `--steps` more; its median step
//! counts. Per kernel, a round is a run with it and one without, their order swapped from round to
//! round so that a drift of the machine's speed falls on both alike; the ratio is taken within
//! each round. The runs start from `QWENCODEC_CPU_KERNELS` as this program finds it (`avx2` to
//! measure the AVX2 kernels; hold libtorch's libraries to AVX2 alike, as `make bench` documents),
//! and hold the kernel back by name (`,-winograd`). Attention and RMSNorm run as kernels of their
//! own only where the transformer layer is not one call: they are measured with it held back in
//! both runs. A kernel that does not run here (an AVX-512 one held to AVX2) is listed as such.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use common::{machine, percentile, read_codes, run_steps, slug};
use gstqwencodec::model::{
    Allowed, CpuKernels, Dtype, KERNELS_ENV, Kernel, Model, StreamDecoder, TailStrategy, widest_kernels,
};
use serde_json::{Value, json};

const WARM_UP_STEPS: usize = 10;

struct Args {
    model: PathBuf,
    out: PathBuf,
    dtype: Dtype,
    chunk_frames: usize,
    steps: usize,
    rounds: usize,
    kernels: Vec<Kernel>,
    /// Set in a child: time the steps with the environment as it is and print the median.
    child: bool,
}

fn parse_args() -> Args {
    common::read_options(|options| {
        Ok(Args {
            model: PathBuf::from(options.take_required("--model")?),
            out: options
                .take("--out")?
                .map_or_else(|| PathBuf::from("bench/results"), PathBuf::from),
            dtype: options.take_parsed("--dtype", Dtype::F32)?,
            chunk_frames: options.take_parsed("--chunk-frames", 1)?,
            steps: options.take_parsed("--steps", 60)?,
            rounds: options.take_parsed("--rounds", 4)?,
            kernels: options.take_list("--kernels", &Kernel::ALL)?,
            child: options.take_parsed("--child", false)?,
        })
    })
}

/// In a child: the median ms of `--steps` steps after a warm-up.
fn time_steps(args: &Args) -> f64 {
    let model = Arc::new(Model::load(&args.model, tch::Device::Cpu, args.dtype).unwrap());
    let codes = read_codes(&args.model.join("codes.raw"));
    let codebooks = model.config().num_quantizers;
    let mut decoder = StreamDecoder::new(model, args.chunk_frames, TailStrategy::Eager).unwrap();
    run_steps(&mut decoder, &codes, codebooks, WARM_UP_STEPS);
    percentile(&run_steps(&mut decoder, &codes, codebooks, args.steps), 0.5)
}

/// A child run with `kernels` as [`KERNELS_ENV`]: its median step in ms.
fn child_run(args: &Args, kernels: &str) -> f64 {
    let output = Command::new(std::env::current_exe().unwrap())
        .env(KERNELS_ENV, kernels)
        .args(["--child", "true", "--model"])
        .arg(&args.model)
        .args(["--dtype", &args.dtype.to_string()])
        .args(["--chunk-frames", &args.chunk_frames.to_string()])
        .args(["--steps", &args.steps.to_string()])
        .output()
        .expect("run this benchmark as a child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child with {KERNELS_ENV}={kernels} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the child's median step: {stdout:?}"))
}

/// One kernel's A/B: the runs from `base` with it and without it, alternated.
fn kernel_ab(args: &Args, base: &str, kernel: Kernel) -> Value {
    let with = match kernel {
        Kernel::Attention | Kernel::RmsNorm => format!("{base},-transformer_layer"),
        _ => base.to_owned(),
    };
    let without = format!("{with},-{}", kernel.name());
    let allowed = Allowed::parse(&with).expect("the kernels' environment");
    if allowed.kernel(kernel, widest_kernels()) == CpuKernels::Off {
        return json!({ "kernel": kernel.name(), "with": with, "runs_here": false });
    }
    let (mut with_ms, mut without_ms, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let (a, b) = if round % 2 == 0 {
            let a = child_run(args, &with);
            (a, child_run(args, &without))
        } else {
            let b = child_run(args, &without);
            (child_run(args, &with), b)
        };
        eprintln!(
            "{}: round {round}: with {a:.2} ms, without {b:.2} ms",
            kernel.name()
        );
        with_ms.push(a);
        without_ms.push(b);
        ratios.push(a / b);
    }
    json!({
        "kernel": kernel.name(),
        "with": with,
        "without": without,
        "runs_here": true,
        "with_ms": with_ms,
        "without_ms": without_ms,
        "with_ms_p50": percentile(&with_ms, 0.5),
        "without_ms_p50": percentile(&without_ms, 0.5),
        "ratios": ratios,
        "ratio_p50": percentile(&ratios, 0.5),
    })
}

fn markdown(report: &Value) -> String {
    let machine = &report["machine"];
    let mut text = format!(
        "# qwencodec, each CPU kernel A/B, {}\n\nCPU: {} ({}), {} cores, {} torch threads; code {}; dtype {}; \
         {} of the released geometry with random weights; one stream, steps of {} frames ({} timed after {} \
         warm-up steps per process), {} rounds per kernel, the order of the two runs swapped each round.\n\n\
         A ratio under 1 means the step is faster with the kernel; the ratio is taken within each round.\n\n\
         | kernel | with ({}) | step p50 ms with | step p50 ms without | with / without, p50 | rounds |\n\
         | --- | --- | ---: | ---: | ---: | --- |\n",
        report["date"].as_str().unwrap(),
        machine["cpu"].as_str().unwrap_or("?"),
        common::flags(machine),
        machine["cores"],
        machine["torch_threads"],
        common::code(machine),
        report["dtype"].as_str().unwrap(),
        report["model"].as_str().unwrap(),
        report["chunk_frames"],
        report["steps"],
        WARM_UP_STEPS,
        report["rounds"],
        KERNELS_ENV,
    );
    for row in report["kernels"].as_array().unwrap() {
        let kernel = row["kernel"].as_str().unwrap();
        let with = row["with"].as_str().unwrap();
        if row["runs_here"] != json!(true) {
            text += &format!("| `{kernel}` | `{with}` | does not run here | | | |\n");
            continue;
        }
        let rounds: Vec<String> = row["ratios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ratio| format!("{:.2}", ratio.as_f64().unwrap()))
            .collect();
        text += &format!(
            "| `{kernel}` | `{with}` | {:.2} | {:.2} | {:.3}x | {} |\n",
            row["with_ms_p50"].as_f64().unwrap(),
            row["without_ms_p50"].as_f64().unwrap(),
            row["ratio_p50"].as_f64().unwrap(),
            rounds.join(", "),
        );
    }
    text
}

fn main() {
    let args = parse_args();
    if args.child {
        println!("{}", time_steps(&args));
        return;
    }
    let base = std::env::var(KERNELS_ENV).unwrap_or_else(|_| "on".into());
    let rows: Vec<Value> = args
        .kernels
        .iter()
        .map(|&kernel| kernel_ab(&args, &base, kernel))
        .collect();
    let machine = machine();
    let date = common::today();
    let stem = format!(
        "{date}-{}-cpu-{}-c{}-kernels-ab",
        slug(&machine),
        args.dtype,
        args.chunk_frames
    );
    let report = json!({
        "date": date,
        "machine": machine,
        "dtype": args.dtype.to_string(),
        "model": args.model.file_name().unwrap().to_string_lossy(),
        "chunk_frames": args.chunk_frames,
        "steps": args.steps,
        "rounds": args.rounds,
        "kernels": rows,
    });
    std::fs::create_dir_all(&args.out).unwrap();
    let markdown = markdown(&report);
    std::fs::write(
        args.out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&report).unwrap(),
    )
    .unwrap();
    std::fs::write(args.out.join(format!("{stem}.md")), &markdown).unwrap();
    print!("{markdown}");
}
