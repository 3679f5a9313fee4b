//! The Neuron collector on trees written as the Neuron driver writes them (common/neuron.rs, each
//! shape cited to the driver's source): inf1, inf2, trn1 and trn2 (LNC=2, LNC=1, a die-flipped
//! UltraServer node), an older driver (2.14), live utilisation from the tensor-engine counters,
//! ECC as the firmware reports it, unreadable and garbage files, each power status, counters that
//! reset, and a scrape racing a writer. The last test runs the agent binary against a trn2 tree,
//! with pod labels from a fake kubelet.

use std::time::Duration;

use mlnode_agent::assignments::SharedAssignments;
use mlnode_agent::neuron::collector::NeuronCollector;
use mlnode_agent::neuron::settings::{LogicalNcConfig, NeuronSettings};
use mlnode_testbed as testbed;
use testbed::agent::{sample, Agent};
use testbed::devices::neuron_sysfs::{
    write, Driver, NeuronTree, DRIVER_STATUS_NAMES, INF1_24XLARGE, INF2_48XLARGE, INF2_XLARGE,
    TRN1_32XLARGE, TRN2_48XLARGE,
};

/// A registry with only the Neuron collector on `tree`, configured with the instance's EC2 type
/// (as the Node label gives it in a cluster); each call of the closure is one scrape.
fn scraper(tree: &NeuronTree) -> impl Fn() -> String {
    scraper_with(tree, LogicalNcConfig::Auto)
}

fn scraper_with(tree: &NeuronTree, logical_nc_config: LogicalNcConfig) -> impl Fn() -> String {
    scraper_of(NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        class_root: tree.class_root().to_path_buf(),
        instance_type: tree.instance.ec2_type.into(),
        logical_nc_config,
        ..NeuronSettings::default()
    })
}

fn scraper_of(settings: NeuronSettings) -> impl Fn() -> String {
    let registry = mlnode_agent::metrics::registry("neuron-node");
    let collector = NeuronCollector::new(
        settings,
        SharedAssignments::default(),
        Default::default(),
        None,
        vec!["aws.amazon.com/neuron".into()],
        vec!["aws.amazon.com/neuroncore".into()],
        Default::default(),
    )
    .unwrap();
    registry.register(Box::new(collector)).unwrap();
    move || mlnode_agent::metrics::encode(&registry)
}

/// The distinct values of `label` over the samples of `family`.
fn label_values(m: &str, family: &str, label: &str) -> std::collections::BTreeSet<String> {
    let prefix = format!("{family}{{");
    let key = format!("{label}=\"");
    m.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let rest = &l[l.find(&key)? + key.len()..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

#[test]
fn inf2_48xlarge_every_device_and_core() {
    let tree = NeuronTree::new(INF2_48XLARGE);
    let m = scraper(&tree)();
    assert_eq!(sample(&m, "mlnode_neuron_device_count", &[]), Some(12.0));
    for d in 0..12u32 {
        let dev = d.to_string();
        let labels = [
            ("neuron_device_index", dev.as_str()),
            ("instance_type", "inf2.48xlarge"),
            ("Hostname", "neuron-node"),
        ];
        let serial = format!("{:016x}", 0x5e71_a100_0000_0000u64 + u64::from(d));
        assert_eq!(
            sample(
                &m,
                "mlnode_neuron_device_info",
                &[
                    labels[0],
                    labels[1],
                    ("neuron_family", "Inf2"),
                    ("arch_type", "NDv3"),
                    ("device_name", "Inferentia2"),
                    ("serial_number", &serial),
                    ("neuroncore_count", "2"),
                    ("physical_core_count", "2"),
                    ("logical_nc_config", "1"),
                ]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &m,
                "mlnode_neuron_host_memory_bytes",
                &[labels[0], labels[1], ("category", "dma_buffers")]
            ),
            Some((1_000_000 + d) as f64)
        );
        for kind in [
            "mem_ecc_uncorrected",
            "mem_ecc_repairable_uncorrected",
            "sram_ecc_uncorrected",
        ] {
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_ecc_errors",
                    &[labels[0], ("event_type", kind)]
                ),
                Some(0.0),
                "{kind}"
            );
        }
        assert_eq!(
            sample(&m, "mlnode_neuron_power_utilization_ratio", &labels),
            Some(0.4025)
        );
        for c in 0..2u32 {
            // Inf2 has no logical map: device x 2 + core.
            let global = (d * 2 + c).to_string();
            let physical = c.to_string();
            let core = [
                ("neuron_device_index", dev.as_str()),
                ("neuroncore", global.as_str()),
                ("physical_core", physical.as_str()),
            ];
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_core_info",
                    &[core[0], core[1], core[2], ("arch_type", "NCv2")]
                ),
                Some(1.0)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_device_memory_bytes",
                    &[core[0], core[1], ("category", "model_shared_scratchpad")]
                ),
                Some((1u64 << 28) as f64)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_device_memory_peak_bytes",
                    &[core[0], core[1], ("category", "collectives")]
                ),
                Some((3u64 << 28) as f64)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_core_memory_bytes",
                    &[core[0], core[1], ("location", "device")]
                ),
                Some((11u64 << 28) as f64),
                "the driver's per-core aggregate, not a sum the agent made"
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_core_memory_peak_bytes",
                    &[core[0], core[1], ("location", "host")]
                ),
                Some(8192.0)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_exited_runtime_executions_total",
                    &[core[0], core[1], ("status_type", "success")]
                ),
                Some((1000 + c) as f64)
            );
            assert_eq!(
                sample(&m, "mlnode_neuron_exited_runtime_model_loads_total", &core),
                Some(2.0)
            );
            assert_eq!(
                sample(&m, "mlnode_neuron_exited_runtime_inferences_total", &core),
                Some((1000 + c) as f64)
            );
            assert_eq!(
                sample(&m, "mlnode_neuron_exited_runtime_flops_total", &core),
                Some(4e9)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_core_resets_total",
                    &[core[0], core[1], ("result", "failed")]
                ),
                Some(0.0)
            );
            assert_eq!(
                sample(&m, "mlnode_neuron_exited_runtime_busy_seconds_total", &core),
                Some(5.0),
                "nc_time_in_use is in microseconds"
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_core_tensor_engine_cycles_total",
                    &[core[0], core[1], ("state", "idle")]
                ),
                Some(4e6)
            );
        }
    }
    assert_eq!(
        label_values(
            &m,
            "mlnode_neuron_exited_runtime_executions_total",
            "status_type"
        ),
        DRIVER_STATUS_NAMES.iter().map(|s| s.to_string()).collect(),
        "the 24 names the driver writes, as it writes them"
    );
    assert_eq!(
        label_values(&m, "mlnode_neuron_device_memory_bytes", "category").len(),
        11
    );
    assert_eq!(
        label_values(&m, "mlnode_neuron_host_memory_bytes", "category").len(),
        8
    );
    assert_eq!(
        sample(&m, "mlnode_neuron_core_utilization_ratio", &[]),
        None,
        "utilisation needs two reads of the cycle counters"
    );
    assert!(
        !m.contains("mlnode_neuron_sysfs_read_errors_total{"),
        "a driver-shaped tree reads without errors"
    );
}

#[test]
fn trn1_32xlarge_numbers_32_cores_linearly() {
    let tree = NeuronTree::new(TRN1_32XLARGE);
    let m = scraper(&tree)();
    assert_eq!(sample(&m, "mlnode_neuron_device_count", &[]), Some(16.0));
    assert_eq!(
        label_values(&m, "mlnode_neuron_core_info", "neuroncore").len(),
        32
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_core_info",
            &[
                ("neuron_device_index", "15"),
                ("neuroncore", "31"),
                ("physical_core", "1"),
                ("arch_type", "NCv2"),
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_device_info",
            &[
                ("neuron_device_index", "0"),
                ("neuron_family", "Trn1"),
                ("arch_type", "NDv2"),
                ("device_name", "Trainium1")
            ]
        ),
        Some(1.0)
    );
}

#[test]
fn trn2_48xlarge_numbers_64_logical_cores_through_the_driver_map() {
    let tree = NeuronTree::new(TRN2_48XLARGE);
    let m = scraper(&tree)();
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_device_info",
            &[
                ("neuron_device_index", "0"),
                ("neuron_family", "Trn2"),
                ("device_name", "Trainium2"),
                ("neuroncore_count", "4"),
                ("physical_core_count", "8"),
                ("logical_nc_config", "2"),
            ]
        ),
        Some(1.0),
        "LNC=2, the runtime's default on Trn2: 4 logical cores per device"
    );
    let logical = label_values(&m, "mlnode_neuron_core_info", "neuroncore");
    assert_eq!(logical.len(), 64);
    assert!(logical.contains("63") && !logical.contains("64"));
    // nc_mapping_v0_seng_swap: logical 0 = device 0 physical 4+5; logical 4 (device 1's first)
    // = physical 2+3; logical 3 = physical 0+1.
    for (logical, device, physical) in [
        ("0", "0", ["4", "5"]),
        ("3", "0", ["0", "1"]),
        ("4", "1", ["2", "3"]),
        ("63", "15", ["2", "3"]),
    ] {
        for p in physical {
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_core_info",
                    &[
                        ("neuron_device_index", device),
                        ("neuroncore", logical),
                        ("physical_core", p),
                        ("arch_type", "NCv3"),
                    ]
                ),
                Some(1.0),
                "logical {logical} = device {device} physical {p}"
            );
        }
    }

    // LNC=1 (NEURON_LOGICAL_NC_CONFIG=1 on the node's pods): 128 logical cores, same map.
    let m = scraper_with(&tree, LogicalNcConfig::Fixed(1))();
    assert_eq!(
        label_values(&m, "mlnode_neuron_core_info", "neuroncore").len(),
        128
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_core_info",
            &[
                ("neuron_device_index", "1"),
                ("neuroncore", "8"),
                ("physical_core", "2")
            ]
        ),
        Some(1.0)
    );

    // UltraServer node 1 (the driver's node_id_4): the dies swap (mask 0x6).
    write(&tree.class_root().join("node_id_4"), "1\n");
    let m = scraper(&tree)();
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_core_info",
            &[
                ("neuron_device_index", "0"),
                ("neuroncore", "0"),
                ("physical_core", "0")
            ]
        ),
        Some(1.0)
    );
}

#[test]
fn utilisation_is_live_from_the_tensor_engine_while_exit_counters_stay_flat() {
    let tree = NeuronTree::new(TRN2_48XLARGE);
    let scrape = scraper(&tree);
    let first = scrape();
    // 4M cycles pass on every core; a runtime works on logical core 0 (device 0, physical 4 and
    // 5): physical 4 is busy for 3/4 of them, physical 5 for 1/4, the rest idle.
    for d in 0..16 {
        for c in 0..8 {
            tree.set_cycles(d, c, 0, 0, 8_000_000);
        }
    }
    tree.set_cycles(0, 4, 2_000_000, 1_000_000, 4_000_000 + 1_000_000);
    tree.set_cycles(0, 5, 1_000_000, 0, 4_000_000 + 3_000_000);
    let second = scrape();
    let ratio = |m: &str, core: &str| {
        sample(
            m,
            "mlnode_neuron_core_utilization_ratio",
            &[("neuron_device_index", "0"), ("neuroncore", core)],
        )
    };
    assert_eq!(ratio(&first, "0"), None);
    assert_eq!(ratio(&second, "0"), Some(0.5), "(3 + 1) busy of 8 cycles");
    assert_eq!(ratio(&second, "3"), Some(0.0), "idle pair");
    assert_eq!(
        label_values(
            &second,
            "mlnode_neuron_core_utilization_ratio",
            "neuroncore"
        )
        .len(),
        64,
        "one ratio per logical core"
    );
    // The execution counters only move when the runtime process exits.
    let executions = |m: &str| {
        sample(
            m,
            "mlnode_neuron_exited_runtime_executions_total",
            &[
                ("neuroncore", "0"),
                ("physical_core", "4"),
                ("status_type", "success"),
            ],
        )
    };
    assert_eq!(executions(&first), executions(&second));
}

#[test]
fn inf1_and_an_older_driver_export_what_they_have() {
    // Inf1: 4 cores, no ECC nodes, no tensor-engine counters, no serial number, power without data.
    let tree = NeuronTree::new(INF1_24XLARGE);
    let scrape = scraper(&tree);
    scrape();
    let m = scrape();
    assert_eq!(
        label_values(&m, "mlnode_neuron_core_info", "neuroncore").len(),
        64
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_device_info",
            &[
                ("neuron_device_index", "0"),
                ("neuron_family", "Inf1"),
                ("arch_type", "NDv1"),
                ("serial_number", "")
            ]
        ),
        Some(1.0)
    );
    for absent in [
        "mlnode_neuron_ecc_errors",
        "mlnode_neuron_core_utilization_ratio",
        "mlnode_neuron_power_utilization_ratio",
        "mlnode_neuron_sysfs_read_errors_total",
    ] {
        assert_eq!(sample(&m, absent, &[]), None, "{absent}");
    }

    // Driver 2.14 on an inf2: ECC without the repairable kind, no power, no nc_time_in_use,
    // no pe_cntrs.
    let tree = NeuronTree::with_driver(INF2_XLARGE, Driver::V2_14);
    let scrape = scraper(&tree);
    scrape();
    let m = scrape();
    assert_eq!(
        label_values(&m, "mlnode_neuron_ecc_errors", "event_type"),
        ["mem_ecc_uncorrected", "sram_ecc_uncorrected"]
            .map(String::from)
            .into()
    );
    for absent in [
        "mlnode_neuron_core_utilization_ratio",
        "mlnode_neuron_core_tensor_engine_cycles_total",
        "mlnode_neuron_power_utilization_ratio",
        "mlnode_neuron_exited_runtime_busy_seconds_total",
        "mlnode_neuron_sysfs_read_errors_total",
    ] {
        assert_eq!(sample(&m, absent, &[]), None, "{absent}");
    }
    assert!(sample(&m, "mlnode_neuron_exited_runtime_inferences_total", &[]).is_some());
}

#[test]
fn ecc_is_exported_as_the_firmware_reports_it_even_when_it_falls() {
    let tree = NeuronTree::new(TRN2_48XLARGE);
    let hardware = tree.device(2).join("stats/hardware");
    let scrape = scraper(&tree);
    let ecc = |m: &str, kind: &str| {
        sample(
            m,
            "mlnode_neuron_ecc_errors",
            &[("neuron_device_index", "2"), ("event_type", kind)],
        )
    };
    write(&hardware.join("mem_ecc_uncorrected"), "3\n");
    assert_eq!(ecc(&scrape(), "mem_ecc_uncorrected"), Some(3.0));
    // The HBM repair state changes (v3/neuron_dhal_v3.c:1078-1117): the errors now read as
    // repairable, pending a reboot.
    write(&hardware.join("mem_ecc_uncorrected"), "0\n");
    write(&hardware.join("mem_ecc_repairable_uncorrected"), "3\n");
    let m = scrape();
    assert_eq!(ecc(&m, "mem_ecc_uncorrected"), Some(0.0), "no offset kept");
    assert_eq!(ecc(&m, "mem_ecc_repairable_uncorrected"), Some(3.0));
    assert_eq!(
        sample(&m, "mlnode_neuron_counter_resets_total", &[]),
        None,
        "a firmware count going down is not a counter reset"
    );
}

#[test]
fn a_status_name_a_later_driver_adds_and_missing_nodes_are_read_as_they_are() {
    let tree = NeuronTree::new(INF2_XLARGE);
    let dev = tree.device(0);
    // A status of the driver's form that no driver has yet (the reader keeps no list); host
    // memory and power gone.
    write(
        &tree
            .core_stats(0, 1)
            .join("status/execute_sw_future_error/total"),
        "9\n",
    );
    std::fs::remove_dir_all(dev.join("stats/memory_usage/host_mem")).unwrap();
    std::fs::remove_dir_all(dev.join("stats/power")).unwrap();
    std::fs::remove_dir_all(tree.core_stats(0, 0).join("other_info")).unwrap();
    let m = scraper(&tree)();
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_exited_runtime_executions_total",
            &[
                ("neuroncore", "1"),
                ("status_type", "execute_sw_future_error")
            ]
        ),
        Some(9.0)
    );
    assert_eq!(sample(&m, "mlnode_neuron_host_memory_bytes", &[]), None);
    assert_eq!(
        sample(&m, "mlnode_neuron_power_utilization_ratio", &[]),
        None
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_exited_runtime_model_loads_total",
            &[("neuroncore", "0")]
        ),
        None
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_exited_runtime_model_loads_total",
            &[("neuroncore", "1")]
        ),
        Some(2.0)
    );
    assert!(
        !m.contains("mlnode_neuron_sysfs_read_errors_total{"),
        "absent is not an error: {m}"
    );
}

#[test]
fn unreadable_and_garbage_files_are_counted_and_skipped() {
    let tree = NeuronTree::new(INF2_XLARGE);
    let core = tree.core_stats(0, 0);
    write(&core.join("other_info/inference_count/total"), "lots");
    write(&core.join("status/success/total"), "");
    // A FIFO where a value should be: must neither block nor crash.
    let fifo = core.join("other_info/model_load_count/total");
    std::fs::remove_file(&fifo).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // A directory where a value file should be.
    let power = tree.device(0).join("stats/power/utilization");
    std::fs::remove_file(&power).unwrap();
    std::fs::create_dir(&power).unwrap();
    let scrape = scraper(&tree);
    let started = std::time::Instant::now();
    let m = scrape();
    // A FIFO that blocked the read would block it for good; the bound is for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_exited_runtime_inferences_total",
            &[("neuroncore", "0")]
        ),
        None
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_exited_runtime_inferences_total",
            &[("neuroncore", "1")]
        ),
        Some(1001.0),
        "the other core is unaffected"
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_sysfs_read_errors_total",
            &[("path_kind", "other_info")]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_sysfs_read_errors_total",
            &[("path_kind", "status")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_sysfs_read_errors_total",
            &[("path_kind", "power")]
        ),
        Some(1.0)
    );
    // Errors accumulate across scrapes, as a counter should.
    let m = scrape();
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_sysfs_read_errors_total",
            &[("path_kind", "other_info")]
        ),
        Some(4.0)
    );
}

#[test]
fn power_is_exported_only_when_valid() {
    let tree = NeuronTree::new(INF2_XLARGE);
    let file = tree.device(0).join("stats/power/utilization");
    let scrape = scraper(&tree);
    for (content, expected) in [
        (
            "POWER_STATUS_VALID,1796000000,10.00,62.50,40.25",
            Some(0.4025),
        ),
        ("POWER_STATUS_NO_DATA,1796000060,0,0,0", None),
        ("POWER_STATUS_INVALID,1796000120,0,0,0", None),
        ("POWER_STATUS_VALID,1796000180,1,2", None),
    ] {
        write(&file, content);
        assert_eq!(
            sample(&scrape(), "mlnode_neuron_power_utilization_ratio", &[]),
            expected,
            "{content}"
        );
    }
    assert_eq!(
        sample(
            &scrape(),
            "mlnode_neuron_sysfs_read_errors_total",
            &[("path_kind", "power")]
        ),
        Some(2.0),
        "the malformed line, scraped twice"
    );
}

#[test]
fn a_counter_reset_never_goes_backwards_and_is_counted() {
    let tree = NeuronTree::new(INF2_XLARGE);
    let completed = tree.core_stats(0, 1).join("status/success/total");
    let scrape = scraper(&tree);
    let value = |m: &str| {
        sample(
            m,
            "mlnode_neuron_exited_runtime_executions_total",
            &[("neuroncore", "1"), ("status_type", "success")],
        )
        .unwrap()
    };
    assert_eq!(value(&scrape()), 1001.0);
    write(&completed, 0); // a write resets it
    let m = scrape();
    assert_eq!(value(&m), 1001.0);
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_counter_resets_total",
            &[("path_kind", "status")]
        ),
        Some(1.0)
    );
    write(&completed, 5);
    assert_eq!(value(&scrape()), 1006.0);
}

#[test]
fn scrapes_racing_a_writer_never_see_a_torn_or_falling_value() {
    let tree = NeuronTree::new(INF2_XLARGE);
    let file = tree
        .core_stats(0, 0)
        .join("other_info/inference_count/total");
    write(&file, 999_999);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (file, stop) = (file.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut value = 1_000_000u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&file, value.to_string()).unwrap();
                value += 1;
            }
            value
        })
    };
    // Let the writer get going, so the scrapes below race it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0)
        < 1_000_010
    {
        assert!(std::time::Instant::now() < deadline, "the writer never ran");
        std::thread::yield_now();
    }
    let scrape = scraper(&tree);
    let mut last = 0.0;
    for _ in 0..300 {
        if let Some(v) = sample(
            &scrape(),
            "mlnode_neuron_exited_runtime_inferences_total",
            &[("neuroncore", "0")],
        ) {
            assert!((999_999.0..10_000_000.0).contains(&v), "torn value {v}");
            assert!(v >= last, "went backwards: {last} -> {v}");
            last = v;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(
        last >= 1_000_000.0 && last < written as f64,
        "last seen {last}, written up to {written}"
    );
}

#[test]
fn the_agent_serves_neuron_series_with_pod_labels_on_logical_cores() {
    let tree = NeuronTree::new(TRN2_48XLARGE);
    // The device plugin's ids: device indexes under aws.amazon.com/neuron, logical core indexes
    // under aws.amazon.com/neuroncore.
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(
        testbed::node::pod_resources::response(&[
            ("llama-0", "aws.amazon.com/neuron", &["3"]),
            ("mistral-0", "aws.amazon.com/neuroncore", &["10"]),
        ]),
    );
    let config = format!(
        "models: []\nnvml:\n  enabled: false\nneuron:\n  sysfs_root: {:?}\n  class_root: {:?}\n  availability_zone: us-east-2a\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        tree.root().display().to_string(),
        tree.class_root().display().to_string(),
        kubelet.socket().display().to_string()
    );
    let agent = Agent::start(&config);
    agent.wait_for("pod labels", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_neuron_core_info",
            &[("neuroncore", "15"), ("pod", "llama-0")],
        )
        .is_some()
            && sample(
                m,
                "mlnode_neuron_core_info",
                &[("neuroncore", "10"), ("pod", "mistral-0")],
            )
            .is_some()
    });
    let m = agent.metrics();
    assert_eq!(
        sample(&m, "mlnode_collector_up", &[("collector", "neuron")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&m, "mlnode_collector_up", &[("collector", "nvml")]),
        Some(0.0)
    );
    // Device 3 (logical cores 12-15) belongs to llama-0.
    assert!(sample(
        &m,
        "mlnode_neuron_host_memory_bytes",
        &[
            ("neuron_device_index", "3"),
            ("pod", "llama-0"),
            ("availability_zone", "us-east-2a")
        ]
    )
    .is_some());
    // Logical core 10 = device 2, physical 2 and 3 (the driver's map), to mistral-0 alone.
    for physical in ["2", "3"] {
        assert!(sample(
            &m,
            "mlnode_neuron_device_memory_bytes",
            &[
                ("neuron_device_index", "2"),
                ("neuroncore", "10"),
                ("physical_core", physical),
                ("pod", "mistral-0")
            ]
        )
        .is_some());
    }
    let core11 = m
        .lines()
        .find(|l| l.starts_with("mlnode_neuron_core_info{") && l.contains("neuroncore=\"11\""))
        .unwrap();
    assert!(!core11.contains("pod="), "{core11}");
}

/// The Inferentia/Trainium devices the kernel lists on the PCI bus are counted beside the
/// driver's: on a trn2.48xlarge-shaped tree both are 16 (the NIC on the bus is none of them).
#[test]
fn neuron_devices_on_the_pci_bus_are_counted() {
    let tree = NeuronTree::new(testbed::devices::neuron_sysfs::TRN2_48XLARGE);
    let scrape = scraper_of(NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        class_root: tree.class_root().to_path_buf(),
        pci_devices: tree.pci_devices(),
        ..NeuronSettings::default()
    });
    let m = scrape();
    assert_eq!(sample(&m, "mlnode_neuron_pci_devices", &[]), Some(16.0));
    assert_eq!(sample(&m, "mlnode_neuron_device_count", &[]), Some(16.0));
}

/// `kubelet.pod_uid` and `kubelet.pod_labels` on Neuron series as on GPU ones: the holder's UID
/// and the labels asked for, beside its names.
#[test]
fn a_devices_holder_uid_and_chosen_labels_go_on_its_series() {
    use mlnode_core::assignments::{Assignment, Assignments};
    use mlnode_core::pods::{HolderLabels, LabelPattern, PodDirectory, PodIdentity, PodNames};
    let tree = NeuronTree::new(INF2_48XLARGE);
    let mut assignments = Assignments::default();
    assignments.assign("aws.amazon.com/neuron", "3", || Assignment {
        pod: "llama-0".into(),
        namespace: "inference".into(),
        container: "vllm".into(),
    });
    let pods = PodDirectory::from_pods([PodIdentity {
        namespace: "inference".into(),
        name: "llama-0".into(),
        uid: "5d0e2a1b-3c4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
        containers: Default::default(),
        labels: [("app".to_string(), "llama".to_string())].into(),
    }]);
    let registry = mlnode_agent::metrics::registry("neuron-node");
    let collector = NeuronCollector::new(
        NeuronSettings {
            sysfs_root: tree.root().to_path_buf(),
            class_root: tree.class_root().to_path_buf(),
            ..NeuronSettings::default()
        },
        SharedAssignments::new(assignments),
        Default::default(),
        None,
        vec!["aws.amazon.com/neuron".into()],
        vec!["aws.amazon.com/neuroncore".into()],
        PodNames {
            pods: mlnode_agent::shared::Shared::new(pods),
            holder: HolderLabels {
                pod_uid: true,
                copy: vec![LabelPattern::try_from("app".to_string()).unwrap()],
                max: 8,
                virtual_gpus: false,
            },
        },
    )
    .unwrap();
    registry.register(Box::new(collector)).unwrap();
    let m = mlnode_agent::metrics::encode(&registry);
    let held = [
        ("neuron_device_index", "3"),
        ("pod", "llama-0"),
        ("pod_uid", "5d0e2a1b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"),
        ("app", "llama"),
    ];
    assert!(
        sample(&m, "mlnode_neuron_host_memory_bytes", &held).is_some(),
        "{m}"
    );
    assert!(sample(
        &m,
        "mlnode_neuron_core_info",
        &[("neuroncore", "6"), ("pod_uid", held[2].1)]
    )
    .is_some());
    let free = m
        .lines()
        .find(|l| l.starts_with("mlnode_neuron_host_memory_bytes{neuron_device_index=\"0\""))
        .unwrap();
    assert!(!free.contains("pod_uid"), "{free}");
}
