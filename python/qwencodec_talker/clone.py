"""Voice cloning on a Base checkpoint: a reference recording made into upstream's prompt.

Upstream's wrapper (`Qwen3TTSModel.create_voice_clone_prompt`) encodes the reference audio with
the speech tokenizer's encoder (its codes, for ICL) and upstream's speaker encoder (the x-vector),
and `generate_voice_clone` speaks with them. `voice_clone_prompt` calls that same method on the
model loaded by `load_model`, with upstream's speech tokenizer loaded from the checkpoint's
`speech_tokenizer/` (its encoder only is used: decoding is qwencodecdec's), and hands back the
item `prompt.prompt` takes, so the frames `stream_codes` streams are a caller of
`generate_voice_clone`'s.
"""

from pathlib import Path


def load_speech_tokenizer(folder, device="cpu"):
    """Upstream's speech tokenizer (Qwen3TTSTokenizer) from a folder in the published layout."""
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    options = {} if str(device) == "cpu" else {"device_map": str(device)}
    return Qwen3TTSTokenizer.from_pretrained(str(folder), **options)


def voice_clone_prompt(model, ref_audio, *, ref_text=None, x_vector_only_mode=False,
                       speech_tokenizer=None, talker_dir=None):
    """One `VoiceClonePromptItem` of `ref_audio` (a WAV path, a URL, base64, or (samples, rate)),
    as upstream's `create_voice_clone_prompt` makes it: ICL (`ref_text`, the reference's
    transcript, required) or the x-vector alone (`x_vector_only_mode`). The speech tokenizer is
    `speech_tokenizer`, or loaded from `talker_dir`/speech_tokenizer once and kept on the model."""
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel

    if model.tts_model_type != "base":
        raise ValueError(f"a {model.tts_model_type} checkpoint does not clone voices: Base only")
    if not x_vector_only_mode and not ref_text:
        raise ValueError("cloning in ICL mode needs ref_text, the reference's transcript "
                         "(or x_vector_only_mode)")
    if speech_tokenizer is not None:
        model.load_speech_tokenizer(speech_tokenizer)
    elif model.speech_tokenizer is None:
        if talker_dir is None:
            raise ValueError("give speech_tokenizer, or talker_dir holding speech_tokenizer/")
        folder = Path(talker_dir) / "speech_tokenizer"
        if not (folder / "config.json").exists():
            raise ValueError(f"{folder}: no speech tokenizer (config.json) to encode the reference with")
        model.load_speech_tokenizer(load_speech_tokenizer(folder, model.device))
    wrapper = Qwen3TTSModel(model, None, model.generate_config)
    return wrapper.create_voice_clone_prompt(ref_audio, ref_text=ref_text,
                                             x_vector_only_mode=x_vector_only_mode)[0]
