//! Calling the CPU shims (`shim.h`): each returns a new tensor (or succeeds) or an error message.

use std::ffi::{CStr, c_char};

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

/// Whether this CPU runs the shims' AVX-512 kernels (elsewhere libtorch's ops do their work).
pub fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}
