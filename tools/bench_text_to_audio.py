#!/usr/bin/env python3
"""Text to audio in one process: the talker and qwencodecdec sharing the cores.

For each talker (random CustomVoice talkers made here by tools/make_talker_fixture.py: --geometry
tiny and 0.6b; or --model folders), with a speech decoder checkpoint (--decoder; the released
geometry by default) at chunk-frames 1, in --rounds rounds, the three runs of a round taking
turns (the order rotated each round, so that a busy machine slows each alike):

- talker alone: our loop (`stream_frames`) makes the utterance's N frames from the text's prompt;
- decoder alone: the same frames pushed at once into `appsrc ! qwencodecdec ! appsink` (the
  Speaker's Decoder), to the last sample;
- both in one process: `Speaker.speak(text)` (the talker in a thread, each frame decoded as it
  comes), as the pipecat and LiveKit adapters and `qwencodec-speech` run it: the time to its
  first audio (text to first audio) and to its last.

The codec head's EOS row is zeroed so every run makes its N frames (N + 1 talker steps, the
first of which makes none), and each round checks that
the Speaker's audio is the decoder's alone (the same frames, within 2 LSB: steps of other sizes). Torch's and the element's threads
are as a user gets them (no pinning). Goal: both in one process take no longer than the talker
alone plus the decoder alone, the two sharing the cores rather than contending for them. Figures
are medians over the rounds.

    python tools/bench_text_to_audio.py [--geometry tiny,0.6b] [--model DIR ...]
        [--decoder DIR] [--dtype f32] [--rounds 3]

The report goes to measurements/results/<cpu>/text-to-audio.md and .json (--out names another
folder for measurements/results; benches/tools/results.py). The plugin must be where GStreamer
finds it (GST_PLUGIN_PATH=target/release after `make build`), and python/ on the path or its
packages installed.
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
from bench_talker_loop import DTYPES, FRAME_S, loadavg, make_talkers, write_report  # noqa: E402
from results import RESULTS, this_machine  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away."
DEFAULT_DECODER = Path(os.environ.get("QWENCODEC_CACHE", "/var/cache/qwencodec")) / "fixtures" / "full-release-80"


def largest_difference(a, b):
    """The largest difference of two S16LE buffers' samples: steps of other sizes (frames as they
    come, or all at once) round a few samples by a unit or two."""
    import numpy as np

    return int(np.abs(np.frombuffer(a, "<i2").astype(np.int32) - np.frombuffer(b, "<i2").astype(np.int32)).max())


def talker_alone(speaker, voice, frames, seed):
    """(codes, seconds) of our loop making `frames` frames of TEXT."""
    import qwencodec_talker as qt
    from qwencodec_talker.prompt import prompt

    start = time.perf_counter()
    words = prompt(speaker.model, speaker.processor, TEXT, speaker=voice, language="english")
    codes = list(qt.stream_frames(speaker.model, loop=speaker.loop, seed=seed, **words,
                                  **qt.generate_kwargs(speaker.model, max_new_tokens=frames + 1)))
    return codes, time.perf_counter() - start


def decoder_alone(speaker, codes):
    """(audio bytes, seconds) of the Speaker's decoder taking `codes` at once, to the last sample."""
    decoder = speaker.decoder
    want = len(codes) * decoder.samples_per_frame * 2
    start = time.perf_counter()
    for frame in codes:
        decoder.push(frame)
    decoder.drain()
    audio = b""
    while len(audio) < want:
        chunk = decoder.pull(30)
        if chunk is None:
            raise RuntimeError(f"the decoder gave {len(audio)} of {want} bytes")
        audio += chunk
    return audio, time.perf_counter() - start


def both(speaker, voice, frames, seed):
    """(audio bytes, seconds to the first audio, seconds to the last) of Speaker.speak(TEXT)."""
    start = time.perf_counter()
    first, audio = None, b""
    for chunk in speaker.speak(TEXT, speaker=voice, language="english", seed=seed, max_new_tokens=frames + 1):
        if first is None:
            first = time.perf_counter() - start
        audio += chunk
    return audio, first, time.perf_counter() - start


def measure(talker_dir, decoder_dir, dtype, frames, rounds, seed):
    import torch

    from qwencodec_talker.speech import Speaker

    speaker = Speaker(talker_dir, decoder_dir=decoder_dir, chunk_frames=1, dtype=DTYPES[dtype])
    model = speaker.model
    with torch.no_grad():
        model.talker.codec_head.weight[model.config.talker_config.codec_eos_token_id] = 0
    voice = next(iter(model.config.talker_config.spk_id or {}), None)
    # Warm: the talker's first steps, the decoder's shapes; the frames the decoder takes alone.
    decoder_alone(speaker, talker_alone(speaker, voice, 4, seed)[0])
    codes, _ = talker_alone(speaker, voice, frames, seed)
    runs = {"talker": lambda: talker_alone(speaker, voice, frames, seed),
            "decoder": lambda: decoder_alone(speaker, codes),
            "both": lambda: both(speaker, voice, frames, seed)}
    rows, same = [], True
    for index in range(rounds):
        order = list(runs)[index % 3:] + list(runs)[:index % 3]
        row = dict(load=loadavg()[0], order=order)
        for name in order:
            result = runs[name]()
            if name == "talker":
                codes, row["talker_s"] = result
            elif name == "decoder":
                decoded, row["decoder_s"] = result
            else:
                spoken, row["first_audio_s"], row["both_s"] = result
        row["bytes"] = dict(both=len(spoken), decoder=len(decoded), want=frames * speaker.decoder.samples_per_frame * 2)
        row["largest_difference"] = largest_difference(spoken, decoded) if len(spoken) == len(decoded) else None
        same = same and len(set(row["bytes"].values())) == 1 and row["largest_difference"] <= 2
        row["ratio"] = row["both_s"] / (row["talker_s"] + row["decoder_s"])
        print(f"  {Path(talker_dir).name} {dtype} round {index + 1}: talker {row['talker_s']:.2f} s, decoder "
              f"{row['decoder_s']:.2f} s, both {row['both_s']:.2f} s (first audio {row['first_audio_s'] * 1e3:.0f} ms), "
              f"{row['ratio']:.2f}x the sum, load {row['load']:.1f}; bytes {row['bytes']}, "
              f"largest difference {row['largest_difference']}", flush=True)
        rows.append(row)
    speaker.close()
    median = {key: statistics.median(row[key] for row in rows)
              for key in ("talker_s", "decoder_s", "both_s", "first_audio_s", "ratio")}
    return dict(talker=str(talker_dir), name=Path(talker_dir).name, dtype=dtype, frames=frames,
                audio_s=frames * FRAME_S, same_audio=same, median=median, rounds=rows)


def markdown(report):
    lines = [f"# Text to audio in one process ({report['machine']['cpu']}, {report['machine']['cores']} cores)", "",
             f"Commit {report['commit']}, {report['date']}; `{report['command']}`. Decoder `{report['decoder']}` "
             f"at chunk-frames 1; torch {report['torch']}. Medians of {report['rounds']} rounds, the runs of a round "
             f"taking turns; load average {report['load_before']:.1f} before, {report['load_after']:.1f} after.", "",
             "| talker | dtype | frames (audio s) | talker alone s | decoder alone s | both in one process s "
             "| both / (talker + decoder) | text to first audio ms | same audio |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in report["runs"]:
        m = run["median"]
        lines.append(f"| {run['name']} | {run['dtype']} | {run['frames']} ({run['audio_s']:.2f}) | {m['talker_s']:.2f} "
                     f"| {m['decoder_s']:.2f} | {m['both_s']:.2f} | {m['ratio']:.2f} | {m['first_audio_s'] * 1e3:.0f} "
                     f"| {'yes' if run['same_audio'] else 'NO'} |")
    lines += ["", "Goal: both in one process within the talker alone plus the decoder alone (a ratio at most 1.00).", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", type=Path, default=[], help="a talker folder (repeatable)")
    parser.add_argument("--geometry", default="tiny,0.6b",
                        help="random CustomVoice talkers made here, comma-separated: tiny, 0.6b (\"\" for none)")
    parser.add_argument("--decoder", type=Path, default=DEFAULT_DECODER)
    parser.add_argument("--dtype", default="f32", choices=list(DTYPES))
    parser.add_argument("--frames", type=int, default=60, help="frames an utterance of the tiny talker")
    parser.add_argument("--large-frames", type=int, default=16,
                        help="frames an utterance of a larger talker (hidden size 512 or more)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    machine = dict(this_machine(), cores=os.cpu_count())
    report = dict(machine=machine, date=time.strftime("%Y-%m-%d", time.gmtime()),
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                        capture_output=True).stdout.strip(),
                  torch=torch.__version__, decoder=str(args.decoder), rounds=args.rounds,
                  command="python " + " ".join([f"tools/{Path(__file__).name}", *sys.argv[1:]]),
                  load_before=loadavg()[0], runs=[])
    geometries = [g for g in args.geometry.split(",") if g]
    with tempfile.TemporaryDirectory() as tmp:
        talkers = list(args.model) + make_talkers(geometries, tmp)
        for talker in talkers:
            hidden = json.loads((talker / "config.json").read_text())["talker_config"]["hidden_size"]
            frames = args.large_frames if hidden >= 512 else args.frames
            report["runs"].append(measure(talker, args.decoder, args.dtype, frames, args.rounds, args.seed))
    report["load_after"] = loadavg()[0]
    write_report(args.out, machine, "text-to-audio", report, markdown)


if __name__ == "__main__":
    main()
