//! What the NVML collector writes: every series and label against the fake's scenario, clock
//! event reasons, XIDs (dcgm-exporter's windowed count too), fields a GPU or driver lacks, an old
//! driver's library, the node label's spelling and the GPU smoke test's comparison.

use super::*;

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
fn an_old_drivers_library_without_the_newer_symbols_is_read_with_the_older_calls() {
    let scenario = Scenario::new(2);
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  dcgm_names: true\n",
        testbed::devices::fake_nvml::fake_nvml_old_driver()
            .display()
            .to_string()
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
