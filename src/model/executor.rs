//! Where libtorch computes: one long-lived thread per device for the whole process.
//!
//! libtorch runs each CPU op across the cores with OpenMP, and GNU OpenMP gives every thread
//! that calls into it a worker team of its own. Once the process holds more OpenMP threads
//! than cores, OpenMP stops spinning between ops and puts its workers to sleep, so each of the
//! hundreds of small ops of a step pays a wake-up: decoding on GStreamer's streaming threads
//! (one per pipeline branch) ran several times slower than on one thread. Here every step, state
//! allocation and model load of a device runs on that device's one thread, the caller waiting
//! for it, so the process keeps a single team, and streams take turns at full speed.
//!
//! That thread runs in libtorch's inference mode (`executor.cpp`): tch offers only no_grad,
//! under which every op still passes the autograd and view-tracking dispatch keys and every
//! tensor gets a version counter. A one-frame step dispatches hundreds of ops, and inference mode
//! saves a little on each, in every dtype. Tensors made on the thread are inference tensors: no
//! other thread may change them in place.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use tch::Device;

use super::kernels::shim::checked;

unsafe extern "C" {
    fn qwencodec_enter_inference_mode(error: *mut std::ffi::c_char, error_size: usize) -> bool;
    #[cfg(test)]
    fn qwencodec_is_inference_mode() -> bool;
}

/// Runs `work` on `device`'s compute thread and returns its result; a panic in `work` comes
/// back to the caller. Called from that thread itself, `work` runs at once.
pub fn run<R: Send>(device: Device, work: impl FnOnce() -> R + Send) -> R {
    match thread_for(device) {
        Some(pool) => pool.install(work),
        // Without a thread of its own (the system refused one), the caller's thread computes.
        None => work(),
    }
}

/// How the compute thread's OpenMP workers wait between ops, as libgomp read it from the
/// environment when libtorch loaded (it cannot change after): a sentence for a start-up log.
/// Spinning, libgomp's default, is the fastest for the one decoding process on its cores; a
/// shorter spin or a passive wait is for several decoding processes sharing cores, which
/// would otherwise starve each other (docs/element.md, "Threads").
pub fn wait_policy() -> String {
    wait_policy_of(
        std::env::var("OMP_WAIT_POLICY").ok().as_deref(),
        std::env::var("GOMP_SPINCOUNT").ok().as_deref(),
    )
}

fn wait_policy_of(wait_policy: Option<&str>, spin_count: Option<&str>) -> String {
    let is = |name: &str| wait_policy.is_some_and(|policy| policy.eq_ignore_ascii_case(name));
    if is("active") {
        return "OpenMP workers spin between ops and never sleep (OMP_WAIT_POLICY=active)".into();
    }
    match (is("passive"), spin_count) {
        (true, _) => "OpenMP workers sleep between ops (OMP_WAIT_POLICY=passive: for decoding \
                      processes sharing cores; alone, a step is slower)"
            .into(),
        (false, Some(count)) => format!(
            "OpenMP workers spin {count} times before they sleep between ops (GOMP_SPINCOUNT={count}: \
             for decoding processes sharing cores; alone, a step may be slower)"
        ),
        (false, None) => "OpenMP workers spin between ops (libgomp's default: the fastest for \
                          the one decoding process on its cores)"
            .into(),
    }
}

fn thread_for(device: Device) -> Option<Arc<rayon_core::ThreadPool>> {
    static THREADS: LazyLock<Mutex<HashMap<Device, Arc<rayon_core::ThreadPool>>>> =
        LazyLock::new(Default::default);
    let mut threads = THREADS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(pool) = threads.get(&device) {
        return Some(pool.clone());
    }
    let name = match device {
        Device::Cuda(index) => format!("qwencodec-cuda{index}"),
        _ => "qwencodec-cpu".to_owned(),
    };
    let pool = rayon_core::ThreadPoolBuilder::new()
        .num_threads(1)
        .thread_name(move |_| name.clone())
        .start_handler(|_| {
            // SAFETY: the shim writes at most `len` bytes of message on failure.
            if let Err(err) = checked("inference mode", |error, len| unsafe {
                qwencodec_enter_inference_mode(error, len)
            }) {
                super::log::warning(format_args!("{err}: the compute thread runs without it"));
            }
        })
        .build()
        .ok()?;
    let pool = Arc::new(pool);
    threads.insert(device, pool.clone());
    Some(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_one_thread_per_device_and_returns_its_result() {
        let cpu = run(Device::Cpu, || std::thread::current().id());
        assert_ne!(cpu, std::thread::current().id());
        let from_another = std::thread::spawn(|| run(Device::Cpu, || std::thread::current().id()))
            .join()
            .unwrap();
        assert_eq!(cpu, from_another);
        assert_ne!(run(Device::Cuda(0), || std::thread::current().id()), cpu);
        // Nested calls run in place instead of waiting for themselves.
        assert_eq!(run(Device::Cpu, || run(Device::Cpu, || 7)), 7);
    }

    #[test]
    fn the_compute_thread_runs_in_inference_mode() {
        // SAFETY: reads the calling thread's mode.
        assert!(run(Device::Cpu, || unsafe { qwencodec_is_inference_mode() }));
        assert!(!unsafe { qwencodec_is_inference_mode() }, "only that thread");
    }

    #[test]
    fn the_wait_policy_names_what_the_environment_set() {
        assert!(wait_policy_of(None, None).contains("libgomp's default"));
        assert!(wait_policy_of(None, Some("1000")).contains("GOMP_SPINCOUNT=1000"));
        assert!(wait_policy_of(Some("PASSIVE"), Some("1000")).contains("OMP_WAIT_POLICY=passive"));
        assert!(wait_policy_of(Some("active"), None).contains("never sleep"));
    }

    #[test]
    fn a_panic_reaches_the_caller_and_the_thread_goes_on() {
        let caught = std::panic::catch_unwind(|| run(Device::Cpu, || panic!("boom")));
        assert!(caught.is_err());
        assert_eq!(run(Device::Cpu, || 1 + 1), 2);
    }
}
