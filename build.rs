//! Builds what the server's tests load through the C ABI, from the reference backend's one
//! source (the backend host links the same source statically: `backends/host/build.rs`):
//!  - a shared library, so the `library` path is tested with identical behaviour,
//!  - a copy of it claiming ABI 2, for the loader's tests,
//!
//! and the C test program that drives that shared library through the header alone.
//! Their paths reach the code and tests as OMNI_REFERENCE_LIB and OMNI_ABI_TEST_BIN
//! (plus OMNI_REFERENCE_LIB_WRONG_ABI, a copy claiming ABI 2, for the loader's tests).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const HEADER: &str = "include/omni_backend.h";
const REFERENCE: &str = "backends/reference/reference_backend.c";
const ABI_TEST: &str = "tests/c/abi_test.c";

fn main() {
    for f in [HEADER, REFERENCE, ABI_TEST] {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));

    let compiler = cc::Build::new().get_compiler();
    let lib = out.join("libomni_reference.so");
    run(compiler
        .to_command()
        .args([
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-Iinclude",
            REFERENCE,
            "-lm",
            "-o",
        ])
        .arg(&lib));

    let wrong_abi = out.join("libomni_reference_abi2.so");
    run(compiler
        .to_command()
        .args([
            "-std=c11",
            "-O1",
            "-shared",
            "-fPIC",
            "-Iinclude",
            "-DOMNI_REFERENCE_CLAIMED_ABI=2",
            REFERENCE,
            "-lm",
            "-o",
        ])
        .arg(&wrong_abi));

    let abi_test = out.join("omni_abi_test");
    run(compiler
        .to_command()
        .args([
            "-std=c11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-Iinclude",
            ABI_TEST,
            "-ldl",
            "-lm",
            "-o",
        ])
        .arg(&abi_test));

    println!("cargo:rustc-env=OMNI_REFERENCE_LIB={}", lib.display());
    println!("cargo:rustc-env=OMNI_REFERENCE_LIB_WRONG_ABI={}", wrong_abi.display());
    println!("cargo:rustc-env=OMNI_ABI_TEST_BIN={}", abi_test.display());
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run the C compiler {:?}: {e}", cmd.get_program()));
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    assert!(status.success(), "C compiler failed: {} {}", cmd.get_program().to_string_lossy(), args.join(" "));
}
