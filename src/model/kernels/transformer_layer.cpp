// One transformer layer of a step on the CPU in one call: RMSNorm, the stacked q/k/v product,
// attention (the window moved on), o_proj and its LayerScale'd residual, RMSNorm, the stacked
// gate/up product, SiLU gating, down_proj and its residual. A one-frame step runs a layer on a
// row per stream, where libtorch's way (about 27 ops a layer, each dispatched from Rust and
// allocated) spent a fifth of the transformer's time between the products. The products are
// the few-row kernel's, so this runs where that does (AVX2 or AVX-512) and on as many rows.
// Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels.h"
#include "shim.h"

extern "C" {

// A layer's tensors, as transformer.rs holds them; biases may be null. Products: contiguous
// [out, in] float32 or float16 weights with float32 biases of [out] values; norms and
// LayerScales: float32, one per hidden unit.
struct QwencodecLayerWeights {
  const at::Tensor* input_norm;
  const at::Tensor* qkv_weight;
  const at::Tensor* qkv_bias;
  const at::Tensor* o_weight;
  const at::Tensor* o_bias;
  const at::Tensor* attention_scale;
  const at::Tensor* post_attention_norm;
  const at::Tensor* gate_up_weight;
  const at::Tensor* gate_up_bias;
  const at::Tensor* down_weight;
  const at::Tensor* down_bias;
  const at::Tensor* mlp_scale;
  double eps;
};

// What every layer's attention shares in a step (as qwencodec_attention takes it).
struct QwencodecStepAttention {
  const at::Tensor* query_cos;
  const at::Tensor* query_sin;
  const at::Tensor* key_cos;
  const at::Tensor* key_sin;
  const at::Tensor* mask;
  int64_t heads;
  int64_t kv_heads;
};

static_assert(std::is_standard_layout_v<QwencodecLayerWeights> && std::is_standard_layout_v<QwencodecStepAttention>,
              "the structs transformer.rs mirrors are plain C structs");

// The two structs' sizes and their fields' offsets, in declaration order, for transformer.rs's
// test of its mirror: writes up to `capacity` and returns how many there are.
size_t qwencodec_transformer_layer_layout(size_t* out, size_t capacity) {
  const size_t layout[] = {
      sizeof(QwencodecLayerWeights),
      offsetof(QwencodecLayerWeights, input_norm),
      offsetof(QwencodecLayerWeights, qkv_weight),
      offsetof(QwencodecLayerWeights, qkv_bias),
      offsetof(QwencodecLayerWeights, o_weight),
      offsetof(QwencodecLayerWeights, o_bias),
      offsetof(QwencodecLayerWeights, attention_scale),
      offsetof(QwencodecLayerWeights, post_attention_norm),
      offsetof(QwencodecLayerWeights, gate_up_weight),
      offsetof(QwencodecLayerWeights, gate_up_bias),
      offsetof(QwencodecLayerWeights, down_weight),
      offsetof(QwencodecLayerWeights, down_bias),
      offsetof(QwencodecLayerWeights, mlp_scale),
      offsetof(QwencodecLayerWeights, eps),
      sizeof(QwencodecStepAttention),
      offsetof(QwencodecStepAttention, query_cos),
      offsetof(QwencodecStepAttention, query_sin),
      offsetof(QwencodecStepAttention, key_cos),
      offsetof(QwencodecStepAttention, key_sin),
      offsetof(QwencodecStepAttention, mask),
      offsetof(QwencodecStepAttention, heads),
      offsetof(QwencodecStepAttention, kv_heads),
  };
  const size_t count = sizeof(layout) / sizeof(layout[0]);
  for (size_t i = 0; i < count && i < capacity; ++i) out[i] = layout[i];
  return count;
}

}  // extern "C"

namespace {

// x += branch * scale, per hidden unit (upstream's LayerScale'd residual).
void add_scaled(at::Tensor& x, const at::Tensor& branch, const at::Tensor* scale, const char* what) {
  const int64_t hidden = x.size(1);
  TORCH_CHECK(branch.sizes() == x.sizes(), what, " gives ", branch.sizes(), " for a residual of ", x.sizes());
  TORCH_CHECK(scale->is_contiguous() && scale->numel() == hidden && scale->scalar_type() == at::kFloat, what,
              " must be float32, one per hidden unit (", hidden, ")");
  const float* s = scale->data_ptr<float>();
  const float* b = branch.data_ptr<float>();
  float* out = x.data_ptr<float>();
  for (int64_t row = 0; row < x.size(0); ++row) {
    for (int64_t i = 0; i < hidden; ++i) out[row * hidden + i] += b[row * hidden + i] * s[i];
  }
}

// [rows, 2 I] gate and up halves -> [rows, I]: silu(gate) * up, SiLU as libtorch computes it.
at::Tensor gated(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up_proj gives an odd width, ", gate_up.size(1));
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  at::Tensor result = at::empty({rows, width}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* out = result.data_ptr<float>();
  for (int64_t row = 0; row < rows; ++row) {
    const float* gate = in + row * 2 * width;
    const float* up = gate + width;
    for (int64_t i = 0; i < width; ++i) out[row * width + i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
  return result;
}

}  // namespace

extern "C" {

// `x`: [B, T, hidden] float32, the layer's input; `keys`, `values`: the layer's window, as
// qwencodec_attention takes it (moved on in place); `kernels`: the products' instruction set
// (qwencodec::CpuKernels). `*out`: the layer's output, [B, T, hidden], a new tensor.
bool qwencodec_transformer_layer(const at::Tensor* x, const QwencodecLayerWeights* w,
                                 const QwencodecStepAttention* step, at::Tensor* keys, at::Tensor* values,
                                 int32_t kernels, at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::transformer_layer", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const auto isa = qwencodec::vector_kernels(kernels, "the transformer layer");
    TORCH_CHECK(x->dim() == 3 && x->scalar_type() == at::kFloat && x->device().is_cpu(),
                "a transformer layer takes float32 [batch, steps, hidden] on the CPU, not ", x->sizes());
    const int64_t batch = x->size(0), steps = x->size(1), hidden = x->size(2);
    // The residual stream, updated in place.
    at::Tensor residual = x->reshape({batch * steps, hidden}).clone(at::MemoryFormat::Contiguous);

    const at::Tensor qkv = qwencodec::few_row_product(
        *w->qkv_weight, qwencodec::rms_norm(residual, *w->input_norm, w->eps), w->qkv_bias, true, isa);
    const at::Tensor attended =
        qwencodec::attention(qkv.view({batch, steps, -1}), *keys, *values, *step->query_cos, *step->query_sin,
                             *step->key_cos, *step->key_sin, *step->mask, step->heads, step->kv_heads);
    add_scaled(residual,
               qwencodec::few_row_product(*w->o_weight, attended.view({batch * steps, -1}), w->o_bias, true, isa),
               w->attention_scale, "self_attn_layer_scale");

    const at::Tensor gate_up = qwencodec::few_row_product(
        *w->gate_up_weight, qwencodec::rms_norm(residual, *w->post_attention_norm, w->eps),
        w->gate_up_bias, true, isa);
    add_scaled(residual, qwencodec::few_row_product(*w->down_weight, gated(gate_up), w->down_bias, true, isa),
               w->mlp_scale, "mlp_layer_scale");
    *out = new at::Tensor(residual.view({batch, steps, hidden}));
  });
}

}  // extern "C"
