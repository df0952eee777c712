//! The precisions the network computes in.

use std::fmt;
use std::str::FromStr;

use tch::Kind;

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
