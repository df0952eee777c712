// A causal convolution's context, as a stream's state keeps it (winograd.cpp, conv_amx.cpp): each
// row's last `reach` input columns, the context's then the new ones'.
#pragma once

#include <algorithm>
#include <cstdint>

namespace qwencodec {

// Each of `rows` rows of `context` ([rows, reach]) moved on to the last `reach` columns of itself
// followed by its row of `x` ([rows, columns]), once every reader of the old context is done. A
// few hundred short rows: one thread.
inline void advance_context(float* context, const float* x, int64_t rows, int64_t reach, int64_t columns) {
  const int64_t kept = std::max<int64_t>(0, reach - columns);
  for (int64_t row = 0; row < rows; ++row) {
    float* past = context + row * reach;
    const float* fresh = x + row * columns;
    std::copy(past + reach - kept, past + reach, past);
    std::copy(fresh + columns - (reach - kept), fresh + columns, past + kept);
  }
}

}  // namespace qwencodec
