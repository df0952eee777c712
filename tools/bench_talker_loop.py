#!/usr/bin/env python3
"""Our talker loop (qwencodec_talker.loop) against upstream's generate, timed in turns.

For each talker folder (--model) or random CustomVoice talker of tools/make_talker_fixture.py
made in a temp folder (--geometry: tiny, where the loop's own cost is nearly all there is;
0.6b and 1.7b, the released shapes) and dtype, in
--rounds rounds, each running our loop and upstream's generate (streamed by
qwencodec_talker.stream_codes, as the command line does today) one after the other, the
order swapped every round so that a busy machine slows both alike: the time from the call to
the first frame (TTFF), frames a second over frames 2..N by the clock and by the process's CPU
time (what an idle core would take, near enough, when other work shares the machine), and the
real-time factor (a frame's time / its 80 ms). The same fixed prompt and seed, upstream's
default sampling; the codec head's EOS row is zeroed so every run makes its N frames, and each
round checks that both made the same codes. The figures are medians over the rounds.

Then, with --texts (default 1,2,4,8), `loop.Batch` with each count of different texts started
together, the counts in turns: a step's time (one frame of every text) by the clock and CPU
time, its code-predictor and talker parts, the cost against one text, and whether the first
text made its codes alone. Beside them: the bytes of weights a frame reads (talker once, code
predictor once a sub-step) against the rate a plain sum reads memory (1 and 2 threads), the
GB/s one matrix product reads at 1-8 rows in each dtype, and the torch operations the loop
calls from Python a frame (the profiler's top-level events).

--device cuda (or cuda:N) loads the talker and makes every tensor on that GPU, as
tools/gpu-check.sh runs it. Each frame comes out as Python ints, which waits for the GPU, and
each timing starts and ends after a torch.cuda.synchronize, so the figures are the GPU's; "by
CPU time" is then the host process's CPU time (launching kernels and waiting on them). The
memory-bandwidth and matrix-product measurements are the CPU's and are left out there; the
operations a frame are those called from Python, on either device; --threads sets torch's CPU
threads. Codes that differ from upstream's, or a batched part that fails, make the script exit
1 after it writes the report (batched codes that part from the solo run's are only reported:
other rows in a product can round a row differently).

    python tools/bench_talker_loop.py [--geometry tiny,0.6b] [--model DIR ...] [--dtypes f32,bf16]
        [--texts 1,2,4,8] [--no-upstream] [--rounds 3] [--device cuda]

The report goes to measurements/results/<cpu>/talker-loop.md and .json, on a GPU to
talker-loop-<device>.md and .json (--out names another folder for measurements/results;
benches/tools/results.py).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "tools"))
sys.path.insert(0, str(ROOT / "python"))
from results import RESULTS, result_path, this_machine  # noqa: E402

DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
FRAME_S = 0.08
# The assistant prompt of benches/tools/bench_talker.py: role tokens, 12 text tokens, chat tail.
PROMPT = [151644, 77091, 198, *range(1000, 1012), 151645, 198, 151644, 77091, 198]


def loadavg():
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def synchronizer(device):
    """A function that waits for `device`'s queued work (CUDA), else does nothing: a timing
    ends after it, not when the kernels are merely queued."""
    import torch

    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def make_talkers(geometries, folder):
    """Random CustomVoice talkers of `geometries` (tiny, 0.6b, 1.7b) made in `folder` by
    tools/make_talker_fixture.py: their folders."""
    made = []
    for geometry in geometries:
        talker = Path(folder) / f"{geometry}-custom-voice"
        made_it = subprocess.run([sys.executable, str(ROOT / "tools" / "make_talker_fixture.py"), "--kind",
                                  "custom_voice", "--geometry", geometry, "--out", str(talker)],
                                 capture_output=True, text=True)
        # Its errors shown: on a GPU host run once, they are all there is to go on.
        if made_it.returncode != 0:
            sys.exit(f"make_talker_fixture.py --geometry {geometry} failed:\n{made_it.stderr}")
        made.append(talker)
    return made


def write_report(out, machine, benchmark, report, markdown):
    """The report as `benchmark`'s result of `machine` under `out` (.json, and .md as
    `markdown` writes it), the summary printed."""
    path = result_path(out, machine, benchmark)
    path.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {path}.md and .json")


def timed(frames, sync=lambda: None):
    """Run a frame generator to its end: (codes, TTFF s, steady frames/s by the clock and by
    CPU time over frames 2..N). `sync` (see `synchronizer`) before the start and the end: a run
    neither pays for work queued before it nor ends before its own; each frame, Python ints,
    has waited for the device."""
    sync()
    start, cpu_start = time.perf_counter(), time.process_time()
    codes, first, first_cpu = [], None, None
    for frame in frames:
        codes.append(frame)
        if first is None:
            first, first_cpu = time.perf_counter(), time.process_time()
    sync()
    end, cpu_end = time.perf_counter(), time.process_time()
    steady = len(codes) - 1
    if first is None or steady < 1:
        raise RuntimeError(f"made {len(codes)} frames, need at least 2")
    return codes, first - start, steady / (end - first), steady / (cpu_end - first_cpu)


def load(model_dir, dtype, device="cpu"):
    """The talker in `dtype` on `device`, its codec head's EOS row zeroed so every run makes its
    frames."""
    import torch

    import qwencodec_talker as qt

    model = qt.load_model(model_dir, dtype=getattr(torch, DTYPES[dtype]), device=device)
    with torch.no_grad():
        model.talker.codec_head.weight[model.config.talker_config.codec_eos_token_id] = 0
    return model


def measure(model, model_dir, dtype, frames, rounds, seed, sync=lambda: None):
    import torch

    import qwencodec_talker as qt
    from qwencodec_talker import loop

    speaker = next(iter(model.config.talker_config.spk_id or {}), None)
    prompt = dict(input_ids=torch.tensor([PROMPT], device=model.device), speaker=speaker, language="english")
    gen = qt.generate_kwargs(model, max_new_tokens=frames + 1)
    runs = {"ours": lambda: loop.stream_codes(model, seed=seed, **prompt, **gen),
            "upstream": lambda: qt.stream_codes(model, seed=seed, **prompt, **gen)}
    warm = qt.generate_kwargs(model, max_new_tokens=4)
    list(loop.stream_codes(model, seed=seed, **prompt, **warm))
    list(qt.stream_codes(model, seed=seed, **prompt, **warm))
    results = {name: [] for name in runs}
    equal = True
    for index in range(rounds):
        order = list(runs) if index % 2 == 0 else list(reversed(runs))
        codes = {}
        for name in order:
            load_before = loadavg()[0]
            codes[name], ttff, fps, cpu_fps = timed(runs[name](), sync)
            results[name].append(dict(frames=len(codes[name]), ttff_s=ttff, fps=fps, cpu_fps=cpu_fps,
                                      load=load_before))
            print(f"  {model_dir.name} {dtype} round {index + 1} {name}: {len(codes[name])} frames, "
                  f"TTFF {ttff * 1000:.1f} ms, {fps:.1f} frames/s ({cpu_fps:.1f} by CPU time), "
                  f"load {load_before:.1f}", flush=True)
        equal = equal and codes["ours"] == codes["upstream"]
    summary = {}
    for name, rows in results.items():
        median = {key: statistics.median(row[key] for row in rows) for key in ("ttff_s", "fps", "cpu_fps")}
        median["rtf"] = 1 / (median["fps"] * FRAME_S)
        median["cpu_rtf"] = 1 / (median["cpu_fps"] * FRAME_S)
        summary[name] = dict(median=median, rounds=rows)
    return dict(same_codes=equal, **summary,
                speedup=summary["ours"]["median"]["fps"] / summary["upstream"]["median"]["fps"],
                cpu_speedup=summary["ours"]["median"]["cpu_fps"] / summary["upstream"]["median"]["cpu_fps"])


def texts(count, device="cpu"):
    """`count` different 12-token texts in PROMPT's assistant prompt, on `device`."""
    import torch

    return [torch.tensor([[*PROMPT[:3], *range(1000 + 97 * i, 1012 + 97 * i), *PROMPT[15:]]], device=device)
            for i in range(count)]


def weight_bytes(model):
    """Bytes of weights a frame reads: the talker's layers, final norm and codec head once; the
    code predictor's layers, final norm and input projection once a sub-step (15), and each
    sub-step's own head. The embeddings' few rows and the caches are left out."""
    talker = model.talker
    predictor = talker.code_predictor

    def size(*modules):
        return sum(p.numel() * p.element_size() for module in modules for p in module.parameters())

    steps = talker.config.num_code_groups - 1
    return dict(talker=size(talker.model.layers, talker.model.norm, talker.codec_head),
                predictor=steps * size(predictor.model.layers, predictor.model.norm,
                                       predictor.small_to_mtp_projection) + size(predictor.lm_head))


def bandwidth(threads, megabytes=512, repeats=7):
    """GB/s the CPU reads (a sum over a buffer far larger than its caches) and copies (bytes read
    and written), best of `repeats`, with `threads` torch threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    read = copy = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        source.sum()
        read = min(read, time.perf_counter() - start)
        start = time.perf_counter()
        target.copy_(source)
        copy = min(copy, time.perf_counter() - start)
    torch.set_num_threads(before)
    size = source.numel() * 4
    return dict(threads=threads, read_gbs=size / read / 1e9, copy_gbs=2 * size / copy / 1e9)


def products(dtype, threads, rows=(1, 2, 4, 8), repeats=5):
    """GB/s of weights torch's CPU products read with a few rows: a linear of the code
    predictor's MLP shape (1024 to 3072, as at 0.6B) over 24 matrices (302 MB in f32), so that
    the weights come from memory; best of `repeats`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(3072, 1024, generator=generator).to(getattr(torch, DTYPES[dtype])) for _ in range(24)]
    size = sum(weight.numel() * weight.element_size() for weight in weights)
    out = {}
    for count in rows:
        inputs = torch.randn(count, 1024, generator=generator).to(weights[0].dtype)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for weight in weights:
                torch.nn.functional.linear(inputs, weight)
            best = min(best, time.perf_counter() - start)
        out[count] = size / best / 1e9
    torch.set_num_threads(before)
    return dict(dtype=dtype, threads=threads, gbs=out)


def ops_per_frame(model, seed):
    """Torch operations our loop calls from Python a frame (the profiler's top-level events, over
    the frames 6..15 of one text): what the eager loop's per-operation cost multiplies."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import qwencodec_talker as qt
    from qwencodec_talker import loop

    speaker = next(iter(model.config.talker_config.spk_id or {}), None)
    counts = []
    for frames in (5, 15):
        gen = qt.generate_kwargs(model, max_new_tokens=frames + 1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            list(loop.stream_codes(model, input_ids=torch.tensor([PROMPT], device=model.device), speaker=speaker,
                                   language="english", seed=seed, **gen))
        counts.append(sum(event.cpu_parent is None for event in prof.events()))
    return (counts[1] - counts[0]) / 10


def measure_batched(model, model_dir, dtype, counts, frames, rounds, seed, sync=lambda: None):
    """`loop.Batch` with each count of texts, started together, the counts in turns (the order
    reversed every round): the time from the first `add` to the first step's end, then a step's
    time over steps 2..N by the clock and by CPU time, and its code predictor's and talker's
    parts (clock; each part ends with `sync`, as a step does with its codes as ints). Each
    count's first text must make the codes it makes alone."""
    import torch

    import qwencodec_talker as qt
    from qwencodec_talker import loop

    speaker = next(iter(model.config.talker_config.spk_id or {}), None)
    gen = qt.generate_kwargs(model, max_new_tokens=frames + 1)
    inputs = texts(max(counts), model.device)
    results = {count: [] for count in counts}
    first_codes = {}
    for index in range(rounds):
        for count in counts if index % 2 == 0 else list(reversed(counts)):
            batch = loop.Batch(model)
            spent = dict(_predict=0.0, _talker_step=0.0)

            def timing(name, method):
                def timed_part(*args):
                    start = time.perf_counter()
                    try:
                        return method(*args)
                    finally:
                        sync()
                        spent[name] += time.perf_counter() - start
                return timed_part

            for name in spent:
                setattr(batch, name, timing(name, getattr(batch, name)))
            load_before = loadavg()[0]
            sync()
            start, cpu_start = time.perf_counter(), time.process_time()
            keys = [batch.add(input_ids=inputs[i], speaker=speaker, language="english", seed=seed + i, **gen)
                    for i in range(count)]
            made = {key: [] for key in keys}
            steps, first, first_cpu = 0, None, None
            while len(batch):
                step_frames, _ = batch.step()
                for key, frame in step_frames.items():
                    made[key].append(frame)
                steps += 1
                if first is None:
                    first, first_cpu = time.perf_counter(), time.process_time()
                    spent = dict.fromkeys(spent, 0.0)
            sync()
            end, cpu_end = time.perf_counter(), time.process_time()
            if steps < 2 or any(len(codes) != frames for codes in made.values()):
                raise RuntimeError(f"{count} texts made {[len(c) for c in made.values()]} frames, want {frames}")
            first_codes.setdefault(count, made[keys[0]])
            steady = steps - 1
            row = dict(first_s=first - start, step_s=(end - first) / steady,
                       cpu_step_s=(cpu_end - first_cpu) / steady, predictor_s=spent["_predict"] / steady,
                       talker_s=spent["_talker_step"] / steady, load=load_before)
            results[count].append(row)
            print(f"  {model_dir.name} {dtype} round {index + 1} {count} texts batched: step "
                  f"{row['step_s'] * 1000:.1f} ms ({row['cpu_step_s'] * 1000:.1f} by CPU time; code predictor "
                  f"{row['predictor_s'] * 1000:.1f}, talker {row['talker_s'] * 1000:.1f}), first frames "
                  f"{row['first_s'] * 1000:.0f} ms, load {load_before:.1f}", flush=True)
    out = []
    for count, rows in results.items():
        median = {key: statistics.median(row[key] for row in rows)
                  for key in ("first_s", "step_s", "cpu_step_s", "predictor_s", "talker_s")}
        out.append(dict(texts=count, median=median, rounds=rows,
                        same_codes_as_alone=first_codes[count] == first_codes[min(counts)]))
    one = out[0]["median"]
    for entry in out:
        entry["cost_vs_one"] = entry["median"]["step_s"] / one["step_s"]
        entry["cpu_cost_vs_one"] = entry["median"]["cpu_step_s"] / one["cpu_step_s"]
    return out


def markdown(report):
    machine = f"{report['machine']['cpu']}, {report['machine']['cores']} cores"
    device = report.get("device", "cpu")
    if device == "cpu":
        where = machine
        # The benchmark's own threads count in the load after it.
        busy = report["load_before"][0] > 0.5 or report["load_after"][0] > report["threads"] + 0.5
        load = ("(other work shared the machine: read the CPU-time columns for an idle core)." if busy
                else "(nothing else ran: the load after is the benchmark's own threads).")
    else:
        where = f"{report['gpu']} ({device}) on {machine}"
        load = ("(on the GPU, CPU time is the host process's: launching the kernels and waiting "
                "for them).")
    lines = [f"# Talker loop: ours against upstream's generate ({where})", "",
             f"{report['date']}, commit {report['commit']}, torch {report['torch']}, "
             f"transformers {report['transformers']}, {report['threads']} torch thread(s); "
             f"load average {report['load_before']} before, {report['load_after']} after {load}", "",
             f"`{report['command']}`", "",
             "Medians over the rounds; ours and upstream's in turns, the order swapped each round. "
             "TTFF: call to first frame; frames/s over frames 2..N; RTF: a frame's time / 80 ms.", "",
             "| talker | dtype | frames | TTFF ms ours / upstream | frames/s ours / upstream | "
             "by CPU time | RTF ours / upstream (CPU time) | speed-up (CPU time) | same codes |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in report["runs"]:
        if "ours" not in run:
            continue
        ours, up = run["ours"]["median"], run["upstream"]["median"]
        lines.append(
            f"| {run['name']} | {run['dtype']} | {run['frames']} | {ours['ttff_s'] * 1000:.1f} / "
            f"{up['ttff_s'] * 1000:.1f} | {ours['fps']:.1f} / {up['fps']:.2f} | "
            f"{ours['cpu_fps']:.1f} / {up['cpu_fps']:.2f} | {ours['rtf']:.2f} / {up['rtf']:.2f} "
            f"({ours['cpu_rtf']:.2f} / {up['cpu_rtf']:.2f}) | {run['speedup']:.1f}x "
            f"({run['cpu_speedup']:.1f}x) | {'yes' if run['same_codes'] else 'NO'} |")
    lines += ["", "Torch operations our loop calls from Python a frame (one text; the profiler's top-level "
              "events): " + "; ".join(f"{run['name']} {run['dtype']} {run['ops_per_frame']:.0f}"
                                      for run in report["runs"]) + "."]
    failed = [run for run in report["runs"] if run.get("batched_error")]
    if failed:
        lines += ["", "Batched part failed: " + "; ".join(f"{run['name']} {run['dtype']}: {run['batched_error']}"
                                                          for run in failed) + "."]
    batched = [run for run in report["runs"] if run.get("batched")]
    if batched:
        lines += ["", "## Many texts in one step", "",
                  "`loop.Batch` with N texts started together, the counts in turns (order reversed each "
                  "round); medians. First frames: from the first `add` (each text's prompt runs alone) to "
                  "the end of the first step, which makes every text's first frame. A step makes one frame "
                  "of each text; its code predictor and talker parts by the clock. Cost: a step's time over "
                  "one text's step. Same codes: the first text's frames equal its run alone.", "",
                  "| talker | dtype | texts | first frames ms | step ms (CPU) | frames/s, all texts (CPU) | "
                  "RTF a text (CPU) | cost vs one text (CPU) | code predictor / talker ms | same codes |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for run in batched:
            for entry in run["batched"]:
                m, n = entry["median"], entry["texts"]
                lines.append(
                    f"| {run['name']} | {run['dtype']} | {n} | {m['first_s'] * 1000:.0f} | "
                    f"{m['step_s'] * 1000:.1f} ({m['cpu_step_s'] * 1000:.1f}) | {n / m['step_s']:.2f} "
                    f"({n / m['cpu_step_s']:.2f}) | {m['step_s'] / FRAME_S:.2f} ({m['cpu_step_s'] / FRAME_S:.2f}) | "
                    f"{entry['cost_vs_one']:.2f} ({entry['cpu_cost_vs_one']:.2f}) | "
                    f"{m['predictor_s'] * 1000:.1f} / {m['talker_s'] * 1000:.1f} | "
                    f"{'yes' if entry['same_codes_as_alone'] else 'NO'} |")
    if report.get("bandwidth"):
        lines += ["", "## Weights read a frame against what the cores read", "",
                  "Memory: " + "; ".join(f"{b['threads']} thread(s) read {b['read_gbs']:.1f} GB/s (a sum over "
                                         f"512 MB), copy {b['copy_gbs']:.1f} GB/s (read + written)"
                                         for b in report["bandwidth"]) + ".",
                  "Bound: a part's weights / the read rate at the benchmark's thread count; measured: one "
                  "text's step parts (clock, medians).", "",
                  "| talker | dtype | MB a frame: talker / code predictor | bound ms: talker / code predictor | "
                  "measured ms | measured / bound |",
                  "| --- | --- | ---: | ---: | ---: | ---: |"]
        rate = next(b["read_gbs"] for b in report["bandwidth"] if b["threads"] == report["threads"]) * 1e9
        for run in batched:
            weights, m = run["weights"], run["batched"][0]["median"]
            bound = (weights["talker"] / rate, weights["predictor"] / rate)
            lines.append(
                f"| {run['name']} | {run['dtype']} | {weights['talker'] / 1e6:.0f} / {weights['predictor'] / 1e6:.0f} | "
                f"{bound[0] * 1000:.1f} / {bound[1] * 1000:.1f} | {m['talker_s'] * 1000:.1f} / "
                f"{m['predictor_s'] * 1000:.1f} | {m['talker_s'] / bound[0]:.1f} / {m['predictor_s'] / bound[1]:.1f} |")
    if report.get("products"):
        lines += ["", "One matrix product's weights read a second (GB/s), by rows: a linear of the code "
                  "predictor's MLP shape (1024 to 3072) over 24 matrices, so the weights come from memory; "
                  f"{report['threads']} thread(s).", "",
                  "| dtype | " + " | ".join(f"{n} row{'s' if n > 1 else ''}" for n in report["products"][0]["gbs"]) + " |",
                  "| --- |" + " ---: |" * len(report["products"][0]["gbs"])]
        for entry in report["products"]:
            lines.append(f"| {entry['dtype']} | " + " | ".join(f"{v:.1f}" for v in entry["gbs"].values()) + " |")
    lines += ["", "Every round:", ""]
    for run in report["runs"]:
        for name in ("ours", "upstream"):
            if name not in run:
                continue
            rows = ", ".join(f"{row['fps']:.1f} ({row['cpu_fps']:.1f})" for row in run[name]["rounds"])
            lines.append(f"- {run['name']} {run['dtype']} {name}: frames/s (by CPU time) {rows}")
        for entry in run.get("batched", []):
            rows = ", ".join(f"{row['step_s'] * 1000:.1f} ({row['cpu_step_s'] * 1000:.1f})" for row in entry["rounds"])
            lines.append(f"- {run['name']} {run['dtype']} {entry['texts']} texts batched: step ms (by CPU time) {rows}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", type=Path, default=[],
                        help="a talker folder (repeatable)")
    parser.add_argument("--geometry", default="tiny",
                        help="random CustomVoice talkers made here, comma-separated: tiny, 0.6b, 1.7b "
                             "(\"\" for none)")
    parser.add_argument("--dtypes", default="f32")
    parser.add_argument("--frames", type=int, default=60, help="frames a run of the tiny talker")
    parser.add_argument("--large-frames", type=int, default=16,
                        help="frames a run of a larger talker (hidden size 512 or more)")
    parser.add_argument("--texts", default="1,2,4,8",
                        help="counts of texts batched by loop.Batch (\"\" for none)")
    parser.add_argument("--no-upstream", action="store_true",
                        help="leave out ours against upstream's generate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch
    import transformers

    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        sys.exit(f"bench_talker_loop: device {args.device}: cpu, cuda or cuda:N")
    cuda = args.device != "cpu"
    if cuda and not torch.cuda.is_available():
        sys.exit(f"bench_talker_loop: device {args.device}, but torch sees no CUDA device")
    sync = synchronizer(args.device)
    torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        sys.exit(f"bench_talker_loop: unknown dtypes {unknown}; known: {', '.join(DTYPES)}")
    machine = dict(this_machine(), cores=os.cpu_count())
    report = dict(machine=machine, date=time.strftime("%Y-%m-%d", time.gmtime()),
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                        capture_output=True).stdout.strip(),
                  torch=torch.__version__, transformers=transformers.__version__, threads=args.threads,
                  command="python " + " ".join([f"tools/{Path(__file__).name}", *sys.argv[1:]]),
                  device=args.device, load_before=loadavg(), runs=[])
    if cuda:
        report["gpu"] = torch.cuda.get_device_name(args.device)
    geometries = [g for g in args.geometry.split(",") if g]
    unknown = [g for g in geometries if g not in ("tiny", "0.6b", "1.7b")]
    if unknown or not (geometries or args.model):
        sys.exit(f"bench_talker_loop: geometries {unknown or 'none'}; known: tiny, 0.6b, 1.7b")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        models = list(args.model) + make_talkers(geometries, tmp)
        counts = [int(n) for n in args.texts.split(",") if n]
        # The CPU's memory and products: what its frames are bound by; not a GPU's.
        if counts and not cuda:
            report["bandwidth"] = [bandwidth(threads) for threads in sorted({1, 2, args.threads})]
            report["products"] = [products(dtype, args.threads) for dtype in dtypes]
        for model_dir in models:
            for dtype in dtypes:
                model = load(model_dir, dtype, args.device)
                frames = args.large_frames if model.config.talker_config.hidden_size >= 512 else args.frames
                run = dict(model=str(model_dir), name=model_dir.name, dtype=dtype, frames=frames,
                           config=dict(talker_hidden=model.config.talker_config.hidden_size,
                                       talker_layers=model.config.talker_config.num_hidden_layers,
                                       predictor_hidden=model.config.talker_config.code_predictor_config.hidden_size,
                                       predictor_layers=model.config.talker_config.code_predictor_config.num_hidden_layers),
                           weights=weight_bytes(model))
                if not args.no_upstream:
                    run.update(measure(model, model_dir, dtype, frames, args.rounds, args.seed, sync))
                    if not run["same_codes"]:
                        failures.append(f"{run['name']} {dtype}: our codes are not upstream's")
                run["ops_per_frame"] = ops_per_frame(model, args.seed)
                if counts:
                    # A batched part that fails (a device it was never run on) is reported and
                    # fails the script at the end, without costing the other runs' figures.
                    try:
                        run["batched"] = measure_batched(model, model_dir, dtype, counts, frames, args.rounds,
                                                         args.seed, sync)
                    except Exception as error:
                        run["batched_error"] = f"{type(error).__name__}: {error}"
                        failures.append(f"{run['name']} {dtype} batched: {run['batched_error']}")
                report["runs"].append(run)
                del model
                if cuda:
                    torch.cuda.empty_cache()
    report["load_after"] = loadavg()
    # The CPU's result keeps its name; a GPU's is talker-loop-<device> beside it.
    benchmark = "talker-loop" if not cuda else f"talker-loop-{args.device.replace(':', '')}"
    write_report(args.out, machine, benchmark, report, markdown)
    if failures:
        sys.exit("bench_talker_loop: failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
