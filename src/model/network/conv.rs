//! Causal convolutions in streaming form: each keeps the columns of the past it needs (its left
//! context, or a transposed convolution's overlap) as a row of the stream state.

use tch::{Device, Kind, Tensor};

use super::ops::{Matrix, with_weights};
use super::precision::{self, Tiles};
use super::state::{ACTIVATION_KIND, State, StateLayout};
use crate::model::checkpoint::Weights;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;
use crate::model::kernels::conv_amx::ConvAmx;
use crate::model::kernels::direct_conv;
use crate::model::kernels::overlap_add;
use crate::model::kernels::pointwise::Pointwise;
use crate::model::kernels::shim::{self, CpuKernels, Kernel};
use crate::model::kernels::skinny_gemm;
use crate::model::kernels::winograd::{TransformedWeights, Winograd};

/// The shape of a convolution, as upstream's `Conv1d` takes it.
#[derive(Clone, Copy)]
pub struct ConvShape {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub dilation: usize,
    pub groups: usize,
    /// The Winograd tiles it takes, where it takes them.
    pub tiles: Tiles,
}

impl ConvShape {
    /// A dense convolution without dilation, with the most precise tiles.
    pub fn dense(in_channels: usize, out_channels: usize, kernel: usize) -> Self {
        Self {
            in_channels,
            out_channels,
            kernel,
            dilation: 1,
            groups: 1,
            tiles: Tiles::Precise,
        }
    }
}

/// Most rows (output columns times streams) for which a convolution that also has Winograd
/// tiles multiplies its matrix instead: while the weight's bytes bound the product. The tiles
/// read a little more of them (8 or 10 matrices of the kernel's size per 7 taps, in float32), but
/// from a few dozen rows on the products are bound by arithmetic, where the tiles do fewer.
const MATRIX_MAX_ROWS: i64 = 16;

/// Most multiply-adds (output channels times input channels times rows) for which a float32
/// 1x1 convolution on the CPU is one MKL product per stream instead of a convolution: in a
/// one-frame step oneDNN's kernels take longer than the products, at four frames less.
const POINTWISE_MAX_MULTIPLY_ADDS: i64 = 32 << 20;

/// How a CPU float32 1x1 convolution runs beyond the matrix's rows.
enum OneByOne {
    /// Its weight packed for our kernel, where it runs ([`Pointwise`]): every step.
    Kernel(Pointwise),
    /// Elsewhere its weight as [out, in] and its bias as [out, 1] (views of the kernel weights):
    /// one MKL product per stream, for small steps (see [`POINTWISE_MAX_MULTIPLY_ADDS`]).
    Products(Tensor, Tensor),
}

/// Whether the layer at `weights`, its matrix `rounded` to 16 bits or not, with `in_channels`
/// inputs, takes bfloat16 products by `kernel` ([`shim::bfloat16_products`]).
fn bfloat16_products(weights: &Weights, rounded: bool, in_channels: usize, kernel: Kernel) -> bool {
    shim::bfloat16_products(
        weights.weight_rounding(),
        rounded,
        weights.stored_kind("weight"),
        in_channels,
        kernel,
    )
}

/// A 1-D convolution padded causally: `(kernel - 1) * dilation` columns of the past on the left.
pub struct CausalConv {
    /// The convolution in AMX tiles at every step (dtype bf16 on a CPU with AMX-BF16:
    /// `precision::amx_conv`), which then keeps no other form.
    amx: Option<ConvAmx>,
    /// [out, in / groups, kernel] and [out], for the convolution kernels; none where the matrix
    /// is rounded to 16 bits, which is then always multiplied as a matrix.
    kernel_weights: Option<(Tensor, Tensor)>,
    /// A dense convolution's weight as one [out, in * kernel] matrix (for plain weights a view)
    /// and its bias, for short inputs (see `forward`); none for a 1x1 convolution whose kernel
    /// takes every step (bfloat16 products in AMX tiles: `precision::amx_products`).
    matrix: Option<Matrix>,
    /// The same convolution by Winograd tiles, for CPU float32 weights where it pays (see
    /// `forward`); beside a 16-bit matrix, for the steps too large for it, with its transformed
    /// weights in 16 bits too (see `Winograd::new`).
    winograd: Option<Winograd>,
    /// A CPU float32 1x1 convolution's own way, beyond the matrix's rows (or at every step).
    one_by_one: Option<OneByOne>,
    /// Whether the kernel weights are summed directly (`direct_conv`): depthwise, or few outputs.
    direct: bool,
    in_channels: i64,
    kernel: i64,
    dilation: i64,
    groups: i64,
    context: i64,
    slot: Option<usize>,
}

impl CausalConv {
    /// Upstream's `CausalConvNet` at `weights` (its tensors under `conv.`).
    pub fn load(weights: &Weights, layout: &mut StateLayout, shape: ConvShape) -> Result<Self, ModelError> {
        let ConvShape {
            in_channels,
            out_channels,
            kernel,
            dilation,
            groups,
            tiles,
        } = shape;
        let weights = weights.at("conv");
        let context = (kernel - 1) * dilation;
        let weight = weights.get("weight", &[out_channels, in_channels / groups, kernel])?;
        let bias = weights.get("bias", &[out_channels])?;
        // In AMX tiles at every step, where it takes them, then in no other form.
        let amx = (groups == 1
            && kernel > 1
            && weight.kind() == Kind::Float
            && weights.device() == Device::Cpu
            && precision::amx_conv(&weights, in_channels, out_channels))
        .then(|| ConvAmx::new(&weight, &bias, dilation as i64))
        .transpose()?;
        let other_forms = amx.is_none();
        let amx_products = kernel == 1 && groups == 1 && precision::amx_products(&weights, in_channels);
        // Grouped convolutions have no matrix form; a 1x1 convolution in AMX tiles at every step
        // needs none.
        let matrix = if other_forms && groups == 1 && !amx_products {
            Some(Matrix::new(
                weight.f_view([out_channels as i64, -1])?,
                Some(bias.shallow_clone()),
                match kernel {
                    1 => precision::one_by_one_rounding(&weights, in_channels),
                    _ => precision::matrix_rounding(&weights, in_channels * kernel),
                },
                weights.columns_per_frame(),
            )?)
        } else {
            None
        };
        let rounded = matrix.as_ref().is_some_and(Matrix::is_rounded);
        let tile = precision::winograd_outputs(&weights, tiles);
        let winograd = (other_forms
            && groups == 1
            && weight.kind() == Kind::Float
            && Winograd::applies(weights.device(), in_channels.min(out_channels), tile, kernel))
        .then(|| {
            let stored = weights.stored_kind("weight");
            let format =
                TransformedWeights::for_layer(weights.weight_rounding(), rounded, stored, in_channels);
            Winograd::new(&weight, &bias, dilation, tile, format)
        })
        .transpose()?;
        let one_by_one = (kernel == 1
            && groups == 1
            && !rounded
            && weight.kind() == Kind::Float
            && weights.device() == Device::Cpu)
            .then(|| -> TorchResult<_> {
                let matrix = weight.f_view([out_channels as i64, -1])?;
                let bfloat16 = bfloat16_products(&weights, false, in_channels, Kernel::PointwiseBf16);
                Ok(match Pointwise::new(&matrix, Some(&bias), bfloat16)? {
                    Some(packed) => OneByOne::Kernel(packed),
                    None => OneByOne::Products(matrix, bias.f_view([-1, 1])?),
                })
            })
            .transpose()?;
        let direct =
            other_forms && !rounded && direct_conv::applies(&weight, groups as i64, weights.device());
        Ok(Self {
            amx,
            kernel_weights: (other_forms && !rounded).then_some((weight, bias)),
            matrix,
            winograd,
            one_by_one,
            direct,
            in_channels: in_channels as i64,
            kernel: kernel as i64,
            dilation: dilation as i64,
            groups: groups as i64,
            context: context as i64,
            slot: layout.reserve(in_channels, context),
        })
    }

    /// `x`: [B, in, T] -> [B, out, T].
    pub fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
        if let Some(amx) = &self.amx {
            let slot = self.slot.expect("a kernel of several taps has a context");
            return amx.forward(&mut state.contexts[slot], x);
        }
        let (batch, columns) = (x.size()[0], x.size()[2]);
        // As one matrix product over the gathered taps: on CPU where the weight dominates (few
        // output columns against many input channels: the low-rate layers of a small step), as
        // it reads the weight faster than the convolution kernels do; on CUDA always, as cuBLAS
        // keeps float32 exact where cuDNN defaults to TF32; 16-bit weights always, unless the
        // step is large enough for Winograd tiles: a stream's step, not the batch's rows, where the
        // matrix is in AMX tiles (`Matrix::is_amx`), whose products stay bound by the weight's
        // bytes at a batch's rows, so that a stream's audio does not depend on its batch.
        let rows = batch * columns;
        let by_matrix = match &self.matrix {
            None => false,
            Some(_) if x.device().is_cuda() => true,
            Some(matrix) if self.winograd.is_some() => {
                let counted = if matrix.is_amx() { columns } else { rows };
                counted <= MATRIX_MAX_ROWS
            }
            Some(matrix) => matrix.is_rounded() || rows * 16 <= self.in_channels,
        };
        // Otherwise by Winograd tiles where the CPU has them for this many channels: fewer
        // products than the convolution kernels, which already run at the CPU's peak. They read
        // the context where the state keeps it, and move it on.
        if let Some(winograd) = self.winograd.as_ref().filter(|_| !by_matrix) {
            let slot = self.slot.expect("a kernel of several taps has a context");
            return winograd.forward(&mut state.contexts[slot], x);
        }
        let input = match self.slot {
            Some(slot) => {
                let full = Tensor::f_cat(&[&state.contexts[slot], x], 2)?;
                let len = full.size()[2];
                // Written in place: a stream's state keeps its allocations from start to end.
                state.contexts[slot].f_copy_(&full.f_narrow(2, len - self.context, self.context)?)?;
                full
            }
            None => x.shallow_clone(),
        };
        if let Some(matrix) = self.matrix.as_ref().filter(|_| by_matrix) {
            // [B, in, T, taps] -> [B * T, in * kernel]
            let taps = input
                .f_unfold(2, self.context + 1, 1)?
                .f_slice(3, 0, self.context + 1, self.dilation)?
                .f_permute([0, 2, 1, 3])?
                .f_reshape([rows, self.in_channels * self.kernel])?;
            // [B * T, out] -> [B, out, T]
            return matrix
                .forward(&taps)?
                .f_reshape([batch, columns, -1])?
                .f_permute([0, 2, 1]);
        }
        match &self.one_by_one {
            Some(OneByOne::Kernel(packed)) => return packed.forward(&input),
            Some(OneByOne::Products(weight, bias))
                if weight.size()[0] * self.in_channels * rows <= POINTWISE_MAX_MULTIPLY_ADDS =>
            {
                let y = Tensor::f_empty([batch, weight.size()[0], columns], (Kind::Float, x.device()))?;
                for row in 0..batch {
                    _ = bias.f_addmm_out(&y.f_select(0, row)?, weight, &input.f_select(0, row)?)?;
                }
                return Ok(y);
            }
            _ => {}
        }
        let (weight, bias) = self
            .kernel_weights
            .as_ref()
            .expect("convolutions without a 16-bit matrix keep their kernel weights");
        if self.direct {
            return direct_conv::forward(
                &input,
                weight,
                bias,
                self.dilation,
                self.groups,
                shim::kernel(Kernel::DirectConv),
            );
        }
        with_weights(&input, weight.kind(), |input| {
            input.f_conv1d(weight, Some(bias), [1], [0], [self.dilation], self.groups)
        })
    }
}

/// A transposed conv (stride `s`, kernel `s` or `2s`) trimmed on the right to `s` samples per
/// input column, computed as one matrix product per step. With kernel `2s` each input column
/// also adds into the next column's block: that overlap is carried to the next step.
pub struct CausalTransConv {
    /// [out * kernel, in]: row `o * kernel + j` is output channel `o`'s tap `j`. None where the
    /// 1x1 kernel takes every step (bfloat16 products in AMX tiles: `precision::amx_products`).
    matrix: Option<Matrix>,
    /// The same weight packed for our 1x1 kernel where it runs ([`Pointwise`]), for steps of
    /// more rows than the few-row kernel takes: faster than MKL's product (AVX2 on the CPUs it
    /// runs on) and oneDNN's 1x1 convolution at every block's shape; or for every step.
    pointwise: Option<Pointwise>,
    /// [1, out, 1], float32.
    bias: Tensor,
    out_channels: i64,
    stride: i64,
    kernel: i64,
    slot: Option<usize>,
}

impl CausalTransConv {
    /// Upstream's `CausalTransConvNet` at `weights` (its tensors under `conv.`).
    pub fn load(
        weights: &Weights,
        layout: &mut StateLayout,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
    ) -> Result<Self, ModelError> {
        if kernel != stride && kernel != 2 * stride {
            // Only then does each input column's output overlap the next one's alone, which is
            // all the state a step carries.
            return Err(ModelError::Config(format!(
                "a transposed convolution of kernel {kernel} and stride {stride}: streaming \
                 needs a kernel of one or two strides"
            )));
        }
        let weights = weights.at("conv");
        let weight = weights.get("weight", &[in_channels, out_channels, kernel])?;
        let taps = weight
            .f_reshape([in_channels as i64, -1])?
            .f_transpose(0, 1)?
            .f_contiguous()?;
        let every_step = match precision::amx_products(&weights, in_channels) {
            true => Pointwise::new(&taps, None, true)?,
            false => None,
        };
        let (matrix, pointwise) = match every_step {
            Some(pointwise) => (None, Some(pointwise)),
            None => {
                let matrix = Matrix::new(
                    taps,
                    None,
                    precision::one_by_one_rounding(&weights, in_channels),
                    weights.columns_per_frame(),
                )?;
                let pointwise = match &matrix {
                    Matrix::Plain { weight, .. } => {
                        let bfloat16 = bfloat16_products(&weights, false, in_channels, Kernel::PointwiseBf16);
                        Pointwise::new(weight, None, bfloat16)?
                    }
                    _ => None,
                };
                (Some(matrix), pointwise)
            }
        };
        Ok(Self {
            matrix,
            pointwise,
            // Float32 as the activations: a sum with a 16-bit one would be widened anyway.
            bias: weights
                .get("bias", &[out_channels])?
                .f_to_kind(ACTIVATION_KIND)?
                .f_view([1, -1, 1])?,
            out_channels: out_channels as i64,
            stride: stride as i64,
            kernel: kernel as i64,
            // The carried overlap: `kernel - stride` samples of every output channel.
            slot: layout.reserve(out_channels, kernel - stride),
        })
    }

    /// `x`: [B, in, T] -> [B, out, T * stride].
    pub fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
        let (batch, columns) = (x.size()[0], x.size()[2]);
        // [B, out * kernel, T]: what each new input column contributes to each output tap.
        let taps = match (&self.matrix, &self.pointwise) {
            (matrix, Some(pointwise)) if matrix.is_none() || batch * columns > skinny_gemm::MAX_ROWS => {
                pointwise.forward(x)?
            }
            // The product comes as a transposed view of [out * kernel, B * T] (see
            // `Matrix::forward`), so this is a view.
            (Some(matrix), _) => matrix
                .forward(&x.f_transpose(1, 2)?.f_flatten(0, 1)?)?
                .f_transpose(0, 1)?
                .f_unflatten(1, [batch, columns])?
                .f_permute([1, 0, 2])?,
            (None, _) => unreachable!("a transposed convolution without a matrix has the 1x1 kernel"),
        };
        // Our kernel on the CPU unless our kernels are off (then CUDA's path, run here).
        if x.device() == Device::Cpu && shim::kernel(Kernel::OverlapAdd) != CpuKernels::Off {
            let carry = self.slot.map(|slot| &mut state.contexts[slot]);
            return overlap_add::forward(&taps, carry, &self.bias, self.stride);
        }
        // [B, out, kernel, T]
        let taps = taps.f_reshape([batch, self.out_channels, self.kernel, columns])?;
        let mut blocks = taps.f_narrow(2, 0, self.stride)?;
        if let Some(slot) = self.slot {
            // Block t also gets the second half of column t - 1's taps; the first block gets
            // the carry of the previous step ([B, out, s] as [B, out, s, 1]).
            let mut carry = state.contexts[slot].f_unsqueeze(3)?;
            let overlap = taps.f_narrow(2, self.stride, self.stride)?;
            let earlier = Tensor::f_cat(&[&carry, &overlap.f_narrow(3, 0, columns - 1)?], 3)?;
            carry.f_copy_(&overlap.f_narrow(3, columns - 1, 1)?)?;
            blocks = blocks.f_add(&earlier)?;
        }
        // [B, out, s, T] -> [B, out, T * s]
        let mut output =
            blocks
                .f_permute([0, 1, 3, 2])?
                .f_reshape([batch, self.out_channels, columns * self.stride])?;
        output.f_add_(&self.bias)
    }
}
