//! The Grafana dashboards in dashboards/: current schema with `datasource`, `Hostname` and
//! `model_name` variables; every PromQL expression parses and runs in a real Prometheus that scrapes
//! the agent (fake NVML with DCGM names, a Neuron tree, an example model) and a vLLM exposition
//! fixture; every series named is one the agent exports or a known DCGM/vLLM series; every join
//! returns a non-empty result.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlnode_testbed as testbed;
use serde_json::Value;
use testbed::agent::{sample, Agent};
use testbed::models::PlainModel;
use testbed::prometheus::{query, query_raw, start_prometheus};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dashboards() -> Vec<(String, Value)> {
    let mut found: Vec<(String, Value)> = std::fs::read_dir(repo().join("dashboards"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
            )
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

fn expressions(dashboard: &Value) -> Vec<String> {
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = variable["query"]["query"].as_str() {
            // label_values(<selector>, label) → the selector.
            if let Some(inner) = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(s, _)| s.to_string())
            {
                exprs.push(inner);
            }
        }
    }
    exprs
}

/// Grafana's variables as the dashboards' defaults ("All") resolve them.
fn resolve(expr: &str) -> String {
    expr.replace("$Hostname", ".*")
        .replace("$model_name", ".*")
        .replace("$__rate_interval", "1m")
        .replace("$__range", "5m")
}

/// Metric names an expression uses: identifiers of our, DCGM's and vLLM's series.
fn series_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("mlnode_") || t.starts_with("DCGM_FI_") || t.starts_with("vllm:"))
        .map(|t| {
            t.trim_end_matches("_bucket")
                .trim_end_matches("_count")
                .trim_end_matches("_sum")
                .to_string()
        })
        .collect()
}

#[test]
fn dashboards_use_the_current_schema_and_variables() {
    let all = dashboards();
    assert_eq!(
        all.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [
            "model-caches.json",
            "node-overview.json",
            "startup-phases.json"
        ]
    );
    for (name, d) in &all {
        assert!(d["schemaVersion"].as_u64().unwrap() >= 39, "{name}");
        let variables: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(
            variables.contains(&"datasource") && variables.contains(&"Hostname"),
            "{name}: {variables:?}"
        );
        for panel in d["panels"].as_array().unwrap() {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{name}: {}",
                panel["title"]
            );
        }
    }
    assert!(all
        .iter()
        .filter(|(n, _)| n != "node-overview.json")
        .all(|(_, d)| d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "model_name")));
}

/// The series names an exposition declares (its `# TYPE` lines).
fn type_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| {
            l.strip_prefix("# TYPE ")?
                .split_whitespace()
                .next()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn every_query_runs_names_real_series_and_every_join_has_data() {
    let model = PlainModel::new();
    let (_m, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let tree = testbed::devices::neuron_sysfs::NeuronTree::new(
        testbed::devices::neuron_sysfs::INF2_48XLARGE,
    );
    // Two EFA devices and an InfiniBand HCA, for the fabric row.
    let fabric = testbed::devices::rdma_sysfs::Tree::new();
    fabric.efa("rdmap16s27", "0000:10:1b.0", 1000);
    fabric.efa("rdmap32s27", "0000:20:1b.0", 2000);
    fabric.infiniband("mlx5_0", "0000:c1:00.0", "4: ACTIVE", "5: LinkUp", 1);
    let scenario_dir = tempfile::tempdir().unwrap();
    let scenario = scenario_dir.path().join("scenario.json");
    let device = |i: usize| {
        serde_json::json!({"uuid": format!("GPU-{i}"), "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": format!("00000000:0{i}:00.0"),
        "memory": {"total": 85520809984u64, "used": 1048576000u64, "free": 83935952896u64, "reserved": 536281088u64},
        "clocks_event_reasons": 4, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 45, "power_mw": 312500,
        "utilization": {"gpu": 87, "memory": 40}, "energy_mj": 123456789u64, "xid_events": [79],
        // The node's init on the GPU: a process no pod owns, for the shared-GPU panels.
        "processes": [{"pid": 1, "used_memory": 1048576000u64, "sm_util": 87}]})
    };
    std::fs::write(
        &scenario,
        serde_json::json!({"driver_version": "580.95.05", "devices": [device(0), device(1)]})
            .to_string(),
    )
    .unwrap();
    let config = format!(
        "nvml:\n  library: {:?}\n  sample_interval: 200ms\n  dcgm_names: true\n  process_attribution: true\nneuron:\n  sysfs_root: {:?}\nrdma:\n  sysfs_root: {:?}\n  pci_devices: {:?}\n{}",
        testbed::devices::fake_nvml::fake_nvml().display().to_string(),
        tree.root().display().to_string(),
        fabric.class().display().to_string(),
        fabric.pci_devices().display().to_string(),
        testbed::agent::model_config("tiny-model", model.root(), &manifest)
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario)]);
    agent.wait_for("all collectors", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_model_cache_verified",
            &[("model_name", "tiny-model")],
        ) == Some(1.0)
            && sample(m, "mlnode_gpu_count", &[]) == Some(2.0)
    });
    // Tensor-engine cycles pass between two scrapes, so the live utilisation has an interval.
    agent.metrics();
    for device in 0..tree.instance.devices {
        for core in 0..2 {
            tree.set_cycles(device, core, 3_000_000, 1_000_000, 4_000_000 + 4_000_000);
        }
    }
    agent.wait_for("NeuronCore utilisation", Duration::from_secs(20), |m| {
        sample(m, "mlnode_neuron_core_utilization_ratio", &[]).is_some()
    });
    let exposed = type_names(&agent.metrics());
    let vllm_port = testbed::prometheus::serve_vllm_fixture();
    let vllm_series = type_names(
        &std::fs::read_to_string(repo().join("tests/fixtures/vllm-metrics.txt")).unwrap(),
    );
    // Every series an mlnode panel names must be one the agent exports; the startup and readiness
    // series come from a cluster (the tracker, the controller), so they are checked against
    // docs/metrics.md instead.
    let documented = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();

    let prometheus = start_prometheus(&[("mlnode", agent.port()), ("vllm", vllm_port)]);
    testbed::prometheus::wait_query(prometheus.port, "up{job=\"vllm\"} == 1");
    testbed::prometheus::wait_query(
        prometheus.port,
        "count(rate(mlnode_gpu_clock_event_reason_seconds_total[1m]) > 0)",
    );

    for (name, dashboard) in dashboards() {
        for expr in expressions(&dashboard) {
            for series in series_names(&expr) {
                let known = if series.starts_with("vllm:") {
                    vllm_series.contains(&series)
                } else if series.starts_with("mlnode_pod_startup")
                    || series.starts_with("mlnode_image_pull")
                    || series.starts_with("mlnode_readiness_gate")
                    || series.starts_with("mlnode_node_condition_updates")
                {
                    documented.contains(&format!("`{series}`"))
                } else {
                    exposed.contains(&series)
                };
                assert!(
                    known,
                    "{name}: {series} in {expr} is not a series the agent, DCGM or vLLM exports"
                );
            }
            let resolved = resolve(&expr);
            query_raw(prometheus.port, &resolved).unwrap_or_else(|e| panic!("{name}: {e}"));
            // The scenario's GPUs report XID 79 once, after Prometheus began scraping: a series that
            // first appears in the range, which the panel must count rather than show as 0.
            if expr.contains("mlnode_gpu_xid_errors_total") {
                let started = Instant::now();
                loop {
                    let rows = query(prometheus.port, &resolved).unwrap_or_default();
                    let counted = rows.as_array().into_iter().flatten().any(|row| {
                        row["metric"]["xid"] == "79"
                            && row["value"][1].as_str().and_then(|v| v.parse::<f64>().ok())
                                >= Some(1.0)
                    });
                    if counted {
                        break;
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "{name}: {resolved} does not count a first XID: {rows}"
                    );
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
            if resolved.contains(" on (") {
                let started = Instant::now();
                while query(prometheus.port, &resolved).is_none() {
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "{name}: the join {resolved} returns nothing"
                    );
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
    }
}

/// Runs tests/dashboards-schema/check.mjs (Grafana's @grafana/schema types, through tsc) on
/// `files`; Err when Node.js or the package is not installed (scripts/test.sh installs both).
fn grafana_schema_check(files: &[PathBuf]) -> Result<std::process::Output, String> {
    let dir = repo().join("tests/dashboards-schema");
    if !dir.join("node_modules/@grafana/schema").is_dir() {
        return Err(
            "@grafana/schema is not installed (cd tests/dashboards-schema && npm ci)".into(),
        );
    }
    std::process::Command::new("node")
        .arg(dir.join("check.mjs"))
        .args(files)
        .output()
        .map_err(|e| format!("cannot run node (Node.js): {e}"))
}

#[test]
fn dashboards_match_grafanas_own_schema_and_a_misplaced_option_does_not() {
    let files: Vec<PathBuf> = dashboards()
        .iter()
        .map(|(name, _)| repo().join("dashboards").join(name))
        .collect();
    let output = testbed::needs!(grafana_schema_check(&files));
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // The mistake this check exists for: a barchart's stacking put where a time series keeps it.
    let (_, mut startup) = dashboards()
        .into_iter()
        .find(|(name, _)| name == "startup-phases.json")
        .unwrap();
    let barchart = startup["panels"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["type"] == "barchart")
        .expect("the startup dashboard has a barchart");
    barchart["fieldConfig"]["defaults"]["custom"] =
        serde_json::json!({"stacking": {"mode": "normal", "group": "A"}});
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("misplaced.json");
    std::fs::write(&bad, startup.to_string()).unwrap();
    let output = grafana_schema_check(&[bad]).unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("'\"stacking\"' does not exist"), "{stdout}");
}
