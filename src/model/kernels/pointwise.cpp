// A float32 weight [out, in] against channels-first activations [B, in, T] (a 1x1 convolution:
// the vocoder's residual units' second convolutions, and the transposed convolutions' taps) on the
// CPU, in AVX-512. Where MKL's float32 products run its AVX2 code (on AMD's CPUs; see shim.rs),
// they and oneDNN's 1x1 convolution reach well under the FMA's rate at the vocoder's shapes,
// these tiles close to it (docs/performance.md).
//
// The weight is packed at load time in blocks of kBlockOutputs outputs, [blocks, in, 8], zeros
// past `out`: each input's weights for a block side by side, broadcast one at a time against
// vectors of 16 columns of that input's row, so the activations are read as they lie, with no
// transposes, and the sums are the outputs' own rows. In dtype bf16 the layers bound by
// arithmetic take bfloat16 products: by `vdpbf16ps` (AVX512_BF16) on CPUs other than Intel's, in
// AMX tiles (AMX-BF16) where the CPU has them. Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "amx.h"
#include "shim.h"
#include "widen.h"

namespace {

// Outputs per packed block (pointwise.rs's BLOCK_OUTPUTS): 8 outputs x 3 vectors of columns are
// 24 accumulators, with 3 column vectors and a broadcast weight in AVX-512's 32 registers.
constexpr int64_t kBlockOutputs = 8;
// Column vectors per tile at most.
constexpr int kVectors = 3;

// The kernel's operands are 32-bit words: float32 values, or (`pairs`) two bfloat16 values of
// consecutive inputs, the lower one first.
struct Product {
  const float* packed;  // [blocks, steps, kBlockOutputs]
  const float* x;       // [B, steps, T]
  const float* bias;    // [out] or null
  float* y;             // [B, out, T]
  int64_t steps, out, columns;
};

// The sums of a tile start from the bias of its outputs (those below `outputs`).
template <int V>
__attribute__((target("avx512f"), always_inline)) inline void start_sums(const Product& p, int64_t first,
                                                                         int64_t outputs, __m512 (&sums)[kBlockOutputs][V]) {
#pragma GCC unroll 8
  for (int o = 0; o < kBlockOutputs; ++o) {
    const __m512 bias = _mm512_set1_ps(p.bias && o < outputs ? p.bias[first + o] : 0.0f);
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) sums[o][v] = bias;
  }
}

template <int V>
__attribute__((target("avx512f"), always_inline)) inline void store_sums(const Product& p, int64_t b, int64_t first,
                                                                         int64_t t0, int64_t outputs,
                                                                         const __mmask16 (&masks)[V],
                                                                         const __m512 (&sums)[kBlockOutputs][V]) {
  float* y = p.y + (b * p.out + first) * p.columns + t0;
#pragma GCC unroll 8
  for (int o = 0; o < kBlockOutputs; ++o) {
    if (o >= outputs) break;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + o * p.columns + 16 * v, masks[v], sums[o][v]);
  }
}

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
  start_sums<V>(p, first, outputs, sums);
  const float* weight = p.packed + block * p.steps * kBlockOutputs;
  const float* row = p.x + b * p.steps * p.columns + t0;
  for (int64_t i = 0; i < p.steps; ++i, weight += kBlockOutputs, row += p.columns) {
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
  store_sums<V>(p, b, first, t0, outputs, masks, sums);
}

// The same tile in bfloat16 products (AVX512_BF16, dtype bf16): each step two inputs, whose
// weights and column values come in pairs, multiplied and added to the float32 sums by one
// `vdpbf16ps`, twice the products of an FMA.
template <int V>
__attribute__((target("avx512f,avx512bf16"))) void tile_pairs(const Product& p, int64_t block, int64_t b, int64_t t0,
                                                              int64_t lanes) {
  const int64_t first = block * kBlockOutputs;
  const int64_t outputs = std::min(kBlockOutputs, p.out - first);
  __mmask16 masks[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) masks[v] = qwencodec::tail_mask(lanes - 16 * v);
  __m512 sums[kBlockOutputs][V];
  start_sums<V>(p, first, outputs, sums);
  const float* weight = p.packed + block * p.steps * kBlockOutputs;
  const float* row = p.x + b * p.steps * p.columns + t0;
  for (int64_t i = 0; i < p.steps; ++i, weight += kBlockOutputs, row += p.columns) {
    __m512bh x[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) x[v] = (__m512bh)_mm512_maskz_loadu_ps(masks[v], row + 16 * v);
#pragma GCC unroll 8
    for (int o = 0; o < kBlockOutputs; ++o) {
      const __m512bh w = (__m512bh)_mm512_set1_ps(weight[o]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) sums[o][v] = _mm512_dpbf16_ps(sums[o][v], w, x[v]);
    }
  }
  store_sums<V>(p, b, first, t0, outputs, masks, sums);
}

struct Float32 {
  template <int V>
  static void tile(const Product& p, int64_t block, int64_t b, int64_t t0, int64_t lanes) {
    ::tile<V>(p, block, b, t0, lanes);
  }
};
struct Pairs {
  template <int V>
  static void tile(const Product& p, int64_t block, int64_t b, int64_t t0, int64_t lanes) {
    tile_pairs<V>(p, block, b, t0, lanes);
  }
};

// Block `block`'s outputs of stream b's columns, in tiles of 48 columns and the rest.
template <typename Format>
void stream_columns(const Product& p, int64_t block, int64_t b) {
  constexpr int64_t kTileColumns = 16 * kVectors;
  int64_t t0 = 0;
  for (; t0 + kTileColumns <= p.columns; t0 += kTileColumns) {
    Format::template tile<kVectors>(p, block, b, t0, kTileColumns);
  }
  const int64_t rest = p.columns - t0;
  if (rest > 32) {
    Format::template tile<3>(p, block, b, t0, rest);
  } else if (rest > 16) {
    Format::template tile<2>(p, block, b, t0, rest);
  } else if (rest > 0) {
    Format::template tile<1>(p, block, b, t0, rest);
  }
}

// Every block's outputs, the blocks split across the threads: each thread reads its blocks'
// weights once, and every stream's columns (in the second-level cache) once per block. Split by
// columns instead, each thread would read every weight once per tile of columns: twice the time
// for the taps of block 2 (3840 x 768 against 32 columns), the same for the late blocks' shapes.
template <typename Format>
void multiply(const Product& p, int64_t batch) {
  const int64_t blocks = (p.out + kBlockOutputs - 1) / kBlockOutputs;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      for (int64_t b = 0; b < batch; ++b) stream_columns<Format>(p, block, b);
    }
  });
}

// Block `block`'s 16 outputs of stream b's columns in AMX tiles (AMX-BF16): the weight's 16 rows
// ([blocks, 16, in] bfloat16, zeros past `out`) as the left side, the stream's columns as
// bfloat16 pairs of inputs ([in / 2, padded]: AMX's layout of a right side, as column_pairs
// lays them out, each row padded with zeros to a whole number of 16 columns) as the right, 48
// columns a pass: each `tdpbf16ps` multiplies 16 outputs' next 32 inputs by 16 columns. The sums
// stay float32 over every input, then take the bias. `in` a multiple of 32; the tile
// configuration (qwencodec::load_tile_config) is the calling thread's.
__attribute__((target("avx512f,amx-tile,amx-bf16"))) void block_amx(const Product& p, const at::BFloat16* packed,
                                                                   int64_t in, int64_t padded, int64_t block,
                                                                   int64_t b) {
  const int64_t first = block * qwencodec::kAmxRows;
  const int64_t outputs = std::min(qwencodec::kAmxRows, p.out - first);
  const int64_t pairs = in / 2;
  const at::BFloat16* weight = packed + first * in;
  const float* words = p.x + b * pairs * padded;
  alignas(64) float sums[3][qwencodec::kAmxRows * 16];
  qwencodec::compiler_fence();
  for (int64_t t0 = 0; t0 < p.columns; t0 += 48) {
    const int64_t tiles = std::min<int64_t>(3, (p.columns - t0 + 15) / 16);
    qwencodec::zero_sums();
    for (int64_t i = 0; i < pairs; i += qwencodec::kAmxPairs) {
      const float* row = words + i * padded + t0;
      qwencodec::load_left(weight + 2 * i, in * 2);
      qwencodec::multiply_into<0>(row, padded * 4);
      if (tiles > 1) qwencodec::multiply_into<1>(row + 16, padded * 4);
      if (tiles > 2) qwencodec::multiply_into<2>(row + 32, padded * 4);
    }
    qwencodec::store_sums(sums);
    qwencodec::compiler_fence();
    for (int64_t o = 0; o < outputs; ++o) {
      const __m512 bias = _mm512_set1_ps(p.bias ? p.bias[first + o] : 0.0f);
      float* y = p.y + (b * p.out + first + o) * p.columns + t0;
      for (int64_t v = 0; v < tiles; ++v) {
        const __mmask16 mask = qwencodec::tail_mask(p.columns - t0 - 16 * v);
        _mm512_mask_storeu_ps(y + 16 * v, mask, _mm512_add_ps(bias, _mm512_load_ps(sums[v] + o * 16)));
      }
    }
  }
}

// multiply in AMX tiles: blocks of 16 outputs across the threads, as there.
void multiply_amx(const Product& p, const at::BFloat16* packed, int64_t in, int64_t padded, int64_t batch) {
  const int64_t blocks = (p.out + qwencodec::kAmxRows - 1) / qwencodec::kAmxRows;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    qwencodec::load_tile_config();
    for (int64_t block = begin; block < end; ++block) {
      for (int64_t b = 0; b < batch; ++b) block_amx(p, packed, in, padded, block, b);
    }
    qwencodec::release_tiles();
  });
}

// Two inputs' rows of `columns` values (`lower`, `upper`) rounded to bfloat16 (to nearest even)
// and paired: words[t] holds both values of column t, the lower input's in its low half.
__attribute__((target("avx512f,avx512bf16"))) void round_in_pairs(const float* lower, const float* upper,
                                                                   int64_t columns, float* words) {
  for (int64_t t = 0; t < columns; t += 16) {
    const __mmask16 mask = qwencodec::tail_mask(columns - t);
    const __m256i low = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, lower + t));
    const __m256i high = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, upper + t));
    const __m512i word =
        _mm512_or_si512(_mm512_cvtepu16_epi32(low), _mm512_slli_epi32(_mm512_cvtepu16_epi32(high), 16));
    _mm512_mask_storeu_ps(words + t, mask, _mm512_castsi512_ps(word));
  }
}

// Each stream's columns [B, in, T] as bfloat16 pairs of inputs, [B, in / 2, padded]: word (b, i,
// t) holds inputs 2i and 2i + 1 of column t, zeros from column T to `padded`.
at::Tensor column_pairs(const at::Tensor& x, int64_t padded) {
  const int64_t batch = x.size(0), in = x.size(1), columns = x.size(2);
  at::Tensor pairs = at::empty({batch, in / 2, padded}, x.options());
  const float* source = x.data_ptr<float>();
  float* words = pairs.data_ptr<float>();
  at::parallel_for(0, batch * in / 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      round_in_pairs(source + 2 * r * columns, source + (2 * r + 1) * columns, columns, words + r * padded);
      std::fill(words + r * padded + columns, words + (r + 1) * padded, 0.0f);
    }
  });
  return pairs;
}

}  // namespace

extern "C" {

// `packed`: [blocks, in, 8] float32, contiguous: a weight [out, in]'s outputs in blocks of 8, each
// input's weights for a block side by side, zeros past `out_features`; or [blocks, in / 2, 8, 2]
// bfloat16, each output's weights of inputs 2i and 2i + 1 side by side, for bfloat16 products (a
// CPU with AVX512_BF16, which the caller has checked); or [blocks, 16, in] bfloat16, the weight's
// rows in blocks of 16 outputs, for bfloat16 products in AMX tiles (qwencodec_amx_bf16 true,
// `in` a multiple of 32). `x`: [B, in, T] float32; `bias`: [out] float32 or null. `*out`: the
// weight times each stream's columns plus the bias, [B, out, T] float32, a new tensor.
bool qwencodec_pointwise(const at::Tensor* packed, const at::Tensor* x, const at::Tensor* bias, int64_t out_features,
                         at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::pointwise", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const bool bf16 = packed->scalar_type() == at::kBFloat16;
    const bool amx = bf16 && packed->dim() == 3;
    const bool pairs = bf16 && !amx;
    const int64_t blocks = (out_features + kBlockOutputs - 1) / kBlockOutputs;
    const int64_t amx_blocks = (out_features + qwencodec::kAmxRows - 1) / qwencodec::kAmxRows;
    TORCH_CHECK(out_features > 0 && packed->is_contiguous() &&
                    (amx    ? packed->size(0) == amx_blocks && packed->size(1) == qwencodec::kAmxRows &&
                               packed->size(2) % 32 == 0
                     : pairs ? packed->dim() == 4 && packed->size(0) == blocks && packed->size(2) == kBlockOutputs &&
                                   packed->size(3) == 2
                             : packed->dim() == 3 && packed->scalar_type() == at::kFloat &&
                                   packed->size(0) == blocks && packed->size(2) == kBlockOutputs),
                "the packed weight must be contiguous float32 [blocks, in, ", kBlockOutputs,
                "] or bfloat16 [blocks, in / 2, ", kBlockOutputs, ", 2] or [blocks, ", qwencodec::kAmxRows,
                ", in] (in a multiple of 32) for ", out_features, " outputs");
    const int64_t in = amx ? packed->size(2) : pairs ? 2 * packed->size(1) : packed->size(1);
    TORCH_CHECK(x->dim() == 3 && x->size(1) == in && x->scalar_type() == at::kFloat,
                "the activations must be float32 [B, ", in, ", T]");
    TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == out_features && bias->scalar_type() == at::kFloat),
                "the bias must be float32, one per output");
    const int64_t columns = x->size(2);
    // AMX tiles read whole rows of 16 columns.
    const int64_t padded = amx ? (columns + 15) / 16 * 16 : columns;
    const at::Tensor input = bf16 ? column_pairs(x->contiguous(), padded) : x->contiguous();
    const int64_t batch = input.size(0);
    at::Tensor result = at::empty({batch, out_features, columns}, input.options());
    const Product p{static_cast<const float*>(packed->data_ptr()), input.data_ptr<float>(),
                    bias ? bias->data_ptr<float>() : nullptr, result.data_ptr<float>(), input.size(1), out_features,
                    columns};
    if (amx) {
      multiply_amx(p, static_cast<const at::BFloat16*>(packed->data_ptr()), in, padded, batch);
    } else if (pairs) {
      multiply<Pairs>(p, batch);
    } else {
      multiply<Float32>(p, batch);
    }
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
