// A float32 or float16 weight [out, in] against a few rows of float32 activations [rows, in]:
// the products of a small decode step, whose cost is streaming the weight once. float16 weights
// are widened to float32 in registers: half the bytes, the same float32 accumulation. MKL's
// kernels for such shapes re-pack or re-read the weight for 4 to 64 rows (see skinny_gemm.rs);
// here each tile of 4 weight rows is read from memory once and multiplied, from the first-level
// cache, with every activation row. AVX-512 only (shim.rs checks the CPU); skinny_gemm.rs uses
// libtorch's product elsewhere. Errors as in shim.h.
//
// From 8 rows on, a dot product per output spends a sixth of its time summing its vector's lanes;
// float16 weights that see such rows (the vocoder's first blocks) are packed at load time in
// blocks of kBlockOutputs outputs, [blocks, in, kBlockOutputs], and multiplied as outer
// products: each input's weights for a block's outputs against 12 rows, no lanes to sum.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels.h"
#include "shim.h"
#include "widen.h"

namespace {

// Weight rows per tile; activation rows per tile: 4 x 6 accumulators, 4 weight vectors and one
// activation vector fill AVX-512's 32 registers.
constexpr int64_t kWeightRows = 4;
constexpr int kActivationRows = 6;

// The first `count` of sixteen weights widened to float32, the rest zero.
__attribute__((target("avx512f"))) inline __m512 load_first(const float* w, int64_t count) {
  return _mm512_maskz_loadu_ps(qwencodec::tail_mask(count), w);
}
__attribute__((target("avx512f"))) inline __m512 load_first(const at::Half* w, int64_t count) {
  // A masked 16-bit load needs AVX-512 BW; the tail is at most once per row.
  at::Half padded[16] = {};
  for (int64_t i = 0; i < count; ++i) padded[i] = w[i];
  return qwencodec::widen(padded);
}

template <typename W>
struct Product {
  const W* weight;    // [out, in]
  const float* rows;  // [n, in]
  const float* bias;  // [out] or null
  // Output o of row r at result[o * out_stride + r * row_stride]: [out, n] or [n, out].
  float* result;
  int64_t out_stride, row_stride;
  int64_t in;
  int64_t out;
  int64_t n;
};

// Weight rows `first..first + O` against activation rows `row..row + R`. The full vectors' loop
// is kept apart from the masked tail, and the accumulators local: either way (a branch in the
// loop, or a helper taking them by reference) they left the registers and the tile ran at half
// the speed.
template <int O, int R, typename W>
__attribute__((target("avx512f"))) void tile(const Product<W>& p, int64_t first, int64_t row) {
  const int64_t in = p.in;
  const W* weight = p.weight + first * in;
  const float* rows = p.rows + row * in;
  __m512 sums[O][R];
  for (int o = 0; o < O; ++o) {
    for (int r = 0; r < R; ++r) sums[o][r] = _mm512_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    __m512 w[O];
    for (int o = 0; o < O; ++o) w[o] = qwencodec::widen(weight + o * in + k);
    // The next tile's rows (the weight's next rows), into the second-level cache: without, a
    // weight streamed from memory at 13-18 GB/s where it now takes 19-25 on the Xeon.
    for (int o = 0; o < O; ++o) _mm_prefetch(reinterpret_cast<const char*>(weight + (O + o) * in + k), _MM_HINT_T1);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_loadu_ps(rows + r * in + k);
      for (int o = 0; o < O; ++o) sums[o][r] = _mm512_fmadd_ps(w[o], x, sums[o][r]);
    }
  }
  if (k < in) {
    const __mmask16 mask = qwencodec::tail_mask(in - k);
    __m512 w[O];
    for (int o = 0; o < O; ++o) w[o] = load_first(weight + o * in + k, in - k);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_maskz_loadu_ps(mask, rows + r * in + k);
      for (int o = 0; o < O; ++o) sums[o][r] = _mm512_fmadd_ps(w[o], x, sums[o][r]);
    }
  }
  for (int o = 0; o < O; ++o) {
    const float bias = p.bias ? p.bias[first + o] : 0.0f;
    float* result = p.result + (first + o) * p.out_stride + row * p.row_stride;
    for (int r = 0; r < R; ++r) result[r * p.row_stride] = _mm512_reduce_add_ps(sums[o][r]) + bias;
  }
}

// Weight rows `first..first + O` against every activation row.
template <int O, typename W>
void weight_rows(const Product<W>& p, int64_t first) {
  int64_t row = 0;
  for (; row + kActivationRows <= p.n; row += kActivationRows) tile<O, kActivationRows>(p, first, row);
  switch (p.n - row) {
    case 1: tile<O, 1>(p, first, row); break;
    case 2: tile<O, 2>(p, first, row); break;
    case 3: tile<O, 3>(p, first, row); break;
    case 4: tile<O, 4>(p, first, row); break;
    case 5: tile<O, 5>(p, first, row); break;
    default: break;
  }
}

template <typename W>
void multiply(const Product<W>& p) {
  const int64_t tiles = p.out / kWeightRows;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) weight_rows<kWeightRows>(p, t * kWeightRows);
  });
  for (int64_t first = tiles * kWeightRows; first < p.out; ++first) weight_rows<1>(p, first);
}

constexpr int kBlockVectors = 2;
constexpr int64_t kBlockOutputs = 16 * kBlockVectors;
// Rows per outer-product tile: 12 x 2 accumulators, 2 weight vectors and a broadcast row value
// in AVX-512's 32 registers.
constexpr int kOuterRows = 12;

struct PackedProduct {
  const at::Half* packed;  // [blocks, in, kBlockOutputs], zero past `out`
  const float* rows;       // [n, in]
  const float* bias;       // [out] or null
  float* result;           // [n, out]
  int64_t in, out, n;
};

// Outputs `block * kBlockOutputs..` (those below `out`) of rows `row..row + R`.
template <int R>
__attribute__((target("avx512f"))) void outer_tile(const PackedProduct& p, int64_t block, int64_t row) {
  const int64_t first = block * kBlockOutputs, in = p.in;
  __mmask16 masks[kBlockVectors];
  __m512 sums[R][kBlockVectors];
  for (int v = 0; v < kBlockVectors; ++v) {
    masks[v] = qwencodec::tail_mask(p.out - first - 16 * v);
    const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(masks[v], p.bias + first + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) sums[r][v] = bias;
  }
  const at::Half* weight = p.packed + block * in * kBlockOutputs;
  const float* x = p.rows + row * in;
  for (int64_t k = 0; k < in; ++k, weight += kBlockOutputs) {
    __m512 w[kBlockVectors];
    for (int v = 0; v < kBlockVectors; ++v) w[v] = qwencodec::widen(weight + 16 * v);
    // The block's weights are one stream; 16 inputs ahead is a kilobyte.
    _mm_prefetch(reinterpret_cast<const char*>(weight + 16 * kBlockOutputs), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * in + k]);
      for (int v = 0; v < kBlockVectors; ++v) sums[r][v] = _mm512_fmadd_ps(w[v], a, sums[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* result = p.result + (row + r) * p.out + first;
    for (int v = 0; v < kBlockVectors; ++v) _mm512_mask_storeu_ps(result + 16 * v, masks[v], sums[r][v]);
  }
}

template <int R>
void outer_rest(const PackedProduct& p, int64_t block, int64_t row) {
  if constexpr (R > 0) {
    if (p.n - row == R) return outer_tile<R>(p, block, row);
    outer_rest<R - 1>(p, block, row);
  }
}

void multiply_packed(const PackedProduct& p) {
  const int64_t blocks = (p.out + kBlockOutputs - 1) / kBlockOutputs;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      int64_t row = 0;
      for (; row + kOuterRows <= p.n; row += kOuterRows) outer_tile<kOuterRows>(p, block, row);
      outer_rest<kOuterRows - 1>(p, block, row);
    }
  });
}

}  // namespace

namespace qwencodec {

at::Tensor few_row_product(const at::Tensor& weight, const at::Tensor& rows, const at::Tensor* bias,
                           bool rows_first) {
  const auto kind = weight.scalar_type();
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && (kind == at::kFloat || kind == at::kHalf),
              "the weight must be a contiguous float32 or float16 matrix");
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == weight.size(1) && rows.scalar_type() == at::kFloat,
              "the activations must be float32 rows of the weight's width");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == weight.size(0) && bias->scalar_type() == at::kFloat),
              "the bias must be float32, one per output");
  const at::Tensor input = rows.contiguous();
  const int64_t out = weight.size(0), n = input.size(0);
  at::Tensor result = rows_first ? at::empty({n, out}, input.options()) : at::empty({out, n}, input.options());
  const float* bias_data = bias ? bias->data_ptr<float>() : nullptr;
  const int64_t out_stride = rows_first ? 1 : n, row_stride = rows_first ? out : 1;
  if (kind == at::kHalf) {
    multiply(Product<at::Half>{weight.data_ptr<at::Half>(), input.data_ptr<float>(), bias_data, result.data_ptr<float>(),
                               out_stride, row_stride, weight.size(1), out, n});
  } else {
    multiply(Product<float>{weight.data_ptr<float>(), input.data_ptr<float>(), bias_data, result.data_ptr<float>(),
                            out_stride, row_stride, weight.size(1), out, n});
  }
  return result;
}

}  // namespace qwencodec

extern "C" {

// `weight`: [out, in] float32 or float16, contiguous; `rows`: [n, in] float32; `bias`: [out]
// float32 or null. `*out`: the weight times the rows' transpose plus the bias, [out, n] float32,
// a new tensor (the layout of libtorch's product as ops.rs calls it).
bool qwencodec_skinny_gemm(const at::Tensor* weight, const at::Tensor* rows, const at::Tensor* bias,
                           at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::skinny_gemm", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    *out = new at::Tensor(qwencodec::few_row_product(*weight, *rows, bias, false));
  });
}

// `packed`: [blocks, in, 32] float16, contiguous: a weight [out, in]'s outputs in blocks of 32,
// each input's weights for a block side by side, zeros past `out`; `rows`: [n, in] float32;
// `bias`: [out] float32 or null. `*out`: the rows times the weight's transpose plus the bias,
// [n, out] float32, a new tensor.
bool qwencodec_packed_gemm(const at::Tensor* packed, const at::Tensor* rows, const at::Tensor* bias,
                           int64_t out_features, at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::packed_gemm", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    TORCH_CHECK(packed->dim() == 3 && packed->is_contiguous() && packed->scalar_type() == at::kHalf &&
                    packed->size(2) == kBlockOutputs &&
                    packed->size(0) == (out_features + kBlockOutputs - 1) / kBlockOutputs,
                "the packed weight must be contiguous float16 [blocks, in, ", kBlockOutputs, "] for ", out_features,
                " outputs");
    TORCH_CHECK(rows->dim() == 2 && rows->size(1) == packed->size(1) && rows->scalar_type() == at::kFloat,
                "the activations must be float32 rows of the weight's width");
    TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == out_features &&
                          bias->scalar_type() == at::kFloat),
                "the bias must be float32, one per output");
    const at::Tensor input = rows->contiguous();
    at::Tensor result = at::empty({input.size(0), out_features}, input.options());
    multiply_packed(PackedProduct{packed->data_ptr<at::Half>(), input.data_ptr<float>(),
                                  bias ? bias->data_ptr<float>() : nullptr, result.data_ptr<float>(), input.size(1),
                                  out_features, input.size(0)});
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
