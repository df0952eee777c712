//! Calling the CPU shims (`shim.h`): each returns a new tensor (or succeeds) or an error message.

use std::ffi::{CStr, c_char};
use std::sync::LazyLock;

use tch::{Kind, TchError, Tensor};

use crate::model::error::TorchResult;

/// Calls a shim function that writes a new tensor or an error message; `what` names the
/// product in the error.
pub fn call(
    what: &str,
    f: impl FnOnce(*mut *mut torch_sys::C_tensor, *mut c_char, usize) -> bool,
) -> TorchResult<Tensor> {
    let mut out = std::ptr::null_mut();
    checked(what, |error, size| f(&mut out, error, size))?;
    // SAFETY: on success the shim handed over a tensor it allocated with `new`.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Calls a shim function that succeeds or writes an error message; `what` names it in the
/// error.
pub fn checked(what: &str, f: impl FnOnce(*mut c_char, usize) -> bool) -> TorchResult<()> {
    let mut error = [0 as c_char; 512];
    if f(error.as_mut_ptr(), error.len()) {
        return Ok(());
    }
    // SAFETY: on failure the shim wrote a NUL-terminated message into `error`.
    let text = unsafe { CStr::from_ptr(error.as_ptr()) }.to_string_lossy();
    // libtorch's messages end with a C++ backtrace: keep what it says, not where.
    let text = text.split("\nException raised from").next().unwrap_or_default();
    Err(TchError::Torch(format!("{what}: {text}")))
}

/// The instruction set our CPU kernels run in: the widest this CPU has, unless the environment
/// variable [`KERNELS_ENV`] holds them back. The few-row product, SnakeBeta and the Winograd tiles
/// come in AVX2 and AVX-512, the direct convolutions in AVX-512 only; where they do not run,
/// libtorch's ops do their work.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuKernels {
    Off = 0,
    /// With FMA and F16C.
    Avx2 = 1,
    Avx512 = 2,
}

/// The environment variable that holds our CPU kernels back: `off` (libtorch's ops, as on a CPU
/// they do not run on) or `avx2` (no wider); unset or `on`, the widest the CPU has. Kernels named
/// after a minus are held back one by one (`on,-winograd,-snake_beta`, or `-winograd` alone): the
/// alternated A/B of each kernel (`make kernels-ab`) runs with and without it. To compare, or to
/// check the path other CPUs take.
pub const KERNELS_ENV: &str = "QWENCODEC_CPU_KERNELS";

/// Our CPU kernels, by the names [`KERNELS_ENV`] holds them back with (their files' names, and
/// `winograd_bf16` for the Winograd tiles' bfloat16 products).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    SkinnyGemm,
    Winograd,
    /// The Winograd tiles' products in bfloat16 (dtype bf16, AVX512_BF16).
    WinogradBf16,
    DirectConv,
    OverlapAdd,
    SnakeBeta,
    Attention,
    RmsNorm,
    /// 1x1 convolutions of float32 weights (AVX-512, where MKL runs without it).
    Pointwise,
    /// Their products in bfloat16 (dtype bf16, AVX512_BF16).
    PointwiseBf16,
    /// The few-row products of bfloat16 weights in AMX tiles (dtype bf16, AMX-BF16).
    SkinnyGemmBf16,
    /// Convolutions of several taps in AMX tiles, directly (dtype bf16, AMX-BF16).
    ConvAmx,
}

impl Kernel {
    pub const ALL: [Kernel; 12] = [
        Kernel::SkinnyGemm,
        Kernel::Winograd,
        Kernel::WinogradBf16,
        Kernel::DirectConv,
        Kernel::OverlapAdd,
        Kernel::SnakeBeta,
        Kernel::Attention,
        Kernel::RmsNorm,
        Kernel::Pointwise,
        Kernel::PointwiseBf16,
        Kernel::SkinnyGemmBf16,
        Kernel::ConvAmx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::SkinnyGemm => "skinny_gemm",
            Kernel::Winograd => "winograd",
            Kernel::WinogradBf16 => "winograd_bf16",
            Kernel::DirectConv => "direct_conv",
            Kernel::OverlapAdd => "overlap_add",
            Kernel::SnakeBeta => "snake_beta",
            Kernel::Attention => "attention",
            Kernel::RmsNorm => "rms_norm",
            Kernel::Pointwise => "pointwise",
            Kernel::PointwiseBf16 => "pointwise_bf16",
            Kernel::SkinnyGemmBf16 => "skinny_gemm_bf16",
            Kernel::ConvAmx => "conv_amx",
        }
    }

    /// Whether the kernel runs in `kernels`: AVX2 (the plain C++ ones too, held back with the
    /// vector kernels on other CPUs), but for three that run only on CPUs other than Intel's
    /// ([`intel_cpu`]), where each pays: the 1x1 convolutions (AVX-512), and the Winograd tiles'
    /// and the 1x1 convolutions' bfloat16 products (AVX-512 and AVX512_BF16). The 1x1 convolutions' bfloat16 products run
    /// on Intel's CPUs too where they have AMX-BF16 ([`has_amx_bf16`]), in AMX tiles; the few-row
    /// products' and the convolutions' of several taps in AMX tiles only there (which take the
    /// layers of the Winograd tiles' bfloat16 products).
    pub fn runs_in(self, kernels: CpuKernels) -> bool {
        let least = match self {
            Kernel::SkinnyGemmBf16 | Kernel::ConvAmx if !has_amx_bf16() => return false,
            Kernel::PointwiseBf16 | Kernel::WinogradBf16 if !has_bf16_products() => return false,
            // On Intel's CPUs the pairs do not pay ([`intel_cpu`]); `conv_amx` takes these layers
            // where the CPU has AMX-BF16.
            Kernel::WinogradBf16 if intel_cpu() => return false,
            Kernel::PointwiseBf16 if intel_cpu() && !has_amx_bf16() => return false,
            Kernel::Pointwise if intel_cpu() => return false,
            Kernel::Pointwise
            | Kernel::PointwiseBf16
            | Kernel::WinogradBf16
            | Kernel::SkinnyGemmBf16
            | Kernel::ConvAmx => CpuKernels::Avx512,
            _ => CpuKernels::Avx2,
        };
        kernels >= least
    }
}

impl std::str::FromStr for Kernel {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Kernel::ALL
            .into_iter()
            .find(|kernel| kernel.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Kernel::ALL.iter().map(|kernel| kernel.name()).collect();
                format!("no kernel is called {name:?} (there are {})", names.join(", "))
            })
    }
}

/// What [`KERNELS_ENV`] allows: an instruction set, and kernels held back whatever it is.
#[derive(Debug, PartialEq, Eq)]
pub struct Allowed {
    pub kernels: CpuKernels,
    pub held_back: Vec<Kernel>,
}

impl Allowed {
    /// Every kernel, in the widest instruction set the CPU has.
    pub const ALL: Allowed = Allowed {
        kernels: CpuKernels::Avx512,
        held_back: Vec::new(),
    };

    /// `value` as [`KERNELS_ENV`] holds it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut allowed = Allowed::ALL;
        for (index, part) in value.split(',').map(str::trim).enumerate() {
            if let Some(name) = part.strip_prefix('-') {
                allowed.held_back.push(name.parse()?);
                continue;
            }
            allowed.kernels = match part {
                _ if index > 0 => {
                    return Err(format!(
                        "{part:?} after the first part: kernels are held back by -name"
                    ));
                }
                "on" => CpuKernels::Avx512,
                "avx2" => CpuKernels::Avx2,
                "off" => CpuKernels::Off,
                _ => return Err(format!("{part:?} is none of on, avx2 and off")),
            };
        }
        Ok(allowed)
    }

    /// The instruction set `kernel` runs in on a CPU whose widest is `widest`.
    pub fn kernel(&self, kernel: Kernel, widest: CpuKernels) -> CpuKernels {
        if self.held_back.contains(&kernel) {
            CpuKernels::Off
        } else {
            widest.min(self.kernels)
        }
    }
}

/// This process's instruction sets, by kernel in [`Kernel::ALL`]'s order, then that of the kernels
/// not held back by name: the environment read once (a value that does not parse is reported and
/// leaves every kernel on), for the layers that ask on every step.
fn process_kernels() -> &'static ([CpuKernels; Kernel::ALL.len()], CpuKernels) {
    static KERNELS: LazyLock<([CpuKernels; Kernel::ALL.len()], CpuKernels)> = LazyLock::new(|| {
        let allowed = match std::env::var(KERNELS_ENV) {
            Err(_) => Allowed::ALL,
            Ok(value) => Allowed::parse(&value).unwrap_or_else(|err| {
                eprintln!("{KERNELS_ENV}={value:?}: {err}; the CPU kernels stay on");
                Allowed::ALL
            }),
        };
        let widest = widest_kernels();
        (
            Kernel::ALL.map(|kernel| allowed.kernel(kernel, widest)),
            widest.min(allowed.kernels),
        )
    });
    &KERNELS
}

/// This process's [`CpuKernels`]: the instruction set of the kernels not held back one by one.
pub fn cpu_kernels() -> CpuKernels {
    process_kernels().1
}

/// The instruction set `kernel` runs in in this process ([`CpuKernels::Off`]: libtorch's ops do
/// its work).
pub fn kernel(kernel: Kernel) -> CpuKernels {
    process_kernels().0[kernel as usize]
}

/// `kernels` for a test of the kernel in that instruction set, which the building CPU has
/// (build.rs's `host_avx2`, `host_avx512`, by which such tests are ignored elsewhere): a test
/// binary run on a narrower CPU than built it fails here rather than test less.
#[cfg(test)]
pub fn tested(kernels: CpuKernels) -> CpuKernels {
    assert!(
        kernels <= widest_kernels(),
        "a test of the {kernels:?} kernels, built on a CPU that has them, runs on one that has \
         only {:?}: build the tests on this CPU",
        widest_kernels()
    );
    kernels
}

/// For a test of AMX's products, which the building CPU has (build.rs's `host_amx_bf16`, by which
/// such tests are ignored elsewhere): asks Linux for the tiles, as the kernels' selection does
/// before any of them runs (without, their first instruction is fatal), and fails where this
/// CPU or process has none.
#[cfg(test)]
pub fn tested_amx() {
    assert!(
        has_amx_bf16(),
        "the CPU has AMX-BF16, and Linux lends it to this process"
    );
}

/// The widest [`CpuKernels`] this CPU runs, whatever the environment says.
pub fn widest_kernels() -> CpuKernels {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return CpuKernels::Avx512;
        }
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            return CpuKernels::Avx2;
        }
    }
    CpuKernels::Off
}

/// Whether this CPU multiplies bfloat16 pairs into float32 sums (AVX512_BF16: `vdpbf16ps`).
pub fn has_bf16_products() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

unsafe extern "C" {
    fn qwencodec_amx_bf16() -> bool;
}

/// Outputs per block of a weight packed for AMX's tiles: a product's 16 (`qwencodec::kAmxRows`,
/// which the kernels check).
pub const AMX_BLOCK_OUTPUTS: i64 = 16;

/// Whether this CPU multiplies bfloat16 in AMX tiles (AMX-BF16's `tdpbf16ps`, 16 rows by 16
/// outputs by 32 inputs an instruction) and this process may use them (the kernel grants it
/// once asked: `amx.cpp`'s `qwencodec_amx_bf16`). With AVX512_BF16, which every such CPU
/// has and the rounding of the tiles uses.
pub fn has_amx_bf16() -> bool {
    static AMX: LazyLock<bool> = LazyLock::new(|| {
        // SAFETY: no arguments; it asks the kernel for the tiles' state once.
        has_bf16_products() && unsafe { qwencodec_amx_bf16() }
    });
    *AMX
}

/// Whether a layer takes bfloat16 products by `kernel` (one that computes them: the Winograd
/// tiles' or the 1x1 convolutions'): in dtype bf16 (`dtype_rounding`, the 16-bit kind weights
/// are rounded to on the CPU), in the layers bound by arithmetic (whose matrix is not `rounded`
/// to 16 bits: see `network::precision::rounded_weights`), whose inputs fit the products (in
/// pairs, an even `in_channels`; in AMX tiles, where the CPU has them, in 32s), where the kernel
/// runs, unless the checkpoint `stored` the weight in bfloat16, whose products float32 keeps as
/// exact as f32's. Where the CPU has AMX-BF16 the kernels take the products in its tiles.
pub fn bfloat16_products(
    dtype_rounding: Option<Kind>,
    rounded: bool,
    stored: Option<Kind>,
    in_channels: usize,
    kernel: Kernel,
) -> bool {
    dtype_rounding == Some(Kind::BFloat16)
        && !rounded
        && stored != Some(Kind::BFloat16)
        && in_channels.is_multiple_of(if has_amx_bf16() { 32 } else { 2 })
        && kernel.runs_in(self::kernel(kernel))
}

/// Whether this is an Intel CPU, where two of our kernels do not pay (each kernel's A/B on both
/// CPUs: README.md here):
/// - MKL's float32 products run its AVX-512 code on Intel's CPUs alone (AVX2 at most on AMD's),
///   and there do the 1x1 convolutions as fast as `pointwise`;
/// - Intel's server cores run two 512-bit FMAs a cycle, as many products as `vdpbf16ps`'s pairs
///   at one a cycle, so the bfloat16 pairs gain nothing and pay for rounding their inputs (AMD's
///   cores run 512-bit FMAs at half rate, where the pairs pay). In AMX tiles, where the CPU has
///   them, the 1x1 convolutions' bfloat16 products pay on Intel's CPUs too, and `conv_amx` takes
///   the Winograd tiles' layers.
fn intel_cpu() -> bool {
    static INTEL: LazyLock<bool> = LazyLock::new(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let vendor = std::arch::x86_64::__cpuid(0);
            let name: Vec<u8> = [vendor.ebx, vendor.edx, vendor.ecx]
                .iter()
                .flat_map(|word| word.to_le_bytes())
                .collect();
            name == b"GenuineIntel"
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    });
    *INTEL
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instruction sets the build announced (build.rs's `host_avx2`, `host_avx512`, which
    /// decide whether the kernels' tests run or are ignored) are this CPU's: a build that missed
    /// AVX-512 on a CPU that has it would ignore every AVX-512 kernel test, and pass.
    #[test]
    fn the_build_announced_the_instruction_sets_of_this_cpu() {
        let announced = if cfg!(host_avx512) {
            CpuKernels::Avx512
        } else if cfg!(host_avx2) {
            CpuKernels::Avx2
        } else {
            CpuKernels::Off
        };
        assert_eq!(
            announced,
            widest_kernels(),
            "build.rs announced {announced:?} kernels' tests, this CPU runs {:?}",
            widest_kernels()
        );
        // The AMX kernels' tests likewise (build.rs's `host_amx_bf16`: CPUID's AMX-BF16 and
        // AMX-TILE with AVX512_BF16): a build that missed AMX would ignore them all, and one
        // that claimed it on a CPU or kernel without the tiles would fail in their first line.
        assert_eq!(
            cfg!(host_amx_bf16),
            has_amx_bf16(),
            "build.rs announced AMX-BF16: {}, this CPU and Linux lend it: {}",
            cfg!(host_amx_bf16),
            has_amx_bf16()
        );
        // The line `make test` shows: which instruction sets' kernel tests this run ran.
        let sets = [
            ("AVX2", cfg!(host_avx2)),
            ("AVX-512", cfg!(host_avx512)),
            ("AMX-BF16", cfg!(host_amx_bf16)),
        ];
        let (ran, not): (Vec<_>, Vec<_>) = sets.iter().partition(|(_, ran)| *ran);
        let names = |sets: Vec<&(&str, bool)>| {
            let names: Vec<_> = sets.iter().map(|(name, _)| *name).collect();
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        };
        println!(
            "kernel tests: ran {} on this CPU; not run (the CPU lacks them): {}",
            names(ran),
            names(not)
        );
    }

    fn parsed(value: &str) -> Allowed {
        Allowed::parse(value).unwrap()
    }

    #[test]
    fn the_environment_holds_kernels_back_by_instruction_set_and_by_name() {
        assert_eq!(parsed("on").kernels, CpuKernels::Avx512);
        assert_eq!(parsed("avx2").kernels, CpuKernels::Avx2);
        assert_eq!(parsed("off").kernels, CpuKernels::Off);
        let some = parsed("avx2,-winograd, -snake_beta");
        assert_eq!(some.kernels, CpuKernels::Avx2);
        assert_eq!(some.held_back, [Kernel::Winograd, Kernel::SnakeBeta]);
        assert_eq!(parsed("-direct_conv").kernels, CpuKernels::Avx512);
        for bad in ["fast", "-winogard", "-winograd,avx2", "on,off"] {
            let err = Allowed::parse(bad).unwrap_err();
            assert!(
                err.contains(bad.split(',').next_back().unwrap().trim_start_matches('-')),
                "{bad}: {err}"
            );
        }

        let some = parsed("on,-winograd");
        assert_eq!(some.kernel(Kernel::Winograd, CpuKernels::Avx512), CpuKernels::Off);
        assert_eq!(
            some.kernel(Kernel::SnakeBeta, CpuKernels::Avx512),
            CpuKernels::Avx512
        );
        assert_eq!(some.kernel(Kernel::SnakeBeta, CpuKernels::Avx2), CpuKernels::Avx2);
        assert_eq!(
            parsed("avx2").kernel(Kernel::SnakeBeta, CpuKernels::Avx512),
            CpuKernels::Avx2
        );
        // The process's table is indexed by the kernels' order in ALL.
        for (index, kernel) in Kernel::ALL.into_iter().enumerate() {
            assert_eq!(kernel as usize, index, "{kernel:?}");
        }
    }

    #[test]
    fn each_kernel_runs_from_the_least_instruction_set_it_needs() {
        for kernel in Kernel::ALL {
            assert!(
                !kernel.runs_in(CpuKernels::Off),
                "{kernel:?} with the kernels off"
            );
        }
        for kernel in Kernel::ALL {
            let avx2 = !matches!(
                kernel,
                Kernel::Pointwise
                    | Kernel::PointwiseBf16
                    | Kernel::WinogradBf16
                    | Kernel::SkinnyGemmBf16
                    | Kernel::ConvAmx
            );
            assert_eq!(kernel.runs_in(CpuKernels::Avx2), avx2, "{kernel:?} in AVX2");
            let avx512 = match kernel {
                Kernel::Pointwise => !intel_cpu(),
                Kernel::PointwiseBf16 => has_bf16_products() && (!intel_cpu() || has_amx_bf16()),
                Kernel::WinogradBf16 => has_bf16_products() && !intel_cpu(),
                Kernel::SkinnyGemmBf16 | Kernel::ConvAmx => has_amx_bf16(),
                _ => true,
            };
            assert_eq!(
                kernel.runs_in(CpuKernels::Avx512),
                avx512,
                "{kernel:?} in AVX-512"
            );
        }
    }

    /// The first CPU's `field` as /proc/cpuinfo gives it (what follows the colon, trimmed).
    fn cpuinfo(field: &str) -> String {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        cpuinfo
            .lines()
            .find(|line| line.split(':').next().map(str::trim) == Some(field))
            .and_then(|line| line.split_once(':'))
            .map(|(_, value)| value.trim().to_owned())
            .unwrap_or_else(|| panic!("no {field} in /proc/cpuinfo"))
    }

    /// The bfloat16 products are taken to run where /proc/cpuinfo lists AVX512_BF16.
    #[test]
    #[cfg_attr(not(target_os = "linux"), ignore = "reads /proc/cpuinfo")]
    fn bf16_products_are_taken_to_run_where_the_cpu_lists_them() {
        let flags = cpuinfo("flags");
        let listed = |flag: &str| flags.split_whitespace().any(|f| f == flag);
        assert_eq!(has_bf16_products(), listed("avx512f") && listed("avx512_bf16"));
    }

    /// An Intel CPU is told by its vendor as the kernel reports it.
    #[test]
    #[cfg_attr(not(target_os = "linux"), ignore = "reads /proc/cpuinfo")]
    fn intel_cpus_are_told_by_their_vendor() {
        let vendor = cpuinfo("vendor_id");
        assert_eq!(intel_cpu(), vendor == "GenuineIntel", "{vendor}");
    }
}
