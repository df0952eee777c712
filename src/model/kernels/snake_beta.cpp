// SnakeBeta, x + inverse_magnitude * sin(frequency * x)^2 per channel, in one pass over float32
// activations on the CPU: libtorch's element-wise ops take four passes and two tensors, and the
// vocoder's late blocks run it on hundreds of thousands of samples a step. In AVX-512 or AVX2
// (with FMA), the caller says which (shim.rs checks the CPU): the same arithmetic in vectors of
// 16 or 8. Errors as in shim.h.

#include "intrinsics.h"  // first: see there

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels.h"
#include "shim.h"
#include "widen.h"

extern "C" __m512 Sleef_sinf16_u10(__m512);
extern "C" __m256 Sleef_sinf8_u10avx2(__m256);

namespace {

// Elements per thread below which a split costs more than it saves.
constexpr int64_t kGrain = 32768;

// pi in three parts (Cody and Waite): the first has 8 significant bits, so that k times it is
// exact while k < 2^16, which every argument up to kReducedLimit keeps.
constexpr float kPiHigh = 3.140625f;
constexpr float kPiMiddle = 9.67502593994140625e-4f;
constexpr float kPiLow = 1.509957990978376432e-7f;
constexpr float kReducedLimit = 65536.0f;

// sin(y)^2, within about 2 ulp: sin^2 has period pi, so y is reduced to r = y - k pi in [-pi/2,
// pi/2], and sin(r) = r + r^3 P(r^2), P fitted to 5e-9 there. SLEEF's 1-ulp sine, which
// libtorch_cpu exports (its own vectorized sin calls it), reduces any argument to a quarter
// period and would take most of the kernel's time; it serves only vectors with an argument
// beyond kReducedLimit (or not a number).
__attribute__((target("avx512f"))) inline __m512 sin_squared(__m512 y) {
  if (_mm512_cmp_ps_mask(_mm512_abs_ps(y), _mm512_set1_ps(kReducedLimit), _CMP_NLE_UQ) != 0) {
    const __m512 s = Sleef_sinf16_u10(y);
    return _mm512_mul_ps(s, s);
  }
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(0.318309886183790671f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kPiHigh), y);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kPiMiddle), r);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kPiLow), r);
  const __m512 u = _mm512_mul_ps(r, r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(2.6089924e-06f), u, _mm512_set1_ps(-0.00019811139f));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.008333089f));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-0.16666661f));
  const __m512 s = _mm512_fmadd_ps(_mm512_mul_ps(p, u), r, r);
  return _mm512_mul_ps(s, s);
}

// Rows `begin..end` of [rows, length], row r of channel r % channels.
__attribute__((target("avx512f"))) void snake_rows(const float* x, float* y, const float* frequency,
                                                   const float* inverse_magnitude, int64_t channels,
                                                   int64_t length, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const __m512 f = _mm512_set1_ps(frequency[row % channels]);
    const __m512 m = _mm512_set1_ps(inverse_magnitude[row % channels]);
    const float* in = x + row * length;
    float* out = y + row * length;
    int64_t t = 0;
    for (; t + 16 <= length; t += 16) {
      const __m512 v = _mm512_loadu_ps(in + t);
      _mm512_storeu_ps(out + t, _mm512_fmadd_ps(sin_squared(_mm512_mul_ps(v, f)), m, v));
    }
    if (t < length) {
      const __mmask16 mask = qwencodec::tail_mask(length - t);
      const __m512 v = _mm512_maskz_loadu_ps(mask, in + t);
      _mm512_mask_storeu_ps(out + t, mask, _mm512_fmadd_ps(sin_squared(_mm512_mul_ps(v, f)), m, v));
    }
  }
}

// sin_squared in AVX2, lane for lane the same arithmetic.
__attribute__((target("avx2,fma"))) inline __m256 sin_squared8(__m256 y) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), y);
  if (_mm256_movemask_ps(_mm256_cmp_ps(magnitude, _mm256_set1_ps(kReducedLimit), _CMP_NLE_UQ)) != 0) {
    const __m256 s = Sleef_sinf8_u10avx2(y);
    return _mm256_mul_ps(s, s);
  }
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(0.318309886183790671f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kPiHigh), y);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kPiMiddle), r);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kPiLow), r);
  const __m256 u = _mm256_mul_ps(r, r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(2.6089924e-06f), u, _mm256_set1_ps(-0.00019811139f));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(0.008333089f));
  p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(-0.16666661f));
  const __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(p, u), r, r);
  return _mm256_mul_ps(s, s);
}

// snake_rows in AVX2; a row's last partial vector goes through a zero-padded copy.
__attribute__((target("avx2,fma"))) void snake_rows8(const float* x, float* y, const float* frequency,
                                                    const float* inverse_magnitude, int64_t channels,
                                                    int64_t length, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const __m256 f = _mm256_set1_ps(frequency[row % channels]);
    const __m256 m = _mm256_set1_ps(inverse_magnitude[row % channels]);
    const float* in = x + row * length;
    float* out = y + row * length;
    int64_t t = 0;
    for (; t + 8 <= length; t += 8) {
      const __m256 v = _mm256_loadu_ps(in + t);
      _mm256_storeu_ps(out + t, _mm256_fmadd_ps(sin_squared8(_mm256_mul_ps(v, f)), m, v));
    }
    if (t < length) {
      float padded[8] = {};
      std::copy(in + t, in + length, padded);
      const __m256 v = _mm256_loadu_ps(padded);
      _mm256_storeu_ps(padded, _mm256_fmadd_ps(sin_squared8(_mm256_mul_ps(v, f)), m, v));
      std::copy(padded, padded + (length - t), out + t);
    }
  }
}

}  // namespace

extern "C" {

// `x`: [B, channels, T] float32; `frequency`, `inverse_magnitude`: `channels` float32 values
// each, contiguous; `kernels`: the instruction set (qwencodec::CpuKernels, AVX2 or AVX-512).
// `*out`: SnakeBeta of `x`, a new contiguous tensor.
bool qwencodec_snake_beta(const at::Tensor* x, const at::Tensor* frequency, const at::Tensor* inverse_magnitude,
                          int32_t kernels, at::Tensor** out, char* error, size_t error_size) {
  RECORD_FUNCTION("qwencodec::snake_beta", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    const auto isa = qwencodec::vector_kernels(kernels, "SnakeBeta");
    TORCH_CHECK(x->dim() == 3 && x->scalar_type() == at::kFloat, "SnakeBeta takes float32 [B, channels, T]");
    const int64_t channels = x->size(1);
    for (const at::Tensor* factor : {frequency, inverse_magnitude}) {
      TORCH_CHECK(factor->is_contiguous() && factor->numel() == channels && factor->scalar_type() == at::kFloat,
                  "SnakeBeta's factors are float32, one per channel");
    }
    const at::Tensor input = x->contiguous();
    at::Tensor result = at::empty_like(input);
    const int64_t rows = input.size(0) * channels;
    const int64_t length = input.size(2);
    const float* in = input.data_ptr<float>();
    float* y = result.data_ptr<float>();
    const float* f = frequency->data_ptr<float>();
    const float* m = inverse_magnitude->data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, length)),
                     [&](int64_t begin, int64_t end) {
                       if (isa == qwencodec::CpuKernels::kAvx512) {
                         snake_rows(in, y, f, m, channels, length, begin, end);
                       } else {
                         snake_rows8(in, y, f, m, channels, length, begin, end);
                       }
                     });
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"
