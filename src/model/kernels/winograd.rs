//! Dilated convolutions by Winograd's minimal filtering (Cook-Toom): `m` outputs of a kernel of
//! `taps` taps from `m + taps - 1` products instead of `m * taps`. The vocoder's residual units
//! spend most of a step in their kernel-7 convolutions, which already run at the CPU's peak as
//! convolutions; this needs fewer multiplications: 8 products per 2 outputs instead of 14, 10
//! per 4 instead of 28, or 12 per 6 instead of 42.
//!
//! The price is rounding: the transforms scale values by up to the interpolation points'
//! powers, and more outputs per tile need more and larger points. With points searched for the
//! least rounding ([`FINITE_POINTS`]), float32 takes tiles of 4 in the residual units and 2 in
//! the vocoder's input conv, and its decode stays about as close to float64 as upstream's own;
//! dtypes f16 and bf16 also take 6 (`network::precision::winograd_outputs`), and keeps the
//! transformed weights of the convolutions bound by their bytes in 16-bit integers
//! ([`INT16_STEPS`]).
//!
//! The convolution is C++ (`winograd.cpp`, AVX-512 or AVX2): the transforms and, between them, a
//! product per point with its transformed weight, in pieces that keep the tiles in the caches.

use tch::{Device, Kind, Tensor};

use super::shim::{self, CpuKernels, Kernel, call};
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_winograd_conv(
            context: *mut C_tensor,
            x: *const C_tensor,
            weights: *const C_tensor,
            scales: *const C_tensor,
            bias: *const C_tensor,
            bt: *const C_tensor,
            at: *const C_tensor,
            dilation: i64,
            kernels: i32,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// The finite interpolation points of the tile sizes used, by their number (infinity is the
/// last point): small integers, halves and thirds keep the transforms' entries, and so their
/// rounding, small. For the 7-tap kernels (the vocoder's), the sets with 0 and ±1 of least
/// float32 error in a model of the kernel's rounding (`tools/winograd_points.py`): for tiles of
/// 4 outputs, 2.4x less than 0, ±1, ±2, ±1/2, ±3. For the 3-tap kernel (the quantizer's
/// pre_conv, in large steps), the smallest points.
const FINITE_POINTS: [&[f64]; 5] = [
    // F(2, 3)
    &[0.0, 1.0, -1.0],
    // F(4, 3)
    &[0.0, 1.0, -1.0, 2.0, -2.0],
    // F(2, 7)
    &[0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5],
    // F(4, 7)
    &[0.0, 1.0, -1.0, 2.0, -0.5, -3.0, 1.0 / 3.0, -1.5, 2.0 / 3.0],
    // F(6, 7)
    &[
        0.0,
        1.0,
        -1.0,
        3.0,
        -3.0,
        1.0 / 3.0,
        -1.0 / 3.0,
        1.5,
        -1.5,
        2.0 / 3.0,
        -2.0 / 3.0,
    ],
];

/// The finite points of tiles of `points` points, where a set is chosen for that many.
fn finite_points(points: usize) -> Option<&'static [f64]> {
    FINITE_POINTS.iter().copied().find(|set| set.len() + 1 == points)
}

/// The fewest channels at which tiles of `m` outputs (first) are measured to beat libtorch's
/// convolution: every block of the released geometry, whose narrowest has 96. With few
/// channels, each input value becoming `points / m` tile values, written and read again, weighs
/// more against the products saved.
const MIN_CHANNELS: [(usize, usize); 3] = [(2, 96), (4, 96), (6, 96)];

/// Output channels per block of the transformed weights: the outputs one call of the kernel's
/// products computes (`kBlockOutputs` in winograd.cpp, which checks it).
const BLOCK_OUTPUTS: i64 = 48;

/// The integer that the largest transformed weight of each point's output channel becomes, in
/// int16 weights (the 16-bit tiles of dtypes f16 and bf16): each is rounded to within half a step of that, where
/// float16 rounds each to 11 bits of its own size. The transforms magnify the transformed
/// weights' rounding, about 12 times the kernel's own (RMS, tiles of 4, in a model of random
/// weights and inputs): float16 transformed weights in the vocoder's first block alone put the
/// released geometry's decode at 2.8e-2 from float64, these at 1.67e-2, where its float16
/// matrices give 1.63e-2.
const INT16_STEPS: f64 = 32767.0;

/// How a convolution keeps its transformed weights, and so how its products are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransformedWeights {
    /// float32 weights and products.
    Float32,
    /// 16-bit integers ([`INT16_STEPS`]): half the bytes, float32 products (dtypes f16 and bf16
    /// where the bytes are the cost).
    Int16,
    /// bfloat16 weights and tiles, multiplied in pairs into float32 sums by AVX512_BF16's
    /// `vdpbf16ps`, twice the products of an FMA: dtype bf16 where the CPU has
    /// them ([`TransformedWeights::for_layer`]).
    Bfloat16,
}

impl TransformedWeights {
    /// The weights of a layer of `dtype_rounding` (the 16-bit kind dtype f16 or bf16 rounds
    /// weights to on the CPU, none in float32) whose matrix is `rounded` to it or not (see
    /// `network::precision::rounded_weights`), its weight `stored` in the checkpoint as that
    /// kind. Layers bound by their weights' bytes keep them in 16-bit integers, the closest 16
    /// bits; those bound by arithmetic (the vocoder's late blocks) keep float32, and in dtype
    /// bf16 multiply in bfloat16 where the CPU can ([`Kernel::WinogradBf16`]) and their inputs
    /// pair up (an even number), unless the checkpoint stores the weight in bfloat16, whose
    /// products float32 tiles keep as exact as f32's. Rounding the tiles puts the
    /// released geometry's decode at 1.4e-1 from float64, against 1.1e-1 with float32 tiles and
    /// upstream's own bf16 decode's 2.0e-1; the same products in blocks 2 to 4 put it at 1.8e-1,
    /// in every block at 2.1e-1. On CPUs with AMX-BF16 these layers run in its tiles without
    /// Winograd's transforms (`kernels::conv_amx`).
    pub fn for_layer(
        dtype_rounding: Option<Kind>,
        rounded: bool,
        stored: Option<Kind>,
        in_channels: usize,
    ) -> Self {
        if shim::bfloat16_products(dtype_rounding, rounded, stored, in_channels, Kernel::WinogradBf16) {
            Self::Bfloat16
        } else if rounded {
            Self::Int16
        } else {
            Self::Float32
        }
    }
}

/// Winograd's three matrices for `m` outputs of a `taps`-tap kernel, `points = m + taps - 1`:
/// outputs = AT ((G kernel) * (BT inputs)), where output i is the sum over taps k of
/// kernel[k] * inputs[i + k].
struct Transforms {
    /// [m][points]
    output: Vec<Vec<f64>>,
    /// [points][taps]
    kernel: Vec<Vec<f64>>,
    /// [points][points]
    input: Vec<Vec<f64>>,
}

impl Transforms {
    /// Cook-Toom: evaluate at the finite points and at infinity, multiply, interpolate.
    fn new(m: usize, taps: usize) -> Self {
        let points = m + taps - 1;
        let finite = finite_points(points).unwrap_or_else(|| panic!("no points for F({m}, {taps})"));
        let mut output = vec![vec![0.0; points]; m];
        for (i, row) in output.iter_mut().enumerate() {
            for (entry, a) in row.iter_mut().zip(finite) {
                *entry = a.powi(i as i32);
            }
            row[points - 1] = if i == m - 1 { 1.0 } else { 0.0 };
        }
        let mut kernel = vec![vec![0.0; taps]; points];
        for (k, a) in finite.iter().enumerate() {
            let denominator: f64 = finite
                .iter()
                .enumerate()
                .filter(|&(l, _)| l != k)
                .map(|(_, b)| a - b)
                .product();
            for (j, entry) in kernel[k].iter_mut().enumerate() {
                *entry = a.powi(j as i32) / denominator;
            }
        }
        kernel[points - 1][taps - 1] = 1.0;
        // Row k: the coefficients, lowest power first, of the product of (x - b) over the finite
        // points b other than point k; the last row over all of them.
        let polynomial = |skip: Option<usize>| {
            let mut coefficients = vec![1.0];
            for (l, b) in finite.iter().enumerate() {
                if Some(l) == skip {
                    continue;
                }
                let mut next = vec![0.0; coefficients.len() + 1];
                for (power, c) in coefficients.iter().enumerate() {
                    next[power + 1] += c;
                    next[power] -= b * c;
                }
                coefficients = next;
            }
            coefficients.resize(points, 0.0);
            coefficients
        };
        let input = (0..points)
            .map(|k| polynomial((k < points - 1).then_some(k)))
            .collect();
        Self {
            output,
            kernel,
            input,
        }
    }
}

/// `rows` as a [rows, columns] tensor of `kind`.
fn matrix(rows: &[Vec<f64>], kind: Kind) -> TorchResult<Tensor> {
    let flat: Vec<f64> = rows.concat();
    Tensor::from_slice(&flat)
        .f_view([rows.len() as i64, -1])?
        .f_to_kind(kind)
}

/// A convolution (no groups) computed by Winograd tiles of `m` outputs.
pub struct Winograd {
    /// [points, blocks, in, BLOCK_OUTPUTS]: the kernel taps transformed, one matrix [in, out] per
    /// point, its output channels in blocks (the last padded with zeros), each block's bytes
    /// consecutive as the kernel reads them. float32, or int16 (see [`INT16_STEPS`]); bfloat16
    /// as [points, blocks, in / 2, BLOCK_OUTPUTS, 2], two inputs side by side for each output.
    weights: Tensor,
    /// For int16 weights, [points, blocks * BLOCK_OUTPUTS] float32: what each point's output
    /// channel's integers stand for.
    scales: Option<Tensor>,
    /// [out], contiguous
    bias: Tensor,
    /// [points, points] and [m, points], float32.
    input_transform: Tensor,
    output_transform: Tensor,
    dilation: i64,
    /// The instruction set it runs in.
    kernels: CpuKernels,
}

impl Winograd {
    /// Whether tiles of `m` outputs pay for a convolution of `channels` (in and out, the fewer)
    /// on this machine: where the kernel runs (AVX-512 or AVX2), with at least [`MIN_CHANNELS`]
    /// for the tile size, and points chosen for it and the kernel's size.
    pub fn applies(device: Device, channels: usize, m: usize, taps: usize) -> bool {
        let least = MIN_CHANNELS
            .iter()
            .find(|&&(outputs, _)| outputs == m)
            .map_or(usize::MAX, |&(_, least)| least);
        device == Device::Cpu
            && taps > 1
            && finite_points(m + taps - 1).is_some()
            && channels >= least
            && shim::kernel(Kernel::Winograd) != CpuKernels::Off
    }

    /// `weight` [out, in, taps] and `bias` [out], float32, in this process's instruction set for
    /// the kernel. The transformed weights are rounded once, as `format` keeps them.
    pub fn new(
        weight: &Tensor,
        bias: &Tensor,
        dilation: usize,
        m: usize,
        format: TransformedWeights,
    ) -> TorchResult<Self> {
        Self::in_kernels(weight, bias, dilation, m, format, shim::kernel(Kernel::Winograd))
    }

    /// [`Winograd::new`] in `kernels` (AVX2 or AVX-512), which the CPU must have; bfloat16
    /// weights run in AVX-512, where the CPU must have AVX512_BF16.
    fn in_kernels(
        weight: &Tensor,
        bias: &Tensor,
        dilation: usize,
        m: usize,
        format: TransformedWeights,
        kernels: CpuKernels,
    ) -> TorchResult<Self> {
        let taps = weight.size()[2] as usize;
        let transforms = Transforms::new(m, taps);
        let (out, inputs) = (weight.size()[0], weight.size()[1]);
        let blocks = (out + BLOCK_OUTPUTS - 1) / BLOCK_OUTPUTS;
        let padding = [0, 0, 0, 0, 0, blocks * BLOCK_OUTPUTS - out];
        // [points, taps] x [out, in, taps] in float64: [out, in, points].
        let transformed = weight
            .f_to_kind(Kind::Double)?
            .f_matmul(&matrix(&transforms.kernel, Kind::Double)?.f_t_()?)?;
        let (rounded, scales) = if format == TransformedWeights::Int16 {
            // Each point's output channel on its own scale: its largest weight is INT16_STEPS.
            let scales = (transformed.f_abs()?.f_amax([1], true)? / INT16_STEPS)
                .f_clamp_min(f64::from(f32::MIN_POSITIVE))?
                .f_to_kind(Kind::Float)?;
            let integers = transformed
                .f_div(&scales.f_to_kind(Kind::Double)?)?
                .f_round()?
                .f_to_kind(Kind::Int16)?;
            let scales = scales
                .f_squeeze_dim(1)?
                .f_constant_pad_nd([0, 0, 0, blocks * BLOCK_OUTPUTS - out])?
                .f_transpose(0, 1)?
                .f_contiguous()?;
            (integers, Some(scales))
        } else if format == TransformedWeights::Bfloat16 {
            // Through float32, so that each weight is rounded once more, to nearest even.
            let rounded = transformed.f_to_kind(Kind::Float)?.f_to_kind(Kind::BFloat16)?;
            (rounded, None)
        } else {
            (transformed.f_to_kind(Kind::Float)?, None)
        };
        let padded = rounded.f_constant_pad_nd(padding)?;
        let weights = if format == TransformedWeights::Bfloat16 {
            padded
                .f_view([blocks, BLOCK_OUTPUTS, inputs / 2, 2, -1])?
                .f_permute([4, 0, 2, 1, 3])?
                .f_contiguous()?
        } else {
            padded
                .f_view([blocks, BLOCK_OUTPUTS, inputs, -1])?
                .f_permute([3, 0, 2, 1])?
                .f_contiguous()?
        };
        Ok(Self {
            weights,
            scales,
            bias: bias.f_to_kind(Kind::Float)?.f_contiguous()?,
            input_transform: matrix(&transforms.input, Kind::Float)?,
            output_transform: matrix(&transforms.output, Kind::Float)?,
            dilation: dilation as i64,
            kernels,
        })
    }

    /// `x`: [B, in, columns] float32 -> [B, out, columns]; `context`: [B, in, reach], contiguous
    /// float32, the kernel's reach into the past ((taps - 1) * dilation columns), moved on in
    /// place to the last `reach` columns of the input (context and `x`), as a stream's state
    /// keeps it. The two are read where they are: no joined copy.
    pub fn forward(&self, context: &mut Tensor, x: &Tensor) -> TorchResult<Tensor> {
        let x = x.f_contiguous()?;
        // SAFETY: the tensors are live for the duration of the call.
        call("Winograd convolution", |out, error, size| unsafe {
            ffi::qwencodec_winograd_conv(
                context.as_mut_ptr(),
                x.as_ptr(),
                self.weights.as_ptr(),
                self.scales
                    .as_ref()
                    .map_or(std::ptr::null(), |scales| scales.as_ptr()),
                self.bias.as_ptr(),
                self.input_transform.as_ptr(),
                self.output_transform.as_ptr(),
                self.dilation,
                self.kernels as i32,
                out,
                error,
                size,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::shim::{has_amx_bf16, has_bf16_products};
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// Which convolutions take which tiles.
    #[test]
    fn applies_to_many_channels_on_the_cpu() {
        for m in [2, 4, 6] {
            assert_eq!(
                Winograd::applies(Device::Cpu, 96, m, 7),
                shim::kernel(Kernel::Winograd) != CpuKernels::Off
            );
        }
        assert!(!Winograd::applies(Device::Cpu, 64, 4, 7));
        assert!(!Winograd::applies(Device::Cpu, 64, 2, 7));
        assert!(
            !Winograd::applies(Device::Cpu, 1024, 3, 7),
            "no threshold measured for 3 outputs"
        );
        for m in [2, 4] {
            assert!(
                !Winograd::applies(Device::Cpu, 1024, m, 1),
                "a 1-tap kernel saves nothing"
            );
        }
        assert!(
            !Winograd::applies(Device::Cpu, 1024, 2, 6),
            "no points chosen for 7 points, as F(2, 6) needs"
        );
        assert!(!Winograd::applies(Device::Cuda(0), 1024, 2, 7));
    }

    /// Which layers keep which transformed weights: bfloat16 products only in dtype bf16, in the
    /// layers bound by arithmetic, where the CPU has them, the inputs fit them (in pairs; in 32s
    /// for AMX tiles) and the checkpoint does not store the weight in bfloat16.
    #[test]
    fn bfloat16_products_go_where_bf16_rounds_arithmetic_bound_layers() {
        use TransformedWeights::{Bfloat16, Float32, Int16};
        let runs = Kernel::WinogradBf16.runs_in(shim::kernel(Kernel::WinogradBf16));
        let (bf16, f16, f32) = (Some(Kind::BFloat16), Some(Kind::Half), Some(Kind::Float));
        let arithmetic_bound = TransformedWeights::for_layer(bf16, false, f32, 192);
        assert_eq!(arithmetic_bound, if runs { Bfloat16 } else { Float32 });
        assert_eq!(TransformedWeights::for_layer(bf16, true, f32, 384), Int16);
        assert_eq!(
            TransformedWeights::for_layer(bf16, false, bf16, 192),
            Float32,
            "a weight stored in bfloat16 stays exact"
        );
        assert_eq!(TransformedWeights::for_layer(bf16, false, f32, 191), Float32);
        // AMX tiles take the inputs in 32s: where the CPU has them, pairs alone are not enough.
        let pairs_alone = if runs && !has_amx_bf16() {
            Bfloat16
        } else {
            Float32
        };
        assert_eq!(TransformedWeights::for_layer(bf16, false, f32, 194), pairs_alone);
        assert_eq!(TransformedWeights::for_layer(f16, false, f32, 192), Float32);
        assert_eq!(TransformedWeights::for_layer(f16, true, f32, 384), Int16);
        assert_eq!(TransformedWeights::for_layer(None, false, f32, 192), Float32);
    }

    /// The three matrices compute a correlation exactly (in float64), for every tile size used.
    #[test]
    fn transforms_compute_a_correlation() {
        for (m, taps) in [(2, 3), (4, 3), (2, 7), (4, 7), (6, 7)] {
            let t = Transforms::new(m, taps);
            let points = m + taps - 1;
            let kernel: Vec<f64> = (0..taps).map(|k| (k as f64 * 0.37).sin() + 0.1).collect();
            let inputs: Vec<f64> = (0..points).map(|j| (j as f64 * 1.3).cos()).collect();
            let dot = |row: &[f64], v: &[f64]| row.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
            let products: Vec<f64> = (0..points)
                .map(|p| dot(&t.kernel[p], &kernel) * dot(&t.input[p], &inputs))
                .collect();
            for i in 0..m {
                let expected: f64 = (0..taps).map(|k| kernel[k] * inputs[i + k]).sum();
                let got = dot(&t.output[i], &products);
                assert!(
                    (got - expected).abs() < 1e-9,
                    "F({m}, {taps}) output {i}: {got} against {expected}"
                );
            }
        }
    }

    /// Against libtorch's convolution in float64: float32 and int16 weights, dilations, tile
    /// sizes and column counts that leave partial tiles or take several pieces, one and two
    /// streams. In each instruction set whenever the CPU has it, whatever the process runs.
    #[test]
    #[cfg_attr(not(host_avx512), ignore = "this CPU has no AVX-512: the kernel cannot run")]
    fn matches_a_float64_convolution_in_avx512() {
        matches_a_float64_convolution(shim::tested(CpuKernels::Avx512));
    }

    #[test]
    #[cfg_attr(not(host_avx2), ignore = "this CPU has no AVX2: the kernel cannot run")]
    fn matches_a_float64_convolution_in_avx2() {
        matches_a_float64_convolution(shim::tested(CpuKernels::Avx2));
    }

    fn matches_a_float64_convolution(kernels: CpuKernels) {
        let mut random = Inputs::new(5);
        // More inputs than one chain of sums takes (64), and outputs in partial vectors (of 16
        // and of 8, and a block's second half partly used in AVX2: 40 = 24 + 16).
        for (channels_in, channels_out) in [(40, 160), (136, 40), (21, 45)] {
            // The bfloat16 products by `vdpbf16ps` where the CPU has them.
            let mut formats = vec![TransformedWeights::Float32, TransformedWeights::Int16];
            if kernels == CpuKernels::Avx512 && has_bf16_products() && channels_in % 2 == 0 {
                formats.push(TransformedWeights::Bfloat16);
            }
            for taps in [3, 7] {
                check_kernel(&mut random, channels_in, channels_out, taps, kernels, &formats);
            }
        }
    }

    /// The bfloat16 products' largest error against float64, of the output's scale, in these
    /// tests for tiles of `m` outputs: twice the most measured (7 taps: 1.4e-2, 4.4e-2 and
    /// 1.1e-1), about 90 times int16's, as bfloat16 keeps 8 bits to int16's 15.
    fn bf16_bound(m: usize) -> f64 {
        match m {
            2 => 2.8e-2,
            4 => 8.9e-2,
            _ => 2.1e-1,
        }
    }

    fn check_kernel(
        random: &mut Inputs,
        channels_in: i64,
        channels_out: i64,
        taps: i64,
        kernels: CpuKernels,
        formats: &[TransformedWeights],
    ) {
        let options = (Kind::Float, Device::Cpu);
        let weight = random.normal([channels_out, channels_in, taps], options) / 17.0;
        let bias = random.normal([channels_out], options);
        // int16 weights: each transformed weight within half a step of 1/32767 of its channel's
        // largest, which the transforms magnify (tiles of 6: up to about 1e-3 here). bfloat16
        // rounds the tiles too, each to 8 bits of its own size (see bf16_bound).
        for &format in formats {
            for m in [2, 4, 6] {
                let bound = match format {
                    TransformedWeights::Float32 => 2e-5,
                    TransformedWeights::Int16 => 2e-3,
                    TransformedWeights::Bfloat16 => bf16_bound(m),
                };
                for dilation in [1, 3, 9] {
                    let conv = Winograd::in_kernels(&weight, &bias, dilation, m, format, kernels).unwrap();
                    let what = format!(
                        "{kernels:?}: {channels_in} -> {channels_out} channels, F({m}, {taps}), \
                         dilation {dilation}, {format:?} weights"
                    );
                    check_tiles(random, &conv, &weight, &bias, dilation, bound, &what);
                }
            }
        }
    }

    /// `conv` (of `weight` and `bias` at `dilation`, `what`) within `bound` of float64.
    fn check_tiles(
        random: &mut Inputs,
        conv: &Winograd,
        weight: &Tensor,
        bias: &Tensor,
        dilation: usize,
        bound: f64,
        what: &str,
    ) {
        let options = (Kind::Float, Device::Cpu);
        let (channels_in, taps) = (weight.size()[1], weight.size()[2]);
        // One stream (its tiles split among the threads, where enough), and two and three (their
        // small steps' tiles in one piece, their large ones' in pieces of their own).
        for (streams, columns) in [1, 2, 3]
            .into_iter()
            .flat_map(|s| [1, 5, 17, 64, 301, 3001].map(|c| (s, c)))
        {
            let reach = (taps - 1) * dilation as i64;
            let input = random.normal([streams, channels_in, reach + columns], options);
            let mut context = input.narrow(2, 0, reach).contiguous();
            let got = conv
                .forward(&mut context, &input.narrow(2, reach, columns))
                .unwrap();
            assert!(
                context.equal(&input.narrow(2, columns, reach)),
                "{what}, {columns} columns: the context moves on to the input's last {reach} columns"
            );
            let expected = input.to_kind(Kind::Double).conv1d(
                &weight.to_kind(Kind::Double),
                Some(&bias.to_kind(Kind::Double)),
                [1],
                [0],
                [dilation as i64],
                1,
            );
            assert_eq!(got.size(), expected.size());
            let (error, scale) = max_error_and_scale(&got, &expected);
            assert!(
                error <= bound * scale,
                "{what}, {streams} x {columns} columns: off by {error:e} of {scale:e}"
            );
        }
    }
}
