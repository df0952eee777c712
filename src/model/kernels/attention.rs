//! `attention.cpp`: a layer's sliding-window attention for one step in one call (RoPE, masked
//! softmax, the values' weighted sum, the KV window moved on in place).

use tch::Tensor;

use super::shim::call;
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_attention(
            qkv: *const C_tensor,
            keys: *mut C_tensor,
            values: *mut C_tensor,
            query_cos: *const C_tensor,
            query_sin: *const C_tensor,
            key_cos: *const C_tensor,
            key_sin: *const C_tensor,
            mask: *const C_tensor,
            heads: i64,
            kv_heads: i64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// The step's RoPE tables (cos and sin, for the queries and for the window's keys and the
/// step's) and the mask added to the scores.
pub struct Tables<'a> {
    pub query_cos: &'a Tensor,
    pub query_sin: &'a Tensor,
    pub key_cos: &'a Tensor,
    pub key_sin: &'a Tensor,
    pub mask: &'a Tensor,
}

/// `qkv`: [B, T, (heads + 2 kv_heads) head_dim]; `keys`, `values`: the window, [B, kv_heads,
/// slots, head_dim] contiguous float32 (the kernel checks before it writes them), moved on by T
/// positions. Returns [B, T, heads head_dim].
pub fn attention(
    qkv: &Tensor,
    keys: &mut Tensor,
    values: &mut Tensor,
    tables: &Tables<'_>,
    heads: i64,
    kv_heads: i64,
) -> TorchResult<Tensor> {
    // SAFETY: the tensors are live for the duration of the call.
    call("attention", |out, error, size| unsafe {
        ffi::qwencodec_attention(
            qkv.as_ptr(),
            keys.as_mut_ptr(),
            values.as_mut_ptr(),
            tables.query_cos.as_ptr(),
            tables.query_sin.as_ptr(),
            tables.key_cos.as_ptr(),
            tables.key_sin.as_ptr(),
            tables.mask.as_ptr(),
            heads,
            kv_heads,
            out,
            error,
            size,
        )
    })
}
