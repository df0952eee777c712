// The kernels' vector helpers. Sixteen weights as float32 in a register, from float32 or
// 16 bits: the kernels keep weights in 16 bits where reading them is the cost (dtypes f16 and
// bf16), so that only the weights are rounded and the activations and sums stay float32. The mask of a
// vector's first lanes (AVX-512's and AVX2's), for the partial vector at the end of a row. And float32 values rounded to
// bfloat16, for the bfloat16 products (AVX512_BF16, AMX-BF16).
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

// The first `lanes` of AVX2's eight (none for 0 or fewer, all for 8 or more), as its masked loads
// and stores take them: a lane's top bit.
__attribute__((target("avx2"))) inline __m256i tail_mask8(int64_t lanes) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(lanes, 0, 8))), index);
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

// `count` floats (even) rounded to bfloat16, to nearest even, in their order.
__attribute__((target("avx512f,avx512bf16"))) inline void round_to_bf16(const float* values, int64_t count,
                                                                        uint32_t* pairs) {
  int64_t j = 0;
  for (; j + 32 <= count; j += 32) {
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(values + j + 16), _mm512_loadu_ps(values + j));
    _mm512_storeu_si512(pairs + j / 2, (__m512i)both);
  }
  for (; j < count; j += 2) {
    const __m256bh two = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(0x3, values + j));
    pairs[j / 2] = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128((__m256i)two)));
  }
}

}  // namespace qwencodec
