//! This crate's own tests link libtorch through the plugin's library: they need its run-time
//! path to libtorch (the plugin's build script gives it to the plugin's own targets alone).

fn main() {
    let lib_dir = std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys gives its libtorch's lib folder");
    println!("cargo::rustc-link-arg=-Wl,-rpath,{lib_dir}");
}
