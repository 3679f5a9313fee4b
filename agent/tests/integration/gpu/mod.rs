//! The NVML collector end to end: the agent binary loads the compiled fake `libnvidia-ml`
//! (tests/fake-nvml) through nvml-wrapper, the same FFI path as a real GPU, with 8 fake H100s whose
//! state the test changes while the agent runs.

mod health;
mod metrics;
mod mig;
mod nvml_failures;
mod pod_gate;
mod pods;
mod release;
mod repair;

use std::path::Path;
use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{sample, Agent, EXIT_BOUND};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::control_plane::gpu_taints;
use testbed::devices::fake_nvml::{fake_nvml, Scenario};

/// The agent with the GPU collector on `scenario` (its PCI bus `scenario.pci_devices()`), `extra`
/// added to its `nvml` settings (YAML lines indented by two spaces).
pub(crate) fn start(scenario: &Scenario, extra: &str) -> Agent {
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\n{extra}",
        fake_nvml().display().to_string(),
        scenario.pci_devices().display().to_string()
    );
    Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())])
}

fn gpu(index: usize) -> String {
    index.to_string()
}

/// An agent with the GPU collector and the readiness controller on a node of the real cluster: the
/// node's `AcceleratorHealthy` condition, as the API server holds it.
pub(crate) fn start_with_readiness(scenario: &Scenario) -> Result<(Agent, ApiOnlyNode), String> {
    let api = ApiOnlyNode::gpu(&[])?;
    let agent = start_against(scenario, &api, Path::new("/proc/sys/kernel/random/boot_id"));
    Ok((agent, api))
}

/// The agent with the GPU collector and readiness against `api`, reading its boot id from `boot_id`.
fn start_against(scenario: &Scenario, api: &ApiOnlyNode, boot_id: &Path) -> Agent {
    start_configured(scenario, (&api.kubeconfig(), api.name()), boot_id, "")
}

/// [`start_against`], with more `readiness` settings (YAML lines indented by two spaces).
fn start_configured(
    scenario: &Scenario,
    (kubeconfig, node): (&Path, &str),
    boot_id: &Path,
    readiness: &str,
) -> Agent {
    Agent::start_with_env(
        &format!(
            // Verdict tests: NVML stays held through a reset request (start_watched tests the release).
            "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\n  expected_gpus: {}\n  release_for_reset: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\n  boot_id_file: {:?}\n{readiness}",
            fake_nvml().display().to_string(),
            scenario.pci_devices().display().to_string(),
            scenario.value["devices"].as_array().unwrap().len(),
            boot_id.display().to_string()
        ),
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", kubeconfig),
            ("MLNODE_NODE_NAME", Path::new(node)),
        ],
    )
}

fn wait_condition(
    agent: &Agent,
    api: &ApiOnlyNode,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    wait_condition_of("AcceleratorHealthy", agent, api, what, check)
}

fn wait_condition_of(
    kind: &str,
    agent: &Agent,
    api: &ApiOnlyNode,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    testbed::wait_until(what, Duration::from_secs(20), || {
        let condition = api.condition(kind);
        if check(&condition) {
            Ok(condition)
        } else {
            Err(format!("{kind} is {condition}\n{}", agent.log()))
        }
    })
}

/// Until the readiness controller has finished `n` more rounds.
fn wait_rounds_of_readiness(agent: &Agent, n: f64) {
    let rounds = |m: &str| {
        ["written", "skipped", "error"]
            .iter()
            .filter_map(|r| sample(m, "mlnode_node_condition_updates_total", &[("result", r)]))
            .sum::<f64>()
    };
    agent.wait_for("serving", Duration::from_secs(20), |m| {
        m.contains("mlnode_build_info")
    });
    let from = rounds(&agent.metrics());
    agent.wait_for("readiness rounds", Duration::from_secs(20), |m| {
        rounds(m) >= from + n
    });
}

/// The agent with readiness against `api`, its NVML settings extended by `nvml` (lines indented by
/// two spaces), and the fake library keeping its ledger and device files where the test reads them.
/// The agent watching `node` (its release annotation) through the API server `kubeconfig` names.
fn start_watched(scenario: &Scenario, kubeconfig: &Path, node: &str, nvml: &str) -> Agent {
    Agent::start_with_env(
        &format!(
            "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\n{nvml}readiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\n",
            fake_nvml().display().to_string(),
            scenario.pci_devices().display().to_string(),
        ),
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("FAKE_NVML_LEDGER", &scenario.ledger_path()),
            ("FAKE_NVML_DEVICE_DIR", &scenario.device_dir()),
            ("KUBECONFIG", kubeconfig),
            ("MLNODE_NODE_NAME", Path::new(node)),
        ],
    )
}
