// A float32 weight [out, in] against channels-first activations [B, in, T] (a 1x1 convolution:
// the vocoder's residual units' second convolutions, and the transposed convolutions' taps) on the
// CPU, in AVX-512. Where MKL's float32 products run its AVX2 code (on AMD's CPUs; see shim.rs),
// they and oneDNN's 1x1 convolution reached 40-93 % of the FMA's rate at the vocoder's shapes,
// these tiles 89-99 % (`measurements/results/2026-12-05-amd-epyc-avx512-pointwise.md`).
//
// The weight is packed at load time in blocks of kBlockOutputs outputs, [blocks, in, 8], zeros
// past `out`: each input's weights for a block side by side, broadcast one at a time against
// vectors of 16 columns of that input's row, so the activations are read as they lie, with no
// transposes, and the sums are the outputs' own rows. Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "shim.h"
#include "widen.h"

namespace {

// Outputs per packed block (pointwise.rs's BLOCK_OUTPUTS): 8 outputs x 3 vectors of columns are
// 24 accumulators, with 3 column vectors and a broadcast weight in AVX-512's 32 registers.
constexpr int64_t kBlockOutputs = 8;
// Column vectors per tile at most.
constexpr int kVectors = 3;

struct Product {
  const float* packed;  // [blocks, in, kBlockOutputs]
  const float* x;       // [B, in, T]
  const float* bias;    // [out] or null
  float* y;             // [B, out, T]
  int64_t in, out, columns;
};

// Block `block`'s outputs of stream b's columns t0..t0 + lanes (at most 16 * V): each input's
// row of V vectors against its 8 weights. The block's weights ([in, 8], a few kilobytes) stay in
// the first-level cache while the stream's columns pass; the rows come from the second.
template <int V>
__attribute__((target("avx512f"))) void tile(const Product& p, int64_t block, int64_t b, int64_t t0, int64_t lanes) {
  const int64_t first = block * kBlockOutputs;
  const int64_t outputs = std::min(kBlockOutputs, p.out - first);
  __mmask16 masks[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) masks[v] = qwencodec::tail_mask(lanes - 16 * v);
  __m512 sums[kBlockOutputs][V];
#pragma GCC unroll 8
  for (int o = 0; o < kBlockOutputs; ++o) {
    const __m512 bias = _mm512_set1_ps(p.bias && o < outputs ? p.bias[first + o] : 0.0f);
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) sums[o][v] = bias;
  }
  const float* weight = p.packed + block * p.in * kBlockOutputs;
  const float* row = p.x + b * p.in * p.columns + t0;
  for (int64_t i = 0; i < p.in; ++i, weight += kBlockOutputs, row += p.columns) {
    __m512 x[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) x[v] = _mm512_maskz_loadu_ps(masks[v], row + 16 * v);
#pragma GCC unroll 8
    for (int o = 0; o < kBlockOutputs; ++o) {
      const __m512 w = _mm512_set1_ps(weight[o]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) sums[o][v] = _mm512_fmadd_ps(w, x[v], sums[o][v]);
    }
  }
  float* y = p.y + (b * p.out + first) * p.columns + t0;
#pragma GCC unroll 8
  for (int o = 0; o < kBlockOutputs; ++o) {
    if (o >= outputs) break;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + o * p.columns + 16 * v, masks[v], sums[o][v]);
  }
}

// Block `block`'s outputs of stream b's columns, in tiles of 48 columns and the rest.
void stream_columns(const Product& p, int64_t block, int64_t b) {
  constexpr int64_t kTileColumns = 16 * kVectors;
  int64_t t0 = 0;
  for (; t0 + kTileColumns <= p.columns; t0 += kTileColumns) tile<kVectors>(p, block, b, t0, kTileColumns);
  const int64_t rest = p.columns - t0;
  if (rest > 32) {
    tile<3>(p, block, b, t0, rest);
  } else if (rest > 16) {
    tile<2>(p, block, b, t0, rest);
  } else if (rest > 0) {
    tile<1>(p, block, b, t0, rest);
  }
}

// Every block's outputs, the blocks split across the threads: each thread reads its blocks'
// weights once, and every stream's columns (in the second-level cache) once per block. Split by
// columns instead, each thread would read every weight once per tile of columns: twice the time
// for the taps of block 2 (3840 x 768 against 32 columns), the same for the late blocks' shapes.
void multiply(const Product& p, int64_t batch) {
  const int64_t blocks = (p.out + kBlockOutputs - 1) / kBlockOutputs;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      for (int64_t b = 0; b < batch; ++b) stream_columns(p, block, b);
    }
  });
}

}  // namespace

extern "C" {

// `packed`: [blocks, in, 8] float32, contiguous: a weight [out, in]'s outputs in blocks of 8, each
// input's weights for a block side by side, zeros past `out_features`; `x`: [B, in, T] float32;
// `bias`: [out] float32 or null. `*out`: the weight times each stream's columns plus the bias,
// [B, out, T] float32, a new tensor.
bool qwencodec_pointwise(const at::Tensor* packed, const at::Tensor* x, const at::Tensor* bias, int64_t out_features,
                         at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::pointwise", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    TORCH_CHECK(packed->dim() == 3 && packed->is_contiguous() && packed->scalar_type() == at::kFloat &&
                    packed->size(2) == kBlockOutputs && out_features > 0 &&
                    packed->size(0) == (out_features + kBlockOutputs - 1) / kBlockOutputs,
                "the packed weight must be contiguous float32 [blocks, in, ", kBlockOutputs, "] for ", out_features,
                " outputs");
    TORCH_CHECK(x->dim() == 3 && x->size(1) == packed->size(1) && x->scalar_type() == at::kFloat,
                "the activations must be float32 [B, ", packed->size(1), ", T]");
    TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == out_features && bias->scalar_type() == at::kFloat),
                "the bias must be float32, one per output");
    const at::Tensor input = x->contiguous();
    const int64_t batch = input.size(0);
    at::Tensor result = at::empty({batch, out_features, input.size(2)}, input.options());
    multiply(Product{packed->data_ptr<float>(), input.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
                     result.data_ptr<float>(), input.size(1), out_features, input.size(2)},
             batch);
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
