//! NVIDIA's own hardware mocks, through tests/programs/nvidia-mocks (built by scripts/test.sh with go-nvml
//! v0.13.4-1 and go-nvlib v0.13.0): go-nvml's mock DGX servers as fake-NVML scenarios with what
//! the mock answered beside them, and go-nvlib's mock PCI tree with nvpci's own reading of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The mocks' program, as `scripts/test.sh` builds it (tests/programs/nvidia-mocks), or why there
/// is none.
pub fn binary() -> Result<PathBuf, String> {
    crate::built_program(
        "MLNODE_TEST_NVIDIA_MOCKS",
        "nvidia-mocks/nvidia-mocks",
        "NVIDIA's mocks (tests/programs/nvidia-mocks)",
    )
}

/// `server` (dgxa100, dgxh100, dgxh200, dgxb200) walked through go-nvml's interface: (the scenario
/// for tests/fake-nvml, what the mock answered). With `mig`, GPU 0 is split into seven 1-slice
/// instances and GPU 1 into a mixed split through the mock's own create calls.
pub fn server(server: &str, mig: bool) -> Result<(Value, Value), String> {
    let mut command = Command::new(binary()?);
    command.args(["nvml", "--server", server]);
    if mig {
        command.arg("--mig");
    }
    let mut out = run(command)?;
    Ok((out["scenario"].take(), out["answers"].take()))
}

/// go-nvlib's `MockNvpci` tree, made under `dir` by `args` (`--a100 ADDR,...`, `--vfs ADDR=N`,
/// `--vfio ADDR`): `{"root", "gpus", "all"}`, the last two nvpci's `GetGPUs` and `GetAllDevices`.
pub fn pci_tree(dir: &Path, args: &[&str]) -> Result<Value, String> {
    let mut command = Command::new(binary()?);
    command.arg("pci").args(args).env("TMPDIR", dir);
    run(command)
}

fn run(mut command: Command) -> Result<Value, String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("{command:?}'s output: {e}"))
}
