#!/usr/bin/env python3
"""Build random-weight reference checkpoints and their expected audio.

Each preset becomes a folder in the published Qwen3-TTS-Tokenizer-12Hz layout
(config.json, model.safetensors) plus expected.safetensors: random codes and
the waveform that the UPSTREAM decoder (qwen-tts 0.1.1,
Qwen3TTSTokenizerV2Decoder) computes for them in one full-sequence forward,
in float64. Upstream's own float32 error against that decode, a multiple of
which the tests allow, is recorded too, and must stay under the preset's
ceiling (f32_error_ceiling), else the script fails.

Weights are random but at magnitudes where every parameter matters: the
upstream initialisation leaves SnakeBeta at 0, ConvNeXt gamma at 1e-6 and
LayerScale at 0.01, which would hide a wrong implementation of those parts.

Needs the venv of tools/setup.sh with tools/setup-reference.sh applied.

    python tools/make_fixtures.py --out tests/fixtures
    python tools/make_fixtures.py --preset full-release --frames 120 \\
        --out DIR --no-expected
"""

import argparse
import contextlib
import copy
import importlib
import importlib.metadata
import importlib.util
import json
import math
import struct
import sys
import types
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

# Keys of every decoder_config unless a preset overrides them; the released
# checkpoint spells all of them out.
COMMON_DECODER = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
}

# The released geometry, shared by release-tiny (at tiny widths) and
# full-release. num_semantic_quantizers and semantic_codebook_size are in the
# published config.json but upstream ignores them (it hard-codes one semantic
# codebook of codebook_size entries), so a decoder must ignore them too.
RELEASE_DECODER = {
    **COMMON_DECODER,
    "codebook_size": 2048,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "semantic_codebook_size": 4096,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 8,
    "sliding_window": 72,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
}

# bf16-weights and f16-weights share this geometry; only the storage differs.
HALF_PRECISION_DECODER = {
    **COMMON_DECODER,
    "codebook_size": 32,
    "num_quantizers": 4,
    "codebook_dim": 8,
    "latent_dim": 16,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    # Deliberately not hidden_size / num_attention_heads (= 8).
    "head_dim": 12,
    "num_hidden_layers": 2,
    "intermediate_size": 24,
    "sliding_window": 12,
    "upsample_rates": [3, 2],
    "upsampling_ratios": [3],
    "decoder_dim": 16,
}

# Upstream's own float32 error against the float64 decode, measured in
# make_preset, is the yardstick of every parity test (they allow a multiple of
# it: crates/testing/src/lib.rs, MEASURED), so a regeneration that made it large
# would loosen every test at once. Each preset states the most it may be; the
# script fails above it. At tiny widths
# it is 1e-6 to 3e-6 (see RESIDUAL_GAIN); at full widths about 3e-5.
TINY_F32_ERROR_CEILING = 1e-5
FULL_F32_ERROR_CEILING = 1e-4

PRESETS = {
    "release-tiny": {
        "seed": 1001,
        "frames": 160,
        "sample_rate": 24000,
        "storage_dtype": torch.float32,
        "f32_error_ceiling": TINY_F32_ERROR_CEILING,
        "decoder_config": {
            **RELEASE_DECODER,
            "codebook_dim": 8,
            "latent_dim": 16,
            "hidden_size": 16,
            "head_dim": 4,
            "intermediate_size": 32,
            "decoder_dim": 32,
        },
    },
    "gqa-bias": {
        "seed": 1002,
        "frames": 120,
        "sample_rate": 16000,
        "storage_dtype": torch.float32,
        "f32_error_ceiling": TINY_F32_ERROR_CEILING,
        # No head_dim key: upstream then uses hidden_size / heads = 8.
        "decoder_config": {
            **COMMON_DECODER,
            "codebook_size": 64,
            "num_quantizers": 8,
            "codebook_dim": 12,
            "latent_dim": 24,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "attention_bias": True,
            "num_hidden_layers": 3,
            "intermediate_size": 48,
            "sliding_window": 6,
            "rope_theta": 1000,
            "upsample_rates": [5, 4],
            "upsampling_ratios": [2],
            "decoder_dim": 16,
        },
    },
    "bf16-weights": {
        "seed": 1003,
        "frames": 100,
        "sample_rate": 8000,
        "storage_dtype": torch.bfloat16,
        "f32_error_ceiling": TINY_F32_ERROR_CEILING,
        "decoder_config": HALF_PRECISION_DECODER,
    },
    "f16-weights": {
        "seed": 1004,
        "frames": 60,
        "sample_rate": 8000,
        "storage_dtype": torch.float16,
        "f32_error_ceiling": TINY_F32_ERROR_CEILING,
        "decoder_config": HALF_PRECISION_DECODER,
    },
    "full-release": {
        "seed": 1005,
        "frames": 100,
        "sample_rate": 24000,
        "storage_dtype": torch.float32,
        "f32_error_ceiling": FULL_F32_ERROR_CEILING,
        # Upstream's float16 forward on the CPU takes ~7 s per frame at these
        # widths (torch has no fast float16 convolutions there; 10 minutes
        # for 80 frames on two cores): its error is left out (NaN).
        "half_references": (torch.bfloat16,),
        "decoder_config": {
            **RELEASE_DECODER,
            "codebook_dim": 512,
            "latent_dim": 1024,
            "hidden_size": 512,
            "head_dim": 64,
            "intermediate_size": 1024,
            "decoder_dim": 1536,
        },
    },
}
DEFAULT_PRESETS = ["release-tiny", "gqa-bias", "bf16-weights", "f16-weights"]

DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}

# Name of the synthetic package the upstream modules are imported under.
UPSTREAM_PACKAGE = "qwen_tts_tokenizer_12hz"

# q and k projections get this extra gain on top of the 1/sqrt(fan_in) scale
# so that attention logits spread over a few units: softmax is then far from
# uniform and a wrong mask, window or RoPE shows in the output.
QK_GAIN = 1.5
# The closing 1x1 conv of each decoder residual unit gets this gain. At full
# scale each of the three units per block doubles the variance, activations
# reach ~50 by the last block, and SnakeBeta's sin(exp(alpha) * x) makes the
# output so sensitive to rounding that upstream's own float32 forward is off
# by ~3e-4 (relative L2) on release-tiny and worse on full-release. At 0.25
# activations stay within a few units, and the float32 error is
# ~3e-6 (tiny) to ~3e-5 (full), while breaking a single unit (a wrong
# dilation, a dropped tap) still changes the output by 25-60%.
RESIDUAL_GAIN = 0.25
# The final conv is rescaled so the waveform has about this RMS ...
TARGET_RMS = 0.3
# ... and at most this fraction of its samples reach the final clamp.
MAX_CLIPPED = 0.02


def load_upstream():
    """Import the upstream tokenizer modules without running qwen_tts/__init__.

    The package's __init__ imports the whole TTS stack (and its many
    dependencies, which setup-reference.sh leaves out); the decoder only needs
    two modules. They are imported under a synthetic package whose __path__
    is their folder, so their relative import of each other still works.
    """
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None:
        sys.exit("qwen-tts is not installed: run tools/setup-reference.sh")
    root = Path(next(iter(spec.submodule_search_locations)))
    package = types.ModuleType(UPSTREAM_PACKAGE)
    package.__path__ = [str(root / "core" / "tokenizer_12hz")]
    sys.modules[UPSTREAM_PACKAGE] = package
    configuration = importlib.import_module(
        f"{UPSTREAM_PACKAGE}.configuration_qwen3_tts_tokenizer_v2")
    modeling = importlib.import_module(
        f"{UPSTREAM_PACKAGE}.modeling_qwen3_tts_tokenizer_v2")
    return configuration, modeling


def samples_per_frame(decoder_config):
    return math.prod(decoder_config["upsample_rates"]
                     + decoder_config["upsampling_ratios"])


def build_decoder(upstream, decoder_config):
    configuration, modeling = upstream
    config = configuration.Qwen3TTSTokenizerV2DecoderConfig(**decoder_config)
    # sdpa rather than eager: eager computes its softmax in float32 whatever
    # the model dtype, which would cap the float64 reference's precision.
    config._attn_implementation = "sdpa"
    return modeling.Qwen3TTSTokenizerV2Decoder(config).eval()


def fan_in(module):
    """Inputs that sum into one output of a conv or linear layer."""
    weight = module.weight
    if isinstance(module, nn.ConvTranspose1d):
        # Weight is [in, out / groups, k]; each output sample gathers
        # ceil(k / stride) taps of every input channel of its group.
        taps = math.ceil(module.kernel_size[0] / module.stride[0])
        return weight.shape[0] // module.groups * taps
    # Conv1d [out, in / groups, k] and Linear [out, in].
    return weight[0].numel()


def weight_gain(name):
    """Extra scale of a conv or linear layer's weight, by module name."""
    if name.endswith(("q_proj", "k_proj")):
        return QK_GAIN
    if name.endswith("conv2.conv"):
        return RESIDUAL_GAIN
    return 1.0


def randomize(upstream, decoder, generator):
    """Give every parameter of the decoder random values that matter."""
    modeling = upstream[1]

    def normal(tensor, std):
        tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)

    def uniform(tensor, low, high):
        tensor.copy_(torch.rand(tensor.shape, generator=generator)
                     * (high - low) + low)

    done = set()
    with torch.no_grad():
        for name, module in decoder.named_modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)):
                normal(module.weight,
                       weight_gain(name) / math.sqrt(fan_in(module)))
                if module.bias is not None:
                    normal(module.bias, 0.1)
            elif isinstance(module, modeling.SnakeBeta):
                normal(module.alpha, 0.5)
                normal(module.beta, 0.5)
            elif isinstance(module, modeling.Qwen3TTSTokenizerV2ConvNeXtBlock):
                uniform(module.gamma, 0.5, 1.5)
            elif isinstance(module, nn.LayerNorm):
                uniform(module.weight, 0.5, 1.5)
                normal(module.bias, 0.1)
            elif isinstance(module,
                            modeling.Qwen3TTSTokenizerV2DecoderRMSNorm):
                uniform(module.weight, 0.5, 1.5)
            elif isinstance(module,
                            modeling.Qwen3TTSTokenizerV2DecoderLayerScale):
                uniform(module.scale, 0.3, 1.0)
            elif isinstance(module, modeling.EuclideanCodebook):
                normal(module.embedding_sum, 1.0)
                # Away from 1 so that the division by the usage matters.
                uniform(module.cluster_usage, 0.5, 2.0)
            else:
                continue
            done.update(id(p) for p in module.parameters(recurse=False))
    missed = [n for n, p in decoder.named_parameters() if id(p) not in done]
    if missed:
        raise RuntimeError(f"parameters left at upstream init: {missed}")


def calibrate_output(decoder, codes):
    """Rescale the final conv: waveform RMS TARGET_RMS, little clipping.

    The activations before the final conv are fixed by the other weights, so
    scaling its weight and bias by g scales the unclamped waveform by g.
    """
    final = decoder.decoder[-1]
    captured = []
    hook = final.register_forward_hook(
        lambda module, args, output: captured.append(output))
    upstream_forward(decoder, codes)
    hook.remove()
    unclamped = captured[0].double().flatten()
    gain = TARGET_RMS / unclamped.square().mean().sqrt()
    # A heavy tail could clip too much at the target RMS: shrink until not.
    while (gain * unclamped).abs().ge(1.0).double().mean() > MAX_CLIPPED:
        gain *= 0.9
    # Rounded so that the last float bits of this forward (which may vary
    # with the thread count) do not change the saved weights.
    gain = float(f"{gain.item():.3g}")
    with torch.no_grad():
        final.conv.weight.mul_(gain)
        final.conv.bias.mul_(gain)


@contextlib.contextmanager
def true_float64(modeling):
    """Make the upstream forward compute in float64 throughout.

    Upstream forces two computations to float32 whatever the model dtype,
    which a float64 reference must not inherit (the float32 run keeps them):
    - the rotary embedding computes inv_freq, the angles and cos/sin in
      float32 (its inv_freq buffer is float32-rounded at construction);
    - RMSNorm casts its input to float32 (meant as an upcast for half
      precision, it is a downcast for float64).
    """
    rotary = modeling.Qwen3TTSTokenizerV2DecoderRotatoryEmbedding
    rms_norm = modeling.Qwen3TTSTokenizerV2DecoderRMSNorm

    def rotary_forward(self, x, position_ids):
        if self.rope_type != "default":
            raise NotImplementedError(f"rope_type {self.rope_type}")
        config = self.config
        dim = (getattr(config, "head_dim", None)
               or config.hidden_size // config.num_attention_heads)
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inv_freq = 1.0 / config.rope_theta ** exponents
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def rms_norm_forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states
                              * torch.rsqrt(variance + self.variance_epsilon))

    saved = rotary.forward, rms_norm.forward
    rotary.forward, rms_norm.forward = rotary_forward, rms_norm_forward
    try:
        yield
    finally:
        rotary.forward, rms_norm.forward = saved


def top_config(preset):
    """config.json as published: the tokenizer model around decoder_config."""
    decoder_config = preset["decoder_config"]
    rate = preset["sample_rate"]
    stride = samples_per_frame(decoder_config)
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": decoder_config["num_quantizers"],
        "input_sample_rate": rate,
        "output_sample_rate": rate,
        "decode_upsample_rate": stride,
        "encode_downsample_rate": stride,
        # Mimi-like keys only: no encoder is built from them.
        "encoder_config": {
            "sampling_rate": rate,
            "frame_rate": rate / stride,
            "hidden_size": 32,
            "codebook_size": decoder_config["codebook_size"],
            "codebook_dim": 16,
            "num_quantizers": 2 * decoder_config["num_quantizers"],
        },
        "decoder_config": decoder_config,
    }


def encoder_tensors(generator, dtype):
    """A few encoder-side tensors, named as in the published file.

    They sit under the `encoder.` prefix of model.safetensors, which a
    decoder must skip.
    """
    prefix = "encoder.quantizer.semantic_residual_vector_quantizer.layers.0"
    shapes = {
        "encoder.encoder.layers.0.conv.weight": (8, 1, 7),
        "encoder.encoder.layers.0.conv.bias": (8,),
        f"{prefix}.codebook.embed_sum": (16, 8),
        f"{prefix}.codebook.cluster_usage": (16,),
    }
    return {name: torch.randn(shape, generator=generator).to(dtype)
            for name, shape in shapes.items()}


def upstream_forward(decoder, codes):
    """Upstream's full-sequence forward: codes [T, Q] to audio [T * S]."""
    with torch.no_grad():
        audio = decoder(codes.T[None].long())
    return audio.flatten()


def relative_l2(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


def sort_metadata(path):
    """Rewrite a safetensors header with its keys sorted, in place.

    safetensors writes __metadata__ from a Rust HashMap, in an order that
    changes from run to run; sorted, the file is byte-for-byte reproducible.
    Only the order changes, so the header keeps its length (and the data
    its offsets).
    """
    with open(path, "r+b") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
        text = json.dumps(header, sort_keys=True, separators=(",", ":"))
        assert len(text) <= length, "header grew"
        file.seek(8)
        file.write(text.encode().ljust(length))


def make_preset(upstream, name, preset, frames, out, with_expected):
    configuration, modeling = upstream
    decoder_config = preset["decoder_config"]
    storage_dtype = preset["storage_dtype"]
    stride = samples_per_frame(decoder_config)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)

    # Weights are drawn before the codes, so that --frames changes only the
    # codes and the output gain, not the other weights.
    generator = torch.Generator().manual_seed(preset["seed"])
    decoder = build_decoder(upstream, decoder_config)
    randomize(upstream, decoder, generator)
    encoder = encoder_tensors(generator, storage_dtype)
    codes = torch.randint(decoder_config["codebook_size"],
                          (frames, decoder_config["num_quantizers"]),
                          generator=generator, dtype=torch.int32)
    calibrate_output(decoder, codes)

    config = top_config(preset)
    # The published file must parse with upstream's own config class into
    # exactly the decoder configuration used here.
    parsed = configuration.Qwen3TTSTokenizerV2Config(**config).decoder_config
    for key, value in decoder_config.items():
        assert getattr(parsed, key) == value, key
    # Keys sorted, as transformers writes them.
    (folder / "config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n")

    weights = {f"decoder.{key}": value.to(storage_dtype).contiguous()
               for key, value in decoder.state_dict().items()}
    weights.update(encoder)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    # The same codes as a raw stream of frames (Q little-endian int16 each),
    # what qwencodecdec takes: for pipelines and the demo.
    (folder / "codes.raw").write_bytes(
        codes.to(torch.int16).numpy().astype("<i2").tobytes())

    files = ["config.json", "model.safetensors", "codes.raw"]
    line = f"{name}: T={frames} S={stride}"
    if with_expected:
        # Expectations come from the weights as saved, so that bf16/f16
        # rounding is part of the model being checked.
        saved = load_file(folder / "model.safetensors")
        decoder.load_state_dict(
            {key[len("decoder."):]: value for key, value in saved.items()
             if key.startswith("decoder.")}, strict=True)
        audio32 = upstream_forward(decoder.float(), codes).double()
        # Upstream's own half-precision forwards: the yardstick for ours.
        half_errors = {}
        with true_float64(modeling):
            audio64 = upstream_forward(decoder.double(), codes)
        assert audio64.numel() == frames * stride, audio64.shape
        rel_l2 = relative_l2(audio32, audio64)
        ceiling = preset["f32_error_ceiling"]
        if not rel_l2 <= ceiling:
            # No expectations beside weights they were not computed from.
            (folder / "expected.safetensors").unlink(missing_ok=True)
            sys.exit(f"{name}: upstream's float32 decode is {rel_l2:.3e} (relative"
                     f" L2) from the float64 one, above this preset's ceiling of"
                     f" {ceiling:.0e}: the weights or the reference went wrong,"
                     f" and tests allowing 5x this error would check little."
                     f" No expected.safetensors in {folder}.")
        half_references = preset.get("half_references",
                                     (torch.bfloat16, torch.float16))
        for half, key in ((torch.bfloat16, "upstream_bf16_rel_l2"),
                          (torch.float16, "upstream_f16_rel_l2")):
            if half not in half_references:
                half_errors[key] = "nan"
                continue
            audio_half = upstream_forward(
                copy.deepcopy(decoder).to(half), codes).double()
            half_errors[key] = f"{relative_l2(audio_half, audio64):.6e}"
        rms = audio64.square().mean().sqrt().item()
        clipped = audio64.abs().ge(1.0).double().mean().item()
        metadata = {
            "upstream_f32_rel_l2": f"{rel_l2:.6e}",
            **half_errors,
            "frames": str(frames),
            "samples_per_frame": str(stride),
            "sample_rate": str(preset["sample_rate"]),
            "storage_dtype": DTYPE_NAMES[storage_dtype],
            "generator": (
                f"qwen-tts {importlib.metadata.version('qwen-tts')}"
                f" / transformers {transformers.__version__}"
                f" / torch {torch.__version__}"),
        }
        save_file({"codes": codes, "audio": audio64.float()},
                  folder / "expected.safetensors", metadata=metadata)
        sort_metadata(folder / "expected.safetensors")
        files.append("expected.safetensors")
        line += (f" rms={rms:.4f} clipped={clipped:.4%}"
                 f" upstream_f32_rel_l2={rel_l2:.3e}")
    sizes = " ".join(f"{file}={(folder / file).stat().st_size}B"
                     for file in files)
    print(f"{line} {sizes}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures"),
                        help="folder that receives one sub-folder per preset")
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS),
                        help="preset to build (repeatable); default: "
                        + ", ".join(DEFAULT_PRESETS))
    parser.add_argument("--frames", type=int,
                        help="frames of codes instead of the preset's count")
    parser.add_argument("--no-expected", action="store_true",
                        help="write only config.json and model.safetensors")
    args = parser.parse_args()

    upstream = load_upstream()
    for name in args.preset or DEFAULT_PRESETS:
        preset = PRESETS[name]
        make_preset(upstream, name, preset, args.frames or preset["frames"],
                    args.out, not args.no_expected)


if __name__ == "__main__":
    main()
