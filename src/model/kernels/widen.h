// The AVX-512 kernels' vector helpers. Sixteen weights as float32 in a register, from float32 or
// 16 bits: the kernels keep weights in 16 bits where reading them is the cost (dtypes f16 and
// bf16), so that only the weights are rounded and the activations and sums stay float32. And the mask of a
// vector's first lanes, for the partial vector at the end of a row.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include "intrinsics.h"

#include <algorithm>
#include <cstdint>

namespace qwencodec {

// The first `lanes` of a vector's sixteen: none for 0 or fewer, all for 16 or more.
__attribute__((target("avx512f"))) inline __mmask16 tail_mask(int64_t lanes) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(lanes, 0, 16)) - 1);
}

__attribute__((target("avx512f"))) inline __m512 widen(const float* w) { return _mm512_loadu_ps(w); }

__attribute__((target("avx512f"))) inline __m512 widen(const at::Half* w) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
}

// A bfloat16 is a float32's upper half: widening is a shift, no bfloat16 arithmetic needed.
__attribute__((target("avx512f"))) inline __m512 widen(const at::BFloat16* w) {
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

// Integers, exact in float32 (a scale applies to their sums).
__attribute__((target("avx512f"))) inline __m512 widen(const int16_t* w) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))));
}

}  // namespace qwencodec
