//! The layout shows the architecture only if dependencies run one way: no two source files of the
//! library may depend on each other, directly or around a circle. A dependency is any path a file
//! names into another module (`use crate::a::b`, `use crate::{a, b::c}`, `super::x`,
//! `crate::a::b::f()` inline), resolved to the file that defines that module. Files are parsed
//! with syn, not read as text.

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

/// The module paths a file's library code names, absolute (`crate::` and `super::` resolved):
/// every `use` tree, grouped ones (`use crate::{a::b, c}`) expanded, and every path in the code
/// (`crate::a::b::f()` inline). Parsed with syn, so comments, strings and `#[cfg(test)]` items
/// (tests may reach anywhere) never count.
fn references(module: &str, is_mod_file: bool, text: &str) -> BTreeSet<String> {
    // The parent of a file module; a mod.rs is its own directory's module.
    let mut parent: Vec<String> = module
        .split("::")
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    if !is_mod_file {
        parent.pop();
    }
    let file = syn::parse_file(text).unwrap_or_else(|e| panic!("{module}: {e}"));
    let mut paths = Paths::default();
    syn::visit::visit_file(&mut paths, &file);
    paths
        .found
        .into_iter()
        .filter_map(|segments| absolute(&parent, &segments))
        .collect()
}

/// `crate::a::b` → `a::b`; `super::super::c` from `x::y` → `c`; None for paths of other roots.
fn absolute(parent: &[String], segments: &[String]) -> Option<String> {
    let (mut base, rest) = match segments.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &segments[1..]),
        Some("super") => {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            let mut base = parent.to_vec();
            base.truncate(parent.len().saturating_sub(ups - 1));
            (base, &segments[ups..])
        }
        _ => return None,
    };
    base.extend(rest.iter().cloned());
    Some(base.join("::"))
}

/// Every path the library code names, as segments.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => self.leaf(prefix, &name.ident),
            syn::UseTree::Rename(rename) => self.leaf(prefix, &rename.ident),
            syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
            syn::UseTree::Group(group) => {
                for item in &group.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }

    /// `use a::b::{self}` names `a::b`.
    fn leaf(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(ident.to_string());
        }
        self.found.push(path);
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> syn::visit::Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.found
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
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

/// Within each crate of the workspace; between crates, Cargo itself keeps dependencies one way.
#[test]
fn no_two_modules_depend_on_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for krate in [
        "", "cache", "core", "accel", "kube", "verify", "files", "testbed",
    ] {
        assert_no_circles(&root.join(krate).join("src"));
    }
}

/// The packages `package` builds on (normal dependencies, not tests' or build scripts'), by
/// name: its direct ones, or all of them.
fn dependencies(package: &str, direct: bool) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command.args([
        "tree",
        "--offline",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    command.args(["-p", package]);
    if direct {
        command.args(["--depth", "1"]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != package)
        .map(String::from)
        .collect()
}

/// The cut of docs/architecture.md: the bounded file reads build on nothing, the verifier core on
/// them alone and the shared contracts on no other crate of the workspace, the model-cache monitors and the collectors on those two, the
/// Kubernetes side on the collectors' verdicts, and only the binary on everything. The verifier core links no async runtime, API
/// client, gRPC or metrics library, so it can be used alone.
#[test]
fn crates_build_on_each_other_one_way() {
    let workspace = |package: &str| -> BTreeSet<String> {
        dependencies(package, true)
            .into_iter()
            .filter(|name| name.starts_with("mlnode-"))
            .collect()
    };
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(workspace("mlnode-files"), set(&[]));
    assert_eq!(workspace("mlnode-verify"), set(&["mlnode-files"]));
    assert_eq!(workspace("mlnode-core"), set(&[]));
    assert_eq!(
        workspace("mlnode-accel"),
        set(&["mlnode-core", "mlnode-files"])
    );
    assert_eq!(
        workspace("mlnode-cache"),
        set(&["mlnode-core", "mlnode-verify"])
    );
    assert_eq!(
        workspace("mlnode-kube"),
        set(&["mlnode-accel", "mlnode-core", "mlnode-files"])
    );
    assert_eq!(
        workspace("mlnode-agent"),
        set(&[
            "mlnode-accel",
            "mlnode-cache",
            "mlnode-core",
            "mlnode-files",
            "mlnode-kube",
            "mlnode-verify"
        ])
    );
    // The tests' harness builds on no crate of the product: what it stands up is what users have,
    // not the agent's own reading of it.
    assert_eq!(workspace("mlnode-testbed"), set(&[]));
    for (package, never) in [
        (
            "mlnode-files",
            &["tokio", "kube", "tonic", "prometheus", "clap", "serde"][..],
        ),
        (
            "mlnode-verify",
            &["tokio", "kube", "tonic", "prometheus", "clap"][..],
        ),
        (
            "mlnode-core",
            &["kube", "tonic", "nvml-wrapper", "k8s-openapi"],
        ),
        ("mlnode-accel", &["kube", "tonic"]),
        (
            "mlnode-cache",
            &["kube", "tonic", "nvml-wrapper", "k8s-openapi"],
        ),
    ] {
        let linked = dependencies(package, false);
        for name in never {
            assert!(!linked.contains(*name), "{package} links {name}");
        }
    }
}

fn assert_no_circles(src: &Path) {
    let src = src.to_path_buf();
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
        "import circles in {} (each file on it depends on the next):\n{}",
        src.display(),
        circles.join("\n")
    );
}

/// The forms the text scan missed: grouped and nested `use` trees, `self` in a group, `super`
/// chains, inline paths; and what never counts: comments, strings, other crates, test-only items.
#[test]
fn every_form_of_path_is_found_and_nothing_else() {
    let text = r#"
        use crate::{cache::state::ModelState, gpu::{health, state::GpuState}};
        use super::super::plan::{self, Planner};
        use std::sync::Arc;
        // crate::not::this
        fn f() -> u32 { let _ = "crate::nor::this"; crate::pci::scan_count() }
        #[cfg(test)]
        mod tests { use crate::readiness::gates; }
    "#;
    let found = references("readiness::controller::inner", false, text);
    let expected: BTreeSet<String> = [
        "cache::state::ModelState",
        "gpu::health",
        "gpu::state::GpuState",
        "readiness::plan",
        "readiness::plan::Planner",
        "pci::scan_count",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
}
