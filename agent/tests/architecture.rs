//! The layout shows the architecture only if dependencies run one way: no two source files of the
//! library may depend on each other, directly or around a circle. A dependency is any path a file
//! names into another module (`use crate::a::b`, `super::x`, `crate::a::b::f()` inline), resolved
//! to the file that defines that module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/cache/monitor.rs` → `cache::monitor`; `src/cache/mod.rs` → `cache`; `src/lib.rs` → ``.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The module paths a file names, absolute (`crate::` and `super::` resolved).
fn references(module: &str, is_mod_file: bool, text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    // The parent of a file module; a mod.rs is its own directory's module.
    let parent: Vec<&str> = {
        let mut parts: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
        if !is_mod_file {
            parts.pop();
        }
        parts
    };
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let bytes = code.as_bytes();
    for (start, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let path: String = code[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let mut base: Vec<&str> = Vec::new();
        match segments.first() {
            Some(&"crate") => {
                segments.remove(0);
            }
            Some(&"super") => {
                base = parent.clone();
                while segments.first() == Some(&"super") {
                    segments.remove(0);
                    if segments.first() == Some(&"super") {
                        base.pop();
                    }
                }
            }
            _ => continue,
        }
        base.extend(segments);
        found.insert(base.join("::"));
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_two_modules_depend_on_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<String, String> = files
        .iter()
        .map(|f| (module_of(&src, f), std::fs::read_to_string(f).unwrap()))
        .collect();
    // module → the other modules (files) it depends on.
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (module, text) in &modules {
        let file = files
            .iter()
            .find(|f| module_of(&src, f) == *module)
            .unwrap();
        let is_mod_file = file
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        // Tests may reach anywhere; only the code the library runs is layered.
        let text = text.split("#[cfg(test)]").next().unwrap_or(text);
        for reference in references(module, is_mod_file, text) {
            // The longest prefix that is a module with a file of its own.
            let mut target = reference.as_str();
            while !modules.contains_key(target) {
                match target.rsplit_once("::") {
                    Some((head, _)) => target = head,
                    None => {
                        target = "";
                        break;
                    }
                }
            }
            let target = modules.get_key_value(target).unwrap().0.as_str();
            // A module's own children and its ancestors (re-exports, mod declarations) are
            // structure, not layering.
            if target.is_empty()
                || target == module
                || module.starts_with(&format!("{target}::"))
                || target.starts_with(&format!("{module}::"))
            {
                continue;
            }
            graph.entry(module.as_str()).or_default().insert(target);
        }
    }
    // Depth-first search for a back edge, reporting the circle it closes.
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        circles: &mut Vec<String>,
    ) {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut circle: Vec<&str> = stack[at..].to_vec();
            circle.push(node);
            circles.push(circle.join(" -> "));
            return;
        }
        if !done.insert(node) {
            return;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, stack, done, circles);
        }
        stack.pop();
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(
        circles.is_empty(),
        "import circles (each file on it depends on the next):\n{}",
        circles.join("\n")
    );
}
