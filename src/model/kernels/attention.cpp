// One transformer layer's sliding-window attention for a step on the CPU, in one call: RoPE on
// the queries and the window's keys, scores, mask, softmax, the values' weighted sum, and the
// KV window moved on by the step's positions. A step has a few positions against a window of a
// few dozen, so the arithmetic is small and libtorch's way (about forty ops per layer, each
// dispatched, allocated and split over the threads) spent most of the layer's time outside its
// products. Plain loops, float32 like libtorch's ops, compiled for AVX2 and FMA (the kernel runs
// where those are: shim.rs), the dot products in vectors. Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "shim.h"

namespace {

struct Attention {
  const float* qkv;  // [B, T, (H + 2 KV) D]
  float* keys;       // [B, KV, S, D]
  float* values;     // [B, KV, S, D]
  const float* query_cos;
  const float* query_sin;  // [T, D]
  const float* key_cos;
  const float* key_sin;  // [S + T, D]
  const float* mask;     // [B, T, S + T]
  float* out;            // [B, T, H D]
  int64_t steps, heads, kv_heads, head_dim, slots;

  int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t positions() const { return slots + steps; }
};

// `x` rotated as upstream's RoPE rotates it: x * cos + rotate_half(x) * sin, rotate_half(x)
// being [-x2, x1] for the halves x1, x2.
__attribute__((target("avx2,fma"))) void rope(const float* x, const float* cos, const float* sin, float* out, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
  for (int64_t i = half; i < d; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

// The dot product of `a` and `b` (`d` values) in two vectors of partial sums: one chain of d
// dependent adds, as a plain loop keeps them, takes most of the layer's attention.
__attribute__((target("avx2,fma"))) float dot(const float* a, const float* b, int64_t d) {
  __m256 first = _mm256_setzero_ps(), second = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    first = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), first);
    second = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), second);
  }
  for (; i + 8 <= d; i += 8) first = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), first);
  const __m256 both = _mm256_add_ps(first, second);
  __m128 four = _mm_add_ps(_mm256_castps256_ps128(both), _mm256_extractf128_ps(both, 1));
  four = _mm_add_ps(four, _mm_movehl_ps(four, four));
  float sum = _mm_cvtss_f32(_mm_add_ss(four, _mm_shuffle_ps(four, four, 1)));
  for (; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

// Key/value head `g` of row `b`: the query heads it serves, then its window moved on.
__attribute__((target("avx2,fma"))) void group(const Attention& a, int64_t b, int64_t g) {
  const int64_t d = a.head_dim, positions = a.positions(), groups = a.heads / a.kv_heads;
  float* window_keys = a.keys + (b * a.kv_heads + g) * a.slots * d;
  float* window_values = a.values + (b * a.kv_heads + g) * a.slots * d;
  const float* new_rows = a.qkv + b * a.steps * a.width();
  const int64_t key_offset = (a.heads + g) * d, value_offset = (a.heads + a.kv_heads + g) * d;
  // Keys and values by position: the window's slots, then the step's positions.
  auto key_at = [&](int64_t j) {
    return j < a.slots ? window_keys + j * d : new_rows + (j - a.slots) * a.width() + key_offset;
  };
  auto value_at = [&](int64_t j) {
    return j < a.slots ? window_values + j * d : new_rows + (j - a.slots) * a.width() + value_offset;
  };
  std::vector<float> rotated_keys(positions * d), query(d), scores(positions), sum(d);
  for (int64_t j = 0; j < positions; ++j) {
    rope(key_at(j), a.key_cos + j * d, a.key_sin + j * d, rotated_keys.data() + j * d, d);
  }
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  for (int64_t h = g * groups; h < (g + 1) * groups; ++h) {
    for (int64_t t = 0; t < a.steps; ++t) {
      rope(new_rows + t * a.width() + h * d, a.query_cos + t * d, a.query_sin + t * d, query.data(), d);
      const float* mask = a.mask + (b * a.steps + t) * positions;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < positions; ++j) {
        scores[j] = dot(query.data(), rotated_keys.data() + j * d, d) * scale + mask[j];
        top = std::max(top, scores[j]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j < positions; ++j) {
        scores[j] = std::exp(scores[j] - top);
        total += scores[j];
      }
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t j = 0; j < positions; ++j) {
        const float p = scores[j] / total;
        const float* v = value_at(j);
        for (int64_t i = 0; i < d; ++i) sum[i] += p * v[i];
      }
      std::memcpy(a.out + (b * a.steps + t) * a.heads * d + h * d, sum.data(), d * sizeof(float));
    }
  }
  // The window keeps the last `slots` positions, un-rotated.
  const int64_t kept = std::max<int64_t>(0, a.slots - a.steps);
  std::memmove(window_keys, window_keys + (a.slots - kept) * d, kept * d * sizeof(float));
  std::memmove(window_values, window_values + (a.slots - kept) * d, kept * d * sizeof(float));
  for (int64_t j = kept; j < a.slots; ++j) {
    const int64_t t = a.steps - (a.slots - j);
    std::memcpy(window_keys + j * d, new_rows + t * a.width() + key_offset, d * sizeof(float));
    std::memcpy(window_values + j * d, new_rows + t * a.width() + value_offset, d * sizeof(float));
  }
}

void check_float(const at::Tensor& t, int64_t dim, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == dim && t.device().is_cpu(), what,
              " must be float32 on the CPU with ", dim, " dimensions");
}

at::Tensor attention(const at::Tensor& qkv, at::Tensor& keys, at::Tensor& values, const at::Tensor& query_cos,
                     const at::Tensor& query_sin, const at::Tensor& key_cos, const at::Tensor& key_sin,
                     const at::Tensor& mask, int64_t heads, int64_t kv_heads) {
  check_float(qkv, 3, "qkv");
  check_float(keys, 4, "the window's keys");
  check_float(values, 4, "the window's values");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes(),
              "the window's keys and values are contiguous and alike");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, heads, " query heads for ", kv_heads,
              " key/value heads");
  const int64_t batch = qkv.size(0), steps = qkv.size(1), head_dim = keys.size(3), slots = keys.size(2);
  TORCH_CHECK(head_dim % 2 == 0 && qkv.size(2) == (heads + 2 * kv_heads) * head_dim && keys.size(0) == batch &&
                  keys.size(1) == kv_heads,
              "qkv's heads and the window's do not match");
  const at::Tensor tables[4] = {query_cos.contiguous(), query_sin.contiguous(), key_cos.contiguous(),
                                key_sin.contiguous()};
  for (int i = 0; i < 4; ++i) {
    check_float(tables[i], 2, "a RoPE table");
    TORCH_CHECK(tables[i].size(0) == (i < 2 ? steps : slots + steps) && tables[i].size(1) == head_dim,
                "a RoPE table made for another step");
  }
  check_float(mask, 4, "the mask");
  const at::Tensor scores_mask = mask.expand({batch, 1, steps, slots + steps}).contiguous();
  const at::Tensor input = qkv.contiguous();
  at::Tensor result = at::empty({batch, steps, heads * head_dim}, input.options());
  const Attention a{input.data_ptr<float>(),     keys.data_ptr<float>(),       values.data_ptr<float>(),
                    tables[0].data_ptr<float>(), tables[1].data_ptr<float>(), tables[2].data_ptr<float>(),
                    tables[3].data_ptr<float>(), scores_mask.data_ptr<float>(), result.data_ptr<float>(),
                    steps,                       heads,                        kv_heads,
                    head_dim,                    slots};
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) group(a, i / kv_heads, i % kv_heads);
  });
  return result;
}

}  // namespace

extern "C" {

// `qkv`: [B, T, (H + 2 KV) D], the queries', keys' and values' heads side by side; `keys`,
// `values`: [B, KV, S, D], contiguous, the window (updated in place); `query_cos`/`query_sin`:
// [T, D] and `key_cos`/`key_sin`: [S + T, D], the RoPE tables; `mask`: [B, 1, T, S + T], added
// to the scores. `*out`: [B, T, H D], a new tensor.
bool qwencodec_attention(const at::Tensor* qkv, at::Tensor* keys, at::Tensor* values, const at::Tensor* query_cos,
                         const at::Tensor* query_sin, const at::Tensor* key_cos, const at::Tensor* key_sin,
                         const at::Tensor* mask, int64_t heads, int64_t kv_heads, at::Tensor** out, char* error,
                         size_t error_size) {
  RECORD_FUNCTION("qwencodec::attention", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    *out = new at::Tensor(attention(*qkv, *keys, *values, *query_cos, *query_sin, *key_cos, *key_sin,
                                               *mask, heads, kv_heads));
  });
}

}  // extern "C"
