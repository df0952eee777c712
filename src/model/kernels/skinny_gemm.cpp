// A float32, float16 or bfloat16 weight [out, in] against a few rows of float32 activations
// [rows, in]: the products of a small decode step, whose cost is streaming the weight once.
// 16-bit weights are widened to float32 in registers: half the bytes, the same float32
// accumulation. MKL's
// kernels for such shapes re-pack or re-read the weight for 4 to 64 rows (see skinny_gemm.rs);
// here each tile of 4 weight rows is read from memory once and multiplied, from the first-level
// cache, with every activation row. In AVX-512, or in AVX2 (with FMA and F16C) on CPUs without
// it: the same tiles in vectors of 8 and 16 registers, so fewer activation rows at a time; the
// caller says which (skinny_gemm.rs checks the CPU); skinny_gemm.rs uses libtorch's product
// elsewhere. Errors as in shim.h.
//
// From 8 rows on, a dot product per output spends a sixth of its time summing its vector's lanes;
// 16-bit weights that see such rows (the vocoder's first blocks) are packed at load time in
// blocks of kBlockOutputs outputs, [blocks, in, kBlockOutputs], and multiplied as outer
// products: each input's weights for a block's outputs against 12 rows, no lanes to sum
// (AVX-512 only).

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amx.h"
#include "kernels.h"
#include "shim.h"
#include "widen.h"

namespace {

// Weight rows per tile, in either instruction set.
constexpr int64_t kWeightRows = 4;

// The first `count` of sixteen weights widened to float32, the rest zero.
__attribute__((target("avx512f"))) inline __m512 load_first(const float* w, int64_t count) {
  return _mm512_maskz_loadu_ps(qwencodec::tail_mask(count), w);
}
template <typename H>
__attribute__((target("avx512f"))) inline __m512 load_first(const H* w, int64_t count) {
  // A masked 16-bit load needs AVX-512 BW; the tail is at most once per row.
  H padded[16] = {};
  for (int64_t i = 0; i < count; ++i) padded[i] = w[i];
  return qwencodec::widen(padded);
}

template <typename W>
struct Product {
  const W* weight;    // [out, in]
  const float* rows;  // [n, in]
  const float* bias;  // [out] or null
  float* result;       // [out, n]
  int64_t in;
  int64_t out;
  int64_t n;
};

// Weight rows `first..first + O` against activation rows `row..row + R` in AVX-512: 4 x 6
// accumulators, 4 weight vectors and one activation vector fill its 32 registers. The full
// vectors' loop is kept apart from the masked tail, and the accumulators local: either way (a
// branch in the loop, or a helper taking them by reference) they left the registers and the
// tile ran at half the speed.
template <int O, int R, typename W>
__attribute__((target("avx512f"))) void tile_avx512(const Product<W>& p, int64_t first, int64_t row) {
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
    // The next tile's rows (the weight's next rows), into the second-level cache: Intel's
    // prefetchers alone leave the weight's stream well below memory speed.
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
    float* result = p.result + (first + o) * p.n + row;
    for (int r = 0; r < R; ++r) result[r] = _mm512_reduce_add_ps(sums[o][r]) + bias;
  }
}

// The same tile in AVX2: 8 lanes and 16 registers, so 4 x 2 accumulators (with 4 weight vectors
// and one activation vector). Partial vectors at the end of a row go through a zero-padded copy
// (AVX2 has no masked 16-bit loads), once per row.
__attribute__((target("avx2,fma,f16c"))) inline __m256 widen8(const float* w) { return _mm256_loadu_ps(w); }
__attribute__((target("avx2,fma,f16c"))) inline __m256 widen8(const at::Half* w) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 widen8(const at::BFloat16* w) {
  const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
}

template <typename T>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load_first8(const T* w, int64_t count) {
  T padded[8] = {};
  for (int64_t i = 0; i < count; ++i) padded[i] = w[i];
  return widen8(padded);
}

__attribute__((target("avx2,fma,f16c"))) inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int O, int R, typename W>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const Product<W>& p, int64_t first, int64_t row) {
  const int64_t in = p.in;
  const W* weight = p.weight + first * in;
  const float* rows = p.rows + row * in;
  __m256 sums[O][R];
  for (int o = 0; o < O; ++o) {
    for (int r = 0; r < R; ++r) sums[o][r] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    __m256 w[O];
    for (int o = 0; o < O; ++o) w[o] = widen8(weight + o * in + k);
    for (int o = 0; o < O; ++o) _mm_prefetch(reinterpret_cast<const char*>(weight + (O + o) * in + k), _MM_HINT_T1);
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_loadu_ps(rows + r * in + k);
      for (int o = 0; o < O; ++o) sums[o][r] = _mm256_fmadd_ps(w[o], x, sums[o][r]);
    }
  }
  if (k < in) {
    __m256 w[O];
    for (int o = 0; o < O; ++o) w[o] = load_first8(weight + o * in + k, in - k);
    for (int r = 0; r < R; ++r) {
      const __m256 x = load_first8(rows + r * in + k, in - k);
      for (int o = 0; o < O; ++o) sums[o][r] = _mm256_fmadd_ps(w[o], x, sums[o][r]);
    }
  }
  for (int o = 0; o < O; ++o) {
    const float bias = p.bias ? p.bias[first + o] : 0.0f;
    float* result = p.result + (first + o) * p.n + row;
    for (int r = 0; r < R; ++r) result[r] = sum8(sums[o][r]) + bias;
  }
}

// The instruction sets' tiles and how many activation rows each takes at a time (as many as
// their registers hold).
struct Avx512 {
  static constexpr int kRows = 6;
  template <int O, int R, typename W>
  static void tile(const Product<W>& p, int64_t first, int64_t row) {
    tile_avx512<O, R>(p, first, row);
  }
};
struct Avx2 {
  static constexpr int kRows = 2;
  template <int O, int R, typename W>
  static void tile(const Product<W>& p, int64_t first, int64_t row) {
    tile_avx2<O, R>(p, first, row);
  }
};

// Weight rows `first..first + O` against the last `R` or fewer activation rows from `row`.
template <typename Isa, int O, int R, typename W>
void last_rows(const Product<W>& p, int64_t first, int64_t row) {
  if constexpr (R > 0) {
    if (p.n - row == R) return Isa::template tile<O, R>(p, first, row);
    last_rows<Isa, O, R - 1>(p, first, row);
  }
}

// Weight rows `first..first + O` against every activation row.
template <typename Isa, int O, typename W>
void weight_rows(const Product<W>& p, int64_t first) {
  int64_t row = 0;
  for (; row + Isa::kRows <= p.n; row += Isa::kRows) Isa::template tile<O, Isa::kRows>(p, first, row);
  last_rows<Isa, O, Isa::kRows - 1>(p, first, row);
}

template <typename Isa, typename W>
void multiply(const Product<W>& p) {
  const int64_t tiles = p.out / kWeightRows;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) weight_rows<Isa, kWeightRows>(p, t * kWeightRows);
  });
  for (int64_t first = tiles * kWeightRows; first < p.out; ++first) weight_rows<Isa, 1>(p, first);
}

template <typename W>
void multiply(const Product<W>& p, qwencodec::CpuKernels kernels) {
  if (kernels == qwencodec::CpuKernels::kAvx512) {
    multiply<Avx512>(p);
  } else {
    multiply<Avx2>(p);
  }
}

constexpr int kBlockVectors = 2;
constexpr int64_t kBlockOutputs = 16 * kBlockVectors;
// Rows per outer-product tile: 12 x 2 accumulators, 2 weight vectors and a broadcast row value
// in AVX-512's 32 registers.
constexpr int kOuterRows = 12;

template <typename H>
struct PackedProduct {
  const H* packed;         // [blocks, in, kBlockOutputs], zero past `out`
  const float* rows;       // [n, in]
  const float* bias;       // [out] or null
  float* result;           // [n, out]
  int64_t in, out, n;
};

// Outputs `block * kBlockOutputs..` (those below `out`) of rows `row..row + R`.
template <int R, typename H>
__attribute__((target("avx512f"))) void outer_tile(const PackedProduct<H>& p, int64_t block, int64_t row) {
  const int64_t first = block * kBlockOutputs, in = p.in;
  __mmask16 masks[kBlockVectors];
  __m512 sums[R][kBlockVectors];
  for (int v = 0; v < kBlockVectors; ++v) {
    masks[v] = qwencodec::tail_mask(p.out - first - 16 * v);
    const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(masks[v], p.bias + first + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) sums[r][v] = bias;
  }
  const H* weight = p.packed + block * in * kBlockOutputs;
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

template <int R, typename H>
void outer_rest(const PackedProduct<H>& p, int64_t block, int64_t row) {
  if constexpr (R > 0) {
    if (p.n - row == R) return outer_tile<R>(p, block, row);
    outer_rest<R - 1>(p, block, row);
  }
}

template <typename H>
void multiply_packed(const PackedProduct<H>& p) {
  const int64_t blocks = (p.out + kBlockOutputs - 1) / kBlockOutputs;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      int64_t row = 0;
      for (; row + kOuterRows <= p.n; row += kOuterRows) outer_tile<kOuterRows>(p, block, row);
      outer_rest<kOuterRows - 1>(p, block, row);
    }
  });
}

// In AMX tiles (dtype bf16 where the CPU has AMX-BF16): a bfloat16 weight against the rows
// rounded to bfloat16, float32 sums. Groups of 3 blocks of 16 outputs, packed at load time as
// [groups, in / 32, 3, 16, 16, 2]: for each 32 inputs, the group's three right sides one after
// another (16 pairs of inputs by 16 outputs each, as `tdpbf16ps` takes them), so that a group's
// weight is one stream. The rows, up to 16 at a time, are the left side: each product multiplies
// their next 32 inputs by 16 outputs. The weight is read once per 16 rows; at any count of
// rows a tile of products takes 1 KB of weight per 16 cycles, far more than memory brings.
constexpr int64_t kAmxGroupBlocks = 3;
constexpr int64_t kAmxGroupOutputs = kAmxGroupBlocks * qwencodec::kAmxRows;
// bfloat16 values per tile.
constexpr int64_t kAmxTileValues = qwencodec::kAmxRows * 32;
// Steps of 32 inputs (3 KB of weight) the prefetches run ahead.
constexpr int64_t kAmxAhead = 8;

struct AmxProduct {
  const at::BFloat16* packed;  // [groups, in / 32, 3, 16, 16, 2], zero past `out`
  const at::BFloat16* rows;    // [n, in]
  const float* bias;           // [out] or null
  float* result;               // [n, out]
  int64_t in, out, n;
};

// Group `group`'s outputs of every row, the tiles configured for `configured` rows of the left
// side (16, or the last tile's fewer), which it updates as it configures them for others.
__attribute__((target("avx512f,amx-tile,amx-bf16"))) void amx_group(const AmxProduct& p, int64_t group,
                                                                   int64_t& configured) {
  const int64_t steps = p.in / 32;
  const at::BFloat16* weight = p.packed + group * steps * kAmxGroupBlocks * kAmxTileValues;
  alignas(64) float sums[kAmxGroupBlocks][qwencodec::kAmxRows * 16];
  for (int64_t row = 0; row < p.n; row += qwencodec::kAmxRows) {
    // A left side of fewer rows, not one padded to 16: a one-frame step has 1 to 4.
    const int64_t rows = std::min<int64_t>(qwencodec::kAmxRows, p.n - row);
    if (rows != configured) {
      qwencodec::load_tile_config(rows);
      configured = rows;
    }
    qwencodec::compiler_fence();
    qwencodec::zero_sums();
    const at::BFloat16* x = p.rows + row * p.in;
    const at::BFloat16* w = weight;
    for (int64_t step = 0; step < steps; ++step, w += kAmxGroupBlocks * kAmxTileValues) {
      // The weight's stream into the second-level cache, kAmxAhead steps ahead: Intel's
      // prefetchers alone leave it well below memory speed (as in tile_avx512).
      const char* ahead = reinterpret_cast<const char*>(w + kAmxAhead * kAmxGroupBlocks * kAmxTileValues);
      for (int64_t line = 0; line < kAmxGroupBlocks * kAmxTileValues * 2; line += 64) {
        _mm_prefetch(ahead + line, _MM_HINT_T1);
      }
      // The group's three right sides, one after another.
      qwencodec::multiply_into_three(x + step * 32, p.in * 2, w, kAmxTileValues * 2, 64);
    }
    qwencodec::store_sums(sums);
    qwencodec::compiler_fence();
    for (int64_t block = 0; block < kAmxGroupBlocks; ++block) {
      const int64_t first = group * kAmxGroupOutputs + block * qwencodec::kAmxRows;
      if (first >= p.out) break;
      const __mmask16 mask = qwencodec::tail_mask(p.out - first);
      const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(mask, p.bias + first) : _mm512_setzero_ps();
      for (int64_t r = 0; r < rows; ++r) {
        _mm512_mask_storeu_ps(p.result + (row + r) * p.out + first, mask,
                              _mm512_add_ps(bias, _mm512_load_ps(sums[block] + r * 16)));
      }
    }
  }
}

void multiply_amx(const AmxProduct& p) {
  const int64_t groups = (p.out + kAmxGroupOutputs - 1) / kAmxGroupOutputs;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    int64_t configured = 0;
    for (int64_t group = begin; group < end; ++group) amx_group(p, group, configured);
    qwencodec::release_tiles();
  });
}

at::Tensor few_row_product(const at::Tensor& weight, const at::Tensor& rows, const at::Tensor* bias,
                           qwencodec::CpuKernels kernels) {
  const auto kind = weight.scalar_type();
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() &&
                  (kind == at::kFloat || kind == at::kHalf || kind == at::kBFloat16),
              "the weight must be a contiguous float32, float16 or bfloat16 matrix");
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == weight.size(1) && rows.scalar_type() == at::kFloat,
              "the activations must be float32 rows of the weight's width");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == weight.size(0) && bias->scalar_type() == at::kFloat),
              "the bias must be float32, one per output");
  const at::Tensor input = rows.contiguous();
  const int64_t out = weight.size(0), n = input.size(0);
  at::Tensor result = at::empty({out, n}, input.options());
  const float* bias_data = bias ? bias->data_ptr<float>() : nullptr;
  if (kind == at::kHalf) {
    multiply(Product<at::Half>{weight.data_ptr<at::Half>(), input.data_ptr<float>(), bias_data, result.data_ptr<float>(),
                               weight.size(1), out, n},
             kernels);
  } else if (kind == at::kBFloat16) {
    multiply(Product<at::BFloat16>{weight.data_ptr<at::BFloat16>(), input.data_ptr<float>(), bias_data,
                                   result.data_ptr<float>(), weight.size(1), out, n},
             kernels);
  } else {
    multiply(Product<float>{weight.data_ptr<float>(), input.data_ptr<float>(), bias_data, result.data_ptr<float>(),
                            weight.size(1), out, n},
             kernels);
  }
  return result;
}

}  // namespace

extern "C" {

// `weight`: [out, in] float32, float16 or bfloat16, contiguous; `rows`: [n, in] float32; `bias`: [out]
// float32 or null; `kernels`: the instruction set (qwencodec::CpuKernels, which the CPU must have).
// `*out`: the weight times the rows' transpose plus the bias, [out, n] float32, a new tensor
// (the layout of libtorch's product as ops.rs calls it).
bool qwencodec_skinny_gemm(const at::Tensor* weight, const at::Tensor* rows, const at::Tensor* bias,
                           int32_t kernels, at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::skinny_gemm", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const auto isa = qwencodec::vector_kernels(kernels, "the few-row product");
    *out = new at::Tensor(few_row_product(*weight, *rows, bias, isa));
  });
}

// `packed`: [blocks, in, 32] float16 or bfloat16, contiguous: a weight [out, in]'s outputs in blocks of 32,
// each input's weights for a block side by side, zeros past `out`; `rows`: [n, in] float32;
// `bias`: [out] float32 or null. `*out`: the rows times the weight's transpose plus the bias,
// [n, out] float32, a new tensor.
bool qwencodec_packed_gemm(const at::Tensor* packed, const at::Tensor* rows, const at::Tensor* bias,
                           int64_t out_features, at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::packed_gemm", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const auto kind = packed->scalar_type();
    TORCH_CHECK(packed->dim() == 3 && packed->is_contiguous() && (kind == at::kHalf || kind == at::kBFloat16) &&
                    packed->size(2) == kBlockOutputs &&
                    packed->size(0) == (out_features + kBlockOutputs - 1) / kBlockOutputs,
                "the packed weight must be contiguous float16 or bfloat16 [blocks, in, ", kBlockOutputs, "] for ",
                out_features, " outputs");
    TORCH_CHECK(rows->dim() == 2 && rows->size(1) == packed->size(1) && rows->scalar_type() == at::kFloat,
                "the activations must be float32 rows of the weight's width");
    TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == out_features &&
                          bias->scalar_type() == at::kFloat),
                "the bias must be float32, one per output");
    const at::Tensor input = rows->contiguous();
    at::Tensor result = at::empty({input.size(0), out_features}, input.options());
    const float* bias_data = bias ? bias->data_ptr<float>() : nullptr;
    if (kind == at::kHalf) {
      multiply_packed(PackedProduct<at::Half>{packed->data_ptr<at::Half>(), input.data_ptr<float>(), bias_data,
                                              result.data_ptr<float>(), input.size(1), out_features, input.size(0)});
    } else {
      multiply_packed(PackedProduct<at::BFloat16>{packed->data_ptr<at::BFloat16>(), input.data_ptr<float>(),
                                                  bias_data, result.data_ptr<float>(), input.size(1), out_features,
                                                  input.size(0)});
    }
    *out = new at::Tensor(std::move(result));
  });
}

// `packed`: [groups, in / 32, 3, 16, 16, 2] bfloat16, contiguous: a weight [out, in]'s outputs in
// groups of 48 (zeros past `out`), for each 32 inputs three blocks of 16 outputs, each 16 pairs
// of inputs by 16 outputs by the pair (AMX's right side); for a CPU with AMX-BF16, which the
// caller has checked. `rows`: [n, in] float32, rounded to bfloat16 here; `bias`: [out] float32
// or null. `*out`: the rows times the weight's transpose plus the bias, [n, out] float32, a new
// tensor.
bool qwencodec_amx_gemm(const at::Tensor* packed, const at::Tensor* rows, const at::Tensor* bias,
                        int64_t out_features, at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::skinny_gemm_bf16", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const int64_t groups = (out_features + kAmxGroupOutputs - 1) / kAmxGroupOutputs;
    TORCH_CHECK(packed->dim() == 6 && packed->is_contiguous() && packed->scalar_type() == at::kBFloat16 &&
                    packed->size(0) == groups && packed->size(2) == kAmxGroupBlocks &&
                    packed->size(3) == qwencodec::kAmxPairs && packed->size(4) == qwencodec::kAmxRows &&
                    packed->size(5) == 2,
                "the packed weight must be contiguous bfloat16 [groups, in / 32, ", kAmxGroupBlocks, ", ",
                qwencodec::kAmxPairs, ", ", qwencodec::kAmxRows, ", 2] for ", out_features, " outputs");
    const int64_t in = packed->size(1) * 32;
    TORCH_CHECK(rows->dim() == 2 && rows->size(1) == in && rows->scalar_type() == at::kFloat,
                "the activations must be float32 rows of the weight's width");
    TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == out_features &&
                          bias->scalar_type() == at::kFloat),
                "the bias must be float32, one per output");
    const int64_t n = rows->size(0);
    const at::Tensor input = rows->contiguous();
    // The rows in bfloat16 here, not by libtorch's op: a one-frame step makes dozens of these
    // products of a row or a few, where an op's dispatch costs as much as the rounding.
    // `in` is a multiple of 32: whole pairs, in the words the rounding writes.
    std::vector<at::BFloat16> left(static_cast<size_t>(n * in));
    qwencodec::round_to_bf16(input.data_ptr<float>(), n * in, reinterpret_cast<uint32_t*>(left.data()));
    at::Tensor result = at::empty({n, out_features}, rows->options());
    multiply_amx(AmxProduct{packed->data_ptr<at::BFloat16>(), left.data(),
                            bias ? bias->data_ptr<float>() : nullptr, result.data_ptr<float>(), in, out_features, n});
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
