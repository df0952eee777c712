#!/usr/bin/env python3
"""Summarise every benchmark result in measurements/results/ as one markdown table.

One row per result file (<date>-<cpu>-<device>-<dtype>.json, written by
benches/decode/main.rs): the CPU, the thread counts, and the headline figures, in
seconds of compute per second of audio as "best / median" of the timed runs.
With --into, the table replaces the block between the bench-summary markers
of that file, its links relative to it (`make bench` does this for
docs/performance.md); else it is printed, its links relative to the repository.

    python benches/tools/bench_summary.py measurements/results [--into docs/performance.md]
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

BEGIN = "<!-- bench-summary: begin (benches/tools/bench_summary.py writes this table) -->"
END = "<!-- bench-summary: end -->"


def best_median(value, digits):
    """A "best / median" cell; results from before the benchmark repeated
    its runs hold a single figure."""
    if isinstance(value, dict):
        return f"{value['best']:.{digits}f} / {value['median']:.{digits}f}"
    return f"{value:.{digits}f}"


def find_row(report, method):
    for row in report["rows"]:
        if row["method"] == method:
            return row
    return None


def cell(report, method, key, digits):
    row = find_row(report, method)
    return "–" if row is None else best_median(row[key], digits)


def summary_row(path, report, links):
    machine = report["machine"]
    avx512 = machine.get("avx512")
    cpu = machine["cpu"]
    if machine.get("limits"):
        # An AVX-512 CPU kept from its widest instructions, standing in for another.
        cpu += " (limited by " + ", ".join(machine["limits"]) + ")"
    elif avx512 is not None:
        cpu += " (AVX-512)" if avx512 else " (no AVX-512)"
    cpu += f", {machine['cores']} cores"
    rows = report["rows"]
    if "threads" in rows[0]:
        ours = next(r for r in rows if r["method"].startswith("qwencodec"))
        threads = f"{rows[0]['threads']} / {ours['threads']}"
    else:
        threads = f"{report['upstream_threads']} / {machine['torch_threads']}"
    steady = report.get("steady")
    growth = ("–" if not steady else
              f"{steady['last_over_first_p50']:.2f}x ({steady['model']})")
    core = "qwencodec core, chunk-frames {}"
    result = f"[{path.stem}]({links}/{path.stem}.md)"
    if not isinstance(rows[0]["seconds_per_audio_second"], dict):
        result += " (older method: upstream best of 3, ours a single run)"
    return [
        cpu,
        f"{report['device']}, {report['dtype']}",
        threads,
        cell(report, "upstream PyTorch, full sequence",
             "seconds_per_audio_second", 3),
        cell(report, core.format(1), "seconds_per_audio_second", 3),
        cell(report, core.format(4), "seconds_per_audio_second", 3),
        cell(report, core.format(1), "first_audio_ms", 1),
        growth,
        result,
    ]


def table(results, links):
    header = [
        "CPU", "device, dtype", "threads (upstream / ours)",
        "upstream full decode", "ours, chunk-frames 1", "ours, chunk-frames 4",
        "first audio ms, chunk-frames 1", "long stream: old / fresh step (last / first before e2fd209)",
        "result",
    ]
    lines = ["| " + " | ".join(header) + " |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for path in sorted(results.glob("*.json")):
        if path.stem.endswith(("-streams", "-profile", "-kernels-ab", "-rtp-codes", "-talker-speed")) \
                or "-time-to-effect" in path.stem:
            # benches/streams.rs, effect.rs, kernels_ab.rs, rtp_codes.rs, make profile and
            # benches/tools/bench_talker.py: tabled in their own files
            continue
        report = json.loads(path.read_text())
        lines.append("| " + " | ".join(summary_row(path, report, links)) + " |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--into", type=Path,
                        help="file whose bench-summary block to rewrite")
    args = parser.parse_args()
    if args.into is None:
        print(table(args.results, args.results.as_posix()), end="")
        return
    text = table(args.results, Path(os.path.relpath(args.results, args.into.parent)).as_posix())
    readme = args.into.read_text()
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END),
                         re.DOTALL)
    if not pattern.search(readme):
        sys.exit(f"{args.into}: no bench-summary block ({BEGIN} ... {END})")
    args.into.write_text(
        pattern.sub(lambda _: f"{BEGIN}\n{text}{END}", readme))


if __name__ == "__main__":
    main()
