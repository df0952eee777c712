#!/usr/bin/env python3
"""Our generation loop (qwencodec_talker.loop) == upstream's generate, frame for frame.

On the tiny random talkers of tools/make_talker_fixture.py and the prompt shapes of
test_exact.py (CustomVoice with language auto / English, a dialect speaker, non_streaming_mode;
VoiceDesign; Base by x-vector, ICL, ICL with a short text), at f32:

- greedy: the loop's frames equal the codes upstream's Qwen3TTSForConditionalGeneration.generate
  returns, on every shape;
- sampled, the checkpoint's defaults and explicit temperature/top-k/top-p, on every shape: the
  loop seeded with `seed=s` (a torch.Generator of its own) makes upstream's codes after
  torch.manual_seed(s), so it draws its random numbers in upstream's order; with no seed it
  draws from the global generator as upstream does, and a seeded stream leaves that untouched;
  two seeded streams stepped in turn each make their solo codes;
- the loop runs no transformers `generate`, hands out the first frame after the prompt's talker
  step and one frame's code-predictor steps, and `cancel` / close() end it at once.

Exact equality throughout, so no statistical test is needed: the loop takes upstream's draws.

    python tests/talker/test_loop.py FIXTURE_ROOT   (holds custom_voice/, voice_design/, base/)
"""

import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwencodec_talker as qt  # noqa: E402
from qwencodec_talker import loop  # noqa: E402
from test_exact import MAX_NEW, cases, upstream, wrap  # noqa: E402

MODES = [("greedy", 0, dict(greedy=True)),
         ("sampled", 7, dict(temperature=0.8, top_k=40, top_p=0.9)),
         ("sampled", 8, dict())]


class Counter:
    """Counts forward calls of a module while installed."""

    def __init__(self, module):
        self.calls = 0
        self.handle = module.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.calls += 1


def no_generate(model):
    """Make transformers' generate on the talker and its code predictor fail while the loop
    runs; returns the undo."""
    def fail(*args, **kwargs):
        raise AssertionError("the loop called transformers' generate")
    model.talker.generate = fail
    model.talker.code_predictor.generate = fail

    def undo():
        del model.talker.generate
        del model.talker.code_predictor.generate
    return undo


def main():
    root = Path(sys.argv[1])
    torch.set_num_threads(1)
    failures, runs, frames_total, eos_ended = [], 0, 0, 0
    all_cases = cases(root)
    for name, model, prompt in all_cases:
        for mode, seed, opts in MODES:
            gen = qt.generate_kwargs(model, max_new_tokens=MAX_NEW, **opts)
            expected = upstream(model, prompt, seed, gen)
            undo = no_generate(model)
            try:
                ours = list(loop.stream_codes(model, seed=seed, **prompt, **gen))
            finally:
                undo()
            runs += 1
            frames_total += len(ours)
            eos_ended += len(expected) < MAX_NEW - 1
            if not expected or any(len(f) != 16 for f in expected):
                failures.append(f"{name} {mode}: upstream made {len(expected)} frames")
            if ours != expected:
                first = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), None)
                failures.append(f"{name} {mode} seed {seed}: {len(ours)} frames vs upstream's "
                                f"{len(expected)}, first differing frame {first}")

    # The global generator: unseeded, the loop draws from it as upstream does; seeded, it
    # leaves it alone.
    vd_name, vd, vd_prompt = next(c for c in all_cases if c[0] == "voice_design/instruct")
    gen = qt.generate_kwargs(vd, max_new_tokens=MAX_NEW)
    expected = upstream(vd, vd_prompt, 5, gen)
    torch.manual_seed(5)
    unseeded = list(loop.stream_codes(vd, **vd_prompt, **gen))
    state = torch.get_rng_state()
    list(loop.stream_codes(vd, seed=6, **vd_prompt, **gen))
    if unseeded != expected:
        failures.append("unseeded loop after torch.manual_seed differs from upstream")
    if not torch.equal(state, torch.get_rng_state()):
        failures.append("a seeded stream drew from the global generator")

    # Two seeded streams stepped in turn, each with its own generator: their solo codes.
    texts = [wrap(torch.arange(3000, 3009).unsqueeze(0)), wrap(torch.arange(5000, 5012).unsqueeze(0))]
    solo = [list(loop.stream_codes(vd, input_ids=t, seed=11 + i, **gen)) for i, t in enumerate(texts)]
    streams = [loop.stream_codes(vd, input_ids=t, seed=11 + i, **gen) for i, t in enumerate(texts)]
    turns = [[], []]
    live = [True, True]
    while any(live):
        for i, stream in enumerate(streams):
            if live[i]:
                frame = next(stream, None)
                if frame is None:
                    live[i] = False
                else:
                    turns[i].append(frame)
    if solo[0] == solo[1] or turns != solo:
        failures.append(f"two streams in turn: {[len(t) for t in turns]} frames, solo {[len(s) for s in solo]}")

    # The first frame comes after the prompt's talker step and 15 code-predictor steps (each
    # through every layer once), before the talker's next step; close() and cancel end it.
    greedy = qt.generate_kwargs(vd, greedy=True, max_new_tokens=MAX_NEW)
    full = list(loop.stream_codes(vd, **vd_prompt, **greedy))
    talker_steps = Counter(vd.talker.model.layers[0])
    predictor_steps = Counter(vd.talker.code_predictor.model.layers[0])
    try:
        stream = loop.stream_codes(vd, **vd_prompt, **greedy)
        first = next(stream)
        at_first = (talker_steps.calls, predictor_steps.calls)
        stream.close()
        after_close = (talker_steps.calls, predictor_steps.calls)
    finally:
        talker_steps.handle.remove()
        predictor_steps.handle.remove()
    if len(full) < 8 or first != full[0]:
        failures.append(f"first frame check needs a long greedy run, got {len(full)} frames")
    if at_first != (1, 15) or after_close != at_first:
        failures.append(f"(talker, code predictor) steps at the first frame {at_first}, after close {after_close}")
    cancel = threading.Event()
    got = []
    for frame in loop.stream_codes(vd, cancel=cancel, **vd_prompt, **greedy):
        got.append(frame)
        if len(got) == 3:
            cancel.set()
    if got != full[:3]:
        failures.append(f"cancel after 3 of {len(full)} frames gave {len(got)}")

    try:
        next(loop.stream_codes(vd, seed=1, generator=torch.Generator(), **vd_prompt, **gen))
        failures.append("seed and generator together were accepted")
    except ValueError:
        pass

    if eos_ended == 0 or eos_ended == runs:
        failures.append(f"{eos_ended} of {runs} runs ended on EOS: both ends must be exercised")
    for f in failures:
        print("FAIL", f)
    equal = runs - len([f for f in failures if " seed " in f])
    print(f"talker loop: {runs} runs against upstream ({equal} equal), {frames_total} frames, "
          f"{eos_ended} ended on EOS; global generator, two streams, first frame, close, cancel "
          f"{'ok' if not failures else 'FAILED'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
