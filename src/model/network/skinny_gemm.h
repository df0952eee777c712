// The few-row float32 product of skinny_gemm.cpp, for the other kernels that need it.
#pragma once

#include <cstdint>

namespace qwencodec {

// `weight` [out, in] times each of the `n` rows of `rows` [n, in], plus `bias` (`out` values, or
// null): `result` [out, n]. All float32 and contiguous; AVX-512 only. Splits the weight's rows
// across threads unless called from a parallel region.
void skinny_product(const float* weight, const float* rows, const float* bias, float* result, int64_t in,
                    int64_t out, int64_t n);

}  // namespace qwencodec
