//! `transformer_layer.cpp`: a whole transformer layer of a step of few rows in one call
//! (RMSNorm, the q/k/v products, attention, o_proj and its LayerScale, RMSNorm, the gated MLP and
//! its LayerScale), with AVX2 or AVX-512.

use tch::Tensor;

use super::TorchResult;
use super::attention::Tables;
use super::shim::{CpuKernels, call};

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    /// `QwencodecLayerWeights` of `transformer_layer.cpp`; biases may be null.
    #[repr(C)]
    pub struct LayerWeights {
        pub input_norm: *const C_tensor,
        pub qkv_weight: *const C_tensor,
        pub qkv_bias: *const C_tensor,
        pub o_weight: *const C_tensor,
        pub o_bias: *const C_tensor,
        pub attention_scale: *const C_tensor,
        pub post_attention_norm: *const C_tensor,
        pub gate_up_weight: *const C_tensor,
        pub gate_up_bias: *const C_tensor,
        pub down_weight: *const C_tensor,
        pub down_bias: *const C_tensor,
        pub mlp_scale: *const C_tensor,
        pub eps: f64,
    }

    /// `QwencodecStepAttention` of `transformer_layer.cpp`.
    #[repr(C)]
    pub struct StepAttention {
        pub query_cos: *const C_tensor,
        pub query_sin: *const C_tensor,
        pub key_cos: *const C_tensor,
        pub key_sin: *const C_tensor,
        pub mask: *const C_tensor,
        pub heads: i64,
        pub kv_heads: i64,
    }

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_transformer_layer(
            x: *const C_tensor,
            weights: *const LayerWeights,
            step: *const StepAttention,
            keys: *mut C_tensor,
            values: *mut C_tensor,
            kernels: i32,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;

        /// The C structs' sizes and offsets, for the test of these mirrors.
        #[cfg(test)]
        pub fn qwencodec_transformer_layer_layout(out: *mut usize, capacity: usize) -> usize;
    }
}

/// A product's weight and bias, packed for the few-row kernel.
pub struct Product<'a> {
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
}

/// A layer's weights as the kernel takes them.
pub struct LayerWeights<'a> {
    pub input_norm: &'a Tensor,
    pub qkv: Product<'a>,
    pub o: Product<'a>,
    pub attention_scale: &'a Tensor,
    pub post_attention_norm: &'a Tensor,
    pub gate_up: Product<'a>,
    pub down: Product<'a>,
    pub mlp_scale: &'a Tensor,
    pub eps: f64,
}

/// The layer on `x` ([B, T, hidden] float32, B T rows at most the few-row kernel's), the window
/// `keys`, `values` ([B, kv_heads, slots, head_dim] contiguous float32, which the kernel checks
/// before it writes them) moved on by T positions, in the instruction set of `kernels`.
#[allow(clippy::too_many_arguments)]
pub fn transformer_layer(
    x: &Tensor,
    weights: &LayerWeights<'_>,
    tables: &Tables<'_>,
    heads: i64,
    kv_heads: i64,
    keys: &mut Tensor,
    values: &mut Tensor,
    kernels: CpuKernels,
) -> TorchResult<Tensor> {
    let bias = |product: &Product<'_>| product.bias.map_or(std::ptr::null(), Tensor::as_ptr);
    let layer = ffi::LayerWeights {
        input_norm: weights.input_norm.as_ptr(),
        qkv_weight: weights.qkv.weight.as_ptr(),
        qkv_bias: bias(&weights.qkv),
        o_weight: weights.o.weight.as_ptr(),
        o_bias: bias(&weights.o),
        attention_scale: weights.attention_scale.as_ptr(),
        post_attention_norm: weights.post_attention_norm.as_ptr(),
        gate_up_weight: weights.gate_up.weight.as_ptr(),
        gate_up_bias: bias(&weights.gate_up),
        down_weight: weights.down.weight.as_ptr(),
        down_bias: bias(&weights.down),
        mlp_scale: weights.mlp_scale.as_ptr(),
        eps: weights.eps,
    };
    let step = ffi::StepAttention {
        query_cos: tables.query_cos.as_ptr(),
        query_sin: tables.query_sin.as_ptr(),
        key_cos: tables.key_cos.as_ptr(),
        key_sin: tables.key_sin.as_ptr(),
        mask: tables.mask.as_ptr(),
        heads,
        kv_heads,
    };
    // SAFETY: the tensors behind every pointer are live for the duration of the call.
    call("transformer layer", |out, error, size| unsafe {
        ffi::qwencodec_transformer_layer(
            x.as_ptr(),
            &layer,
            &step,
            keys.as_mut_ptr(),
            values.as_mut_ptr(),
            kernels as i32,
            out,
            error,
            size,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structs mirrored from `transformer_layer.cpp` lie in memory as the C++ compiler lays
    /// them out: same size, every field at the same offset.
    #[test]
    fn layer_structs_match_their_cpp_layout() {
        use std::mem::{offset_of, size_of};
        let ours = [
            size_of::<ffi::LayerWeights>(),
            offset_of!(ffi::LayerWeights, input_norm),
            offset_of!(ffi::LayerWeights, qkv_weight),
            offset_of!(ffi::LayerWeights, qkv_bias),
            offset_of!(ffi::LayerWeights, o_weight),
            offset_of!(ffi::LayerWeights, o_bias),
            offset_of!(ffi::LayerWeights, attention_scale),
            offset_of!(ffi::LayerWeights, post_attention_norm),
            offset_of!(ffi::LayerWeights, gate_up_weight),
            offset_of!(ffi::LayerWeights, gate_up_bias),
            offset_of!(ffi::LayerWeights, down_weight),
            offset_of!(ffi::LayerWeights, down_bias),
            offset_of!(ffi::LayerWeights, mlp_scale),
            offset_of!(ffi::LayerWeights, eps),
            size_of::<ffi::StepAttention>(),
            offset_of!(ffi::StepAttention, query_cos),
            offset_of!(ffi::StepAttention, query_sin),
            offset_of!(ffi::StepAttention, key_cos),
            offset_of!(ffi::StepAttention, key_sin),
            offset_of!(ffi::StepAttention, mask),
            offset_of!(ffi::StepAttention, heads),
            offset_of!(ffi::StepAttention, kv_heads),
        ];
        let mut theirs = [0usize; 32];
        // SAFETY: the function writes at most `capacity` values.
        let count = unsafe { ffi::qwencodec_transformer_layer_layout(theirs.as_mut_ptr(), theirs.len()) };
        assert_eq!(&ours[..], &theirs[..count], "sizes then offsets, as in the C++");
    }
}
