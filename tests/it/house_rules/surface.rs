//! What a crate shows: no public function says its error is just a `String` (a typed error
//! names its cases); no process global beyond the named list; no two public types of one name
//! in a crate; and no transport names a dialect's event (the seam between them is typed).

use super::{parse, production_files, root, rust_files, shown, test_only, workspace};
use std::collections::BTreeMap;
use std::path::Path;
use syn::visit::Visit;

/// The process globals, each with why it is one per process: (crate, name, why).
const GLOBALS: &[(&str, &str, &str)] = &[
    ("omni-actors", "METRICS", "the Prometheus registry: one per process, as its scrape is"),
    ("omni-actors", "GATE", "the log gate: one budget of log lines for the whole process"),
    ("omni-actors", "SPARES", "the spare backend threads, lent to any worker of the process"),
    ("omni-actors", "CONNECTIONS", "connection ids, unique in the process"),
    ("omni-actors", "LAST_MS", "the last id timestamp, keeping ids increasing in the process"),
    ("omni-actors", "SAID", "a warning said once per process (free disk space unreadable)"),
    ("omni-gateway", "NEXT_LINK", "node link ids, unique in the node process"),
    ("omni-backend-host", "IO", "the one runtime serving every node link's socket"),
    ("omni-backend-host", "SERVERS", "one state per vLLM-Omni server URL, shared by its slots"),
    ("omni-cascade", "API", "the C ABI's function table, a static as C requires"),
    ("omni-cascade", "BACKEND", "llama.cpp's backend, initialised once per process"),
    ("omni-cascade", "MODELS", "loaded LLM weights, shared by every instance in the process"),
    ("omni-vad-silero", "ORT", "ONNX Runtime's environment, one per process"),
    ("omni-vad-silero", "SESSIONS", "one ONNX session per thread and model (thread-local)"),
    ("omni-tools", "ENDPOINT", "callload's one SIP endpoint for all its calls"),
    ("omni-dialects", "HELD", "what every session's conversation holds: one buffer budget per process"),
];

/// What one file declares that the rules below read.
#[derive(Default)]
struct Declared {
    /// Public functions whose error is a `String`.
    string_errors: Vec<String>,
    /// Names of `static`s, thread-locals included.
    globals: Vec<String>,
    /// Names of public types (struct, enum, union, type alias, trait).
    types: Vec<String>,
}

impl Declared {
    fn of(file: &Path) -> Declared {
        let mut declared = Declared::default();
        declared.visit_file(&parse(file));
        declared
    }
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

/// Whether `output` is `Result<_, String>`.
fn string_error(output: &syn::ReturnType) -> bool {
    let syn::ReturnType::Type(_, ty) = output else { return false };
    let syn::Type::Path(path) = &**ty else { return false };
    let Some(last) = path.path.segments.last() else { return false };
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return false };
    let types: Vec<&syn::Type> =
        args.args.iter().filter_map(|a| if let syn::GenericArgument::Type(t) = a { Some(t) } else { None }).collect();
    last.ident == "Result" && types.len() == 2 && matches!(types[1], syn::Type::Path(e) if e.path.is_ident("String"))
}

impl<'a> Visit<'a> for Declared {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if test_only(&f.attrs) {
            return;
        }
        if is_pub(&f.vis) && string_error(&f.sig.output) {
            self.string_errors.push(f.sig.ident.to_string());
        }
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if is_pub(&f.vis) && string_error(&f.sig.output) {
            self.string_errors.push(f.sig.ident.to_string());
        }
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_item_static(&mut self, s: &'a syn::ItemStatic) {
        self.globals.push(s.ident.to_string());
    }
    fn visit_item_macro(&mut self, m: &'a syn::ItemMacro) {
        if m.mac.path.is_ident("thread_local") {
            let mut tokens = m.mac.tokens.clone().into_iter();
            while let Some(token) = tokens.next() {
                if matches!(&token, proc_macro2::TokenTree::Ident(i) if i == "static")
                    && let Some(proc_macro2::TokenTree::Ident(name)) = tokens.next()
                {
                    self.globals.push(name.to_string());
                }
            }
        }
    }
    fn visit_item_struct(&mut self, i: &'a syn::ItemStruct) {
        if is_pub(&i.vis) {
            self.types.push(i.ident.to_string());
        }
    }
    fn visit_item_enum(&mut self, i: &'a syn::ItemEnum) {
        if is_pub(&i.vis) {
            self.types.push(i.ident.to_string());
        }
    }
    fn visit_item_union(&mut self, i: &'a syn::ItemUnion) {
        if is_pub(&i.vis) {
            self.types.push(i.ident.to_string());
        }
    }
    fn visit_item_type(&mut self, i: &'a syn::ItemType) {
        if is_pub(&i.vis) {
            self.types.push(i.ident.to_string());
        }
    }
    fn visit_item_trait(&mut self, i: &'a syn::ItemTrait) {
        if is_pub(&i.vis) {
            self.types.push(i.ident.to_string());
        }
        syn::visit::visit_item_trait(self, i);
    }
}

#[test]
fn no_public_function_has_a_string_for_an_error() {
    let mut found = Vec::new();
    for package in workspace() {
        for file in production_files(&package.src) {
            for name in Declared::of(&file).string_errors {
                found.push(format!("{}: fn {name}", shown(&file)));
            }
        }
    }
    assert!(found.is_empty(), "public functions with String errors (type them):\n{}", found.join("\n"));
}

#[test]
fn no_process_global_beyond_the_named_list() {
    let mut unlisted = Vec::new();
    let mut seen = Vec::new();
    for package in workspace() {
        for file in production_files(&package.src) {
            for name in Declared::of(&file).globals {
                match GLOBALS.iter().find(|(c, n, _)| *c == package.name && *n == name) {
                    Some(_) => seen.push((package.name.clone(), name)),
                    None => unlisted.push(format!("{} ({}): static {name}", shown(&file), package.name)),
                }
            }
        }
    }
    assert!(unlisted.is_empty(), "process globals not in GLOBALS:\n{}", unlisted.join("\n"));
    let gone: Vec<_> =
        GLOBALS.iter().filter(|(c, n, _)| !seen.iter().any(|(sc, sn)| sc == c && sn == n)).map(|(_, n, _)| n).collect();
    assert!(gone.is_empty(), "GLOBALS names statics that are gone (remove them): {gone:?}");
}

#[test]
fn no_two_public_types_of_one_name_in_a_crate() {
    let mut twice = Vec::new();
    for package in workspace() {
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for file in production_files(&package.src) {
            for name in Declared::of(&file).types {
                by_name.entry(name).or_default().push(shown(&file));
            }
        }
        for (name, files) in by_name.into_iter().filter(|(_, f)| f.len() > 1) {
            twice.push(format!("{}: {name} in {}", package.name, files.join(", ")));
        }
    }
    assert!(twice.is_empty(), "public types sharing a name (rename one):\n{}", twice.join("\n"));
}

#[test]
fn the_surface_rules_read_what_they_claim() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "pub fn a() -> Result<(), String> { todo!() }\nfn b() -> Result<(), String> { todo!() }\n\
         pub fn c() -> Result<HashMap<String, String>, Error> { todo!() }\n\
         pub struct T; pub(crate) struct U; pub enum V {}\nimpl T { pub fn d(&self) -> io::Result<u8, String> { todo!() } }\n\
         static A: u8 = 0;\nfn f() { static B: u8 = 0; }\nthread_local! { static C: u8 = 0; }\n\
         #[cfg(test)]\nmod tests { pub struct W; static D: u8 = 0; pub fn e() -> Result<(), String> { todo!() } }\n",
    )
    .unwrap();
    let declared = Declared::of(&file);
    assert_eq!(declared.string_errors, ["a", "d"]);
    assert_eq!(declared.globals, ["A", "B", "C"]);
    assert_eq!(declared.types, ["T", "V"]);
}

/// The dotted names the dialects crate writes in string literals (its events, and the paths of
/// their fields): `session.created`, `input_audio_buffer.append`, ...
fn dialect_names() -> Vec<String> {
    let mut names = Vec::new();
    for file in production_files(&root().join("dialects/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for literal in text.split('"').skip(1).step_by(2) {
            let dotted = literal.contains('.')
                && literal
                    .split('.')
                    .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            if dotted && !names.iter().any(|n| n == literal) {
                names.push(literal.to_string());
            }
        }
    }
    names
}

/// Where `text` names `name` on its own (not as part of a longer dotted name).
fn names(text: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(at, _)| {
        let after = &text[at + name.len()..];
        let longer = after.starts_with(word) || after.strip_prefix('.').is_some_and(|rest| rest.starts_with(word));
        !text[..at].ends_with(|c: char| word(c) || c == '.') && !longer
    })
}

#[test]
fn no_transport_names_a_dialect_event() {
    let events = dialect_names();
    assert!(events.iter().any(|e| e == "session.created") && events.len() > 50, "{} names read", events.len());
    let mut found = Vec::new();
    for file in rust_files(&root().join("transports/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for event in events.iter().filter(|e| names(&text, e)) {
            found.push(format!("{}: {event}", shown(&file)));
        }
    }
    assert!(found.is_empty(), "transports naming dialect events (use the typed seam):\n{}", found.join("\n"));
}

#[test]
fn the_event_rule_matches_whole_names() {
    assert!(names(r#"if text.contains("\"type\":\"session.created\"")"#, "session.created"));
    assert!(names("// answered on session.created.", "session.created"));
    assert!(!names("session.created_at", "session.created"));
    assert!(!names("x.session.created", "session.created"));
}
