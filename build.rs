use std::env;
use std::path::{Path, PathBuf};

/// The CPU kernels' sources, in `KERNELS_DIR` beside the headers they share (the op profiler's
/// shim includes them too).
const KERNELS_DIR: &str = "src/model/kernels";
const SHIM_HEADERS: [&str; 7] = [
    "amx.h",
    "context.h",
    "intrinsics.h",
    "kernels.h",
    "shim.h",
    "transpose.h",
    "widen.h",
];
const OP_PROFILER: &str = "src/model/op_profiler/op_profiler.cpp";
const EXECUTOR: &str = "src/model/executor.cpp";
const CUDA_GRAPH: &str = "src/model/engine/cuda_graph.cpp";
const CPU_KERNELS: [&str; 10] = [
    "amx.cpp",
    "attention.cpp",
    "conv_amx.cpp",
    "direct_conv.cpp",
    "overlap_add.cpp",
    "pointwise.cpp",
    "rms_norm.cpp",
    "skinny_gemm.cpp",
    "snake_beta.cpp",
    "winograd.cpp",
];

fn main() {
    gst_plugin_version_helper::info();
    println!("cargo::rustc-check-cfg=cfg(cuda_graphs)");
    announce_instruction_sets();
    println!("cargo::rerun-if-changed={CUDA_GRAPH}");
    println!("cargo::rerun-if-changed={OP_PROFILER}");
    println!("cargo::rerun-if-changed={EXECUTOR}");
    for file in SHIM_HEADERS.iter().chain(&CPU_KERNELS) {
        println!("cargo::rerun-if-changed={KERNELS_DIR}/{file}");
    }

    // torch-sys tells its dependents where the libtorch it linked lives (and the shims need
    // its headers).
    let lib_dir =
        PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys gives its libtorch's lib folder"));
    // Let the plugin (and the tests) find libtorch at run time without LD_LIBRARY_PATH.
    println!("cargo::rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // Every symbol the plugin calls must resolve when it links, not when GStreamer loads it:
    // snake_beta.cpp's SLEEF sines among them, which libtorch exports but declares in no header.
    println!("cargo::rustc-cdylib-link-arg=-Wl,-z,defs");
    build_cpu_shims(&lib_dir);

    if !lib_dir.join("libtorch_cuda.so").exists() {
        return; // A CPU-only libtorch: no CUDA, no graphs.
    }
    // Nothing of ours calls into libtorch_cuda directly, so the linker would drop it (it
    // links with --as-needed) and libtorch would then see no GPU: its CUDA support
    // registers itself when the library loads.
    println!("cargo::rustc-link-arg=-Wl,--push-state,--no-as-needed,-ltorch_cuda,-lc10_cuda,--pop-state");

    match cuda_include_dir(&lib_dir) {
        Some(cuda_include) => build_graph_shim(&lib_dir, &cuda_include),
        None => println!(
            "cargo::warning=no CUDA runtime headers beside libtorch or in CUDA_HOME: building without CUDA graphs"
        ),
    }
}

/// `host_avx2` and `host_avx512` where the CPU that builds has the kernels' instruction sets (as
/// `shim::widest_kernels` reads them at run time): a kernel's tests are ignored, and say so,
/// where its instruction set cannot run, rather than passing without running it.
fn announce_instruction_sets() {
    println!("cargo::rustc-check-cfg=cfg(host_avx2, host_avx512, host_amx_bf16)");
    let native = env::var("TARGET").ok() == env::var("HOST").ok();
    #[cfg(target_arch = "x86_64")]
    if native && env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        if avx2 || std::is_x86_feature_detected!("avx512f") {
            println!("cargo::rustc-cfg=host_avx2");
        }
        if std::is_x86_feature_detected!("avx512f") {
            println!("cargo::rustc-cfg=host_avx512");
        }
        // AMX-BF16 and AMX-TILE (CPUID leaf 7, EDX bits 22 and 24), with AVX512_BF16, which the
        // kernels round their inputs with: std's detection of AMX is not stable.
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let amx = leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0;
        if amx && std::is_x86_feature_detected!("avx512bf16") {
            println!("cargo::rustc-cfg=host_amx_bf16");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native;
}

/// The CUDA runtime headers: the PyPI wheel's nvidia package beside torch, else a toolkit.
fn cuda_include_dir(lib_dir: &Path) -> Option<PathBuf> {
    let site_packages = lib_dir.parent()?.parent()?;
    let wheels = std::fs::read_dir(site_packages.join("nvidia"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("include"));
    let toolkit = env::var_os("CUDA_HOME").map(|home| PathBuf::from(home).join("include"));
    wheels
        .chain(toolkit)
        .chain([PathBuf::from("/usr/local/cuda/include")])
        .find(|dir| dir.join("cuda_runtime_api.h").exists())
}

/// A C++ build against libtorch's headers.
fn torch_shim_build(lib_dir: &Path) -> cc::Build {
    let torch_include = lib_dir
        .parent()
        .expect("libtorch lib dir has a parent")
        .join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        // libtorch's headers as system headers: their warnings are not ours to fix.
        .flag("-isystem")
        .flag(
            torch_include
                .to_str()
                .expect("libtorch's include folder is UTF-8"),
        )
        .flag("-isystem")
        .flag(
            torch_include
                .join("torch/csrc/api/include")
                .to_str()
                .expect("libtorch's include folder is UTF-8"),
        )
        // libtorch 2.x is built with the C++11 ABI.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .warnings(true)
        .extra_warnings(true)
        // `make` builds with QWENCODEC_WERROR=1: a warning fails the build there, while a
        // newer compiler's new warnings do not stop a plain `cargo build`.
        .warnings_into_errors(env::var_os("QWENCODEC_WERROR").is_some_and(|value| value == "1"));
    println!("cargo::rerun-if-env-changed=QWENCODEC_WERROR");
    build
}

/// The CPU kernels that tch does not offer, behind a C interface (the list:
/// `src/model/kernels/README.md`); the executor's inference mode; and libtorch's op profiler.
fn build_cpu_shims(lib_dir: &Path) {
    // With OpenMP, as libtorch's `at::parallel_for` is inline and runs serially without it.
    // The libgomp it links resolves to the one libtorch already loaded (one per process).
    torch_shim_build(lib_dir)
        .flag("-fopenmp")
        .files(CPU_KERNELS.map(|kernel| format!("{KERNELS_DIR}/{kernel}")))
        .file(OP_PROFILER)
        .file(EXECUTOR)
        .include(KERNELS_DIR)
        .compile("qwencodec_cpu_kernels");
    println!("cargo::rustc-link-lib=gomp");
}

/// libtorch's CUDA graphs behind a C interface (tch does not wrap them).
fn build_graph_shim(lib_dir: &Path, cuda_include: &Path) {
    torch_shim_build(lib_dir)
        .file(CUDA_GRAPH)
        .include(cuda_include)
        .compile("qwencodec_cuda_graph");
    println!("cargo::rustc-cfg=cuda_graphs");
}
