//! What the agent's integration tests and benchmarks stand up, laid out by what it is:
//!
//! - [`cluster`]: real control planes (the run's shared one, and a test's private one with its
//!   etcd apart), a proxy for the faults the real server cannot be made to show, its audit log, the
//!   agent's objects installed on a Node that exists only in the API, Karpenter's own repair
//!   decision, a fleet of agents;
//! - [`node`]: the real node (containerd, runc, CNI, a registry and SOCI in namespaces of their
//!   own), the one-node cluster with a real kubelet on it, the workloads it runs, a container
//!   started as the kubelet would without either, and a fake of the kubelet's pod-resources API;
//! - [`devices`]: what drivers write: NVML through the fake library and NVIDIA's own profiles and
//!   mocks, Neuron's and RDMA's sysfs trees, journals written by systemd's own tools, ttar archives;
//! - [`renderers`]: the manifests as kustomize and Helm render them;
//! - [`models`]: model caches on disk; [`agent`]: the agent as a process and its endpoints;
//!   [`prometheus`]: a real Prometheus scraping it.
//!
//! Every component is real where users have it, built by `scripts/test.sh`; a test that cannot
//! have one says so through [`needs!`].

pub mod agent;
pub mod cluster;
pub mod devices;
pub mod models;
pub mod node;
pub mod process_stats;
pub mod prometheus;
pub mod renderers;
pub mod wait;

pub use wait::wait_until;

use std::path::{Path, PathBuf};

/// What a test needs from the machine (a tool, a kernel feature), or the test stops: under
/// `CI=true` it fails naming what is missing, since a CI run must never pass a test it did not run;
/// on a developer's machine it says SKIPPED with the reason and returns.
#[macro_export]
macro_rules! needs {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(reason) => {
                $crate::missing(&reason);
                return;
            }
        }
    };
}

/// The repository's root folder: where `deploy/`, `docs/`, `tests/` and the Dockerfile are.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the tests keep what outlives one test, Cargo's `CARGO_TARGET_TMPDIR` (`<target>/tmp`),
/// found from the running test's or benchmark's own executable (`<target>/<profile>/deps/`).
pub fn target_tmpdir() -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable's path");
    let target = exe
        .ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("{} is not under <target>/<profile>/deps", exe.display()));
    let tmp = target.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    tmp
}

/// A program `scripts/test.sh` builds with Go: at `$env` where set, else at `target/<under_target>`;
/// Err names `what` and where it builds it from.
pub fn built_program(env: &str, under_target: &str, what: &str) -> Result<PathBuf, String> {
    let path = match std::env::var_os(env) {
        Some(path) => PathBuf::from(path),
        None => repo_root().join("target").join(under_target),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{what} is not built at {}: scripts/test.sh builds it with Go",
            path.display()
        ))
    }
}

/// Fails under `CI=true`, else says SKIPPED: see [`needs!`].
pub fn missing(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and this test cannot run: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// Writes `text` to a fresh file and returns its path (the directory lives as long as the guard).
pub fn write_temp(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest.json");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}
