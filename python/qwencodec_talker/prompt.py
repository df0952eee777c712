"""The prompt of one utterance as upstream's wrapper makes it, for `stream_codes`.

Upstream's `Qwen3TTSModel` (qwen_tts/inference/qwen3_tts_model.py) has one method per model
kind, each with its own defaults: `generate_custom_voice` and `generate_voice_design` set
`non_streaming_mode=True`, `generate_voice_clone` (Base) False; `generate_custom_voice` drops the
instruct of a 0.6B model; all tokenize with the checkpoint's processor (loaded with
`fix_mistral_regex=True`), default the language to "Auto" and refuse languages and speakers the
checkpoint does not have. `prompt` does the same for one text, so that the frames `stream_codes`
streams are the codes a caller of that method gets.
"""

import importlib
import warnings

from . import load_upstream

# Each model kind's wrapper method and its non_streaming_mode default.
WRAPPER_METHODS = {"custom_voice": ("generate_custom_voice", True),
                   "voice_design": ("generate_voice_design", True),
                   "base": ("generate_voice_clone", False)}


def assistant_text(text):
    """The prompt text upstream's wrapper tokenizes (_build_assistant_text)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct):
    """An instruction as the wrapper tokenizes it (_build_instruct_text)."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def ref_text(text):
    """A voice clone's reference transcript as the wrapper tokenizes it (_build_ref_text)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def load_processor(model_dir):
    """The checkpoint's text processor, loaded as upstream's Qwen3TTSModel.from_pretrained
    loads it (its classes registered with transformers' Auto classes)."""
    from transformers import AutoConfig, AutoProcessor

    configuration, _ = load_upstream()
    processing = importlib.import_module("qwen_tts.core.models.processing_qwen3_tts")
    AutoConfig.register("qwen3_tts", configuration.Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(configuration.Qwen3TTSConfig, processing.Qwen3TTSProcessor, exist_ok=True)
    return AutoProcessor.from_pretrained(str(model_dir), fix_mistral_regex=True, local_files_only=True)


def tokenize(processor, text, device="cpu"):
    """Token ids [1, T] of `text` as the wrapper makes them (_tokenize_texts)."""
    ids = processor(text=text, return_tensors="pt", padding=True)["input_ids"].to(device)
    return ids.unsqueeze(0) if ids.dim() == 1 else ids


def _check(what, value, supported):
    if supported is None:  # the checkpoint does not say: the wrapper checks nothing either
        return
    if str(value).lower() not in {str(s).lower() for s in supported}:
        raise ValueError(f"this checkpoint has no {what} {value!r}; it has: {', '.join(sorted(supported))}")


def prompt(model, processor, text=None, *, input_ids=None, speaker=None, instruct=None,
           language=None, non_streaming_mode=None, voice_clone_prompt=None):
    """`stream_codes`' prompt arguments for `text` (or the ids of its whole assistant prompt,
    `input_ids`), as the wrapper method of the model's kind (model.tts_model_type) makes them.

    speaker: a CustomVoice speaker; instruct: VoiceDesign's voice description, or a 1.7B
    CustomVoice's instruction (a 0.6B one's is dropped, with a warning, as the wrapper drops it);
    language: None for the wrapper's "Auto"; non_streaming_mode: None for the wrapper's default.
    voice_clone_prompt: Base only, one item as upstream's `create_voice_clone_prompt` makes them
    (ref_code, ref_spk_embedding, x_vector_only_mode, icl_mode, ref_text).
    """
    kind = model.tts_model_type
    if kind not in WRAPPER_METHODS:
        raise ValueError(f"unknown model kind {kind!r} (tts_model_type): not one of {', '.join(WRAPPER_METHODS)}")
    if (text is None) == (input_ids is None):
        raise ValueError("give the text or its input_ids, not both")
    language = "Auto" if language is None else language
    _check("language", language, model.get_supported_languages())
    device = model.device
    if input_ids is None:
        input_ids = tokenize(processor, assistant_text(text), device)
    out = dict(input_ids=input_ids.to(device), language=language,
               non_streaming_mode=WRAPPER_METHODS[kind][1] if non_streaming_mode is None else non_streaming_mode)
    if kind == "base":
        if voice_clone_prompt is None:
            raise ValueError("a Base checkpoint clones a voice: it needs a voice_clone_prompt")
        if speaker or instruct:
            raise ValueError("a Base checkpoint takes no speaker or instruct, only a voice_clone_prompt")
        item = voice_clone_prompt
        out["voice_clone_prompt"] = dict(ref_code=[item.ref_code], ref_spk_embedding=[item.ref_spk_embedding],
                                         x_vector_only_mode=[item.x_vector_only_mode], icl_mode=[item.icl_mode])
        if item.ref_text:
            out["ref_ids"] = tokenize(processor, ref_text(item.ref_text), device)
        return out
    if voice_clone_prompt is not None:
        raise ValueError(f"a {kind} checkpoint takes no voice_clone_prompt (Base only)")
    if kind == "custom_voice":
        if speaker:
            _check("speaker", speaker, model.get_supported_speakers())
        size = model.tts_model_size
        if instruct and size is not None and size in "0b6":
            warnings.warn("a 0.6B CustomVoice model takes no instruct: dropped, as upstream's "
                          "generate_custom_voice drops it", stacklevel=2)
            instruct = None
        out["speaker"] = speaker
    elif speaker:
        raise ValueError("a VoiceDesign checkpoint takes no speaker: describe the voice with instruct")
    if instruct:
        out["instruct_ids"] = tokenize(processor, instruct_text(instruct), device)
    return out
