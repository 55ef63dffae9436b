//! The crate's files use one another without a cycle: a file uses another's items
//! only if that one does not, directly or through others, use it back. A module
//! and its child modules (`accept/`) count as one; `lib.rs` (which only declares
//! the modules) and this file are left out.
//!
//! A use is any `crate::<module>` path in a file's text, doc links included.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Who uses whom, by module.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every source file under `dir`, by path relative to `root`, with its text.
fn sources(root: &Path, dir: &Path, into: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("the crate's sources") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(root, &path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path).expect("a source file");
            into.push((relative, text));
        }
    }
}

/// The module a file belongs to: `accept/wait.rs` and `accept.rs` to `accept`.
fn module_of(relative: &str) -> String {
    let first = relative.split('/').next().unwrap_or(relative);
    first.strip_suffix(".rs").unwrap_or(first).to_string()
}

/// The modules `text` names in `crate::` paths (`crate::a::b`, `crate::{a, b::c}`).
fn named(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = group.split('}').next().unwrap_or_default();
            out.extend(inside.split(',').map(ident));
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

/// The crate's module graph, from its files.
fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    files.retain(|(path, _)| path != "lib.rs" && path != "module_graph.rs");
    let modules: BTreeSet<String> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut graph = Graph::new();
    for (path, text) in &files {
        let module = module_of(path);
        let uses = graph.entry(module.clone()).or_default();
        for m in named(text) {
            if m != module && modules.contains(&m) {
                uses.insert(m);
            }
        }
    }
    graph
}

/// A cycle of `graph`, as the modules along it (the first again at the end), if
/// there is one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut found = path[at..].to_vec();
            found.push(module.to_string());
            return Some(found);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_use_one_another_without_a_cycle() {
    let graph = graph();
    assert!(graph.contains_key("node") && graph.contains_key("accept"));
    if let Some(found) = cycle(&graph) {
        let edges: Vec<String> = graph
            .iter()
            .map(|(m, uses)| format!("{m} -> {}", Vec::from_iter(uses.iter().cloned()).join(", ")))
            .collect();
        panic!(
            "the modules use one another in a circle: {}\n{}",
            found.join(" -> "),
            edges.join("\n")
        );
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    fn edge(graph: &mut Graph, from: &str, to: &str) {
        graph
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string());
    }
    let mut graph = Graph::new();
    edge(&mut graph, "node", "sessions");
    edge(&mut graph, "sessions", "shares");
    edge(&mut graph, "shares", "registry");
    assert_eq!(cycle(&graph), None);
    edge(&mut graph, "registry", "sessions");
    assert_eq!(
        cycle(&graph).map(|c| c.join(" -> ")),
        Some("sessions -> shares -> registry -> sessions".to_string())
    );
}

#[test]
fn uses_are_read_from_paths_and_groups() {
    let text = "use crate::store::Cas;\nuse crate::{names::Names, wire};\n/// [`x`]: crate::Fleet";
    let found: Vec<String> = named(text).into_iter().collect();
    assert_eq!(found, ["Fleet", "names", "store", "wire"]);
    assert_eq!(module_of("accept/wait.rs"), "accept");
    assert_eq!(module_of("node.rs"), "node");
}
