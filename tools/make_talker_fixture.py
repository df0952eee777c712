#!/usr/bin/env python3
"""Make a tiny random-weight Qwen3-TTS 12 Hz talker in the published layout.

Upstream's own classes (qwen-tts 0.1.1, Qwen3TTSForConditionalGeneration)
build the model from a tiny Qwen3TTSConfig with the released structure
(16 code groups, codebook 2048, mrope, the released special text token ids)
at tiny widths; save_pretrained writes config.json and model.safetensors,
and generation_config.json holds the sampling defaults as a real download
does. The text tokenizer is a real Qwen2 byte-level BPE in the published
files (vocab.json, merges.txt, tokenizer_config.json) with one token per
byte and the chat special tokens at their released ids, so `--text` and
the agents' adapters take text as with a download. Deterministic by --seed.

    python tools/make_talker_fixture.py --kind custom_voice --out DIR

`--geometry 0.6b|1.7b` makes instead a talker at a released model's shapes
(Qwen3-TTS-12Hz-0.6B / 1.7B; the values and their sources: RELEASED) with upstream's own
initialisation (std 0.02), stored in bfloat16 as the release is, for speed
measurements (benches/tools/bench_talker.py): no EOS trick, so runs end at
max_new_tokens. 0.6B is 1.8 GB, 1.7B 3.9 GB.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from qwencodec_talker import load_upstream  # noqa: E402

CODEC = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150,
             codec_think_id=2154, codec_nothink_id=2155,
             codec_think_bos_id=2156, codec_think_eos_id=2157)
LANGUAGES = {"chinese": 2055, "english": 2050, "beijing_dialect": 2074}
SPEAKERS = {"vivian": 3065, "dylan": 2878}
DIALECT = {"vivian": False, "dylan": "beijing_dialect"}


def tiny_config(kind):
    talker = dict(
        vocab_size=3072, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, text_hidden_size=32, text_vocab_size=151936,
        num_code_groups=16, max_position_embeddings=4096,
        rope_scaling={"interleaved": True, "mrope_section": [4, 2, 2],
                      "rope_type": "default", "type": "default"},
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=48, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=12, num_code_groups=16,
            max_position_embeddings=64),
        codec_language_id=LANGUAGES,
        **CODEC)
    if kind == "custom_voice":
        talker.update(spk_id=SPEAKERS, spk_is_dialect=DIALECT)
    else:
        talker.update(spk_id={}, spk_is_dialect={})
    return dict(
        talker_config=talker,
        # enc_dim is the talker width: the x-vector is one talker input.
        speaker_encoder_config=dict(
            mel_dim=128, enc_dim=64, enc_channels=[32, 32, 32, 32, 96],
            enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
            enc_attention_channels=16, enc_res2net_scale=4, enc_se_channels=16),
        tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="0b6",
        tts_model_type=kind)


# The released geometries. Both sizes share the 28-layer talker's heads (16 of
# 128, 8 key-value heads), the 5-layer code predictor of width 1024, the text
# embedding (151936 x 2048), rope theta 1e6 and the interleaved mrope [24, 20,
# 20]; they differ in the talker's width (1024 / 2048) and MLP (3072 / 6144).
# At 1.7B the code predictor (1024) is narrower than the talker, so upstream
# adds its small_to_mtp_projection (2048 -> 1024). CustomVoice, VoiceDesign and
# Base have the same talker; Base adds the speaker encoder (enc_dim = talker
# width), used only to encode reference audio. Sources: upstream qwen-tts's
# configuration_qwen3_tts.py (the code predictor's defaults are the released
# values; the talker's are not, so a released config.json sets them) and
# modeling_qwen3_tts.py (small_to_mtp_projection, the text projection); the
# released config.json files as public ports (Swift MLX, C++, Rust) reproduce
# them, where the 1.7B MLP is 6144 (one early port's notes say 8192; 6144 gives
# the 1.7B parameters beside the text embedding).
RELEASED = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, tts_model_size="0b6"),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, tts_model_size="1b7"),
}
RELEASED_LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070,
                      "portuguese": 2071, "spanish": 2054, "japanese": 2058, "korean": 2064,
                      "french": 2061, "russian": 2069, "beijing_dialect": 2074,
                      "sichuan_dialect": 2062}
RELEASED_SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061,
                     "aiden": 2861, "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
RELEASED_DIALECT = {**{name: False for name in RELEASED_SPEAKERS},
                    "eric": "sichuan_dialect", "dylan": "beijing_dialect"}


def released_config(kind, geometry):
    size = RELEASED[geometry]
    talker = dict(
        vocab_size=3072, hidden_size=size["hidden_size"],
        intermediate_size=size["intermediate_size"], num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        hidden_act="silu", rms_norm_eps=1e-6, text_hidden_size=2048,
        text_vocab_size=151936, num_code_groups=16, max_position_embeddings=32768,
        position_id_per_seconds=13, rope_theta=1000000,
        rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20],
                      "rope_type": "default", "type": "default"},
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=1024, intermediate_size=3072,
            num_hidden_layers=5, num_attention_heads=16, num_key_value_heads=8,
            head_dim=128, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000,
            num_code_groups=16, max_position_embeddings=65536),
        codec_language_id=RELEASED_LANGUAGES,
        **CODEC)
    if kind == "custom_voice":
        talker.update(spk_id=RELEASED_SPEAKERS, spk_is_dialect=RELEASED_DIALECT)
    else:
        talker.update(spk_id={}, spk_is_dialect={})
    config = dict(talker_config=talker, tokenizer_type="qwen3_tts_tokenizer_12hz",
                  tts_model_size=size["tts_model_size"], tts_model_type=kind)
    if kind == "base":
        config["speaker_encoder_config"] = dict(enc_dim=size["hidden_size"], sample_rate=24000)
    return config


def make_released(kind, geometry, out, seed):
    """A random talker at a released geometry, upstream's init, saved in bfloat16."""
    configuration, modeling = load_upstream()
    config_dict = released_config(kind, geometry)
    config = configuration.Qwen3TTSConfig(**config_dict)
    torch.manual_seed(seed)
    model = modeling.Qwen3TTSForConditionalGeneration(config).eval().to(torch.bfloat16)
    return save_published(model, config_dict, out)


GENERATION = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9,
                  repetition_penalty=1.05, subtalker_dosample=True,
                  subtalker_top_k=50, subtalker_top_p=1.0,
                  subtalker_temperature=0.9, max_new_tokens=8192)


SPECIAL_TOKENS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}


def byte_tokens():
    """GPT-2's byte-to-character table, which byte-level BPE vocabularies are spelled in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def write_tokenizer(out):
    vocab = {char: byte for byte, char in byte_tokens().items()}
    vocab.update({token: id for id, token in SPECIAL_TOKENS.items()})
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n")
    added = {str(id): dict(content=token, special=True, lstrip=False, rstrip=False,
                           normalized=False, single_word=False)
             for id, token in SPECIAL_TOKENS.items()}
    config = dict(tokenizer_class="Qwen2Tokenizer", model_max_length=32768, errors="replace",
                  eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
                  unk_token=None, clean_up_tokenization_spaces=False, added_tokens_decoder=added)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def make(kind, out, seed):
    configuration, modeling = load_upstream()
    config = configuration.Qwen3TTSConfig(**tiny_config(kind))
    torch.manual_seed(seed)
    model = modeling.Qwen3TTSForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Upstream's init (std 0.02) makes near-uniform logits; larger
        # weights give the talker distinct, input-dependent choices, so a
        # wrong prompt or frame order would change the codes.
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3 if "embed" in name else 0.15)
        # Random weights almost never pick EOS, which would leave upstream's
        # EOS cut untested: point EOS's codec_head row along the codes a
        # short greedy run picks (their mean row, at 2.5 times a row's
        # typical norm), so EOS competes
        # with the model's favourite codes and some runs end on it.
        eos = config.talker_config.codec_eos_token_id
        head = model.talker.codec_head.weight
        probe = torch.tensor([[151644, 77091, 198, *range(1000, 1008), 151645, 198, 151644, 77091, 198]])
        codes, _ = model.generate(input_ids=[probe], languages=["auto"], speakers=[None],
                                  do_sample=False, subtalker_dosample=False, max_new_tokens=12)
        direction = head[codes[0][:, 0]].mean(0)
        head[eos] = 2.5 * head.norm(dim=1).mean() * direction / direction.norm()
    return save_published(model, tiny_config(kind), out)


def save_published(model, config_dict, out):
    """`model` in the published layout in `out`: weights, config, generation config, tokenizer.

    save_pretrained's config.json spells out every PretrainedConfig default
    in the sub-configs, which upstream's Qwen3TTSSpeakerEncoderConfig then
    refuses on load (`model_type`); the published config.json holds only
    the model's own keys, so write that.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    published = dict(architectures=["Qwen3TTSForConditionalGeneration"],
                     model_type="qwen3_tts", **config_dict,
                     im_start_token_id=151644, im_end_token_id=151645,
                     tts_pad_token_id=151671, tts_bos_token_id=151672,
                     tts_eos_token_id=151673, transformers_version="4.57.3")
    (out / "config.json").write_text(json.dumps(published, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")
    write_tokenizer(out)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["custom_voice", "voice_design", "base", "all"], required=True,
                        help="all: one subfolder per kind under --out")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--geometry", choices=["tiny", "0.6b", "1.7b"], default="tiny",
                        help="tiny (default): the test talkers; 0.6b / 1.7b: the released shapes, "
                             "upstream's init, for speed measurements")
    args = parser.parse_args()
    build = make if args.geometry == "tiny" else (
        lambda kind, out, seed: make_released(kind, args.geometry, out, seed))
    if args.kind == "all":
        for kind in ("custom_voice", "voice_design", "base"):
            build(kind, Path(args.out) / kind, args.seed)
    else:
        build(args.kind, args.out, args.seed)


if __name__ == "__main__":
    main()
