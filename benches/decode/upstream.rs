//! Upstream's side: its full decode timed in a Python process of its own, and its rows.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use gstqwencodec::model::Model;
use serde_json::{Value, json};

use crate::common::percentile;
use crate::{Args, Run, frame_period, row};

/// Upstream's full decode in its own Python process (`benches/tools/bench_upstream.py --serve`): the
/// model loaded once, each decode timed on request.
pub(crate) struct UpstreamFull {
    process: Child,
    /// Closed on drop: end of input ends the server.
    requests: Option<ChildStdin>,
    answers: BufReader<ChildStdout>,
}

impl UpstreamFull {
    pub(crate) fn start(args: &Args) -> Self {
        let mut process = Command::new(&args.python)
            .arg("benches/tools/bench_upstream.py")
            .arg(&args.model)
            .args(["--serve", "--device", &args.device])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} benches/tools/bench_upstream.py --serve: {e}", args.python));
        let requests = process.stdin.take();
        let mut answers = BufReader::new(process.stdout.take().unwrap());
        let mut line = String::new();
        answers.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "bench_upstream.py --serve did not start");
        Self {
            process,
            requests,
            answers,
        }
    }

    /// Seconds of one full decode.
    pub(crate) fn decode(&mut self) -> f64 {
        let requests = self.requests.as_mut().unwrap();
        writeln!(requests, "full").unwrap();
        requests.flush().unwrap();
        let mut line = String::new();
        self.answers.read_line(&mut line).unwrap();
        line.trim()
            .parse()
            .unwrap_or_else(|_| panic!("bench_upstream.py --serve answered {line:?}"))
    }
}

impl Drop for UpstreamFull {
    fn drop(&mut self) {
        drop(self.requests.take());
        _ = self.process.wait();
    }
}

/// Upstream's windowed row, timed by benches/tools/bench_upstream.py alike.
pub(crate) fn windowed_row(upstream: &Value) -> Value {
    let u = &upstream["windowed"];
    let steps: Vec<f64> = u["step_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    json!({
        "method": "upstream PyTorch, windowed (8 + 25 context)",
        "threads": upstream["threads"],
        "runs": upstream["repeats"],
        "seconds_per_audio_second": u["seconds_per_audio_second"],
        "first_audio_ms": u["first_audio_ms"],
        "step_ms": {"p50": percentile(&steps, 0.5), "p99": percentile(&steps, 0.99)},
        "relative_l2": u["relative_l2"],
    })
}

/// Upstream's full-decode row, from the seconds of its runs interleaved with ours.
pub(crate) fn upstream_full_row(upstream: &Value, seconds: &[f64], model: &Model, frames: usize) -> Value {
    let audio_seconds = frames as f64 * frame_period(model);
    let step_ms: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
    let runs: Vec<Run> = seconds
        .iter()
        .map(|s| Run {
            seconds_per_audio_second: s / audio_seconds,
            // The whole utterance is needed before its first audio.
            first_audio_ms: ((frames - 1) as f64 * frame_period(model) + s) * 1e3,
            error: upstream["full"]["relative_l2"].as_f64().unwrap(),
        })
        .collect();
    row(
        "upstream PyTorch, full sequence",
        upstream["threads"].clone(),
        &runs,
        json!({"p50": percentile(&step_ms, 0.5), "p99": percentile(&step_ms, 0.99)}),
    )
}
