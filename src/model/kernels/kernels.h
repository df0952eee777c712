// The instruction-set switch of the kernels that come in AVX2 and AVX-512.
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

}  // namespace qwencodec
