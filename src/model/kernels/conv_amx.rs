//! Dense causal convolutions of several taps in AMX tiles, directly (`conv_amx.cpp`): in dtype
//! bf16 on CPUs with AMX-BF16, the vocoder's residual units' dilated convolutions
//! ([`Kernel::ConvAmx`], chosen by `network::precision::amx_conv`). The weights and each column's
//! inputs are rounded to bfloat16, the sums are float32; no Winograd transform rounds or
//! magnifies anything, and each row's sums do not depend on the other streams of a batch.

use tch::{Kind, Tensor};

use super::shim::{AMX_BLOCK_OUTPUTS, call};
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_conv_amx(
            context: *mut C_tensor,
            x: *const C_tensor,
            weights: *const C_tensor,
            bias_tiles: *const C_tensor,
            out_features: i64,
            dilation: i64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// Inputs a tile row takes (32 bfloat16): the layer's inputs come in multiples of it.
pub const AMX_INPUTS: i64 = 32;

/// A convolution's weight packed for AMX's tiles, and its bias as tiles.
pub struct ConvAmx {
    /// bfloat16 [out_blocks / 2, taps, in / 32, 2, 16, 16, 2]: for each pair of blocks of 16
    /// outputs, tap and 32 inputs, each block's inputs in pairs by its outputs (the right side of
    /// a tile product), in the order the kernel reads them; zeros past the outputs.
    weights: Tensor,
    /// float32 [out_blocks, 16, 16]: each block's biases in every row, where the sums start.
    bias_tiles: Tensor,
    out: i64,
    dilation: i64,
}

impl ConvAmx {
    /// `weight` [out, in, taps] and `bias` [out], float32, `in` a multiple of [`AMX_INPUTS`] (an
    /// error otherwise); the caller has checked that the CPU and process have AMX-BF16.
    pub fn new(weight: &Tensor, bias: &Tensor, dilation: i64) -> TorchResult<Self> {
        let (out, in_channels, taps) = (weight.size()[0], weight.size()[1], weight.size()[2]);
        if in_channels % AMX_INPUTS != 0 {
            return Err(tch::TchError::Shape(format!(
                "AMX convolutions take inputs in multiples of {AMX_INPUTS}, not {in_channels}"
            )));
        }
        let pair = 2 * AMX_BLOCK_OUTPUTS;
        let blocks = (out + pair - 1) / pair * 2;
        let padding = blocks * AMX_BLOCK_OUTPUTS - out;
        // [out, in, taps] as [block pairs, 2 blocks, 16 outputs, in / 32, 16 pairs, 2, taps] ->
        // [block pairs, taps, in / 32, 2 blocks, 16 pairs, 16 outputs, 2].
        let weights = weight
            .f_constant_pad_nd([0, 0, 0, 0, 0, padding])?
            .f_view(
                &[
                    blocks / 2,
                    2,
                    AMX_BLOCK_OUTPUTS,
                    in_channels / AMX_INPUTS,
                    AMX_INPUTS / 2,
                    2,
                    taps,
                ][..],
            )?
            .f_permute(&[0, 6, 3, 1, 4, 2, 5][..])?
            .f_to_kind(Kind::BFloat16)?
            .f_contiguous()?;
        let bias_tiles = bias
            .f_to_kind(Kind::Float)?
            .f_constant_pad_nd([0, padding])?
            .f_view([blocks, 1, AMX_BLOCK_OUTPUTS])?
            .f_expand([blocks, AMX_BLOCK_OUTPUTS, AMX_BLOCK_OUTPUTS], false)?
            .f_contiguous()?;
        Ok(Self {
            weights,
            bias_tiles,
            out,
            dilation,
        })
    }

    /// `x`: [B, in, columns] float32 -> [B, out, columns]; `context`: [B, in, reach], contiguous
    /// float32, the kernel's reach into the past ((taps - 1) * dilation columns), moved on in
    /// place to the last `reach` columns of the input, as a stream's state keeps it.
    pub fn forward(&self, context: &mut Tensor, x: &Tensor) -> TorchResult<Tensor> {
        let x = x.f_contiguous()?;
        // SAFETY: the tensors are live for the duration of the call.
        call("AMX convolution", |out, error, size| unsafe {
            ffi::qwencodec_conv_amx(
                context.as_mut_ptr(),
                x.as_ptr(),
                self.weights.as_ptr(),
                self.bias_tiles.as_ptr(),
                self.out,
                self.dilation,
                out,
                error,
                size,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;
    use crate::model::kernels::shim::{self, CpuKernels};
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// Against the convolution in float64 of the weight and inputs rounded to bfloat16 (what the
    /// tiles multiply), within float32's rounding of the magnitudes summed: outputs that fill
    /// their pairs of blocks and that do not, inputs in one tile row and several, dilations,
    /// columns that leave partial tiles and units, fewer columns than the reach, streams of their
    /// own; over two calls, so that the second reads the context the first moved on.
    #[test]
    #[cfg_attr(
        not(host_amx_bf16),
        ignore = "this CPU has no AMX-BF16: the products cannot run"
    )]
    fn matches_a_float64_convolution_and_moves_the_context() {
        shim::tested_amx();
        shim::tested(CpuKernels::Avx512);
        let mut random = Inputs::new(31);
        let options = (Kind::Float, Device::Cpu);
        let bfloat16 = |t: &Tensor| t.to_kind(Kind::BFloat16).to_kind(Kind::Double);
        for (inputs, outputs, taps, dilation, batch, columns) in [
            (32, 32, 7, 1, 1, 32),
            (96, 96, 7, 3, 1, 160),
            (64, 48, 7, 9, 2, 33),
            (32, 16, 3, 2, 3, 1),
            (64, 80, 7, 1, 1, 5),
            (32, 32, 7, 9, 2, 70),
        ] {
            let weight = random.normal([outputs, inputs, taps], options);
            let bias = random.normal([outputs], options);
            let conv = ConvAmx::new(&weight, &bias, dilation).unwrap();
            let reach = (taps - 1) * dilation;
            let start = random.normal([batch, inputs, reach], options);
            let mut context = start.copy();
            let first = random.normal([batch, inputs, columns], options);
            let second = random.normal([batch, inputs, columns], options);
            let got = Tensor::cat(
                &[
                    conv.forward(&mut context, &first).unwrap(),
                    conv.forward(&mut context, &second).unwrap(),
                ],
                2,
            );
            let whole = Tensor::cat(&[&start, &first, &second], 2);
            let expected = bfloat16(&whole).conv1d(
                &bfloat16(&weight),
                Some(&bias.to_kind(Kind::Double)),
                [1],
                [0],
                [dilation],
                1,
            );
            let scale = bfloat16(&whole)
                .abs()
                .conv1d::<Tensor>(&bfloat16(&weight).abs(), None, [1], [0], [dilation], 1)
                .max()
                .double_value(&[]);
            let (error, _) = max_error_and_scale(&got, &expected);
            let shape = (inputs, outputs, taps, dilation, batch, columns);
            assert!(
                error <= scale * 1e-6,
                "{shape:?}: error {error:e} of a sum of magnitudes up to {scale:e}"
            );
            let moved = whole.narrow(2, 2 * columns, reach);
            assert!(
                context.equal(&moved),
                "{shape:?}: the context holds the input's last {reach} columns"
            );
        }
    }

    /// A convolution's error names what was wrong instead of reading past a tensor.
    #[test]
    #[cfg_attr(
        not(host_amx_bf16),
        ignore = "this CPU has no AMX-BF16: the products cannot run"
    )]
    fn a_mismatched_context_is_an_error() {
        shim::tested_amx();
        let options = (Kind::Float, Device::Cpu);
        let conv = ConvAmx::new(
            &Tensor::zeros([32, 32, 7], options),
            &Tensor::zeros([32], options),
            2,
        )
        .unwrap();
        let mut context = Tensor::zeros([1, 32, 11], options);
        let err = conv
            .forward(&mut context, &Tensor::zeros([1, 32, 4], options))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("AMX convolution") && err.contains("context"),
            "{err}"
        );
    }
}
