//! Float32 weights against a few rows of activations on the CPU: the C++ kernel of
//! `skinny_gemm.cpp` (AVX-512), which reads each weight once whatever the number of rows.
//!
//! A small step's products are a weight against 1 to about a hundred rows (a frame is 1 row in
//! the transformer, 4 after the upsampler, 32 in the vocoder's first block). MKL streams a
//! weight at memory speed for 1 or 2 rows, but for 4 to 64 rows it re-reads or re-packs it and
//! runs several times slower than the weight's bytes allow
//! (`bench/results/2026-11-30-amd-epyc-avx512-skinny-gemm.md`).

use tch::{Device, Kind, Tensor};

use super::TorchResult;
use super::shim::{self, call};

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_skinny_gemm(
            weight: *const C_tensor,
            rows: *const C_tensor,
            bias: *const C_tensor,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// Most activation rows a product runs here with: from there on MKL's kernels reuse each weight
/// element often enough to be as fast.
const MAX_ROWS: i64 = 128;

/// Whether `weight` [out, in] against `rows` rows runs here: a contiguous float32 weight on a
/// CPU with AVX-512, at most [`MAX_ROWS`] rows.
pub fn applies(weight: &Tensor, rows: i64) -> bool {
    rows <= MAX_ROWS
        && weight.device() == Device::Cpu
        && weight.kind() == Kind::Float
        && weight.is_contiguous()
        && shim::avx512()
}

/// `weight` [out, in] times each row of `rows` [R, in], plus `bias` (`out` values): [out, R],
/// as [`super::ops::project`].
pub fn product(weight: &Tensor, rows: &Tensor, bias: Option<&Tensor>) -> TorchResult<Tensor> {
    let bias = bias.map(Tensor::f_contiguous).transpose()?;
    let bias_ptr = bias.as_ref().map_or(std::ptr::null(), |bias| bias.as_ptr());
    // SAFETY: the tensors are live for the duration of the call; the bias may be null.
    call("float32 product", |out, error, size| unsafe {
        ffi::qwencodec_skinny_gemm(weight.as_ptr(), rows.as_ptr(), bias_ptr, out, error, size)
    })
}
