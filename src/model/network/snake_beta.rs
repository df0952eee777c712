//! SnakeBeta, `x + 1 / (exp(beta) + 1e-9) * sin(exp(alpha) * x)^2` per channel: the vocoder's
//! activation. On a CPU with AVX2 or AVX-512, one pass of the C++ kernel in `snake_beta.cpp`;
//! elsewhere (CUDA, where graphs capture it, or other CPUs) libtorch's element-wise ops.

use tch::{Device, Kind, Tensor};

use super::state::ACTIVATION_KIND;
use crate::model::checkpoint::Weights;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;
use crate::model::kernels;
use crate::model::kernels::shim::{self, CpuKernels, Kernel};

/// SnakeBeta with both factors precomputed.
pub struct SnakeBeta {
    /// exp(alpha), [1, channels, 1] float32.
    frequency: Tensor,
    /// 1 / (exp(beta) + 1e-9), [1, channels, 1] float32.
    inverse_magnitude: Tensor,
}

impl SnakeBeta {
    pub fn load(weights: &Weights, channels: usize) -> Result<Self, ModelError> {
        let alpha = weights.get_as("alpha", &[channels], Kind::Double)?;
        let beta = weights.get_as("beta", &[channels], Kind::Double)?;
        Ok(Self {
            frequency: alpha.f_exp()?.f_view([1, -1, 1])?.f_to_kind(ACTIVATION_KIND)?,
            inverse_magnitude: beta
                .f_exp()?
                .f_add_scalar(1e-9)?
                .f_reciprocal()?
                .f_view([1, -1, 1])?
                .f_to_kind(ACTIVATION_KIND)?,
        })
    }

    /// `x`: [B, channels, T] float32.
    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let kernels = shim::kernel(Kernel::SnakeBeta);
        if x.device() == Device::Cpu && kernels >= CpuKernels::Avx2 {
            return self.kernel(kernels, x);
        }
        // Two new tensors and four passes.
        let mut wave = x.f_mul(&self.frequency)?;
        _ = wave.f_sin_()?;
        _ = wave.f_square_()?;
        x.f_addcmul(&wave, &self.inverse_magnitude)
    }

    /// [`Self::forward`] on the CPU by the kernel in the instruction set of `kernels` (AVX2 or
    /// AVX-512), which the CPU must have.
    fn kernel(&self, kernels: CpuKernels, x: &Tensor) -> TorchResult<Tensor> {
        kernels::snake_beta::snake_beta(x, &self.frequency, &self.inverse_magnitude, kernels)
    }

    /// `x` through this process's path ([`Self::forward`]) or, given `kernels`, the kernel in
    /// that instruction set.
    #[cfg(test)]
    fn through(&self, kernels: Option<CpuKernels>, x: &Tensor) -> Tensor {
        match kernels {
            Some(kernels) => self.kernel(kernels, x),
            None => self.forward(x),
        }
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::{Inputs, max_error_and_scale};

    #[test]
    fn this_process_path_matches_the_formula() {
        matches_the_formula_in_float64(None);
        squares_the_sine_of_any_argument(None);
    }

    #[test]
    #[cfg_attr(
        not(host_avx2),
        ignore = "this CPU has no AVX2 with FMA and F16C: the kernel cannot run"
    )]
    fn avx2_kernel_matches_the_formula() {
        let kernels = Some(shim::tested(CpuKernels::Avx2));
        matches_the_formula_in_float64(kernels);
        squares_the_sine_of_any_argument(kernels);
    }

    #[test]
    #[cfg_attr(not(host_avx512), ignore = "this CPU has no AVX-512: the kernel cannot run")]
    fn avx512_kernel_matches_the_formula() {
        let kernels = Some(shim::tested(CpuKernels::Avx512));
        matches_the_formula_in_float64(kernels);
        squares_the_sine_of_any_argument(kernels);
    }

    /// SnakeBeta on the CPU (this process's path or a kernel) against the formula in float64,
    /// on rows whose length leaves a partial vector and arguments large enough for the sine's
    /// range reduction to count.
    fn matches_the_formula_in_float64(kernels: Option<CpuKernels>) {
        let mut random = Inputs::new(3);
        let channels = 5;
        let snake = SnakeBeta {
            frequency: (random.normal([1, channels, 1], (Kind::Float, Device::Cpu)) * 2.0).exp(),
            inverse_magnitude: random.uniform([1, channels, 1], (Kind::Float, Device::Cpu)) + 0.1,
        };
        for length in [1, 15, 16, 17, 1000] {
            let x = random.normal([2, channels, length], (Kind::Float, Device::Cpu)) * 20.0;
            let x64 = x.to_kind(Kind::Double);
            let expected = &x64
                + (x64.shallow_clone() * snake.frequency.to_kind(Kind::Double))
                    .sin()
                    .square()
                    * snake.inverse_magnitude.to_kind(Kind::Double);
            let (error, scale) = max_error_and_scale(&snake.through(kernels, &x), &expected);
            assert!(
                error <= 1e-6 * scale,
                "{kernels:?}, length {length}: off by {error:e} of {scale:e}"
            );
        }
    }

    /// The sine's square over the arguments the kernels reduce themselves (up to 65536) and
    /// beyond, where they take SLEEF's (the path as above): against float64 of the same
    /// float32 argument (frequency times x), with samples next to multiples of pi, where the
    /// reduction cancels most.
    fn squares_the_sine_of_any_argument(kernels: Option<CpuKernels>) {
        let frequency = 1e4f32;
        let snake = SnakeBeta {
            frequency: Tensor::from_slice(&[frequency]).view([1, 1, 1]),
            inverse_magnitude: Tensor::from_slice(&[1.0f32]).view([1, 1, 1]),
        };
        let mut x: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) * 1e-3).collect();
        x.extend((1..2_000).map(|k| (k as f64 * 37.0 * std::f64::consts::PI / f64::from(frequency)) as f32));
        let x = Tensor::from_slice(&x).view([1, 1, -1]);
        let argument = (&x * f64::from(frequency)).to_kind(Kind::Double);
        let expected = x.to_kind(Kind::Double) + argument.sin().square();
        let error = (snake.through(kernels, &x).to_kind(Kind::Double) - &expected)
            .abs()
            .max()
            .double_value(&[]);
        assert!(error <= 2e-6, "{kernels:?}: off by {error:e}");
    }
}
