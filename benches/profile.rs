//! `make profile`: the raw material of a profile of one stream's steps (not a test: it asserts
//! nothing). `tools/profile.sh` runs it under `perf record` and `tools/profile_report.py` makes
//! the report.
//!
//! cargo bench --bench profile -- --model DIR --out DIR [--chunk-frames 1] [--steps 100]
//!     [--device cpu] [--dtype f32]
//!
//! One stream decodes its frames in steps of `--chunk-frames`: a warm-up, then `--steps` timed
//! steps (the phase that perf's samples are taken from: its bounds are written in
//! CLOCK_MONOTONIC, perf's `-k CLOCK_MONOTONIC`), then as many steps again under libtorch's op
//! profiler. Writes `run.json` (machine, settings, step times, the phase's bounds) and
//! `events.tsv` (the op profiler's events, see `OpProfiler::finish`) to `--out`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{machine, read_codes, run_steps, slug};
use gstqwencodec::model::{Dtype, Model, OpProfiler, StreamDecoder, TailStrategy, parse_device};
use serde_json::json;

const WARM_UP_STEPS: usize = 10;

/// CLOCK_MONOTONIC in ns, the clock perf stamps its samples with under `-k CLOCK_MONOTONIC`.
fn monotonic_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        seconds: i64,
        nanoseconds: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    let mut time = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: `time` is a valid timespec for the call to fill.
    assert_eq!(unsafe { clock_gettime(CLOCK_MONOTONIC, &mut time) }, 0);
    time.seconds as u64 * 1_000_000_000 + time.nanoseconds as u64
}

fn main() {
    // Every option read before any work (see `common::read_options`).
    let (model_path, out, chunk_frames, steps, device_name, dtype) = common::read_options(|options| {
        Ok((
            PathBuf::from(options.take_required("--model")?),
            PathBuf::from(options.take_required("--out")?),
            options.take_parsed::<usize>("--chunk-frames", 1)?,
            options.take_parsed::<usize>("--steps", 100)?,
            options.take("--device")?.unwrap_or_else(|| "cpu".into()),
            options.take_parsed("--dtype", Dtype::F32)?,
        ))
    });

    let device = parse_device(&device_name).unwrap();
    let model = Arc::new(Model::load(&model_path, device, dtype).unwrap());
    let codes = read_codes(&model_path.join("codes.raw"));
    let codebooks = model.config().num_quantizers;
    let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();

    run_steps(&mut decoder, &codes, codebooks, WARM_UP_STEPS);
    let sampled_from = monotonic_ns();
    let step_ms = run_steps(&mut decoder, &codes, codebooks, steps);
    let sampled_to = monotonic_ns();

    std::fs::create_dir_all(&out).unwrap();
    let profiler = OpProfiler::start(device).unwrap();
    let profiled_step_ms = run_steps(&mut decoder, &codes, codebooks, steps);
    profiler.finish(&out.join("events.tsv")).unwrap();

    let machine = machine();
    let date = common::today();
    let run = json!({
        "stem": format!("{date}-{}-{device_name}-{dtype}-c{chunk_frames}-profile", slug(&machine)),
        "date": date,
        "machine": machine,
        "device": device_name,
        "dtype": dtype.to_string(),
        "model": model_path.file_name().unwrap().to_string_lossy(),
        "chunk_frames": chunk_frames,
        "audio_seconds_per_step": (chunk_frames * model.samples_per_frame()) as f64 / model.sample_rate() as f64,
        "step_ms": step_ms,
        "profiled_step_ms": profiled_step_ms,
        "perf_window_ns": [sampled_from, sampled_to],
        "pid": std::process::id(),
        "program": std::env::current_exe().unwrap().file_name().unwrap().to_string_lossy(),
    });
    std::fs::write(out.join("run.json"), serde_json::to_string_pretty(&run).unwrap()).unwrap();
}
