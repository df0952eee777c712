#!/usr/bin/env python3
"""The element's thread policy against threads pinned at every core, on a quiet machine.

`make bench`'s one-frame and batched figures, each measured with the policy (the default:
the compute thread's team sized from its steps' times, docs/element.md "Threads") and pinned
at every core (`OMP_NUM_THREADS`, the fixed count of an idle machine): benches/decode at
chunk-frames 1 (the core, the element in a pipeline, gst-launch in f32) and benches/streams'
batched throughput (1, 4 and 8 streams). The two arms take turns, whole benchmark runs each,
the one that goes first swapped every round, for --rounds rounds. A figure is the median over
rounds; the ratio is the policy's over pinned's in each round, and their range is the noise
to judge it by. Goal: the policy costs nothing on a quiet machine (ratios within noise).

    python3 benches/tools/threads_ab.py CHECKPOINT --upstream UPSTREAM.json \
        --reference REFERENCE.f32 --out measurements/results

Writes <out>/<cpu>/threads-ab.{md,json} (benches/tools/results.py).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from results import ROOT, commit, result_path, this_machine

ARMS = ("policy", "pinned")
DECODE_ROWS = ("qwencodec core, chunk-frames 1", "qwencodecdec in a pipeline, chunk-frames 1",
               "gst-launch-1.0 in f32, chunk-frames 1")
STREAMS = (1, 4, 8)


def bench(name: str, args: list, arm: str, cores: int, out: Path) -> dict:
    """One run of a cargo benchmark under an arm's environment; its JSON report."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if arm == "pinned":
        env["OMP_NUM_THREADS"] = str(cores)
    command = ["cargo", "bench", "-q", "--bench", name, "--", *args, "--out", str(out)]
    if subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"threads_ab: {' '.join(command)} failed")
    reports = list(out.glob(f"*/{name}-cpu-f32.json"))
    if len(reports) != 1:
        sys.exit(f"threads_ab: {name} wrote {len(reports)} reports to {out}, not one")
    return json.loads(reports[0].read_text())


def figures(decode: dict, streams: dict) -> dict:
    """{figure: value} of one arm's run: seconds per audio second (lower is faster) of the
    decode rows, audio seconds per second (higher is faster) of the batched throughput."""
    found = {}
    by_method = {row["method"]: row for row in decode["rows"]}
    for method in DECODE_ROWS:
        if method not in by_method:
            sys.exit(f"threads_ab: the decode report has no row '{method}'")
        found[f"{method}: s per audio s"] = by_method[method]["seconds_per_audio_second"]["median"]
    for n in STREAMS:
        rows = [row for row in streams["throughput"]
                if row["streams"] == n and row["mode"] == "batched" and row["step_frames"] == 1]
        if len(rows) != 1:
            sys.exit(f"threads_ab: the streams report has {len(rows)} batched rows of {n} streams")
        found[f"{n} streams batched: audio s per s"] = rows[0]["audio_seconds_per_second"]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--upstream", type=Path, required=True, help="bench_upstream.py's report")
    parser.add_argument("--reference", type=Path, required=True, help="the float64 reference decode")
    parser.add_argument("--out", type=Path, default=ROOT / "measurements" / "results")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    # benches/decode times its rows as often as upstream's report was timed.
    repeats = json.loads(options.upstream.read_text())["repeats"]
    decode_args = ["--model", str(options.checkpoint), "--upstream", str(options.upstream),
                   "--reference", str(options.reference), "--chunks", "1", "--launch-chunks", "1",
                   "--launch-dtypes", "f32", "--steady-frames", "0", "--repeats", str(repeats)]
    # Only the batched throughput is read; the other sections are kept short.
    streams_args = ["--model", str(options.checkpoint), "--streams", ",".join(map(str, STREAMS)),
                    "--off-up-to", "1", "--bulk", "1", "--first-audio", "8", "--probes", "3",
                    "--live", "1", "--live-runs", "1", "--live-seconds", "3"]
    runs = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="threads-ab-") as scratch:
        for round_ in range(options.rounds):
            order = ARMS if round_ % 2 == 0 else ARMS[::-1]
            for arm in order:
                out = Path(scratch) / f"{round_}-{arm}"
                decode = bench("decode", decode_args, arm, cores, out / "decode")
                streams = bench("streams", streams_args, arm, cores, out / "streams")
                runs[arm].append(figures(decode, streams))
                print(f"threads_ab: round {round_ + 1}, {arm}: {runs[arm][-1]}", file=sys.stderr)
    rows = []
    for figure in runs["policy"][0]:
        policy = [run[figure] for run in runs["policy"]]
        pinned = [run[figure] for run in runs["pinned"]]
        ratios = [a / b for a, b in zip(policy, pinned)]
        rows.append({"figure": figure, "policy": policy, "pinned": pinned, "ratios": ratios,
                     "policy_median": statistics.median(policy), "pinned_median": statistics.median(pinned),
                     "ratio_median": statistics.median(ratios),
                     "pinned_spread": max(pinned) / min(pinned)})
    machine = this_machine()
    report = {"date": datetime.date.today().isoformat(), "commit": commit(), "machine": machine,
              "cores": cores, "checkpoint": str(options.checkpoint), "rounds": options.rounds,
              "repeats": repeats, "rows": rows}
    path = result_path(options.out, machine, "threads-ab")
    json_path = path.with_suffix(".json")
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"# The thread policy against threads pinned, on a quiet machine ({machine['cpu']}, {cores} cores)",
        "",
        f"Commit {report['commit']}, {report['date']}; `python3 benches/tools/threads_ab.py` "
        "(benches/tools/threads_ab.py says what each figure is). The two arms took turns, a whole "
        f"benchmark run each, the first swapped every round; {options.rounds} rounds. Medians over "
        "rounds; the ratio is the policy's figure over pinned's in each round (for seconds per audio "
        "second, below 1 is faster; for audio seconds per second, above 1), and the spread is "
        "pinned's own largest over smallest, the noise between rounds.",
        "",
        "| figure | policy | pinned | ratio, median | ratios by round | pinned's spread |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        lines.append(f"| {row['figure']} | {row['policy_median']:.3f} | {row['pinned_median']:.3f} | "
                     f"{row['ratio_median']:.3f} | {', '.join(f'{r:.3f}' for r in row['ratios'])} | "
                     f"{row['pinned_spread']:.3f} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"threads_ab: wrote {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
