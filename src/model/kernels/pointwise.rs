//! 1x1 convolutions of float32 weights on channels-first activations by the C++ kernel of
//! `pointwise.cpp` (AVX-512): the vocoder's residual units' second convolutions and the
//! transposed convolutions' taps, beyond the few-row kernel's rows, on CPUs where MKL's float32
//! products run without AVX-512 ([`Kernel::Pointwise`]). There MKL's products and oneDNN's 1x1
//! convolution reach well under the FMA's rate at the vocoder's shapes, these tiles close to it
//! (`docs/performance.md`). In dtype bf16, the layers
//! bound by arithmetic in bfloat16 products ([`Kernel::PointwiseBf16`]): by `vdpbf16ps` there, in
//! AMX tiles where the CPU has AMX-BF16 (Intel's too, whose MKL does the float32 ones).

use tch::{Device, Kind, Tensor};

use super::shim::{self, Kernel, call};
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_pointwise(
            packed: *const C_tensor,
            x: *const C_tensor,
            bias: *const C_tensor,
            out_features: i64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// Outputs per packed block (`kBlockOutputs` in pointwise.cpp, which checks it).
const BLOCK_OUTPUTS: i64 = 8;

/// How the kernel multiplies: the weight's packing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Products {
    /// float32 products: [blocks, in, BLOCK_OUTPUTS], each input's weights for a block's
    /// outputs side by side, zeros past `out`.
    Float32,
    /// bfloat16 products by `vdpbf16ps`: [blocks, in / 2, BLOCK_OUTPUTS, 2], in pairs of inputs.
    Pairs,
    /// bfloat16 products in AMX tiles: [blocks, shim::AMX_BLOCK_OUTPUTS, in], the weight's rows,
    /// zeros past `out`; `in` a multiple of 32.
    Amx,
}

/// A weight [out, in] packed for the kernel, and its bias.
pub struct Pointwise {
    /// The weight as [`Products`] says.
    packed: Tensor,
    /// [out], contiguous.
    bias: Option<Tensor>,
    out: i64,
}

impl Pointwise {
    /// `weight` [out, in] and `bias` [out], where the kernel runs for them: float32 on the CPU,
    /// and a CPU and process that run it. With `bfloat16_products` (the layer takes them:
    /// `shim::bfloat16_products` with [`Kernel::PointwiseBf16`]) the weight is rounded to
    /// bfloat16 and the columns are, at each call: the products run at twice the FMA's rate
    /// (`vdpbf16ps` on AMD's CPUs), or in AMX tiles where the CPU has them.
    pub fn new(weight: &Tensor, bias: Option<&Tensor>, bfloat16_products: bool) -> TorchResult<Option<Self>> {
        if weight.device() != Device::Cpu || weight.kind() != Kind::Float {
            return Ok(None);
        }
        let products = match bfloat16_products {
            true if shim::has_amx_bf16() => Products::Amx,
            true => Products::Pairs,
            false if Kernel::Pointwise.runs_in(shim::kernel(Kernel::Pointwise)) => Products::Float32,
            _ => return Ok(None),
        };
        Self::pack(weight, bias, products).map(Some)
    }

    /// `weight` and `bias` packed for `products`, wherever the kernel runs.
    fn pack(weight: &Tensor, bias: Option<&Tensor>, products: Products) -> TorchResult<Self> {
        let (out, in_channels) = (weight.size()[0], weight.size()[1]);
        let block = if products == Products::Amx {
            shim::AMX_BLOCK_OUTPUTS
        } else {
            BLOCK_OUTPUTS
        };
        let blocks = (out + block - 1) / block;
        let padded = weight
            .f_constant_pad_nd([0, 0, 0, blocks * block - out])?
            .f_view([blocks, block, in_channels])?;
        let packed = match products {
            // [blocks, in / 2, 8, 2]: each output's weights of inputs 2i and 2i + 1 together.
            Products::Pairs => padded
                .f_view([blocks, BLOCK_OUTPUTS, in_channels / 2, 2])?
                .f_permute([0, 2, 1, 3])?
                .f_to_kind(Kind::BFloat16)?
                .f_contiguous()?,
            Products::Amx => padded.f_to_kind(Kind::BFloat16)?.f_contiguous()?,
            Products::Float32 => padded.f_transpose(1, 2)?.f_contiguous()?,
        };
        let bias = bias
            .map(|bias| bias.f_flatten(0, -1)?.f_contiguous())
            .transpose()?;
        Ok(Self { packed, bias, out })
    }

    /// `x` [B, in, T] float32 -> [B, out, T].
    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let bias = self.bias.as_ref().map_or(std::ptr::null(), |bias| bias.as_ptr());
        // SAFETY: the tensors are live for the duration of the call; the bias may be null.
        call("1x1 convolution", |out, error, size| unsafe {
            ffi::qwencodec_pointwise(self.packed.as_ptr(), x.as_ptr(), bias, self.out, out, error, size)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::shim::CpuKernels;
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// Float32 weights on the CPU come here where the process runs the kernel; 16-bit ones never.
    #[test]
    fn packs_float32_weights_where_the_kernel_runs() {
        let options = (Kind::Float, Device::Cpu);
        let weight = Tensor::zeros([12, 5], options);
        let runs = Kernel::Pointwise.runs_in(shim::kernel(Kernel::Pointwise));
        assert_eq!(Pointwise::new(&weight, None, false).unwrap().is_some(), runs);
        assert!(
            Pointwise::new(&weight.to_kind(Kind::Half), None, false)
                .unwrap()
                .is_none()
        );
    }

    /// Output counts that fill their blocks and that do not, column counts that leave partial
    /// vectors and tiles, streams, with and without a bias, against libtorch's product in
    /// float64, within float32's rounding of the magnitudes summed. In bfloat16 products too
    /// where the CPU has them (even input counts): against the product of the weight and the
    /// columns rounded to bfloat16, the sums float32 all the same. Built directly, so it runs
    /// wherever the CPU has AVX-512, whatever MKL runs.
    #[test]
    #[cfg_attr(not(host_avx512), ignore = "this CPU has no AVX-512: the kernel cannot run")]
    fn matches_a_float64_product() {
        shim::tested(CpuKernels::Avx512);
        let mut random = Inputs::new(23);
        for (inputs, outputs) in [(96, 96), (7, 13), (40, 8), (3, 1), (2, 9)] {
            let mut formats = vec![Products::Float32];
            if shim::has_bf16_products() && inputs % 2 == 0 {
                formats.push(Products::Pairs);
            }
            check_products(&mut random, inputs, outputs, &formats);
        }
    }

    /// The same in AMX tiles: inputs in 32s (one product's and more), outputs in whole and
    /// partial blocks of 16.
    #[test]
    #[cfg_attr(
        not(host_amx_bf16),
        ignore = "this CPU has no AMX-BF16: the products cannot run"
    )]
    fn matches_a_float64_product_in_amx_tiles() {
        shim::tested_amx();
        shim::tested(CpuKernels::Avx512);
        let mut random = Inputs::new(24);
        for (inputs, outputs) in [(96, 96), (64, 40), (32, 7)] {
            check_products(&mut random, inputs, outputs, &[Products::Amx]);
        }
    }

    fn check_products(random: &mut Inputs, inputs: i64, outputs: i64, formats: &[Products]) {
        let options = (Kind::Float, Device::Cpu);
        let weight = random.normal([outputs, inputs], options);
        let bias = random.normal([outputs], options);
        for &products in formats {
            let packed = Pointwise::pack(&weight, Some(&bias), products).unwrap();
            let no_bias = Pointwise::pack(&weight, None, products).unwrap();
            // The values the products see, in float64.
            let seen = |values: &Tensor| match products {
                Products::Pairs | Products::Amx => values.to_kind(Kind::BFloat16).to_kind(Kind::Double),
                Products::Float32 => values.to_kind(Kind::Double),
            };
            for (batch, columns) in [
                (1, 1),
                (1, 16),
                (1, 17),
                (2, 32),
                (1, 47),
                (3, 48),
                (2, 160),
                (1, 203),
            ] {
                let x = random.normal([batch, inputs, columns], options);
                let product = seen(&weight).matmul(&seen(&x));
                let scale = seen(&weight)
                    .abs()
                    .matmul(&seen(&x).abs())
                    .max()
                    .double_value(&[])
                    + bias.abs().max().double_value(&[]);
                for (pointwise, expected) in [
                    (&packed, &product + bias.to_kind(Kind::Double).view([1, -1, 1])),
                    (&no_bias, product.shallow_clone()),
                ] {
                    let got = pointwise.forward(&x).unwrap();
                    assert_eq!(got.size(), expected.size());
                    let (error, _) = max_error_and_scale(&got, &expected);
                    assert!(
                        error <= 1e-6 * scale,
                        "{inputs} -> {outputs}, {batch} x {columns} columns, bias {}, {products:?}: \
                         off by {error:e} of {scale:e}",
                        pointwise.bias.is_some()
                    );
                }
            }
        }
    }

    /// Shapes that do not fit are an error naming what is wrong, not a crash.
    #[test]
    fn says_what_does_not_fit() {
        let options = (Kind::Float, Device::Cpu);
        let pointwise = Pointwise {
            packed: Tensor::zeros([2, 5, BLOCK_OUTPUTS], options),
            bias: None,
            out: 12,
        };
        let error = pointwise
            .forward(&Tensor::zeros([1, 4, 3], options))
            .unwrap_err()
            .to_string();
        assert!(error.contains("float32 [B, 5, T]"), "{error}");
        let wrong = Pointwise {
            packed: Tensor::zeros([3, 5, BLOCK_OUTPUTS], options),
            bias: None,
            out: 12,
        };
        let error = wrong
            .forward(&Tensor::zeros([1, 5, 3], options))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("float32 [blocks, in, 8] or bfloat16 [blocks, in / 2, 8, 2] or [blocks, 16, in]"),
            "{error}"
        );
    }
}
