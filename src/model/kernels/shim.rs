//! Calling the CPU shims (`shim.h`): each returns a new tensor (or succeeds) or an error message.

use std::ffi::{CStr, c_char};
use std::sync::LazyLock;

use tch::{TchError, Tensor};

use super::TorchResult;

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
/// variable [`KERNELS_ENV`] holds them back. The few-row product (and with it the transformer
/// layer in one call) and SnakeBeta come in AVX2 and AVX-512, the other kernels in AVX-512 only;
/// where they do not run, libtorch's ops do their work.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuKernels {
    Off = 0,
    /// With FMA and F16C.
    Avx2 = 1,
    Avx512 = 2,
}

/// The environment variable that holds our CPU kernels back: `off` (libtorch's ops, as on a CPU
/// they do not run on) or `avx2` (no wider); unset or `on`, the widest the CPU has. To compare,
/// or to check the path other CPUs take.
pub const KERNELS_ENV: &str = "QWENCODEC_CPU_KERNELS";

/// This process's [`CpuKernels`] (the environment is read once).
pub fn cpu_kernels() -> CpuKernels {
    static KERNELS: LazyLock<CpuKernels> = LazyLock::new(|| widest_kernels().min(allowed_kernels()));
    *KERNELS
}

/// Whether the AVX-512 kernels run.
pub fn avx512() -> bool {
    cpu_kernels() == CpuKernels::Avx512
}

fn allowed_kernels() -> CpuKernels {
    match std::env::var_os(KERNELS_ENV) {
        None => CpuKernels::Avx512,
        Some(value) if value == "on" => CpuKernels::Avx512,
        Some(value) if value == "avx2" => CpuKernels::Avx2,
        Some(value) if value == "off" => CpuKernels::Off,
        Some(value) => {
            eprintln!("{KERNELS_ENV}={value:?} is none of on, avx2 and off: the CPU kernels stay on");
            CpuKernels::Avx512
        }
    }
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
