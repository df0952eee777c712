//! RMSNorm, `weight * (x * rsqrt(mean(x^2) + eps))` over the last dimension: the transformer's
//! normalization, 17 times a step. On the CPU one op of ours (`rms_norm.cpp`) where libtorch's
//! ops take six; on CUDA, where graphs capture the ops, libtorch's.

use tch::{Device, Tensor};

use super::state::ACTIVATION_KIND;
use crate::model::checkpoint::Weights;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;
use crate::model::kernels;
use crate::model::kernels::shim::{self, CpuKernels, Kernel};

/// RMSNorm on float32 activations, like everything element-wise here.
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn load(weights: &Weights, size: usize, eps: f64) -> Result<Self, ModelError> {
        Ok(Self {
            weight: weights.get_as("weight", &[size], ACTIVATION_KIND)?,
            eps,
        })
    }

    /// The CPU's one-op RMSNorm.
    fn by_kernel(&self, x: &Tensor) -> TorchResult<Tensor> {
        kernels::rms_norm::rms_norm(x, &self.weight, self.eps)
    }

    /// The per-unit weight (float32) and epsilon, for a test's formula.
    #[cfg(test)]
    pub fn parts(&self) -> (&Tensor, f64) {
        (&self.weight, self.eps)
    }

    /// `x`: [..., size] float32.
    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        // Our kernel on the CPU unless our kernels are off (then CUDA's path, run here).
        if x.device() == Device::Cpu && shim::kernel(Kernel::RmsNorm) != CpuKernels::Off {
            return self.by_kernel(x);
        }
        let variance = x.f_square()?.f_mean_dim(-1, true, ACTIVATION_KIND)?;
        self.weight
            .f_mul(&x.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?)
    }
}

#[cfg(test)]
mod tests {
    use tch::Kind;

    use super::*;
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// The CPU's one-op RMSNorm against the formula in float64, on single rows and batches,
    /// contiguous or not, with values far from 1 so that the scale matters.
    #[test]
    fn matches_the_formula_in_float64() {
        let mut random = Inputs::new(5);
        let options = (Kind::Float, Device::Cpu);
        for width in [1, 7, 512] {
            let norm = RmsNorm {
                weight: random.normal([width], options),
                eps: 1e-6,
            };
            for x in [
                random.normal([1, 1, width], options) * 30.0,
                random.normal([3, 5, width], options) * 1e-2,
                random.normal([width, 4], options).transpose(0, 1).unsqueeze(0),
            ] {
                let got = norm.forward(&x).unwrap();
                let x64 = x.to_kind(Kind::Double);
                let variance = x64.square().mean_dim(-1, true, Kind::Double);
                let expected = norm.weight.to_kind(Kind::Double) * (&x64 * (variance + norm.eps).rsqrt());
                assert_eq!(got.size(), x.size());
                let (error, scale) = max_error_and_scale(&got, &expected);
                assert!(
                    error <= 1e-6 * scale,
                    "width {width}, shape {:?}: off by {error:e} of {scale:e}",
                    x.size()
                );
            }
        }
    }

    #[test]
    fn a_weight_of_another_width_is_an_error_not_a_crash() {
        let norm = RmsNorm {
            weight: Tensor::ones([4], (Kind::Float, Device::Cpu)),
            eps: 1e-6,
        };
        let x = Tensor::ones([1, 1, 5], (Kind::Float, Device::Cpu));
        let error = norm.by_kernel(&x).unwrap_err().to_string();
        assert!(error.contains("RMSNorm"), "{error}");
        // Whichever path runs (with our kernels off, libtorch's ops) refuses it.
        assert!(norm.forward(&x).is_err());
    }
}
