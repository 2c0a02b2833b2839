//! Builds the reference backend (`backends/reference/reference_backend.c`) statically into the
//! host, with its entry points renamed: `backend = "builtin"`, the default, needs no library.
//! With it, the ABI's layout probe (`backends/abi_layout.c`), which the host's tests hold the
//! Rust mirror of the header against. (The server's build makes the same source a shared
//! library too, for the tests of the `library` path.)

const HEADER: &str = "../../include/omni_backend.h";
const REFERENCE: &str = "../reference/reference_backend.c";
const LAYOUT: &str = "../abi_layout.c";

fn main() {
    for f in [HEADER, REFERENCE, LAYOUT] {
        println!("cargo:rerun-if-changed={f}");
    }
    cc::Build::new()
        .file(REFERENCE)
        .file(LAYOUT)
        .include("../../include")
        .define("OMNI_REFERENCE_STATIC", None)
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("omni_reference");
    println!("cargo:rustc-link-lib=m");
}
