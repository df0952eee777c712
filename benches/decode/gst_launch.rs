//! The element as a user runs it: `gst-launch-1.0` in a fresh process per run, frames from
//! `filesrc`, in the environment `make bench` runs in (no thread settings of ours).
//!
//! A process's time holds its start, the plugin's and the model's load and the first steps'
//! warm-up, none of which a long stream pays per step; so each run decodes a short file (the
//! benchmark's codes, its audio checked against the reference) and a long one (the same codes
//! [`LONG_REPEATS`] times) in two processes, and a step costs the difference of their times over
//! the difference of their steps.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use gstqwencodec::model::{Dtype, Model};
use serde_json::{Value, json};

use crate::common::{percentile, relative_l2};
use crate::{Args, best_and_median, frame_period, read_f32};

/// The long file holds the benchmark's codes this many times.
const LONG_REPEATS: usize = 3;

/// The codes files of the runs, written once.
pub(crate) struct LaunchFiles {
    short: PathBuf,
    long: PathBuf,
    frames: usize,
    plugin_dir: PathBuf,
    scratch: PathBuf,
}

impl LaunchFiles {
    pub(crate) fn write(codes: &[i16], codebooks: usize, scratch: &Path) -> Self {
        std::fs::create_dir_all(scratch).unwrap();
        let bytes: Vec<u8> = codes.iter().flat_map(|c| c.to_le_bytes()).collect();
        let short = scratch.join("launch-short.codes");
        let long = scratch.join("launch-long.codes");
        std::fs::write(&short, &bytes).unwrap();
        std::fs::write(&long, bytes.repeat(LONG_REPEATS)).unwrap();
        // The plugin `make build` made, which the benchmark's own library build is not.
        let plugin_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release");
        let plugin = plugin_dir.join("libgstqwencodec.so");
        assert!(plugin.exists(), "no {}: run `make build` first", plugin.display());
        // gst-launch loads that file, not this binary's library: one built before the sources'
        // last change would time other code.
        let built = std::fs::metadata(&plugin).and_then(|m| m.modified()).unwrap();
        if let Some(newer) = newest_source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
            .filter(|(changed, _)| *changed > built)
        {
            panic!(
                "{} is older than {}: run `make build` first",
                plugin.display(),
                newer.1.display()
            );
        }
        Self {
            short,
            long,
            frames: codes.len() / codebooks,
            plugin_dir,
            scratch: scratch.to_owned(),
        }
    }
}

/// The most recently changed file under `dir`, and when.
fn newest_source(dir: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            if path.is_dir() {
                newest_source(&path)
            } else {
                Some((entry.metadata().ok()?.modified().ok()?, path))
            }
        })
        .max_by_key(|(changed, _)| *changed)
}

/// One `gst-launch-1.0` process decoding `codes` to `sink`: its wall time in seconds.
fn launch(
    args: &Args,
    files: &LaunchFiles,
    model: &Model,
    codes: &Path,
    dtype: Dtype,
    chunk_frames: usize,
    sink: &str,
) -> f64 {
    let config = model.config();
    let (num, den) = config.frame_rate();
    let pipeline = format!(
        "filesrc location={} ! audio/x-qwen3-tts-codes,codebooks={},framerate={num}/{den} ! \
         qwencodecdec model-path={} device={} dtype={dtype} chunk-frames={chunk_frames} \
         max-step-frames={chunk_frames} ! {sink}",
        codes.display(),
        config.num_quantizers,
        args.model.display(),
        args.device,
    );
    let started = Instant::now();
    let output = Command::new("gst-launch-1.0")
        .arg("-q")
        .args(pipeline.split_whitespace())
        .env("GST_PLUGIN_PATH", &files.plugin_dir)
        .env("GST_REGISTRY", files.scratch.join("registry.bin"))
        .stdin(Stdio::null())
        .output()
        .expect("gst-launch-1.0");
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        output.status.success(),
        "gst-launch-1.0 {pipeline}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    seconds
}

/// The runs of one dtype at one chunk size.
pub(crate) struct LaunchBench {
    dtype: Dtype,
    /// Per run: ms per step, the long file's minus the short one's.
    step_ms: Vec<f64>,
    error: f64,
}

impl LaunchBench {
    pub(crate) fn new(dtype: Dtype) -> Self {
        Self {
            dtype,
            step_ms: Vec::new(),
            error: 0.0,
        }
    }

    /// One run (two processes), kept unless it is the warm-up (which fills the page cache).
    pub(crate) fn run(
        &mut self,
        args: &Args,
        files: &LaunchFiles,
        model: &Model,
        chunk_frames: usize,
        reference: &[f32],
        warm_up: bool,
    ) {
        let audio_path = files.scratch.join("launch-short.f32");
        let short = launch(
            args,
            files,
            model,
            &files.short,
            self.dtype,
            chunk_frames,
            &format!(
                "audio/x-raw,format=F32LE ! filesink location={}",
                audio_path.display()
            ),
        );
        let long = launch(
            args,
            files,
            model,
            &files.long,
            self.dtype,
            chunk_frames,
            "fakesink",
        );
        if warm_up {
            return;
        }
        let audio = read_f32(&audio_path);
        self.error = self.error.max(relative_l2(&audio, reference));
        let steps = |frames: usize| frames.div_ceil(chunk_frames) as f64;
        let extra_steps = steps(files.frames * LONG_REPEATS) - steps(files.frames);
        self.step_ms.push((long - short) / extra_steps * 1e3);
    }

    pub(crate) fn row(&self, model: &Model, chunk_frames: usize, threads: Value) -> Value {
        let step_seconds = chunk_frames as f64 * frame_period(model);
        let speed: Vec<f64> = self.step_ms.iter().map(|ms| ms / 1e3 / step_seconds).collect();
        json!({
            "method": format!("gst-launch-1.0 in {}, chunk-frames {chunk_frames}", self.dtype),
            "threads": threads,
            "runs": self.step_ms.len(),
            "seconds_per_audio_second": best_and_median(&speed),
            "first_audio_ms": Value::Null,
            "step_ms": {"p50": percentile(&self.step_ms, 0.5), "p99": Value::Null},
            "relative_l2": self.error,
        })
    }
}
