//! The precisions the network computes in.

use std::fmt;
use std::str::FromStr;

use tch::{Device, Kind};

use crate::model::kernels::shim::{self, Kernel};

/// Precision the network computes in. Activations, states and element-wise math are float32
/// in every dtype; the dtypes differ in the weights and the products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dtype {
    /// float32 throughout.
    #[default]
    F32,
    /// bfloat16 weights. On the CPU as f16 (with bfloat16's 8-bit mantissa where float16 has
    /// 11, for checkpoints stored in bfloat16); on CUDA products run in bfloat16.
    Bf16,
    /// float16 weights. On the CPU only the weights of the products bound by their bytes are
    /// rounded, and those products keep float32 activations and accumulation, widened in
    /// registers (no 16-bit arithmetic needed); on CUDA products run in float16.
    F16,
}

impl Dtype {
    pub fn kind(self) -> Kind {
        match self {
            Dtype::F32 => Kind::Float,
            Dtype::Bf16 => Kind::BFloat16,
            Dtype::F16 => Kind::Half,
        }
    }
}

impl FromStr for Dtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" | "float32" => Ok(Dtype::F32),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            "f16" | "float16" => Ok(Dtype::F16),
            other => Err(format!("unknown dtype {other:?} (expected f32, bf16 or f16)")),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        })
    }
}

/// What a decoder in `dtype` on `device` should know of the other dtypes' speed here. Where the
/// CPU takes every bfloat16 product of ours (AVX512_BF16 on a CPU other than Intel's, AMX-BF16 on
/// any, our kernels on: see `Kernel::runs_in`; the convolutions' by Winograd tiles in bfloat16
/// pairs or directly in AMX tiles), `bf16` is the fastest dtype; where it takes none
/// (no AVX512_BF16, an Intel CPU without AMX, the kernels held back), `bf16` runs `f16`'s path
/// at `f16`'s speed and rounds more, so `f16` is the better reduced dtype. None where there is nothing to add (CUDA; `f32`;
/// the dtype already the fastest; some products held back by name, unmeasured).
pub fn dtype_note(dtype: Dtype, device: Device) -> Option<&'static str> {
    if device != Device::Cpu {
        return None;
    }
    let runs = |kernel: Kernel| kernel.runs_in(shim::kernel(kernel));
    let convolutions = runs(Kernel::WinogradBf16) || runs(Kernel::ConvAmx);
    let products = match (convolutions, runs(Kernel::PointwiseBf16)) {
        (true, true) => Bf16Products::All,
        (false, false) => Bf16Products::None,
        _ => Bf16Products::Some,
    };
    dtype_note_of(dtype, products)
}

/// Which of our bfloat16 products a CPU takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bf16Products {
    All,
    Some,
    None,
}

fn dtype_note_of(dtype: Dtype, products: Bf16Products) -> Option<&'static str> {
    match (dtype, products) {
        (Dtype::F16, Bf16Products::All) => Some(
            "dtype bf16 is the fastest on this CPU (bfloat16 products: AVX512_BF16 or AMX), at 1.2-1.4e-1 \
             from float64 at the released widths where f16 is at 1.7e-2 (docs/performance.md)",
        ),
        (Dtype::Bf16, Bf16Products::None) => Some(
            "our bfloat16 products do not run on this CPU (they need AVX512_BF16 on a CPU other \
             than Intel's, or AMX), or our kernels are held back: bf16 runs f16's path at its speed \
             and rounds more (f16 1.7e-2 from float64 at the released widths); f16 is the better \
             choice here",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 is named the fastest where the CPU takes every bfloat16 product of ours, f16 the
    /// better choice where it takes none; nothing for f32, nor for the dtype already the fastest,
    /// nor where only some run (unmeasured there).
    #[test]
    fn notes_the_fastest_reduced_dtype_of_the_cpu() {
        use Bf16Products::{All, None as No, Some as Part};
        assert!(
            dtype_note_of(Dtype::F16, All)
                .unwrap()
                .contains("bf16 is the fastest")
        );
        assert!(
            dtype_note_of(Dtype::Bf16, No)
                .unwrap()
                .contains("f16 is the better choice")
        );
        assert_eq!(dtype_note_of(Dtype::Bf16, All), None);
        assert_eq!(dtype_note_of(Dtype::F16, No), None);
        assert_eq!(dtype_note_of(Dtype::F16, Part), None);
        assert_eq!(dtype_note_of(Dtype::Bf16, Part), None);
        assert_eq!(dtype_note_of(Dtype::F32, All), None);
        assert_eq!(dtype_note(Dtype::Bf16, Device::Cuda(0)), None);
    }

    /// On a CPU with AMX-BF16, whose convolutions take their bfloat16 products by `conv_amx`, not
    /// by Winograd's pairs (which do not run on Intel's CPUs), f16 is told that bf16 is the
    /// fastest, wherever this process runs those kernels (not under `QWENCODEC_CPU_KERNELS=avx2`
    /// or `off`).
    #[test]
    #[cfg_attr(
        not(host_amx_bf16),
        ignore = "this CPU has no AMX-BF16: its convolutions take no AMX products"
    )]
    fn names_bf16_the_fastest_where_the_cpu_has_amx() {
        let runs = |kernel: Kernel| kernel.runs_in(shim::kernel(kernel));
        let kernels_run = runs(Kernel::ConvAmx) && runs(Kernel::PointwiseBf16);
        let named =
            dtype_note(Dtype::F16, Device::Cpu).is_some_and(|note| note.contains("bf16 is the fastest"));
        assert_eq!(named, kernels_run);
    }
}
