//! The report's markdown.

use serde_json::Value;

use crate::common;

fn fmt(value: &Value, digits: usize) -> String {
    value
        .as_f64()
        .map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

/// Per chunk size: how much longer the alongside dtype's core took than the report's dtype, from
/// the same alternated runs.
fn alongside_ratios(report: &Value, other: &str) -> String {
    let dtype = report["dtype"].as_str().unwrap();
    let rows = report["rows"].as_array().unwrap();
    let speed = |method: &str, statistic: &str| {
        rows.iter()
            .find(|r| r["method"] == method)
            .and_then(|r| r["seconds_per_audio_second"][statistic].as_f64())
    };
    let mut md = format!(
        "\nThe core in {other} alongside, its runs alternating with {dtype}'s: {other}'s time over {dtype}'s \
         (above 1: {dtype} is faster).\n\n| chunk-frames | best | median |\n| ---: | ---: | ---: |\n"
    );
    for r in rows {
        let method = r["method"].as_str().unwrap();
        let Some(chunk) = method
            .strip_prefix("qwencodec core, chunk-frames ")
            .filter(|_| !method.contains("alongside"))
        else {
            continue;
        };
        let other_method = format!("qwencodec core in {other} (alongside), chunk-frames {chunk}");
        let ratio = |statistic| match (speed(&other_method, statistic), speed(method, statistic)) {
            (Some(theirs), Some(ours)) => format!("{:.2}x", theirs / ours),
            _ => "–".into(),
        };
        md += &format!("| {chunk} | {} | {} |\n", ratio("best"), ratio("median"));
    }
    md
}

pub(crate) fn markdown(report: &Value) -> String {
    let mut md = String::new();
    let m = &report["machine"];
    md += &format!(
        "# qwencodec benchmark, {}\n\nCPU: {} ({}), {} cores; code {}; device {}, dtype {}; {} frames ({:.2} s \
         of audio) of the released geometry with random weights.\n\n",
        report["date"].as_str().unwrap(),
        m["cpu"].as_str().unwrap(),
        common::flags(m),
        m["cores"],
        common::code(m),
        report["device"].as_str().unwrap(),
        report["dtype"].as_str().unwrap(),
        report["frames"],
        report["audio_seconds"].as_f64().unwrap(),
    );
    md += &format!(
        "Every decode ran once as a warm-up, then {} times: best and median of those runs. Threads: the \
         torch threads of each side. First audio: from the first frame handed over, frames coming at the \
         talker's pace, to its audio, the wait for a full step included. Step ms: over every step of the \
         timed runs (for the element, its own stats: the median run's mean step and the longest step). \
         Upstream's full decode ran, in a process of its own, before each round of every chunk size's runs: \
         its row gathers all of those runs, and each of our rows' \"vs upstream full\" is its best over \
         upstream's best of the same rounds. Upstream's windowed decode was timed before.\n\n",
        report["repeats"]
    );
    md += "| method | threads | s per audio s, best | median | vs upstream full | step ms p50 | p99 | first audio ms, best | median | rel. L2 vs float64 |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    let full = report["rows"][0]["seconds_per_audio_second"]["best"]
        .as_f64()
        .unwrap();
    for r in report["rows"].as_array().unwrap() {
        let speed = &r["seconds_per_audio_second"];
        let steps = &r["step_ms"];
        let (step_a, step_b) = if steps["p50"].is_null() {
            (
                format!("mean {}", fmt(&steps["mean"], 1)),
                format!("max {}", fmt(&steps["max"], 1)),
            )
        } else {
            (fmt(&steps["p50"], 1), fmt(&steps["p99"], 1))
        };
        md += &format!(
            "| {} | {} | {} | {} | {:.2}x | {} | {} | {} | {} | {:.2e} |\n",
            r["method"].as_str().unwrap(),
            r["threads"],
            fmt(&speed["best"], 3),
            fmt(&speed["median"], 3),
            r["vs_upstream_full"]["best"]
                .as_f64()
                .unwrap_or_else(|| speed["best"].as_f64().unwrap() / full),
            step_a,
            step_b,
            fmt(&r["first_audio_ms"]["best"], 1),
            fmt(&r["first_audio_ms"]["median"], 1),
            r["relative_l2"].as_f64().unwrap(),
        );
    }
    if let Some(other) = report["alongside"].as_str() {
        md += &alongside_ratios(report, other);
    }
    md += &format!(
        "\nState per stream (window full): {:.2} MiB. Process RSS growth per 100 open streams (each after \
         {} frames): {:.1} MiB. Weights are loaded once per process.\n\n",
        report["state_bytes"].as_f64().unwrap() / 1048576.0,
        report["rss_streams_frames"],
        report["rss_per_100_streams"].as_f64().unwrap() / 1048576.0,
    );
    let steady = &report["steady"];
    if !steady.is_null() {
        md += &format!(
            "\nCost per frame late in a long stream: a stream {} frames in and a fresh one at chunk-frames 1 on {} \
             (not the released widths: see benches/decode/main.rs), {} one-frame steps each, taken in turn.\n\n",
            steady["frames"],
            steady["geometry"].as_str().unwrap(),
            steady["steps_compared"],
        );
        md += "| steps | p50 ms | mean ms | p99 ms |\n| --- | ---: | ---: | ---: |\n";
        for (label, key) in [("fresh stream's", "first"), ("old stream's", "last")] {
            let s = &steady[key];
            md += &format!(
                "| {label} {} | {} | {} | {} |\n",
                steady["steps_compared"],
                fmt(&s["p50"], 3),
                fmt(&s["mean"], 3),
                fmt(&s["p99"], 3)
            );
        }
        md += &format!(
            "| old / fresh | {} | {} | |\n",
            fmt(&steady["last_over_first_p50"], 3),
            fmt(&steady["last_over_first_mean"], 3)
        );
    }
    md
}
