#!/usr/bin/env python3
"""The element beside busy neighbours, against upstream's full decode beside the same ones.

A user's one-frame stream through gst-launch (`qwencodecdec chunk-frames=1`, the checkpoint's
codes, as fast as it decodes), in f32 and a 16-bit dtype, with the element's thread policy
(threads chosen from the steps' times) and pinned at every core (`OMP_NUM_THREADS`, the fixed
count of an idle machine); and upstream's full-sequence decode of the same codes
(bench_upstream.py --serve, loaded once). Each alone, beside one and beside two busy processes
(a Python busy loop each), the runs of one condition taking turns, for --rounds rounds. A
figure is the median wall-clock seconds; its slowdown is that over the same column alone. Goal:
the element's slowdown no worse than upstream's beside each number of neighbours. Where the
time went: each run's threads' seconds on a core and runnable but waiting for one.

    python benches/tools/bench_neighbours.py CHECKPOINT --out measurements/results

Writes <out>/<cpu>/neighbours.{md,json} (benches/tools/results.py).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import ROOT, commit, result_path, this_machine

BUSY = [sys.executable, "-c", "while True: pass"]


def schedstat(pid: int) -> dict:
    """{tid: (seconds on a core, seconds runnable waiting for one)} of a process's threads now."""
    times = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            on_core, waiting, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        times[task.name] = (int(on_core) / 1e9, int(waiting) / 1e9)
    return times


def element_run(checkpoint: Path, dtype: str, pinned_threads) -> dict:
    """A one-frame gst-launch decode of the checkpoint's codes: its wall-clock seconds, and its
    threads' seconds on a core and runnable but waiting for one (the last seen of each thread,
    read every 20 ms)."""
    env = dict(os.environ, GST_PLUGIN_PATH=str(ROOT / "target" / "release"))
    env.pop("OMP_NUM_THREADS", None)
    if pinned_threads:
        env["OMP_NUM_THREADS"] = str(pinned_threads)
    pipeline = ["gst-launch-1.0", "-q", "filesrc", f"location={checkpoint / 'codes.raw'}", "!",
                "audio/x-qwen3-tts-codes,codebooks=16", "!", "qwencodecdec", f"model-path={checkpoint}",
                "chunk-frames=1", f"dtype={dtype}", "!", "fakesink", "sync=false"]
    started = time.perf_counter()
    process = subprocess.Popen(pipeline, env=env, stdout=subprocess.DEVNULL)
    threads = {}
    while process.poll() is None:
        threads.update(schedstat(process.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        sys.exit(f"bench_neighbours: gst-launch-1.0 failed ({process.returncode}): {' '.join(pipeline)}")
    return {"seconds": seconds, "on_core": sum(on for on, _ in threads.values()),
            "waiting": sum(wait for _, wait in threads.values())}


class Upstream:
    """bench_upstream.py --serve: upstream's decoder loaded once, a full decode a request."""

    def __init__(self, checkpoint: Path, python: str):
        self.process = subprocess.Popen(
            [python, str(ROOT / "benches" / "tools" / "bench_upstream.py"), str(checkpoint), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            sys.exit("bench_neighbours: upstream's decoder did not load")

    def run(self) -> dict:
        before = schedstat(self.process.pid)
        self.process.stdin.write("full\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            sys.exit("bench_neighbours: upstream's decoder stopped")
        after = schedstat(self.process.pid)
        spent = [(on - before.get(tid, (0, 0))[0], wait - before.get(tid, (0, 0))[1])
                 for tid, (on, wait) in after.items()]
        return {"seconds": float(line), "on_core": sum(on for on, _ in spent),
                "waiting": sum(wait for _, wait in spent)}

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "measurements" / "results")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype16", default="bf16", help="the 16-bit dtype measured beside f32")
    parser.add_argument("--python", default=sys.executable, help="the python with torch and qwen-tts")
    options = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    columns = {
        "element f32": lambda: element_run(options.checkpoint, "float32", None),
        "element f32, threads pinned": lambda: element_run(options.checkpoint, "float32", cores),
        f"element {options.dtype16}": lambda: element_run(
            options.checkpoint, {"bf16": "bfloat16", "f16": "float16"}[options.dtype16], None),
    }
    upstream = Upstream(options.checkpoint, options.python)
    upstream.run()  # its first decode pays one-off costs
    columns["upstream full decode"] = upstream.run
    # Every column once, so that first-use costs (page cache, libtorch's first load) are paid.
    for measure in columns.values():
        measure()
    rows = []
    for neighbours in (0, 1, 2):
        busy = [subprocess.Popen(BUSY) for _ in range(neighbours)]
        try:
            times = {name: [] for name in columns}
            for _ in range(options.rounds):
                for name, measure in columns.items():
                    times[name].append(measure())
        finally:
            for process in busy:
                process.kill()
                process.wait()
        median = lambda values, key: statistics.median(value[key] for value in values)
        rows.append({"neighbours": neighbours, "runs": times,
                     "median": {name: median(values, "seconds") for name, values in times.items()},
                     "on_core": {name: median(values, "on_core") for name, values in times.items()},
                     "waiting": {name: median(values, "waiting") for name, values in times.items()}})
        print(f"beside {neighbours}: " + ", ".join(f"{name} {row:.2f} s" for name, row in rows[-1]["median"].items()),
              flush=True)
    upstream.close()
    alone = rows[0]["median"]
    for row in rows:
        row["slowdown"] = {name: row["median"][name] / alone[name] for name in columns}
    machine = this_machine()
    report = {"date": datetime.date.today().isoformat(), "commit": commit(), "machine": machine,
              "cores": cores, "checkpoint": str(options.checkpoint), "rounds": options.rounds,
              "dtype16": options.dtype16, "rows": rows}
    path = result_path(options.out, machine, "neighbours")
    path.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    names = list(columns)
    lines = [f"# The element beside busy neighbours ({machine['cpu']}, {cores} cores)", "",
             f"Commit {report['commit']}, {report['date']}; `python3 benches/tools/bench_neighbours.py` "
             f"(benches/tools/bench_neighbours.py says what each column is). Median wall-clock seconds of "
             f"{options.rounds} rounds, the columns of a row taking turns; in brackets the slowdown over "
             "the same column alone.", "",
             "| busy neighbours | " + " | ".join(names) + " |",
             "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for row in rows:
        lines.append(f"| {row['neighbours']} | " + " | ".join(
            f"{row['median'][name]:.2f} s ({row['slowdown'][name]:.2f}x)" for name in names) + " |")
    lines += ["", "Where the time went: the median seconds the runs' threads spent on a core (spinning "
              "at a barrier counts) and runnable but waiting for one (`/proc/<pid>/task/*/schedstat`).", "",
              "| busy neighbours | " + " | ".join(names) + " |",
              "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for row in rows:
        lines.append(f"| {row['neighbours']} | " + " | ".join(
            f"{row['on_core'][name]:.1f} on, {row['waiting'][name]:.1f} waiting" for name in names) + " |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"bench_neighbours: {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
