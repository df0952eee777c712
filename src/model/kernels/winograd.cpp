// A convolution by Winograd tiles (winograd.rs) on float32 activations on the CPU: the inputs
// into tiles of the transform domain, one product per point with the transformed weights, and
// the products back into outputs. In AVX-512 or AVX2 (as `kernels` says; shim.rs checks the CPU):
// the two share the layout and the work's split and differ in the few functions that hold
// registers (`Avx512` and `Avx2` below). Errors as in shim.h.
//
// A tile holds `m` outputs `dilation` columns apart and the `points` inputs they read: tile k of
// phase r (r < dilation) has outputs k * m * dilation + r + i * dilation, i < m.
//
// The work goes in pieces, each a range of tiles of every phase of one stream, or the whole of
// several streams' small steps, so that a piece's tiles and products stay in a core's caches:
// whole, they can take tens of megabytes, and the products then wait on memory. With several
// pieces each thread runs whole pieces; a single piece (a small step) spreads each of its parts
// across the threads instead. Every piece reads every transformed weight once.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "context.h"
#include "kernels.h"
#include "shim.h"
#include "transpose.h"
#include "widen.h"

namespace {

// Inputs per tile at most: a tile's inputs stay in registers.
constexpr int kMaxPoints = 16;

// About what a core's L2 cache holds: a piece's tiles take at most this ...
constexpr int64_t kPieceBytes = 1 << 20;
// ... but at least this many tiles: every piece reads all of the transformed weights once.
constexpr int64_t kMinPieceTiles = 256;
// A stream's tiles are nonetheless split into a piece per thread where each gets this many:
// a thread then runs its piece's three parts without waiting for the others between them, at
// the cost of reading every weight once per thread. That pays where the tiles are many and the
// weights few (the late blocks of a one-frame step), not with a few dozen tiles of many
// channels.
constexpr int64_t kMinThreadPieceTiles = 48;

// Output channels per block of the transformed weights (winograd.rs's BLOCK_OUTPUTS): three
// vectors of 16 in AVX-512, two units of three vectors of 8 in AVX2 (see products).
constexpr int64_t kBlockOutputs = 48;

// Columns 0..count of 16 rows (row r at rows + r * stride) side by side: columns[j * 16 + r].
__attribute__((target("avx512f"))) void rows_to_columns(const float* rows, int64_t stride, int64_t count,
                                                        float* columns) {
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) qwencodec::transpose16(rows + j, stride, columns + j * 16, 16);
  for (; j < count; ++j) {
    for (int64_t r = 0; r < 16; ++r) columns[j * 16 + r] = rows[r * stride + j];
  }
}

// The inverse: columns[j * 16 + r] into rows[r * stride + j], j < count.
__attribute__((target("avx512f"))) void columns_to_rows(const float* columns, int64_t count, float* rows,
                                                        int64_t stride) {
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) qwencodec::transpose16(columns + j * 16, 16, rows + j, stride);
  for (; j < count; ++j) {
    for (int64_t r = 0; r < 16; ++r) rows[r * stride + j] = columns[j * 16 + r];
  }
}

// The thread buffers (qwencodec::thread_buffer) a piece's parts use at once.
struct PieceBuffer;
struct ColumnsBuffer;
struct OutputsBuffer;

struct Convolution {
  // The input: the stream's context (the kernel's reach into the past), then the new columns.
  const float* context;  // [B, in, reach]
  const float* x;        // [B, in, columns]
  // [points, blocks, in, kBlockOutputs] (see products): float32, or 16-bit integers whose
  // products are multiplied by `scales` [points, blocks * kBlockOutputs] (null otherwise); or,
  // with `bf16`, bfloat16 in pairs of inputs, [points, blocks, in / 2, kBlockOutputs, 2].
  const void* weights;
  const float* scales;
  const float* bias;     // [out]
  const float* bt;       // [points, points]
  const float* at;       // [m, points]
  float* y;              // [B, out, columns]
  int64_t in, out, reach, columns;
  int64_t m, points, dilation;
  int64_t tiles;  // tiles per phase: ceil(columns / (m * dilation))
  bool bf16;      // the products in bfloat16 (see product_block_pairs)

  int64_t block() const { return m * dilation; }
};

// Tiles k0..k1 of every phase of streams b0..b1. Tile t = base(b) + r * (k1 - k0) + (k - k0) of
// the piece.
struct Piece {
  int64_t b0, b1, k0, k1;
  int64_t stream_count(const Convolution& c) const { return c.dilation * (k1 - k0); }
  int64_t count(const Convolution& c) const { return (b1 - b0) * stream_count(c); }
  // The first tile of stream b.
  int64_t base(const Convolution& c, int64_t b) const { return (b - b0) * stream_count(c); }
};

// The tiles of one group of 16 channels from their columns side by side (`columns[column * 16 +
// lane]`, the first `lanes` used): all P points' sums at once, each input read once, so that the
// sums are independent chains. P known when compiling keeps the inputs and sums in registers;
// the coefficients are all multiplied, zeros included, which costs less than branching on them.
template <int P>
__attribute__((target("avx512f"))) void group_tiles(const Convolution& c, const Piece& piece, const float* columns,
                                                    float* v, int64_t base, int64_t c0, int64_t lanes) {
  const __mmask16 mask = qwencodec::tail_mask(lanes);
  const int64_t count = piece.count(c);
  const int64_t tiles = piece.k1 - piece.k0;
  const float* bt = c.bt;
  for (int64_t r = 0; r < c.dilation; ++r) {
    for (int64_t k = 0; k < tiles; ++k) {
      const float* inputs = columns + (k * c.block() + r) * 16;
      __m512 sums[P];
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) sums[p] = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int j = 0; j < P; ++j) {
        const __m512 input = _mm512_loadu_ps(inputs + j * c.dilation * 16);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) sums[p] = _mm512_fmadd_ps(_mm512_set1_ps(bt[p * P + j]), input, sums[p]);
      }
      float* tile = v + (base + r * tiles + k) * c.in + c0;
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) _mm512_mask_storeu_ps(tile + p * count * c.in, mask, sums[p]);
    }
  }
}

// How far ahead of the row they multiply the products prefetch their weight block: a small
// step's products read each block once, from memory, and wait on it without; a few rows ahead
// are too close.
constexpr int64_t kPrefetchBytes = 6144;

// Inputs summed in one chain, whose sum is then added to the others': one chain over all of them
// (up to 1536) rounds the float32 decode to 3.1e-5 from float64, where this keeps 1.9e-5.
constexpr int64_t kSumInputs = 64;

// The R tiles' sums, V vectors each, into their rows of `result` (`out` apart; the last vector's
// first lanes as `last_mask` says): each vector times its `scale` where there is one (int16
// weights), added to what the rows hold but for the first chain of inputs. The scales are read
// here, not held through the products' loop: 9 tiles' sums and the weights take 31 of the 32
// registers, and GCC spilled the sums to the stack at every input with the scales' three.
template <int V, int R>
__attribute__((target("avx512f"), always_inline)) inline void store_sums(const __m512 (&sums)[R][V],
                                                                          const float* scale, float* result,
                                                                          int64_t out, __mmask16 last_mask,
                                                                          bool first) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* row = result + r * out;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 mask = v + 1 < V ? static_cast<__mmask16>(0xffff) : last_mask;
      __m512 sum = sums[r][v];
      if (scale) sum = _mm512_mul_ps(sum, _mm512_loadu_ps(scale + 16 * v));
      if (!first) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, row + 16 * v));
      _mm512_mask_storeu_ps(row + 16 * v, mask, sum);
    }
  }
}

// R tiles [R, in] (rows `in` apart) against a unit of the weight block [in, kBlockOutputs]
// (float32, or int16 whose sums `scale` multiplies, one per output), whose first V vectors are
// used (the last one's first `last` lanes; the block's padding is zeros, so its loads are whole),
// into results (rows `out` apart): result[r][o] = sum over i of tiles[r][i] * weight[i][o]. Each
// tile value is broadcast against whole vectors of outputs, so no sum is reduced across lanes,
// and the block stays in the core's cache while the piece's tiles pass. Its first pass reads it
// from memory, ahead of use (kPrefetchBytes). The sums go in chains of kSumInputs. The loops are
// unrolled by pragma: without, GCC kept the accumulators in an array on the stack and stored
// them on every step.
template <int V, int R, typename W>
__attribute__((target("avx512f"))) void product_block(const float* tiles, const W* weight, const float* scale,
                                                      float* result, int64_t in, int64_t out, int64_t last) {
  const __mmask16 last_mask = qwencodec::tail_mask(last);
  for (int64_t i0 = 0; i0 < in; i0 += kSumInputs) {
    const int64_t i1 = std::min(in, i0 + kSumInputs);
    __m512 sums[R][V];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) sums[r][v] = _mm512_setzero_ps();
    }
    for (int64_t i = i0; i < i1; ++i) {
      const W* w = weight + i * kBlockOutputs;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(w + 16 * v) + kPrefetchBytes, _MM_HINT_T0);
      }
      __m512 weights[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) weights[v] = qwencodec::widen(w + 16 * v);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(tiles[r * in + i]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) sums[r][v] = _mm512_fmadd_ps(weights[v], x, sums[r][v]);
      }
    }
    store_sums<V, R>(sums, std::is_same_v<W, int16_t> ? scale : nullptr, result, out, last_mask, i0 == 0);
  }
}

// product_block in bfloat16 products (AVX512_BF16), for dtype bf16 where the CPU has them: the
// tiles rounded to bfloat16 and taken two inputs at a time (`pairs`: tile r's inputs 2i and 2i + 1
// at pairs[r * in / 2 + i]), against the block's weights in the same pairs ([in / 2,
// kBlockOutputs, 2]); each instruction multiplies both and adds them to a float32 sum, twice the
// products of an FMA. The sums stay float32, in chains of kSumInputs inputs as above. AVX-512
// only: a unit is one whole block (kUnitOutputs).
template <int V, int R>
__attribute__((target("avx512f,avx512bf16"))) void product_block_pairs(const uint32_t* pairs,
                                                                       const at::BFloat16* weight, float* result,
                                                                       int64_t in, int64_t out, int64_t last) {
  const __mmask16 last_mask = qwencodec::tail_mask(last);
  const int64_t count = in / 2;
  for (int64_t i0 = 0; i0 < count; i0 += kSumInputs / 2) {
    const int64_t i1 = std::min(count, i0 + kSumInputs / 2);
    __m512 sums[R][V];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) sums[r][v] = _mm512_setzero_ps();
    }
    for (int64_t i = i0; i < i1; ++i) {
      const at::BFloat16* w = weight + i * 2 * kBlockOutputs;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(w + 32 * v) + kPrefetchBytes, _MM_HINT_T0);
      }
      __m512bh weights[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) weights[v] = (__m512bh)_mm512_loadu_si512(w + 32 * v);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[r * count + i]));
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) sums[r][v] = _mm512_dpbf16_ps(sums[r][v], weights[v], x);
      }
    }
    store_sums<V, R>(sums, nullptr, result, out, last_mask, i0 == 0);
  }
}

// One group of 16 output channels (from c0, the first `lanes` used) of the piece's tiles from
// their products, plus the bias, into outputs[column * 16 + lane]: each tile's P products read
// once, then its outputs. P known when compiling keeps them in registers; the coefficients are
// all multiplied, zeros included (adding a zero product leaves a sum as it is).
template <int P>
__attribute__((target("avx512f"))) void group_outputs(const Convolution& c, const Piece& piece, const float* products,
                                                      int64_t base, int64_t columns, int64_t c0, int64_t lanes,
                                                      float* outputs) {
  const __mmask16 mask = qwencodec::tail_mask(lanes);
  const int64_t count = piece.count(c);
  const int64_t tiles = piece.k1 - piece.k0;
  const __m512 bias = _mm512_maskz_loadu_ps(mask, c.bias + c0);
  for (int64_t r = 0; r < c.dilation; ++r) {
    for (int64_t k = 0; k < tiles; ++k) {
      const int64_t tile = base + r * tiles + k;
      __m512 values[P];
#pragma GCC unroll 16
      for (int p = 0; p < P; ++p) values[p] = _mm512_maskz_loadu_ps(mask, products + (p * count + tile) * c.out + c0);
      const int64_t start = k * c.block() + r;
      for (int64_t i = 0; i < c.m; ++i) {
        const int64_t column = start + i * c.dilation;
        if (column >= columns) break;
        __m512 sum = bias;
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) sum = _mm512_fmadd_ps(_mm512_set1_ps(c.at[i * P + p]), values[p], sum);
        _mm512_storeu_ps(outputs + column * 16, sum);
      }
    }
  }
}

// The same in AVX2: 8 lanes and 16 registers. The layout stays the AVX-512 one (groups of 16
// channels side by side), each group taken as two halves of 8.

// 8 rows of 8 floats (row r at src + r * src_stride) into 8 rows of 8 (dst + j * dst_stride gets
// column j): pairs, then fours, then the 128-bit halves.
__attribute__((target("avx2,fma"))) void transpose8(const float* src, int64_t src_stride, float* dst,
                                                   int64_t dst_stride) {
  __m256 rows[8], pairs[8], fours[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) rows[r] = _mm256_loadu_ps(src + r * src_stride);
#pragma GCC unroll 4
  for (int r = 0; r < 8; r += 2) {
    pairs[r] = _mm256_unpacklo_ps(rows[r], rows[r + 1]);
    pairs[r + 1] = _mm256_unpackhi_ps(rows[r], rows[r + 1]);
  }
  // fours[4g + k]: in 128-bit half l, column 4l + k of rows 4g..4g + 3.
#pragma GCC unroll 2
  for (int g = 0; g < 8; g += 4) {
    fours[g] = _mm256_shuffle_ps(pairs[g], pairs[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    fours[g + 1] = _mm256_shuffle_ps(pairs[g], pairs[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    fours[g + 2] = _mm256_shuffle_ps(pairs[g + 1], pairs[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    fours[g + 3] = _mm256_shuffle_ps(pairs[g + 1], pairs[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(dst + k * dst_stride, _mm256_permute2f128_ps(fours[k], fours[4 + k], 0x20));
    _mm256_storeu_ps(dst + (4 + k) * dst_stride, _mm256_permute2f128_ps(fours[k], fours[4 + k], 0x31));
  }
}

__attribute__((target("avx2,fma"))) void rows_to_columns8(const float* rows, int64_t stride, int64_t count,
                                                         float* columns) {
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    transpose8(rows + j, stride, columns + j * 16, 16);
    transpose8(rows + 8 * stride + j, stride, columns + j * 16 + 8, 16);
  }
  for (; j < count; ++j) {
    for (int64_t r = 0; r < 16; ++r) columns[j * 16 + r] = rows[r * stride + j];
  }
}

__attribute__((target("avx2,fma"))) void columns_to_rows8(const float* columns, int64_t count, float* rows,
                                                         int64_t stride) {
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    transpose8(columns + j * 16, 16, rows + j, stride);
    transpose8(columns + j * 16 + 8, 16, rows + 8 * stride + j, stride);
  }
  for (; j < count; ++j) {
    for (int64_t r = 0; r < 16; ++r) rows[r * stride + j] = columns[j * 16 + r];
  }
}

template <int P>
__attribute__((target("avx2,fma"))) void group_tiles8(const Convolution& c, const Piece& piece, const float* columns,
                                                     float* v, int64_t base, int64_t c0, int64_t lanes) {
  const int64_t count = piece.count(c);
  const int64_t tiles = piece.k1 - piece.k0;
  const float* bt = c.bt;
  for (int64_t half = 0; half * 8 < lanes; ++half) {
    const __m256i mask = qwencodec::tail_mask8(lanes - half * 8);
    for (int64_t r = 0; r < c.dilation; ++r) {
      for (int64_t k = 0; k < tiles; ++k) {
        const float* inputs = columns + (k * c.block() + r) * 16 + half * 8;
        __m256 sums[P];
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) sums[p] = _mm256_setzero_ps();
#pragma GCC unroll 16
        for (int j = 0; j < P; ++j) {
          const __m256 input = _mm256_loadu_ps(inputs + j * c.dilation * 16);
#pragma GCC unroll 16
          for (int p = 0; p < P; ++p) sums[p] = _mm256_fmadd_ps(_mm256_set1_ps(bt[p * P + j]), input, sums[p]);
        }
        float* tile = v + (base + r * tiles + k) * c.in + c0 + half * 8;
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) _mm256_maskstore_ps(tile + p * count * c.in, mask, sums[p]);
      }
    }
  }
}

__attribute__((target("avx2,fma"))) inline __m256 widen8(const float* w) { return _mm256_loadu_ps(w); }

__attribute__((target("avx2,fma"))) inline __m256 widen8(const int16_t* w) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
}

// product_block in AVX2: units of up to 3 vectors of 8 outputs and 4 tiles, whose 12
// accumulators, 3 weight vectors and broadcast tile value fill its 16 registers.
template <int V, int R, typename W>
__attribute__((target("avx2,fma"))) void product_block8(const float* tiles, const W* weight, const float* scale,
                                                       float* result, int64_t in, int64_t out, int64_t last) {
  const __m256i last_mask = qwencodec::tail_mask8(last);
  for (int64_t i0 = 0; i0 < in; i0 += kSumInputs) {
    const int64_t i1 = std::min(in, i0 + kSumInputs);
    __m256 sums[R][V];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
      for (int v = 0; v < V; ++v) sums[r][v] = _mm256_setzero_ps();
    }
    for (int64_t i = i0; i < i1; ++i) {
      const W* w = weight + i * kBlockOutputs;
#pragma GCC unroll 3
      for (int v = 0; v < V; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(w + 8 * v) + kPrefetchBytes, _MM_HINT_T0);
      }
      __m256 weights[V];
#pragma GCC unroll 3
      for (int v = 0; v < V; ++v) weights[v] = widen8(w + 8 * v);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_set1_ps(tiles[r * in + i]);
#pragma GCC unroll 3
        for (int v = 0; v < V; ++v) sums[r][v] = _mm256_fmadd_ps(weights[v], x, sums[r][v]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      float* row = result + r * out;
#pragma GCC unroll 3
      for (int v = 0; v < V; ++v) {
        const __m256i mask = v + 1 < V ? _mm256_set1_epi32(-1) : last_mask;
        __m256 sum = sums[r][v];
        if constexpr (std::is_same_v<W, int16_t>) sum = _mm256_mul_ps(sum, _mm256_loadu_ps(scale + 8 * v));
        if (i0 > 0) sum = _mm256_add_ps(sum, _mm256_maskload_ps(row + 8 * v, mask));
        _mm256_maskstore_ps(row + 8 * v, mask, sum);
      }
    }
  }
}

template <int P>
__attribute__((target("avx2,fma"))) void group_outputs8(const Convolution& c, const Piece& piece, const float* products,
                                                       int64_t base, int64_t columns, int64_t c0, int64_t lanes,
                                                       float* outputs) {
  const int64_t count = piece.count(c);
  const int64_t tiles = piece.k1 - piece.k0;
  for (int64_t half = 0; half * 8 < lanes; ++half) {
    const __m256i mask = qwencodec::tail_mask8(lanes - half * 8);
    const int64_t h0 = c0 + half * 8;
    const __m256 bias = _mm256_maskload_ps(c.bias + h0, mask);
    for (int64_t r = 0; r < c.dilation; ++r) {
      for (int64_t k = 0; k < tiles; ++k) {
        const int64_t tile = base + r * tiles + k;
        __m256 values[P];
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) values[p] = _mm256_maskload_ps(products + (p * count + tile) * c.out + h0, mask);
        const int64_t start = k * c.block() + r;
        for (int64_t i = 0; i < c.m; ++i) {
          const int64_t column = start + i * c.dilation;
          if (column >= columns) break;
          __m256 sum = bias;
#pragma GCC unroll 16
          for (int p = 0; p < P; ++p) sum = _mm256_fmadd_ps(_mm256_set1_ps(c.at[i * P + p]), values[p], sum);
          _mm256_storeu_ps(outputs + column * 16 + half * 8, sum);
        }
      }
    }
  }
}

// The instruction sets: what holds registers, for the parts below, which are the same in both.
// A unit of a product is up to three vectors of outputs of a block of the weights; a pass of it
// takes up to kBlockTiles tiles.
struct Avx512 {
  static constexpr int64_t kUnitOutputs = 48;
  static constexpr int64_t kLanes = 16;
  // 3 x 8 accumulators, 3 weight vectors and a broadcast tile value fill AVX-512's 32 registers
  // (9 tiles take 31: see product_blocks).
  static constexpr int kBlockTiles = 8;
  static constexpr bool kNineTiles = true;
  static void rows_to_columns(const float* rows, int64_t stride, int64_t count, float* columns) {
    ::rows_to_columns(rows, stride, count, columns);
  }
  static void columns_to_rows(const float* columns, int64_t count, float* rows, int64_t stride) {
    ::columns_to_rows(columns, count, rows, stride);
  }
  template <int P>
  static void tiles(const Convolution& c, const Piece& piece, const float* columns, float* v, int64_t base,
                    int64_t c0, int64_t lanes) {
    group_tiles<P>(c, piece, columns, v, base, c0, lanes);
  }
  template <int V, int R, typename W>
  static void block(const float* tiles, const W* weight, const float* scale, float* result, int64_t in, int64_t out,
                    int64_t last) {
    product_block<V, R>(tiles, weight, scale, result, in, out, last);
  }
  template <int V, int R>
  static void block(const uint32_t* pairs, const at::BFloat16* weight, const float*, float* result, int64_t in,
                    int64_t out, int64_t last) {
    product_block_pairs<V, R>(pairs, weight, result, in, out, last);
  }
  template <int P>
  static void outputs(const Convolution& c, const Piece& piece, const float* products, int64_t base, int64_t columns,
                      int64_t c0, int64_t lanes, float* outputs) {
    group_outputs<P>(c, piece, products, base, columns, c0, lanes, outputs);
  }
};

struct Avx2 {
  static constexpr int64_t kUnitOutputs = 24;
  static constexpr int64_t kLanes = 8;
  static constexpr int kBlockTiles = 4;
  static constexpr bool kNineTiles = false;
  static void rows_to_columns(const float* rows, int64_t stride, int64_t count, float* columns) {
    rows_to_columns8(rows, stride, count, columns);
  }
  static void columns_to_rows(const float* columns, int64_t count, float* rows, int64_t stride) {
    columns_to_rows8(columns, count, rows, stride);
  }
  template <int P>
  static void tiles(const Convolution& c, const Piece& piece, const float* columns, float* v, int64_t base,
                    int64_t c0, int64_t lanes) {
    group_tiles8<P>(c, piece, columns, v, base, c0, lanes);
  }
  template <int V, int R, typename W>
  static void block(const float* tiles, const W* weight, const float* scale, float* result, int64_t in, int64_t out,
                    int64_t last) {
    product_block8<V, R>(tiles, weight, scale, result, in, out, last);
  }
  template <int P>
  static void outputs(const Convolution& c, const Piece& piece, const float* products, int64_t base, int64_t columns,
                      int64_t c0, int64_t lanes, float* outputs) {
    group_outputs8<P>(c, piece, products, base, columns, c0, lanes, outputs);
  }
};

// `f(std::integral_constant<int, P>)` for P the convolution's number of points (1 to
// kMaxPoints, checked on entry): the transforms' loops over points known when compiling.
template <int P = 1, typename F>
void with_points(const Convolution& c, F&& f) {
  if constexpr (P < kMaxPoints) {
    if (c.points != P) return with_points<P + 1>(c, f);
  }
  f(std::integral_constant<int, P>{});
}

// Groups `begin..end` of 16 channels of the piece's inputs into its tiles [points, count, in].
template <typename Isa>
void input_groups(const Convolution& c, const Piece& piece, float* v, int64_t begin, int64_t end) {
  // Input column j is context column j below the reach, else new column j - reach.
  const int64_t first = piece.k0 * c.block();
  // The columns the piece reads: its outputs' and the kernel's reach past the last of them.
  const int64_t span = (piece.k1 - piece.k0) * c.block() + (c.points - 1) * c.dilation;
  // Those of them the input has; the rest, past its end, are zeros.
  const int64_t stored = std::clamp<int64_t>(c.reach + c.columns - first, 0, span);
  const int64_t from_context = std::clamp<int64_t>(c.reach - first, 0, stored);
  float* columns = qwencodec::thread_buffer<ColumnsBuffer>(static_cast<size_t>(span * 16));
  for (int64_t group = begin; group < end; ++group) {
    const int64_t c0 = group * 16;
    const int64_t lanes = std::min<int64_t>(16, c.in - c0);
    for (int64_t b = piece.b0; b < piece.b1; ++b) {
      const int64_t row = b * c.in + c0;
      if (lanes == 16) {
        if (from_context > 0) Isa::rows_to_columns(c.context + row * c.reach + first, c.reach, from_context, columns);
        if (stored > from_context) {
          Isa::rows_to_columns(c.x + row * c.columns + first + from_context - c.reach, c.columns,
                               stored - from_context, columns + from_context * 16);
        }
        std::fill(columns + stored * 16, columns + span * 16, 0.0f);
      } else {
        std::fill(columns, columns + span * 16, 0.0f);
        for (int64_t lane = 0; lane < lanes; ++lane) {
          const float* context = c.context + (row + lane) * c.reach;
          const float* x = c.x + (row + lane) * c.columns;
          for (int64_t column = 0; column < from_context; ++column) {
            columns[column * 16 + lane] = context[first + column];
          }
          for (int64_t column = from_context; column < stored; ++column) {
            columns[column * 16 + lane] = x[first + column - c.reach];
          }
        }
      }
      with_points(c, [&](auto points) {
        Isa::template tiles<decltype(points)::value>(c, piece, columns, v, piece.base(c, b), c0, lanes);
      });
    }
  }
}

template <typename Isa>
void input_transform(const Convolution& c, const Piece& piece, float* v) {
  at::parallel_for(0, (c.in + 15) / 16, 1,
                   [&](int64_t begin, int64_t end) { input_groups<Isa>(c, piece, v, begin, end); });
}

// The elements of type `T` between one tile's inputs and the next's: float32 inputs, or bfloat16
// pairs (uint32_t, two inputs each).
template <typename T>
int64_t tile_stride(const Convolution& c) {
  return std::is_same_v<T, float> ? c.in : c.in / 2;
}

// Every tile of the piece against a unit of the weight block (see the instruction sets) whose
// outputs start at o0, in passes of kBlockTiles tiles; in AVX-512 one of 9 where that saves a
// pass: a pass costs its weight loads whatever its tiles, and a one-frame step's first block has
// 8 or 9 tiles, whose ninth took a pass of its own. (Passes of 9 throughout were slower in the
// late blocks, whose inputs come in short chains: the accumulators leave the registers at the
// end of each.)
template <typename Isa, int V, typename T, typename W>
void product_blocks(const Convolution& c, int64_t count, const T* tiles, const W* weight, const float* scale,
                    float* result, int64_t o0, int64_t last) {
  constexpr int kTiles = Isa::kBlockTiles;
  result += o0;
  int64_t passes = (count + kTiles - 1) / kTiles;
  if (Isa::kNineTiles && count > kTiles && count % kTiles == 1) --passes;
  for (int64_t pass = 0, n0 = 0; pass < passes; ++pass) {
    const int64_t n = (count - n0) / (passes - pass);
    const T* first = tiles + n0 * tile_stride<T>(c);
    float* results = result + n0 * c.out;
    switch (n) {
      case 1: Isa::template block<V, 1>(first, weight, scale, results, c.in, c.out, last); break;
      case 2: Isa::template block<V, 2>(first, weight, scale, results, c.in, c.out, last); break;
      case 3: Isa::template block<V, 3>(first, weight, scale, results, c.in, c.out, last); break;
      case 4: Isa::template block<V, 4>(first, weight, scale, results, c.in, c.out, last); break;
      default:
        if constexpr (kTiles == 8) {
          switch (n) {
            case 5: Isa::template block<V, 5>(first, weight, scale, results, c.in, c.out, last); break;
            case 6: Isa::template block<V, 6>(first, weight, scale, results, c.in, c.out, last); break;
            case 7: Isa::template block<V, 7>(first, weight, scale, results, c.in, c.out, last); break;
            case 8: Isa::template block<V, 8>(first, weight, scale, results, c.in, c.out, last); break;
            default: Isa::template block<V, 9>(first, weight, scale, results, c.in, c.out, last); break;
          }
        }
        break;
    }
    n0 += n;
  }
}

// Each point's weight against the piece's tiles [count, in]: products [points, count, out], in
// units of one point and up to kBlockOutputs outputs, spread across the threads. A unit's
// weights are one block [in, kBlockOutputs] of consecutive bytes: read as columns of the whole
// [in, out] matrix, rows kilobytes apart, they come from memory at a fraction of its speed on
// Intel's CPUs, whose prefetchers do not follow strides across pages. AVX2 takes a block in two
// passes of half its outputs each.
template <typename Isa, typename W, typename T>
void products(const Convolution& c, const Piece& piece, const T* v, float* products) {
  const int64_t count = piece.count(c);
  const int64_t output_blocks = (c.out + kBlockOutputs - 1) / kBlockOutputs;
  at::parallel_for(0, c.points * output_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t p = unit / output_blocks;
      const int64_t block = unit % output_blocks;
      const T* tiles = v + p * count * tile_stride<T>(c);
      const W* weight = static_cast<const W*>(c.weights) + (p * output_blocks + block) * c.in * kBlockOutputs;
      // The block's scales (int16 weights only).
      const float* scale = c.scales ? c.scales + (p * output_blocks + block) * kBlockOutputs : nullptr;
      float* result = products + p * count * c.out;
      for (int64_t part = 0; part < kBlockOutputs; part += Isa::kUnitOutputs) {
        const int64_t o0 = block * kBlockOutputs + part;
        const int64_t outputs = std::min(Isa::kUnitOutputs, c.out - o0);
        if (outputs <= 0) break;
        const int64_t vectors = (outputs + Isa::kLanes - 1) / Isa::kLanes;
        const int64_t last = outputs - Isa::kLanes * (vectors - 1);
        const float* unit_scale = scale ? scale + part : nullptr;
        switch (vectors) {
          case 1: product_blocks<Isa, 1>(c, count, tiles, weight + part, unit_scale, result, o0, last); break;
          case 2: product_blocks<Isa, 2>(c, count, tiles, weight + part, unit_scale, result, o0, last); break;
          default: product_blocks<Isa, 3>(c, count, tiles, weight + part, unit_scale, result, o0, last); break;
        }
      }
    }
  });
}

// Groups `begin..end` of 16 output channels of the piece from its products, plus the bias.
template <typename Isa>
void output_groups(const Convolution& c, const Piece& piece, const float* products, int64_t begin, int64_t end) {
  const int64_t first = piece.k0 * c.block();
  const int64_t columns = std::min((piece.k1 - piece.k0) * c.block(), c.columns - first);
  // The outputs of 16 channels side by side: outputs[column * 16 + lane].
  float* outputs = qwencodec::thread_buffer<OutputsBuffer>(static_cast<size_t>(columns * 16));
  for (int64_t group = begin; group < end; ++group) {
    const int64_t c0 = group * 16;
    const int64_t lanes = std::min<int64_t>(16, c.out - c0);
    for (int64_t b = piece.b0; b < piece.b1; ++b) {
      with_points(c, [&](auto points) {
        Isa::template outputs<decltype(points)::value>(c, piece, products, piece.base(c, b), columns, c0, lanes,
                                                       outputs);
      });
      float* rows = c.y + (b * c.out + c0) * c.columns + first;
      if (lanes == 16) {
        Isa::columns_to_rows(outputs, columns, rows, c.columns);
        continue;
      }
      for (int64_t lane = 0; lane < lanes; ++lane) {
        for (int64_t column = 0; column < columns; ++column) {
          rows[lane * c.columns + column] = outputs[column * 16 + lane];
        }
      }
    }
  }
}

template <typename Isa>
void output_transform(const Convolution& c, const Piece& piece, const float* products) {
  at::parallel_for(0, (c.out + 15) / 16, 1,
                   [&](int64_t begin, int64_t end) { output_groups<Isa>(c, piece, products, begin, end); });
}

template <typename Isa>
void run_piece(const Convolution& c, const Piece& piece) {
  const int64_t count = piece.count(c);
  // The tiles, then the products, then (bfloat16 products) the tiles rounded; every value is
  // written before it is read.
  const size_t tiles = static_cast<size_t>(c.points * count * c.in);
  const size_t products_size = static_cast<size_t>(c.points * count * c.out);
  float* v = qwencodec::thread_buffer<PieceBuffer>(tiles + products_size + (c.bf16 ? tiles / 2 : 0));
  input_transform<Isa>(c, piece, v);
  if (c.bf16) {
    if constexpr (std::is_same_v<Isa, Avx512>) {
      auto* pairs = reinterpret_cast<uint32_t*>(v + tiles + products_size);
      // In pieces of whole pairs across the threads.
      at::parallel_for(0, static_cast<int64_t>(tiles / 2), 4096, [&](int64_t begin, int64_t end) {
        qwencodec::round_to_bf16(v + 2 * begin, 2 * (end - begin), pairs + begin);
      });
      products<Isa, at::BFloat16>(c, piece, static_cast<const uint32_t*>(pairs), v + tiles);
    } else {
      TORCH_CHECK(false, "bfloat16 Winograd products run in AVX-512 only");
    }
  } else if (c.scales) {
    products<Isa, int16_t>(c, piece, v, v + tiles);
  } else {
    products<Isa, float>(c, piece, v, v + tiles);
  }
  output_transform<Isa>(c, piece, v + tiles);
}

void check_matrix(const at::Tensor* matrix, int64_t rows, int64_t cols, const char* name) {
  TORCH_CHECK(matrix->scalar_type() == at::kFloat && matrix->is_contiguous() && matrix->dim() == 2 &&
                  matrix->size(0) == rows && matrix->size(1) == cols,
              "the Winograd ", name, " matrix is float32 [", rows, ", ", cols, "]");
}

}  // namespace

extern "C" {

// `context`: [B, in, reach] float32, the kernel's reach into the past ((taps - 1) * dilation
// columns), moved on in place to the last `reach` columns of the input; `x`: [B, in, T] float32,
// the new columns; `weights`: [points, blocks, in, 48], the kernel transformed, its output
// channels in blocks of 48 (the last padded with zeros): float32, or int16 with `scales`
// [points, blocks * 48] (else null), output channel o of point p being scales[p][o] times
// weights[p][o / 48][.][o % 48]; or bfloat16 [points, blocks, in / 2, 48, 2], input i of output o
// at [p][o / 48][i / 2][o % 48][i % 2], whose products are bfloat16 (AVX-512 only); `bias`: `out`
// values; `bt`: [points, points] and `at`: [m, points], the input and output transforms; all
// float32 unless said, and contiguous; `kernels`: the instruction set (qwencodec::CpuKernels,
// AVX2 or AVX-512). `*out`: [B, out, T].
bool qwencodec_winograd_conv(at::Tensor* context, const at::Tensor* x, const at::Tensor* weights,
                             const at::Tensor* scales, const at::Tensor* bias, const at::Tensor* bt, const at::Tensor* at_matrix,
                             int64_t dilation, int32_t kernels, at::Tensor** out, char* error,
                             size_t error_size) {
  RECORD_FUNCTION("qwencodec::winograd_conv", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const qwencodec::CpuKernels isa = qwencodec::vector_kernels(kernels, "a Winograd convolution");
    TORCH_CHECK(x->dim() == 3 && x->scalar_type() == at::kFloat && x->is_contiguous() && x->size(2) >= 1,
                "a Winograd input is contiguous float32 [B, channels, T]");
    const int64_t out_channels = bias->numel();
    const int64_t blocks = (out_channels + kBlockOutputs - 1) / kBlockOutputs;
    const bool bf16 = weights->scalar_type() == at::kBFloat16;
    if (bf16) {
      TORCH_CHECK(isa == qwencodec::CpuKernels::kAvx512 && !scales,
                  "bfloat16 Winograd weights run in AVX-512, unscaled");
      TORCH_CHECK(weights->dim() == 5 && weights->is_contiguous() && weights->size(1) == blocks &&
                      weights->size(2) * 2 == x->size(1) && weights->size(3) == kBlockOutputs && weights->size(4) == 2,
                  "bfloat16 Winograd weights are contiguous [points, blocks, in / 2, ", kBlockOutputs, ", 2] for ",
                  out_channels, " outputs and an even number of inputs");
    } else {
      TORCH_CHECK(weights->dim() == 4 && weights->scalar_type() == (scales ? at::kShort : at::kFloat) &&
                      weights->is_contiguous() && weights->size(1) == blocks && weights->size(2) == x->size(1) &&
                      weights->size(3) == kBlockOutputs,
                  "Winograd weights are contiguous ", scales ? "int16" : "float32", " [points, blocks, in, ",
                  kBlockOutputs, "] for ", out_channels, " outputs");
    }
    const int64_t points = weights->size(0);
    TORCH_CHECK(!scales || (scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                            scales->numel() == points * weights->size(1) * kBlockOutputs),
                "the scales of int16 Winograd weights are contiguous float32 [points, blocks * ", kBlockOutputs,
                "]");
    TORCH_CHECK(points <= kMaxPoints, "Winograd tiles of at most ", kMaxPoints, " points");
    check_matrix(bt, points, points, "input transform");
    const int64_t m = at_matrix->size(0);
    check_matrix(at_matrix, m, points, "output transform");
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_channels && bias->scalar_type() == at::kFloat,
                "a Winograd bias is float32, one per output channel");
    TORCH_CHECK(m >= 1 && m <= points && dilation >= 1, "Winograd tiles of ", m, " outputs at dilation ",
                dilation);
    const int64_t reach = (points - m) * dilation;
    TORCH_CHECK(context->dim() == 3 && context->scalar_type() == at::kFloat && context->is_contiguous() &&
                    context->size(0) == x->size(0) && context->size(1) == x->size(1) && context->size(2) == reach,
                "a Winograd context is contiguous float32 [B, channels, ", reach, "] beside an input of ",
                x->sizes());
    const int64_t columns = x->size(2);
    at::Tensor result = at::empty({x->size(0), out_channels, columns}, x->options());
    Convolution c{context->data_ptr<float>(),
                  x->data_ptr<float>(),
                  weights->data_ptr(),
                  scales ? scales->data_ptr<float>() : nullptr,
                  bias->data_ptr<float>(),
                  bt->data_ptr<float>(),
                  at_matrix->data_ptr<float>(),
                  result.data_ptr<float>(),
                  x->size(1),
                  out_channels,
                  reach,
                  columns,
                  m,
                  points,
                  dilation,
                  0,
                  bf16};
    c.tiles = (columns + c.block() - 1) / c.block();
    // Tiles of every phase per piece, as many pieces as fit the cache budget, rounded up to a
    // multiple of the threads so that none idles at the end.
    const int64_t per_tile = 4 * points * std::max(c.in, c.out);
    const int64_t budget = std::max(kMinPieceTiles, kPieceBytes / per_tile);
    const int64_t batch = x->size(0);
    const int64_t stream_tiles = dilation * c.tiles;
    const int64_t threads = at::get_num_threads();
    const auto whole = [&](int64_t pieces) { return pieces > 1 ? (pieces + threads - 1) / threads * threads : 1; };
    std::vector<Piece> pieces;
    if (batch > 1 && stream_tiles * 2 <= budget) {
      // Several streams' small steps (a batch of one-frame steps): their tiles together, as many
      // streams a piece as its budget takes, so that a piece reads each weight for all of them
      // (a piece a stream read block 1's weights once a row).
      const int64_t count = std::min(batch, whole((batch * stream_tiles + budget - 1) / budget));
      const int64_t per_piece = (batch + count - 1) / count;
      for (int64_t b0 = 0; b0 < batch; b0 += per_piece) pieces.push_back({b0, std::min(batch, b0 + per_piece), 0, c.tiles});
    } else {
      int64_t pieces_per_stream = std::max<int64_t>(1, stream_tiles / budget);
      if (batch * pieces_per_stream < threads && stream_tiles >= threads * kMinThreadPieceTiles) {
        pieces_per_stream = (threads + batch - 1) / batch;
      }
      if (batch * pieces_per_stream > 1 && (batch * pieces_per_stream) % threads != 0) {
        pieces_per_stream = std::min(c.tiles, whole(batch * pieces_per_stream) / batch);
      }
      const int64_t per_piece = (c.tiles + pieces_per_stream - 1) / pieces_per_stream;
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t k0 = 0; k0 < c.tiles; k0 += per_piece) {
          pieces.push_back({b, b + 1, k0, std::min(c.tiles, k0 + per_piece)});
        }
      }
    }
    const auto run_pieces = [&](auto isa) {
      using Isa = decltype(isa);
      if (pieces.size() == 1) {
        // Not from inside a parallel_for, which would run the piece's own parallel parts serially.
        run_piece<Isa>(c, pieces[0]);
      } else {
        at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) run_piece<Isa>(c, pieces[i]);
        });
      }
    };
    if (isa == qwencodec::CpuKernels::kAvx512) {
      run_pieces(Avx512{});
    } else {
      run_pieces(Avx2{});
    }
    // Once every piece has read the context.
    qwencodec::advance_context(context->data_ptr<float>(), c.x, x->size(0) * x->size(1), c.reach, c.columns);
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
