#!/usr/bin/env python3
"""Time the upstream Python decoder on a checkpoint, for `make bench`.

Runs, on the checkpoint's codes.raw, with torch's default thread count (one
per core, as libtorch on the Rust side):
- the float64 full-sequence reference (RoPE and RMSNorm in float64 too, as
  for the fixtures), written as raw float32 samples for the error columns;
- the full-sequence forward `decoder(codes)` in float32 once, for its error;
- the windowed decode that stateless integrations use to stream: each block
  of 8 new frames decoded again with 25 frames of left context, keeping the
  new frames' audio; once as a warm-up and then --repeats times, keeping the
  best and the median (the Rust side does the same).

    python benches/tools/bench_upstream.py CHECKPOINT --out measurements/cache/upstream.json \\
        --reference measurements/cache/reference.f32

The full decode, what streaming must match in speed, is timed with --serve
instead, by benches/decode/main.rs, its runs taking turns with the streaming
decoder's (the machine's speed drifts within minutes): the decoder is loaded
once, then every line `full` on standard input runs one full decode and
answers with its wall-clock seconds on a line of standard output.

    python benches/tools/bench_upstream.py CHECKPOINT --serve [--device cuda]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import make_fixtures  # noqa: E402  (the upstream loader and float64 patch)

WINDOW_BLOCK = 8
WINDOW_CONTEXT = 25


def load_decoder(upstream, folder):
    config = json.loads((folder / "config.json").read_text())
    decoder = make_fixtures.build_decoder(upstream, config["decoder_config"])
    weights = load_file(folder / "model.safetensors")
    decoder.load_state_dict(
        {key[len("decoder."):]: value.float() for key, value in weights.items()
         if key.startswith("decoder.")}, strict=True)
    return decoder, config


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function, repeats, device):
    """Wall-clock times of `repeats` runs after one warm-up, and the results
    of those runs."""
    function()
    times, results = [], []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        results.append(function())
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times, results


def best_and_median(values):
    return {"best": min(values), "median": statistics.median(values)}


def windowed_decode(decoder, codes, samples_per_frame, device):
    """Stream by re-decoding: per block, the block plus its left context."""
    pieces, step_times = [], []
    for start in range(0, codes.shape[0], WINDOW_BLOCK):
        end = min(start + WINDOW_BLOCK, codes.shape[0])
        context = min(start, WINDOW_CONTEXT)
        began = time.perf_counter()
        audio = make_fixtures.upstream_forward(
            decoder, codes[start - context:end])
        synchronize(device)
        step_times.append(time.perf_counter() - began)
        pieces.append(audio[context * samples_per_frame:])
    return torch.cat(pieces), step_times


def relative_l2(actual, expected):
    return float((actual.double() - expected).norm() / expected.norm())


def worst_error(audios, reference):
    """The largest error of the runs' outputs (they should all be equal)."""
    return max(relative_l2(audio.cpu(), reference) for audio in audios)


def serve(decoder, codes, device):
    """Answers each line `full` with the seconds of one full decode."""
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "full":
            sys.exit(f"bench_upstream --serve: unknown request {line.strip()!r}")
        synchronize(device)
        start = time.perf_counter()
        make_fixtures.upstream_forward(decoder, codes)
        synchronize(device)
        print(time.perf_counter() - start, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--serve", action="store_true",
                        help="time full decodes on request (see above)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs of each decode, after one warm-up")
    parser.add_argument("--device", default="cpu",
                        help="where the float32 decodes run (cpu, cuda)")
    args = parser.parse_args()
    if not args.serve and (args.out is None or args.reference is None):
        parser.error("--out and --reference are required, unless --serve")

    upstream = make_fixtures.load_upstream()
    decoder, config = load_decoder(upstream, args.checkpoint)
    spf = make_fixtures.samples_per_frame(config["decoder_config"])
    rate = config["output_sample_rate"]
    quantizers = config["decoder_config"]["num_quantizers"]
    raw = np.fromfile(args.checkpoint / "codes.raw", dtype="<i2")
    codes = torch.from_numpy(raw.astype(np.int64)).view(-1, quantizers)
    frames = codes.shape[0]
    audio_seconds = frames * spf / rate
    threads = torch.get_num_threads()
    device = torch.device(args.device)
    if args.serve:
        serve(decoder.float().to(device), codes.to(device), device)
        return
    print(f"upstream: {frames} frames ({audio_seconds:.2f} s of audio), "
          f"{threads} torch threads", flush=True)

    with torch.no_grad(), make_fixtures.true_float64(upstream[1]):
        reference = make_fixtures.upstream_forward(decoder.double(), codes)
    args.reference.parent.mkdir(parents=True, exist_ok=True)
    reference.float().numpy().astype("<f4").tofile(args.reference)

    decoder.float().to(device)
    codes = codes.to(device)
    full_audio = make_fixtures.upstream_forward(decoder, codes)
    windowed_times, windowed_runs = timed(
        lambda: windowed_decode(decoder, codes, spf, device), args.repeats,
        device)
    frame_period = 1.0 / (rate / spf)
    # First audio, as for every row of the benchmark: from the first frame
    # handed over (frames arriving at the talker's pace, one per frame
    # period) to its audio, the wait for the frames a step needs included.
    # The full decode needs the whole utterance; the windowed one a block.
    result = {
        "threads": threads,
        "frames": frames,
        "audio_seconds": audio_seconds,
        "torch": torch.__version__,
        "device": args.device,
        "repeats": args.repeats,
        "full": {"relative_l2": worst_error([full_audio], reference)},
        "windowed": {
            "seconds_per_audio_second": best_and_median(
                [t / audio_seconds for t in windowed_times]),
            "step_ms": [t * 1e3 for _, steps in windowed_runs
                        for t in steps],
            "first_audio_ms": best_and_median(
                [((WINDOW_BLOCK - 1) * frame_period + steps[0]) * 1e3
                 for _, steps in windowed_runs]),
            "relative_l2": worst_error(
                [audio for audio, _ in windowed_runs], reference),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"upstream full: error {result['full']['relative_l2']:.2e}",
          flush=True)
    row = result["windowed"]
    speed = row["seconds_per_audio_second"]
    print(f"upstream windowed: {speed['best']:.3f} s per audio s (best of "
          f"{args.repeats}; median {speed['median']:.3f}), error "
          f"{row['relative_l2']:.2e}", flush=True)


if __name__ == "__main__":
    main()
