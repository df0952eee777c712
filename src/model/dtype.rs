//! The precisions the network computes in, and which is slow on which device.

use std::fmt;
use std::str::FromStr;

use tch::{Device, Kind};

/// Precision the network computes in. Activations, states and element-wise math are float32
/// in every dtype; the dtypes differ in the weights and the products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dtype {
    /// float32 throughout.
    #[default]
    F32,
    /// bfloat16 weights, products in bfloat16 (their inputs rounded to it).
    Bf16,
    /// float16 weights. On the CPU only the weights of the products bound by their bytes are
    /// rounded, and those products keep float32 activations and accumulation; on CUDA
    /// products run in float16.
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

    /// Why this dtype is a slow choice on `device` of this machine, where it is: for a
    /// warning at start. bfloat16 products on a CPU without bfloat16 arithmetic (AVX512_BF16,
    /// AMX-BF16) are emulated by libtorch, slower than float32's; f16 keeps float32 products
    /// there (docs/performance.md, "dtypes").
    pub fn slow_on(self, device: Device) -> Option<&'static str> {
        (self == Dtype::Bf16 && device == Device::Cpu && !cpu_has_bf16_arithmetic()).then_some(
            "this CPU has no bfloat16 arithmetic (AVX512_BF16, AMX-BF16): libtorch emulates bf16's \
             products, slower than f32's; f16 is the fastest dtype here, f32 the most precise",
        )
    }
}

fn cpu_has_bf16_arithmetic() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Every CPU with AMX-BF16 has AVX512_BF16 too.
        std::is_x86_feature_detected!("avx512bf16")
    }
    // Elsewhere unknown here: no warning.
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bf16_on_a_cpu_without_bfloat16_arithmetic_is_called_slow() {
        for dtype in [Dtype::F32, Dtype::F16] {
            assert_eq!(dtype.slow_on(Device::Cpu), None);
        }
        assert_eq!(Dtype::Bf16.slow_on(Device::Cuda(0)), None);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let has_avx512_bf16 = cpuinfo
            .lines()
            .find(|line| line.starts_with("flags"))
            .is_some_and(|flags| flags.split_whitespace().any(|flag| flag == "avx512_bf16"));
        let warning = Dtype::Bf16.slow_on(Device::Cpu);
        assert_eq!(warning.is_some(), !has_avx512_bf16, "{warning:?}");
        if let Some(why) = warning {
            assert!(why.contains("f16 is the fastest"), "{why}");
        }
    }
}
