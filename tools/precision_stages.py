#!/usr/bin/env python3
"""Where reduced-precision decodes lose accuracy, stage by stage.

Runs upstream's decoder on a fixture made by tools/make_fixtures.py (its
weights and codes) in float64 as the reference, and in each precision mode
below, capturing every stage's output. Prints, per mode, each stage's
relative L2 error against the float64 stage output (the error accumulated up
to there), and for the bf16-weight modes the final error when only one stage
group is reduced (what that group contributes).

Modes:
- f32: upstream's float32 forward.
- upstream bf16: upstream's forward with the model cast to bfloat16.
- bf16 products: qwencodec's dtype=bf16, emulated in float64: every conv and
  linear layer's weight and bias rounded to bfloat16, its input rounded
  before and its output after the product.
- bf16 weights, split activations: weights rounded to bfloat16, biases kept,
  each input rounded to the sum of two bfloat16 numbers (hi + lo), the
  product and its output exact (one bfloat16 product of twice the columns,
  accumulated in float32, would compute this).
- f16 weights: weights rounded to float16; biases, activations and products
  at full precision: qwencodec's dtype=f16 on the CPU.

    python tools/precision_stages.py /var/cache/qwencodec/fixtures/full-release-80
"""

import argparse
import copy
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import make_fixtures  # noqa: E402

PRODUCT_LAYERS = (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)


def bf16(x):
    return x.to(torch.bfloat16).to(x.dtype)


def split_bf16(x):
    """x as the sum of two bfloat16 numbers, hi + lo."""
    hi = bf16(x)
    return hi + bf16(x - hi)


def stage_modules(decoder):
    """(name, module whose output ends the stage), in network order."""
    stages = [("quantizer + pre_conv + transformer", decoder.pre_transformer)]
    stages += [(f"upsampler stage {i + 1}", blocks[-1])
               for i, blocks in enumerate(decoder.upsample)]
    vocoder = list(decoder.decoder)
    stages.append(("vocoder input conv", vocoder[0]))
    stages += [(f"decoder block {i}", block)
               for i, block in enumerate(vocoder[1:-2], start=1)]
    stages.append(("final SnakeBeta + conv", vocoder[-1]))
    return stages


def stage_groups(decoder):
    """The modules of each stage, for reducing one stage at a time."""
    groups = [("quantizer + pre_conv + transformer",
               [decoder.quantizer, decoder.pre_conv, decoder.pre_transformer])]
    groups.append(("upsampler", list(decoder.upsample)))
    vocoder = list(decoder.decoder)
    groups.append(("vocoder input conv", [vocoder[0]]))
    groups += [(f"decoder block {i}", [block])
               for i, block in enumerate(vocoder[1:-2], start=1)]
    groups.append(("final SnakeBeta + conv", vocoder[-2:]))
    return groups


def product_layers(modules):
    for module in modules:
        for layer in module.modules():
            if isinstance(layer, PRODUCT_LAYERS):
                yield layer


def bf16_products(modules):
    """qwencodec's former dtype=bf16: products entirely in bfloat16."""
    for layer in product_layers(modules):
        with torch.no_grad():
            layer.weight.copy_(bf16(layer.weight))
            if layer.bias is not None:
                layer.bias.copy_(bf16(layer.bias))
        layer.register_forward_pre_hook(
            lambda _m, args: (bf16(args[0]),) + args[1:])
        layer.register_forward_hook(lambda _m, _a, out: bf16(out))


def bf16_weights_split(modules):
    """bf16 weights against split (hi + lo) activations, exact products."""
    for layer in product_layers(modules):
        with torch.no_grad():
            layer.weight.copy_(bf16(layer.weight))
        layer.register_forward_pre_hook(
            lambda _m, args: (split_bf16(args[0]),) + args[1:])


def f16_weights(modules):
    """float16 weights against full-precision activations."""
    for layer in product_layers(modules):
        with torch.no_grad():
            layer.weight.copy_(layer.weight.to(torch.float16).to(layer.weight.dtype))


REDUCTIONS = {
    "bf16 products": bf16_products,
    "bf16 weights, split activations": bf16_weights_split,
    "f16 weights": f16_weights,
}


def run(decoder, codes, modeling, float64):
    """The final audio and every stage's output, in float64."""
    captured = {}
    hooks = []
    for name, module in stage_modules(decoder):
        def keep(_m, _a, out, name=name):
            out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
            captured[name] = out.detach().double()
        hooks.append(module.register_forward_hook(keep))
    if float64:
        with make_fixtures.true_float64(modeling):
            audio = make_fixtures.upstream_forward(decoder, codes)
    else:
        audio = make_fixtures.upstream_forward(decoder, codes)
    for hook in hooks:
        hook.remove()
    captured["output (clamped)"] = audio.double()
    return captured


def relative_l2(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixture", type=Path,
                        help="a folder made by tools/make_fixtures.py")
    parser.add_argument("--frames", type=int,
                        help="decode only the first FRAMES frames")
    args = parser.parse_args()

    upstream = make_fixtures.load_upstream()
    modeling = upstream[1]
    config = make_fixtures.json.loads((args.fixture / "config.json").read_text())
    decoder = make_fixtures.build_decoder(upstream, config["decoder_config"])
    saved = load_file(args.fixture / "model.safetensors")
    decoder.load_state_dict(
        {key[len("decoder."):]: value.double() for key, value in saved.items()
         if key.startswith("decoder.")}, strict=True)
    decoder = decoder.double()
    codes = load_file(args.fixture / "expected.safetensors")["codes"]
    if args.frames:
        codes = codes[:args.frames]

    reference = run(decoder, codes, modeling, float64=True)
    stages = list(reference)

    def emulated(reduce, groups=None):
        model = copy.deepcopy(decoder)
        modules = [model] if groups is None else dict(stage_groups(model))[groups]
        reduce(modules)
        return run(model, codes, modeling, float64=True)

    modes = {
        "f32": run(copy.deepcopy(decoder).float(), codes, modeling, False),
        "upstream bf16": run(copy.deepcopy(decoder).to(torch.bfloat16),
                             codes, modeling, False),
        **{name: emulated(reduce) for name, reduce in REDUCTIONS.items()},
    }
    print("Accumulated error at each stage's output (relative L2 vs float64):")
    print("| stage | " + " | ".join(modes) + " |")
    print("| --- |" + " ---: |" * len(modes))
    for stage in stages:
        errors = [relative_l2(mode[stage], reference[stage])
                  for mode in modes.values()]
        print(f"| {stage} | " + " | ".join(f"{e:.2e}" for e in errors) + " |")

    print()
    print("Final error with only one stage group reduced:")
    print("| stage group | " + " | ".join(REDUCTIONS) + " |")
    print("| --- |" + " ---: |" * len(REDUCTIONS))
    final = "output (clamped)"
    for group, _ in stage_groups(decoder):
        errors = [relative_l2(emulated(reduce, group)[final], reference[final])
                  for reduce in REDUCTIONS.values()]
        print(f"| {group} | " + " | ".join(f"{e:.2e}" for e in errors) + " |",
              flush=True)


if __name__ == "__main__":
    main()
