fn main() {
    gst_plugin_version_helper::info();

    // Let the plugin (and the tests) find libtorch at run time without LD_LIBRARY_PATH:
    // torch-sys tells its dependents where the libraries it linked live.
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
