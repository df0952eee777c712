#!/usr/bin/env python3
"""How much earlier a frame leaves on qwencodec_talker's own loop than on upstream's generate.

Upstream's generate makes a frame's codebooks 1-15 inside the talker's next forward, which then
runs the talker's backbone before the forward hook can hand the frame out; the own loop
(qwencodec_talker.loop) hands it out when the code predictor returns. On one checkpoint, the
same text and seed on both loops (the same codes), this prints per loop the time from the call
to the first frame and the mean time between frames, and for the own loop the time from each
frame's hand-out to the end of the talker step after it: the wait each frame no longer has.

    python tools/talker_frame_timing.py MODEL_DIR [--runs 3] [--threads 1]

with a python that has the qwencodec-talker package (tools/setup-packages.sh's venv).
"""

import argparse
import statistics
import time

import torch

import qwencodec_talker as qt
from qwencodec_talker import loop as own
from qwencodec_talker.prompt import load_processor, prompt

TEXT = "Hello there, how is the frame timing today?"


def timed(frames):
    """(seconds from the call to each frame, the frames)."""
    start = time.perf_counter()
    times, codes = [], []
    for frame in frames:
        times.append(time.perf_counter() - start)
        codes.append(frame)
    return times, codes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=60)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = qt.load_model(a.model)
    words = prompt(model, load_processor(a.model), TEXT, speaker="vivian")
    gen = qt.generate_kwargs(model, max_new_tokens=a.max_new_tokens)

    # The end of each talker step of the own loop, to set against the hand-out before it.
    step_ends = []
    talker_step = own._Stream.talker_step

    def recorded(self, embeds):
        out = talker_step(self, embeds)
        step_ends.append(time.perf_counter())
        return out

    own._Stream.talker_step = recorded
    results = {"own": [], "upstream": []}
    waits = []
    for run in range(a.runs):
        for name in ("upstream", "own"):
            step_ends.clear()
            start = time.perf_counter()
            times, codes = timed(qt.stream_frames(model, loop=name, seed=run, **words, **gen))
            results[name].append((times, codes))
            if name == "own":
                # step_ends[0] is the prefill; step_ends[k + 1] follows frame k's hand-out.
                waits += [step_ends[k + 1] - (start + times[k])
                          for k in range(len(times)) if k + 1 < len(step_ends)]
        if results["own"][-1][1] != results["upstream"][-1][1]:
            raise SystemExit(f"run {run}: the loops made different codes")
    print(f"{a.model}: {a.runs} runs, {a.threads} thread(s), seeds 0-{a.runs - 1}")
    for name, runs in results.items():
        first = [times[0] for times, _ in runs]
        gaps = [b - c for times, _ in runs for c, b in zip(times, times[1:])]
        frames = sum(len(codes) for _, codes in runs)
        print(f"{name:9s} frames {frames}, first frame {1000 * statistics.median(first):.1f} ms (median), "
              f"between frames {1000 * statistics.mean(gaps):.2f} ms (mean)")
    print(f"own loop: a frame leaves {1000 * statistics.mean(waits):.2f} ms (mean; median "
          f"{1000 * statistics.median(waits):.2f}) before the end of the talker step after it, "
          f"over {len(waits)} frames")


if __name__ == "__main__":
    main()
