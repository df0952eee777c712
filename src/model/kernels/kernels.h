// The CPU kernels that other kernels call in C++ (transformer_layer.cpp strings a layer's
// together), each defined beside its own C entry point. They check their inputs with
// TORCH_CHECK, as those entry points do.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace qwencodec {

// The instruction set of the kernels that come in more than one (shim.rs's `CpuKernels`); the
// caller has checked that the CPU has it.
enum class CpuKernels : int32_t { kOff = 0, kAvx2 = 1, kAvx512 = 2 };

// A C entry point's `kernels` argument as the instruction set of a kernel that comes in AVX2 and
// AVX-512 (`what`, for the error any other value is).
inline CpuKernels vector_kernels(int32_t kernels, const char* what) {
  TORCH_CHECK(kernels == static_cast<int32_t>(CpuKernels::kAvx2) ||
                  kernels == static_cast<int32_t>(CpuKernels::kAvx512),
              what, " runs in AVX2 or AVX-512, not kernels ", kernels);
  return static_cast<CpuKernels>(kernels);
}

// `weight` [out, in] (float32 or float16, contiguous) times each of `rows` [n, in] (float32),
// plus `bias` ([out] float32, or null): [n, out] with `rows_first`, else [out, n]. In AVX2 or
// AVX-512, as `kernels` says (see vector_kernels; skinny_gemm.cpp).
at::Tensor few_row_product(const at::Tensor& weight, const at::Tensor& rows, const at::Tensor* bias,
                           bool rows_first, CpuKernels kernels);

// RMSNorm of `x`'s rows (float32 [..., width]) with `weight` (`width` float32 values): a new
// contiguous tensor of `x`'s shape (rms_norm.cpp).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// A layer's attention for a step, the window moved on in place (attention.cpp, whose C entry
// point documents the arguments).
at::Tensor attention(const at::Tensor& qkv, at::Tensor& keys, at::Tensor& values, const at::Tensor& query_cos,
                     const at::Tensor& query_sin, const at::Tensor& key_cos, const at::Tensor& key_sin,
                     const at::Tensor& mask, int64_t heads, int64_t kv_heads);

}  // namespace qwencodec
