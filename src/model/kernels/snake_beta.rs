//! `snake_beta.cpp`: SnakeBeta, `x + inverse_magnitude * sin(frequency * x)^2` per channel, in
//! one pass with AVX2 or AVX-512 (SLEEF's vectorized sine).

use tch::Tensor;

use super::shim::{CpuKernels, call};
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_snake_beta(
            x: *const C_tensor,
            frequency: *const C_tensor,
            inverse_magnitude: *const C_tensor,
            kernels: i32,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// `x`: [B, channels, T] float32 on the CPU; `frequency`, `inverse_magnitude`: [1, channels, 1]
/// float32. Runs in the instruction set of `kernels` (AVX2 or AVX-512), which the CPU must have.
pub fn snake_beta(
    x: &Tensor,
    frequency: &Tensor,
    inverse_magnitude: &Tensor,
    kernels: CpuKernels,
) -> TorchResult<Tensor> {
    // SAFETY: the tensors are live for the duration of the call.
    call("SnakeBeta", |out, error, size| unsafe {
        ffi::qwencodec_snake_beta(
            x.as_ptr(),
            frequency.as_ptr(),
            inverse_magnitude.as_ptr(),
            kernels as i32,
            out,
            error,
            size,
        )
    })
}
