//! The manifests as real kustomize renders them: `kubectl kustomize` (kustomize v5 inside kubectl),
//! else a `kustomize` binary. Without either, the caller skips with the reason.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's deploy/ folder.
pub fn deploy_dir() -> PathBuf {
    crate::repo_root().join("deploy").canonicalize().unwrap()
}

/// The command that renders a kustomization directory, or why there is none.
fn renderer() -> Result<Vec<String>, String> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works("kubectl", &["kustomize", "--help"]) {
        return Ok(vec!["kubectl".into(), "kustomize".into()]);
    }
    if works("kustomize", &["version"]) {
        return Ok(vec!["kustomize".into(), "build".into()]);
    }
    Err("neither `kubectl` nor `kustomize` is installed: the manifests can only be tested as real kustomize renders them (scripts/test.sh installs kubectl)".into())
}

/// The objects kustomize renders from `dir`; Err says why nothing could be rendered (no binary).
/// A kustomize error fails the test.
pub fn render(dir: &Path) -> Result<Vec<Value>, String> {
    let command = renderer()?;
    let output = Command::new(&command[0])
        .args(&command[1..])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{} {} {}: {}",
        command[0],
        command[1],
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    Ok(serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect())
}

/// Renders `deploy/daemonset/<overlay>` with `components` (paths under deploy/daemonset) added,
/// through a kustomization that names them by relative paths, as kustomize requires.
pub fn render_with(overlay: &str, components: &[&str]) -> Result<Vec<Value>, String> {
    let base = deploy_dir().join("daemonset");
    if components.is_empty() {
        return render(&base.join(overlay));
    }
    let dir = tempfile::tempdir_in(crate::target_tmpdir()).unwrap();
    let relative = |target: &str| relative_path(dir.path(), &base.join(target));
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n",
        relative(overlay)
    );
    for component in components {
        text.push_str(&format!("  - {}\n", relative(component)));
    }
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    render(dir.path())
}

/// `to` relative to the directory `from` (both absolute, canonical).
pub fn relative_path(from: &Path, to: &Path) -> String {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path.display().to_string()
}

/// What names an object in a cluster: its kind, namespace and name (empty where it has none).
pub fn id(o: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&o["kind"]),
        text(&o["metadata"]["namespace"]),
        text(&o["metadata"]["name"]),
    )
}

/// The agent's one DaemonSet in an overlay's objects (`mlnode-agent-gpu`, `mlnode-agent-neuron`).
pub fn daemonset(objects: &[Value]) -> &Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .collect();
    match found[..] {
        [one] => one,
        _ => panic!(
            "{} DaemonSets in the rendered objects, not one",
            found.len()
        ),
    }
}

/// The object of `kind` named `name`; panics naming them when there is none.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered objects"))
}

/// The README's example model: served as llama-3.1-8b, its cache the node's
/// /var/lib/models/llama-3.1-8b (/models in the agent's pod), its manifest the
/// mlnode-model-manifests key llama-3.1-8b.json.
pub const README_MODEL: &str = "llama-3.1-8b";

/// The agent's config of `objects` (the mlnode-agent-config ConfigMap, which names no model) with
/// the README's model added, as README step 3 has the user add theirs.
pub fn config_with_readme_model(objects: &[Value]) -> String {
    let map = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-agent-config")
        .expect("the install's mlnode-agent-config ConfigMap");
    let mut config: Value =
        serde_saphyr::from_str(map["data"]["config.yaml"].as_str().unwrap()).unwrap();
    config["models"] = serde_json::json!([{
        "name": README_MODEL,
        "root": format!("/models/{README_MODEL}"),
        "manifest": format!("/etc/mlnode/manifests/{README_MODEL}.json"),
    }]);
    serde_saphyr::to_string(&config).unwrap()
}
