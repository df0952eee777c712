// The two transforms of a Winograd convolution (winograd.rs) on float32 activations on the CPU:
// the inputs into tiles of the transform domain, and the products back into outputs. AVX-512
// only (shim.rs checks the CPU). Errors as in shim.h.
//
// A tile holds `m` outputs `dilation` columns apart and the `points` inputs they read. Tiles of
// one phase r (r < dilation) start at columns k * m * dilation + r. Seen as polyphase rows,
// input `j` of tile k of phase r is row (j % m, r) at k + j / m: the tiles of a phase are
// contiguous there, so each transform runs along the tiles with whole vectors.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shim.h"

namespace {

// Values per thread below which a split costs more than it saves.
constexpr int64_t kGrain = 32768;

// Inputs per tile at most: a tile's inputs stay in registers.
constexpr int64_t kMaxPoints = 16;

__attribute__((target("avx512f"))) inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

struct Geometry {
  int64_t m;         // outputs per tile
  int64_t points;    // inputs per tile: m + taps - 1
  int64_t dilation;  // columns between a tile's outputs
  int64_t columns;   // outputs per row
  int64_t tiles;     // tiles per phase: ceil(columns / (m * dilation))

  // Columns per polyphase row: the tiles plus those the last tile reads past them.
  int64_t span() const { return tiles + (points - 1) / m; }
};

// Blocks `begin..end` of 16 channels of x [B, channels, length] (block = b * blocks + i) into
// v [points, n, channels], n = B * dilation * tiles, tile (b * dilation + r) * tiles + k: a
// tile's values are rows of channels, as the products read them.
__attribute__((target("avx512f"))) void input_blocks(const float* x, float* v, const float* bt, const Geometry& g,
                                                     int64_t channels, int64_t length, int64_t first, int64_t n,
                                                     int64_t begin, int64_t end) {
  const int64_t span = g.span();
  const int64_t block = g.m * g.dilation;
  const int64_t blocks = (channels + 15) / 16;
  // Polyphase rows (s, r), s < m, of 16 channels side by side:
  // poly[((s * dilation + r) * span + k) * 16 + lane] = x[c0 + lane, k * block + s * dilation + r].
  std::vector<float> poly(static_cast<size_t>(block * span * 16));
  __m512 inputs[kMaxPoints];
  for (int64_t index = begin; index < end; ++index) {
    const int64_t b = index / blocks;
    const int64_t c0 = (index % blocks) * 16;
    const int64_t lanes = std::min<int64_t>(16, channels - c0);
    const __mmask16 mask = tail_mask(lanes);
    if (lanes < 16) std::fill(poly.begin(), poly.end(), 0.0f);
    for (int64_t lane = 0; lane < lanes; ++lane) {
      const float* in = x + (b * channels + c0 + lane) * length + first;
      for (int64_t k = 0; k < span; ++k) {
        for (int64_t phase = 0; phase < block; ++phase) {
          const int64_t column = k * block + phase;
          poly[(phase * span + k) * 16 + lane] = first + column < length ? in[column] : 0.0f;
        }
      }
    }
    for (int64_t r = 0; r < g.dilation; ++r) {
      for (int64_t k = 0; k < g.tiles; ++k) {
        for (int64_t j = 0; j < g.points; ++j) {
          inputs[j] = _mm512_loadu_ps(poly.data() + (((j % g.m) * g.dilation + r) * span + k + j / g.m) * 16);
        }
        float* tile = v + ((b * g.dilation + r) * g.tiles + k) * channels + c0;
        for (int64_t p = 0; p < g.points; ++p) {
          __m512 sum = _mm512_setzero_ps();
          for (int64_t j = 0; j < g.points; ++j) {
            const float coefficient = bt[p * g.points + j];
            if (coefficient != 0.0f) sum = _mm512_fmadd_ps(_mm512_set1_ps(coefficient), inputs[j], sum);
          }
          _mm512_mask_storeu_ps(tile + p * n * channels, mask, sum);
        }
      }
    }
  }
}

// Rows `begin..end` of y [rows, length] (row = b * channels + o), columns `first..first +
// columns`, from products [points, channels, n], plus the channel's bias.
__attribute__((target("avx512f"))) void output_rows(const float* products, float* y, const float* at_matrix,
                                                    const float* bias, const Geometry& g, int64_t channels,
                                                    int64_t length, int64_t first, int64_t n, int64_t begin,
                                                    int64_t end) {
  const int64_t block = g.m * g.dilation;
  // Polyphase outputs: tile k's output i of phase r at (i * dilation + r) * tiles + k.
  std::vector<float> poly(static_cast<size_t>(block * g.tiles));
  for (int64_t row = begin; row < end; ++row) {
    const int64_t b = row / channels;
    const int64_t o = row % channels;
    const __m512 offset = _mm512_set1_ps(bias[o]);
    for (int64_t r = 0; r < g.dilation; ++r) {
      const int64_t first = (b * g.dilation + r) * g.tiles;
      for (int64_t k = 0; k < g.tiles; k += 16) {
        const __mmask16 mask = tail_mask(g.tiles - k);
        for (int64_t i = 0; i < g.m; ++i) {
          __m512 sum = offset;
          for (int64_t p = 0; p < g.points; ++p) {
            const float coefficient = at_matrix[i * g.points + p];
            if (coefficient == 0.0f) continue;
            const float* source = products + (p * channels + o) * n + first + k;
            sum = _mm512_fmadd_ps(_mm512_set1_ps(coefficient), _mm512_maskz_loadu_ps(mask, source), sum);
          }
          _mm512_mask_storeu_ps(poly.data() + (i * g.dilation + r) * g.tiles + k, mask, sum);
        }
      }
    }
    float* out = y + row * length + first;
    for (int64_t column = 0; column < g.columns; ++column) {
      const int64_t k = column / block;
      const int64_t phase = column % block;
      out[column] = poly[phase * g.tiles + k];
    }
  }
}

void check_matrix(const at::Tensor* matrix, int64_t rows, int64_t cols, const char* name) {
  TORCH_CHECK(matrix->scalar_type() == at::kFloat && matrix->is_contiguous() && matrix->dim() == 2 &&
                  matrix->size(0) == rows && matrix->size(1) == cols,
              "the Winograd ", name, " matrix is float32 [", rows, ", ", cols, "]");
}

Geometry geometry(int64_t m, int64_t points, int64_t dilation, int64_t columns) {
  TORCH_CHECK(m >= 1 && points >= m && points <= kMaxPoints && dilation >= 1 && columns >= 1,
              "a Winograd tile of ", m, " outputs, ", points, " points, dilation ", dilation, " and ", columns,
              " columns");
  const int64_t block = m * dilation;
  return Geometry{m, points, dilation, columns, (columns + block - 1) / block};
}

}  // namespace

extern "C" {

// `x`: [B, channels, length] float32, contiguous: the inputs of outputs `first..first + columns`
// start at column `first` (length is at least first + columns + (points - m) * dilation); `bt`:
// [points, points], the input transform. `*out`: the tiles in the transform domain, [points,
// B * dilation * tiles, channels].
bool qwencodec_winograd_input(const at::Tensor* x, const at::Tensor* bt, int64_t m, int64_t dilation, int64_t first,
                              int64_t columns, at::Tensor** out, char* error, size_t error_size) {
  return qwencodec::guarded(error, error_size, [&] {
    TORCH_CHECK(x->dim() == 3 && x->scalar_type() == at::kFloat && x->is_contiguous(),
                "a Winograd input is contiguous float32 [B, channels, T]");
    const int64_t points = bt->size(0);
    check_matrix(bt, points, points, "input transform");
    const Geometry g = geometry(m, points, dilation, columns);
    const int64_t batch = x->size(0), channels = x->size(1), length = x->size(2);
    TORCH_CHECK(first >= 0 && length >= first + columns + (points - m) * dilation, "a Winograd input of ", length,
                " columns for outputs ", first, " to ", first + columns);
    const int64_t n = batch * dilation * g.tiles;
    at::Tensor tiles = at::empty({points, n, channels}, x->options());
    const float* in = x->data_ptr<float>();
    float* v = tiles.data_ptr<float>();
    const float* transform = bt->data_ptr<float>();
    const int64_t blocks = batch * ((channels + 15) / 16);
    at::parallel_for(0, blocks, std::max<int64_t>(1, kGrain / (16 * points * dilation * g.tiles)),
                     [&](int64_t begin, int64_t end) {
                       input_blocks(in, v, transform, g, channels, length, first, n, begin, end);
                     });
    *out = new at::Tensor(std::move(tiles));
  });
}

// `products`: [points, channels, B * dilation * tiles] float32, the tiles times the transformed
// weights; `at_matrix`: [m, points], the output transform; `bias`: `channels` float32 values.
// Writes columns `first..first + columns` of `y`, [B, channels, length] float32, contiguous.
bool qwencodec_winograd_output(const at::Tensor* products, const at::Tensor* at_matrix, const at::Tensor* bias,
                               int64_t dilation, int64_t first, int64_t columns, at::Tensor* y, char* error,
                               size_t error_size) {
  return qwencodec::guarded(error, error_size, [&] {
    TORCH_CHECK(products->dim() == 3 && products->scalar_type() == at::kFloat && products->is_contiguous(),
                "Winograd products are contiguous float32 [points, channels, n]");
    const int64_t points = products->size(0), channels = products->size(1);
    const int64_t m = at_matrix->size(0);
    check_matrix(at_matrix, m, points, "output transform");
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == channels && bias->scalar_type() == at::kFloat,
                "a Winograd bias is float32, one per channel");
    TORCH_CHECK(y->dim() == 3 && y->size(1) == channels && y->scalar_type() == at::kFloat && y->is_contiguous(),
                "a Winograd output is contiguous float32 [B, ", channels, ", T]");
    const int64_t batch = y->size(0), length = y->size(2);
    TORCH_CHECK(first >= 0 && first + columns <= length, "Winograd outputs ", first, " to ", first + columns,
                " of ", length);
    const Geometry g = geometry(m, points, dilation, columns);
    const int64_t n = batch * dilation * g.tiles;
    TORCH_CHECK(products->size(2) == n, "Winograd products of ", products->size(2), " tiles where ", n,
                " are needed");
    const float* source = products->data_ptr<float>();
    float* out = y->data_ptr<float>();
    const float* transform = at_matrix->data_ptr<float>();
    const float* offsets = bias->data_ptr<float>();
    at::parallel_for(0, batch * channels, std::max<int64_t>(1, kGrain / (points * dilation * g.tiles)),
                     [&](int64_t begin, int64_t end) {
                       output_rows(source, out, transform, offsets, g, channels, length, first, n, begin, end);
                     });
  });
}

}  // extern "C"
