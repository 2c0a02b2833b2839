//! A part of the actor system (a folder of `actors/src` with actors: `session`, `queue`, `pool`,
//! `worker`, `transcribe`, `observe`) reaches another only through the messages
//! (`actors/src/messages/`) or what that part's root re-exports, never a module of its inside.

use super::{root, rust_files};
use std::path::Path;

const PARTS: [&str; 6] = ["session", "queue", "pool", "worker", "transcribe", "observe"];

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
