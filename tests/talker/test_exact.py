#!/usr/bin/env python3
"""Streamed talker frames == upstream's non-streaming generate, frame for frame.

For each model kind's prompt shape (CustomVoice: speaker id, incl. a dialect
speaker; VoiceDesign: instruct text; Base: voice clone by x-vector only and
in ICL mode with reference codes), on a tiny random talker that
tools/make_talker_fixture.py builds with upstream's classes, and for greedy
and seeded sampling: the frames stream_codes yields must equal the codes
upstream's Qwen3TTSForConditionalGeneration.generate returns (same count,
same 16 values each). Also checked: frames arrive before generation ends,
and closing the stream stops generation at once; the CLI's
S16LE output equals upstream's codes byte for byte.

And as users of upstream call it: each model kind's wrapper method (generate_custom_voice,
generate_voice_design, generate_voice_clone) with its own defaults (non_streaming_mode, the
processor's tokens, a 0.6B CustomVoice's instruct dropped) against stream_codes on what
qwencodec_talker.prompt makes of the same call, and the CLI's --text against
generate_custom_voice.

    python tests/talker/test_exact.py FIXTURE_ROOT   (holds custom_voice/, voice_design/, base/)

with the python of the venv that tools/setup-packages.sh pip-installs the package into
(tools/check-talker.sh).
"""

import sys
import threading
import time
from pathlib import Path

import torch

import qwencodec_talker as qt
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

MAX_NEW = 12


installed(qt, script="tools/check-talker.sh")


def ids(generator, n, low=100, high=150000):
    return torch.randint(low, high, (1, n), generator=generator)


def wrap(body):
    """[1, T] ids shaped like the tokenized assistant text: 3 role tokens,
    the text, then <|im_end|>\\n<|im_start|>assistant\\n (5 tokens)."""
    role = torch.tensor([[151644, 77091, 198]])
    tail = torch.tensor([[151645, 198, 151644, 77091, 198]])
    return torch.cat([role, body, tail], dim=1)


def cases(root):
    g = torch.Generator().manual_seed(1234)
    text = wrap(ids(g, 7))
    long_text = wrap(ids(g, 30))
    out = []
    cv = qt.load_model(root / "custom_voice")
    out += [("custom_voice/vivian/auto", cv, dict(input_ids=text, speaker="vivian")),
            ("custom_voice/vivian/english", cv, dict(input_ids=text, speaker="vivian", language="english")),
            ("custom_voice/dylan(dialect)", cv, dict(input_ids=long_text, speaker="dylan", language="chinese")),
            ("custom_voice/non_streaming_mode", cv, dict(input_ids=text, speaker="vivian", non_streaming_mode=True))]
    vd = qt.load_model(root / "voice_design")
    instruct = torch.cat([torch.tensor([[151644, 872, 198]]), ids(g, 9), torch.tensor([[151645, 198]])], 1)
    out += [("voice_design/instruct", vd, dict(input_ids=text, instruct_ids=instruct, language="english"))]
    base = qt.load_model(root / "base")
    hidden = base.config.talker_config.hidden_size
    spk = torch.randn(hidden, generator=g)
    ref_code = torch.randint(0, 2048, (6, 16), generator=g)
    ref_ids = torch.cat([torch.tensor([[151644, 77091, 198]]), ids(g, 5), torch.tensor([[151645, 198]])], 1)
    xvec = dict(ref_code=[None], ref_spk_embedding=[spk], x_vector_only_mode=[True], icl_mode=[False])
    icl = dict(ref_code=[ref_code], ref_spk_embedding=[spk], x_vector_only_mode=[False], icl_mode=[True])
    out += [("base/x_vector_only", base, dict(input_ids=text, voice_clone_prompt=xvec)),
            ("base/icl", base, dict(input_ids=long_text, ref_ids=ref_ids, voice_clone_prompt=icl)),
            ("base/icl_short_text", base, dict(input_ids=text, ref_ids=ref_ids, voice_clone_prompt=icl))]
    return out


def upstream(model, prompt, seed, gen):
    """Upstream's own non-streaming call, as its wrapper makes it."""
    torch.manual_seed(seed)
    p = dict(prompt)
    codes, _ = model.generate(
        input_ids=[p.pop("input_ids")],
        instruct_ids=[p["instruct_ids"]] if p.get("instruct_ids") is not None else None,
        ref_ids=[p["ref_ids"]] if p.get("ref_ids") is not None else None,
        voice_clone_prompt=p.get("voice_clone_prompt"),
        languages=[p.get("language", "auto")], speakers=[p.get("speaker")],
        non_streaming_mode=p.get("non_streaming_mode", False), **gen)
    return codes[0].tolist()


WRAPPER_TEXT = "Hello there, a test of the wrapper's prompt."


class Codes:
    """Stands in for the speech tokenizer that upstream's wrapper decodes with (the element's
    job here): keeps the codes the wrapper hands it."""

    def decode(self, items):
        import numpy as np

        self.codes = [item["audio_codes"] for item in items]
        return [np.zeros(1, dtype=np.float32) for _ in items], 24000


def wrapper_checks(root):
    """Upstream's wrapper methods (Qwen3TTSModel.generate_custom_voice, generate_voice_design,
    generate_voice_clone), each with its own defaults, against stream_codes on what
    `prompt.prompt` makes of the same call: the same codes, frame for frame. Returns the
    failures, the runs and the CLI's frames."""
    import struct
    import tempfile
    import warnings

    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel, VoiceClonePromptItem
    from transformers import AutoProcessor

    from qwencodec_talker.__main__ import main as cli
    from qwencodec_talker.prompt import load_processor, prompt

    failures, runs = [], 0
    g = torch.Generator().manual_seed(99)
    models = {}
    for kind in ("custom_voice", "voice_design", "base"):
        model = qt.load_model(root / kind)
        model.speech_tokenizer = Codes()
        ours = load_processor(root / kind)
        # The processor as Qwen3TTSModel.from_pretrained loads it.
        theirs = AutoProcessor.from_pretrained(str(root / kind), fix_mistral_regex=True)
        models[kind] = (model, ours, Qwen3TTSModel(model, theirs, model.generate_config))
    spk = torch.randn(models["base"][0].config.talker_config.hidden_size, generator=g)
    ref_code = torch.randint(0, 2048, (5, 16), generator=g)
    xvec = VoiceClonePromptItem(ref_code=None, ref_spk_embedding=spk, x_vector_only_mode=True,
                                icl_mode=False, ref_text=None)
    icl = VoiceClonePromptItem(ref_code=ref_code, ref_spk_embedding=spk, x_vector_only_mode=False,
                               icl_mode=True, ref_text="The words of the reference.")
    # (name, kind, wrapper method, its arguments, prompt's, modes, tts_model_size)
    cases = [
        ("custom_voice/vivian", "custom_voice", "generate_custom_voice", dict(speaker="vivian"),
         dict(speaker="vivian"), ("greedy", "sampled"), "0b6"),
        ("custom_voice/dylan/Chinese", "custom_voice", "generate_custom_voice",
         dict(speaker="dylan", language="Chinese"), dict(speaker="dylan", language="Chinese"), ("greedy",), "0b6"),
        ("custom_voice/0.6B instruct dropped", "custom_voice", "generate_custom_voice",
         dict(speaker="vivian", instruct="Whisper it."), dict(speaker="vivian", instruct="Whisper it."),
         ("greedy",), "0b6"),
        ("custom_voice/1.7B instruct", "custom_voice", "generate_custom_voice",
         dict(speaker="vivian", instruct="Whisper it."), dict(speaker="vivian", instruct="Whisper it."),
         ("greedy", "sampled"), "1b7"),
        ("custom_voice/non_streaming_mode=False", "custom_voice", "generate_custom_voice",
         dict(speaker="vivian", non_streaming_mode=False), dict(speaker="vivian", non_streaming_mode=False),
         ("greedy",), "0b6"),
        ("voice_design/instruct", "voice_design", "generate_voice_design",
         dict(instruct="A low, warm voice.", language="English"),
         dict(instruct="A low, warm voice.", language="English"), ("greedy", "sampled"), None),
        ("voice_design/no instruct", "voice_design", "generate_voice_design", dict(instruct=""),
         dict(instruct=""), ("greedy",), None),
        ("base/x_vector_only", "base", "generate_voice_clone", dict(voice_clone_prompt=[xvec]),
         dict(voice_clone_prompt=xvec), ("greedy",), None),
        ("base/icl", "base", "generate_voice_clone", dict(voice_clone_prompt=[icl]),
         dict(voice_clone_prompt=icl), ("greedy", "sampled"), None),
    ]
    for name, kind, method, call, ours_call, modes, size in cases:
        model, processor, wrapper = models[kind]
        if size is not None:
            model.tts_model_size = size
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            words = prompt(model, processor, WRAPPER_TEXT, **ours_call)
        dropped = any("takes no instruct" in str(w.message) for w in caught)
        if "instruct" in ours_call and ours_call["instruct"]:
            want = size != "0b6"
            if ("instruct_ids" in words) != want or dropped == want:
                failures.append(f"wrapper {name}: instruct kept {'instruct_ids' in words}, warned {dropped}")
        want_mode = call.get("non_streaming_mode", kind != "base")
        if words["non_streaming_mode"] != want_mode:
            failures.append(f"wrapper {name}: non_streaming_mode {words['non_streaming_mode']}, not {want_mode}")
        for seed, mode in enumerate(modes, start=20):
            greedy = mode == "greedy"
            torch.manual_seed(seed)
            getattr(wrapper, method)(WRAPPER_TEXT, max_new_tokens=MAX_NEW, **call,
                                     **(dict(do_sample=False, subtalker_dosample=False) if greedy else {}))
            held = len(ref_code) if name == "base/icl" else 0  # the wrapper decodes ICL's reference codes too
            expected = model.speech_tokenizer.codes[0][held:].tolist()
            streamed = list(qt.stream_codes(model, seed=seed, **words,
                                            **qt.generate_kwargs(model, greedy=greedy, max_new_tokens=MAX_NEW)))
            runs += 1
            if not expected or streamed != expected:
                failures.append(f"wrapper {name} {mode}: {len(streamed)} streamed vs {len(expected)} "
                                f"frames from {method}")
        model.tts_model_size = "0b6" if kind == "custom_voice" else model.tts_model_size

    # The command line: text through the processor, the wrapper's defaults for the model's kind.
    model, _, wrapper = models["custom_voice"]
    torch.manual_seed(2)
    wrapper.generate_custom_voice(WRAPPER_TEXT, speaker="vivian", max_new_tokens=MAX_NEW)
    expected = model.speech_tokenizer.codes[0].tolist()
    with tempfile.NamedTemporaryFile(suffix=".raw") as raw:
        cli(["--model", str(root / "custom_voice"), "--text", WRAPPER_TEXT, "--speaker", "vivian",
             "--seed", "2", "--max-new-tokens", str(MAX_NEW), "--out", raw.name])
        data = Path(raw.name).read_bytes()
    if not expected or data != b"".join(struct.pack("<16h", *f) for f in expected):
        failures.append(f"CLI --text: {len(data) // 32} frames, not generate_custom_voice's {len(expected)}")
    # What the wrapper refuses, prompt refuses, naming it.
    cv, processor, _ = models["custom_voice"]
    for bad, what in ((dict(speaker="nobody"), "nobody"), (dict(speaker="vivian", language="klingon"), "klingon")):
        try:
            prompt(cv, processor, WRAPPER_TEXT, **bad)
            failures.append(f"prompt took {bad}")
        except ValueError as error:
            if what not in str(error):
                failures.append(f"prompt refused {bad} without naming {what}: {error}")
    return failures, runs, len(expected)


def main():
    root = Path(sys.argv[1])
    torch.set_num_threads(1)
    # Greedy on every prompt shape; seeded sampling (the checkpoint's
    # defaults, and explicit temperature/top-k/top-p) on one shape per kind.
    greedy = [("greedy", 0, dict(greedy=True))]
    sampled = [("sampled", 7, dict(temperature=0.8, top_k=40, top_p=0.9)),
               ("sampled", 8, dict())]
    sampled_on = {"custom_voice/vivian/auto", "voice_design/instruct", "base/icl"}
    failures, checked, frames_total, eos_ended, lengths = [], 0, 0, 0, []
    all_cases = cases(root)
    for name, model, prompt in all_cases:
        for mode, seed, opts in greedy + (sampled if name in sampled_on else []):
            gen = qt.generate_kwargs(model, max_new_tokens=MAX_NEW, **opts)
            expected = upstream(model, prompt, seed, gen)
            streamed = list(qt.stream_codes(model, seed=seed, **prompt, **gen))
            checked += 1
            frames_total += len(streamed)
            lengths.append(len(expected))
            if len(expected) < MAX_NEW - 1:
                eos_ended += 1
            if len(expected) == 0 or any(len(f) != 16 for f in expected):
                failures.append(f"{name} {mode}: upstream made {len(expected)} frames")
            if streamed != expected:
                first = next((i for i, (a, b) in enumerate(zip(streamed, expected)) if a != b), None)
                failures.append(f"{name} {mode} seed {seed}: {len(streamed)} streamed vs "
                                f"{len(expected)} upstream frames, first differing frame {first}")

    # Streaming and stopping, on the VoiceDesign greedy case (11 frames,
    # the longest): the first frame must come after the step that makes it
    # (prefill, then frame 0's step; one more allowed for the thread race),
    # not at the end; close() and cancel must end generation at once.
    vd_name, vd_model, vd_prompt = next(c for c in all_cases if c[0] == "voice_design/instruct")
    gen = qt.generate_kwargs(vd_model, greedy=True, max_new_tokens=MAX_NEW)
    steps = []
    handle = vd_model.talker.register_forward_hook(lambda *a: steps.append(time.monotonic()))
    full = list(qt.stream_codes(vd_model, seed=0, **vd_prompt, **gen))
    full_steps = len(steps)
    steps.clear()
    stream = qt.stream_codes(vd_model, seed=0, **vd_prompt, **gen)
    next(stream)
    at_first = len(steps)
    stream.close()
    after_close = len(steps)
    time.sleep(0.2)
    handle.remove()
    if len(full) < 8:
        failures.append(f"stream/close check needs a long run, got {len(full)} frames")
    if not (at_first <= 3 and full_steps >= at_first + 5):
        failures.append(f"first frame only after {at_first} of {full_steps} talker steps")
    if len(steps) != after_close or after_close > at_first + 1:
        failures.append(f"close() did not stop: {at_first} steps at first frame, {len(steps)} in all")
    cancel = threading.Event()
    got = []
    for frame in qt.stream_codes(vd_model, seed=0, cancel=cancel, **vd_prompt, **gen):
        got.append(frame)
        if len(got) == 3:
            cancel.set()
    if not (3 <= len(got) <= 4 and got == full[:len(got)]):
        failures.append(f"cancel after 3 of {len(full)} frames gave {len(got)}")

    # Two streams at once on one model (the hook is the model's): each gets its own frames,
    # those it gets alone.
    texts = [wrap(torch.arange(3000, 3009).unsqueeze(0)), wrap(torch.arange(5000, 5012).unsqueeze(0))]
    alone = [list(qt.stream_codes(vd_model, input_ids=t, **gen)) for t in texts]
    together = {}

    def speak(index):
        together[index] = list(qt.stream_codes(vd_model, input_ids=texts[index], **gen))

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if alone[0] == alone[1] or [together.get(0), together.get(1)] != alone:
        failures.append(f"two streams at once: {[len(together.get(i, [])) for i in range(2)]} frames, "
                        f"alone {[len(a) for a in alone]}")

    # The CLI's bytes: S16LE, 16 codes a frame, frame-major, equal to
    # upstream's codes for the same prompt and seed (sampled, VoiceDesign
    # shape without instruct).
    import struct
    import tempfile
    from qwencodec_talker.__main__ import main as cli
    vd = vd_model
    text = wrap(torch.arange(2000, 2030).unsqueeze(0))
    gen = qt.generate_kwargs(vd, max_new_tokens=MAX_NEW)
    # the wrapper's default for VoiceDesign
    expected = upstream(vd, dict(input_ids=text, non_streaming_mode=True), 2, gen)
    with tempfile.NamedTemporaryFile(suffix=".raw") as raw:
        cli(["--model", str(root / "voice_design"), "--text-ids", ",".join(map(str, text[0].tolist())),
             "--seed", "2", "--max-new-tokens", str(MAX_NEW), "--out", raw.name])
        data = Path(raw.name).read_bytes()
    want = b"".join(struct.pack("<16h", *f) for f in expected)
    if not expected or data != want:
        failures.append(f"CLI wrote {len(data)} bytes, upstream's {len(expected)} frames are {len(want)} bytes"
                        f"{'' if len(data) != len(want) else ', values differ'}")

    # --dtype and --attn-implementation reach the model: the CLI's bytes equal upstream's codes
    # on the model loaded so; by default transformers chooses (sdpa), as upstream leaves it.
    half = qt.load_model(root / "voice_design", dtype="bfloat16", attn_implementation="eager")
    default = qt.load_model(root / "voice_design")
    if (half.dtype, half.config._attn_implementation) != (torch.bfloat16, "eager"):
        failures.append(f"load_model(bfloat16, eager) gave {half.dtype}, {half.config._attn_implementation}")
    if (default.dtype, default.config._attn_implementation) != (torch.float32, "sdpa"):
        failures.append(f"load_model() gave {default.dtype}, {default.config._attn_implementation}")
    try:
        qt.as_dtype("float64")
        failures.append("as_dtype('float64') did not refuse")
    except ValueError as error:
        if "float32" not in str(error):
            failures.append(f"as_dtype('float64') refused without naming the choices: {error}")
    half_expected = upstream(half, dict(input_ids=text, non_streaming_mode=True), 3,
                             qt.generate_kwargs(half, max_new_tokens=MAX_NEW))
    with tempfile.NamedTemporaryFile(suffix=".raw") as raw:
        cli(["--model", str(root / "voice_design"), "--text-ids", ",".join(map(str, text[0].tolist())),
             "--seed", "3", "--max-new-tokens", str(MAX_NEW), "--device", "cpu", "--dtype", "bfloat16",
             "--attn-implementation", "eager", "--out", raw.name])
        data = Path(raw.name).read_bytes()
    if not half_expected or data != b"".join(struct.pack("<16h", *f) for f in half_expected):
        failures.append(f"CLI in bfloat16, eager: {len(data) // 32} frames, not upstream's {len(half_expected)}")

    wrapper_failures, wrapper_runs, cli_text_frames = wrapper_checks(root)
    failures += wrapper_failures

    if eos_ended == 0:
        failures.append("no run ended on EOS: the EOS cut was not exercised")
    if eos_ended == checked:
        failures.append("every run ended on EOS: the max_new_tokens end was not exercised")
    print("frames per run (upstream):", lengths)
    for f in failures:
        print("FAIL", f)
    print(f"talker exactness: {checked} runs ({checked - len([f for f in failures if ' seed ' in f])} equal), "
          f"{frames_total} frames, {eos_ended} ended on EOS; stream/close/cancel/two at once "
          f"{'ok' if not any(k in ' '.join(failures) for k in ('close', 'first frame', 'cancel', 'two streams')) else 'FAILED'}; "
          f"CLI bytes {'FAILED' if any(f.startswith(('CLI wrote', 'CLI in')) for f in failures) else 'equal'} "
          f"({len(expected)} frames); "
          f"upstream's wrapper methods: {wrapper_runs} runs "
          f"({wrapper_runs - len([f for f in wrapper_failures if f.startswith('wrapper ') and ' frames from ' in f])} equal), "
          f"CLI --text {cli_text_frames} frames")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
