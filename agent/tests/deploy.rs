//! Every Kubernetes object in deploy/ is valid against the Kubernetes 1.33 schema
//! (`kubernetes-validate`, installed by the test command), and the documented init-container gate
//! runs the verifier with the exit codes the pod relies on.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use common::PlainModel;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The YAML files under deploy/ that hold Kubernetes objects (kustomization files are build input).
fn object_files() -> Vec<PathBuf> {
    walkdir::WalkDir::new(deploy_dir())
        .into_iter()
        .filter_map(|e| e.ok())
        .map(|e| e.into_path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect()
}

#[test]
fn every_object_in_deploy_validates_against_kubernetes_1_33() {
    let files = object_files();
    assert!(files.len() >= 3, "{files:?}");
    let output = Command::new("kubernetes-validate")
        .args(["--kubernetes-version", "1.33.0", "--strict", "--no-warn"])
        .args(&files)
        .output()
        .expect("kubernetes-validate is installed by the test command (pip install kubernetes-validate)");
    let report = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}");
    assert!(!report.contains("ERROR"), "{report}");
}

/// The init container's command from the example, with its paths pointed at `root` and `manifest`.
fn init_container_command(root: &Path, manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(deploy_dir().join("examples/vllm-with-verified-cache.yaml"))
        .unwrap();
    let deployment: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let init = &deployment["spec"]["template"]["spec"]["initContainers"][0];
    init["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .map(|a| match a {
            "/models/llama-3.1-8b" => root.display().to_string(),
            "/etc/mlnode/manifests/llama-3.1-8b.json" => manifest.display().to_string(),
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn the_init_container_gate_blocks_a_corrupt_cache() {
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let command = init_container_command(model.root(), &manifest);
    assert_eq!(command[0], "mlnode-agent");
    let run = || {
        Command::cargo_bin("mlnode-agent")
            .unwrap()
            .args(&command[1..])
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(
        run(),
        Some(0),
        "a verified cache lets the vLLM container start"
    );
    std::fs::write(model.path("model-00002-of-00002.safetensors"), b"truncated").unwrap();
    assert_eq!(run(), Some(1), "a corrupt cache keeps the pod in Init");
    std::fs::write(model.path("stray.bin"), b"x").unwrap();
    std::fs::write(
        model.path("model-00002-of-00002.safetensors"),
        &model.files["model-00002-of-00002.safetensors"],
    )
    .unwrap();
    assert_eq!(
        run(),
        Some(1),
        "--fail-on-extra: an unexpected file fails too"
    );
}
