// A causal convolution with few multiply-adds per output column, summed directly on float32
// activations on the CPU: a depthwise one (a channel's taps on its own row) or one of few output
// channels (the vocoder's last, to one channel). oneDNN's kernels, which libtorch's conv1d calls,
// spent hundreds of microseconds on each of these for what is a few thousand vector operations.
// In AVX-512 or AVX2 with FMA (the caller names which, having checked the CPU). Errors as in
// shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels.h"
#include "shim.h"
#include "widen.h"

namespace {

// Output vectors (of 16 columns in AVX-512, 8 in AVX2) summed side by side: independent chains,
// so that each multiply-add need not wait for the one before.
constexpr int kVectors = 4;
constexpr int64_t kUnitColumns = 16 * kVectors;
constexpr int64_t kUnitColumns8 = 8 * kVectors;

// Multiply-adds per thread below which a split costs more than it saves.
constexpr int64_t kGrain = 1 << 16;

struct Convolution {
  const float* input;   // [B, in, length]: the context, then the new columns
  const float* weight;  // [out, in / groups, taps]
  const float* bias;    // [out]
  float* y;             // [B, out, columns]
  int64_t in, out, groups, group_inputs, taps, dilation, length, columns;
};

// Columns `t0..t0 + kUnitColumns` (those below `columns`) of output row (b, o).
__attribute__((target("avx512f"))) void unit(const Convolution& c, int64_t b, int64_t o, int64_t t0) {
  __m512 sums[kVectors];
  __mmask16 masks[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    sums[v] = _mm512_set1_ps(c.bias[o]);
    masks[v] = qwencodec::tail_mask(c.columns - t0 - 16 * v);
  }
  // The first input channel of output o's group.
  const int64_t first = o / (c.out / c.groups) * c.group_inputs;
  for (int64_t i = 0; i < c.group_inputs; ++i) {
    const float* row = c.input + (b * c.in + first + i) * c.length + t0;
    const float* taps = c.weight + (o * c.group_inputs + i) * c.taps;
    for (int64_t k = 0; k < c.taps; ++k) {
      const __m512 w = _mm512_set1_ps(taps[k]);
      const float* shifted = row + k * c.dilation;
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) {
        sums[v] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(masks[v], shifted + 16 * v), sums[v]);
      }
    }
  }
  float* result = c.y + (b * c.out + o) * c.columns + t0;
#pragma GCC unroll 4
  for (int v = 0; v < kVectors; ++v) _mm512_mask_storeu_ps(result + 16 * v, masks[v], sums[v]);
}

// `unit` in AVX2: columns `t0..t0 + kUnitColumns8`.
__attribute__((target("avx2,fma"))) void unit8(const Convolution& c, int64_t b, int64_t o, int64_t t0) {
  __m256 sums[kVectors];
  __m256i masks[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    sums[v] = _mm256_set1_ps(c.bias[o]);
    masks[v] = qwencodec::tail_mask8(c.columns - t0 - 8 * v);
  }
  const int64_t first = o / (c.out / c.groups) * c.group_inputs;
  for (int64_t i = 0; i < c.group_inputs; ++i) {
    const float* row = c.input + (b * c.in + first + i) * c.length + t0;
    const float* taps = c.weight + (o * c.group_inputs + i) * c.taps;
    for (int64_t k = 0; k < c.taps; ++k) {
      const __m256 w = _mm256_set1_ps(taps[k]);
      const float* shifted = row + k * c.dilation;
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) {
        sums[v] = _mm256_fmadd_ps(w, _mm256_maskload_ps(shifted + 8 * v, masks[v]), sums[v]);
      }
    }
  }
  float* result = c.y + (b * c.out + o) * c.columns + t0;
#pragma GCC unroll 4
  for (int v = 0; v < kVectors; ++v) _mm256_maskstore_ps(result + 8 * v, masks[v], sums[v]);
}

}  // namespace

extern "C" {

// `input`: [B, in, reach + T] float32, the context ((taps - 1) * dilation columns) then the new
// columns; `weight`: [out, in / groups, taps] and `bias`: [out] float32; `groups` 1 or `in` (then
// `out` a multiple of it). All contiguous. `kernels`: the instruction set (qwencodec::CpuKernels,
// AVX2 or AVX-512). `*out`: the convolution's T new columns, [B, out, T].
bool qwencodec_direct_conv(const at::Tensor* input, const at::Tensor* weight, const at::Tensor* bias,
                           int64_t dilation, int64_t groups, int32_t kernels, at::Tensor** out, char* error,
                           size_t error_size) {
  RECORD_FUNCTION("qwencodec::direct_conv", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const auto isa = qwencodec::vector_kernels(kernels, "a direct convolution");
    TORCH_CHECK(input->dim() == 3 && input->scalar_type() == at::kFloat && input->is_contiguous(),
                "a direct convolution's input is contiguous float32 [B, channels, columns]");
    const int64_t in = input->size(1);
    TORCH_CHECK(groups == 1 || groups == in, "a direct convolution is dense or depthwise, not ", groups,
                " groups of ", in, " channels");
    TORCH_CHECK(weight->dim() == 3 && weight->scalar_type() == at::kFloat && weight->is_contiguous() &&
                    weight->size(1) == in / groups && weight->size(0) % groups == 0,
                "a direct convolution's weight is contiguous float32 [out, ", in / groups, ", taps]");
    const int64_t out_channels = weight->size(0);
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_channels && bias->scalar_type() == at::kFloat,
                "a direct convolution's bias is float32, one per output channel");
    const int64_t taps = weight->size(2);
    TORCH_CHECK(dilation >= 1 && taps >= 1, "a direct convolution of ", taps, " taps at dilation ", dilation);
    const int64_t reach = (taps - 1) * dilation;
    const int64_t length = input->size(2);
    TORCH_CHECK(length > reach, "a direct convolution's input holds its ", reach,
                " columns of context and at least one more, not ", length);
    const int64_t batch = input->size(0);
    const int64_t columns = length - reach;
    at::Tensor result = at::empty({batch, out_channels, columns}, input->options());
    const Convolution c{input->data_ptr<float>(), weight->data_ptr<float>(), bias->data_ptr<float>(),
                        result.data_ptr<float>(), in, out_channels, groups, in / groups, taps, dilation, length, columns};
    const bool wide = isa == qwencodec::CpuKernels::kAvx512;
    const int64_t unit_columns = wide ? kUnitColumns : kUnitColumns8;
    const int64_t per_row = (columns + unit_columns - 1) / unit_columns;
    const int64_t units = batch * out_channels * per_row;
    const int64_t unit_work = c.group_inputs * taps * unit_columns;
    at::parallel_for(0, units, std::max<int64_t>(1, kGrain / unit_work), [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        const int64_t row = u / per_row, b = row / out_channels, o = row % out_channels;
        const int64_t t0 = u % per_row * unit_columns;
        if (wide) {
          unit(c, b, o, t0);
        } else {
          unit8(c, b, o, t0);
        }
      }
    });
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
