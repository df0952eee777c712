//! Where libtorch computes: one long-lived thread per device for the whole process.
//!
//! libtorch runs each CPU op across the cores with OpenMP, and GNU OpenMP gives every thread
//! that calls into it a worker team of its own. Once the process holds more OpenMP threads
//! than cores, OpenMP stops spinning between ops and puts its workers to sleep, so each of the
//! hundreds of small ops of a step pays a wake-up: decoding on GStreamer's streaming threads
//! (one per pipeline branch) ran 3-5 times slower than on one thread. Here every step, state
//! allocation and model load of a device runs on that device's one thread, the caller waiting
//! for it, so the process keeps a single team, and streams take turns at full speed.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use tch::Device;

/// Runs `work` on `device`'s compute thread and returns its result; a panic in `work` comes
/// back to the caller. Called from that thread itself, `work` runs at once.
pub fn run<R: Send>(device: Device, work: impl FnOnce() -> R + Send) -> R {
    match thread_for(device) {
        Some(pool) => pool.install(work),
        // Without a thread of its own (the system refused one), the caller's thread computes.
        None => work(),
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
    fn a_panic_reaches_the_caller_and_the_thread_goes_on() {
        let caught = std::panic::catch_unwind(|| run(Device::Cpu, || panic!("boom")));
        assert!(caught.is_err());
        assert_eq!(run(Device::Cpu, || 1 + 1), 2);
    }
}
