//! `docs/architecture.md` is the newcomer's map of the tree; these tests keep its checkable
//! claims true:
//!
//! - every repository path it writes in backticks exists;
//! - each row of its "Where does it go" table names folders that exist, in the crate the row's
//!   kind of addition belongs to;
//! - its dependency list (the fenced `deps` block) is exactly what `cargo metadata` says;
//! - its actor table names every actor of the workspace, each where it is implemented;
//! - its messages table names every file of `actors/src/messages/` and types declared in it;
//! - its seam table names exactly the variants of `FromClient`, `ToClient` and `Notice`;
//! - a session's core runs no timer of its own, and its actor arms one.
//!
//! Each reader has a self-test on a bad input, so that a rule that reads nothing cannot pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{cargo_metadata, production_files, root, shown};

fn the_map() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).unwrap()
}

/// Code lines with their `//` comments dropped.
fn code(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// `text` without its fenced blocks.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut kept = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            kept.push(line);
        }
    }
    kept.join("\n")
}

/// The spans of `text` in backticks (outside fenced blocks).
fn backticked(text: &str) -> Vec<String> {
    prose(text).split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// A path in the map starts with one of these, or ends like a file or a folder.
const ROOTS: [&str; 14] = [
    "actors/",
    "dialects/",
    "transports/",
    "backends/",
    "tools/",
    "src/",
    "tests/",
    "include/",
    "docs/",
    "web/",
    "scripts/",
    "deploy/",
    "benches/",
    "examples/",
];
const ENDINGS: [&str; 6] = [".rs", ".h", ".c", ".toml", ".md", "/"];

/// The repository paths among the backticked spans of `text`.
fn repo_paths(text: &str) -> Vec<String> {
    backticked(text)
        .into_iter()
        .filter(|s| !s.contains(char::is_whitespace) && !s.contains("://") && !s.starts_with('/'))
        .filter(|s| {
            ROOTS.iter().any(|r| s.starts_with(*r)) || (s.contains('/') && ENDINGS.iter().any(|e| s.ends_with(*e)))
        })
        .collect()
}

/// The part of a path that must exist: up to a placeholder (`transports/src/<name>/` is
/// `transports/src/`).
fn existing_part(path: &str) -> &str {
    path.split('<').next().unwrap_or(path)
}

/// The paths of `paths` that are not in the tree under `base`.
fn missing(paths: &[String], base: &Path) -> Vec<String> {
    paths.iter().filter(|p| !base.join(existing_part(p)).exists()).cloned().collect()
}

#[test]
fn every_path_the_map_names_exists() {
    let paths = repo_paths(&the_map());
    assert!(paths.len() > 50, "only {} paths read from docs/architecture.md", paths.len());
    let gone = missing(&paths, &root());
    assert!(gone.is_empty(), "docs/architecture.md names paths that do not exist:\n{}", gone.join("\n"));
}

#[test]
fn the_path_reader_sees_a_stale_path() {
    let text = "The edge (`src/transport/websocket/`) and `actors/src/session/core/`, `transport/mod.rs`, \
                `transports/src/<name>/`, `omni_actors::edge`, `[cluster] engine`, `https://x/y/`, `/v1/realtime`.\n\
                ```deps\n`src/not/read/`\n```\n";
    let paths = repo_paths(text);
    assert_eq!(
        paths,
        ["src/transport/websocket/", "actors/src/session/core/", "transport/mod.rs", "transports/src/<name>/"]
    );
    assert_eq!(missing(&paths, &root()), ["src/transport/websocket/", "transport/mod.rs"]);
}

/// The lines of section `heading` (a `## ` heading), up to the next one.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let title = format!("## {heading}");
    text.lines().skip_while(|l| l.trim() != title).skip(1).take_while(|l| !l.starts_with("## ")).collect()
}

/// The rows of the first table in `lines`, as cells, without its header and separator.
fn table(lines: &[&str]) -> Vec<Vec<String>> {
    let rows: Vec<Vec<String>> = lines
        .iter()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split('|').collect();
            cells.iter().map(|c| c.trim().to_string()).collect()
        })
        .collect();
    rows.into_iter().skip(2).collect()
}

/// What the "Where does it go" table must say: a row for each kind of addition, each naming a
/// folder of the crate it lands in.
const LANDS_IN: [(&str, &str); 5] = [
    ("a transport", "transports/src/"),
    ("a dialect", "dialects/src/"),
    ("a backend", "backends/"),
    ("a store", "src/store/"),
    ("an actor", "actors/src/"),
];

/// What is wrong with the "Where does it go" table of `text`, its folders looked up under `base`.
fn where_problems(text: &str, base: &Path) -> Vec<String> {
    let rows = table(&section(text, "Where does it go"));
    let mut problems = Vec::new();
    for (kind, folder) in LANDS_IN {
        let Some(row) = rows.iter().find(|r| r[0] == kind) else {
            problems.push(format!("no row for {kind}"));
            continue;
        };
        let folders = row.get(2).map(|cell| backticked(cell)).unwrap_or_default();
        if folders.is_empty() {
            problems.push(format!("{kind}: no folder in the third column"));
        }
        for f in &folders {
            if !f.starts_with(folder) {
                problems.push(format!("{kind}: `{f}` is not under {folder}"));
            }
            if !base.join(existing_part(f)).is_dir() {
                problems.push(format!("{kind}: `{f}` is not a folder of the tree"));
            }
        }
    }
    problems
}

#[test]
fn each_row_of_where_does_it_go_names_a_folder_that_exists() {
    let problems = where_problems(&the_map(), &root());
    assert!(problems.is_empty(), "docs/architecture.md, \"Where does it go\":\n{}", problems.join("\n"));
}

#[test]
fn the_where_table_reader_sees_a_wrong_folder_and_a_missing_row() {
    let text = "## Where does it go\n\n| to add | crate | folder | more |\n|---|---|---|---|\n\
                | a transport | x | `transports/src/<name>/` | |\n\
                | a dialect | x | `src/dialect/<name>` | |\n\
                | a backend | x | `backends/<name>/` or `backends/host/src/` | |\n\
                | an actor | x | `actors/src/<part>/` and `actors/src/messages/` | |\n\n## Next\n";
    let problems = where_problems(text, &root());
    assert_eq!(
        problems,
        [
            "a dialect: `src/dialect/<name>` is not under dialects/src/",
            "a dialect: `src/dialect/<name>` is not a folder of the tree",
            "no row for a store",
        ]
    );
}

/// A crate and the workspace crates it depends on.
type Deps = BTreeMap<String, BTreeSet<String>>;

/// The map's fenced `deps` block: `crate -> a, b` or `crate -> (none)`, one line a crate.
fn documented_deps(text: &str) -> Result<Deps, String> {
    let mut lines = text.lines().skip_while(|l| l.trim() != "```deps");
    if lines.next().is_none() {
        return Err("no ```deps block".into());
    }
    let mut deps = Deps::new();
    for line in lines.take_while(|l| l.trim() != "```") {
        let (from, to) = line.split_once("->").ok_or_else(|| format!("not `crate -> crates`: {line}"))?;
        let from = from.trim();
        if from.is_empty() || from.contains(char::is_whitespace) {
            return Err(format!("not one crate before the arrow: {line}"));
        }
        let to = to.trim();
        let uses: BTreeSet<String> =
            if to == "(none)" { BTreeSet::new() } else { to.split(',').map(|c| c.trim().to_string()).collect() };
        if uses.iter().any(|c| c.is_empty() || c.contains(char::is_whitespace)) {
            return Err(format!("not a list of crates after the arrow: {line}"));
        }
        if deps.insert(from.to_string(), uses).is_some() {
            return Err(format!("{from} listed twice"));
        }
    }
    if deps.is_empty() {
        return Err("an empty ```deps block".into());
    }
    Ok(deps)
}

/// Each workspace crate and the workspace crates it depends on (normal, build and dev), from
/// `cargo metadata --no-deps --format-version 1`.
fn workspace_deps(metadata: &serde_json::Value) -> Deps {
    let packages = metadata["packages"].as_array().expect("cargo metadata lists packages");
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut deps = Deps::new();
    for p in packages {
        let uses = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["name"].as_str())
            .filter(|d| names.contains(d))
            .map(str::to_string)
            .collect();
        deps.insert(p["name"].as_str().unwrap_or_default().to_string(), uses);
    }
    deps
}

/// Where the map and the workspace disagree.
fn deps_problems(documented: &Deps, actual: &Deps) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, uses) in actual {
        let Some(listed) = documented.get(name) else {
            problems.push(format!("{name}: a workspace crate the map does not list"));
            continue;
        };
        for used in uses.difference(listed) {
            problems.push(format!("{name} -> {used}: in Cargo.toml, not in the map"));
        }
        for used in listed.difference(uses) {
            problems.push(format!("{name} -> {used}: in the map, not in Cargo.toml"));
        }
    }
    for name in documented.keys().filter(|n| !actual.contains_key(*n)) {
        problems.push(format!("{name}: in the map, not a workspace crate"));
    }
    problems
}

#[test]
fn the_maps_dependency_list_is_what_cargo_says() {
    let documented = documented_deps(&the_map()).unwrap_or_else(|e| panic!("docs/architecture.md: {e}"));
    let actual = workspace_deps(&cargo_metadata());
    assert!(actual.len() >= 10 && actual.contains_key("omni-actors"), "cargo metadata saw {:?}", actual.keys());
    let problems = deps_problems(&documented, &actual);
    assert!(problems.is_empty(), "docs/architecture.md's deps block is not the workspace's:\n{}", problems.join("\n"));
}

#[test]
fn the_dependency_reader_refuses_a_bad_line_and_sees_each_difference() {
    assert!(documented_deps("no block here").is_err());
    assert!(documented_deps("```deps\nomni-a omni-b\n```").is_err());
    assert!(documented_deps("```deps\nomni-a -> omni-b,\n```").is_err());
    assert!(documented_deps("```deps\nomni-a -> (none)\nomni-a -> omni-b\n```").is_err());
    let documented = documented_deps("```deps\nomni-a -> omni-b\nomni-b -> (none)\nomni-gone -> (none)\n```").unwrap();
    let metadata = serde_json::json!({"packages": [
        {"name": "omni-a", "dependencies": [{"name": "omni-c", "kind": null}, {"name": "serde", "kind": null}]},
        {"name": "omni-b", "dependencies": []},
        {"name": "omni-c", "dependencies": [{"name": "omni-b", "kind": "dev"}]}
    ]});
    let actual = workspace_deps(&metadata);
    assert_eq!(
        deps_problems(&documented, &actual),
        [
            "omni-a -> omni-c: in Cargo.toml, not in the map",
            "omni-a -> omni-b: in the map, not in Cargo.toml",
            "omni-c: a workspace crate the map does not list",
            "omni-gone: in the map, not a workspace crate",
        ]
    );
}

/// `text` without its inline test module (`#[cfg(test)]` then `mod tests {`).
fn without_tests(text: &str) -> &str {
    let cut = text.find("#[cfg(test)]\nmod tests {").unwrap_or(text.len());
    &text[..cut]
}

/// The types `text` implements `Actor` for: `impl Actor for X`, `impl<C: T> Actor for X<C>`,
/// `impl actix::Actor for X` (comments not read).
fn actor_impls(text: &str) -> Vec<String> {
    let text = code(text);
    let mut found = Vec::new();
    for (at, needle) in text.match_indices("Actor for ") {
        if !text[..at].ends_with([' ', ':']) {
            continue;
        }
        let rest = &text[at + needle.len()..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

/// The crates' source folders whose actors the map lists.
const SOURCES: [&str; 6] = ["actors/src", "dialects/src", "transports/src", "backends/host/src", "tools/src", "src"];

/// Every actor of the workspace's production code, with its file.
fn workspace_actors() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for dir in SOURCES {
        for file in production_files(&root().join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for name in actor_impls(without_tests(&text)) {
                found.push((name, shown(&file)));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The map's actor table: each actor's name and file.
fn documented_actors(text: &str) -> Vec<(String, String)> {
    table(&section(text, "The actors"))
        .iter()
        .map(|row| {
            let name = row[0].trim_matches('`').to_string();
            let file = row.get(1).map(|c| c.trim_matches('`').to_string()).unwrap_or_default();
            (name, file)
        })
        .collect()
}

/// Where the actor table and the code disagree.
fn actor_problems(documented: &[(String, String)], actual: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, file) in documented {
        if !actual.iter().any(|(n, f)| n == name && f == file) {
            problems.push(format!("{name}: no `impl Actor for {name}` in {file}"));
        }
    }
    for (name, file) in actual {
        if !documented.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name} ({file}): an actor the map does not list"));
        }
    }
    problems
}

#[test]
fn the_actor_table_lists_every_actor_where_it_is() {
    let documented = documented_actors(&the_map());
    let actual = workspace_actors();
    assert!(actual.iter().any(|(n, _)| n == "SessionActor"), "actors read: {actual:?}");
    let problems = actor_problems(&documented, &actual);
    assert!(problems.is_empty(), "docs/architecture.md, \"The actors\":\n{}", problems.join("\n"));
}

#[test]
fn the_actor_reader_sees_impls_and_the_table_reader_sees_gaps() {
    let text = "impl Actor for Foo {}\nimpl<C: Carried> Actor for Bar<C> {}\nimpl actix::Actor for Baz {}\n\
                impl Handler<M> for QuxActor {}\nimpl MyActor for Quux {}\n// impl Actor for Commented {}\n\
                #[cfg(test)]\nmod tests {\n    impl Actor for Stand {}\n}\n";
    assert_eq!(actor_impls(without_tests(text)), ["Foo", "Bar", "Baz"]);
    let doc = "## The actors\n\n| actor | file | owns |\n|---|---|---|\n\
               | `Foo` | `a/foo.rs` | x |\n| `Gone` | `a/gone.rs` | x |\n\n## Next\n";
    let documented = documented_actors(doc);
    let actual = [("Foo".to_string(), "a/foo.rs".to_string()), ("Bar".to_string(), "a/bar.rs".to_string())];
    assert_eq!(
        actor_problems(&documented, &actual),
        ["Gone: no `impl Actor for Gone` in a/gone.rs", "Bar (a/bar.rs): an actor the map does not list"]
    );
}

/// Whether `text` declares a type `name` (`struct`, `enum` or `type`).
fn declares(text: &str, name: &str) -> bool {
    let text = code(text);
    ["struct ", "enum ", "type "].iter().any(|kw| {
        let needle = format!("{kw}{name}");
        text.match_indices(&needle).any(|(at, _)| {
            let before_ok = at == 0 || text[..at].ends_with([' ', '\n']);
            let after = text[at + needle.len()..].chars().next();
            before_ok && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

/// The map's messages table: each file and the types it names.
fn documented_messages(text: &str) -> Vec<(String, Vec<String>)> {
    table(&section(text, "The messages"))
        .iter()
        .map(|row| {
            let file = row[0].trim_matches('`').to_string();
            let types = row.get(2).map(|c| backticked(c)).unwrap_or_default();
            (file, types)
        })
        .collect()
}

/// Where the messages table and the code under `base` disagree.
fn message_problems(documented: &[(String, Vec<String>)], base: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = base.join("actors/src/messages");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| format!("actors/src/messages/{}", e.file_name().to_string_lossy()))
        .filter(|f| f.ends_with(".rs") && !f.ends_with("/mod.rs"))
        .collect();
    files.sort();
    for f in files.iter().filter(|f| !documented.iter().any(|(d, _)| d == *f)) {
        problems.push(format!("{f}: not in the map's messages table"));
    }
    for (file, types) in documented {
        let Ok(text) = std::fs::read_to_string(base.join(file)) else {
            problems.push(format!("{file}: no such file"));
            continue;
        };
        for t in types.iter().filter(|t| !declares(&text, t)) {
            problems.push(format!("{file}: declares no `{t}`"));
        }
    }
    problems
}

#[test]
fn the_messages_table_names_each_file_and_what_it_declares() {
    let documented = documented_messages(&the_map());
    assert!(documented.iter().map(|(_, t)| t.len()).sum::<usize>() > 20, "read: {documented:?}");
    let problems = message_problems(&documented, &root());
    assert!(problems.is_empty(), "docs/architecture.md, \"The messages\":\n{}", problems.join("\n"));
}

#[test]
fn the_messages_reader_sees_a_missing_file_and_a_wrong_type() {
    assert!(declares("pub struct Join {", "Join"));
    assert!(declares("pub type StartWorker = Arc<dyn Fn()>;", "StartWorker"));
    assert!(!declares("pub struct Joined {", "Join"));
    assert!(!declares("// pub struct Join {", "Join"));
    let text = "## The messages\n\n| file | between | types |\n|---|---|---|\n\
                | `actors/src/messages/queue.rs` | x | `Join`, `Joins` |\n\n## Next\n";
    let problems = message_problems(&documented_messages(text), &root());
    assert!(problems.contains(&"actors/src/messages/queue.rs: declares no `Joins`".to_string()), "{problems:?}");
    assert!(!problems.iter().any(|p| p.contains("`Join`")), "{problems:?}");
    assert!(problems.contains(&"actors/src/messages/worker.rs: not in the map's messages table".to_string()));
}

/// The enums of the seam whose variants the map names, all of them.
const SEAM: [&str; 3] = ["FromClient", "ToClient", "Notice"];

/// The variants of `pub enum name` in `text`: the names its body's lines at one indent start with.
fn enum_variants(text: &str, name: &str) -> Result<BTreeSet<String>, String> {
    let head = format!("pub enum {name} {{");
    let body = text.split_once(&head).ok_or_else(|| format!("no `{head}`"))?.1;
    let body = body.split("\n}").next().unwrap_or("");
    let variants: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| l.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .collect();
    if variants.is_empty() {
        return Err(format!("`{name}` has no variants read"));
    }
    Ok(variants)
}

/// The variants of `name` the map writes in backticks (`FromClient::Text`, ...).
fn documented_variants(text: &str, name: &str) -> BTreeSet<String> {
    let prefix = format!("{name}::");
    backticked(text)
        .iter()
        .filter_map(|s| s.strip_prefix(&prefix))
        .map(|rest| rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .collect()
}

/// Where the map's and the code's variants of `name` differ.
fn variant_problems(name: &str, documented: &BTreeSet<String>, actual: &BTreeSet<String>) -> Vec<String> {
    let mut problems: Vec<String> =
        actual.difference(documented).map(|v| format!("{name}::{v}: in the code, not in the map")).collect();
    problems.extend(documented.difference(actual).map(|v| format!("{name}::{v}: in the map, not in the code")));
    problems
}

#[test]
fn the_seam_table_names_every_variant_of_the_seam() {
    let (map, client) = (the_map(), std::fs::read_to_string(root().join("actors/src/edge/client.rs")).unwrap());
    let mut problems = Vec::new();
    for name in SEAM {
        let actual = enum_variants(&client, name).unwrap_or_else(|e| panic!("actors/src/edge/client.rs: {e}"));
        problems.extend(variant_problems(name, &documented_variants(&map, name), &actual));
    }
    assert!(problems.is_empty(), "docs/architecture.md, the seam:\n{}", problems.join("\n"));
}

#[test]
fn the_variant_reader_sees_a_variant_the_map_lacks_and_one_it_invents() {
    let text = "/// What the edge hands.\npub enum FromClient {\n    /// Text.\n    Text(ByteString),\n    \
                #[allow(x)]\n    Ended(CloseReason),\n    Lost {\n        reason: CloseReason,\n    },\n}\n";
    let actual = enum_variants(text, "FromClient").unwrap();
    assert_eq!(actual.iter().map(String::as_str).collect::<Vec<_>>(), ["Ended", "Lost", "Text"]);
    assert!(enum_variants(text, "ToClient").is_err());
    let named = "`FromClient::Text`, `FromClient::Ended`, `FromClient::Gone(x)`";
    let documented = documented_variants(named, "FromClient");
    assert_eq!(
        variant_problems("FromClient", &documented, &actual),
        ["FromClient::Lost: in the code, not in the map", "FromClient::Gone: in the map, not in the code"]
    );
}

/// The calls that arm an actix timer in `text` (comments not read).
fn timer_calls(text: &str) -> usize {
    let text = code(text);
    ["run_later(", "run_interval(", "notify_later("].iter().map(|call| text.matches(call).count()).sum()
}

#[test]
fn a_sessions_core_has_no_runtime_and_its_actor_arms_one_timer() {
    let dir = root().join("actors/src/session");
    let mut problems = Vec::new();
    for file in production_files(&dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        let text = without_tests(&text);
        let in_core = file.starts_with(dir.join("core"));
        if in_core && code(text).contains("actix") {
            problems.push(format!("{}: the core names actix", shown(&file)));
        }
        let expected = usize::from(file == dir.join("mod.rs"));
        if timer_calls(text) != expected {
            problems.push(format!("{}: {} timer calls, not {expected}", shown(&file), timer_calls(text)));
        }
    }
    assert!(problems.is_empty(), "docs/architecture.md, \"A session's one brain\":\n{}", problems.join("\n"));
}

#[test]
fn the_timer_reader_counts_calls_not_comments() {
    assert_eq!(timer_calls("let h = ctx.run_later(d, f); // not ctx.run_interval(d, f)"), 1);
    assert_eq!(timer_calls("ctx.run_interval(d, f);\nctx.notify_later(m, d);"), 2);
    assert_eq!(timer_calls("fn deadline(&self) -> Option<Instant>"), 0);
}
