//! `rms_norm.cpp`: RMSNorm over the last dimension in one op, where libtorch's ops take six
//! (plain C++, no vector instruction set of its own).

use tch::Tensor;

use super::shim::call;
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_rms_norm(
            x: *const C_tensor,
            weight: *const C_tensor,
            eps: f64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// `weight * (x * rsqrt(mean(x^2) + eps))`; `x`: [..., size] float32 on the CPU, `weight`:
/// [size] float32.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> TorchResult<Tensor> {
    // SAFETY: the tensors are live for the duration of the call.
    call("RMSNorm", |out, error, size| unsafe {
        ffi::qwencodec_rms_norm(x.as_ptr(), weight.as_ptr(), eps, out, error, size)
    })
}
