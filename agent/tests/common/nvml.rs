//! The compiled fake NVML library (tests/fake-nvml).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

/// Builds tests/fake-nvml once and returns the path of `libfake_nvml.so`.
pub fn fake_nvml() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let output = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "fake-nvml", "--message-format=json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "fake_nvml")
            .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
            .filter_map(|f| f.as_str().map(PathBuf::from))
            .find(|f| f.extension().is_some_and(|e| e == "so"))
            .expect("cargo reports libfake_nvml.so")
    })
}
