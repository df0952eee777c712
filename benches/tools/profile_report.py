#!/usr/bin/env python3
"""The profile of one stream's steps (or of several streams' batches), in markdown, from what
`make profile` gathered.

    profile_report.py RUN_DIR [--perf PERF_SCRIPT_TXT] --out-dir DIR

RUN_DIR holds `run.json` and `events.tsv` of `benches/profile.rs`; PERF_SCRIPT_TXT is
`perf script -F pid,tid,comm,time,ip,sym,dso` of the run (samples without call graphs: where
each thread was). Prints the report and writes it to DIR/<cpu>/<benchmark>.md (the run's
name for it: profile-<device>-<dtype>-c<frames>[-s<streams>]), with its figures in .json beside
it; DIR is measurements/results for make profile.
"""

import argparse
import collections
import json
import re
import statistics
import sys
from pathlib import Path

# Ops that only make a new view of a tensor's memory (or tell its type): all dispatch, no data.
VIEW_OPS = {
    "aten::as_strided", "aten::slice", "aten::narrow", "aten::view", "aten::transpose",
    "aten::reshape", "aten::_reshape_alias", "aten::flatten", "aten::unflatten", "aten::expand",
    "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::select", "aten::unfold",
    "aten::_unsafe_view", "aten::t", "aten::alias", "aten::resolve_conj", "aten::resolve_neg",
    "aten::result_type", "aten::detach", "aten::split", "aten::chunk",
}


class Event:
    __slots__ = ("thread", "start", "end", "kind", "name", "parent", "children")

    def __init__(self, thread, start, end, kind, name):
        self.thread, self.start, self.end, self.kind, self.name = thread, start, end, kind, name
        self.parent = None
        self.children = []

    @property
    def ns(self):
        return self.end - self.start

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


def read_events(path):
    """The events of each thread, nested: each one's parent is the innermost event holding it."""
    threads = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            thread, start, end, kind, name = line.rstrip("\n").split("\t", 4)
            threads[thread].append(Event(thread, int(start), int(end), kind, name))
    events = []
    for thread_events in threads.values():
        # Outer first where two start together.
        thread_events.sort(key=lambda e: (e.start, -e.end))
        stack = []
        for event in thread_events:
            while stack and stack[-1].end <= event.start:
                stack.pop()
            if stack and event.end <= stack[-1].end:
                event.parent = stack[-1]
                stack[-1].children.append(event)
            stack.append(event)
        events.extend(thread_events)
    return events


def op_profile(events):
    steps = [e for e in events if e.kind == "scope" and e.name == "step"]
    if not steps:
        sys.exit("no `step` scopes in the events: was the op profiler on the compute thread?")
    n = len(steps)
    step_ns = sum(s.ns for s in steps)

    def in_step(e):
        return any(a.kind == "scope" and a.name == "step" for a in e.ancestors())

    def top_level(e):
        """An op called from our code: no op above it."""
        return e.kind == "op" and all(a.kind == "scope" for a in e.ancestors())

    stages = collections.OrderedDict()
    for e in sorted(events, key=lambda e: e.start):
        if e.kind == "scope" and e.parent is not None and e.parent.name == "step":
            stages.setdefault(e.name, 0)
            stages[e.name] += e.ns
    ops_in_step = [e for e in events if e.kind == "op" and in_step(e)]
    top = [e for e in ops_in_step if top_level(e)]
    top_ns = sum(e.ns for e in top)

    by_name = collections.defaultdict(lambda: [0, 0])
    for e in top:
        by_name[e.name][0] += 1
        by_name[e.name][1] += e.ns
    self_by_name = collections.defaultdict(lambda: [0, 0])
    for e in ops_in_step:
        self_ns = e.ns - sum(c.ns for c in e.children if c.kind == "op")
        self_by_name[e.name][0] += 1
        self_by_name[e.name][1] += self_ns
    views = [e for e in top if e.name in VIEW_OPS]
    outside = [e for e in events if e.kind == "op" and not in_step(e) and top_level(e)]
    return {
        "steps": n,
        "step_ms": step_ns / n / 1e6,
        "stages_ms": {name: ns / n / 1e6 for name, ns in stages.items()},
        "ops_per_step": len(ops_in_step) / n,
        "top_level_ops_per_step": len(top) / n,
        "view_ops_per_step": len(views) / n,
        "view_ops_ms": sum(e.ns for e in views) / n / 1e6,
        "outside_ops_ms": (step_ns - top_ns) / n / 1e6,
        "engine_ops_per_step": len(outside) / n,
        "engine_ops_ms": sum(e.ns for e in outside) / n / 1e6,
        "top_level_ops": {
            name: {"per_step": count / n, "ms": ns / n / 1e6}
            for name, (count, ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])
        },
        "self_time": {
            name: {"per_step": count / n, "ms": ns / n / 1e6}
            for name, (count, ns) in sorted(self_by_name.items(), key=lambda kv: -kv[1][1])
        },
    }


def category(sym, dso, program):
    """Where a sample was, in the words of the report."""
    name = Path(dso).name
    if "kernel.kallsyms" in dso or name.startswith("[kernel"):
        return "kernel (page faults, scheduling)"
    if name.startswith("libgomp"):
        return "libgomp (OpenMP threads waiting)"
    if re.match(r"(libc|libm|libstdc\+\+|ld-linux[^/]*)\.so", name):
        return "libc, libstdc++ (malloc, free, memcpy)"
    if name.startswith("perf-") or name in ("[unknown]", "[JIT] tid", "//anon"):
        return "JIT code (oneDNN's kernels)"
    if sym.startswith("mkl_"):
        return "MKL"
    if "dnnl" in sym:
        return "oneDNN (outside its JIT code)"
    if name == program:
        # The shims' kernels live in anonymous namespaces; the rest is Rust.
        if sym.startswith("(anonymous namespace)::"):
            return "qwencodec kernels (shims)"
        return "qwencodec's Rust and tch's bindings"
    if name.startswith(("libtorch", "libc10")):
        if "at::native" in sym or "Sleef" in sym:
            return "libtorch's kernels (element-wise, copies, cat)"
        return "libtorch's dispatch and bookkeeping"
    return "other"


LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+(?P<time>[\d.]+):\s+"
                  r"[0-9a-f]+\s+(?P<sym>.*?)\s+\((?P<dso>[^()]*)\)\s*$")


def perf_profile(path, run):
    """Samples of the timed phase by thread role and category, and the hottest symbols."""
    start, end = (t / 1e9 for t in run["perf_window_ns"])
    pid = run["pid"]
    samples = []
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m or int(m["pid"]) != pid:
            continue
        time = float(m["time"])
        if start <= time <= end:
            samples.append((int(m["tid"]), m["comm"].strip(), m["sym"], m["dso"]))
    if not samples:
        return None
    # The compute thread starts the OpenMP team, whose threads take its name: it is the
    # oldest thread of that name.
    compute = min(tid for tid, comm, _, _ in samples if comm.startswith("qwencodec-"))

    def role(tid, comm):
        if tid == compute:
            return "compute thread"
        if tid == pid:
            return "main thread"
        return "OpenMP workers" if comm.startswith("qwencodec-") else "other threads"

    by_role = collections.defaultdict(collections.Counter)
    symbols = collections.Counter()
    program = run["program"]
    for tid, comm, sym, dso in samples:
        by_role[role(tid, comm)][category(sym, dso, program)] += 1
        # libtorch's element-wise loops are all callbacks of one function_ref: name the loop.
        sym = sym.replace("c10::function_ref<void (char**, long const*, long, long)>::callback_fn<", "")
        dso_name = Path(dso).name
        if category(sym, dso, program).startswith("JIT"):
            sym, dso_name = "[JIT code]", "oneDNN"
        symbols[(sym or "[unknown]", dso_name)] += 1
    total = len(samples)
    return {
        "samples": total,
        "seconds": end - start,
        "by_role": {
            r: {"samples": sum(c.values()), "categories": dict(c.most_common())} for r, c in by_role.items()
        },
        "top_symbols": [{"symbol": s, "dso": d, "share": k / total} for (s, d), k in symbols.most_common(20)],
    }


def markdown(run, ops, perf):
    machine = run["machine"]
    step_ms = statistics.median(run["step_ms"])
    profiled_ms = statistics.median(run["profiled_step_ms"])
    # A batched step gives every stream its audio.
    streams = run.get("streams", 1)
    audio_per_step = run["audio_seconds_per_step"] * streams
    per_audio = step_ms / 1e3 / audio_per_step
    # Each stream pushed as many steps; the op profiler saw one step per batch.
    rows = streams * len(run["profiled_step_ms"]) / ops["steps"]
    who = ("one stream" if streams == 1 else
           f"{streams} streams, each on its own thread, batched by the engine "
           f"({rows:.2f} rows per batch under the op profiler)")
    out = []
    w = out.append
    w(f"# Where a chunk-frames-{run['chunk_frames']} step's time goes: {machine['cpu']} ({run['date']})\n")
    w(f"`make profile` (`benches/profile.rs`, `benches/tools/profile_report.py`): {who}, "
      f"{run['dtype']} on {run['device']}, model `{run['model']}`, steps of {run['chunk_frames']} "
      f"frame(s); code {machine.get('code', 'unknown')}; {machine['cores']} cores, "
      f"{machine['torch_threads']} torch threads; CPU flags: "
      f"{', '.join(machine['cpu_flags']) or 'none of avx2, fma, avx512'}"
      f"{'; limited by ' + ', '.join(machine['limits']) if machine.get('limits') else ''}.\n")
    w("| | ms per step (median) | s per audio s (every stream's) |")
    w("| --- | ---: | ---: |")
    w(f"| {len(run['step_ms'])} steps, perf sampling | {step_ms:.1f} | {per_audio:.3f} |")
    w(f"| {len(run['profiled_step_ms'])} steps under the op profiler | {profiled_ms:.1f} | "
      f"{profiled_ms / 1e3 / audio_per_step:.3f} |")
    w("")
    w("## Per stage (op profiler scopes, mean per step)\n")
    w("Stages by upstream's module names: `decoder.0` the vocoder's input conv, `decoder.1-4` its "
      "blocks, `decoder.5` the final SnakeBeta and conv.\n")
    w("| stage | ms | share |")
    w("| --- | ---: | ---: |")
    for name, ms in ops["stages_ms"].items():
        w(f"| {name} | {ms:.2f} | {ms / ops['step_ms']:.1%} |")
    staged = sum(ops["stages_ms"].values())
    w(f"| between stages | {ops['step_ms'] - staged:.2f} | {(ops['step_ms'] - staged) / ops['step_ms']:.1%} |")
    w(f"| **step** | **{ops['step_ms']:.2f}** | |")
    w("")
    w("## Ops per step\n")
    w("| | per step | ms per step |")
    w("| --- | ---: | ---: |")
    w(f"| ops dispatched (every level: an op's own inner ops too) | {ops['ops_per_step']:.0f} | |")
    w(f"| ops our code calls (top level) | {ops['top_level_ops_per_step']:.0f} | "
      f"{ops['step_ms'] - ops['outside_ops_ms']:.2f} |")
    w(f"| of which views (no data moved: narrow, transpose, view, ...) | {ops['view_ops_per_step']:.0f} | "
      f"{ops['view_ops_ms']:.2f} |")
    w(f"| time in a step outside every op (Rust, tch's FFI, freeing tensors) | | {ops['outside_ops_ms']:.2f} |")
    w(f"| the engine's ops around the step (codes in, audio out) | {ops['engine_ops_per_step']:.0f} | "
      f"{ops['engine_ops_ms']:.2f} |")
    w("")
    w("## Per op (top level: the ops our code calls, their inner ops included)\n")
    w("| op | calls per step | ms per step | share of step |")
    w("| --- | ---: | ---: | ---: |")
    for name, row in list(ops["top_level_ops"].items())[:25]:
        w(f"| `{name}` | {row['per_step']:.0f} | {row['ms']:.2f} | {row['ms'] / ops['step_ms']:.1%} |")
    w("")
    w("## Per op, self time (every level, inner ops' time taken out)\n")
    w("| op | calls per step | ms per step | share of step |")
    w("| --- | ---: | ---: | ---: |")
    for name, row in list(ops["self_time"].items())[:20]:
        w(f"| `{name}` | {row['per_step']:.0f} | {row['ms']:.2f} | {row['ms'] / ops['step_ms']:.1%} |")
    w("")
    if perf is None:
        w("## perf\n\nNo perf samples (perf missing or not allowed here).\n")
        return "\n".join(out)
    w(f"## Per thread (perf, {perf['samples']} samples of the timed steps, {perf['seconds']:.1f} s)\n")
    w("Where each thread was, as a share of its own samples; the compute thread runs every op and "
      "its share of each parallel one, the OpenMP workers their share of the parallel ones.\n")
    for role, row in sorted(perf["by_role"].items(), key=lambda kv: -kv[1]["samples"]):
        if row["samples"] < 0.02 * perf["samples"]:
            continue
        w(f"**{role}** ({row['samples']} samples)\n")
        w("| where | share |")
        w("| --- | ---: |")
        for name, count in row["categories"].items():
            w(f"| {name} | {count / row['samples']:.1%} |")
        w("")
    w("## Hottest symbols (perf, all threads)\n")
    w("| symbol | library | share |")
    w("| --- | --- | ---: |")
    for row in perf["top_symbols"]:
        symbol = row["symbol"].replace("|", "\\|")
        w(f"| `{symbol[:90]}` | {row['dso']} | {row['share']:.1%} |")
    w("")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--perf", type=Path)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    run = json.loads((args.run_dir / "run.json").read_text())
    ops = op_profile(read_events(args.run_dir / "events.tsv"))
    perf = perf_profile(args.perf, run) if args.perf else None
    text = markdown(run, ops, perf)
    out = args.out_dir / run["result"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        {"run": {k: v for k, v in run.items() if k not in ("step_ms", "profiled_step_ms")},
         "step_ms_median": statistics.median(run["step_ms"]),
         "op_profile": ops, "perf": perf}, indent=1))
    print(text)
    print(f"written: {out}.{{md,json}}", file=sys.stderr)


if __name__ == "__main__":
    main()
