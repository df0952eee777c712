// RMSNorm, weight * (x * rsqrt(mean(x^2) + eps)) over the last dimension, in one op on the CPU:
// libtorch's takes six (square, mean, add, rsqrt and two products), and a one-frame step runs it
// on single rows of a few hundred values, where each op's dispatch costs more than its work.
// Plain C++, for every CPU. The mean of squares is summed in double. Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "shim.h"

namespace {

// Elements per thread below which a split costs more than it saves.
constexpr int64_t kGrain = 32768;

void normalize_rows(const float* x, const float* weight, float* y, int64_t width, double eps, int64_t begin,
                    int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const float* in = x + row * width;
    float* out = y + row * width;
    double squares = 0.0;
    for (int64_t i = 0; i < width; ++i) squares += static_cast<double>(in[i]) * in[i];
    const auto scale = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(width) + eps));
    for (int64_t i = 0; i < width; ++i) out[i] = weight[i] * (in[i] * scale);
  }
}

at::Tensor normalized(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "RMSNorm takes float32 rows on the CPU");
  const int64_t width = x.size(-1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == width && weight.scalar_type() == at::kFloat,
              "an RMSNorm weight is float32, one per column (", width, "), not ", weight.sizes());
  const at::Tensor input = x.contiguous();
  at::Tensor result = at::empty_like(input);
  const int64_t rows = width == 0 ? 0 : input.numel() / width;
  const float* in = input.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* y = result.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, width)),
                   [&](int64_t begin, int64_t end) { normalize_rows(in, w, y, width, eps, begin, end); });
  return result;
}

}  // namespace

extern "C" {

// `x`: [..., width] float32; `weight`: `width` float32 values, contiguous. `*out`: the
// normalized rows, a new contiguous tensor of `x`'s shape.
bool qwencodec_rms_norm(const at::Tensor* x, const at::Tensor* weight, double eps, at::Tensor** out, char* error,
                        size_t error_size) {
  RECORD_FUNCTION("qwencodec::rms_norm", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] { *out = new at::Tensor(normalized(*x, *weight, eps)); });
}

}  // extern "C"
