#!/usr/bin/env python3
"""Streams batched (qwencodec_talker.loop.Batch) == each stream's solo run, frame for frame.

On the tiny random talkers of tools/make_talker_fixture.py and the prompt shapes of
test_exact.py (prompts of different lengths and kinds on one model), at f32, for greedy and
three seeded sampled settings (one with the code predictor's sampling hot), and the four mixed
in one batch: the streams of a model join a batch at different frames (so they
step together at different positions and cache lengths, and a stream joins and leaves while
others run), and each stream's frames equal those of `loop.stream_codes` alone with the same
seed (which test_loop.py checks against upstream's generate). Also: a step runs the talker's
layers once and the code predictor's 15 times whatever the number of streams, with a row per
stream; a stream removed mid-run made a prefix of its solo frames and its companions are
unaffected; streams end on EOS and at the token limit.

    python tests/talker/test_batch.py FIXTURE_ROOT   (holds custom_voice/, voice_design/, base/)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwencodec_talker as qt  # noqa: E402
from qwencodec_talker import loop  # noqa: E402
from test_exact import cases, wrap  # noqa: E402

MAX_NEW = 30
# Frames run before each next stream joins.
STAGGER = 3
# The last: the code predictor's draws made to matter (the tiny talkers' own distributions are
# peaked), so a row drawing from another's generator shows.
MODES = [("greedy", dict(greedy=True)),
         ("sampled", dict(temperature=0.8, top_k=40, top_p=0.9)),
         ("sampled", dict()),
         ("sampled", dict(subtalker_temperature=3.0, subtalker_top_k=2048))]


class Rows:
    """Records the batch rows of each forward call of a module while installed."""

    def __init__(self, module):
        self.rows = []
        self.handle = module.register_forward_hook(lambda module, args, output: self.rows.append(args[0].shape[0]))


def run_batch(model, prompts, seeds, gens, remove=None):
    """Streams started STAGGER frames apart (each with its prompt, seed and generation options),
    stepped together to their ends: each one's frames,
    the (talker, code predictor) layer-0 calls and their rows per step. `remove`: (stream,
    frames) removes that stream once it made that many."""
    batch = loop.Batch(model)
    frames = [[] for _ in prompts]
    keys = {}
    talker = Rows(model.talker.model.layers[0])
    predictor = Rows(model.talker.code_predictor.model.layers[0])
    steps = []
    try:
        ended = set()
        step = 0
        while len(ended) < len(prompts):
            if step % STAGGER == 0 and step // STAGGER < len(prompts):
                index = step // STAGGER
                keys[batch.add(seed=seeds[index], **prompts[index], **gens[index])] = index
            talker.rows.clear()
            predictor.rows.clear()
            rows = len(batch)
            made, gone = batch.step()
            steps.append((rows, list(talker.rows), list(predictor.rows)))
            for key, frame in made.items():
                frames[keys[key]].append(frame)
            ended.update(keys[key] for key in gone)
            if remove is not None and len(frames[remove[0]]) == remove[1] and remove[0] not in ended:
                batch.remove(next(k for k, i in keys.items() if i == remove[0]))
                ended.add(remove[0])
            step += 1
            if step > MAX_NEW * (len(prompts) + 1):
                raise AssertionError("the batch did not end")
    finally:
        talker.handle.remove()
        predictor.handle.remove()
    return frames, steps


def main():
    root = Path(sys.argv[1])
    torch.set_num_threads(1)
    failures = []
    models = {}
    for name, model, prompt in cases(root):
        models.setdefault(id(model), (model, []))[1].append((name, prompt))
    # VoiceDesign has one prompt shape: more of its texts, of other lengths.
    for model, prompts in models.values():
        if len(prompts) == 1:
            name, prompt = prompts[0]
            for n in (3, 17, 26):
                prompts.append((f"{name}+{n}", dict(prompt, input_ids=wrap(torch.arange(4000, 4000 + n).unsqueeze(0)))))
    runs = streams = frames_total = eos_ended = limit_ended = 0
    widest = 0
    for model, named in models.values():
        names = [name for name, _ in named]
        prompts = [prompt for _, prompt in named]
        # Each mode for every stream, then the modes mixed in one batch.
        for mode, opts in MODES + [("mixed", None)]:
            gens = [qt.generate_kwargs(model, max_new_tokens=MAX_NEW,
                                       **(opts if opts is not None else MODES[i % len(MODES)][1]))
                    for i in range(len(prompts))]
            seeds = [21 + i for i in range(len(prompts))]
            solo = [list(loop.stream_codes(model, seed=s, **p, **g)) for s, p, g in zip(seeds, prompts, gens)]
            together, steps = run_batch(model, prompts, seeds, gens)
            runs += 1
            streams += len(prompts)
            frames_total += sum(map(len, together))
            eos_ended += sum(len(s) < MAX_NEW - 1 for s in solo)
            limit_ended += sum(len(s) == MAX_NEW - 1 for s in solo)
            for name, alone, batched in zip(names, solo, together):
                if alone != batched:
                    first = next((i for i, (a, b) in enumerate(zip(alone, batched)) if a != b), None)
                    failures.append(f"{name} {mode} {opts}: batched {len(batched)} frames vs solo "
                                    f"{len(alone)}, first differing frame {first}")
            for rows, talker_rows, predictor_rows in steps:
                widest = max(widest, rows)
                if rows and (talker_rows != [rows] or predictor_rows != [rows] * 15):
                    failures.append(f"{names[0]} {mode}: a step of {rows} streams ran the talker's layer "
                                    f"with rows {talker_rows}, the code predictor's with {predictor_rows}")
            if max(rows for rows, _, _ in steps) < 2:
                failures.append(f"{names[0]} {mode}: never more than one stream in a step")
        # A stream removed after 4 frames: a prefix of its solo frames; the others unchanged.
        gen = qt.generate_kwargs(model, max_new_tokens=MAX_NEW, greedy=True)
        solo = [list(loop.stream_codes(model, **p, **gen)) for p in prompts]
        cut, _ = run_batch(model, prompts, [None] * len(prompts), [gen] * len(prompts), remove=(0, 4))
        if cut[0] != solo[0][:4] or cut[1:] != solo[1:]:
            failures.append(f"{names[0]}: removing a stream after 4 frames gave {[len(c) for c in cut]}, "
                            f"solo {[len(s) for s in solo]}")

    if eos_ended == 0 or limit_ended == 0:
        failures.append(f"{eos_ended} streams ended on EOS, {limit_ended} at the limit: both must be exercised")
    if widest < 4:
        failures.append(f"at most {widest} streams stepped together; want 4 or more")
    for f in failures:
        print("FAIL", f)
    print(f"talker batch: {runs} batched runs, {streams} streams ({eos_ended} ended on EOS), "
          f"{frames_total} frames, up to {widest} streams a step; "
          f"{'each equal to its solo run' if not failures else 'FAILED'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
