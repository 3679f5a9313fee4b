//! The whole exposition, compared against a checked-in file (node_exporter's end-to-end test does
//! the same with `collector/fixtures/e2e-output.txt`): the agent binary on fixed fakes (a model
//! cache, two fake H100s through the compiled fake NVML, a driver-shaped Neuron tree) is scraped
//! once everything has been seen, and any change to a name, a label, a help text, a type or a unit
//! shows in review as a diff of `tests/fixtures/exposition.golden.txt`.
//!
//! Values that depend on time (durations, timestamps, seconds accumulated while running) and the
//! build's revision are replaced by `<varies>`; every other value is compared too.
//! `UPDATE_GOLDEN=1 cargo test --test integration exposition::` rewrites the file.

use std::path::Path;
use std::time::Duration;

use mlnode_testbed as testbed;
use testbed::agent::{model_config, sample, Agent};
use testbed::devices::fake_nvml::{fake_nvml, Scenario};
use testbed::devices::neuron_sysfs::NeuronTree;
use testbed::models::PlainModel;

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/exposition.golden.txt"
);

/// Families whose values move with the clock, not with the fakes.
const VARYING: [&str; 6] = [
    "mlnode_model_cache_verify_duration_seconds",
    "mlnode_gpu_readings_age_seconds",
    "mlnode_model_cache_last_verified_timestamp_seconds",
    "mlnode_model_cache_last_full_hash_timestamp_seconds",
    "mlnode_gpu_clock_event_reason_seconds_total",
    // The fakes include no kubelet: its List fails once per interval.
    "mlnode_kubelet_pod_resources_errors_total",
];

/// The exposition with the time-dependent values and the build's revision masked.
fn normalize(exposition: &str) -> String {
    let mut out = String::new();
    for line in exposition.lines() {
        let varies = !line.starts_with('#')
            && VARYING.iter().any(|family| {
                line.strip_prefix(family)
                    .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))
            });
        // The value is after the last space: label values may hold spaces ("NVIDIA H100 ...").
        let line = match line.rsplit_once(' ') {
            Some((series, _)) if varies => format!("{series} <varies>"),
            _ => line.to_string(),
        };
        let line = match (
            line.find("revision=\""),
            line.starts_with("mlnode_build_info"),
        ) {
            (Some(at), true) => {
                let value = at + "revision=\"".len();
                let end = value + line[value..].find('"').unwrap_or(0);
                format!("{}<varies>{}", &line[..value], &line[end..])
            }
            _ => line,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn the_exposition_matches_the_golden_file() {
    let model = PlainModel::new();
    let (_manifest_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let scenario = Scenario::new(2);
    let neuron = NeuronTree::new(testbed::devices::neuron_sysfs::INF2_XLARGE);
    let config = format!(
        "{}nvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\nneuron:\n  sysfs_root: {:?}\n  class_root: {:?}\n  pci_devices: {:?}\n",
        model_config("llama", model.root(), &manifest),
        fake_nvml().display().to_string(),
        scenario.pci_devices().display().to_string(),
        neuron.root().display().to_string(),
        neuron.class_root().display().to_string(),
        neuron.pci_devices().display().to_string(),
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    let seen = |m: &str| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0)
            && sample(m, "mlnode_gpu_count", &[]) == Some(2.0)
            // GPM ratios come from the second sample of each GPU.
            && m.matches("\nmlnode_gpu_sm_active_ratio{").count() == 2
            && sample(m, "mlnode_neuron_device_count", &[]) == Some(1.0)
            // Registered when the pod-resources poller starts, after the collectors.
            && sample(m, "mlnode_kubelet_pod_resources_errors_total", &[]).is_some()
    };
    agent.wait_for(
        "model, GPUs and Neuron device",
        Duration::from_secs(30),
        seen,
    );
    let actual = normalize(&agent.metrics());

    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    if actual != expected {
        let diff: Vec<String> = diff_lines(&expected, &actual);
        panic!(
            "the exposition differs from {} (run with UPDATE_GOLDEN=1 to accept it):\n{}",
            Path::new(GOLDEN).display(),
            diff.join("\n")
        );
    }
}

/// Lines only in one of the two, marked `-` (expected) and `+` (actual), in order.
fn diff_lines(expected: &str, actual: &str) -> Vec<String> {
    let expected_lines: Vec<&str> = expected.lines().collect();
    let actual_lines: Vec<&str> = actual.lines().collect();
    let missing = expected_lines
        .iter()
        .filter(|l| !actual_lines.contains(l))
        .map(|l| format!("- {l}"));
    let added = actual_lines
        .iter()
        .filter(|l| !expected_lines.contains(l))
        .map(|l| format!("+ {l}"));
    missing.chain(added).collect()
}

#[test]
fn normalizing_masks_only_time_and_the_revision() {
    let text = "# HELP mlnode_model_cache_verify_duration_seconds Time.\n\
                mlnode_model_cache_verify_duration_seconds_bucket{le=\"0.01\"} 1\n\
                mlnode_model_cache_verify_duration_seconds_sum 0.004\n\
                mlnode_build_info{revision=\"abc123\",version=\"0.1.0\"} 1\n\
                mlnode_gpu_clock_event_reason_seconds_total{modelName=\"NVIDIA H100\"} 0.3\n\
                mlnode_model_cache_verified{model_name=\"m\"} 1\n";
    assert_eq!(
        normalize(text),
        "# HELP mlnode_model_cache_verify_duration_seconds Time.\n\
         mlnode_model_cache_verify_duration_seconds_bucket{le=\"0.01\"} <varies>\n\
         mlnode_model_cache_verify_duration_seconds_sum <varies>\n\
         mlnode_build_info{revision=\"<varies>\",version=\"0.1.0\"} 1\n\
         mlnode_gpu_clock_event_reason_seconds_total{modelName=\"NVIDIA H100\"} <varies>\n\
         mlnode_model_cache_verified{model_name=\"m\"} 1\n"
    );
}
