"""Stream Qwen3-TTS 12 Hz talker codes frame by frame, on upstream's own code.

The talker (qwen-tts 0.1.1, Qwen3TTSForConditionalGeneration) predicts
codebook 0 of a frame; on the NEXT talker step its code predictor fills in
codebooks 1-15 of that frame (Qwen3TTSTalkerForConditionalGeneration.forward,
returned in `hidden_states[1]`). We run upstream's unmodified `generate` in a
worker thread and read each finished frame from a forward hook on the talker,
so the prompt, sampling and stopping are upstream's by construction and every
frame is handed out the moment its talker step returns.
"""

import importlib
import importlib.util
import json
import queue
import sys
import threading
import types
from pathlib import Path

import torch

from .version import __version__  # noqa: F401

CODEBOOKS = 16


def _shim(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _unavailable(what):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{what} is not installed; only needed to encode reference audio")
    return fail


def load_upstream():
    """Import upstream's talker modules: (configuration, modeling).

    With qwen-tts installed as it declares itself (the package's requirements), that is the
    whole of upstream, its wrapper and speech tokenizer included. Without its dependencies (the
    torch venv of tools/setup-reference.sh, for the fixture and benchmark scripts), qwen_tts's
    __init__ (and qwen_tts.core's) cannot load: the modules are then imported without them, and
    the two things the modeling module imports but the talker never calls, librosa's mel filter
    (speaker-encoder front end, reference audio only) and the speech tokenizer wrapper (used by
    its from_pretrained, which we bypass), are stand-ins that raise if ever called.
    """
    if "qwen_tts.core.models.modeling_qwen3_tts" in sys.modules:
        mods = sys.modules
        return (mods["qwen_tts.core.models.configuration_qwen3_tts"],
                mods["qwen_tts.core.models.modeling_qwen3_tts"])
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None:
        sys.exit("qwen-tts is not installed: pip install the qwencodec-talker package (docs/talker.md)")
    try:
        importlib.import_module("qwen_tts")
        return (importlib.import_module("qwen_tts.core.models.configuration_qwen3_tts"),
                importlib.import_module("qwen_tts.core.models.modeling_qwen3_tts"))
    except ImportError:
        pass
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, sub in (("qwen_tts", ""), ("qwen_tts.core", "core"),
                      ("qwen_tts.core.models", "core/models"),
                      ("qwen_tts.inference", "inference")):
        if name not in sys.modules:
            _shim(name, __path__=[str(root / sub)])
    # transformers probes for librosa at import: let it see the real state
    # before the stand-in exists.
    import transformers  # noqa: F401
    if importlib.util.find_spec("librosa") is None:
        librosa = _shim("librosa")
        librosa.filters = _shim("librosa.filters", mel=_unavailable("librosa"))
    if "qwen_tts.inference.qwen3_tts_tokenizer" not in sys.modules:
        class Qwen3TTSTokenizer:  # noqa: D401 - stand-in, see docstring
            from_pretrained = staticmethod(_unavailable("the speech tokenizer"))
        _shim("qwen_tts.inference.qwen3_tts_tokenizer", Qwen3TTSTokenizer=Qwen3TTSTokenizer)
    configuration = importlib.import_module("qwen_tts.core.models.configuration_qwen3_tts")
    modeling = importlib.import_module("qwen_tts.core.models.modeling_qwen3_tts")
    return configuration, modeling


# The weights' types a model loads in, by name (--dtype).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def as_dtype(dtype):
    """A torch dtype from one or its name in DTYPES."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(model_dir, dtype=torch.float32, device="cpu", attn_implementation=None):
    """Load a checkpoint folder in the published layout (config.json,
    model.safetensors, generation_config.json). Upstream's own
    from_pretrained also loads speech_tokenizer/ (the decoder, which the
    GStreamer element does); we call the transformers loader beneath it.
    dtype, device and attn_implementation ("eager", "sdpa", "flash_attention_2") are what
    upstream's Qwen3TTSModel.from_pretrained passes on to it; None leaves transformers' choice,
    as upstream does when not given one."""
    _, modeling = load_upstream()
    cls = modeling.Qwen3TTSForConditionalGeneration
    options = dict(dtype=as_dtype(dtype), local_files_only=True)
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    model = modeling.PreTrainedModel.from_pretrained.__func__(cls, str(model_dir), **options)
    model.to(device).eval()
    gen_path = Path(model_dir) / "generation_config.json"
    model.load_generate_config(json.loads(gen_path.read_text()) if gen_path.exists() else {})
    return model


# Upstream's wrapper defaults (inference/qwen3_tts_model.py, hard_defaults),
# overridden by generation_config.json, then by the caller.
HARD_DEFAULTS = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9,
                     repetition_penalty=1.05, subtalker_dosample=True,
                     subtalker_top_k=50, subtalker_top_p=1.0,
                     subtalker_temperature=0.9, max_new_tokens=2048)


def generate_kwargs(model, greedy=False, **overrides):
    """Sampling options as upstream's wrapper merges them; greedy turns off
    sampling in both the talker and the code predictor."""
    merged = {k: (model.generate_config or {}).get(k, v) for k, v in HARD_DEFAULTS.items()}
    merged.update({k: v for k, v in overrides.items() if v is not None})
    if greedy:
        merged.update(do_sample=False, subtalker_dosample=False)
    return merged


class _Stop(Exception):
    pass


def stream_codes(model, *, input_ids, instruct_ids=None, ref_ids=None,
                 voice_clone_prompt=None, language="auto", speaker=None,
                 non_streaming_mode=False, seed=None, cancel=None, **gen):
    """Yield each frame's 16 codes (list of ints) as soon as it is made.

    Arguments are those of upstream's `Qwen3TTSForConditionalGeneration.generate`
    for one utterance (input_ids etc. as [1, T] tensors; voice_clone_prompt a
    dict of one-element lists), plus `seed` (torch.manual_seed right before
    generation, as a caller of upstream would) and `cancel` (a
    threading.Event). Stopping: set `cancel` (no frame is handed out after it), or stop
    iterating / close() the generator; generation ends before the next talker step either way.
    """
    frames = queue.Queue()
    stop = threading.Event()
    eos = model.config.talker_config.codec_eos_token_id
    done = object()

    def hook(module, args, output):
        # The hook sits on the model, shared by every stream generating on it at once: each
        # stream takes the steps of its own worker thread alone.
        if threading.current_thread() is not worker:
            return
        if stop.is_set() or (cancel is not None and cancel.is_set()):
            raise _Stop()
        codec_ids = output.hidden_states[1]  # [1, 16] of the previous frame, or None at prefill
        if codec_ids is not None:
            frames.put(codec_ids[0].tolist())

    def work():
        handle = model.talker.register_forward_hook(hook)
        try:
            if seed is not None:
                torch.manual_seed(seed)
            model.generate(
                input_ids=[input_ids],
                instruct_ids=None if instruct_ids is None else [instruct_ids],
                ref_ids=None if ref_ids is None else [ref_ids],
                voice_clone_prompt=voice_clone_prompt,
                languages=[language], speakers=[speaker],
                non_streaming_mode=non_streaming_mode, **gen)
            frames.put(done)
        except _Stop:
            frames.put(done)
        except BaseException as error:  # handed to the consumer
            frames.put(error)
        finally:
            handle.remove()

    worker = threading.Thread(target=work, name="qwencodec-talker", daemon=True)
    worker.start()
    try:
        while True:
            # A cancel ends the iteration at once; generation ends before its next step.
            if cancel is not None and cancel.is_set():
                return
            try:
                item = frames.get(timeout=0.02)
            except queue.Empty:
                continue
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            # Upstream cuts the codes at the first EOS in codebook 0; the EOS
            # frame never reaches the hook (generation ends on it), but stop
            # here too rather than hand one out.
            if item[0] == eos:
                return
            yield item
    finally:
        stop.set()
        worker.join()



# The generation loops a stream can run on: qwencodec_talker.loop's own (the default), or
# upstream's `generate` (stream_codes above), kept for checking the other against.
LOOPS = ("own", "upstream")


def stream_frames(model, *, loop="own", seed=None, cancel=None, **arguments):
    """Each frame's 16 codes from the loop named (LOOPS), with `stream_codes`' arguments.

    "own": `loop.stream_codes`, which hands a frame out when the code predictor returns and
    draws from a torch.Generator of the stream's own, seeded with `seed` (or `generator=`);
    "upstream": upstream's `generate`, a frame out after the talker's next step, `seed` through
    torch.manual_seed. The same seed gives the same codes on both. No frame is handed out once
    `cancel` is set; closing the generator stops the loop before its next step.
    """
    if loop == "upstream":
        if arguments.get("generator") is not None:
            raise ValueError("loop 'upstream' draws from torch's global generator: give a seed")
        arguments.pop("generator", None)
        frames = stream_codes(model, seed=seed, cancel=cancel, **arguments)
    elif loop == "own":
        from . import loop as own  # here: it imports transformers' generation machinery

        frames = own.stream_codes(model, seed=seed, cancel=cancel, **arguments)
    else:
        raise ValueError(f"loop {loop!r} is not one of {', '.join(LOOPS)}")
    try:
        for frame in frames:
            if cancel is not None and cancel.is_set():
                return
            yield frame
    finally:
        frames.close()
