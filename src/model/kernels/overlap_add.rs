//! A transposed convolution's taps into output samples on the CPU, by the C++ kernel of
//! `overlap_add.cpp`: the overlap of the previous column (or step) and the bias added in the
//! same pass (see [`super::conv::CausalTransConv`]).

use tch::Tensor;

use super::shim::call;
use crate::model::error::TorchResult;

mod ffi {
    use std::ffi::c_char;

    use torch_sys::C_tensor;

    // Tensors cross as libtorch's own `at::Tensor*` (tch's `C_tensor`).
    unsafe extern "C" {
        pub fn qwencodec_overlap_add(
            taps: *const C_tensor,
            carry: *mut C_tensor,
            bias: *const C_tensor,
            stride: i64,
            out: *mut *mut C_tensor,
            error: *mut c_char,
            size: usize,
        ) -> bool;
    }
}

/// `taps` [B, out * kernel, T] (row `o * kernel + j`: channel o's tap j of each column; any
/// strides: a product's transposed output, a convolution's output), kernel `stride` or twice
/// it; `carry` [B, out, kernel - stride] (the overlap carried from the last step, moved on)
/// where kernel is twice the stride; `bias` (`out` values, contiguous) -> [B, out, T * stride].
pub fn forward(taps: &Tensor, carry: Option<&mut Tensor>, bias: &Tensor, stride: i64) -> TorchResult<Tensor> {
    let carry = carry.map_or(std::ptr::null_mut(), |carry| carry.as_mut_ptr());
    // SAFETY: the tensors are live for the duration of the call; the carry may be null.
    call("transposed convolution", |out, error, size| unsafe {
        ffi::qwencodec_overlap_add(taps.as_ptr(), carry, bias.as_ptr(), stride, out, error, size)
    })
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// The taps' layouts: a product's output [out * kernel, B * T], its transposed view, or a
    /// convolution's output [B, out * kernel, T].
    #[derive(Debug, Clone, Copy)]
    enum Layout {
        Product,
        Transposed,
        Convolution,
    }

    /// Strides the kernel unrolls and one it does not, with and without overlap, several streams
    /// and a single column, each layout of the taps, against the samples laid out by libtorch's
    /// ops in float64, and the carry moved on to the last column's overlap.
    #[test]
    fn lays_out_and_overlaps_the_taps() {
        let mut random = Inputs::new(5);
        let options = (Kind::Float, Device::Cpu);
        for (stride, kernel) in [(3, 6), (8, 16), (7, 14), (4, 4)] {
            // Transposed taps go column by column, in pieces of 16 columns: one and several.
            for (batch, columns, layout) in [
                (1, 1, Layout::Product),
                (1, 20, Layout::Product),
                (3, 9, Layout::Product),
                (3, 9, Layout::Transposed),
                (2, 37, Layout::Transposed),
                (1, 20, Layout::Convolution),
                (3, 9, Layout::Convolution),
            ] {
                let out = 5;
                // [B, out * kernel, T], a view of the products' [out * kernel, B * T].
                let of_product = |taps: Tensor| taps.unflatten(1, [batch, columns]).permute([1, 0, 2]);
                let taps = match layout {
                    Layout::Product => of_product(random.normal([out * kernel, batch * columns], options)),
                    Layout::Transposed => {
                        of_product(random.normal([batch * columns, out * kernel], options).tr())
                    }
                    Layout::Convolution => random.normal([batch, out * kernel, columns], options),
                };
                let bias = random.normal([out], options);
                let overlap = kernel - stride;
                let carried = random.normal([batch, out, overlap], options);
                let mut carry = carried.copy();
                let got = forward(&taps, (overlap > 0).then_some(&mut carry), &bias, stride).unwrap();

                // [B, out, kernel, T] -> per column t, tap j: [B, out, T, kernel]
                let per_column = taps
                    .to_kind(Kind::Double)
                    .reshape([batch, out, kernel, columns])
                    .permute([0, 1, 3, 2]);
                let mut expected = per_column.narrow(3, 0, stride).copy();
                if overlap > 0 {
                    let later = per_column.narrow(3, stride, stride);
                    // Column t gets column t - 1's later taps; column 0 the carry.
                    let earlier = Tensor::cat(
                        &[
                            &carried.to_kind(Kind::Double).unsqueeze(2),
                            &later.narrow(2, 0, columns - 1),
                        ],
                        2,
                    );
                    expected += earlier;
                    let moved = later
                        .narrow(2, columns - 1, 1)
                        .squeeze_dim(2)
                        .to_kind(Kind::Float);
                    assert!(carry.equal(&moved), "stride {stride}, {batch} x {columns}: carry");
                }
                let expected = expected.reshape([batch, out, columns * stride])
                    + bias.to_kind(Kind::Double).view([1, -1, 1]);
                assert_eq!(got.size(), expected.size());
                let (error, scale) = max_error_and_scale(&got, &expected);
                assert!(
                    error <= 1e-6 * scale,
                    "stride {stride}, kernel {kernel}, {batch} x {columns} ({layout:?}): off by {error:e} of {scale:e}"
                );
            }
        }
    }

    /// Shapes that do not fit are an error naming what is wrong, not a crash.
    #[test]
    fn says_what_does_not_fit() {
        let options = (Kind::Float, Device::Cpu);
        let bias = Tensor::zeros([4], options);
        let taps = Tensor::zeros([1, 4 * 6, 10], options);
        let error = forward(&taps, None, &bias, 4).unwrap_err().to_string();
        assert!(
            error.contains("its stride or twice it, not 6 at stride 4"),
            "{error}"
        );
        let mut short = Tensor::zeros([1, 4, 2], options);
        let error = forward(&taps, Some(&mut short), &bias, 3)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("carried overlap is contiguous float32 [1, 4, 3]"),
            "{error}"
        );
        let error = forward(&taps.squeeze_dim(0), None, &bias, 3)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[B, out * kernel, T]"), "{error}");
    }
}
