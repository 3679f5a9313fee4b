//! NVIDIA's own dcgm-exporter Grafana dashboard (tests/fixtures/dashboards/dcgm-exporter-dashboard.json,
//! unchanged) against the agent with `nvml.dcgm_names: true` on two fake H100s (GPM included),
//! through a real Prometheus: every panel returns data.

use std::path::Path;
use std::time::Duration;

use mlnode_testbed as testbed;
use testbed::agent::{sample, Agent};
use testbed::devices::fake_nvml::{fake_nvml, Scenario};
use testbed::prometheus::{dashboard_panels, panels_with_data, start_prometheus, wait_query};

#[test]
fn nvidias_dcgm_exporter_dashboard_has_data_on_every_panel() {
    let panels = dashboard_panels(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/dashboards/dcgm-exporter-dashboard.json"
    )));
    assert_eq!(panels.len(), 8, "the dashboard as NVIDIA ships it");
    let scenario = Scenario::new(2);
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 200ms\n  dcgm_names: true\n",
        fake_nvml().display().to_string()
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    agent.wait_for("GPM on both GPUs", Duration::from_secs(20), |m| {
        m.matches("\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{").count() == 2
            && sample(m, "mlnode_gpu_count", &[]) == Some(2.0)
    });
    let prometheus = start_prometheus(&[("dcgm", agent.port())]);
    wait_query(prometheus.port, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE");
    // The dashboard's variables at "All": label_values(DCGM_FI_DEV_GPU_TEMP, instance|gpu).
    let resolve = |expr: &str| expr.replace("$instance", ".*").replace("$gpu", ".*");
    let (with_data, without) = panels_with_data(prometheus.port, &panels, resolve);
    assert!(without.is_empty(), "panels without data: {without:?}");
    assert_eq!(with_data.len(), 8);
}
