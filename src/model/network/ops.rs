//! The element-wise and product layers every part of the network is built from. Activations
//! carry a batch dimension first: one row per stream of a batched step.

use tch::{Device, Kind, Tensor};

use super::precision::MatrixRounding;
use super::state::ACTIVATION_KIND;
use crate::model::checkpoint::Weights;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;
use crate::model::kernels::skinny_gemm;

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
/// run several times slower for 2 to 32 columns on the released geometry's shapes.
///
/// On the CPU a single row goes in twice: MKL computes one column as a matrix-vector product
/// on one core, two as a matrix product on every core. Beyond [`skinny_gemm::MAX_ROWS`] rows,
/// where the arithmetic is the cost, rows that are a transposed view of columns (a
/// channels-first input's) go in as they are instead of copied: the product takes as long.
pub fn project(weight: &Tensor, rows: &Tensor, bias: Option<&Tensor>) -> TorchResult<Tensor> {
    let single = rows.size()[0] == 1 && rows.device() == Device::Cpu;
    let columns_as_given = rows.size()[0] > skinny_gemm::MAX_ROWS && rows.f_transpose(0, 1)?.is_contiguous();
    let rows = if single {
        rows.f_expand([2, -1], false)?.f_contiguous()?
    } else if columns_as_given {
        rows.shallow_clone()
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

/// A weight [out, in] and its bias, multiplied with rows of float32 activations.
pub enum Matrix {
    /// In the compute kind: activations are cast to it for the product ([`with_weights`]).
    Plain {
        weight: Tensor,
        /// [out, 1]
        bias: Option<Tensor>,
    },
    /// Rounded to 16 bits on the CPU (float16 for dtype f16, bfloat16 for bf16), [out, in]; the
    /// bias float32 [out, 1]. Activations and accumulation stay float32, so only the weights
    /// are rounded (16-bit activations would round every input of every product, which the
    /// vocoder magnifies).
    Rounded { weight: Tensor, bias: Option<Tensor> },
    /// Rounded to 16 bits on an AVX-512 CPU where each frame brings 8 or more rows: packed for
    /// the few-row kernel's outer products ([`skinny_gemm::pack`]), which take any number of
    /// rows; the bias float32 [out].
    Packed {
        packed: Tensor,
        bias: Option<Tensor>,
        out: i64,
    },
    /// Rounded to bfloat16 on a CPU with AMX-BF16 ([`MatrixRounding::AmxBf16`]): packed for AMX's
    /// tiles ([`skinny_gemm::pack_amx`]), whose products round the activations to bfloat16 too;
    /// the bias float32 [out].
    Amx {
        packed: Tensor,
        bias: Option<Tensor>,
        out: i64,
    },
}

impl Matrix {
    /// `weight` [out, in] and `bias` [out], in the compute kind, as `rounding` says (see
    /// `precision::matrix_rounding`): the weight rounded to a 16-bit kind, the bias float32, and
    /// packed where it sees `rows_per_frame` rows per frame ([`skinny_gemm::packs`]); or packed
    /// for AMX's tiles.
    pub fn new(
        weight: Tensor,
        bias: Option<Tensor>,
        rounding: MatrixRounding,
        rows_per_frame: usize,
    ) -> TorchResult<Self> {
        let flat_bias = || {
            bias.as_ref()
                .map(|bias| bias.f_to_kind(Kind::Float)?.f_contiguous())
                .transpose()
        };
        let kind = match rounding {
            MatrixRounding::Kept => {
                return Ok(Self::Plain {
                    weight,
                    bias: bias.map(|bias| bias.f_view([-1, 1])).transpose()?,
                });
            }
            MatrixRounding::AmxBf16 => {
                return Ok(Self::Amx {
                    packed: skinny_gemm::pack_amx(&weight)?,
                    bias: flat_bias()?,
                    out: weight.size()[0],
                });
            }
            MatrixRounding::Weight(kind) => kind,
        };
        if skinny_gemm::packs(weight.device(), rows_per_frame) {
            return Ok(Self::Packed {
                packed: skinny_gemm::pack(&weight, kind)?,
                bias: flat_bias()?,
                out: weight.size()[0],
            });
        }
        Ok(Self::Rounded {
            weight: weight.f_to_kind(kind)?.f_contiguous()?,
            bias: bias
                .map(|bias| bias.f_to_kind(Kind::Float)?.f_view([-1, 1]))
                .transpose()?,
        })
    }

    /// Whether the weight is rounded to 16 bits with float32 activations: there are no
    /// convolution kernels for it, so a convolution always multiplies it as a matrix.
    pub fn is_rounded(&self) -> bool {
        matches!(
            self,
            Self::Rounded { .. } | Self::Packed { .. } | Self::Amx { .. }
        )
    }

    /// Whether it is packed for AMX's tiles ([`MatrixRounding::AmxBf16`]).
    pub fn is_amx(&self) -> bool {
        matches!(self, Self::Amx { .. })
    }

    /// `rows` [R, in] float32 -> [R, out] float32 (a transposed view, but for packed weights).
    pub fn forward(&self, rows: &Tensor) -> TorchResult<Tensor> {
        match self {
            Self::Plain { weight, bias } | Self::Rounded { weight, bias }
                if skinny_gemm::applies(weight, rows.size()[0]) =>
            {
                skinny_gemm::product(weight, rows, bias.as_ref())?.f_transpose(0, 1)
            }
            Self::Plain { weight, bias } => {
                with_weights(rows, weight.kind(), |rows| project(weight, rows, bias.as_ref()))?
                    .f_transpose(0, 1)
            }
            // Many rows (a large step or batch): bound by arithmetic, where widening the weight
            // for MKL's float32 product costs a fraction of the product.
            Self::Rounded { weight, bias } => {
                project(&weight.f_to_kind(Kind::Float)?, rows, bias.as_ref())?.f_transpose(0, 1)
            }
            Self::Packed { packed, bias, out } => {
                skinny_gemm::packed_product(packed, rows, bias.as_ref(), *out)
            }
            Self::Amx { packed, bias, out } => skinny_gemm::amx_product(packed, rows, bias.as_ref(), *out),
        }
    }
}

/// A linear layer's weight and bias as read, before they become a [`Linear`].
pub struct LinearWeights {
    weight: Tensor,
    bias: Option<Tensor>,
    rounding: MatrixRounding,
    rows_per_frame: usize,
}

impl LinearWeights {
    pub fn load(
        weights: &Weights,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            weight: weights.get("weight", &[out_features, in_features])?,
            bias: bias.then(|| weights.get("bias", &[out_features])).transpose()?,
            rounding: super::precision::matrix_rounding(weights, in_features),
            rows_per_frame: weights.columns_per_frame(),
        })
    }

    /// One layer computing all of `parts` (same input), their outputs one after another.
    pub fn stacked(parts: &[LinearWeights]) -> TorchResult<Self> {
        let weights: Vec<&Tensor> = parts.iter().map(|part| &part.weight).collect();
        let biases: Option<Vec<&Tensor>> = parts.iter().map(|part| part.bias.as_ref()).collect();
        Ok(Self {
            weight: Tensor::f_cat(&weights, 0)?,
            bias: biases.map(|biases| Tensor::f_cat(&biases, 0)).transpose()?,
            // Parts share their input, so they are kept alike.
            rounding: parts[0].rounding,
            rows_per_frame: parts[0].rows_per_frame,
        })
    }
}

pub struct Linear {
    matrix: Matrix,
}

impl Linear {
    pub fn new(weights: LinearWeights) -> TorchResult<Self> {
        Ok(Self {
            matrix: Matrix::new(
                weights.weight,
                weights.bias,
                weights.rounding,
                weights.rows_per_frame,
            )?,
        })
    }

    pub fn load(
        weights: &Weights,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        Ok(Self::new(LinearWeights::load(
            weights,
            in_features,
            out_features,
            bias,
        )?)?)
    }

    /// The weight [out, in] and bias ([out, 1]) as stored, whatever multiplies them; none when
    /// packed. For a test's formula.
    #[cfg(test)]
    pub fn stored_weights(&self) -> Option<(&Tensor, Option<&Tensor>)> {
        match &self.matrix {
            Matrix::Plain { weight, bias } | Matrix::Rounded { weight, bias } => {
                Some((weight, bias.as_ref()))
            }
            Matrix::Packed { .. } | Matrix::Amx { .. } => None,
        }
    }

    /// `x`: [B, T, in] -> [B, T, out].
    pub fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let (batch, steps) = (x.size()[0], x.size()[1]);
        self.matrix
            .forward(&x.f_flatten(0, 1)?)?
            .f_contiguous()?
            .f_view([batch, steps, -1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::shim;
    use crate::model::kernels::skinny_gemm::MAX_ROWS;
    use crate::model::kernels::skinny_gemm::tests::float64_product;
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// Rows that are a transposed view of columns, few and many (where they go to MKL as they
    /// lie), and rows laid out as rows, against a float64 product.
    #[test]
    fn projects_rows_in_either_layout() {
        let mut random = Inputs::new(3);
        let options = (Kind::Float, Device::Cpu);
        let weight = random.normal([24, 40], options);
        let bias = random.normal([24, 1], options);
        for rows in [3, skinny_gemm::MAX_ROWS + 72] {
            let columns = random.normal([40, rows], options);
            for x in [columns.tr(), columns.tr().contiguous()] {
                let got = project(&weight, &x, Some(&bias)).unwrap();
                let expected = weight.to_kind(Kind::Double).mm(&columns.to_kind(Kind::Double))
                    + bias.to_kind(Kind::Double);
                assert_eq!(got.size(), [24, rows]);
                let (error, scale) = max_error_and_scale(&got, &expected);
                assert!(
                    error <= 1e-5 * scale,
                    "{rows} rows (contiguous {}): off by {error:e} of {scale:e}",
                    x.is_contiguous()
                );
            }
        }
    }

    /// A float32, float16 or bfloat16 matrix's product (this kernel where the process runs it,
    /// else libtorch's) in every tile shape the kernel has (1 to 6 activation rows, whole and
    /// partial tiles of 4 weight rows, a masked tail of the inputs), and beyond its rows; 16-bit
    /// weights packed too (whole and partial blocks of outputs, 1 to 12 rows and more), against a
    /// float64 product of the weight as stored.
    #[test]
    fn matches_a_float64_product() {
        let mut random = Inputs::new(7);
        for (out, inputs) in [(4, 16), (7, 37), (33, 100), (64, 2048)] {
            for rows in [1, 2, 3, 5, 6, 7, 11, 13, 40, MAX_ROWS + 1] {
                let weight = random.normal([out, inputs], (Kind::Float, Device::Cpu));
                let x = random.normal([rows, inputs], (Kind::Float, Device::Cpu));
                let bias = random.normal([out], (Kind::Float, Device::Cpu));
                for (bias, rounded, rows_per_frame) in [
                    (None, None, 1),
                    (Some(&bias), None, 1),
                    (None, Some(Kind::Half), 1),
                    (Some(&bias), Some(Kind::Half), 1),
                    (Some(&bias), Some(Kind::BFloat16), 1),
                    (None, Some(Kind::Half), 8),
                    (Some(&bias), Some(Kind::Half), 8),
                    (Some(&bias), Some(Kind::BFloat16), 8),
                ] {
                    let rounding = rounded.map_or(MatrixRounding::Kept, MatrixRounding::Weight);
                    let matrix = Matrix::new(
                        weight.shallow_clone(),
                        bias.map(Tensor::shallow_clone),
                        rounding,
                        rows_per_frame,
                    )
                    .unwrap();
                    assert_eq!(
                        matches!(matrix, Matrix::Packed { .. }),
                        rounded.is_some()
                            && rows_per_frame == 8
                            && shim::kernel(shim::Kernel::SkinnyGemm) == shim::CpuKernels::Avx512
                    );
                    let got = matrix.forward(&x).unwrap().transpose(0, 1);
                    assert_eq!(got.size(), [out, rows]);
                    let stored = weight.to_kind(rounded.unwrap_or(Kind::Float));
                    let (error, scale) = max_error_and_scale(&got, &float64_product(&stored, &x, bias));
                    assert!(
                        error <= 1e-5 * scale,
                        "{out}x{inputs} against {rows} rows (bias {}, rounded to {rounded:?}, {rows_per_frame} \
                         rows per frame): off by {error:e} of {scale:e}",
                        bias.is_some()
                    );
                }
            }
        }
    }

    /// A matrix packed for AMX's tiles gives its rows' products, [R, out], as the others do: the
    /// float64 product of the weight and the rows rounded to bfloat16, plus the bias.
    #[test]
    #[cfg_attr(
        not(host_amx_bf16),
        ignore = "this CPU has no AMX-BF16: the products cannot run"
    )]
    fn an_amx_matrix_matches_a_float64_product_of_bfloat16_values() {
        shim::tested_amx();
        let mut random = Inputs::new(8);
        let options = (Kind::Float, Device::Cpu);
        let (out, inputs) = (100, 64);
        let weight = random.normal([out, inputs], options);
        let bias = random.normal([out], options);
        let matrix = Matrix::new(
            weight.shallow_clone(),
            Some(bias.shallow_clone()),
            MatrixRounding::AmxBf16,
            1,
        )
        .unwrap();
        assert!(matches!(matrix, Matrix::Amx { .. }) && matrix.is_rounded());
        let seen = |values: &Tensor| values.to_kind(Kind::BFloat16);
        for rows in [1, 5, 33] {
            let x = random.normal([rows, inputs], options);
            let got = matrix.forward(&x).unwrap().transpose(0, 1);
            let (error, scale) =
                max_error_and_scale(&got, &float64_product(&seen(&weight), &seen(&x), Some(&bias)));
            assert!(
                error <= 1e-5 * scale,
                "{rows} rows: off by {error:e} of {scale:e}"
            );
        }
    }
}
