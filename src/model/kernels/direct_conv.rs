//! Convolutions with few multiply-adds per output column (depthwise, or to fewer than
//! [`MAX_DENSE_OUTPUTS`] channels) summed directly by the C++ kernel of `direct_conv.cpp`
//! (AVX-512 or AVX2): the upsampler's depthwise convolutions and the vocoder's last one, for
//! which libtorch's conv1d (oneDNN) takes far longer than their arithmetic, in AVX-512 and AVX2
//! alike (the figures: README.md here).

use tch::{Device, Kind, Tensor};

use super::shim::{self, CpuKernels, Kernel, call};
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_direct_conv(
            input: *const C_tensor,
            weight: *const C_tensor,
            bias: *const C_tensor,
            dilation: i64,
            groups: i64,
            kernels: i32,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// Most output channels of a dense convolution summed here: one vector's worth; more are a
/// matrix product's work.
const MAX_DENSE_OUTPUTS: i64 = 16;

/// Whether a convolution with this weight [out, in / groups, taps] on `device` runs here.
pub fn applies(weight: &Tensor, groups: i64, device: Device) -> bool {
    let (out, group_inputs) = (weight.size()[0], weight.size()[1]);
    let depthwise = group_inputs == 1 && out % groups == 0;
    device == Device::Cpu
        && weight.kind() == Kind::Float
        && (depthwise || (groups == 1 && out < MAX_DENSE_OUTPUTS))
        && Kernel::DirectConv.runs_in(shim::kernel(Kernel::DirectConv))
}

/// `input` [B, in, reach + T] (the context, then the new columns) -> [B, out, T], by the kernel
/// in the instruction set of `kernels` (AVX2 or AVX-512), which the CPU must have.
pub fn forward(
    input: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    dilation: i64,
    groups: i64,
    kernels: CpuKernels,
) -> TorchResult<Tensor> {
    let input = input.f_contiguous()?;
    // SAFETY: the tensors are live for the duration of the call.
    call("direct convolution", |out, error, size| unsafe {
        ffi::qwencodec_direct_conv(
            input.as_ptr(),
            weight.as_ptr(),
            bias.as_ptr(),
            dilation,
            groups,
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
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// (in, out, groups, taps): depthwise convolutions and dense ones of few outputs.
    const SHAPES: [(i64, i64, i64, i64); 4] = [(24, 24, 24, 7), (8, 16, 8, 3), (96, 1, 1, 7), (5, 3, 1, 2)];

    /// Such convolutions come here on CPUs with AVX2 or AVX-512 unless the process holds the
    /// kernels back; others (many outputs, grouped but not depthwise, float16) never.
    #[test]
    fn applies_to_depthwise_and_few_outputs() {
        let options = (Kind::Float, Device::Cpu);
        for (inputs, outputs, groups, taps) in SHAPES {
            let weight = Tensor::zeros([outputs, inputs / groups, taps], options);
            assert_eq!(
                applies(&weight, groups, Device::Cpu),
                shim::kernel(Kernel::DirectConv) >= CpuKernels::Avx2
            );
            assert!(!applies(&weight, groups, Device::Cuda(0)));
            assert!(!applies(&weight.to_kind(Kind::Half), groups, Device::Cpu));
        }
        assert!(!applies(&Tensor::zeros([16, 8, 3], options), 1, Device::Cpu));
        assert!(!applies(&Tensor::zeros([16, 4, 3], options), 2, Device::Cpu));
    }

    #[test]
    #[cfg_attr(
        not(host_avx2),
        ignore = "this CPU has no AVX2 with FMA and F16C: the kernel cannot run"
    )]
    fn avx2_kernel_matches_a_float64_convolution() {
        matches_a_float64_convolution(shim::tested(CpuKernels::Avx2));
    }

    #[test]
    #[cfg_attr(not(host_avx512), ignore = "this CPU has no AVX-512: the kernel cannot run")]
    fn avx512_kernel_matches_a_float64_convolution() {
        matches_a_float64_convolution(shim::tested(CpuKernels::Avx512));
    }

    /// Depthwise and few-output convolutions, with dilations, batches and column counts that
    /// leave partial vectors (and, in AVX2, units of whole vectors), against libtorch's
    /// convolution in float64, within float32's rounding of the magnitudes summed. The kernel in
    /// `kernels` runs whatever the process runs.
    fn matches_a_float64_convolution(kernels: CpuKernels) {
        let mut random = Inputs::new(11);
        let options = (Kind::Float, Device::Cpu);
        for (inputs, outputs, groups, taps) in SHAPES {
            let weight = random.normal([outputs, inputs / groups, taps], options);
            let bias = random.normal([outputs], options);
            for dilation in [1, 3] {
                for (batch, columns) in [(1, 1), (1, 17), (2, 64), (3, 200)] {
                    let input = random.normal([batch, inputs, (taps - 1) * dilation + columns], options);
                    let got = forward(&input, &weight, &bias, dilation, groups, kernels).unwrap();
                    let expected = input.to_kind(Kind::Double).conv1d(
                        &weight.to_kind(Kind::Double),
                        Some(&bias.to_kind(Kind::Double)),
                        [1],
                        [0],
                        [dilation],
                        groups,
                    );
                    assert_eq!(got.size(), expected.size());
                    let (error, _) = max_error_and_scale(&got, &expected);
                    // Float32 sums' rounding grows with the magnitudes summed, which cancel in
                    // the output: the bound is on their sum (one wrong term errs by about
                    // 1/taps of it).
                    let scale = input
                        .abs()
                        .to_kind(Kind::Double)
                        .conv1d(
                            &weight.abs().to_kind(Kind::Double),
                            None::<Tensor>,
                            [1],
                            [0],
                            [dilation],
                            groups,
                        )
                        .max()
                        .double_value(&[])
                        + bias.abs().max().double_value(&[]);
                    assert!(
                        error <= 1e-6 * scale,
                        "{kernels:?}: {inputs} -> {outputs} channels in {groups} groups, {taps} taps, \
                         dilation {dilation}, {batch} x {columns} columns: off by {error:e} of {scale:e}"
                    );
                }
            }
        }
    }

    /// Shapes that do not fit are an error naming what is wrong, not a crash.
    #[test]
    fn says_what_does_not_fit() {
        let options = (Kind::Float, Device::Cpu);
        let weight = Tensor::zeros([4, 1, 7], options);
        let bias = Tensor::zeros([4], options);
        let short = Tensor::zeros([1, 4, 6], options);
        let error = forward(&short, &weight, &bias, 1, 4, CpuKernels::Avx2)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("6 columns of context and at least one more"),
            "{error}"
        );
        let error = forward(
            &Tensor::zeros([1, 4, 20], options),
            &weight,
            &bias,
            1,
            2,
            CpuKernels::Avx2,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("dense or depthwise"), "{error}");
    }
}
