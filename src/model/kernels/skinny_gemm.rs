//! Float32, float16 or bfloat16 weights against a few rows of float32 activations on the CPU:
//! the C++ kernel of `skinny_gemm.cpp` (AVX-512, or AVX2 on CPUs without it), which reads each
//! weight once whatever the number of rows, 16-bit ones widened in registers (dtypes f16 and
//! bf16: half the bytes; faster than FBGEMM's float16 product and than oneDNN's bfloat16 one).
//!
//! A small step's products are a weight against 1 to about a hundred rows (a frame is 1 row in
//! the transformer, 4 after the upsampler, 32 in the vocoder's first block). MKL streams a
//! weight at memory speed for 1 or 2 rows, but for 4 to 64 rows it re-reads or re-packs it and
//! runs several times slower than the weight's bytes allow (`docs/performance.md`).
//!
//! 16-bit weights that see 8 or more rows per frame (the vocoder's first blocks) are packed at
//! load time for the kernel's outer products instead ([`pack`], [`packed_product`]), which
//! spend no time summing vector lanes, and run as fast as MKL's float32 product.
//!
//! In dtype bf16 on CPUs with AMX-BF16, the bfloat16 weights of 2 or more columns a frame are
//! packed for AMX's tiles instead ([`pack_amx`], [`amx_product`];
//! `network::precision::matrix_rounding`), whose products round the rows to bfloat16 too: the same
//! bytes, read about as fast, for a few rows, and faster from 4 rows on, where the widened
//! weights' float32 FMAs are bound by arithmetic (`docs/performance.md`).

use tch::{Device, Kind, Tensor};

use super::shim::{self, CpuKernels, Kernel, call};
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_skinny_gemm(
            weight: *const C_tensor,
            rows: *const C_tensor,
            bias: *const C_tensor,
            kernels: i32,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;

        pub fn qwencodec_amx_gemm(
            packed: *const C_tensor,
            rows: *const C_tensor,
            bias: *const C_tensor,
            out_features: i64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;

        pub fn qwencodec_packed_gemm(
            packed: *const C_tensor,
            rows: *const C_tensor,
            bias: *const C_tensor,
            out_features: i64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// Most activation rows a product runs here with in AVX-512: from there on MKL's kernels reuse
/// each weight element often enough to be as fast.
pub const MAX_ROWS: i64 = 128;

/// Most activation rows a product runs here with in AVX2, whose 16 registers hold tiles of 2
/// rows: each tile re-reads its weights (from the second-level cache, for the vocoder's wide
/// convolutions) for every 2 rows, so that from a few rows on MKL's products are faster.
const MAX_ROWS_AVX2: i64 = 8;

/// Most activation rows a product runs here with, in this process's kernels
/// ([`shim::cpu_kernels`]); none where they do not run.
pub fn max_rows() -> i64 {
    match shim::kernel(Kernel::SkinnyGemm) {
        CpuKernels::Avx512 => MAX_ROWS,
        CpuKernels::Avx2 => MAX_ROWS_AVX2,
        CpuKernels::Off => 0,
    }
}

/// Whether `weight` [out, in] against `rows` rows runs here: a contiguous float32, float16 or
/// bfloat16 weight on a CPU with AVX2 or AVX-512, at most [`max_rows`] rows.
pub fn applies(weight: &Tensor, rows: i64) -> bool {
    rows <= max_rows()
        && weight.device() == Device::Cpu
        && matches!(weight.kind(), Kind::Float | Kind::Half | Kind::BFloat16)
        && weight.is_contiguous()
}

/// Outputs per block of a packed weight (the kernel's `kBlockOutputs`).
const PACKED_BLOCK: i64 = 32;

/// Rows per frame from which a 16-bit weight is packed for outer products.
const PACKED_MIN_ROWS_PER_FRAME: usize = 8;

/// Whether a 16-bit weight on `device` that sees `rows_per_frame` rows per frame is packed (the
/// outer products are AVX-512 only).
pub fn packs(device: Device, rows_per_frame: usize) -> bool {
    rows_per_frame >= PACKED_MIN_ROWS_PER_FRAME
        && device == Device::Cpu
        && shim::kernel(Kernel::SkinnyGemm) == CpuKernels::Avx512
}

/// `weight` [out, in] as `kind` (float16 or bfloat16) [blocks, in, PACKED_BLOCK]: block k holds
/// outputs k * PACKED_BLOCK.., each input's weights for them side by side, zeros past the last.
pub fn pack(weight: &Tensor, kind: Kind) -> TorchResult<Tensor> {
    let (out, inputs) = (weight.size()[0], weight.size()[1]);
    let blocks = (out + PACKED_BLOCK - 1) / PACKED_BLOCK;
    weight
        .f_to_kind(kind)?
        .f_constant_pad_nd([0, 0, 0, blocks * PACKED_BLOCK - out])?
        .f_view([blocks, PACKED_BLOCK, inputs])?
        .f_transpose(1, 2)?
        .f_contiguous()
}

/// A weight packed by [`pack`] times each row of `rows` [R, in], plus `bias` (`out` values):
/// [R, out].
pub fn packed_product(
    packed: &Tensor,
    rows: &Tensor,
    bias: Option<&Tensor>,
    out: i64,
) -> TorchResult<Tensor> {
    let bias_ptr = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: the tensors are live for the duration of the call; the bias may be null.
    call("16-bit product", |result, error, size| unsafe {
        ffi::qwencodec_packed_gemm(packed.as_ptr(), rows.as_ptr(), bias_ptr, out, result, error, size)
    })
}

/// Blocks of 16 outputs per group of a weight packed for AMX's tiles (the kernel's
/// `kAmxGroupBlocks`).
const AMX_GROUP_BLOCKS: i64 = 3;

/// `weight` [out, in] (`in` a multiple of 32) as bfloat16 for [`amx_product`],
/// [groups, in / 32, 3, 16, 16, 2]: for each 32 inputs, the three blocks of 16 outputs of a
/// group of 48 one after another, each as AMX's right side (16 pairs of inputs by 16 outputs, an
/// output's two weights of a pair side by side), zeros past the last output.
pub fn pack_amx(weight: &Tensor) -> TorchResult<Tensor> {
    let (out, inputs) = (weight.size()[0], weight.size()[1]);
    let group = AMX_GROUP_BLOCKS * shim::AMX_BLOCK_OUTPUTS;
    let groups = (out + group - 1) / group;
    weight
        .f_to_kind(Kind::BFloat16)?
        .f_constant_pad_nd([0, 0, 0, groups * group - out])?
        .f_view([
            groups,
            AMX_GROUP_BLOCKS,
            shim::AMX_BLOCK_OUTPUTS,
            inputs / 32,
            16,
            2,
        ])?
        .f_permute([0, 3, 1, 4, 2, 5])?
        .f_contiguous()
}

/// A weight packed by [`pack_amx`] times each row of `rows` [R, in] rounded to bfloat16, in
/// AMX tiles with float32 sums, plus `bias` (`out` values): [R, out]. The CPU must have AMX-BF16
/// ([`shim::has_amx_bf16`]).
pub fn amx_product(packed: &Tensor, rows: &Tensor, bias: Option<&Tensor>, out: i64) -> TorchResult<Tensor> {
    let bias_ptr = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: the tensors are live for the duration of the call; the bias may be null.
    call("bfloat16 product in AMX tiles", |result, error, size| unsafe {
        ffi::qwencodec_amx_gemm(packed.as_ptr(), rows.as_ptr(), bias_ptr, out, result, error, size)
    })
}

/// `weight` [out, in] times each row of `rows` [R, in], plus `bias` (`out` values): [out, R],
/// as [`super::ops::project`].
pub fn product(weight: &Tensor, rows: &Tensor, bias: Option<&Tensor>) -> TorchResult<Tensor> {
    product_in(shim::kernel(Kernel::SkinnyGemm), weight, rows, bias)
}

/// [`product`] in the instruction set of `kernels` (AVX2 or AVX-512), which the CPU must have.
fn product_in(
    kernels: CpuKernels,
    weight: &Tensor,
    rows: &Tensor,
    bias: Option<&Tensor>,
) -> TorchResult<Tensor> {
    let bias = bias.map(Tensor::f_contiguous).transpose()?;
    let bias_ptr = bias.as_ref().map_or(std::ptr::null(), |bias| bias.as_ptr());
    // SAFETY: the tensors are live for the duration of the call; the bias may be null.
    call("float32 product", |out, error, size| unsafe {
        ffi::qwencodec_skinny_gemm(
            weight.as_ptr(),
            rows.as_ptr(),
            bias_ptr,
            kernels as i32,
            out,
            error,
            size,
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// `stored` [out, in] times each row of `x` [R, in], plus `bias`, in float64: [out, R].
    pub(crate) fn float64_product(stored: &Tensor, x: &Tensor, bias: Option<&Tensor>) -> Tensor {
        let product = stored
            .to_kind(Kind::Double)
            .mm(&x.to_kind(Kind::Double).transpose(0, 1));
        match bias {
            Some(bias) => product + bias.to_kind(Kind::Double).view([-1, 1]),
            None => product,
        }
    }

    #[test]
    #[cfg_attr(
        not(host_avx2),
        ignore = "this CPU has no AVX2 with FMA and F16C: the kernel cannot run"
    )]
    fn avx2_kernel_matches_a_float64_product() {
        kernel_matches_a_float64_product(shim::tested(CpuKernels::Avx2));
    }

    #[test]
    #[cfg_attr(not(host_avx512), ignore = "this CPU has no AVX-512: the kernel cannot run")]
    fn avx512_kernel_matches_a_float64_product() {
        kernel_matches_a_float64_product(shim::tested(CpuKernels::Avx512));
    }

    /// The kernel in `kernels`, whatever the process runs (AVX2 on an AVX-512 CPU too: what a
    /// CPU without AVX-512 runs) against a float64 product: float32, float16 and bfloat16 weights, whole
    /// and partial tiles of weight rows and activation rows (AVX2 takes 2 at a time, AVX-512
    /// 6), partial vectors at the end of the inputs.
    fn kernel_matches_a_float64_product(kernels: CpuKernels) {
        let mut random = Inputs::new(11);
        for (out, inputs) in [(4, 8), (5, 13), (9, 100), (64, 1030)] {
            for rows in [1, 2, 3, 6, 7, 13, 40] {
                let weight = random.normal([out, inputs], (Kind::Float, Device::Cpu));
                let x = random.normal([rows, inputs], (Kind::Float, Device::Cpu));
                let bias = random.normal([out], (Kind::Float, Device::Cpu));
                for (bias, stored) in [
                    (None, weight.shallow_clone()),
                    (Some(&bias), weight.shallow_clone()),
                    (Some(&bias), weight.to_kind(Kind::Half)),
                    (Some(&bias), weight.to_kind(Kind::BFloat16)),
                ] {
                    let got = product_in(kernels, &stored, &x, bias).unwrap();
                    let (error, scale) = max_error_and_scale(&got, &float64_product(&stored, &x, bias));
                    assert!(
                        error <= 1e-5 * scale,
                        "{kernels:?}: {out}x{inputs} ({:?}) against {rows} rows (bias {}): off by \
                         {error:e} of {scale:e}",
                        stored.kind(),
                        bias.is_some()
                    );
                }
            }
        }
    }

    /// In AMX tiles: inputs in 32s (one product's and more), outputs in whole and partial
    /// groups of 48 and blocks of 16, rows in whole and partial tiles of 16, with and without a
    /// bias, against the float64 product of the weight and the rows rounded to bfloat16 (what
    /// the products see), within float32's rounding of the sums.
    #[test]
    #[cfg_attr(
        not(host_amx_bf16),
        ignore = "this CPU has no AMX-BF16: the products cannot run"
    )]
    fn amx_kernel_matches_a_float64_product_of_bfloat16_values() {
        shim::tested_amx();
        let mut random = Inputs::new(12);
        let options = (Kind::Float, Device::Cpu);
        for (out, inputs) in [(48, 32), (7, 64), (100, 96), (1536, 1024)] {
            let weight = random.normal([out, inputs], options);
            let bias = random.normal([out], options);
            let packed = pack_amx(&weight).unwrap();
            let seen = |values: &Tensor| values.to_kind(Kind::BFloat16).to_kind(Kind::Float);
            for rows in [1, 4, 16, 17, 40] {
                let x = random.normal([rows, inputs], options);
                for bias in [None, Some(&bias)] {
                    let got = amx_product(&packed, &x, bias, out).unwrap();
                    assert_eq!(got.size(), [rows, out]);
                    let expected = float64_product(&seen(&weight), &seen(&x), bias).transpose(0, 1);
                    let (error, scale) = max_error_and_scale(&got, &expected);
                    assert!(
                        error <= 1e-5 * scale,
                        "{out}x{inputs} against {rows} rows (bias {}): off by {error:e} of {scale:e}",
                        bias.is_some()
                    );
                }
            }
        }
    }

    /// Shapes that do not fit are an error naming what is wrong, not a crash (the checks run
    /// before any vector instruction, so they are made with AVX2 asked for on any CPU).
    #[test]
    fn says_what_does_not_fit() {
        let weight = Tensor::zeros([8, 32], (Kind::Float, Device::Cpu));
        let rows = Tensor::zeros([2, 31], (Kind::Float, Device::Cpu));
        let error = product_in(CpuKernels::Avx2, &weight, &rows, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("rows of the weight's width"), "{error}");
        let error = product_in(CpuKernels::Off, &weight, &weight, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("runs in AVX2 or AVX-512, not kernels 0"),
            "{error}"
        );
        let error = product_in(CpuKernels::Avx2, &weight.to_kind(Kind::Int), &rows, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("float32, float16 or bfloat16"), "{error}");
        let error = packed_product(&pack(&weight, Kind::BFloat16).unwrap(), &rows, None, 8)
            .unwrap_err()
            .to_string();
        assert!(error.contains("rows of the weight's width"), "{error}");
        let error = packed_product(&pack(&weight, Kind::Half).unwrap(), &weight, None, 40)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[blocks, in, 32] for 40 outputs"), "{error}");
        // Checked before any tile is touched, so on any CPU.
        let error = amx_product(&pack_amx(&weight).unwrap(), &rows, None, 8)
            .unwrap_err()
            .to_string();
        assert!(error.contains("rows of the weight's width"), "{error}");
        let error = amx_product(&pack_amx(&weight).unwrap(), &weight, None, 49)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("[groups, in / 32, 3, 16, 16, 2] for 49 outputs"),
            "{error}"
        );
    }
}
