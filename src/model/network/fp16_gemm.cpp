// FBGEMM's float16-weight product (at::fbgemm_linear_fp16_weight_fp32_activation) behind a C
// interface for fp16_gemm.rs: tch does not wrap it. The weight is packed once to float16; the
// activations, the accumulation and the result stay float32. Each function returns false on
// failure, with libtorch's message in `error` (shim.h).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <vector>

#include "shim.h"

namespace {

// ATen warns once per process that these functions are deprecated; the decoder's users cannot
// act on that, so it is kept off their stderr.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

extern "C" {

// `weight`: [out, in] float32 on the CPU. `*out`: the packed matrix, a new tensor.
bool qwencodec_fp16_pack(const at::Tensor* weight, at::Tensor** out, char* error, size_t error_size) {
  return qwencodec::guarded(error, error_size, [&] {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    *out = new at::Tensor(at::fbgemm_pack_gemm_matrix_fp16(*weight));
  });
}

// `input`: [rows, in] float32; `packed[i]` and `biases[i]` ([out_i] float32): the `parts`
// slices of the output features, one per thread (FBGEMM's product runs on the calling thread
// only). `*out`: [rows, sum of out_i] float32, a new tensor.
bool qwencodec_fp16_linear(const at::Tensor* input, const at::Tensor* const* packed,
                           const at::Tensor* const* biases, size_t parts, at::Tensor** out, char* error,
                           size_t error_size) {
  RECORD_FUNCTION("qwencodec::fp16_linear", c10::ArrayRef<const c10::IValue>{});
  return qwencodec::guarded(error, error_size, [&] {
    std::vector<at::Tensor> outputs(parts);
    at::parallel_for(0, static_cast<int64_t>(parts), 1, [&](int64_t begin, int64_t end) {
      SilentWarnings silent;
      c10::WarningUtils::WarningHandlerGuard guard(&silent);
      for (int64_t part = begin; part < end; ++part) {
        outputs[part] = at::fbgemm_linear_fp16_weight_fp32_activation(*input, *packed[part], *biases[part]);
      }
    });
    *out = new at::Tensor(parts == 1 ? outputs[0] : at::cat(outputs, 1));
  });
}

}  // extern "C"
