//! libtorch's CUDA graphs (`at::cuda::CUDAGraph`, through the C++ shim `cuda_graph.cpp` that
//! build.rs compiles against torch's headers): the kernels of a decode step recorded once and
//! launched again with one call, instead of the CPU launching hundreds of small kernels.

use std::ffi::{CStr, c_char};
use std::ptr::NonNull;

use crate::model::error::GraphError;

#[cfg(cuda_graphs)]
mod ffi {
    use std::ffi::c_char;

    #[repr(C)]
    pub struct QwencodecGraph {
        _private: [u8; 0],
    }

    // The shim's functions (cuda_graph.cpp): each catches what libtorch throws and returns it
    // as a message, null on success.
    unsafe extern "C" {
        pub fn qwencodec_graph_new(device: i32, out: *mut *mut QwencodecGraph) -> *mut c_char;
        pub fn qwencodec_graph_free(graph: *mut QwencodecGraph);
        pub fn qwencodec_graph_enter_side_stream(graph: *mut QwencodecGraph) -> *mut c_char;
        pub fn qwencodec_graph_leave_side_stream(graph: *mut QwencodecGraph) -> *mut c_char;
        pub fn qwencodec_graph_capture_begin(
            graph: *mut QwencodecGraph,
            share_pool_of: *const QwencodecGraph,
        ) -> *mut c_char;
        pub fn qwencodec_graph_capture_end(graph: *mut QwencodecGraph) -> *mut c_char;
        pub fn qwencodec_graph_replay(graph: *mut QwencodecGraph) -> *mut c_char;
        pub fn qwencodec_cuda_reserved_bytes(device: i32, out: *mut u64) -> *mut c_char;
        pub fn qwencodec_error_free(error: *mut c_char);
    }
}

/// A captured graph on one CUDA device. It refers to the memory of every tensor the captured
/// work read or wrote: those must outlive it and keep their storage (write them in place).
pub struct CudaGraph {
    #[cfg_attr(not(cuda_graphs), allow(dead_code))]
    raw: NonNull<std::ffi::c_void>,
}

// SAFETY: a CUDAGraph is a handle to device-side objects; replaying and freeing it from
// another thread is allowed (the decoder only ever uses it from its device's compute thread).
unsafe impl Send for CudaGraph {}

/// A shim call's error message, taken over and freed.
#[cfg_attr(not(cuda_graphs), allow(dead_code))]
fn check(error: *mut c_char) -> Result<(), GraphError> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: the shim returns a NUL-terminated string it allocated, ours to free.
    let text = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    // libtorch's messages end with a C++ backtrace: keep what it says, not where.
    let text = match text.find("\nException raised from") {
        Some(end) => text[..end].trim_end().to_owned(),
        None => text,
    };
    // SAFETY: `error` came from the shim, which allocated it with malloc; freed once, here.
    #[cfg(cuda_graphs)]
    unsafe {
        ffi::qwencodec_error_free(error)
    };
    Err(GraphError::Cuda(text))
}

#[cfg(cuda_graphs)]
impl CudaGraph {
    /// Runs `warm_up`, then records the kernels that `work` launches, both on a side stream of
    /// CUDA device `device` (capture needs one; the warm-up there creates what the stream's
    /// first kernels allocate, such as cuBLAS's workspace). Both get `context`. Recording runs
    /// nothing: `work`'s results hold their values only after [`Self::replay`]. With
    /// `share_pool_of`, the new graph allocates from that graph's memory pool: only for graphs
    /// replayed one at a time whose results are read before the next replay.
    pub fn capture<C, T>(
        device: usize,
        share_pool_of: Option<&CudaGraph>,
        context: &mut C,
        warm_up: impl FnOnce(&mut C) -> Result<(), tch::TchError>,
        work: impl FnOnce(&mut C) -> Result<T, tch::TchError>,
    ) -> Result<(Self, T), GraphError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the shim writes a new graph to `raw` or returns an error.
        check(unsafe { ffi::qwencodec_graph_new(device as i32, &mut raw) })?;
        let graph = Self {
            raw: NonNull::new(raw.cast()).ok_or(GraphError::Cuda("no graph made".into()))?,
        };
        // SAFETY: `graph` is a live graph of the shim.
        let captured = check(unsafe { ffi::qwencodec_graph_enter_side_stream(graph.ptr()) })
            .and_then(|()| graph.record(share_pool_of, context, warm_up, work));
        // Back to the earlier device and stream whatever happened (leaving restores only what
        // entering changed), then report the first failure.
        // SAFETY: `graph` is a live graph of the shim.
        let left = check(unsafe { ffi::qwencodec_graph_leave_side_stream(graph.ptr()) });
        let output = captured?;
        left?;
        Ok((graph, output))
    }

    fn record<C, T>(
        &self,
        share_pool_of: Option<&CudaGraph>,
        context: &mut C,
        warm_up: impl FnOnce(&mut C) -> Result<(), tch::TchError>,
        work: impl FnOnce(&mut C) -> Result<T, tch::TchError>,
    ) -> Result<T, GraphError> {
        warm_up(context)?;
        let pool = share_pool_of.map_or(std::ptr::null(), |other| other.ptr().cast_const());
        // SAFETY: both graphs are live graphs of the shim; `pool` may be null (a pool of its own).
        check(unsafe { ffi::qwencodec_graph_capture_begin(self.ptr(), pool) })?;
        let output = work(context);
        // A capture must end even when the work failed, or the stream stays in capture mode.
        // SAFETY: the graph is live, and its capture began above.
        let ended = check(unsafe { ffi::qwencodec_graph_capture_end(self.ptr()) });
        let output = output?;
        ended?;
        Ok(output)
    }

    /// Launches the recorded kernels on the current stream of the graph's device.
    pub fn replay(&self) -> Result<(), GraphError> {
        // SAFETY: the graph is live and was captured (only `capture` hands graphs out).
        check(unsafe { ffi::qwencodec_graph_replay(self.ptr()) })
    }

    fn ptr(&self) -> *mut ffi::QwencodecGraph {
        self.raw.as_ptr().cast()
    }
}

#[cfg(cuda_graphs)]
impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: made by qwencodec_graph_new, freed once.
        unsafe { ffi::qwencodec_graph_free(self.ptr()) }
    }
}

/// Device memory that libtorch's caching allocator holds on CUDA device `device`, graph pools
/// included.
#[cfg(cuda_graphs)]
pub fn reserved_bytes(device: usize) -> Result<u64, GraphError> {
    let mut bytes = 0;
    // SAFETY: the shim writes the count to `bytes` or returns an error.
    check(unsafe { ffi::qwencodec_cuda_reserved_bytes(device as i32, &mut bytes) })?;
    Ok(bytes)
}

#[cfg(not(cuda_graphs))]
pub fn reserved_bytes(_device: usize) -> Result<u64, GraphError> {
    Err(GraphError::Unavailable)
}

#[cfg(not(cuda_graphs))]
impl CudaGraph {
    pub fn capture<C, T>(
        _device: usize,
        _share_pool_of: Option<&CudaGraph>,
        _context: &mut C,
        _warm_up: impl FnOnce(&mut C) -> Result<(), tch::TchError>,
        _work: impl FnOnce(&mut C) -> Result<T, tch::TchError>,
    ) -> Result<(Self, T), GraphError> {
        Err(GraphError::Unavailable)
    }

    pub fn replay(&self) -> Result<(), GraphError> {
        Err(GraphError::Unavailable)
    }
}

#[cfg(all(test, cuda_graphs))]
mod tests {
    use super::*;

    #[test]
    fn shim_errors_come_back_as_messages() {
        // A device index no machine has: libtorch throws, the shim returns its message.
        let result = CudaGraph::capture(
            99,
            None,
            &mut (),
            |_| panic!("no warm-up without a graph"),
            |_| -> Result<(), tch::TchError> { panic!("no capture without a graph") },
        );
        match result {
            Err(GraphError::Cuda(message)) => {
                eprintln!("{message}");
                assert!(!message.is_empty())
            }
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("captured on CUDA device 99"),
        }
    }
}
