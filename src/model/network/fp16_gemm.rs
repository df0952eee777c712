//! float16 weights against float32 activations on the CPU: FBGEMM's packed float16 product
//! (through the C++ shim `fp16_gemm.cpp` that build.rs compiles). Weights are read at half the
//! bytes of float32, which is what a small step's products cost; the activations and the
//! accumulation keep float32, so the only rounding is the weights' own.

use tch::{Kind, Tensor};

use super::TorchResult;
use super::shim::call;

/// What an error of these products says failed.
const WHAT: &str = "float16 weights (FBGEMM)";

mod ffi {
    use std::ffi::c_char;

    use tch::Tensor;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_fp16_pack(
            weight: *const C_tensor,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
        pub fn qwencodec_fp16_linear(
            input: *const C_tensor,
            packed: *const *const C_tensor,
            biases: *const *const C_tensor,
            parts: usize,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }

    pub fn raw(tensor: &Tensor) -> *const C_tensor {
        tensor.as_ptr()
    }
}

/// A weight [out, in] packed to float16, and its bias in float32, in slices of the output
/// features: one per thread, as FBGEMM's product runs on the thread that calls it.
pub struct Fp16Matrix {
    packed: Vec<Tensor>,
    /// [out_i] float32 each: zeros for a product without bias.
    biases: Vec<Tensor>,
}

impl Fp16Matrix {
    /// `weight` [out, in] and `bias` [out] of any floating kind, on the CPU.
    pub fn pack(weight: &Tensor, bias: Option<&Tensor>) -> TorchResult<Self> {
        let weight = weight.f_to_kind(Kind::Float)?;
        let bias = match bias {
            Some(bias) => bias.f_to_kind(Kind::Float)?.f_flatten(0, -1)?,
            None => Tensor::f_zeros([weight.size()[0]], (Kind::Float, weight.device()))?,
        };
        let threads = tch::get_num_threads().max(1) as i64;
        let packed = weight
            .f_chunk(threads, 0)?
            .iter()
            .map(|slice| {
                let slice = slice.f_contiguous()?;
                // SAFETY: `slice` is a live tensor for the duration of the call.
                call(WHAT, |out, error, size| unsafe {
                    ffi::qwencodec_fp16_pack(ffi::raw(&slice), out, error, size)
                })
            })
            .collect::<TorchResult<Vec<_>>>()?;
        let biases = bias
            .f_chunk(threads, 0)?
            .iter()
            .map(Tensor::f_contiguous)
            .collect::<TorchResult<Vec<_>>>()?;
        Ok(Self { packed, biases })
    }

    /// `rows` [R, in] float32 -> [R, out] float32.
    pub fn forward(&self, rows: &Tensor) -> TorchResult<Tensor> {
        let rows = rows.f_contiguous()?;
        let packed: Vec<_> = self.packed.iter().map(ffi::raw).collect();
        let biases: Vec<_> = self.biases.iter().map(ffi::raw).collect();
        // SAFETY: every tensor is live for the duration of the call; both lists hold `parts`.
        call(WHAT, |out, error, size| unsafe {
            ffi::qwencodec_fp16_linear(
                ffi::raw(&rows),
                packed.as_ptr(),
                biases.as_ptr(),
                packed.len(),
                out,
                error,
                size,
            )
        })
    }
}
