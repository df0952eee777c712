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

/// Whether the shims' AVX-512 kernels run (elsewhere libtorch's ops do their work): where the
/// CPU has AVX-512, unless the environment variable [`KERNELS_ENV`] says `off`, which runs
/// libtorch's ops as a CPU without AVX-512 does (to compare, or to check the path other CPUs
/// take). Read once per process.
pub fn avx512() -> bool {
    static ENABLED: LazyLock<bool> = LazyLock::new(|| kernels_allowed() && cpu_has_avx512());
    *ENABLED
}

/// The environment variable that turns the AVX-512 kernels off: `off` (unset or `on`: where
/// the CPU has AVX-512).
pub const KERNELS_ENV: &str = "QWENCODEC_CPU_KERNELS";

fn kernels_allowed() -> bool {
    match std::env::var_os(KERNELS_ENV) {
        None => true,
        Some(value) if value == "on" => true,
        Some(value) if value == "off" => false,
        Some(value) => {
            eprintln!("{KERNELS_ENV}={value:?} is neither on nor off: the CPU kernels stay on");
            true
        }
    }
}

fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}
