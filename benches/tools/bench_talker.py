#!/usr/bin/env python3
"""Measure the talker's speed: python/qwencodec_talker on upstream's code, per dtype and stream count.

For each checkpoint (a folder in the published layout, e.g. one of
tools/make_talker_fixture.py --geometry 0.6b|1.7b), each dtype and each number
of concurrent streams, this starts one worker process per stream (each with
cores/streams torch threads: separate processes so the streams share no
interpreter lock, as a server's worker processes would not), lets each load the
model and warm up (a 3-frame run), then starts them together on the same fixed
prompt and seed with upstream's default sampling, and reads back each frame's
arrival time: time to first frame (TTFF) from the call, steady frames per
second over frames 10..N, the real-time factor (time a frame takes / the 80 ms
it lasts; real time at 1.0 or below) and, from forward hooks, how a frame's
time splits between the talker's backbone, the code predictor's 15 sub-steps
(its forwards, and its `generate` call around them) and the rest of upstream's
loop. It also times the machine (matrix products per dtype, memory reads) and,
with --decoder, one decode step of qwencodecdec at chunk-frames 1 (GStreamer's
Python bindings), so time to first audio = TTFF + one decoder step. The report goes to
measurements/results/<cpu>/talker-speed.md and .json (--out names another folder for
measurements/results; benches/tools/results.py).

    PYTHONPATH=python python benches/tools/bench_talker.py --model /var/cache/qwencodec/fixtures/talker-0.6b \\
        --dtypes f32,bf16,f16 --streams 1,2 --frames 50
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import RESULTS, ROOT, result_path, this_machine  # noqa: E402

sys.path.insert(0, str(ROOT / "python"))

DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
FRAME_S = 0.08  # 12.5 frames a second
# The assistant prompt: role tokens, a 12-token text (a short sentence in
# Qwen's BPE), then the chat tail, as upstream's wrapper builds it.
PROMPT = [151644, 77091, 198, *range(1000, 1012), 151645, 198, 151644, 77091, 198]
STEADY_FROM = 10  # steady rate over frames 10..N (1-based)


def loadavg():
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def mem_available_bytes():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- geometry

def geometry(config):
    t = config["talker_config"]
    cp = t["code_predictor_config"]
    return dict(
        hidden=t["hidden_size"], inter=t["intermediate_size"], layers=t["num_hidden_layers"],
        heads=t["num_attention_heads"], kv=t["num_key_value_heads"], head_dim=t["head_dim"],
        vocab=t["vocab_size"], text_hidden=t["text_hidden_size"], text_vocab=t["text_vocab_size"],
        groups=t["num_code_groups"],
        cp_hidden=cp["hidden_size"], cp_inter=cp["intermediate_size"], cp_layers=cp["num_hidden_layers"],
        cp_heads=cp["num_attention_heads"], cp_kv=cp["num_key_value_heads"], cp_head_dim=cp["head_dim"],
        cp_vocab=cp["vocab_size"])


def layer_params(hidden, inter, heads, kv, head_dim):
    attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2  # q, o; k, v
    return attn + 3 * hidden * inter


def per_frame_cost(g, context):
    """Multiply-adds x 2 and weight elements read for one frame at a talker
    context of `context` positions: one talker step (28 layers + codec head)
    and the code predictor's generate call (a 2-position prefill, then 14
    one-position steps: 16 positions through its 5 layers, one of its 15
    heads a step, and at 1.7B the 2048 -> 1024 projection of each input)."""
    t_layer = layer_params(g["hidden"], g["inter"], g["heads"], g["kv"], g["head_dim"])
    talker_w = g["layers"] * t_layer + g["hidden"] * g["vocab"]
    talker_attn = g["layers"] * 4 * g["heads"] * g["head_dim"] * context
    cp_layer = layer_params(g["cp_hidden"], g["cp_inter"], g["cp_heads"], g["cp_kv"], g["cp_head_dim"])
    proj = g["hidden"] * g["cp_hidden"] if g["hidden"] != g["cp_hidden"] else 0
    subs = g["groups"] - 1  # 15 forwards
    positions = subs + 1  # the prefill carries 2
    cp_flops = 2 * (positions * (g["cp_layers"] * cp_layer + proj) + subs * g["cp_hidden"] * g["cp_vocab"])
    cp_attn = sum(g["cp_layers"] * 4 * g["cp_heads"] * g["cp_head_dim"] * c for c in range(2, positions + 1))
    # Weights read: every forward reads the code predictor's layers again
    # (their 79 M elements are far beyond the 32 MB L3).
    cp_read = subs * (g["cp_layers"] * cp_layer + proj + g["cp_hidden"] * g["cp_vocab"])
    return dict(talker_gflop=(2 * talker_w + talker_attn) / 1e9,
                code_predictor_gflop=(cp_flops + cp_attn) / 1e9,
                talker_weights=talker_w, code_predictor_weights_read=cp_read,
                talker_params_layers=g["layers"] * t_layer,
                code_predictor_params_layers=g["cp_layers"] * cp_layer)


def param_count(config):
    g = geometry(config)
    t_layer = layer_params(g["hidden"], g["inter"], g["heads"], g["kv"], g["head_dim"])
    cp_layer = layer_params(g["cp_hidden"], g["cp_inter"], g["cp_heads"], g["cp_kv"], g["cp_head_dim"])
    n = g["layers"] * t_layer + g["hidden"] * g["vocab"] * 2  # + codec embedding and head
    n += g["text_vocab"] * g["text_hidden"] + g["text_hidden"] ** 2 + g["text_hidden"] * g["hidden"]
    n += g["cp_layers"] * cp_layer + (g["groups"] - 1) * (g["cp_vocab"] * g["hidden"] + g["cp_hidden"] * g["cp_vocab"])
    if g["hidden"] != g["cp_hidden"]:
        n += g["hidden"] * g["cp_hidden"]
    return n


# ---------------------------------------------------------------- worker

def worker(args):
    import torch
    torch.set_num_threads(args.threads)
    from qwencodec_talker import load_model, stream_codes, generate_kwargs
    dtype = getattr(torch, DTYPES[args.dtype])
    t0 = time.perf_counter()
    model = load_model(args.model[0], dtype=dtype)
    load_s = time.perf_counter() - t0
    talker = model.talker
    predictor = talker.code_predictor

    steps = []  # one dict per talker forward
    current = {}

    def now():
        return time.perf_counter()

    def talker_pre(module, a, k):
        current.clear()
        current.update(start=now(), backbone=0.0, cp_fwd=0.0, cp_fwd_n=0, cp_gen=0.0, cp_layers=0.0)

    def talker_post(module, a, out):
        current["end"] = now()
        steps.append(dict(current))

    def timed(key):
        def pre(module, a, k=None):
            current[key + "_t"] = now()

        def post(module, a, out):
            current[key] = current.get(key, 0.0) + now() - current[key + "_t"]
            if key == "cp_fwd":
                current["cp_fwd_n"] = current.get("cp_fwd_n", 0) + 1
        return pre, post

    handles = [talker.register_forward_pre_hook(talker_pre, with_kwargs=True),
               talker.register_forward_hook(talker_post)]
    for module, key in ((talker.model, "backbone"), (predictor, "cp_fwd"), (predictor.model, "cp_layers")):
        pre, post = timed(key)
        handles += [module.register_forward_pre_hook(lambda m, a, k, pre=pre: pre(m, a, k), with_kwargs=True),
                    module.register_forward_hook(post)]
    generate = predictor.generate

    def timed_generate(*a, **k):
        start = now()
        try:
            return generate(*a, **k)
        finally:
            current["cp_gen"] = current.get("cp_gen", 0.0) + now() - start
    predictor.generate = timed_generate  # instance attribute: upstream's method untouched

    ids = torch.tensor([PROMPT])
    gen = generate_kwargs(model, max_new_tokens=args.frames + 1)

    def run(frames, seed, cap):
        steps.clear()
        times = []
        start = now()
        stream = stream_codes(model, input_ids=ids, language="english", speaker="vivian", seed=seed, **gen)
        try:
            for _ in stream:
                times.append(now() - start)
                if len(times) >= frames or (cap and times[-1] > cap):
                    break
        finally:
            stream.close()
        return times, start

    try:
        warm, _ = run(3, args.seed + 1000, 0)
        ready = dict(ready=True, load_s=load_s, warmup_frames_s=warm, threads=torch.get_num_threads(),
                     rss_gb=rss_gb())
    except Exception as error:  # reported as the row's error
        print(json.dumps(dict(ready=False, error=f"{type(error).__name__}: {error}")), flush=True)
        return
    print(json.dumps(ready), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    cpu0 = time.process_time()
    if args.in_process > 1:
        # Streams as threads of this process, sharing its weights. stream_codes'
        # hook is on the (shared) talker and would see every thread's frames, so
        # each thread calls upstream's generate itself and one hook files each
        # finished frame under the thread that made it (the per-step split is
        # not taken here; the threads share torch's global random generator).
        for h in handles:
            h.remove()
        predictor.generate = generate
        per_thread = {}

        class Stop(Exception):
            pass

        def frame_hook(module, a, out):
            mine = per_thread.get(threading.get_ident())
            if mine is None:
                return
            if out.hidden_states[1] is not None:
                mine["times"].append(now() - mine["start"])
                if len(mine["times"]) >= args.frames or mine["times"][-1] > args.time_cap:
                    raise Stop()
        hook = talker.register_forward_hook(frame_hook)
        outs = [None] * args.in_process

        def one(i):
            mine = dict(times=[], start=now())
            per_thread[threading.get_ident()] = mine
            try:
                model.generate(input_ids=[ids], instruct_ids=None, ref_ids=None, voice_clone_prompt=None,
                               languages=["english"], speakers=["vivian"], non_streaming_mode=False, **gen)
            except Stop:
                pass
            except Exception as error:
                outs[i] = dict(error=f"{type(error).__name__}: {error}")
                return
            outs[i] = dict(times=mine["times"], steps=[])
        torch.manual_seed(args.seed)
        pool = [threading.Thread(target=one, args=(i,)) for i in range(args.in_process)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        hook.remove()
        cpu = time.process_time() - cpu0
        for i, o in enumerate(outs):
            print(json.dumps(dict(o, threads=torch.get_num_threads(), rss_gb=rss_gb(), pid=os.getpid(),
                                  cpu_s=cpu if i == 0 else 0.0)), flush=True)
        return
    try:
        times, start = run(args.frames, args.seed, args.time_cap)
    except Exception as error:
        print(json.dumps(dict(error=f"{type(error).__name__}: {error}")), flush=True)
        return
    for h in handles:
        h.remove()
    rel = [dict(start=s["start"] - start, end=s["end"] - start, backbone=s.get("backbone", 0.0),
                cp_fwd=s.get("cp_fwd", 0.0), cp_fwd_n=s.get("cp_fwd_n", 0), cp_gen=s.get("cp_gen", 0.0),
                cp_layers=s.get("cp_layers", 0.0))
           for s in steps]
    print(json.dumps(dict(times=times, steps=rel, threads=torch.get_num_threads(), rss_gb=rss_gb(),
                          pid=os.getpid(), cpu_s=time.process_time() - cpu0)), flush=True)


def rss_gb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024 ** 2
    return 0.0


# ---------------------------------------------------------------- machine

def machine(threads_list):
    """Matrix products per dtype (GEMM at 1024^3, and GEMV at the talker's MLP
    shape) and memory reads, per thread count."""
    import torch
    out = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        row = dict(threads=threads)
        x = torch.ones(256 * 1024 * 1024 // 4 * 4)  # 1 GiB of float32
        x.sum()
        best = min(_time(lambda: x.sum()) for _ in range(5))
        row["read_gb_s"] = x.numel() * 4 / best / 1e9
        del x
        for name, dt in DTYPES.items():
            dtype = getattr(torch, dt)
            a = torch.randn(1024, 1024).to(dtype)
            b = torch.randn(1024, 1024).to(dtype)
            try:
                torch.mm(a, b)
                best = min(_time(lambda: torch.mm(a, b)) for _ in range(5))
                row[f"gemm_{name}_gflop_s"] = 2 * 1024 ** 3 / best / 1e9
                w = torch.randn(3072, 1024).to(dtype)
                v = torch.randn(1, 1024).to(dtype)
                torch.nn.functional.linear(v, w)
                best = min(_time(lambda: [torch.nn.functional.linear(v, w) for _ in range(20)]) for _ in range(5)) / 20
                row[f"gemv_{name}_us"] = best * 1e6
                row[f"gemv_{name}_gb_s"] = w.numel() * w.element_size() / best / 1e9
            except Exception as error:
                row[f"gemm_{name}_error"] = f"{type(error).__name__}: {error}"
        out.append(row)
    return out


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---------------------------------------------------------------- decoder

def decoder_step(model_path, plugin_path):
    """One qwencodecdec step at chunk-frames 1: the fixture's frames pushed at
    once, decoded a frame a step; a pad probe times each step's output."""
    code = f"""
import gi, json, statistics, time
gi.require_version("Gst", "1.0")
from gi.repository import Gst
Gst.init(None)
p = Gst.parse_launch("filesrc location={model_path}/codes.raw ! audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 "
                     "! qwencodecdec name=d model-path={model_path} chunk-frames=1 max-step-frames=1 ! fakesink")
stamps = []
p.get_by_name("d").get_static_pad("src").add_probe(Gst.PadProbeType.BUFFER, lambda pad, info: (stamps.append(time.perf_counter()), Gst.PadProbeReturn.OK)[1])
start = time.perf_counter()
p.set_state(Gst.State.PLAYING)
msg = p.get_bus().timed_pop_filtered(Gst.CLOCK_TIME_NONE, Gst.MessageType.EOS | Gst.MessageType.ERROR)
stats = p.get_by_name("d").get_property("stats")
p.set_state(Gst.State.NULL)
gaps = [b - a for a, b in zip(stamps, stamps[1:])][4:]
print(json.dumps(dict(ok=msg.type == Gst.MessageType.EOS, buffers=len(stamps),
                      median_step_ms=1e3 * statistics.median(gaps), mean_step_ms=stats.get_value("mean-step-ms"),
                      max_step_ms=stats.get_value("max-step-ms"), decode_steps=stats.get_value("decode-steps"),
                      first_output_s=stamps[0] - start)))
"""
    env = dict(os.environ, GST_PLUGIN_PATH=str(plugin_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        return dict(error=proc.stderr.strip().splitlines()[-1:] or ["failed"])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- orchestration

def busy_cpu_s():
    """CPU seconds all processes have run (user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def run_config(args, model, dtype, spec):
    """spec: STREAMS[xTHREADS][t]: t runs the streams as threads of one process."""
    spec = str(spec)
    force_threads = spec.endswith("t")
    spec = spec.rstrip("t")
    streams, _, per = spec.partition("x")
    streams = int(streams)
    cores = os.cpu_count()
    threads = int(per) if per else max(1, cores // streams)
    config = json.loads((Path(model) / "config.json").read_text())
    # Peak resident size measured: 1.5x the weights (loading converts the bfloat16 file) + 0.3 GB.
    need = (param_count(config) * {"f32": 4, "bf16": 2, "f16": 2}[dtype] * 1.5 + 0.5e9) * streams + 1e9
    row = dict(model=Path(model).name, dtype=dtype, streams=streams, threads_per_stream=threads,
               frames_requested=args.frames)
    in_process = 1
    if force_threads and streams > 1:
        in_process = streams
        row["mode"] = f"{streams} threads of one process"
    elif mem_available_bytes() < need:
        one = need / streams
        if streams > 1 and mem_available_bytes() > one:
            # Separate processes would not fit: the streams run as threads of one process instead.
            in_process = streams
            row["mode"] = (f"{streams} threads of one process (separate processes would need about "
                           f"{need / 1e9:.1f} GB, {mem_available_bytes() / 1e9:.1f} GB available)")
        else:
            row["error"] = f"not run: needs about {need / 1e9:.1f} GB, {mem_available_bytes() / 1e9:.1f} GB available"
            return row
    else:
        row["mode"] = f"{streams} process{'es' if streams > 1 else ''}"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT / "python"))
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--dtype", dtype, "--threads", str(threads),
           "--frames", str(args.frames), "--seed", str(args.seed), "--time-cap", str(args.time_cap),
           "--in-process", str(in_process)]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(streams // in_process)]
    stderr = [[] for _ in procs]
    readers = [threading.Thread(target=lambda p=p, s=s: s.extend(p.stderr), daemon=True)
               for p, s in zip(procs, stderr)]
    for r in readers:
        r.start()
    ready = []
    for p, s in zip(procs, stderr):
        line = p.stdout.readline()
        ready.append(json.loads(line) if line.strip() else dict(ready=False, error=_tail(s, p)))
    if not all(r.get("ready") for r in ready):
        for p in procs:
            p.kill()
            p.wait()
        row["error"] = next(r["error"] for r in ready if not r.get("ready"))
        return row
    row["load_s"] = [r["load_s"] for r in ready]
    row["cold_ttff_s"] = [r["warmup_frames_s"][0] if r["warmup_frames_s"] else None for r in ready]
    row["loadavg_before"] = loadavg()
    busy0, wall0 = busy_cpu_s(), time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p, s in zip(procs, stderr):
        for _ in range(in_process):
            line = p.stdout.readline()
            results.append(json.loads(line) if line.strip() else dict(error=_tail(s, p)))
        p.wait()
    row["loadavg_after"] = loadavg()
    busy = busy_cpu_s() - busy0
    ours = sum(r.get("cpu_s", 0.0) for r in results)
    row["cpu_s"] = dict(wall=round(time.perf_counter() - wall0, 2), all_processes=round(busy, 2),
                        workers=round(ours, 2), others=round(busy - ours, 2))
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        row["error"] = errors[0]
        return row
    row["threads_reported"] = [r["threads"] for r in results]
    row["peak_rss_gb"] = [round(r["rss_gb"], 2) for r in results]
    per = [summarize(r, config) for r in results]
    row["per_stream"] = per
    row["ttff_s"] = max(s["ttff_s"] for s in per)
    row["fps"] = min(s["fps"] for s in per)  # the slowest stream
    row["aggregate_fps"] = sum(s["fps"] for s in per)
    row["rtf"] = 12.5 / row["fps"]
    return row


def _tail(lines, proc):
    proc.wait()
    text = "".join(lines).strip().splitlines()
    useful = [l for l in text if "pad_token_id" not in l]
    return f"exit {proc.returncode}: " + (useful[-1] if useful else "no output")


def summarize(result, config):
    times = result["times"]
    n = len(times)
    if n > STEADY_FROM + 1:
        first = STEADY_FROM - 1
    else:
        first = 0
    fps = (n - 1 - first) / (times[-1] - times[first]) if n - 1 > first else float("nan")
    steps = result["steps"]
    if not steps:
        return dict(frames=n, ttff_s=times[0] if times else float("nan"), fps=fps,
                    steady_over=f"frames {first + 1}..{n}")
    # steps[0] is the prefill; step k (k >= 1) completes frame k-1. Steady steps: frames 10..N.
    steady = steps[STEADY_FROM:] if len(steps) > STEADY_FROM + 2 else steps[1:]
    period = [b["start"] - a["start"] for a, b in zip(steady, steady[1:])]
    # Means, so that the parts add up to the frame.
    med = lambda xs: 1e3 * statistics.fmean(xs) if xs else float("nan")  # noqa: E731
    split = dict(
        frame_ms=med(period),
        talker_forward_ms=med([s["end"] - s["start"] for s in steady]),
        backbone_ms=med([s["backbone"] for s in steady]),
        code_predictor_generate_ms=med([s["cp_gen"] for s in steady]),
        code_predictor_forwards_ms=med([s["cp_fwd"] for s in steady]),
        code_predictor_layers_ms=med([s["cp_layers"] for s in steady]),
        code_predictor_forwards_per_frame=statistics.median([s["cp_fwd_n"] for s in steady]) if steady else 0,
        prefill_ms=1e3 * (steps[0]["end"] - steps[0]["start"]) if steps else float("nan"),
    )
    split["code_predictor_machinery_ms"] = split["code_predictor_generate_ms"] - split["code_predictor_forwards_ms"]
    split["outside_talker_forward_ms"] = split["frame_ms"] - split["talker_forward_ms"]
    split["talker_forward_other_ms"] = (split["talker_forward_ms"] - split["backbone_ms"]
                                        - split["code_predictor_generate_ms"])
    g = geometry(config)
    context = len(PROMPT) + 8 + (STEADY_FROM + n) // 2  # prefill positions (about) + mean step
    cost = per_frame_cost(g, context)
    split["gflop_per_frame"] = cost["talker_gflop"] + cost["code_predictor_gflop"]
    split["talker_gflop"] = cost["talker_gflop"]
    split["code_predictor_gflop"] = cost["code_predictor_gflop"]
    split["achieved_gflop_s"] = split["gflop_per_frame"] / (split["frame_ms"] / 1e3)
    split["backbone_gflop_s"] = cost["talker_gflop"] / (split["backbone_ms"] / 1e3)
    split["code_predictor_forwards_gflop_s"] = cost["code_predictor_gflop"] / (split["code_predictor_forwards_ms"] / 1e3)
    return dict(frames=n, ttff_s=times[0] if times else float("nan"), fps=fps,
                steady_over=f"frames {first + 1}..{n}", split=split, cost=cost)


def wait_quiet(limit_s, below, hold_s, poll_s):
    """Wait until the 1-minute load average has stayed below `below` for
    `hold_s`, polling every `poll_s`, at most `limit_s`."""
    start = time.time()
    polls = []
    quiet_since = None
    while True:
        load = loadavg()[0]
        polls.append([round(time.time() - start), load])
        print(f"bench_talker: load {load:.2f}", file=sys.stderr, flush=True)
        if load < below:
            quiet_since = quiet_since if quiet_since is not None else time.time()
            if time.time() - quiet_since >= hold_s:
                return dict(quiet=True, waited_s=round(time.time() - start), polls=polls)
        else:
            quiet_since = None
        if time.time() - start >= limit_s:
            return dict(quiet=False, waited_s=round(time.time() - start), polls=polls)
        time.sleep(poll_s)


def markdown(report):
    lines = [f"# The talker's speed, {report['date']}", "",
             f"CPU: {report['cpu']}, {report['cores']} cores; torch {report['torch']}, transformers "
             f"{report['transformers']}; commit {report['commit']}; {report['frames']} frames asked a run, seed "
             f"{report['seed']}, upstream's default sampling.", ""]
    w = report.get("wait")
    if w:
        lines.append(f"Quiet wait: {'quiet' if w['quiet'] else 'NOT quiet'} after {w['waited_s']} s "
                     f"(1-minute load average below {report['quiet_below']} for {report['quiet_hold_s']} s).")
        lines.append("")
    lines += ["| model | dtype | streams x threads (how) | TTFF s (cold) | steady frames/s (slowest stream) | RTF | "
              "aggregate frames/s | frames | load avg before / after | CPU s: run's wall / all processes / others |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in report["runs"]:
        head = f"| {r['model']} | {r['dtype']} | {r['streams']} x {r['threads_per_stream']} ({r.get('mode', '')}) |"
        if "error" in r:
            lines.append(f"{head} error: {r['error']} | | | | | | |")
            continue
        cold = ", ".join(f"{c:.2f}" for c in r["cold_ttff_s"] if c is not None)
        frames = ", ".join(str(s["frames"]) for s in r["per_stream"])
        lines.append(f"{head} {r['ttff_s']:.2f} ({cold}) | {r['fps']:.2f} | {r['rtf']:.2f} | "
                     f"{r['aggregate_fps']:.2f} | {frames} | {r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f} | "
                     + (f"{r['cpu_s']['wall']:.1f} / {r['cpu_s']['all_processes']:.1f} / {r['cpu_s']['others']:.1f} |"
                        if "cpu_s" in r else "– |"))
    lines += ["", "Where a steady frame's time goes (means over frames 10..N, or 2..N where fewer; one stream; ms):", "",
              "| model | dtype | threads | frame | talker backbone | code predictor generate (15 forwards, of which its 5 layers / machinery) | "
              "rest of talker forward | outside the talker's forward | GFLOP a frame | achieved GFLOP/s (backbone / code predictor forwards) |",
              "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in report["runs"]:
        if "error" in r or r["streams"] != 1 or "split" not in r["per_stream"][0]:
            continue
        s = r["per_stream"][0]["split"]
        lines.append(f"| {r['model']} | {r['dtype']} | {r['threads_per_stream']} | {s['frame_ms']:.1f} | {s['backbone_ms']:.1f} | "
                     f"{s['code_predictor_generate_ms']:.1f} ({s['code_predictor_forwards_ms']:.1f}, "
                     f"{s['code_predictor_layers_ms']:.1f} / "
                     f"{s['code_predictor_machinery_ms']:.1f}) | {s['talker_forward_other_ms']:.1f} | "
                     f"{s['outside_talker_forward_ms']:.1f} | {s['gflop_per_frame']:.2f} | "
                     f"{s['achieved_gflop_s']:.1f} ({s['backbone_gflop_s']:.1f} / {s['code_predictor_forwards_gflop_s']:.1f}) |")
    if report.get("machine"):
        lines += ["", "Machine (best of 5): 1 GiB f32 read, GEMM 1024^3, GEMV 1x1024 @ 1024x3072:", "",
                  "| threads | read GB/s | GEMM f32 / bf16 / f16 GFLOP/s | GEMV f32 / bf16 / f16 us (GB/s of weights) |",
                  "| ---: | ---: | --- | --- |"]
        for m in report["machine"]:
            gemm = " / ".join(f"{m.get(f'gemm_{d}_gflop_s', float('nan')):.1f}" for d in DTYPES)
            gemv = " / ".join(f"{m.get(f'gemv_{d}_us', float('nan')):.0f} ({m.get(f'gemv_{d}_gb_s', float('nan')):.1f})"
                              for d in DTYPES)
            lines.append(f"| {m['threads']} | {m['read_gb_s']:.1f} | {gemm} | {gemv} |")
    d = report.get("decoder")
    if d:
        lines += ["", f"Decoder (qwencodecdec, {d.get('model_path')}, chunk-frames 1): "
                  + (f"median step {d['median_step_ms']:.1f} ms, mean {d['mean_step_ms']:.1f} ms over "
                     f"{d['decode_steps']} steps (max {d['max_step_ms']:.1f}); load avg "
                     f"{d['loadavg_before'][0]:.2f} / {d['loadavg_after'][0]:.2f}"
                     if "error" not in d else f"error: {d['error']}")]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", action="append", default=[], help="checkpoint folder; repeat for several")
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--in-process", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dtypes", default="f32,bf16,f16")
    parser.add_argument("--streams", default="1,2",
                        help="runs, each STREAMS[xTHREADS][t]: THREADS torch threads a stream (default "
                             "cores/STREAMS), t: the streams as threads of one process")
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-cap", type=float, default=90.0,
                        help="stop a stream after this many seconds (its frames so far are reported)")
    parser.add_argument("--wait-quiet", type=float, default=0.0,
                        help="first wait up to this many seconds for the 1-minute load average to stay "
                             "below --quiet-below for --quiet-hold seconds")
    parser.add_argument("--quiet-below", type=float, default=0.8)
    parser.add_argument("--quiet-hold", type=float, default=60.0)
    parser.add_argument("--machine", action="store_true", help="time matrix products and memory reads too")
    parser.add_argument("--decoder", help="a qwencodecdec checkpoint with codes.raw: time one decode step")
    parser.add_argument("--plugin-path", default=str(ROOT / "target" / "release"),
                        help="folder of libgstqwencodec.so (default: this checkout's target/release)")
    parser.add_argument("--slow-dtypes", default="",
                        help="dtypes run with --slow-frames and --slow-streams instead (e.g. bf16,f16 where "
                             "this CPU has no fast 16-bit products)")
    parser.add_argument("--slow-frames", type=int, default=12)
    parser.add_argument("--plan", help="instead of every model x dtype x stream count: "
                                       "MODEL_INDEX:DTYPE:SPEC,... (SPEC as in --streams)")
    parser.add_argument("--slow-streams", default="1")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="the results folder (measurements/results): the report goes to <cpu>/talker-speed.*")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch
    import transformers
    host = this_machine()
    report = dict(date=time.strftime("%Y-%m-%d"), cpu=host["cpu"], avx512=host["avx512"], limits=host["limits"],
                  cores=os.cpu_count(), torch=torch.__version__,
                  transformers=transformers.__version__, frames=args.frames, seed=args.seed,
                  prompt=PROMPT, speaker="vivian", language="english", quiet_below=args.quiet_below,
                  quiet_hold_s=args.quiet_hold, time_cap_s=args.time_cap,
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=ROOT).stdout.strip(),
                  started=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    if args.wait_quiet:
        report["wait"] = wait_quiet(args.wait_quiet, args.quiet_below, args.quiet_hold, 15)
    report["loadavg_start"] = loadavg()
    if args.machine:
        before = loadavg()
        report["machine"] = machine(sorted({1, os.cpu_count()}))
        report["machine_loadavg"] = [before, loadavg()]
    if args.decoder:
        before = loadavg()
        report["decoder"] = dict(decoder_step(args.decoder, args.plugin_path), model_path=args.decoder,
                                 loadavg_before=before, loadavg_after=loadavg())
    report["runs"] = []
    if args.plan:
        # MODEL_INDEX:DTYPE:SPEC entries, in order, all at --frames.
        for entry in args.plan.split(","):
            index, dtype, spec = entry.split(":")
            model = args.model[int(index)]
            config = json.loads((Path(model) / "config.json").read_text())
            report.setdefault("geometries", {})[Path(model).name] = dict(
                geometry(config), params=param_count(config),
                cost_at_context_50=per_frame_cost(geometry(config), 50))
            print(f"bench_talker: {Path(model).name} {dtype} {spec}", file=sys.stderr, flush=True)
            row = run_config(args, model, dtype, spec)
            report["runs"].append(row)
            print(f"bench_talker:   {json.dumps({k: row.get(k) for k in ('ttff_s', 'fps', 'rtf', 'error', 'cpu_s')})}",
                  file=sys.stderr, flush=True)
    for model in ([] if args.plan else args.model):
        config = json.loads((Path(model) / "config.json").read_text())
        report.setdefault("geometries", {})[Path(model).name] = dict(
            geometry(config), params=param_count(config),
            cost_at_context_50=per_frame_cost(geometry(config), 50))
        for dtype in args.dtypes.split(","):
            slow = dtype in args.slow_dtypes.split(",")
            for streams in (args.slow_streams if slow else args.streams).split(","):
                print(f"bench_talker: {Path(model).name} {dtype} x{streams}", file=sys.stderr, flush=True)
                run_args = argparse.Namespace(**{**vars(args), "frames": args.slow_frames if slow else args.frames})
                row = run_config(run_args, model, dtype, streams)
                report["runs"].append(row)
                print(f"bench_talker:   {json.dumps({k: row.get(k) for k in ('ttff_s', 'fps', 'rtf', 'error')})}",
                      file=sys.stderr, flush=True)
    report["loadavg_end"] = loadavg()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    text = markdown(report)
    print(text)
    stem = result_path(args.out, host, "talker-speed")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(f"bench_talker: written: {stem}.{{md,json}}", file=sys.stderr)


if __name__ == "__main__":
    main()
