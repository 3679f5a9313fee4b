//! The NVML collector end to end: the agent binary loads the compiled fake `libnvidia-ml`
//! (tests/fake-nvml) through nvml-wrapper, the same FFI path as a real GPU, with 8 fake H100s whose
//! state the test changes while the agent runs.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::agent::{sample, Agent, EXIT_BOUND};
use common::cluster_node::ClusterNode;
use common::control_plane::gpu_taints;
use common::nvml::{fake_nvml, Scenario};
use serde_json::{json, Value};

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

#[test]
fn every_series_and_label_matches_the_scenario() {
    let scenario = Scenario::new(8);
    let agent = start(&scenario, "  dcgm_names: true\n");
    // GPM ratios need two samples of each GPU.
    agent.wait_for("8 GPUs, GPM on each", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
            && m.matches("\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{").count() == 8
    });
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_collector_up", &[("collector", "nvml")]),
        Some(1.0)
    );
    for i in 0..8 {
        let d = &scenario.value["devices"][i];
        let g = gpu(i);
        let labels = [
            ("gpu", g.as_str()),
            ("UUID", d["uuid"].as_str().unwrap()),
            ("pci_bus_id", d["pci_bus_id"].as_str().unwrap()),
            ("device", &format!("nvidia{i}")),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("Hostname", "test-node"),
            ("DCGM_FI_DRIVER_VERSION", "580.95.05"),
        ];
        let v = |name: &str| {
            sample(&metrics, name, &labels)
                .unwrap_or_else(|| panic!("{name} for GPU {i}\n{metrics}"))
        };
        let mem = &d["memory"];
        assert_eq!(
            v("mlnode_gpu_memory_free_bytes"),
            mem["free"].as_f64().unwrap()
        );
        assert_eq!(
            v("mlnode_gpu_memory_used_bytes"),
            mem["used"].as_f64().unwrap()
        );
        assert_eq!(
            v("mlnode_gpu_memory_reserved_bytes"),
            mem["reserved"].as_f64().unwrap()
        );
        assert_eq!(
            v("mlnode_gpu_memory_total_bytes"),
            mem["total"].as_f64().unwrap()
        );
        assert_eq!(v("mlnode_gpu_sm_clock_hertz"), 1980e6);
        assert_eq!(v("mlnode_gpu_memory_clock_hertz"), 2619e6);
        assert_eq!(v("mlnode_gpu_temperature_celsius"), (40 + i) as f64);
        assert_eq!(
            v("mlnode_gpu_power_watts"),
            (312500 + i * 1000) as f64 / 1000.0
        );
        assert_eq!(v("mlnode_gpu_utilization_ratio"), 0.87);
        assert_eq!(
            v("mlnode_gpu_energy_joules_total"),
            (123456789 + i) as f64 / 1000.0
        );
        assert_eq!(v("mlnode_gpu_lost"), 0.0);
        // DCGM's names and units: MiB truncated, MHz, W, %, mJ.
        assert_eq!(v("DCGM_FI_DEV_FB_FREE"), (83935952896u64 >> 20) as f64);
        assert_eq!(
            v("DCGM_FI_DEV_FB_USED"),
            ((1048576000u64 + i as u64) >> 20) as f64
        );
        assert_eq!(
            v("DCGM_FI_DEV_FB_RESERVED"),
            511.0,
            "536281088 B is 511.43 MiB, truncated"
        );
        assert_eq!(v("DCGM_FI_DEV_SM_CLOCK"), 1980.0);
        assert_eq!(v("DCGM_FI_DEV_MEM_CLOCK"), 2619.0);
        assert_eq!(v("DCGM_FI_DEV_GPU_TEMP"), (40 + i) as f64);
        assert_eq!(
            v("DCGM_FI_DEV_POWER_USAGE"),
            (312500 + i * 1000) as f64 / 1000.0
        );
        assert_eq!(v("DCGM_FI_DEV_GPU_UTIL"), 87.0);
        assert_eq!(
            v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
            (123456789 + i) as f64
        );
        assert_eq!(v("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), 1.0);
        assert_eq!(v("DCGM_FI_DEV_XID_ERRORS"), 0.0);
        // The rest of dcgm-exporter's default counters, and their mlnode_gpu_* twins in base units.
        assert_eq!(v("DCGM_FI_DEV_MEM_COPY_UTIL"), 40.0);
        assert_eq!(v("mlnode_gpu_memory_copy_utilization_ratio"), 0.4);
        assert_eq!(v("DCGM_FI_DEV_ENC_UTIL"), 0.0);
        assert_eq!(v("DCGM_FI_DEV_DEC_UTIL"), 3.0);
        assert_eq!(v("mlnode_gpu_decoder_utilization_ratio"), 0.03);
        assert_eq!(v("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), (2 + i) as f64);
        assert_eq!(v("mlnode_gpu_pcie_replays_total"), (2 + i) as f64);
        assert_eq!(v("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), 1.0);
        assert_eq!(v("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), i as f64);
        assert_eq!(v("DCGM_FI_DEV_ROW_REMAP_FAILURE"), 0.0);
        assert_eq!(v("mlnode_gpu_row_remap_pending"), 0.0);
        assert_eq!(v("DCGM_FI_DEV_MEMORY_TEMP"), (52 + i) as f64);
        assert_eq!(v("mlnode_gpu_memory_temperature_celsius"), (52 + i) as f64);
        assert_eq!(v("DCGM_FI_PROF_PCIE_TX_BYTES"), 1024.0 * 1024.0);
        assert_eq!(v("DCGM_FI_PROF_PCIE_RX_BYTES"), 2048.0 * 1024.0);
        assert_eq!(v("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), 0.915);
        assert_eq!(v("DCGM_FI_PROF_SM_ACTIVE"), 0.8);
        assert_eq!(v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), 0.6225);
        assert_eq!(v("DCGM_FI_PROF_DRAM_ACTIVE"), 0.45);
        assert_eq!(v("mlnode_gpu_tensor_pipe_active_ratio"), 0.6225);
        let rows = |cause: &str| {
            sample(
                &metrics,
                "mlnode_gpu_remapped_rows_total",
                &[("gpu", g.as_str()), ("cause", cause)],
            )
        };
        assert_eq!(rows("uncorrectable"), Some(i as f64));
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_nvlink_bytes_total",
                &[("gpu", g.as_str()), ("direction", "tx")]
            ),
            Some((1_048_576 + i) as f64 * 1024.0),
            "KiB over all links (scope UINT_MAX), in bytes"
        );
        for link in ["0", "17"] {
            assert_eq!(
                sample(
                    &metrics,
                    "mlnode_gpu_nvlink_link_active",
                    &[("gpu", g.as_str()), ("link", link)]
                ),
                Some(1.0),
                "link {link}"
            );
        }
        assert_eq!(
            metrics
                .lines()
                .filter(|l| l.starts_with("mlnode_gpu_nvlink_link_active{")
                    && l.contains(&format!("gpu=\"{g}\"")))
                .count(),
            18,
            "one series per link NVML counts"
        );
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_nvlink_errors_total",
                &[("gpu", g.as_str()), ("counter", "replay")]
            ),
            Some(i as f64)
        );
        assert_eq!(v("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"), i as f64);
        let margin = |limit: &str| {
            sample(
                &metrics,
                "mlnode_gpu_thermal_margin_celsius",
                &[("gpu", g.as_str()), ("limit", limit)],
            )
        };
        assert_eq!(
            margin("slowdown"),
            Some(38.0 - i as f64),
            "signed °C below the limit"
        );
        assert_eq!(margin("memory_max"), Some(30.0));
        assert_eq!(v("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"), 0.0);
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_pcie_bytes_per_second",
                &[("gpu", g.as_str()), ("direction", "rx")]
            ),
            Some(2048.0 * 1024.0)
        );
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_clock_event_reason_active",
                &[("gpu", &g), ("reason", "gpu_idle")]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_clock_event_reason_active",
                &[("gpu", &g), ("reason", "sw_power_cap")]
            ),
            Some(0.0)
        );
        assert!(
            !metrics.contains("pod=\""),
            "no pod labels without a pod-resources assignment"
        );
    }
    assert!(metrics.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"));
    assert!(metrics.contains("# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter"));
    // dcgm-exporter's err_code and err_msg on the XID series.
    assert_eq!(
        sample(
            &metrics,
            "DCGM_FI_DEV_XID_ERRORS",
            &[("gpu", "0"), ("err_code", "0"), ("err_msg", "No Error")]
        ),
        Some(0.0)
    );
    assert!(metrics.contains("# HELP DCGM_FI_DEV_FB_FREE Frame buffer memory free (in MiB)."));
}

#[test]
fn clock_event_reasons_appear_and_disappear() {
    let mut scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    let active = |reason: &'static str, value: f64| {
        move |m: &str| {
            sample(
                m,
                "mlnode_gpu_clock_event_reason_active",
                &[("gpu", "2"), ("reason", reason)],
            ) == Some(value)
        }
    };
    agent.wait_for("idle", Duration::from_secs(20), active("gpu_idle", 1.0));
    let set_at = std::time::Instant::now();
    scenario.set(2, "clocks_event_reasons", json!(0x4)); // sw_power_cap
    agent.wait_for(
        "power cap on",
        Duration::from_secs(5),
        active("sw_power_cap", 1.0),
    );
    // Held until the agent has counted half a second of it.
    let held_for = |m: &str| {
        sample(
            m,
            "mlnode_gpu_clock_event_reason_seconds_total",
            &[("gpu", "2"), ("reason", "sw_power_cap")],
        )
        .unwrap_or(0.0)
    };
    agent.wait_for("power cap counted", Duration::from_secs(5), |m| {
        held_for(m) >= 0.5
    });
    scenario.set(2, "clocks_event_reasons", json!(0x8)); // hw_slowdown
    agent.wait_for(
        "power cap off",
        Duration::from_secs(5),
        active("sw_power_cap", 0.0),
    );
    // It held from our first write to our second, and was counted in 100 ms samples: no more than
    // that span (and a sample), and no less than what was counted when we ended it.
    let at_most = set_at.elapsed().as_secs_f64() + 0.2;
    agent.wait_for(
        "hw slowdown on",
        Duration::from_secs(5),
        active("hw_slowdown", 1.0),
    );
    let metrics = agent.metrics();
    let held = held_for(&metrics);
    assert!(
        (0.5..=at_most).contains(&held),
        "power cap held 0.5 to {at_most:.2} s, counted {held}"
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_clock_event_reason_active",
            &[("gpu", "3"), ("reason", "hw_slowdown")]
        ),
        Some(0.0),
        "other GPUs unaffected"
    );
}

#[test]
fn xid_events_count_per_xid_and_set_the_last() {
    let mut scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
    });
    scenario.set(4, "xid_events", json!([79, 48]));
    agent.wait_for("XIDs", Duration::from_secs(5), |m| {
        sample(
            m,
            "mlnode_gpu_xid_errors_total",
            &[("gpu", "4"), ("xid", "79")],
        ) == Some(1.0)
            && sample(
                m,
                "mlnode_gpu_xid_errors_total",
                &[("gpu", "4"), ("xid", "48")],
            ) == Some(1.0)
            && sample(m, "mlnode_gpu_last_xid", &[("gpu", "4")]) == Some(48.0)
    });
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_gpu_last_xid", &[("gpu", "3")]),
        None,
        "no XID, no last-XID series"
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_xid_info",
            &[
                ("gpu", "4"),
                ("xid", "48"),
                ("message", "Double Bit ECC Error")
            ]
        ),
        Some(1.0),
        "NVIDIA's text for the last XID"
    );
    assert!(agent.log().contains("XID error"), "XIDs are logged");
}

/// dcgm-exporter's windowed count (`DCGM_EXP_XID_ERRORS_COUNT`, internal/pkg/collector/
/// expcollector.go): a series per XID seen in the window with `xid` and `window_size_in_ms`, one
/// series of 0 without `xid` for a GPU with none, and the XID leaves it once the window has passed.
#[test]
fn the_windowed_xid_count_is_dcgm_exporters() {
    let mut scenario = Scenario::new(2);
    let agent = start(&scenario, "  dcgm_names: true\n  xid_count_window: 2s\n");
    let windowed = |m: &str, labels: &[(&str, &str)]| {
        let mut all = vec![("gpu", "1"), ("window_size_in_ms", "2000")];
        all.extend_from_slice(labels);
        sample(m, "DCGM_EXP_XID_ERRORS_COUNT", &all)
    };
    agent.wait_for("a zero series", Duration::from_secs(20), |m| {
        windowed(m, &[]) == Some(0.0)
    });
    scenario.set(1, "xid_events", json!([79, 79]));
    agent.wait_for("two 79s in the window", Duration::from_secs(5), |m| {
        windowed(m, &[("xid", "79")]) == Some(2.0)
    });
    let metrics = agent.metrics();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("DCGM_EXP_XID_ERRORS_COUNT{")
                && l.contains("gpu=\"1\"")
                && !l.contains("xid=")),
        "no zero series beside a counted XID"
    );
    agent.wait_for("the window passed", Duration::from_secs(10), |m| {
        windowed(m, &[]) == Some(0.0) && windowed(m, &[("xid", "79")]).is_none()
    });
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_gpu_xid_errors_total",
            &[("gpu", "1"), ("xid", "79")]
        ),
        Some(2.0),
        "the total keeps them"
    );
}

/// One GPU refusing XID registration (it says it supports the events, then NVML answers
/// NOT_SUPPORTED) costs only that GPU: the ones registered before and after it still deliver, and
/// an XID NVML cannot identify (999) is counted, not dropped.
#[test]
fn one_gpu_refusing_xid_registration_costs_only_that_gpu() {
    let mut scenario = Scenario::new(8);
    scenario.value["devices"][3]["unsupported"] = json!(["register_events"]);
    scenario.write();
    let agent = start(&scenario, "");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
    });
    scenario.set(1, "xid_events", json!([79]));
    scenario.set(6, "xid_events", json!([999]));
    agent.wait_for(
        "XIDs before and after the refusing GPU",
        Duration::from_secs(5),
        |m| {
            sample(
                m,
                "mlnode_gpu_xid_errors_total",
                &[("gpu", "1"), ("xid", "79")],
            ) == Some(1.0)
                && sample(
                    m,
                    "mlnode_gpu_xid_errors_total",
                    &[("gpu", "6"), ("xid", "999")],
                ) == Some(1.0)
        },
    );
    assert!(
        agent.log().contains("the others are unaffected"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_lost_gpu_is_named_while_the_others_keep_reporting() {
    let mut scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
    });
    scenario.set(5, "lost", json!(true));
    agent.wait_for("GPU 5 lost", Duration::from_secs(5), |m| {
        sample(
            m,
            "mlnode_gpu_lost",
            &[
                ("gpu", "5"),
                ("UUID", "GPU-00000005-1111-2222-3333-444444444445"),
                ("pci_bus_id", "00000000:57:00.0"),
            ],
        ) == Some(1.0)
    });
    agent.wait_for(
        "no stale readings for a lost GPU",
        Duration::from_secs(5),
        |m| sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "5")]).is_none(),
    );
    let metrics = agent.metrics();
    for i in (0..8).filter(|&i| i != 5) {
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_temperature_celsius",
                &[("gpu", &gpu(i))]
            ),
            Some((40 + i) as f64)
        );
        assert_eq!(
            sample(&metrics, "mlnode_gpu_lost", &[("gpu", &gpu(i))]),
            Some(0.0)
        );
    }
    assert!(agent.log().contains("fell off the bus"));
    scenario.set(5, "lost", json!(false));
    agent.wait_for("GPU 5 back", Duration::from_secs(5), |m| {
        sample(m, "mlnode_gpu_lost", &[("gpu", "5")]) == Some(0.0)
    });
}

#[test]
fn unsupported_fields_are_absent_and_fallbacks_are_used() {
    let mut scenario = Scenario::new(8);
    scenario.set(2, "unsupported", json!(["reserved", "power", "energy"]));
    scenario.set(1, "unsupported", json!(["clocks_event_reasons"]));
    scenario.set(1, "clocks_event_reasons", json!(0x40)); // hw_thermal_slowdown via the old call
    scenario.set(3, "unsupported", json!(["throttle_reasons"]));
    // An Ampere-class PCIe GPU: no GPM, no NVLink; and one whose driver answers none of the newer
    // fields.
    scenario.set(4, "gpm", json!(null));
    scenario.set(4, "nvlink_kib", json!(null));
    // A driver older than the agent's header: the v2 memory struct and NVML 13's temperature call
    // answer ARGUMENT_VERSION_MISMATCH; another answers NOT_SUPPORTED for the new temperature call.
    scenario.set(6, "version_mismatch", json!(["memory", "temperature_v"]));
    scenario.set(7, "unsupported", json!(["temperature_v"]));
    // And a current driver that no longer answers the deprecated call: the new one is what is used.
    scenario.set(0, "unsupported", json!(["temperature"]));
    scenario.set(
        5,
        "unsupported",
        json!([
            "encoder",
            "decoder",
            "pcie_replay",
            "remapped_rows",
            "memory_temp",
            "pcie_throughput"
        ]),
    );
    let agent = start(&scenario, "  dcgm_names: true\n");
    // Every GPU read once: an unsupported field is then known to be absent, not yet to come.
    agent.wait_for("every GPU read", Duration::from_secs(20), |m| {
        (0..8).all(|i| sample(m, "mlnode_gpu_memory_total_bytes", &[("gpu", &gpu(i))]).is_some())
    });
    // GPU 7's second read has GPM ratios: GPU 4's second read has happened too.
    agent.wait_for("a second read", Duration::from_secs(20), |m| {
        sample(m, "DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "7")]).is_some()
    });
    let metrics = agent.metrics();
    for absent in [
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "mlnode_gpu_sm_active_ratio",
    ] {
        assert_eq!(
            sample(&metrics, absent, &[("gpu", "4")]),
            None,
            "{absent}: no GPM"
        );
    }
    for absent in [
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "mlnode_gpu_remapped_rows_total",
    ] {
        assert_eq!(sample(&metrics, absent, &[("gpu", "5")]), None, "{absent}");
    }
    // A GPU without NVLink (a PCIe card).
    assert_eq!(
        sample(&metrics, "mlnode_gpu_nvlink_bytes_total", &[("gpu", "4")]),
        None
    );
    assert_eq!(
        sample(&metrics, "DCGM_FI_DEV_GPU_UTIL", &[("gpu", "5")]),
        Some(87.0),
        "the rest of GPU 5 is read"
    );
    // The older calls answer instead, and the new one where the old is gone.
    for gpu in ["0", "6", "7"] {
        assert_eq!(
            sample(&metrics, "mlnode_gpu_temperature_celsius", &[("gpu", gpu)]),
            Some(40.0 + gpu.parse::<f64>().unwrap()),
            "GPU {gpu}: one of the two temperature calls"
        );
    }
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_memory_reserved_bytes",
            &[("gpu", "6")]
        ),
        None,
        "v1 memory: no reserved"
    );
    assert!(sample(&metrics, "mlnode_gpu_memory_free_bytes", &[("gpu", "6")]).is_some());
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_memory_reserved_bytes",
            &[("gpu", "2")]
        ),
        None
    );
    assert_eq!(
        sample(&metrics, "mlnode_gpu_power_watts", &[("gpu", "2")]),
        None
    );
    assert_eq!(
        sample(&metrics, "mlnode_gpu_energy_joules_total", &[("gpu", "2")]),
        None
    );
    // The v1 memory call still gives free/total, with reserved counted in used as NVML does.
    assert_eq!(
        sample(&metrics, "mlnode_gpu_memory_free_bytes", &[("gpu", "2")]),
        Some(83935952896.0)
    );
    assert_eq!(
        sample(&metrics, "mlnode_gpu_memory_used_bytes", &[("gpu", "2")]),
        Some((1048576002u64 + 536281088) as f64)
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_clock_event_reason_active",
            &[("gpu", "1"), ("reason", "hw_thermal_slowdown")]
        ),
        Some(1.0),
        "deprecated throttle-reasons fallback"
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_clock_event_reason_active",
            &[("gpu", "3")]
        ),
        None,
        "neither call: no reason series"
    );
    assert_eq!(
        sample(&metrics, "mlnode_gpu_temperature_celsius", &[("gpu", "2")]),
        Some(42.0)
    );
}

#[test]
fn missing_library_leaves_the_agent_running_with_collector_down() {
    let scenario = Scenario::new(8);
    let config = "models: []\nnvml:\n  library: /nonexistent/libnvidia-ml.so.1\n";
    let agent = Agent::start_with_env(config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    // The collector is down from the start; the log line says when start-up gave up, and why.
    agent.wait_for_log("the collector given up", Duration::from_secs(20), |log| {
        log.contains("no NVIDIA GPU collector")
    });
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_collector_up",
            &[("collector", "nvml")]
        ),
        Some(0.0)
    );
    assert_eq!(agent.get("/healthz").0, 200);
    let log = agent.log();
    assert_eq!(
        log.matches("no NVIDIA GPU collector").count(),
        1,
        "one clear log line: {log}"
    );
    assert!(log.contains("/nonexistent/libnvidia-ml.so.1"), "{log}");
}

/// A GPU whose handle call answers RESET_REQUIRED (the state after an XID 48/79-class failure),
/// IRQ_ISSUE or UNKNOWN is flagged with why, its readings are dropped rather than kept as if
/// current, and the others keep reporting; when it can be read again, both come back.
#[test]
fn a_gpu_in_a_failure_state_is_flagged_and_its_readings_dropped() {
    let mut scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    let utilization =
        |m: &str, gpu: &str| sample(m, "mlnode_gpu_utilization_ratio", &[("gpu", gpu)]);
    agent.wait_for("8 GPUs read", Duration::from_secs(20), |m| {
        utilization(m, "2").is_some()
    });
    for (code, reason) in [(16, "reset_required"), (11, "irq_issue"), (999, "unknown")] {
        scenario.set(2, "handle_error", json!(code));
        agent.wait_for(reason, Duration::from_secs(10), |m| {
            sample(m, "mlnode_gpu_failure", &[("gpu", "2"), ("reason", reason)]) == Some(1.0)
        });
        let metrics = agent.metrics();
        assert_eq!(
            utilization(&metrics, "2"),
            None,
            "{reason}: no stale reading"
        );
        assert!(
            utilization(&metrics, "3").is_some(),
            "the other GPUs keep reporting"
        );
        assert_eq!(
            sample(&metrics, "mlnode_gpu_lost", &[("gpu", "2")]),
            Some(0.0)
        );
    }
    scenario.set(2, "handle_error", json!(0));
    agent.wait_for("read again", Duration::from_secs(10), |m| {
        utilization(m, "2").is_some() && !m.contains("mlnode_gpu_failure{")
    });
}

/// When NVML stops answering altogether (it cannot count the GPUs), the collector is down and no
/// reading is exported as if current; when it answers again, both come back. One log line each way.
#[test]
fn a_failing_nvml_is_reported_down_and_its_readings_dropped() {
    let scenario = Scenario::new(8);
    let agent = start(&scenario, "");
    let up = |m: &str| sample(m, "mlnode_collector_up", &[("collector", "nvml")]);
    agent.wait_for("8 GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0) && up(m) == Some(1.0)
    });
    // The fake answers NVML_ERROR_UNKNOWN to every call without its scenario.
    let hidden = scenario.path().with_extension("hidden");
    std::fs::rename(scenario.path(), &hidden).unwrap();
    agent.wait_for("collector down", Duration::from_secs(10), |m| {
        up(m) == Some(0.0)
    });
    let metrics = agent.metrics();
    for gone in [
        "mlnode_gpu_count",
        "mlnode_gpu_utilization_ratio",
        "mlnode_gpu_memory_used_bytes",
    ] {
        assert!(
            !metrics.lines().any(|l| l.starts_with(gone)),
            "{gone} still exported:\n{metrics}"
        );
    }
    std::fs::rename(&hidden, scenario.path()).unwrap();
    agent.wait_for("collector up again", Duration::from_secs(10), |m| {
        up(m) == Some(1.0) && sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
    });
    let log = agent.log();
    assert_eq!(log.matches("NVML stopped answering").count(), 1, "{log}");
    assert_eq!(log.matches("NVML answers again").count(), 1, "{log}");
}

/// A wedged driver blocks `nvmlInit`: the agent still serves (model caches, /healthz) with the
/// GPU collector down, and SIGTERM still stops it promptly.
#[test]
fn a_blocking_nvml_init_holds_up_nothing_else() {
    let mut scenario = Scenario::new(8);
    scenario.value["init_delay_ms"] = json!(120_000);
    scenario.write();
    let model = common::PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let config = format!(
        "nvml:\n  library: {:?}\n{}",
        fake_nvml().display().to_string(),
        common::agent::model_config("llama", model.root(), &manifest)
    );
    let mut agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    agent.wait_for(
        "the cache verified while NVML blocks",
        Duration::from_secs(20),
        |m| sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0),
    );
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_collector_up", &[("collector", "nvml")]),
        Some(0.0)
    );
    assert_eq!(agent.get("/healthz").0, 200);
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0), "{}", agent.log());
    assert!(elapsed < EXIT_BOUND, "{elapsed:?}");
}

/// dcgm-exporter's releases write `Hostname`, its main branch `hostname` (#655): every series
/// carries the one chosen, or both.
#[test]
fn the_node_label_is_spelled_as_chosen_on_every_series() {
    let scenario = Scenario::new(1);
    for (choice, present, absent) in [
        ("Hostname", &["Hostname"][..], &["hostname"][..]),
        ("hostname", &["hostname"], &["Hostname"]),
        ("both", &["Hostname", "hostname"], &[]),
    ] {
        let agent = start(&scenario, &format!("hostname_label: {choice}\n"));
        agent.wait_for("a GPU read", Duration::from_secs(20), |m| {
            sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]).is_some()
        });
        let m = agent.metrics();
        for series in ["mlnode_gpu_temperature_celsius", "mlnode_build_info"] {
            let line = m
                .lines()
                .find(|l| l.starts_with(&format!("{series}{{")))
                .unwrap();
            for label in present {
                assert!(
                    line.contains(&format!("{label}=\"test-node\"")),
                    "{choice}: {line}"
                );
            }
            for label in absent {
                assert!(!line.contains(&format!("{label}=")), "{choice}: {line}");
            }
        }
    }
}

fn gpu3_assigned() -> fake_kubelet::api::ListPodResourcesResponse {
    common::kubelet::response(&[
        (
            "vllm-llama-0",
            "nvidia.com/gpu",
            &["GPU-00000003-1111-2222-3333-444444444443"],
        ),
        (
            "fpga-job",
            "example.com/fpga",
            &["GPU-00000004-1111-2222-3333-444444444444"],
        ),
    ])
}

#[test]
fn pod_labels_from_the_kubelet_on_the_assigned_gpu_only() {
    let scenario = Scenario::new(8);
    let kubelet = common::kubelet::FakeKubelet::serve(gpu3_assigned());
    let extra = format!(
        "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n{extra}",
        fake_nvml().display().to_string()
    );
    // An API server is configured, but the kubelet reports no DRA device: nothing asks it for
    // ResourceSlices.
    let api = common::needs!(ClusterNode::gpu(&[]));
    let agent = Agent::start_with_env(
        &config,
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    agent.wait_for("pod labels", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_temperature_celsius",
            &[
                ("gpu", "3"),
                ("pod", "vllm-llama-0"),
                ("namespace", "inference"),
                ("container", "vllm"),
            ],
        ) == Some(43.0)
    });
    let metrics = agent.metrics();
    let labelled: Vec<&str> = metrics.lines().filter(|l| l.contains("pod=\"")).collect();
    assert!(
        labelled.iter().all(|l| l.contains("gpu=\"3\"")),
        "only GPU 3 is assigned: {labelled:#?}"
    );
    assert!(
        !metrics.contains("fpga-job"),
        "other resources' devices are not GPUs"
    );
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.path.contains("resourceslices")),
        "{:#?}",
        api.requests()
    );
}

#[test]
fn gpus_allocated_through_dra_are_named_by_the_drivers_resource_slices() {
    let mut scenario = Scenario::new(2);
    scenario.set(
        1,
        "mig",
        json!({"enabled": true, "monitor_capability": false, "instances": [
            {"uuid": "MIG-11111111-2222-3333-4444-555555555555", "gpu_instance_id": 7, "compute_instance_id": 0, "profile": "1g.10gb",
             "memory": {"total": 10_737_418_240u64, "used": 1u64 << 30, "free": 9_663_676_416u64, "reserved": 0}}]}),
    );
    let api = common::needs!(ClusterNode::gpu(&[]));
    let kubelet =
        common::kubelet::FakeKubelet::serve(fake_kubelet::api::ListPodResourcesResponse {
            pod_resources: vec![
                common::kubelet::dra_claim("vllm-0", api.name(), &["gpu-0"]),
                common::kubelet::dra_claim("vllm-small-0", api.name(), &["gpu-1-mig-1g10gb-19-0"]),
            ],
        });
    let extra = format!(
        "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n{extra}",
        fake_nvml().display().to_string()
    );
    let agent = Agent::start_with_env(
        &config,
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    // The kubelet's first DRA device starts a watch of this node's slices; the driver has published
    // none yet, so nothing can be named.
    common::wait_until(
        "a watch of the node's slices",
        Duration::from_secs(20),
        || {
            api.requests()
                .iter()
                .any(|r| r.path.contains("resourceslices") && r.path.contains("watch=true"))
                .then_some(())
                .ok_or_else(String::new)
        },
    );
    let slice_requests: Vec<String> = api
        .requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("resourceslices"))
        .collect();
    assert!(
        slice_requests.iter().all(
            |p| p.starts_with("/apis/resource.k8s.io/v1/resourceslices?")
                && p.contains(&format!("fieldSelector=spec.nodeName%3D{}", api.name()))
        ),
        "{slice_requests:#?}"
    );
    assert!(!agent.metrics().contains("pod=\""));

    // The driver publishes its slice; the watch delivers it and the next List is named.
    api.put_resource_slice(common::cluster_node::nvidia_resource_slice(api.name()));
    agent.wait_for(
        "DRA-allocated GPUs labelled",
        Duration::from_secs(20),
        |m| {
            sample(
                m,
                "mlnode_gpu_temperature_celsius",
                &[("gpu", "0"), ("pod", "vllm-0"), ("container", "vllm")],
            )
            .is_some()
                && sample(
                    m,
                    "mlnode_gpu_mig_memory_used_bytes",
                    &[("gpu", "1"), ("GPU_I_ID", "7"), ("pod", "vllm-small-0")],
                ) == Some(1_073_741_824.0)
        },
    );
    let metrics = agent.metrics();
    assert!(
        !metrics
            .lines()
            .any(|l| l.contains("gpu=\"1\"") && l.contains("pod=\"") && !l.contains("GPU_I_ID")),
        "the claim holds a MIG device of GPU 1, not GPU 1"
    );
}

#[test]
fn legacy_pod_label_names() {
    let scenario = Scenario::new(8);
    let kubelet = common::kubelet::FakeKubelet::serve(gpu3_assigned());
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pod_labels: legacy\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        fake_nvml().display().to_string(),
        kubelet.socket().display().to_string()
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    agent.wait_for("legacy labels", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_lost",
            &[
                ("gpu", "3"),
                ("pod_name", "vllm-llama-0"),
                ("pod_namespace", "inference"),
                ("container_name", "vllm"),
            ],
        )
        .is_some()
    });
}

#[test]
fn absent_pod_resources_socket_logs_once_and_changes_nothing_else() {
    let scenario = Scenario::new(8);
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\nkubelet:\n  pod_resources_socket: /nonexistent/kubelet.sock\n  pod_resources_interval: 100ms\n",
        fake_nvml().display().to_string()
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    // Several failed Lists, counted: the log must still say it once.
    agent.wait_for("GPUs and failed Lists", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
            && sample(m, "mlnode_kubelet_pod_resources_errors_total", &[]).is_some_and(|n| n >= 4.0)
    });
    let log = agent.log();
    assert_eq!(
        log.matches("pod-resources API is not available").count(),
        1,
        "{log}"
    );
    assert!(log.contains("/nonexistent/kubelet.sock"));
    assert_eq!(agent.get("/healthz").0, 200);
}

/// The nvidia-smi CSV (`--format=csv,nounits`, header included) a real GPU with the scenario's
/// state would print.
fn nvidia_smi_csv(scenario: &Value) -> String {
    let mib = |v: &Value| v.as_u64().unwrap() >> 20;
    let yes_no = |v: &Value| if v.as_bool().unwrap() { "Yes" } else { "No" };
    let mut csv = String::from(
        "index, uuid, pci.bus_id, name, driver_version, memory.total [MiB], memory.reserved [MiB], \
         memory.used [MiB], memory.free [MiB], temperature.gpu, temperature.memory, power.draw [W], \
         clocks.sm [MHz], clocks.mem [MHz], utilization.gpu [%], utilization.memory [%], \
         utilization.encoder [%], utilization.decoder [%], clocks_event_reasons.active, \
         remapped_rows.correctable, remapped_rows.uncorrectable, remapped_rows.pending, \
         remapped_rows.failure\n",
    );
    for (i, d) in scenario["devices"].as_array().unwrap().iter().enumerate() {
        let rows = &d["remapped_rows"];
        csv.push_str(&format!(
            "{i}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {:.2}, {}, {}, {}, {}, {}, {}, 0x{:016X}, {}, {}, {}, {}\n",
            d["uuid"].as_str().unwrap(),
            d["pci_bus_id"].as_str().unwrap(),
            d["name"].as_str().unwrap(),
            scenario["driver_version"].as_str().unwrap(),
            mib(&d["memory"]["total"]),
            mib(&d["memory"]["reserved"]),
            mib(&d["memory"]["used"]),
            mib(&d["memory"]["free"]),
            d["temperature_c"],
            d["memory_temp_c"],
            d["power_mw"].as_f64().unwrap() / 1000.0,
            d["sm_clock_mhz"],
            d["mem_clock_mhz"],
            d["utilization"]["gpu"],
            d["utilization"]["memory"],
            d["encoder_util_pct"],
            d["decoder_util_pct"],
            d["clocks_event_reasons"].as_u64().unwrap(),
            rows["correctable"],
            rows["uncorrectable"],
            yes_no(&rows["pending"]),
            yes_no(&rows["failed"]),
        ));
    }
    csv
}

/// tests/gpu-smoke.sh's comparison, run on the fake GPUs: it must pass when the agent and
/// nvidia-smi agree, and catch a field that does not.
#[test]
fn gpu_smoke_comparison_passes_on_agreement_and_catches_a_mismatch() {
    let scenario = Scenario::new(8);
    let agent = start(&scenario, "  dcgm_names: true\n");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "7")]).is_some()
    });
    let dir = tempfile::tempdir().unwrap();
    let (metrics, smi, log) = (
        dir.path().join("metrics.txt"),
        dir.path().join("smi.csv"),
        dir.path().join("agent.log"),
    );
    std::fs::write(&metrics, agent.metrics()).unwrap();
    std::fs::write(&log, agent.log()).unwrap();
    let compare = |csv: &str| {
        std::fs::write(&smi, csv).unwrap();
        std::process::Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu_smoke_compare.py"))
            .args([&metrics, &smi, &log])
            .output()
            .unwrap()
    };
    let agree = compare(&nvidia_smi_csv(&scenario.value));
    let report = String::from_utf8_lossy(&agree.stdout);
    assert!(
        agree.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&agree.stderr)
    );
    for field in [
        "| 7 | memory.reserved |",
        "| 7 | clocks_event_reasons.active |",
        "| 7 | remapped_rows.uncorrectable | 7.0 | 7.0 | yes |",
        "| 7 | DCGM_FI_* present | 10/10 |",
    ] {
        assert!(report.contains(field), "{field}\n{report}");
    }
    assert!(report.contains("0 mismatch(es)"), "{report}");

    // A hotter GPU, a power-cap reason and a pending remap the agent did not see: three mismatches.
    let mut differs = scenario.value.clone();
    differs["devices"][1]["temperature_c"] = json!(90);
    differs["devices"][2]["clocks_event_reasons"] = json!(0x5);
    differs["devices"][3]["remapped_rows"]["pending"] = json!(true);
    let disagree = compare(&nvidia_smi_csv(&differs));
    assert_eq!(disagree.status.code(), Some(1));
    let report = String::from_utf8_lossy(&disagree.stdout);
    assert!(report.contains("3 mismatch(es)"), "{report}");
}

#[test]
fn a_hanging_nvml_call_drops_the_readings_without_stalling_scrapes() {
    let mut scenario = Scenario::new(2);
    let agent = start(&scenario, "");
    agent.wait_for("GPUs", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_utilization_ratio", &[("gpu", "1")]).is_some()
    });
    // GPU 1's driver starts blocking every call for 8 s: a round now takes minutes.
    scenario.set(1, "call_delay_ms", json!(8000));
    agent.wait_for("readings dropped", Duration::from_secs(30), |m| {
        sample(m, "mlnode_gpu_utilization_ratio", &[]).is_none()
    });
    let started = std::time::Instant::now();
    let m = agent.metrics();
    // A scrape that waited on the driver would take a call's 8 s; the bound leaves a loaded
    // machine room.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "a scrape does not wait on the driver"
    );
    assert!(sample(&m, "mlnode_gpu_readings_age_seconds", &[]).is_some_and(|age| age > 3.0));
    assert_eq!(
        sample(&m, "mlnode_gpu_count", &[]),
        Some(2.0),
        "the GPUs are still named"
    );
    assert_eq!(
        sample(&m, "mlnode_gpu_utilization_ratio", &[("gpu", "0")]),
        None,
        "GPU 0 was read in a round that did not finish: not current either"
    );
    scenario.set(1, "call_delay_ms", json!(0));
    agent.wait_for("readings back", Duration::from_secs(30), |m| {
        sample(m, "mlnode_gpu_utilization_ratio", &[("gpu", "1")]).is_some()
    });
    assert!(
        agent.log().contains("an NVML call was hanging"),
        "{}",
        agent.log()
    );
}

#[test]
fn mig_devices_are_series_of_their_own_with_their_pods() {
    let mut scenario = Scenario::new(2);
    let instance = |uuid: &str, gi: u32, profile: &str, used: u64| {
        json!({"uuid": uuid, "gpu_instance_id": gi, "compute_instance_id": 0, "profile": profile,
               "memory": {"total": 10_737_418_240u64, "used": used, "free": 10_737_418_240u64 - used, "reserved": 0}})
    };
    // GPU instance 7 has GPM counters of its own (nvmlGpmMigSampleGet); instance 2 none.
    let with_gpm = |mut instance: Value| {
        instance["gpm"] = json!({"graphics_util": 40.0, "sm_util": 35.0, "any_tensor_util": 20.0, "dram_bw_util": 10.0});
        instance
    };
    // GPU 0 as a MIG-enabled H100 seen without the mig/monitor capability: two instances.
    scenario.set(
        0,
        "mig",
        json!({"enabled": true, "monitor_capability": false, "instances": [
            with_gpm(instance("MIG-11111111-2222-3333-4444-555555555555", 7, "1g.10gb", 1 << 30)),
            instance("MIG-66666666-7777-8888-9999-000000000000", 2, "3g.40gb", 2 << 30),
        ]}),
    );
    // The device plugin's mixed strategy (a resource per profile) and single strategy
    // (nvidia.com/gpu), both with EKS's ::N replica suffix.
    let kubelet = common::kubelet::FakeKubelet::serve(common::kubelet::response(&[
        (
            "vllm-small-0",
            "nvidia.com/mig-1g.10gb",
            &["MIG-11111111-2222-3333-4444-555555555555::0"],
        ),
        (
            "vllm-mid-0",
            "nvidia.com/gpu",
            &["MIG-66666666-7777-8888-9999-000000000000"],
        ),
    ]));
    let extra = format!(
        "  dcgm_names: true\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let agent = start(&scenario, &extra);
    agent.wait_for("MIG instances with pods", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_mig_memory_used_bytes",
            &[("GPU_I_ID", "7"), ("pod", "vllm-small-0")],
        )
        .is_some()
            && sample(
                m,
                "mlnode_gpu_mig_memory_used_bytes",
                &[("GPU_I_ID", "2"), ("pod", "vllm-mid-0")],
            )
            .is_some()
    });
    let m = agent.metrics();
    let parent = [
        ("gpu", "0"),
        ("UUID", "GPU-00000000-1111-2222-3333-444444444440"),
    ];
    assert_eq!(sample(&m, "mlnode_gpu_mig_mode", &parent), Some(1.0));
    assert_eq!(
        sample(&m, "mlnode_gpu_mig_mode", &[("gpu", "1")]),
        Some(0.0)
    );
    // What NVML refuses on a MIG GPU is absent, not 0; the rest of it is read.
    for absent in [
        "mlnode_gpu_utilization_ratio",
        "mlnode_gpu_memory_used_bytes",
    ] {
        assert_eq!(sample(&m, absent, &[("gpu", "0")]), None, "{absent}");
    }
    assert!(sample(&m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]).is_some());
    assert!(sample(&m, "mlnode_gpu_memory_used_bytes", &[("gpu", "1")]).is_some());
    // dcgm-exporter's per-instance framebuffer series, labelled GPU_I_ID and GPU_I_PROFILE.
    assert_eq!(
        sample(
            &m,
            "DCGM_FI_DEV_FB_USED",
            &[
                parent[0],
                parent[1],
                ("GPU_I_ID", "2"),
                ("GPU_I_PROFILE", "3g.40gb"),
                ("pod", "vllm-mid-0")
            ]
        ),
        Some(2048.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_mig_instance_info",
            &[
                ("GPU_I_ID", "7"),
                ("GPU_I_PROFILE", "1g.10gb"),
                ("mig_uuid", "MIG-11111111-2222-3333-4444-555555555555")
            ]
        ),
        Some(1.0)
    );
    assert!(
        !m.lines()
            .any(|l| l.contains("pod=\"") && !l.contains("GPU_I_ID")),
        "the pods hold MIG devices, not the whole GPU"
    );
    // Per-instance GPM, under its own names and dcgm-exporter's (told apart by GPU_I_ID).
    agent.wait_for(
        "GPU instance 7's GPM ratios",
        Duration::from_secs(10),
        |m| {
            sample(
                m,
                "mlnode_gpu_mig_sm_active_ratio",
                &[("GPU_I_ID", "7"), ("pod", "vllm-small-0")],
            ) == Some(0.35)
        },
    );
    let m = agent.metrics();
    for (ours, dcgm, value) in [
        (
            "mlnode_gpu_mig_graphics_engine_active_ratio",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            0.4,
        ),
        (
            "mlnode_gpu_mig_sm_active_ratio",
            "DCGM_FI_PROF_SM_ACTIVE",
            0.35,
        ),
        (
            "mlnode_gpu_mig_tensor_pipe_active_ratio",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            0.2,
        ),
        (
            "mlnode_gpu_mig_dram_active_ratio",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            0.1,
        ),
    ] {
        let instance7 = [("GPU_I_ID", "7"), ("GPU_I_PROFILE", "1g.10gb")];
        assert_eq!(sample(&m, ours, &instance7), Some(value), "{ours}");
        assert_eq!(sample(&m, dcgm, &instance7), Some(value), "{dcgm}");
        assert_eq!(sample(&m, ours, &[("GPU_I_ID", "2")]), None, "{ours}");
    }
    assert!(agent.log().contains("MIG"), "{}", agent.log());

    // An XID inside instance 7 (NVML's event carries its GPU and compute instance ids).
    scenario.set(
        0,
        "xid_events",
        json!([{"xid": 31, "gpu_instance_id": 7, "compute_instance_id": 0}]),
    );
    agent.wait_for("the instance's XID", Duration::from_secs(10), |m| {
        sample(
            m,
            "mlnode_gpu_mig_xid_errors_total",
            &[
                ("GPU_I_ID", "7"),
                ("GPU_I_PROFILE", "1g.10gb"),
                ("pod", "vllm-small-0"),
                ("xid", "31"),
            ],
        ) == Some(1.0)
    });
    let m = agent.metrics();
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_xid_errors_total",
            &[("gpu", "0"), ("xid", "31")]
        ),
        Some(1.0),
        "the GPU counts it too"
    );
    assert_eq!(
        sample(&m, "mlnode_gpu_mig_xid_errors_total", &[("GPU_I_ID", "2")]),
        None
    );
}

#[test]
fn an_old_drivers_library_without_the_newer_symbols_is_read_with_the_older_calls() {
    let scenario = Scenario::new(2);
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  dcgm_names: true\n",
        common::nvml::fake_nvml_old_driver().display().to_string()
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    agent.wait_for("both GPUs read twice", Duration::from_secs(30), |m| {
        sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "1")]).is_some()
            && sample(m, "mlnode_gpu_readings_age_seconds", &[]).is_some()
    });
    let m = agent.metrics();
    assert_eq!(
        sample(&m, "mlnode_collector_up", &[("collector", "nvml")]),
        Some(1.0)
    );
    // The older calls answer: throttle reasons, v1 memory, the deprecated temperature call.
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_clock_event_reason_active",
            &[("gpu", "0"), ("reason", "gpu_idle")]
        ),
        Some(1.0)
    );
    assert!(sample(&m, "mlnode_gpu_memory_free_bytes", &[("gpu", "0")]).is_some());
    assert_eq!(
        sample(&m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]),
        Some(40.0)
    );
    // What the old library has no symbol for is absent, not 0.
    for absent in [
        "mlnode_gpu_memory_reserved_bytes",
        "mlnode_gpu_sm_active_ratio",
        "mlnode_gpu_remapped_rows_total",
        "mlnode_gpu_mig_mode",
    ] {
        assert_eq!(sample(&m, absent, &[("gpu", "0")]), None, "{absent}");
    }
}

/// `verify.priority: auto` decides from what the kubelet says, not from the opens the agent saw:
/// after a restart on a node whose pods hold GPUs (it never saw their weights opened) a
/// re-verification yields to them, in the idle classes; where no pod holds an accelerator it runs
/// at full speed. Before, an agent that had seen no open ran its first verification at full speed
/// on a serving node (0.58 of the workload's throughput kept, against 0.98 idle).
#[test]
fn hashing_yields_on_a_node_whose_pods_hold_gpus() {
    let cases = [
        (gpu3_assigned(), "idle"),
        (common::kubelet::response(&[]), "normal"),
    ];
    for (kubelet_says, wanted) in cases {
        let scenario = Scenario::new(8);
        let kubelet = common::kubelet::FakeKubelet::serve(kubelet_says);
        let model = common::PlainModel::new();
        let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
        let config = format!(
            "nvml:\n  library: {:?}\n  sample_interval: 100ms\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\nverify:\n  debounce: 50ms\n{}",
            fake_nvml().display().to_string(),
            kubelet.socket().display().to_string(),
            common::agent::model_config("llama", model.root(), &manifest)
        );
        let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
        let verified = |m: &str| {
            sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0)
        };
        agent.wait_for("verified", Duration::from_secs(20), verified);
        // The kubelet has answered once the devices carry (or do not carry) its pods.
        agent.wait_for("the kubelet's answer", Duration::from_secs(20), |m| {
            sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "3")]).is_some()
        });
        std::fs::write(model.path("config.json"), b"{\"changed\": true}").unwrap();
        agent.wait_for_log("the re-verification", Duration::from_secs(20), |log| {
            log.lines()
                .any(|l| l.contains(r#""kind":"incremental""#) && l.contains("failed verification"))
        });
        let log = agent.log();
        let line = log
            .lines()
            .find(|l| l.contains(r#""kind":"incremental""#))
            .unwrap();
        assert!(
            line.contains(&format!(r#""priority":"{wanted}""#)),
            "{wanted}: {line}"
        );
    }
}

/// An agent with the GPU collector and the readiness controller on a node of the real cluster: the
/// node's `AcceleratorHealthy` condition, as the API server holds it.
pub(crate) fn start_with_readiness(scenario: &Scenario) -> Result<(Agent, ClusterNode), String> {
    let api = ClusterNode::gpu(&[])?;
    let agent = start_against(scenario, &api, Path::new("/proc/sys/kernel/random/boot_id"));
    Ok((agent, api))
}

/// The agent with the GPU collector and readiness against `api`, reading its boot id from `boot_id`.
fn start_against(scenario: &Scenario, api: &ClusterNode, boot_id: &Path) -> Agent {
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
    api: &ClusterNode,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    wait_condition_of("AcceleratorHealthy", agent, api, what, check)
}

fn wait_condition_of(
    kind: &str,
    agent: &Agent,
    api: &ClusterNode,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    common::wait_until(what, Duration::from_secs(20), || {
        let condition = api.condition(kind);
        if check(&condition) {
            Ok(condition)
        } else {
            Err(format!("{kind} is {condition}\n{}", agent.log()))
        }
    })
}

/// The driver's verdict first: a recovery action other than NONE (nvml.h's values) turns
/// `AcceleratorHealthy` False with a reason naming it and a message naming the GPU, and NONE
/// again turns it back. XIDs follow NVIDIA's catalog: 94 (RESTART_APP) is counted under its
/// action and holds nothing; 46 (RESET_GPU, no recovery action linked) holds the node through the
/// driver's NONE.
#[test]
fn accelerator_health_follows_the_drivers_recovery_action_and_nvidias_catalog() {
    let mut scenario = Scenario::new(4);
    let (agent, api) = common::needs!(start_with_readiness(&scenario));
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_gpu_recovery_action",
            &[("gpu", "2"), ("action", "none")]
        ),
        Some(1.0)
    );

    for (value, reason, label) in [
        (1, "GPUResetRequired", "gpu_reset"),
        (2, "NodeRebootRequired", "node_reboot"),
        (4, "DrainAndResetRequired", "drain_and_reset"),
        (12, "UnknownRecoveryAction", "unknown"),
    ] {
        scenario.set(2, "recovery_action", json!(value));
        let condition = wait_condition(&agent, &api, reason, |c| c["reason"] == reason);
        assert_eq!(condition["status"], "False");
        let message = condition["message"].as_str().unwrap();
        assert!(
            message.contains("GPU 2 (GPU-00000002-1111-2222-3333-444444444442, 00000000:27:00.0)")
                && message.contains(&value.to_string()),
            "{message}"
        );
        assert_eq!(
            sample(
                &agent.metrics(),
                "mlnode_gpu_recovery_action",
                &[("gpu", "2"), ("action", label)]
            ),
            Some(1.0)
        );
    }
    scenario.set(2, "recovery_action", json!(0));
    wait_condition(&agent, &api, "NONE again", |c| c["status"] == "True");

    scenario.set(3, "xid_events", json!([94]));
    agent.wait_for("XID 94 counted", Duration::from_secs(10), |m| {
        sample(
            m,
            "mlnode_gpu_xid_errors_total",
            &[
                ("gpu", "3"),
                ("xid", "94"),
                ("immediate_action", "RESTART_APP"),
            ],
        ) == Some(1.0)
    });
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(api.condition("AcceleratorHealthy")["status"], "True");

    // The fake delivers each entry of the list once: 94 was, 46 is next.
    scenario.set(3, "xid_events", json!([94, 46]));
    let condition = wait_condition(&agent, &api, "XID 46", |c| c["reason"] == "FatalXID");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("XID 46 (ROBUST_CHANNEL_GPU_TIMEOUT_ERROR, RESET_GPU)"),
        "{condition}"
    );
}

/// A driver before R565 answers NOT_SUPPORTED for field 230: the GPU has no recovery-action
/// series, the agent says once that NVIDIA's catalog decides alone, and XID 79 (RESTART_BM) holds.
#[test]
fn without_the_recovery_action_the_catalog_decides_and_it_is_said_once() {
    let mut scenario = Scenario::new(2);
    for gpu in 0..2 {
        scenario.value["devices"][gpu]
            .as_object_mut()
            .unwrap()
            .remove("recovery_action");
    }
    scenario.write();
    let (agent, api) = common::needs!(start_with_readiness(&scenario));
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    assert!(!agent.metrics().contains("mlnode_gpu_recovery_action"));
    scenario.set(1, "xid_events", json!([79]));
    wait_condition(&agent, &api, "XID 79", |c| c["reason"] == "FatalXID");
    let log = agent.log();
    assert_eq!(
        log.matches("the driver gives no GPU recovery action")
            .count(),
        2,
        "once per GPU: {log}"
    );
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

/// On an NVSwitch system CUDA fails until Fabric Manager has registered the GPU: NOT_STARTED and
/// IN_PROGRESS hold the node (`FabricNotReady`), COMPLETED with an error fails it (`FabricFailed`),
/// COMPLETED with SUCCESS lets it back in. The fake answers each struct version as a driver of
/// that header does: a driver with 12.x headers refuses v3, so the agent asks again with v2 and
/// still reads the health mask; a degraded bandwidth is reported and not gated.
#[test]
fn fabric_registration_holds_the_node_until_it_completes() {
    let mut scenario = Scenario::new(2);
    scenario.set(
        0,
        "fabric",
        json!({"state": 1, "status": 0, "max_version": 2}),
    );
    let (agent, api) = common::needs!(start_with_readiness(&scenario));
    let condition = wait_condition(&agent, &api, "not started", |c| {
        c["reason"] == "FabricNotReady"
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("not started"),
        "{condition}"
    );
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_fabric_state", &[("gpu", "0")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_fabric_state", &[("gpu", "1")]),
        None,
        "a GPU without a fabric has no fabric series"
    );
    scenario.set(0, "fabric", json!({"state": 2, "max_version": 2}));
    wait_condition(&agent, &api, "in progress", |c| {
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("in progress")
    });
    scenario.set(
        0,
        "fabric",
        json!({"state": 3, "status": 999, "max_version": 2}),
    );
    wait_condition(&agent, &api, "failed", |c| c["reason"] == "FabricFailed");
    // Completed; DEGRADED_BW TRUE (1 at bits 0-1), ROUTE_UNHEALTHY FALSE (2 at bits 4-5).
    scenario.set(
        0,
        "fabric",
        json!({"state": 3, "status": 0, "health_mask": 0b10_0001, "max_version": 2}),
    );
    wait_condition(&agent, &api, "completed", |c| c["status"] == "True");
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_gpu_fabric_healthy", &[("gpu", "0")]),
        Some(1.0)
    );
    for (check, value) in [
        ("degraded_bandwidth", Some(1.0)),
        ("route_unhealthy", Some(0.0)),
        ("route_recovery", None),
    ] {
        assert_eq!(
            sample(
                &metrics,
                "mlnode_gpu_fabric_health",
                &[("gpu", "0"), ("check", check)]
            ),
            value,
            "{check}"
        );
    }
    // A driver that takes no versioned struct: the deprecated call, no health mask.
    scenario.set(0, "fabric", json!({"state": 2, "max_version": 0}));
    wait_condition(&agent, &api, "v1", |c| c["reason"] == "FabricNotReady");
    assert!(!agent.metrics().contains("mlnode_gpu_fabric_health{"));
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

/// The files of `dir` the process `pid` holds open, as `fuser` and `nvidia-smi --gpu-reset` see
/// them: its `/proc/<pid>/fd` links.
fn held_files(pid: u32, dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// The driver asks for a reset of GPU 0 (recovery action GPU_RESET): the agent closes every NVML
/// handle (the fake's inits and shutdowns balance, no device file is held), says so in the gate and
/// a metric, keeps serving with GPU 0's series absent, and takes NVML back once GPU 0 has left the
/// bus and returned, its series back with their labels.
#[test]
fn the_agent_lets_go_of_nvml_for_a_reset_and_takes_it_back_after() {
    let mut scenario = Scenario::new(2);
    let api = common::needs!(ClusterNode::gpu(&[]));
    let agent = start_watched(&scenario, &api.kubeconfig(), api.name(), "");
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let devices = scenario.device_dir();
    assert_eq!(
        held_files(agent.pid(), &devices).len(),
        2,
        "NVML holds both GPUs' files"
    );
    scenario.set(0, "recovery_action", json!(1));
    let condition = wait_condition(&agent, &api, "released", |c| {
        c["reason"] == "GPUResetRequired"
            && c["message"]
                .as_str()
                .unwrap_or_default()
                .contains("closed every NVML handle")
    });
    assert!(
        condition["message"].as_str().unwrap().contains(
            "the driver asks for a GPU reset of GPU-00000000-1111-2222-3333-444444444440 (0000:07:00.0): the agent closed every NVML handle"
        ),
        "{condition}"
    );
    let ledger = scenario.ledger();
    assert_eq!(ledger["initialized"], 0, "{ledger}");
    assert_eq!(ledger["inits"], ledger["shutdowns"], "{ledger}");
    assert!(
        held_files(agent.pid(), &devices).is_empty(),
        "no device file held"
    );
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "mlnode_gpu_nvml_released", &[]), Some(1.0));
    assert_eq!(
        sample(&metrics, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]),
        None,
        "GPU 0's series are absent"
    );
    assert!(
        !metrics.contains("GPU-00000000-1111"),
        "nothing of GPU 0 is said"
    );
    // The reset: the GPU leaves the bus and comes back; the driver then asks for nothing.
    let bdf = "0000:07:00.0";
    scenario.remove_pci_gpu(bdf);
    agent.wait_for("GPU 0 off the bus", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_pci_devices", &[]) == Some(1.0)
    });
    scenario.set(0, "recovery_action", json!(0));
    scenario.restore_pci_gpu(bdf);
    wait_condition(&agent, &api, "taken back", |c| c["status"] == "True");
    agent.wait_for("GPU 0 read again", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]) == Some(40.0)
    });
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "mlnode_gpu_nvml_released", &[]), Some(0.0));
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_nvml_reattaches_total",
            &[("after", "reset")]
        ),
        Some(1.0)
    );
    assert_eq!(scenario.ledger()["inits"], 2);
    assert_eq!(held_files(agent.pid(), &devices).len(), 2);
}

/// An operator or a reset janitor asks through the node annotation `mlnode.dev/release-gpus`, seen
/// through one watch of the node on the real API server (the agent's pod's token, the shipped
/// RBAC): every GPU is let go of (no device file held, NVML shut down), the gate says who asked
/// (`GPUsReleased`), and NVML is taken back when the annotation is removed.
#[test]
fn the_release_annotation_lets_go_of_every_gpu_until_it_is_removed() {
    let control_plane = common::needs!(common::control_plane::shared());
    let objects = common::needs!(common::kustomize::render_with("overlays/gpu", &[]));
    let on = common::control_plane::AgentOnNode::start(
        control_plane,
        &objects,
        &control_plane.unique("node"),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = control_plane.token_kubeconfig(&on.token, dir.path());
    let scenario = Scenario::new(2);
    let agent = start_watched(&scenario, &kubeconfig, &on.node, "");
    let condition = |what: &str, check: &dyn Fn(&Value) -> bool| {
        common::wait_until(what, Duration::from_secs(30), || {
            let node = control_plane.get(&["node", &on.node]);
            let condition = common::control_plane::condition(&node, "AcceleratorHealthy");
            if check(&condition) {
                Ok(condition)
            } else {
                Err(format!(
                    "AcceleratorHealthy is {condition}\n{}",
                    agent.log()
                ))
            }
        })
    };
    condition("healthy at start", &|c| c["status"] == "True");
    let devices = scenario.device_dir();
    let annotation = "mlnode.dev/release-gpus=janitor: reset GPU 1";
    control_plane.admin(&["annotate", "node", &on.node, annotation], "");
    let released = condition("released", &|c| c["reason"] == "GPUsReleased");
    assert!(
        released["message"].as_str().unwrap().contains(
            "the node's mlnode.dev/release-gpus annotation (\"janitor: reset GPU 1\") asks for a release of GPU-00000000-1111-2222-3333-444444444440 (0000:07:00.0), GPU-00000001-1111-2222-3333-444444444441 (0000:17:00.0)"
        ),
        "{released}"
    );
    assert!(
        held_files(agent.pid(), &devices).is_empty(),
        "no device file held"
    );
    assert_eq!(scenario.ledger()["initialized"], 0);
    let metrics = agent.metrics();
    assert!(
        sample(
            &metrics,
            "mlnode_kube_requests_total",
            &[("verb", "watch"), ("resource", "nodes"), ("code", "200")]
        )
        .is_some(),
        "one watch of the node: {metrics}"
    );
    assert_eq!(
        common::control_plane::refused_requests(&metrics),
        Vec::<String>::new()
    );
    control_plane.admin(
        &["annotate", "node", &on.node, "mlnode.dev/release-gpus-"],
        "",
    );
    condition("taken back", &|c| c["status"] == "True");
    read_again_after(&agent, "annotation_removed", &devices);
}

/// The GPU Operator's MIG manager reconfiguring the node, its states set on the Node's
/// `nvidia.com/mig.config.state` label as NVIDIA/mig-parted's reconfigure-mig.sh sets them, seen
/// through the agent's one watch of its node on the real API server: NVML is let go of while it
/// is `pending` (no device file held, the gate and the log say why) and taken back at `success`;
/// once it says `rebooting`, NVML stays released whatever follows, until the agent restarts.
#[test]
fn the_mig_managers_reconfiguration_releases_nvml_until_it_is_done() {
    let scenario = Scenario::new(2);
    let api = common::needs!(ClusterNode::gpu(&[]));
    let agent = start_watched(&scenario, &api.kubeconfig(), api.name(), "");
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let devices = scenario.device_dir();
    // A finished reconfiguration from before asks for nothing.
    api.label_node("nvidia.com/mig.config.state", "success");
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(held_files(agent.pid(), &devices).len(), 2);
    api.label_node("nvidia.com/mig.config.state", "pending");
    let released = wait_condition(&agent, &api, "released", |c| {
        c["reason"] == "MIGReconfiguring"
    });
    let message = released["message"].as_str().unwrap();
    assert!(
        message.contains("the GPU Operator's MIG manager is changing the MIG layout (nvidia.com/mig.config.state=pending) of GPU-00000000-1111-2222-3333-444444444440 (0000:07:00.0), GPU-00000001-1111-2222-3333-444444444441 (0000:17:00.0): the agent closed every NVML handle")
            && message.contains("once it is done (the label leaves pending), or after 10m"),
        "{released}"
    );
    assert!(held_files(agent.pid(), &devices).is_empty());
    assert_eq!(scenario.ledger()["initialized"], 0);
    assert!(agent.log().contains("MIG manager is reconfiguring"));
    api.label_node("nvidia.com/mig.config.state", "success");
    wait_condition(&agent, &api, "taken back", |c| c["status"] == "True");
    read_again_after(&agent, "mig_config_done", &devices);
    // A MIG mode change that needs a reboot: released until the agent starts again.
    api.label_node("nvidia.com/mig.config.state", "pending");
    wait_condition(&agent, &api, "released again", |c| {
        c["reason"] == "MIGReconfiguring"
    });
    api.label_node("nvidia.com/mig.config.state", "rebooting");
    let rebooting = wait_condition(&agent, &api, "until the restart", |c| {
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("when the agent starts again after the node's reboot")
    });
    assert!(
        !rebooting["message"]
            .as_str()
            .unwrap()
            .contains("nvml.release_timeout"),
        "{rebooting}"
    );
    api.label_node("nvidia.com/mig.config.state", "success");
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_nvml_released", &[]),
        Some(1.0)
    );
    assert!(held_files(agent.pid(), &devices).is_empty());
    assert_eq!(
        common::control_plane::refused_requests(&agent.metrics()),
        Vec::<String>::new()
    );
}

/// Waits until NVML is taken back `after` a release, both GPUs read again and their device files
/// held again.
fn read_again_after(agent: &Agent, after: &str, devices: &Path) {
    agent.wait_for("read again", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_nvml_reattaches_total", &[("after", after)]) == Some(1.0)
            && sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "1")]) == Some(41.0)
    });
    assert_eq!(held_files(agent.pid(), devices).len(), 2);
}

/// A reset that never comes: NVML is taken back after `nvml.release_timeout`, said once, and not
/// let go again while the driver keeps asking for the same GPU: the gate then says what the driver
/// asks for.
#[test]
fn a_release_is_bounded_by_its_timeout() {
    let mut scenario = Scenario::new(1);
    let api = common::needs!(ClusterNode::gpu(&[]));
    let agent = start_watched(
        &scenario,
        &api.kubeconfig(),
        api.name(),
        "  release_timeout: 5s\n",
    );
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    scenario.set(0, "recovery_action", json!(1));
    let released = |c: &Value| {
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("closed every NVML handle")
    };
    wait_condition(&agent, &api, "released", |c| released(c));
    wait_condition(&agent, &api, "taken back", |c| {
        c["reason"] == "GPUResetRequired" && !released(c)
    });
    agent.wait_for("the timeout counted", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_nvml_reattaches_total",
            &[("after", "timeout")],
        ) == Some(1.0)
    });
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_nvml_released", &[]),
        Some(0.0)
    );
    assert_eq!(scenario.ledger()["inits"], 2, "released once only");
    assert!(
        agent
            .log()
            .contains("no reset seen within nvml.release_timeout"),
        "{}",
        agent.log()
    );
}

/// A GPU unbound from the driver (for a VM, or a reset by unbind and bind) and bound again, with no
/// restart: NVML is initialised again each time, the gone GPU's series disappear and return with
/// its labels, and the count verdict names it while it is off the driver.
#[test]
fn a_gpu_unbound_and_bound_again_is_followed_without_a_restart() {
    let mut scenario = Scenario::new(2);
    let api = common::needs!(ClusterNode::gpu(&[]));
    let agent = start_watched(&scenario, &api.kubeconfig(), api.name(), "");
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let bdf = "0000:17:00.0";
    scenario.set(1, "bound", json!(false));
    scenario.unbind(bdf);
    let condition = wait_condition(&agent, &api, "GPU 1 unbound", |c| {
        c["reason"] == "GPUCountMismatch"
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("not listed 0000:17:00.0"),
        "{condition}"
    );
    agent.wait_for("one GPU listed", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(1.0)
            && sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "1")]).is_none()
    });
    assert!(
        !agent.metrics().contains("GPU-00000001-1111"),
        "GPU 1's series are gone"
    );
    scenario.set(1, "bound", json!(true));
    scenario.bind(bdf);
    wait_condition(&agent, &api, "GPU 1 back", |c| c["status"] == "True");
    agent.wait_for("GPU 1 read again", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_temperature_celsius",
            &[
                ("gpu", "1"),
                ("UUID", "GPU-00000001-1111-2222-3333-444444444441"),
            ],
        ) == Some(41.0)
    });
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_gpu_nvml_reinits_total", &[]),
        Some(2.0),
        "once for each change"
    );
}

/// XID 13 is the application's fault alone and NVIDIA's catalog resolves it by its history: the
/// node stays in through three on one GPU and is held at the fourth within the threshold's window
/// (`readiness.xid_thresholds`), the reason naming the GPU and the XID; XID 43, not listed, never
/// holds it however often it comes.
#[test]
fn repeated_xids_beyond_their_threshold_hold_the_node() {
    let mut scenario = Scenario::new(2);
    let api = common::needs!(ClusterNode::gpu(&[]));
    let agent = start_configured(
        &scenario,
        (&api.kubeconfig(), api.name()),
        Path::new("/proc/sys/kernel/random/boot_id"),
        "  xid_thresholds: {13: {count: 3, window: 1h}}\n",
    );
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    scenario.set(1, "xid_events", json!([13, 13, 13, 43, 43, 43, 43, 43]));
    agent.wait_for("eight XIDs", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_xid_errors_total",
            &[("gpu", "1"), ("xid", "43")],
        ) == Some(5.0)
            && sample(
                m,
                "mlnode_gpu_xid_errors_total",
                &[("gpu", "1"), ("xid", "13")],
            ) == Some(3.0)
    });
    wait_rounds_of_readiness(&agent, 2.0);
    assert_eq!(api.condition("AcceleratorHealthy")["status"], "True");
    // The fake delivers the events past those it already has.
    scenario.set(1, "xid_events", json!([13, 13, 13, 43, 43, 43, 43, 43, 13]));
    let condition = wait_condition(&agent, &api, "the fourth 13", |c| {
        c["reason"] == "XIDRepeated"
    });
    assert!(
        condition["message"].as_str().unwrap().contains(
            "GPU 1 (GPU-00000001-1111-2222-3333-444444444441, 00000000:17:00.0) reported XID 13 (ROBUST_CHANNEL_GR_EXCEPTION) more than 3 times within 1h"
        ),
        "{condition}"
    );
}

/// `nvmlDeviceGetRemappedRows` through the fake: a pending remapping asks for a reset (the driver's
/// recovery action says none), a failed one says the GPU needs replacing; both pass today's
/// eks-node-monitoring-agent.
#[test]
fn memory_that_cannot_heal_holds_the_node() {
    let mut scenario = Scenario::new(2);
    let (agent, api) = common::needs!(start_with_readiness(&scenario));
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    scenario.set(
        0,
        "remapped_rows",
        json!({"correctable": 0, "uncorrectable": 3, "pending": true, "failed": false}),
    );
    wait_condition(&agent, &api, "pending", |c| {
        c["reason"] == "RowRemapPending"
    });
    scenario.set(
        0,
        "remapped_rows",
        json!({"correctable": 0, "uncorrectable": 3, "pending": false, "failed": true}),
    );
    let condition = wait_condition(&agent, &api, "failed", |c| c["reason"] == "RowRemapFailed");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("needs replacing"),
        "{condition}"
    );
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_gpu_row_remap_failed",
            &[("gpu", "0")]
        ),
        Some(1.0)
    );
}

/// NVLink as nvml.h gives it: a link that was active and is no longer fails `AcceleratorHealthy`
/// naming the GPU and the link (its series says 0, the others 1), and comes back with the link; a
/// rise in the recovery-error total fails it too. The fake answers the link count (field 91), the
/// totals (fields 38/45/52/59) and `nvmlDeviceGetNvLinkState` per link as a driver does.
#[test]
fn an_nvlink_link_lost_or_retraining_holds_the_node() {
    let mut scenario = Scenario::new(2);
    let (agent, api) = common::needs!(start_with_readiness(&scenario));
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let mut nvlink = scenario.value["devices"][1]["nvlink"].clone();
    nvlink["links"][5] = json!(false);
    scenario.set(1, "nvlink", nvlink.clone());
    let condition = wait_condition(&agent, &api, "link 5 down", |c| {
        c["reason"] == "NVLinkInactive"
    });
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("GPU 1 (GPU-00000001-1111-2222-3333-444444444441, 00000000:17:00.0): NVLink link 5 was active"),
        "{message}"
    );
    let metrics = agent.metrics();
    let link = |gpu: &str, link: &str| {
        sample(
            &metrics,
            "mlnode_gpu_nvlink_link_active",
            &[("gpu", gpu), ("link", link)],
        )
    };
    assert_eq!(
        (link("1", "5"), link("1", "4"), link("0", "5")),
        (Some(0.0), Some(1.0), Some(1.0))
    );
    nvlink["links"][5] = json!(true);
    scenario.set(1, "nvlink", nvlink.clone());
    wait_condition(&agent, &api, "link 5 back", |c| c["status"] == "True");
    nvlink["recovery"] = json!(3);
    scenario.set(1, "nvlink", nvlink);
    let condition = wait_condition(&agent, &api, "recovering", |c| {
        c["reason"] == "NVLinkRecoveryErrors"
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("NVLink recovery errors rose to 3"),
        "{condition}"
    );
}

/// Every GPU on the PCI bus is accounted for: an H100 the kernel lists that NVML does not (a GPU
/// the driver lost) fails `AcceleratorHealthy` naming its bus id, and so does a bus with fewer GPUs
/// than `nvml.expected_gpus` (one gone from the bus itself).
#[test]
fn a_gpu_on_the_bus_that_nvml_does_not_list_is_missed_by_name() {
    let scenario = Scenario::new(2);
    let (agent, api) = common::needs!(start_with_readiness(&scenario));
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_pci_devices", &[]),
        Some(2.0)
    );
    scenario.add_pci_gpu("0000:c7:00.0");
    let condition = wait_condition(&agent, &api, "a third GPU on the bus", |c| {
        c["reason"] == "GPUCountMismatch"
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("the PCI bus has 3 NVIDIA GPU(s) and NVML lists 2: not listed 0000:c7:00.0"),
        "{condition}"
    );
    // GPU 1 gone from the bus itself (NVML still names it from before), the extra one too.
    for bdf in ["0000:c7:00.0", "0000:17:00.0"] {
        std::fs::remove_dir_all(scenario.pci_devices().join(bdf)).unwrap();
    }
    let condition = wait_condition(&agent, &api, "one gone from the bus", |c| {
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("2 GPU(s) expected (nvml.expected_gpus), 1 on the PCI bus")
    });
    assert_eq!(condition["status"], "False", "{condition}");
}

/// A fault outlives an agent restart and clears when fixed: XID 46 (RESET_GPU, which the driver
/// links to no recovery action) holds the node; an agent restarted on the same boot (an upgrade,
/// an OOM kill) reads it back from the condition it wrote and keeps the node unhealthy, writing no
/// premature True; a new boot id (the node rebooted) clears it; and an operator's clearing time
/// (one `kubectl annotate`) clears it too.
#[test]
fn a_held_fault_outlives_an_agent_restart_until_the_node_reboots_or_an_operator_clears_it() {
    let mut scenario = Scenario::new(2);
    let api = common::needs!(ClusterNode::gpu(&[]));
    let boot = tempfile::tempdir().unwrap();
    let boot_id = boot.path().join("boot_id");
    std::fs::write(&boot_id, "3f2b1c9e-8d7a-4c1b-9e2f-0a1b2c3d4e5f\n").unwrap();
    let mut agent = start_against(&scenario, &api, &boot_id);
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    scenario.set(1, "xid_events", json!([46]));
    let held = wait_condition(&agent, &api, "XID 46", |c| c["reason"] == "FatalXID");
    assert!(
        held["message"].as_str().unwrap().ends_with(
            "[mlnode-agent: boot 3f2b1c9e-8d7a-4c1b-9e2f-0a1b2c3d4e5f; held GPU-00000001-1111-2222-3333-444444444441=46]"
        ),
        "{held}"
    );
    assert_eq!(agent.terminate().0, Some(0));

    // The same boot: the XID is not delivered again, and the node stays out.
    scenario.set(1, "xid_events", json!([]));
    let patches_before = api.requests().len();
    let agent = start_against(&scenario, &api, &boot_id);
    wait_rounds_of_readiness(&agent, 5.0);
    let condition = api.condition("AcceleratorHealthy");
    assert_eq!(condition["status"], "False", "{condition}\n{}", agent.log());
    assert!(
        condition["message"].as_str().unwrap().contains("46"),
        "{condition}"
    );
    let wrote_true = api.requests()[patches_before..].iter().any(|r| {
        r.body["status"]["conditions"]
            .as_array()
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "AcceleratorHealthy" && c["status"] == "True")
            })
    });
    assert!(!wrote_true, "never a premature True after the restart");
    assert!(agent
        .log()
        .contains("keeping the XIDs the previous agent held on this boot"));

    // An operator clears it: every fault seen before the time named.
    let now = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
    api.annotate_node("mlnode.dev/accelerator-faults-cleared-at", &now);
    wait_condition(&agent, &api, "cleared by the operator", |c| {
        c["status"] == "True"
    });
    drop(agent);

    // The node rebooted: a new boot id, and what the old boot held is gone.
    api.annotate_node(
        "mlnode.dev/accelerator-faults-cleared-at",
        "2000-01-01T00:00:00Z",
    );
    let mut first = start_against(&scenario, &api, &boot_id);
    scenario.set(0, "xid_events", json!([79]));
    wait_condition(&first, &api, "XID 79 on GPU 0", |c| {
        c["reason"] == "FatalXID"
    });
    first.terminate();
    scenario.set(0, "xid_events", json!([]));
    std::fs::write(&boot_id, "9a8b7c6d-0000-4000-8000-000000000002\n").unwrap();
    let agent = start_against(&scenario, &api, &boot_id);
    wait_condition(&agent, &api, "a new boot", |c| c["status"] == "True");
    assert!(
        agent.log().contains("from an earlier boot"),
        "{}",
        agent.log()
    );
}

const REPAIR: &str = "  repair_condition: AcceleratedHardwareReady\n";

/// With `readiness.repair_condition`, the agent also writes `AcceleratedHardwareReady`, the type
/// Karpenter's AWS RepairPolicies and EKS node auto repair act on, with their polarity: False while
/// the driver asks for a reset (the engine replaces the node after 10 minutes of it), True again
/// when it says NONE. It is written under the agent's field manager, and carries no memory trailer.
#[test]
fn the_repair_condition_hands_a_faulty_gpu_to_the_repair_engines() {
    let mut scenario = Scenario::new(2);
    let api = common::needs!(ClusterNode::gpu(&["components/repair-condition"]));
    let boot_id = Path::new("/proc/sys/kernel/random/boot_id");
    let agent = start_configured(&scenario, (&api.kubeconfig(), api.name()), boot_id, REPAIR);
    let repair = |what, check: &dyn Fn(&Value) -> bool| {
        wait_condition_of("AcceleratedHardwareReady", &agent, &api, what, check)
    };
    let healthy = repair("healthy at start", &|c| c["status"] == "True");
    assert_eq!(healthy["reason"], "AcceleratorsHealthy");
    // The field managers as the server records them (kubectl hides them unless asked).
    let node = api
        .control_plane
        .get(&["node", api.name(), "--show-managed-fields"]);
    let owner = node["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| {
            e.pointer("/fieldsV1/f:status/f:conditions")
                .and_then(Value::as_object)
                .is_some_and(|c| c.contains_key(r#"k:{"type":"AcceleratedHardwareReady"}"#))
        })
        .map(|e| e["manager"].clone());
    assert_eq!(
        owner,
        Some(json!("mlnode-agent")),
        "written as mlnode-agent"
    );

    scenario.set(1, "recovery_action", json!(1));
    let faulty = repair("reset required", &|c| c["status"] == "False");
    assert_eq!(faulty["reason"], "GPUResetRequired");
    assert!(
        faulty["message"].as_str().unwrap().contains("GPU 1 (")
            && !faulty["message"]
                .as_str()
                .unwrap()
                .contains("[mlnode-agent:"),
        "{faulty}"
    );
    assert_eq!(
        api.condition("AcceleratorHealthy")["reason"],
        "GPUResetRequired"
    );
    scenario.set(1, "recovery_action", json!(0));
    repair("NONE again", &|c| c["status"] == "True");
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_readiness_repair_condition_refused",
            &[]
        ),
        Some(0.0)
    );
}

/// Karpenter's reboot-clearable and fatal XID policies (aws/karpenter-provider-aws v1.15.0
/// `RepairPolicies()`), as its matcher reports them.
const REBOOT_CLEARABLE: &str = "`.*XID(46|48|54|62|63|95|109|110|136|140|143|155|156|158).*`";
const FATAL: &str = "`.*XID(64|74|79|119|120).*`";

/// One fault, what the agent's two conditions say of it, and what Karpenter decides for the repair
/// condition under 1.15, 1.15 with `RebootForRepair`, and 1.14's legacy policies.
struct RepairCase {
    fault: &'static str,
    cause: fn(&mut Scenario),
    accelerator_reason: &'static str,
    repair_reason: &'static str,
    karpenter: [String; 3],
}

/// Every GPU fault reason of docs/runbooks.md through the real server and Karpenter's own matcher
/// (tests/karpenter-repair), each on a node of its own: an XID that caused or came with a fault is
/// named as eks-node-monitoring-agent names it, so Karpenter repairs after 10 minutes (rebooting a
/// reboot-clearable one where its gate allows); a fault without one waits for the catch-all's 30.
/// A heartbeat never moves `lastTransitionTime`, which Karpenter counts from.
#[test]
fn karpenter_decides_on_the_repair_condition_by_the_xid_it_names() {
    let policy = |action: &str, minutes: u32, policy: &str| {
        format!("{action} after {minutes} min, {policy}")
    };
    let legacy = policy("replace", 10, "any reason");
    let catch_all = [
        policy("replace", 30, "catch-all"),
        policy("replace", 30, "catch-all"),
        legacy.clone(),
    ];
    let cases = [
        RepairCase {
            fault: "XID 79, then the driver's NODE_REBOOT",
            cause: |s| {
                s.set(1, "xid_events", json!([79]));
                s.set(1, "recovery_action", json!(2));
            },
            accelerator_reason: "NodeRebootRequired",
            repair_reason: "NvidiaXID79Error",
            karpenter: [
                policy("replace", 10, FATAL),
                policy("replace", 10, FATAL),
                legacy.clone(),
            ],
        },
        RepairCase {
            fault: "XID 48, then the driver's GPU_RESET",
            cause: |s| {
                s.set(1, "xid_events", json!([48]));
                s.set(1, "recovery_action", json!(1));
            },
            accelerator_reason: "GPUResetRequired",
            repair_reason: "NvidiaXID48Error",
            karpenter: [
                policy("replace", 10, REBOOT_CLEARABLE),
                policy("reboot", 10, REBOOT_CLEARABLE),
                legacy.clone(),
            ],
        },
        RepairCase {
            fault: "XID 13 four times within an hour",
            cause: |s| s.set(1, "xid_events", json!([13, 13, 13, 13])),
            accelerator_reason: "XIDRepeated",
            repair_reason: "NvidiaXID13ErrorRepeated",
            karpenter: catch_all.clone(),
        },
        RepairCase {
            fault: "GPU 1 lost, no XID seen",
            cause: |s| s.set(1, "lost", json!(true)),
            accelerator_reason: "GPULost",
            repair_reason: "GPULost",
            karpenter: catch_all.clone(),
        },
        RepairCase {
            fault: "a third GPU on the bus",
            cause: |s| s.add_pci_gpu("0000:c7:00.0"),
            accelerator_reason: "GPUCountMismatch",
            repair_reason: "GPUCountMismatch",
            karpenter: catch_all.clone(),
        },
        RepairCase {
            fault: "the NVLink fabric registration failed",
            cause: |s| {
                s.set(
                    0,
                    "fabric",
                    json!({"state": 3, "status": 999, "max_version": 2}),
                )
            },
            accelerator_reason: "FabricFailed",
            repair_reason: "FabricFailed",
            karpenter: catch_all.clone(),
        },
    ];
    for case in cases {
        let mut scenario = Scenario::new(2);
        let api = common::needs!(ClusterNode::gpu(&["components/repair-condition"]));
        let boot_id = Path::new("/proc/sys/kernel/random/boot_id");
        let agent = start_configured(&scenario, (&api.kubeconfig(), api.name()), boot_id, REPAIR);
        wait_condition_of(
            "AcceleratedHardwareReady",
            &agent,
            &api,
            "healthy at start",
            |c| c["status"] == "True",
        );
        (case.cause)(&mut scenario);
        wait_condition(&agent, &api, case.fault, |c| {
            c["reason"] == case.accelerator_reason
        });
        let repair = wait_condition_of("AcceleratedHardwareReady", &agent, &api, case.fault, |c| {
            c["reason"] == case.repair_reason
        });
        assert_eq!(repair["status"], "False", "{}: {repair}", case.fault);
        let decided =
            common::karpenter::decisions_for(&api.node(), "AcceleratedHardwareReady").unwrap();
        let said: Vec<String> = decided.iter().map(common::karpenter::said).collect();
        assert_eq!(said, case.karpenter, "{}: {repair}", case.fault);
        let later = wait_condition_of(
            "AcceleratedHardwareReady",
            &agent,
            &api,
            "a heartbeat",
            |c| c["lastHeartbeatTime"] != repair["lastHeartbeatTime"],
        );
        assert_eq!(
            (&later["lastTransitionTime"], &later["reason"]),
            (&repair["lastTransitionTime"], &repair["reason"]),
            "{}: a heartbeat moves no transition",
            case.fault
        );
    }
}

/// A required collector that is not running leaves the repair condition Unknown, which no policy of
/// Karpenter's covers: no engine replaces a node for the agent's own broken install.
#[test]
fn karpenter_leaves_a_node_alone_while_the_agent_cannot_see_its_gpus() {
    let api = common::needs!(ClusterNode::gpu(&["components/repair-condition"]));
    let agent = Agent::start_with_env(
        &format!(
            "models: []\nnvml:\n  enabled: true\n  library: /nonexistent/libnvidia-ml.so.1\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\n{REPAIR}"
        ),
        &[
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    let repair = wait_condition_of("AcceleratedHardwareReady", &agent, &api, "Unknown", |c| {
        c["status"] == "Unknown"
    });
    assert_eq!(repair["reason"], "CollectorUnavailable");
    let decided =
        common::karpenter::decisions_for(&api.node(), "AcceleratedHardwareReady").unwrap();
    assert_eq!(
        decided
            .iter()
            .map(common::karpenter::said)
            .collect::<Vec<_>>(),
        ["nothing"; 3]
    );
}

/// Where another writer owns `AcceleratedHardwareReady` (eks-node-monitoring-agent, whose ready
/// reason and message are those of its cmd/eks-node-monitoring-agent/main.go), the agent never takes
/// it over: it says why in the log and a Node event, exports the refusal, and keeps writing its own
/// conditions; the other writer's condition is left exactly as it was. On the real server, so the
/// owner is found in the managed fields the server itself records for that writer's patch.
#[test]
fn a_repair_condition_another_writer_owns_is_never_taken_over() {
    let mut scenario = Scenario::new(2);
    let node = common::needs!(common::cluster_node::ClusterNode::gpu(&[
        "components/repair-condition"
    ]));
    let theirs = json!({"type": "AcceleratedHardwareReady", "status": "True", "reason": "NvidiaGPUIsReady",
        "message": "Monitoring for the Nvidia GPU system is active",
        "lastHeartbeatTime": "2026-11-30T03:58:00Z", "lastTransitionTime": "2026-11-30T03:51:00Z"});
    node.control_plane.admin(
        &[
            "patch",
            "node",
            node.name(),
            "--subresource=status",
            "--type=strategic",
            "--field-manager=eks-node-monitoring-agent",
            "-p",
            &json!({"status": {"conditions": [theirs]}}).to_string(),
        ],
        "",
    );
    let boot_id = Path::new("/proc/sys/kernel/random/boot_id");
    let agent = start_configured(
        &scenario,
        (&node.api.kubeconfig(), node.name()),
        boot_id,
        REPAIR,
    );
    agent.wait_for("the refusal", Duration::from_secs(30), |m| {
        sample(m, "mlnode_readiness_repair_condition_refused", &[]) == Some(1.0)
    });
    scenario.set(1, "recovery_action", json!(1));
    common::wait_until("reset required", Duration::from_secs(30), || {
        let condition = node.condition("AcceleratorHealthy");
        (condition["reason"] == "GPUResetRequired")
            .then_some(())
            .ok_or(format!("{condition}\n{}", agent.log()))
    });
    wait_rounds_of_readiness(&agent, 2.0);
    assert_eq!(node.condition("AcceleratedHardwareReady"), theirs);
    let requests = node.requests();
    assert!(
        !requests
            .iter()
            .any(|r| r.resource_path().ends_with("/status")
                && r.body.to_string().contains("AcceleratedHardwareReady")),
        "never written"
    );
    let refusal = requests
        .iter()
        .find(|r| r.body["reason"] == "RepairConditionRefused")
        .unwrap_or_else(|| panic!("no RepairConditionRefused event\n{}", agent.log()));
    assert!(
        refusal.body["message"]
            .as_str()
            .unwrap()
            .contains("written by eks-node-monitoring-agent"),
        "{}",
        refusal.body
    );
    assert!(agent.log().contains("does not take it over"));
}

/// A p5.48xlarge that Karpenter labelled with its instance type's 8 GPUs, with 7 on the bus and no
/// `nvml.expected_gpus`: the label speaks, and `AcceleratorHealthy` names it.
#[test]
fn the_nodes_instance_type_label_says_how_many_gpus_it_has() {
    let scenario = Scenario::new(7);
    let control_plane = common::needs!(common::control_plane::shared());
    let objects = common::needs!(common::kustomize::render_with("overlays/gpu", &[]));
    let labels = json!({"metadata": {"labels": {"karpenter.k8s.aws/instance-gpu-count": "8"}}});
    let node = common::control_plane::node(&control_plane.unique("node"), labels);
    let api = ClusterNode::start(control_plane, &objects, node, gpu_taints());
    let agent = Agent::start_with_env(
        &format!(
            "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\nreadiness:\n  enabled: true\n  interval: 200ms\n",
            fake_nvml().display().to_string(),
            scenario.pci_devices().display().to_string(),
        ),
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    let condition = wait_condition(&agent, &api, "one GPU short", |c| {
        c["reason"] == "GPUCountMismatch"
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("8 GPU(s) expected (karpenter.k8s.aws/instance-gpu-count), 7 on the PCI bus"),
        "{condition}"
    );
}
