// A dense causal convolution of several taps (the vocoder's residual units' dilated ones) in AMX
// tiles, directly: no Winograd transform, whose rounding of bfloat16 tiles the transforms magnify,
// and whose transforms cost more than AMX's products at these shapes. For dtype bf16 on CPUs with
// AMX-BF16 (conv_amx.rs). Errors as in shim.h.
//
// Each stream's input (its context, then the new columns) is laid out as rows of time, each row
// the column's inputs rounded to bfloat16: a product's left side is then 16 consecutive rows at
// the tap's shift, 64-byte aligned whatever the shift, and its right side 16 pairs of inputs of
// 16 outputs of one tap's weight, packed at load. A unit of work is 32 columns of one stream by
// 32 outputs (four sums in tiles 0-3, the columns' rows in 4-5, the weights in 6-7), over every
// tap and every input; units go to the threads a range each, outputs first, so that a thread's
// units share their weights.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "amx.h"
#include "context.h"
#include "shim.h"
#include "transpose.h"
#include "widen.h"

namespace {

using qwencodec::kAmxRows;

// Inputs of a tile row: 32 bfloat16, 64 bytes.
constexpr int64_t kInputs = 32;
// Columns and outputs a unit takes: two tiles of each.
constexpr int64_t kUnit = 2 * kAmxRows;

struct Convolution {
  const at::BFloat16* weights;  // [pairs, taps, in / 32, 2, 16, 16, 2] (see the entry point)
  const float* bias_tiles;      // [2 pairs, 16, 16]: each block's bias in every row
  const at::BFloat16* rows;     // [B, stream_rows, in]
  float* y;                     // [B, out, columns]
  int64_t in, out, taps, dilation, columns, stream_rows;
};

// Stream b's input rows t0..t0 + 16 of inputs c0..c0 + 16 (context rows first, then the new
// columns; zeros past them) rounded to bfloat16 into `rows`.
__attribute__((target("avx512f,avx512bf16"))) void pack_block(const float* context, const float* x, int64_t reach,
                                                              int64_t columns, int64_t in, int64_t b, int64_t c0,
                                                              int64_t t0, at::BFloat16* rows, int64_t stream_rows) {
  alignas(64) float by_input[kAmxRows * 16];
  alignas(64) float by_row[kAmxRows * 16];
  for (int64_t c = 0; c < 16; ++c) {
    const float* past = context + (b * in + c0 + c) * reach;
    const float* now = x + (b * in + c0 + c) * columns;
    // Lanes j of this block: row t0 + j, from the context below `reach`, then from `x`.
    const __mmask16 from_past = qwencodec::tail_mask(reach - t0);
    const __mmask16 in_input = qwencodec::tail_mask(reach + columns - t0);
    const __m512 old = _mm512_maskz_loadu_ps(from_past, past + t0);
    const __m512 all = _mm512_mask_loadu_ps(old, static_cast<__mmask16>(in_input & ~from_past), now + t0 - reach);
    _mm512_store_ps(by_input + c * 16, all);
  }
  qwencodec::transpose16(by_input, 16, by_row, 16);
  at::BFloat16* out = rows + (b * stream_rows + t0) * in + c0;
  for (int64_t j = 0; j < 16; ++j) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * in), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(by_row + j * 16)));
  }
}

// One unit: columns t0..t0 + 32 of stream b, outputs of blocks ob, ob + 1. The sums start from
// the bias and take every tap's every input; then they are turned to the outputs' rows.
__attribute__((target("avx512f,amx-tile,amx-bf16"))) void unit(const Convolution& c, int64_t b, int64_t ob,
                                                                int64_t t0) {
  const int64_t in_blocks = c.in / kInputs;
  const int64_t row_bytes = c.in * 2;
  const int64_t weight_block = kAmxRows * kInputs;  // bfloat16 values of one tile
  qwencodec::compiler_fence();
  _tile_loadd(0, c.bias_tiles + ob * 256, 64);
  _tile_loadd(1, c.bias_tiles + (ob + 1) * 256, 64);
  _tile_loadd(2, c.bias_tiles + ob * 256, 64);
  _tile_loadd(3, c.bias_tiles + (ob + 1) * 256, 64);
  const at::BFloat16* stream = c.rows + (b * c.stream_rows + t0) * c.in;
  for (int64_t k = 0; k < c.taps; ++k) {
    const at::BFloat16* shifted = stream + k * c.dilation * c.in;
    // The pair's weights lie in the order they are read.
    const at::BFloat16* weight = c.weights + ((ob / 2) * c.taps + k) * in_blocks * 2 * weight_block;
    for (int64_t i = 0; i < in_blocks; ++i) {
      _tile_loadd(4, shifted + i * kInputs, row_bytes);
      _tile_loadd(5, shifted + kAmxRows * c.in + i * kInputs, row_bytes);
      _tile_loadd(6, weight + 2 * i * weight_block, 64);
      _tile_loadd(7, weight + (2 * i + 1) * weight_block, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float sums[4][kAmxRows * 16];
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  _tile_stored(2, sums[2], 64);
  _tile_stored(3, sums[3], 64);
  qwencodec::compiler_fence();
  // sums[2 * half + block]: rows are columns t0 + 16 half + r, lanes outputs (ob + block) 16 + j.
  alignas(64) float by_output[kAmxRows * 16];
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t first = t0 + half * kAmxRows;
    const __mmask16 mask = qwencodec::tail_mask(c.columns - first);
    if (!mask) break;
    for (int64_t block = 0; block < 2; ++block) {
      qwencodec::transpose16(sums[2 * half + block], 16, by_output, 16);
      const int64_t o0 = (ob + block) * kAmxRows;
      const int64_t outputs = std::min(kAmxRows, c.out - o0);
      for (int64_t j = 0; j < outputs; ++j) {
        _mm512_mask_storeu_ps(c.y + (b * c.out + o0 + j) * c.columns + first, mask, _mm512_load_ps(by_output + j * 16));
      }
    }
  }
}

}  // namespace

extern "C" {

// `context`: [B, in, reach] float32, the kernel's reach into the past ((taps - 1) * dilation
// columns), moved on in place to the last `reach` columns of the input; `x`: [B, in, T] float32,
// the new columns; `weights`: bfloat16 [pairs, taps, in / 32, 2, 16, 16, 2], pairs the outputs'
// 32s rounded up, input i of output o at tap k at [o / 32][k][i / 32][(o / 16) % 2][(i % 32) /
// 2][o % 16][i % 2] (a pair of blocks of 16 outputs in the order a unit reads them), zeros past
// the outputs; `bias_tiles`: float32 [2 pairs, 16, 16], block ob's 16 biases in each of its rows;
// `out_features`: the outputs; all contiguous, `in` a multiple of 32 (qwencodec_amx_bf16 true).
// `*out`: [B, out_features, T] float32.
bool qwencodec_conv_amx(at::Tensor* context, const at::Tensor* x, const at::Tensor* weights,
                        const at::Tensor* bias_tiles, int64_t out_features, int64_t dilation, at::Tensor** out,
                        char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::conv_amx", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    TORCH_CHECK(x->dim() == 3 && x->scalar_type() == at::kFloat && x->is_contiguous() && x->size(2) >= 1,
                "a convolution's input is contiguous float32 [B, channels, T]");
    const int64_t batch = x->size(0), in = x->size(1), columns = x->size(2);
    TORCH_CHECK(weights->dim() == 7 && weights->scalar_type() == at::kBFloat16 && weights->is_contiguous() &&
                    out_features > 0 && weights->size(0) == (out_features + kUnit - 1) / kUnit &&
                    weights->size(2) * kInputs == in && weights->size(3) == 2 && weights->size(4) == kAmxRows &&
                    weights->size(5) == kAmxRows && weights->size(6) == 2,
                "AMX convolution weights are contiguous bfloat16 [out / 32 rounded up, taps, in / 32, 2, 16, 16, 2] "
                "for ",
                out_features, " outputs and ", in, " inputs (a multiple of 32)");
    const int64_t taps = weights->size(1), out_blocks = 2 * weights->size(0);
    TORCH_CHECK(bias_tiles->scalar_type() == at::kFloat && bias_tiles->is_contiguous() &&
                    bias_tiles->numel() == out_blocks * 256,
                "the bias tiles are contiguous float32 [", out_blocks, ", 16, 16]");
    TORCH_CHECK(dilation >= 1, "a dilation of at least 1, not ", dilation);
    const int64_t reach = (taps - 1) * dilation;
    TORCH_CHECK(context->dim() == 3 && context->scalar_type() == at::kFloat && context->is_contiguous() &&
                    context->size(0) == batch && context->size(1) == in && context->size(2) == reach,
                "a convolution's context is contiguous float32 [B, channels, ", reach, "] beside an input of ",
                x->sizes());
    // Every unit reads 32 columns' rows at each tap: rows past the input are zeros.
    const int64_t units_per_stream = (columns + kUnit - 1) / kUnit;
    const int64_t stream_rows = (reach + units_per_stream * kUnit + 15) / 16 * 16;
    at::Tensor rows = at::empty({batch, stream_rows, in}, x->options().dtype(at::kBFloat16));
    const float* past = context->data_ptr<float>();
    const float* now = x->data_ptr<float>();
    at::BFloat16* row_data = rows.data_ptr<at::BFloat16>();
    const int64_t row_blocks = stream_rows / 16, input_blocks = in / 16;
    at::parallel_for(0, batch * row_blocks * input_blocks, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / (row_blocks * input_blocks), rest = i % (row_blocks * input_blocks);
        pack_block(past, now, reach, columns, in, b, (rest % input_blocks) * 16, (rest / input_blocks) * 16, row_data,
                   stream_rows);
      }
    });
    at::Tensor result = at::empty({batch, out_features, columns}, x->options());
    const Convolution c{static_cast<const at::BFloat16*>(weights->data_ptr()),
                        bias_tiles->data_ptr<float>(),
                        row_data,
                        result.data_ptr<float>(),
                        in,
                        out_features,
                        taps,
                        dilation,
                        columns,
                        stream_rows};
    // Units by output pair, then stream, then columns: a thread's range shares its weights.
    const int64_t units = weights->size(0) * batch * units_per_stream;
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      qwencodec::load_eight_tile_config();
      for (int64_t u = begin; u < end; ++u) {
        const int64_t pair = u / (batch * units_per_stream), rest = u % (batch * units_per_stream);
        unit(c, rest / units_per_stream, 2 * pair, (rest % units_per_stream) * kUnit);
      }
      qwencodec::release_tiles();
    });
    // The context moves on to the input's last `reach` columns, once every unit has read it.
    qwencodec::advance_context(context->data_ptr<float>(), now, batch * in, reach, columns);
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
