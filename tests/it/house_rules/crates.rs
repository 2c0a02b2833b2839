//! Dependencies point one way, toward the actors crate: the actors crate and the leaf libraries
//! depend on no crate of the workspace; the crates around the actors (dialects, transports, the
//! backend host, the tools) on the actors crate and the leaves only, never on each other or on
//! the server; a backend library on the leaves only; the server crate composes them all. And no
//! crate has an import cycle between its top-level modules.

use super::{parse, production_files, shown, test_only, workspace};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use syn::visit::Visit;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Role {
    /// A library the others link, depending on nothing here: the ABI, the ASR client, the VAD.
    Leaf,
    /// The actor system on domain types, and the traits at its edges.
    Actors,
    /// Around the actors: it plugs into their traits.
    Edge,
    /// A backend behind the C ABI, built as its own library.
    Backend,
    /// The composition: config, routes, roles, store, `main`.
    Server,
}

/// Every crate of the workspace and its role: a new crate is placed here first.
const ROLES: &[(&str, Role)] = &[
    ("omni-actors", Role::Actors),
    ("omni-backend-abi", Role::Leaf),
    ("omni-asr-client", Role::Leaf),
    ("omni-vad-silero", Role::Leaf),
    ("omni-asr-whisper", Role::Leaf),
    ("omni-dialects", Role::Edge),
    ("omni-transports", Role::Edge),
    ("omni-backend-host", Role::Edge),
    ("omni-tools", Role::Edge),
    ("omni-cascade", Role::Backend),
    ("omni-gateway", Role::Server),
];

fn may_use(from: Role, to: Role) -> bool {
    match from {
        Role::Leaf | Role::Actors => false,
        Role::Edge => matches!(to, Role::Actors | Role::Leaf),
        Role::Backend => to == Role::Leaf,
        Role::Server => to != Role::Server,
    }
}

/// The dependencies that break the rule, as `from -> to (roles)`.
fn wrong_way(crates: &[(String, Vec<String>)]) -> Vec<String> {
    let role = |name: &str| ROLES.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
    let mut wrong = Vec::new();
    for (name, uses) in crates {
        let Some(from) = role(name) else {
            wrong.push(format!("{name}: not in ROLES (give the new crate its place)"));
            continue;
        };
        for used in uses {
            match role(used) {
                Some(to) if may_use(from, to) => {}
                to => wrong.push(format!("{name} ({from:?}) -> {used} ({to:?})")),
            }
        }
    }
    wrong
}

#[test]
fn dependencies_point_toward_the_actors_crate() {
    let crates: Vec<(String, Vec<String>)> = workspace().into_iter().map(|p| (p.name, p.uses)).collect();
    assert!(crates.len() >= ROLES.len(), "cargo metadata saw {} crates", crates.len());
    let wrong = wrong_way(&crates);
    assert!(wrong.is_empty(), "dependencies pointing the wrong way:\n{}", wrong.join("\n"));
}

#[test]
fn the_dependency_rule_refuses_an_edge_on_an_edge_and_the_actors_on_anything() {
    let crates = |from: &str, to: &str| vec![(from.to_string(), vec![to.to_string()])];
    assert!(wrong_way(&crates("omni-dialects", "omni-actors")).is_empty());
    assert!(wrong_way(&crates("omni-gateway", "omni-transports")).is_empty());
    assert_eq!(wrong_way(&crates("omni-transports", "omni-dialects")).len(), 1);
    assert_eq!(wrong_way(&crates("omni-actors", "omni-backend-abi")).len(), 1);
    assert_eq!(wrong_way(&crates("omni-cascade", "omni-actors")).len(), 1);
    assert_eq!(wrong_way(&crates("omni-new", "omni-actors")).len(), 1, "an unplaced crate");
}

/// The top-level modules a crate's files name: `from -> {to: where}`.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// Reads which top-level module each file of `src` reaches (`crate::x`, `super::...::x`).
fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for file in production_files(src) {
        let rel = file.strip_prefix(src).unwrap();
        let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let last = module.pop().unwrap();
        if module.is_empty() && (last == "lib.rs" || last == "main.rs") {
            continue;
        }
        if last != "mod.rs" {
            module.push(last.trim_end_matches(".rs").to_string());
        }
        let mut reader = Reach { module, found: BTreeSet::new() };
        reader.visit_file(&parse(&file));
        let from = reader.module[0].clone();
        for to in reader.found {
            if to != from {
                graph.entry(from.clone()).or_default().entry(to).or_insert_with(|| shown(&file));
            }
        }
    }
    graph
}

/// Collects the top-level modules named by paths, from inside `module`.
struct Reach {
    module: Vec<String>,
    found: BTreeSet<String>,
}

impl Reach {
    fn path(&mut self, segments: &[String]) {
        let top = match segments.first().map(String::as_str) {
            Some("crate") => segments.get(1).cloned(),
            Some("super") => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let kept = self.module.len().saturating_sub(ups);
                if kept > 0 { Some(self.module[0].clone()) } else { segments.get(ups).cloned() }
            }
            _ => None,
        };
        if let Some(top) = top.filter(|t| t != "self" && t != "super") {
            self.found.insert(top);
        }
    }
}

fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, out)),
    }
}

impl<'a> Visit<'a> for Reach {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if test_only(&m.attrs) {
            return;
        }
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        paths.iter().for_each(|p| self.path(p));
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(&segments);
        syn::visit::visit_path(self, p);
    }
}

/// A cycle through `graph`, as the modules and the file naming each step.
fn a_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn walk(graph: &Graph, at: &str, trail: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(start) = trail.iter().position(|m| m == at) {
            let mut cycle: Vec<String> = trail[start..].to_vec();
            cycle.push(at.to_string());
            return Some(cycle);
        }
        if !done.insert(at.to_string()) {
            return None;
        }
        trail.push(at.to_string());
        for to in graph.get(at).into_iter().flat_map(|t| t.keys()) {
            if let Some(cycle) = walk(graph, to, trail, done) {
                return Some(cycle);
            }
        }
        trail.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| walk(graph, m, &mut Vec::new(), &mut done))
}

fn described(graph: &Graph, cycle: &[String]) -> String {
    cycle.windows(2).map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]])).collect::<Vec<_>>().join("\n")
}

#[test]
fn no_crate_has_an_import_cycle_between_its_top_level_modules() {
    let mut cycles = Vec::new();
    let mut modules = 0;
    for package in workspace() {
        let graph = module_graph(&package.src);
        modules += graph.len();
        if let Some(cycle) = a_cycle(&graph) {
            cycles.push(format!("{}:\n{}", package.name, described(&graph, &cycle)));
        }
    }
    assert!(modules > 30, "the rule read {modules} modules that import others");
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n\n"));
}

#[test]
fn the_cycle_rule_follows_crate_and_super_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b/inner")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{c, b::inner::Thing};").unwrap();
    std::fs::write(src.join("b/mod.rs"), "mod inner;").unwrap();
    std::fs::write(src.join("b/inner/mod.rs"), "fn f() { super::super::a::g() }").unwrap();
    std::fs::write(src.join("c.rs"), "#[cfg(test)] mod tests { use crate::a; }").unwrap();
    let graph = module_graph(src);
    assert_eq!(graph["a"].keys().collect::<Vec<_>>(), ["b", "c"]);
    assert!(!graph.contains_key("c"), "a test module is not a dependency");
    let cycle = a_cycle(&graph).expect("a -> b -> a");
    assert_eq!(cycle.len(), 3, "{cycle:?}");
    std::fs::write(src.join("b/inner/mod.rs"), "fn f() { super::g() }").unwrap();
    assert!(a_cycle(&module_graph(src)).is_none());
}
