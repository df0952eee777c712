//! The element-wise and product layers every part of the network is built from. Activations
//! carry a batch dimension first: one row per stream of a batched step.

use tch::{Device, Kind, Tensor};

use super::{ACTIVATION_KIND, TorchResult};
use crate::model::ModelError;
use crate::model::checkpoint::Weights;

/// `op` (a product with weights stored in `weight_kind`) on float32 activations.
pub fn with_weights(
    x: &Tensor,
    weight_kind: Kind,
    op: impl FnOnce(&Tensor) -> TorchResult<Tensor>,
) -> TorchResult<Tensor> {
    if weight_kind == ACTIVATION_KIND {
        return op(x);
    }
    op(&x.f_to_kind(weight_kind)?)?.f_to_kind(ACTIVATION_KIND)
}

/// `weight` [out, in] times each row of `rows` [R, in], plus `bias` [out, 1]: [out, R].
///
/// The product a step needs is a weight against a few columns, where the weight's bytes are the
/// cost. MKL streams a weight at near memory speed only in this arrangement: the weight as it is
/// stored ([out, in], row-major) on the left and the activations row-major on the right, read
/// transposed. The other arrangements (activations on the left, or a column-major right side)
/// ran several times slower for 2 to 32 columns on the released geometry's shapes.
///
/// On the CPU a single row goes in twice: MKL computes one column as a matrix-vector product
/// on one core, two as a matrix product on every core.
pub fn project(weight: &Tensor, rows: &Tensor, bias: Option<&Tensor>) -> TorchResult<Tensor> {
    let single = rows.size()[0] == 1 && rows.device() == Device::Cpu;
    let rows = if single {
        rows.f_expand([2, -1], false)?.f_contiguous()?
    } else {
        rows.f_contiguous()?
    };
    let columns = rows.f_transpose(0, 1)?;
    let product = match bias {
        Some(bias) => bias.f_addmm(weight, &columns)?,
        None => weight.f_mm(&columns)?,
    };
    if single {
        product.f_narrow(1, 0, 1)?.f_contiguous()
    } else {
        Ok(product)
    }
}

pub struct Linear {
    weight: Tensor,
    /// [out, 1]
    bias: Option<Tensor>,
}

impl Linear {
    pub fn load(
        weights: &Weights,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            weight: weights.get("weight", &[out_features, in_features])?,
            bias: if bias {
                Some(weights.get("bias", &[out_features])?.f_view([-1, 1])?)
            } else {
                None
            },
        })
    }

    /// One layer computing all of `parts` (same input), their outputs one after another.
    pub fn stacked(parts: &[Linear]) -> TorchResult<Self> {
        let weights: Vec<&Tensor> = parts.iter().map(|part| &part.weight).collect();
        let biases: Option<Vec<&Tensor>> = parts.iter().map(|part| part.bias.as_ref()).collect();
        Ok(Self {
            weight: Tensor::f_cat(&weights, 0)?,
            bias: biases.map(|biases| Tensor::f_cat(&biases, 0)).transpose()?,
        })
    }

    /// `x`: [B, T, in] -> [B, T, out].
    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let (batch, steps) = (x.size()[0], x.size()[1]);
        with_weights(x, self.weight.kind(), |x| {
            project(&self.weight, &x.f_flatten(0, 1)?, self.bias.as_ref())?
                .f_transpose(0, 1)?
                .f_contiguous()?
                .f_view([batch, steps, -1])
        })
    }
}

/// RMSNorm, on float32 activations like everything element-wise here.
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn load(weights: &Weights, size: usize, eps: f64) -> Result<Self, ModelError> {
        Ok(Self {
            weight: weights.get_as("weight", &[size], Kind::Float)?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let variance = x.f_square()?.f_mean_dim(-1, true, ACTIVATION_KIND)?;
        self.weight
            .f_mul(&x.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?)
    }
}

/// `x + 1 / (exp(beta) + 1e-9) * sin(exp(alpha) * x)^2`, with both factors precomputed.
pub struct SnakeBeta {
    frequency: Tensor,
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

    /// `x`: [B, channels, T].
    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let wave = x.f_mul(&self.frequency)?.f_sin()?.f_square()?;
        x.f_add(&wave.f_mul(&self.inverse_magnitude)?)
    }
}
