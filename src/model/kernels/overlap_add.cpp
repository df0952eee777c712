// A transposed convolution's last part on the CPU (conv.rs's `CausalTransConv`): each input
// column's taps, from one matrix product, laid out as output samples, the previous column's
// overlap and the bias added, and the last column's overlap kept for the next step. In one pass
// where libtorch's ops took several (a concatenation, a sum, a permuting copy and the bias), which
// cost more than the product's own time in the late blocks' small steps. Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "shim.h"

namespace {

// Output samples per thread below which a split costs more than it saves.
constexpr int64_t kGrain = 1 << 14;

// Columns per piece of work where the taps come column by column: the piece's samples (out
// channels x kColumns x stride) stay in cache while they are written.
constexpr int64_t kColumns = 16;

// A row's taps summed, before they are interleaved (qwencodec::thread_buffer).
struct SumsBuffer;

// One tap's samples: `first` (column t at first[t * step]) plus the bias, plus `second`'s
// previous column where the taps overlap (for t = 0 the carry `kept`, then moved on to `second`'s
// last column). Inline, so that the contiguous call's loop is vectorized.
inline void sum_taps(const float* first, const float* second, float* kept, float level, int64_t step,
                     int64_t columns, float* sum) {
  if (second == nullptr) {
    for (int64_t t = 0; t < columns; ++t) sum[t] = first[t * step] + level;
    return;
  }
  sum[0] = first[0] + *kept + level;
  for (int64_t t = 1; t < columns; ++t) sum[t] = first[t * step] + second[(t - 1) * step] + level;
  *kept = second[(columns - 1) * step];
}

// `rows` rows of `columns` side by side: samples[t * rows + j] = sums[j * columns + t]. With the
// row count known when compiled (the released rates'), each column's samples are one unrolled
// copy.
void interleave(const float* sums, int64_t rows, int64_t columns, float* samples) {
  for (int64_t t = 0; t < columns; ++t) {
    for (int64_t j = 0; j < rows; ++j) samples[t * rows + j] = sums[j * columns + t];
  }
}

template <int Rows>
void interleave(const float* sums, int64_t columns, float* samples) {
  interleave(sums, Rows, columns, samples);
}

// The taps as a product's transposed output (each column's taps consecutive: column_step apart,
// tap o * kernel + j at offset o * kernel + j; stream b's from b * stream_step), read column by
// column. Row by row, each row would read one float per cache line, and in large steps (8
// frames' late blocks) the lines would fall out of cache before the next rows read them.
void by_columns(const float* taps, int64_t stream_step, int64_t column_step, const float* biases, float* carried,
                float* y, int64_t batch, int64_t out_channels, int64_t kernel, int64_t stride, int64_t columns) {
  const int64_t overlap = kernel - stride;
  const int64_t blocks = (columns + kColumns - 1) / kColumns;
  const int64_t grain = std::max<int64_t>(1, kGrain / (kColumns * out_channels * stride));
  at::parallel_for(0, batch * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t piece = begin; piece < end; ++piece) {
      const int64_t b = piece / blocks, first_column = piece % blocks * kColumns;
      const int64_t last_column = std::min(columns, first_column + kColumns);
      for (int64_t t = first_column; t < last_column; ++t) {
        const float* column = taps + b * stream_step + t * column_step;
        // The previous column's later taps (tap stride + j), or the carried overlap for t = 0.
        const float* earlier = column - column_step + stride;
        for (int64_t o = 0; o < out_channels; ++o) {
          const float* own = column + o * kernel;
          const float level = biases[o];
          float* samples = y + ((b * out_channels + o) * columns + t) * stride;
          if (overlap == 0) {
            for (int64_t j = 0; j < stride; ++j) samples[j] = own[j] + level;
            continue;
          }
          const float* second = t > 0 ? earlier + o * kernel : carried + (b * out_channels + o) * overlap;
          for (int64_t j = 0; j < stride; ++j) samples[j] = own[j] + second[j] + level;
        }
      }
    }
  });
  if (overlap == 0) return;
  // The last column's later taps are the next step's carry, once every piece has read the old one.
  for (int64_t b = 0; b < batch; ++b) {
    const float* last = taps + b * stream_step + (columns - 1) * column_step + stride;
    for (int64_t o = 0; o < out_channels; ++o) {
      std::copy(last + o * kernel, last + o * kernel + overlap, carried + (b * out_channels + o) * overlap);
    }
  }
}

}  // namespace

extern "C" {

// `taps`: [B, out * kernel, T] float32, row o * kernel + j holding output channel o's tap j of
// each input column, in any strides (a product's transposed output, a convolution's output);
// `kernel` is `stride` or twice it. `carry`: [B, out, kernel - stride], the previous step's
// overlap, overwritten with this step's (null where kernel is `stride`). `bias`: `out` values,
// contiguous. `*out`: [B, out, T * stride], sample t * stride + j of channel o
// being tap j of column t plus tap stride + j of column t - 1 (of the carry for t = 0) plus the
// bias.
bool qwencodec_overlap_add(const at::Tensor* taps, at::Tensor* carry, const at::Tensor* bias, int64_t stride,
                           at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::overlap_add", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const int64_t out_channels = bias->numel();
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous(),
                "a transposed convolution's bias is contiguous float32");
    TORCH_CHECK(stride >= 1, "a transposed convolution of stride ", stride);
    TORCH_CHECK(taps->dim() == 3 && taps->scalar_type() == at::kFloat && out_channels > 0 &&
                    taps->size(1) % out_channels == 0,
                "a transposed convolution's taps are float32 [B, out * kernel, T]");
    const int64_t batch = taps->size(0);
    const int64_t kernel = taps->size(1) / out_channels;
    const int64_t overlap = kernel - stride;
    TORCH_CHECK(overlap == 0 || overlap == stride, "a transposed convolution's kernel is its stride or twice it, not ",
                kernel, " at stride ", stride);
    TORCH_CHECK((overlap == 0) == (carry == nullptr) &&
                    (carry == nullptr ||
                     (carry->scalar_type() == at::kFloat && carry->is_contiguous() &&
                      carry->sizes() == at::IntArrayRef({batch, out_channels, overlap}))),
                "a transposed convolution's carried overlap is contiguous float32 [", batch, ", ", out_channels, ", ",
                overlap, "]");
    const int64_t columns = taps->size(2);
    at::Tensor result = at::empty({batch, out_channels, columns * stride}, taps->options());
    const float* all_taps = taps->data_ptr<float>();
    const float* biases = bias->data_ptr<float>();
    float* carried = carry == nullptr ? nullptr : carry->data_ptr<float>();
    float* y = result.data_ptr<float>();
    const int64_t stream_step = taps->stride(0), row_step = taps->stride(1), column_step = taps->stride(2);
    if (row_step == 1 && column_step != 1) {
      by_columns(all_taps, stream_step, column_step, biases, carried, y, batch, out_channels, kernel, stride, columns);
      *out = new at::Tensor(std::move(result));
      return;
    }
    const int64_t rows = batch * out_channels;
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, columns * stride)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t row = begin; row < end; ++row) {
                         const int64_t b = row / out_channels, o = row % out_channels;
                         // Tap j of stream b's columns: its taps' row o * kernel + j.
                         const float* own = all_taps + b * stream_step + o * kernel * row_step;
                         float* samples = y + row * columns * stride;
                         const float level = biases[o];
                         // Each tap's samples summed along its row (vectorized where the row is
                         // contiguous), then interleaved.
                         float* sums = qwencodec::thread_buffer<SumsBuffer>(static_cast<size_t>(stride * columns));
                         for (int64_t j = 0; j < stride; ++j) {
                           const float* first = own + j * row_step;
                           const float* second = overlap == 0 ? nullptr : first + stride * row_step;
                           float* kept = overlap == 0 ? nullptr : carried + row * overlap + j;
                           if (column_step == 1) {
                             sum_taps(first, second, kept, level, 1, columns, sums + j * columns);
                           } else {
                             sum_taps(first, second, kept, level, column_step, columns, sums + j * columns);
                           }
                         }
                         switch (stride) {
                           case 2: interleave<2>(sums, columns, samples); break;
                           case 3: interleave<3>(sums, columns, samples); break;
                           case 4: interleave<4>(sums, columns, samples); break;
                           case 5: interleave<5>(sums, columns, samples); break;
                           case 8: interleave<8>(sums, columns, samples); break;
                           default: interleave(sums, stride, columns, samples);
                         }
                       }
                     });
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
