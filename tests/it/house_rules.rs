//! The house rules, kept by a test rather than by memory (the compiler keeps the others:
//! `unreachable_pub` for the workspace, `missing_docs` for the actors crate):
//!
//! - a part of the actor system (a folder of `actors/src` with actors: `session`, `queue`,
//!   `pool`, `worker`, `transcribe`, `observe`) reaches another only through that part's
//!   `messages` or what its root re-exports, never a module of its inside;
//! - no public signature says an error is just a `String` (a typed error names its cases), and
//!   the few private ones left stay few.

use std::path::{Path, PathBuf};

const PARTS: [&str; 6] = ["session", "queue", "pool", "worker", "transcribe", "observe"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
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

/// The modules inside a part (its files and folders), which other parts may not name.
fn inner_modules(part: &str) -> Vec<String> {
    let dir = root().join("actors/src").join(part);
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_suffix(".rs").unwrap_or(&name).to_string();
            (stem != "mod" && stem != "messages").then_some(stem)
        })
        .collect()
}

/// Code lines (comments dropped), joined so that a `use` spanning lines is one.
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every path into `part` that `text` names: what follows `crate::PART::`, with a brace group
/// split into its members.
fn paths_into(text: &str, part: &str) -> Vec<String> {
    let needle = format!("crate::{part}::");
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        rest = &rest[at + needle.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            found.extend(group[..end].split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()));
        } else {
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            found.push(rest[..end].to_string());
        }
    }
    found
}

/// Where `text` reaches inside another part than `own`: the path named.
fn reaches_inside(text: &str, own: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for other in PARTS.iter().filter(|p| **p != own) {
        let inner = inner_modules(other);
        for path in paths_into(text, other) {
            let first = path.split("::").next().unwrap_or("");
            if inner.iter().any(|m| m == first) && path.contains("::") {
                bad.push(format!("crate::{other}::{path}"));
            }
        }
    }
    bad
}

#[test]
fn a_part_reaches_another_only_through_its_messages_or_its_surface() {
    let mut violations = Vec::new();
    for part in PARTS {
        for file in rust_files(&root().join("actors/src").join(part)) {
            for path in reaches_inside(&code(&file), part) {
                violations.push(format!("{}: {path}", file.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(violations.is_empty(), "parts reaching inside other parts:\n{}", violations.join("\n"));
}

#[test]
fn the_rule_sees_a_reach_inside_and_lets_messages_and_the_surface_pass() {
    let own = "session";
    assert_eq!(reaches_inside("use crate::queue::state::TicketStatus;", own), ["crate::queue::state::TicketStatus"]);
    assert_eq!(
        reaches_inside("use crate::worker::{messages::Attach, thread::Job};", own),
        ["crate::worker::thread::Job"]
    );
    assert!(reaches_inside("use crate::queue::messages::{Join, Leave};", own).is_empty());
    assert!(reaches_inside("use crate::worker::{BackendFactory, Opener};", own).is_empty());
    assert!(reaches_inside("use crate::observe::metrics;", own).is_empty(), "a function re-exported at the root");
    assert!(reaches_inside("use crate::session::flow::Flow;", own).is_empty(), "its own inside");
}

/// Signatures (pub or not) whose error type is a bare `String`, with whether they are public.
fn string_errors(file: &Path) -> Vec<(bool, String)> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut found = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with("//") {
            continue;
        }
        if let Some(at) = l.find("Result<") {
            let ty = &l[at..];
            // The error parameter: after the top-level comma of `Result<T, E>`.
            let (mut depth, mut comma) = (0i32, None);
            for (i, c) in ty.char_indices() {
                match c {
                    '<' => depth += 1,
                    '>' => {
                        depth -= 1;
                        if depth == 0 {
                            if let Some(comma) = comma
                                && ty[comma + 1..i].trim() == "String"
                            {
                                found.push((l.starts_with("pub ") && !l.starts_with("pub("), l.to_string()));
                            }
                            break;
                        }
                    }
                    ',' if depth == 1 => comma = Some(i),
                    _ => {}
                }
            }
        }
    }
    found
}

#[test]
fn no_public_signature_has_a_string_for_an_error_and_few_private_ones_do() {
    let mut public = Vec::new();
    let mut all = 0;
    for dir in ["src", "actors/src", "dialects/src", "transports/src", "backends/host/src"] {
        for file in rust_files(&root().join(dir)) {
            for (is_pub, line) in string_errors(&file) {
                all += 1;
                if is_pub {
                    public.push(format!("{}: {line}", file.strip_prefix(root()).unwrap().display()));
                }
            }
        }
    }
    assert!(public.is_empty(), "public signatures with String errors:\n{}", public.join("\n"));
    assert!(all < 10, "{all} signatures with String errors: type them");
}

#[test]
fn the_error_rule_reads_the_error_parameter_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "pub fn a() -> Result<(), String> {}\nfn b() -> Result<Vec<u8>, String> {}\n\
         pub fn c() -> Result<HashMap<String, String>, Error> {}\n// pub fn d() -> Result<(), String>\n\
         pub(crate) fn e() -> Result<String, Box<String>> {}\n",
    )
    .unwrap();
    let found: Vec<bool> = string_errors(&file).into_iter().map(|(public, _)| public).collect();
    assert_eq!(found, [true, false], "a public one and a private one; the rest are not String errors");
}
