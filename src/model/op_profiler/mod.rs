//! libtorch's op profiler around a device's steps (`op_profiler.cpp`): every op the
//! steps dispatch, every kernel of the shims, and the network's stages as named scopes, each
//! with its start and end. `benches/profile.rs` and `benches/tools/profile_report.py` make the profile
//! of a step from them.

use std::ffi::{CStr, CString, c_char, c_void};
use std::marker::PhantomData;
use std::path::Path;

use tch::{Device, TchError};

use super::executor;
use super::kernels::shim::checked;

unsafe extern "C" {
    fn qwencodec_op_profiler_start(error: *mut c_char, error_size: usize) -> bool;
    fn qwencodec_op_profiler_stop(path: *const c_char, error: *mut c_char, error_size: usize) -> bool;
    fn qwencodec_scope_begin(name: *const c_char) -> *mut c_void;
    fn qwencodec_scope_end(scope: *mut c_void);
}

/// libtorch's op profiler, listening on a device's compute thread (where every step of that
/// device runs) from [`OpProfiler::start`] to [`OpProfiler::finish`].
pub struct OpProfiler {
    device: Device,
    stopped: bool,
}

impl OpProfiler {
    pub fn start(device: Device) -> Result<Self, TchError> {
        executor::run(device, || {
            // SAFETY: the shim writes at most `len` bytes of message on failure.
            checked("op profiler", |error, len| unsafe {
                qwencodec_op_profiler_start(error, len)
            })
        })?;
        Ok(Self {
            device,
            stopped: false,
        })
    }

    /// Stops listening and writes the events to `events`, one per line: thread, start and end
    /// (ns), `scope` (the network's stages) or `op` (libtorch's ops and the shims' kernels),
    /// name; tab-separated.
    pub fn finish(mut self, events: &Path) -> Result<(), TchError> {
        self.stopped = true;
        let path = CString::new(events.as_os_str().as_encoded_bytes())
            .map_err(|_| TchError::FileFormat(format!("{}: a NUL in the path", events.display())))?;
        executor::run(self.device, || {
            // SAFETY: `path` is NUL-terminated and outlives the call.
            checked("op profiler", |error, len| unsafe {
                qwencodec_op_profiler_stop(path.as_ptr(), error, len)
            })
        })
    }
}

impl Drop for OpProfiler {
    fn drop(&mut self) {
        if !self.stopped {
            // SAFETY: a null path discards the events.
            _ = executor::run(self.device, || {
                checked("op profiler", |error, len| unsafe {
                    qwencodec_op_profiler_stop(std::ptr::null(), error, len)
                })
            });
        }
    }
}

/// A named scope of the network (a stage) in the op profile, from here to its drop; nearly free
/// while no profiler listens.
pub struct Scope<'a> {
    scope: *mut c_void,
    _name: PhantomData<&'a CStr>,
}

impl<'a> Scope<'a> {
    pub fn enter(name: &'a CStr) -> Self {
        Self {
            // SAFETY: `name` is NUL-terminated and outlives the scope, which refers to it.
            scope: unsafe { qwencodec_scope_begin(name.as_ptr()) },
            _name: PhantomData,
        }
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        if !self.scope.is_null() {
            // SAFETY: a scope the shim began and nothing else ended.
            unsafe { qwencodec_scope_end(self.scope) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tch::{Kind, Tensor};

    use super::*;

    /// One profiler at a time listens on the CPU's compute thread; other tests' ops on that
    /// thread may be recorded too.
    static PROFILER: Mutex<()> = Mutex::new(());

    /// The events file's lines of one kind, as (name, duration in ns).
    fn events(path: &Path, kind: &str) -> Vec<(String, u64)> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split('\t').collect();
                let [_, start, end, k, name] = fields[..] else {
                    panic!("5 fields in {line:?}");
                };
                let span = end.parse::<u64>().unwrap() - start.parse::<u64>().unwrap();
                (k == kind).then(|| (name.to_owned(), span))
            })
            .collect()
    }

    #[test]
    fn records_the_ops_and_scopes_of_the_compute_thread_while_it_listens() {
        let _one = PROFILER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.tsv");
        let run = || {
            executor::run(Device::Cpu, || {
                let _scope = Scope::enter(c"a stage");
                let x = Tensor::ones([64, 64], (Kind::Float, Device::Cpu));
                (x.matmul(&x) + 1).sum(Kind::Float).double_value(&[])
            })
        };
        run(); // not recorded
        let profiler = OpProfiler::start(Device::Cpu).unwrap();
        assert_eq!(run(), 65.0 * 64.0 * 64.0);
        profiler.finish(&path).unwrap();
        run(); // not recorded

        let ops = events(&path, "op");
        let matmul = ops.iter().find(|(n, _)| n == "aten::matmul").expect("a matmul").1;
        assert!(ops.iter().any(|(n, _)| n == "aten::add"), "{ops:?}");
        let scopes = events(&path, "scope");
        let stages: Vec<_> = scopes.iter().filter(|(n, _)| n == "a stage").collect();
        assert_eq!(stages.len(), 1, "{scopes:?}");
        assert!(stages[0].1 >= matmul, "the scope holds its ops");
    }

    #[test]
    fn a_profiler_dropped_unfinished_stops_listening() {
        let _one = PROFILER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        drop(OpProfiler::start(Device::Cpu).unwrap());
        // A second start would fail while the first still listened.
        let dir = tempfile::tempdir().unwrap();
        OpProfiler::start(Device::Cpu)
            .unwrap()
            .finish(&dir.path().join("events.tsv"))
            .unwrap();
    }
}
