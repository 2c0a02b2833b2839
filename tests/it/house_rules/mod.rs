//! The house rules over the whole tree (`src/`, `actors/`, `dialects/`, `transports/`,
//! `backends/`, `tools/`), kept by tests rather than by memory. Each rule reads the source as
//! the compiler does (`syn`) or the workspace as cargo does (`cargo metadata`), names what breaks
//! it, and carries a self-test showing it can fail.
//!
//! - [`crates`]: dependencies point toward the actors crate; no import cycle between the
//!   top-level modules of any crate.
//! - [`parts`]: a part of the actor system reaches another only through its messages or surface.
//! - [`sizes`]: production files of at most 800 lines, functions of at most 120, with named
//!   exceptions.
//! - [`surface`]: no `String` for an error in a public signature; no process global beyond a
//!   named list; no two public types of one name in a crate; no dialect event name in a transport.
//! - [`map`]: docs/architecture.md's checkable claims.

mod crates;
mod map;
mod parts;
mod sizes;
mod surface;

use std::path::{Path, PathBuf};

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// A workspace crate as `cargo metadata` describes it.
pub(crate) struct Package {
    pub(crate) name: String,
    /// The folder of its library (or binary) root: `src/`, `actors/src/`, ...
    pub(crate) src: PathBuf,
    /// The workspace crates it depends on to build (not its dev- or build-dependencies).
    pub(crate) uses: Vec<String>,
}

/// What `cargo metadata` says of the workspace's own crates.
pub(crate) fn cargo_metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata answers JSON")
}

/// The workspace's crates, read with `cargo metadata`.
pub(crate) fn workspace() -> Vec<Package> {
    let meta = cargo_metadata();
    let packages = meta["packages"].as_array().unwrap();
    let names: Vec<String> = packages.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    packages
        .iter()
        .map(|p| {
            let targets = p["targets"].as_array().unwrap();
            let kinds =
                |t: &serde_json::Value| t["kind"].as_array().unwrap().iter().map(|k| k.to_string()).collect::<String>();
            let main = targets
                .iter()
                .find(|t| kinds(t).contains("lib"))
                .or_else(|| targets.iter().find(|t| kinds(t).contains("bin")))
                .unwrap();
            let src = Path::new(main["src_path"].as_str().unwrap()).parent().unwrap().to_path_buf();
            let uses = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null() && names.iter().any(|n| n == d["name"].as_str().unwrap()))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect();
            Package { name: p["name"].as_str().unwrap().to_string(), src, uses }
        })
        .collect()
}

/// A file of production code: not a `tests.rs`, not under a `tests/` folder.
pub(crate) fn production_files(src: &Path) -> Vec<PathBuf> {
    rust_files(src)
        .into_iter()
        .filter(|f| {
            let rel = f.strip_prefix(src).unwrap();
            f.file_name().is_some_and(|n| n != "tests.rs") && !rel.components().any(|c| c.as_os_str() == "tests")
        })
        .collect()
}

/// A file parsed as the compiler reads it.
pub(crate) fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether an item only exists in tests (`#[cfg(test)]`, `#[test]`).
pub(crate) fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        (a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
            || a.path().is_ident("test")
    })
}

/// `path` relative to the repository, for messages.
pub(crate) fn shown(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}
