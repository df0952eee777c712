//! The server links libtorch through the plugin's library: it needs the plugin's run-time path to
//! libtorch and, with a CUDA build of libtorch, its CUDA libraries kept (link arguments of the
//! plugin's build script reach only the plugin's own targets).

use std::path::PathBuf;

fn main() {
    let lib_dir = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys gives its libtorch's lib folder"),
    );
    println!("cargo::rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    if lib_dir.join("libtorch_cuda.so").exists() {
        // Nothing calls into libtorch_cuda directly, and libtorch sees a GPU only when it loads.
        println!("cargo::rustc-link-arg=-Wl,--push-state,--no-as-needed,-ltorch_cuda,-lc10_cuda,--pop-state");
    }
}
