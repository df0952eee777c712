#!/usr/bin/env python3
"""Seeds per stream: two seeded streams in one process each make their solo codes.

On the tiny CustomVoice talker with upstream's default sampling, through the installed
package's `stream_frames` (the default loop, qwencodec_talker.loop): each seed's solo run is the
reference; then the two streams taken a frame at a time in turn in one thread, and run at once
in two threads while this thread draws from torch's global generator, must each give their solo
codes, and torch's global generator state is left as it was. The two seeds must give different
codes (else the seed would not be reaching the stream), and `--loop upstream`'s seeding
(torch.manual_seed before upstream's generate) the same codes as the own loop's.

    python tests/talker/test_seeds.py FIXTURE_ROOT   (holds custom_voice/)

with the python of the venv that tools/setup-packages.sh pip-installs the package into
(tools/check-talker.sh).
"""

import sys
import threading
import time
from pathlib import Path

import torch

import qwencodec_talker as qt
from qwencodec_talker.prompt import load_processor, prompt
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Two streams, each with a seed of its own."
SEEDS = (5, 6)
MAX_NEW = 40


installed(qt, script="tools/check-talker.sh")


def main():
    root = Path(sys.argv[1]) / "custom_voice"
    torch.set_num_threads(1)
    model = qt.load_model(root)
    words = prompt(model, load_processor(root), TEXT, speaker="vivian")
    gen = qt.generate_kwargs(model, max_new_tokens=MAX_NEW)
    failures = []

    def check(what, ok, detail=""):
        print(f"{'ok' if ok else 'FAILED'}: {what}{' ' + detail if detail else ''}")
        if not ok:
            failures.append(what)

    def stream(seed, loop="own"):
        return qt.stream_frames(model, loop=loop, seed=seed, **words, **gen)

    state = torch.get_rng_state()
    solo = {seed: list(stream(seed)) for seed in SEEDS}
    check("a seeded stream leaves torch's global generator as it was", torch.equal(state, torch.get_rng_state()))
    check("the two seeds make different codes", solo[SEEDS[0]] != solo[SEEDS[1]],
          f"({len(solo[SEEDS[0]])} and {len(solo[SEEDS[1]])} frames)")

    # Interleaved in one thread: a frame of one, then a frame of the other.
    streams = {seed: stream(seed) for seed in SEEDS}
    taken = {seed: [] for seed in SEEDS}
    while streams:
        for seed in list(streams):
            frame = next(streams[seed], None)
            if frame is None:
                del streams[seed]
            else:
                taken[seed].append(frame)
                torch.rand(7)  # the global generator moves between the streams' draws
    for seed in SEEDS:
        check(f"seed {seed} interleaved in one thread makes its solo codes", taken[seed] == solo[seed],
              f"({len(taken[seed])} frames)")

    # At once in two threads, while this one draws from the global generator.
    made = {}
    threads = [threading.Thread(target=lambda s=seed: made.__setitem__(s, list(stream(s)))) for seed in SEEDS]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        torch.rand(7)
        time.sleep(0.001)
    for thread in threads:
        thread.join()
    for seed in SEEDS:
        check(f"seed {seed} in its own thread beside the other makes its solo codes",
              made.get(seed) == solo[seed], f"({len(made.get(seed) or [])} frames)")

    upstream = list(stream(SEEDS[0], loop="upstream"))
    check("loop upstream with the same seed makes the same codes", upstream == solo[SEEDS[0]],
          f"({len(upstream)} frames)")
    try:
        qt.stream_frames(model, loop="mine", **words).__next__()
        check("an unknown loop is refused", False)
    except ValueError as error:
        check("an unknown loop is refused naming the loops", "own" in str(error) and "upstream" in str(error))

    frames = sum(len(codes) for codes in solo.values())
    print(f"talker seeds: {len(SEEDS)} streams, {frames} frames; "
          f"{'FAILED ' + ', '.join(failures) if failures else 'all ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
