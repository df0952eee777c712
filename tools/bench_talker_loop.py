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

    python tools/bench_talker_loop.py [--geometry tiny,0.6b] [--model DIR ...] [--dtypes f32,bf16]

The report goes to measurements/results/<cpu>/talker-loop.md and .json (--out names another
folder for measurements/results; benches/tools/results.py).
"""

import argparse
import json
import os
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


def timed(frames):
    """Run a frame generator to its end: (codes, TTFF s, steady frames/s by the clock and by
    CPU time over frames 2..N)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    codes, first, first_cpu = [], None, None
    for frame in frames:
        codes.append(frame)
        if first is None:
            first, first_cpu = time.perf_counter(), time.process_time()
    end, cpu_end = time.perf_counter(), time.process_time()
    steady = len(codes) - 1
    if first is None or steady < 1:
        raise RuntimeError(f"made {len(codes)} frames, need at least 2")
    return codes, first - start, steady / (end - first), steady / (cpu_end - first_cpu)


def measure(model_dir, dtype, frames, large_frames, rounds, seed):
    import torch

    import qwencodec_talker as qt
    from qwencodec_talker import loop

    model = qt.load_model(model_dir, dtype=getattr(torch, DTYPES[dtype]))
    if model.config.talker_config.hidden_size >= 512:
        frames = large_frames
    with torch.no_grad():
        model.talker.codec_head.weight[model.config.talker_config.codec_eos_token_id] = 0
    speaker = next(iter(model.config.talker_config.spk_id or {}), None)
    prompt = dict(input_ids=torch.tensor([PROMPT]), speaker=speaker, language="english")
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
            codes[name], ttff, fps, cpu_fps = timed(runs[name]())
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
    return dict(model=str(model_dir), name=model_dir.name, dtype=dtype, frames=frames,
                config=dict(talker_hidden=model.config.talker_config.hidden_size,
                            talker_layers=model.config.talker_config.num_hidden_layers,
                            predictor_hidden=model.config.talker_config.code_predictor_config.hidden_size,
                            predictor_layers=model.config.talker_config.code_predictor_config.num_hidden_layers),
                same_codes=equal, **summary,
                speedup=summary["ours"]["median"]["fps"] / summary["upstream"]["median"]["fps"],
                cpu_speedup=summary["ours"]["median"]["cpu_fps"] / summary["upstream"]["median"]["cpu_fps"])


def markdown(report):
    lines = [f"# Talker loop: ours against upstream's generate ({report['machine']['cpu']}, "
             f"{report['machine']['cores']} cores)", "",
             f"{report['date']}, commit {report['commit']}, torch {report['torch']}, "
             f"transformers {report['transformers']}, {report['threads']} torch thread(s); "
             f"load average {report['load_before']} before, {report['load_after']} after "
             "(other work shared the machine: read the CPU-time columns for an idle core).", "",
             f"`{report['command']}`", "",
             "Medians over the rounds; ours and upstream's in turns, the order swapped each round. "
             "TTFF: call to first frame; frames/s over frames 2..N; RTF: a frame's time / 80 ms.", "",
             "| talker | dtype | frames | TTFF ms ours / upstream | frames/s ours / upstream | "
             "by CPU time | RTF ours / upstream (CPU time) | speed-up (CPU time) | same codes |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in report["runs"]:
        ours, up = run["ours"]["median"], run["upstream"]["median"]
        lines.append(
            f"| {run['name']} | {run['dtype']} | {run['frames']} | {ours['ttff_s'] * 1000:.1f} / "
            f"{up['ttff_s'] * 1000:.1f} | {ours['fps']:.1f} / {up['fps']:.2f} | "
            f"{ours['cpu_fps']:.1f} / {up['cpu_fps']:.2f} | {ours['rtf']:.2f} / {up['rtf']:.2f} "
            f"({ours['cpu_rtf']:.2f} / {up['cpu_rtf']:.2f}) | {run['speedup']:.1f}x "
            f"({run['cpu_speedup']:.1f}x) | {'yes' if run['same_codes'] else 'NO'} |")
    lines += ["", "Every round:", ""]
    for run in report["runs"]:
        for name in ("ours", "upstream"):
            rows = ", ".join(f"{row['fps']:.1f} ({row['cpu_fps']:.1f})" for row in run[name]["rounds"])
            lines.append(f"- {run['name']} {run['dtype']} {name}: frames/s (by CPU time) {rows}")
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch
    import transformers

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
                  load_before=loadavg(), runs=[])
    geometries = [g for g in args.geometry.split(",") if g]
    unknown = [g for g in geometries if g not in ("tiny", "0.6b", "1.7b")]
    if unknown or not (geometries or args.model):
        sys.exit(f"bench_talker_loop: geometries {unknown or 'none'}; known: tiny, 0.6b, 1.7b")
    with tempfile.TemporaryDirectory() as tmp:
        models = list(args.model)
        for geometry in geometries:
            made = Path(tmp) / f"{geometry}-custom-voice"
            subprocess.run([sys.executable, str(ROOT / "tools" / "make_talker_fixture.py"), "--kind",
                            "custom_voice", "--geometry", geometry, "--out", str(made)],
                           check=True, capture_output=True)
            models.append(made)
        for model_dir in models:
            for dtype in dtypes:
                report["runs"].append(measure(model_dir, dtype, args.frames, args.large_frames,
                                              args.rounds, args.seed))
    report["load_after"] = loadavg()
    path = result_path(args.out, machine, "talker-loop")
    path.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {path}.md and .json")


if __name__ == "__main__":
    main()
