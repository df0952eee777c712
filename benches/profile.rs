//! `make profile`: the raw material of a profile of one stream's steps (not a test: it asserts
//! nothing). `benches/tools/profile.sh` runs it under `perf record` and `benches/tools/profile_report.py` makes
//! the report.
//!
//! cargo bench --bench profile -- --model DIR --out DIR [--chunk-frames 1] [--steps 100]
//!     [--device cpu] [--dtype f32] [--streams 1]
//!
//! One stream (or `--streams` streams, each on its own thread, which the model's engine runs as
//! one batch a step, as the server's sessions are) decodes its frames in steps of
//! `--chunk-frames`: a warm-up, then `--steps` timed
//! steps (the phase that perf's samples are taken from: its bounds are written in
//! CLOCK_MONOTONIC, perf's `-k CLOCK_MONOTONIC`), then as many steps again under libtorch's op
//! profiler. Writes `run.json` (machine, settings, step times, the phase's bounds, the result's
//! name, `<cpu>/profile-<device>-<dtype>-c<frames>[-s<streams>]`) and
//! `events.tsv` (the op profiler's events, see `OpProfiler::finish`) to `--out`.

use qwencodec_testing::bench as common;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};

use common::{machine, read_codes, run_steps};
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
    let (model_path, out, chunk_frames, steps, device_name, dtype, streams) =
        common::read_options(|options| {
            Ok((
                PathBuf::from(options.take_required("--model")?),
                PathBuf::from(options.take_required("--out")?),
                options.take_parsed::<usize>("--chunk-frames", 1)?,
                options.take_parsed::<usize>("--steps", 100)?,
                options.take("--device")?.unwrap_or_else(|| "cpu".into()),
                options.take_parsed("--dtype", Dtype::F32)?,
                options.take_parsed::<usize>("--streams", 1)?,
            ))
        });
    assert!(streams >= 1, "--streams: at least one stream");

    let device = parse_device(&device_name).unwrap();
    let model = Arc::new(Model::load(&model_path, device, dtype).unwrap());
    let codes = read_codes(&model_path.join("codes.raw"));
    let codebooks = model.config().num_quantizers;
    std::fs::create_dir_all(&out).unwrap();

    // Every stream runs each phase's steps; the phases start and end together (the barrier), so
    // that the sampled window and the op profiler hold only the batches of all the streams.
    let phase = Barrier::new(streams + 1);
    let (mut sampled_from, mut sampled_to) = (0, 0);
    let mut profiler = None;
    let per_stream: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..streams)
            .map(|_| {
                let (model, codes, phase) = (&model, &codes, &phase);
                scope.spawn(move || {
                    let mut decoder =
                        StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
                    run_steps(&mut decoder, codes, codebooks, WARM_UP_STEPS);
                    phase.wait();
                    let step_ms = run_steps(&mut decoder, codes, codebooks, steps);
                    phase.wait();
                    phase.wait();
                    let profiled_step_ms = run_steps(&mut decoder, codes, codebooks, steps);
                    phase.wait();
                    (step_ms, profiled_step_ms)
                })
            })
            .collect();
        phase.wait();
        sampled_from = monotonic_ns();
        phase.wait();
        sampled_to = monotonic_ns();
        profiler = Some(OpProfiler::start(device).unwrap());
        phase.wait();
        phase.wait();
        threads.into_iter().map(|thread| thread.join().unwrap()).collect()
    });
    profiler.unwrap().finish(&out.join("events.tsv")).unwrap();
    // The first stream's steps: the streams' steps are the same batches'.
    let (step_ms, profiled_step_ms) = per_stream[0].clone();

    let machine = machine();
    let date = common::date();
    let run = json!({
        "result": common::result_name(
            &machine,
            &format!(
                "profile-{device_name}-{dtype}-c{chunk_frames}{}",
                if streams > 1 { format!("-s{streams}") } else { String::new() }
            ),
        ),
        "date": date,
        "machine": machine,
        "device": device_name,
        "dtype": dtype.to_string(),
        "model": model_path.file_name().unwrap().to_string_lossy(),
        "chunk_frames": chunk_frames,
        "streams": streams,
        "audio_seconds_per_step": (chunk_frames * model.samples_per_frame()) as f64 / model.sample_rate() as f64,
        "step_ms": step_ms,
        "profiled_step_ms": profiled_step_ms,
        "perf_window_ns": [sampled_from, sampled_to],
        "pid": std::process::id(),
        "program": std::env::current_exe().unwrap().file_name().unwrap().to_string_lossy(),
    });
    std::fs::write(out.join("run.json"), serde_json::to_string_pretty(&run).unwrap()).unwrap();
}
