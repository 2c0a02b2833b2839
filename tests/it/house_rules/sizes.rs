//! Files of production code of at most 800 lines and functions of at most 120, over every crate
//! of the workspace (tests, in `tests.rs` files, `tests/` folders and `#[cfg(test)]` modules, are
//! not counted). The exceptions are few and named, each with its reason; an exception that is
//! no longer needed fails the test too, so the list stays true.

use super::{parse, production_files, shown, test_only, workspace};
use std::path::Path;
use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_FILE: usize = 800;
const MAX_FN: usize = 120;

/// Functions allowed past [`MAX_FN`]: (file, function, why).
const LONG_FNS: &[(&str, &str, &str)] = &[
    (
        "actors/src/observe/metrics.rs",
        "Metrics::new",
        "a table: one registration per metric, with its name and help; split, it reads worse",
    ),
    (
        "dialects/src/openai/encode.rs",
        "Encoder::encode",
        "one match arm per event the dialect writes, each a few lines: the protocol's own list",
    ),
];

/// Files allowed past [`MAX_FILE`]: (file, why).
const LONG_FILES: &[(&str, &str)] = &[];

/// The lines of `file` outside test-only items.
fn production_lines(file: &Path) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    let tests: usize = parse(file)
        .items
        .iter()
        .filter(|i| match i {
            syn::Item::Mod(m) => test_only(&m.attrs),
            syn::Item::Fn(f) => test_only(&f.attrs),
            _ => false,
        })
        .map(|i| i.span().end().line - i.span().start().line + 1)
        .sum();
    text.lines().count() - tests
}

/// Every function of production code in `file`, with its length in lines (from `fn` to its
/// closing brace): `(name, lines)`, a method named `Type::name`.
fn functions(file: &Path) -> Vec<(String, usize)> {
    let mut reader = Functions { owner: None, found: Vec::new() };
    reader.visit_file(&parse(file));
    reader.found
}

struct Functions {
    owner: Option<String>,
    found: Vec<(String, usize)>,
}

impl Functions {
    fn record(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let lines = block.brace_token.span.close().end().line - sig.fn_token.span.start().line + 1;
        let name = match &self.owner {
            Some(owner) => format!("{owner}::{}", sig.ident),
            None => sig.ident.to_string(),
        };
        self.found.push((name, lines));
    }
}

impl<'a> Visit<'a> for Functions {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !test_only(&f.attrs) {
            self.record(&f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        let owner = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.owner, owner);
        syn::visit::visit_item_impl(self, i);
        self.owner = outer;
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !test_only(&f.attrs) {
            self.record(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn production_files_and_functions_stay_short() {
    let mut long = Vec::new();
    let mut used_fns = Vec::new();
    let mut used_files = Vec::new();
    let mut counted = 0;
    for package in workspace() {
        for file in production_files(&package.src) {
            let at = shown(&file);
            let lines = production_lines(&file);
            match LONG_FILES.iter().find(|(f, _)| *f == at) {
                Some(_) => used_files.push((at.clone(), lines > MAX_FILE)),
                None if lines > MAX_FILE => long.push(format!("{at}: {lines} lines (at most {MAX_FILE})")),
                None => {}
            }
            for (name, lines) in functions(&file) {
                counted += 1;
                match LONG_FNS.iter().find(|(f, n, _)| *f == at && *n == name) {
                    Some(_) => used_fns.push((format!("{at}: {name}"), lines > MAX_FN)),
                    None if lines > MAX_FN => long.push(format!("{at}: fn {name}: {lines} lines (at most {MAX_FN})")),
                    None => {}
                }
            }
        }
    }
    assert!(counted > 2000, "read {counted} functions");
    let mut problems = long;
    for (what, needed) in used_fns.iter().chain(&used_files) {
        if !needed {
            problems.push(format!("{what}: an exception no longer needed (remove it)"));
        }
    }
    for (file, name, _) in LONG_FNS {
        if !used_fns.iter().any(|(what, _)| *what == format!("{file}: {name}")) {
            problems.push(format!("{file}: fn {name}: an exception for a function that is gone"));
        }
    }
    for (file, _) in LONG_FILES {
        if !used_files.iter().any(|(what, _)| what == file) {
            problems.push(format!("{file}: an exception for a file that is gone"));
        }
    }
    assert!(problems.is_empty(), "the size rule:\n{}", problems.join("\n"));
}

#[test]
fn the_size_rule_measures_functions_and_leaves_tests_out() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    let body = "    let x = 1;\n".repeat(5);
    std::fs::write(
        &file,
        format!(
            "fn short() {{}}\nstruct S;\nimpl S {{\n    fn long(&self) {{\n{body}    }}\n}}\n\
             #[cfg(test)]\nmod tests {{\n    fn hidden() {{\n{body}    }}\n}}\n"
        ),
    )
    .unwrap();
    assert_eq!(functions(&file), [("short".to_string(), 1), ("S::long".to_string(), 7)]);
    assert_eq!(production_lines(&file), 11, "21 lines, of which the test module's 10 are not counted");
}
