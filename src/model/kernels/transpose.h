// A 16 by 16 block of floats transposed in AVX-512 registers (winograd.cpp's tiles, conv_amx.cpp's
// rows of time).
#pragma once

#include "intrinsics.h"

#include <cstdint>

namespace qwencodec {

// 16 rows of 16 floats (row r at src + r * src_stride) into 16 rows of 16 (dst + j * dst_stride
// gets column j): pairs, then fours, then 128-bit lanes interleaved.
__attribute__((target("avx512f"))) inline void transpose16(const float* src, int64_t src_stride, float* dst,
                                                    int64_t dst_stride) {
  __m512 rows[16], pairs[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) rows[r] = _mm512_loadu_ps(src + r * src_stride);
#pragma GCC unroll 8
  for (int r = 0; r < 16; r += 2) {
    pairs[r] = _mm512_unpacklo_ps(rows[r], rows[r + 1]);
    pairs[r + 1] = _mm512_unpackhi_ps(rows[r], rows[r + 1]);
  }
  // fours[4g + k]: in 128-bit lane l, column 4l + k of rows 4g..4g + 3.
  __m512 fours[16];
#pragma GCC unroll 4
  for (int g = 0; g < 16; g += 4) {
    const __m512d lo0 = _mm512_castps_pd(pairs[g]), lo1 = _mm512_castps_pd(pairs[g + 2]);
    const __m512d hi0 = _mm512_castps_pd(pairs[g + 1]), hi1 = _mm512_castps_pd(pairs[g + 3]);
    fours[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    fours[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    fours[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    fours[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512 ab_lo = _mm512_shuffle_f32x4(fours[k], fours[4 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 ab_hi = _mm512_shuffle_f32x4(fours[k], fours[4 + k], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 cd_lo = _mm512_shuffle_f32x4(fours[8 + k], fours[12 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 cd_hi = _mm512_shuffle_f32x4(fours[8 + k], fours[12 + k], _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_storeu_ps(dst + k * dst_stride, _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_ps(dst + (4 + k) * dst_stride, _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_ps(dst + (8 + k) * dst_stride, _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_ps(dst + (12 + k) * dst_stride, _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(3, 1, 3, 1)));
  }
}

}  // namespace qwencodec
