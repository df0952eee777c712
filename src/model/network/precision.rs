//! The network's precision policy, layer by layer: which product weights dtypes f16 and bf16
//! round to 16 bits on the CPU, and how many outputs the Winograd tiles of each convolution make. The
//! figures behind each choice: docs/performance.md, "Which layer takes what".

use tch::Kind;

use crate::model::checkpoint::Weights;

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
pub fn rounded_weights(weights: &Weights, in_features: usize) -> Option<Kind> {
    weights
        .weight_rounding()
        .filter(|_| weights.columns_per_frame() * 16 <= in_features)
}

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
