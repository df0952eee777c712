#!/usr/bin/env python3
"""Which interpolation points give Winograd tiles F(m, taps) the least float32 rounding.

A model of the Winograd kernel's rounding (src/model/kernels/winograd.cpp): the kernel
transformed in float64 and rounded once, the input transform, one product per point and the
output transform in float32, on random inputs and weights; its error is the relative L2
distance from the float64 convolution. Every set of `m + taps - 2` finite points that holds 0
and ±1 and takes the rest from small integers, halves, thirds and their kin is tried (infinity
is always the last point), and the best are checked again on other data and widths.

    python3 tools/winograd_points.py --outputs 4 [--taps 7] [--top 8]

Needs numpy (the reference venv has it). Prints the best sets, then those and the current
ones (winograd.rs) on the second data.
"""

import argparse
import itertools
from fractions import Fraction

import numpy as np

POOL = [Fraction(n, d) for n, d in [(2, 1), (1, 2), (3, 1), (1, 3), (4, 1), (1, 4), (3, 2), (2, 3)]]
POOL = [p for q in POOL for p in (q, -q)]


def transforms(m, taps, finite):
    """Cook-Toom, as winograd.rs builds them: output [m, P], kernel [P, taps], input [P, P]."""
    points = m + taps - 1
    assert len(finite) == points - 1
    output = np.zeros((m, points))
    kernel = np.zeros((points, taps))
    inputs = np.zeros((points, points))
    for i in range(m):
        output[i, :-1] = [float(a) ** i for a in finite]
        output[i, -1] = 1.0 if i == m - 1 else 0.0
    for k, a in enumerate(finite):
        denominator = np.prod([float(a - b) for l, b in enumerate(finite) if l != k])
        kernel[k] = [float(a) ** j / denominator for j in range(taps)]
    kernel[-1, -1] = 1.0
    for k in range(points):
        coefficients = [Fraction(1)]
        for l, b in enumerate(finite):
            if l == k:
                continue
            shifted = [Fraction(0)] + coefficients
            coefficients = [s - b * c for s, c in zip(shifted, coefficients + [Fraction(0)])]
        inputs[k, : len(coefficients)] = [float(c) for c in coefficients]
    return output, kernel, inputs


class Problem:
    """A convolution of `channels` in and out over `columns` outputs, in float32 and float64."""

    def __init__(self, seed, channels, columns, taps):
        rng = np.random.default_rng(seed)
        self.taps, self.columns = taps, columns
        self.x = rng.standard_normal((channels, columns + 16)).astype(np.float32)
        self.w = (rng.standard_normal((channels, channels, taps)) / np.sqrt(channels * taps)).astype(np.float32)
        x, w = self.x.astype(np.float64), self.w.astype(np.float64)
        self.exact = sum(w[:, :, k] @ x[:, k : k + columns] for k in range(taps))

    def error(self, m, finite):
        output, kernel, inputs = transforms(m, self.taps, finite)
        points = m + self.taps - 1
        weights = np.einsum("pk,oik->poi", kernel, self.w.astype(np.float64)).astype(np.float32)
        tiles = self.columns // m
        index = np.arange(tiles)[:, None] * m + np.arange(points)[None, :]
        v = np.einsum("qp,cnp->qcn", inputs.astype(np.float32), self.x[:, index]).astype(np.float32)
        products = np.matmul(weights, v).astype(np.float32)
        y = np.einsum("iq,qon->oni", output.astype(np.float32), products).astype(np.float32)
        y = y.reshape(y.shape[0], -1)
        exact = self.exact[:, : tiles * m]
        return np.linalg.norm(y - exact) / np.linalg.norm(exact)


def show(points):
    return "[" + ", ".join(str(p) for p in points) + "]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, required=True, help="m: outputs per tile")
    parser.add_argument("--taps", type=int, default=7)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    m, taps = args.outputs, args.taps
    free = m + taps - 2 - 3
    search = Problem(seed=1, channels=96, columns=240, taps=taps)
    check = Problem(seed=7, channels=384, columns=240, taps=taps)
    base = [Fraction(0), Fraction(1), Fraction(-1)]
    ranked = sorted((search.error(m, base + list(extra)), base + list(extra)) for extra in itertools.combinations(POOL, free))
    print(f"F({m}, {taps}): {len(ranked)} sets; best on 96 channels:")
    for error, points in ranked[: args.top]:
        print(f"  {error:.3e}  {show(points)}")
    current = {7: [0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2), 3, -3, Fraction(1, 3), Fraction(-1, 3)]}
    print("on 384 channels, other data:")
    candidates = [points for _, points in ranked[:3]]
    if taps in current:
        candidates.append([Fraction(p) for p in current[taps][: m + taps - 2]])
    for points in candidates:
        print(f"  {check.error(m, points):.3e}  {show(points)}")


if __name__ == "__main__":
    main()
