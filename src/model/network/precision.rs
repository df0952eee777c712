//! The network's precision policy, layer by layer: which product weights dtypes f16 and bf16
//! round to 16 bits on the CPU, and how many outputs the Winograd tiles of each convolution
//! make. The figures behind each choice: `docs/performance.md`.

use tch::{Device, Kind};

use crate::model::checkpoint::Weights;
use crate::model::kernels::shim::{self, Kernel};
use crate::model::kernels::skinny_gemm;

/// Which Winograd tiles a convolution takes, where it takes them: tiles of more outputs need
/// fewer products and round more (see [`winograd_outputs`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tiles {
    /// The least rounding in float32: for the layers before the vocoder's blocks, whose rounding
    /// every later layer carries.
    Precise,
    /// Fewer products: for the vocoder's residual units.
    Fast,
}

/// The 16-bit kind a product layer at `weights` with `in_features` inputs per column rounds its
/// weight to, where weights are rounded at all (dtypes f16 and bf16 on the CPU): those whose
/// products at one frame per step are bound by the weight's bytes, having few columns against
/// many inputs (at least 16 inputs per column; a convolution's inputs count every tap). The
/// others, the vocoder's late layers, are bound by arithmetic, where half the bytes gain
/// nothing, and stay float32.
fn rounded_weights(weights: &Weights, in_features: usize) -> Option<Kind> {
    weights
        .weight_rounding()
        .filter(|_| weights.columns_per_frame() * 16 <= in_features)
}

/// Where a kind of product takes AMX's bfloat16 tiles (dtype bf16 on a CPU with AMX-BF16): from
/// how many columns a frame, by which of our kernels (which must run, and take the layer's
/// inputs: in 32s, a weight not stored in bfloat16; see `shim::bfloat16_products`).
struct AmxRule {
    from_columns: usize,
    kernel: Kernel,
}

/// 1x1 products from 32 columns a frame: 32 multiply-adds for each 2-byte weight, well past the
/// ratio at which a server CPU's float32 FMAs keep pace with its memory, so that the products
/// are bound by arithmetic.
const AMX_ONE_BY_ONE: AmxRule = AmxRule {
    from_columns: 32,
    kernel: Kernel::PointwiseBf16,
};

/// Convolutions of several taps from 32 columns a frame (the vocoder's residual units, blocks 1-4
/// of the released geometry), directly in AMX tiles (`kernels::conv_amx`) at every step: at 32
/// columns AMX reads block 1's bfloat16 weights at memory's rate where its Winograd tiles of
/// 16-bit integers are bound by float32 FMAs, and from 160 columns its products outrun Winograd's
/// fewer ones with their transforms.
const AMX_CONV: AmxRule = AmxRule {
    from_columns: 32,
    kernel: Kernel::ConvAmx,
};

/// The products of the layers whose weight [`rounded_weights`] keeps in bfloat16, from 2 columns a
/// frame (the released geometry's upsampler, the vocoder's input convolution and block 1's
/// transposed one): bound by the weight's bytes in one stream's one-frame steps, but by
/// arithmetic in batches of streams (16 rows at 4 streams), where float32 FMAs on the widened
/// weight take about twice AMX's time. The transformer's (a column a frame) keep float32
/// products: of a single row, AMX's tiles read the weight no faster, and the decode's error
/// against float64 would rise.
const AMX_MATRIX: AmxRule = AmxRule {
    from_columns: 2,
    kernel: Kernel::SkinnyGemmBf16,
};

impl AmxRule {
    fn takes(
        &self,
        dtype_rounding: Option<Kind>,
        stored: Option<Kind>,
        in_channels: usize,
        columns: usize,
    ) -> bool {
        shim::has_amx_bf16()
            && columns >= self.from_columns
            && shim::bfloat16_products(dtype_rounding, false, stored, in_channels, self.kernel)
    }

    fn takes_layer(&self, weights: &Weights, in_channels: usize) -> bool {
        self.takes(
            weights.weight_rounding(),
            weights.stored_kind("weight"),
            in_channels,
            weights.columns_per_frame(),
        )
    }
}

/// Whether a product layer of 1x1 form (a 1x1 convolution, a transposed convolution's taps) at
/// `weights` with `in_channels` inputs per column takes its bfloat16 products in AMX tiles at
/// every step ([`AMX_ONE_BY_ONE`]), where [`rounded_weights`] would keep its weight in 16 bits
/// for float32 products: the vocoder's block 1's 1x1 convolutions and block 2's transposed
/// convolution in the released geometry. The weight's bytes are the same 16 bits; a one-frame
/// step takes less time, its error against float64 a little more (`docs/performance.md`).
pub fn amx_products(weights: &Weights, in_channels: usize) -> bool {
    AMX_ONE_BY_ONE.takes_layer(weights, in_channels)
}

/// What a product layer's matrix (`ops::Matrix`) rounds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MatrixRounding {
    /// Nothing: the weight stays in the compute kind.
    Kept,
    /// The weight, to this 16-bit kind, for float32 products ([`rounded_weights`]).
    Weight(Kind),
    /// The weight and the activations, to bfloat16, for AMX's products ([`AMX_MATRIX`]): where
    /// [`rounded_weights`] keeps the weight in bfloat16 and the layer sees enough columns.
    AmxBf16,
}

/// What a product layer at `weights` with `in_features` inputs per column rounds (see
/// [`MatrixRounding`]).
pub fn matrix_rounding(weights: &Weights, in_features: usize) -> MatrixRounding {
    match rounded_weights(weights, in_features) {
        None => MatrixRounding::Kept,
        Some(Kind::BFloat16) if AMX_MATRIX.takes_layer(weights, in_features) => MatrixRounding::AmxBf16,
        Some(kind) => MatrixRounding::Weight(kind),
    }
}

/// What a product layer of 1x1 form (a 1x1 convolution, a transposed convolution's taps), only
/// ever multiplied as a matrix, at `weights` with `in_channels` inputs per column rounds: as
/// [`matrix_rounding`], but nothing where its 16-bit weight would be widened to float32 at every
/// step ([`widened_at_every_step`]: on CPUs with AVX2 but not AVX-512, from 9 columns a frame,
/// block 1's 1x1 convolutions and block 2's transposed one in the released geometry). The
/// widening costs a sizeable part of a one-frame step and saves no bytes: MKL's product then
/// reads the float32 copy.
pub fn one_by_one_rounding(weights: &Weights, in_channels: usize) -> MatrixRounding {
    match matrix_rounding(weights, in_channels) {
        MatrixRounding::Weight(_) if widened_at_every_step(weights.device(), weights.columns_per_frame()) => {
            MatrixRounding::Kept
        }
        rounding => rounding,
    }
}

/// Whether a 16-bit weight multiplied as a matrix, `columns` columns a frame on `device`, is
/// widened at every step: the few-row product runs, but takes fewer rows
/// (`skinny_gemm::max_rows`) and cannot pack the weight for more (AVX-512 only), so that MKL's
/// float32 product takes it. Where our kernels are held back (`off`) every 16-bit weight is
/// widened, as libtorch's own path does, which is what that switch is for.
fn widened_at_every_step(device: Device, columns: usize) -> bool {
    let rows = skinny_gemm::max_rows();
    device == Device::Cpu && rows > 0 && columns as i64 > rows && !skinny_gemm::packs(device, columns)
}

/// Whether a dense convolution of several taps at `weights` with `in_channels` inputs and
/// `out_channels` outputs runs in AMX tiles at every step ([`AMX_CONV`]), instead of a matrix or
/// Winograd tiles.
pub fn amx_conv(weights: &Weights, in_channels: usize, out_channels: usize) -> bool {
    out_channels >= AMX_CONV_MIN_OUTPUTS && AMX_CONV.takes_layer(weights, in_channels)
}

/// Fewest outputs for [`amx_conv`]: a unit of its work makes 32, and the vocoder's last
/// convolution (one output) runs faster by `kernels::direct_conv`.
const AMX_CONV_MIN_OUTPUTS: usize = 32;

/// Outputs per tile of a float32 convolution at `weights` computed by Winograd's algorithm
/// (`kernels::winograd`) that wants `tiles`. In float32, 4 (fewer products) for the vocoder's
/// residual units and 2 for the layers before the blocks, so that the released geometry's
/// decode stays about as close to float64 as upstream's own. Dtypes f16 and bf16, whose 16-bit
/// weights err far more, take 4 everywhere, and 6 from 160 columns per frame (blocks 2-4 of the
/// released geometry), where a one-frame step has tens of tiles per point and fewer products
/// outweigh the larger transformed matrices.
pub fn winograd_outputs(weights: &Weights, tiles: Tiles) -> usize {
    match (weights.weight_rounding().is_some(), tiles) {
        (true, _) if weights.columns_per_frame() >= 160 => 6,
        (true, _) | (false, Tiles::Fast) => 4,
        (false, Tiles::Precise) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::shim::CpuKernels;

    /// AMX tiles take the layers of many columns in dtype bf16 alone, where the CPU has them and
    /// the kernel runs, the inputs come in 32s and the checkpoint's weight is not bfloat16.
    #[test]
    fn amx_products_go_to_many_columns_in_bf16_where_the_cpu_has_amx() {
        let amx = shim::has_amx_bf16() && Kernel::PointwiseBf16.runs_in(shim::kernel(Kernel::PointwiseBf16));
        let (bf16, f16, f32) = (Some(Kind::BFloat16), Some(Kind::Half), Some(Kind::Float));
        assert_eq!(AMX_ONE_BY_ONE.takes(bf16, f32, 768, 32), amx);
        assert_eq!(AMX_ONE_BY_ONE.takes(bf16, f32, 768, 160), amx);
        assert!(
            !AMX_ONE_BY_ONE.takes(bf16, f32, 1536, 4),
            "bound by the weight's bytes"
        );
        assert!(!AMX_ONE_BY_ONE.takes(bf16, f32, 770, 32), "inputs not in 32s");
        assert!(
            !AMX_ONE_BY_ONE.takes(bf16, bf16, 768, 32),
            "a weight stored in bfloat16 stays exact"
        );
        assert!(!AMX_ONE_BY_ONE.takes(f16, f32, 768, 32));
        assert!(!AMX_ONE_BY_ONE.takes(None, f32, 768, 32));
    }

    /// A 16-bit weight of 1x1 form is widened at every step only where the few-row product runs in
    /// AVX2: above its 8 rows a frame (block 1's 1x1 convolutions, 32 columns a frame), not at
    /// the upsampler's 2 or block 1's transposed convolution's 4; in AVX-512 it packs them, and
    /// with the kernels held back nothing is ours to spare the widening.
    #[test]
    fn a_weight_is_widened_at_every_step_beyond_the_avx2_products_rows() {
        let avx2 = shim::kernel(Kernel::SkinnyGemm) == CpuKernels::Avx2;
        assert_eq!(widened_at_every_step(Device::Cpu, 32), avx2);
        assert_eq!(widened_at_every_step(Device::Cpu, 160), avx2);
        assert!(!widened_at_every_step(Device::Cpu, 4));
        assert!(!widened_at_every_step(Device::Cpu, 8));
        assert!(!widened_at_every_step(Device::Cuda(0), 32));
    }

    /// AMX's convolutions take the residual units' (from 32 columns a frame: blocks 1-4) in
    /// dtype bf16 alone, where the CPU has them and the kernel runs, the inputs come in 32s and
    /// the checkpoint's weight is not bfloat16.
    #[test]
    fn amx_conv_takes_the_residual_units_in_bf16_where_the_cpu_has_amx() {
        let amx = shim::has_amx_bf16() && Kernel::ConvAmx.runs_in(shim::kernel(Kernel::ConvAmx));
        let (bf16, f16, f32) = (Some(Kind::BFloat16), Some(Kind::Half), Some(Kind::Float));
        for (channels, columns) in [(768, 32), (384, 160), (192, 640), (96, 1920)] {
            assert_eq!(AMX_CONV.takes(bf16, f32, channels, columns), amx);
        }
        assert!(
            !AMX_CONV.takes(bf16, f32, 1024, 4),
            "the vocoder's input convolution, bound by its weight's bytes"
        );
        assert!(!AMX_CONV.takes(bf16, f32, 400, 160), "inputs not in 32s");
        assert!(
            !AMX_CONV.takes(bf16, bf16, 384, 160),
            "a weight stored in bfloat16 stays exact"
        );
        assert!(!AMX_CONV.takes(f16, f32, 384, 160));
        assert!(!AMX_CONV.takes(None, f32, 384, 160));
    }

    /// AMX's few-row products take the layers of 16-bit weights of 2 or more columns a frame in
    /// dtype bf16 (the upsampler's, the vocoder's input convolution, block 1's transposed one),
    /// not the transformer's, where the CPU has them, the inputs come in 32s and the
    /// checkpoint's weight is not bfloat16.
    #[test]
    fn amx_matrix_takes_the_weights_kept_in_bfloat16_of_several_columns_where_the_cpu_has_amx() {
        let amx =
            shim::has_amx_bf16() && Kernel::SkinnyGemmBf16.runs_in(shim::kernel(Kernel::SkinnyGemmBf16));
        let (bf16, f16, f32) = (Some(Kind::BFloat16), Some(Kind::Half), Some(Kind::Float));
        for (inputs, columns) in [(1024, 2), (4096, 4), (7168, 4), (1536, 4)] {
            assert_eq!(AMX_MATRIX.takes(bf16, f32, inputs, columns), amx);
        }
        assert!(
            !AMX_MATRIX.takes(bf16, f32, 1024, 1),
            "the transformer keeps its float32 products"
        );
        assert!(!AMX_MATRIX.takes(bf16, f32, 1030, 4), "inputs not in 32s");
        assert!(
            !AMX_MATRIX.takes(bf16, bf16, 1024, 4),
            "a weight stored in bfloat16 stays exact"
        );
        assert!(!AMX_MATRIX.takes(f16, f32, 1024, 4));
        assert!(!AMX_MATRIX.takes(None, f32, 1024, 4));
    }
}
