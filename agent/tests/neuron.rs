//! The Neuron collector on generated sysfs trees: Inf2- and Trn1-shaped, the newer layout with
//! nodes missing or moved, unreadable and garbage files, each power status, counters that reset,
//! and a scrape racing a writer. The last test runs the agent binary against a tree, with pod
//! labels from a fake kubelet.

mod common;

use std::time::Duration;

use common::agent::{sample, Agent};
use common::neuron::{write, NeuronTree};
use mlnode_agent::config::NeuronSettings;
use mlnode_agent::kubelet::pod_resources::SharedAssignments;
use mlnode_agent::neuron::collector::NeuronCollector;

/// A registry with only the Neuron collector on `tree`; each call of the closure is one scrape.
fn scraper(tree: &NeuronTree) -> impl Fn() -> String {
    let registry = mlnode_agent::metrics::registry("inf2-node");
    let settings = NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        ..NeuronSettings::default()
    };
    let collector = NeuronCollector::new(
        settings,
        SharedAssignments::default(),
        vec!["aws.amazon.com/neuron".into()],
        vec!["aws.amazon.com/neuroncore".into()],
    )
    .unwrap();
    registry.register(Box::new(collector)).unwrap();
    move || mlnode_agent::metrics::encode(&registry)
}

#[test]
fn inf2_48xlarge_every_device_and_core() {
    let tree = NeuronTree::new("inf2.48xlarge", 12, 2);
    let m = scraper(&tree)();
    assert_eq!(sample(&m, "mlnode_neuron_device_count", &[]), Some(12.0));
    for d in 0..12u32 {
        let dev = d.to_string();
        let labels = [
            ("neuron_device_index", dev.as_str()),
            ("instance_type", "inf2.48xlarge"),
            ("Hostname", "inf2-node"),
        ];
        assert_eq!(
            sample(
                &m,
                "mlnode_neuron_device_info",
                &[
                    ("neuron_device_index", &dev),
                    ("device_name", "Inferentia2"),
                    ("neuroncore_count", "2")
                ]
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &m,
                "mlnode_neuron_host_memory_bytes",
                &[labels[0], labels[1], ("category", "dma_rings")]
            ),
            Some((1_000_000 + d) as f64)
        );
        assert_eq!(
            sample(
                &m,
                "mlnode_neuron_hardware_ecc_events_total",
                &[labels[0], ("event_type", "mem_ecc_uncorrected")]
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &m,
                "mlnode_neuron_hardware_ecc_events_total",
                &[labels[0], ("event_type", "sram_ecc_uncorrected")]
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(&m, "mlnode_neuron_power_utilization_ratio", &labels),
            Some(0.4025)
        );
        for c in 0..2u32 {
            // neuron-monitor numbers cores globally: device x cores per device + core.
            let global = (d * 2 + c).to_string();
            let core = [
                ("neuron_device_index", dev.as_str()),
                ("neuroncore", global.as_str()),
            ];
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_device_memory_bytes",
                    &[core[0], core[1], ("category", "tensors")]
                ),
                Some((1u64 << 30) as f64)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_device_memory_peak_bytes",
                    &[core[0], core[1], ("category", "model_code")]
                ),
                Some((3u64 << 30) as f64)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_execution_status_total",
                    &[core[0], core[1], ("status_type", "success")]
                ),
                Some((1000 + c) as f64)
            );
            assert_eq!(
                sample(
                    &m,
                    "mlnode_neuron_execution_status_total",
                    &[core[0], core[1], ("status_type", "timeout")]
                ),
                Some(0.0)
            );
            assert_eq!(
                sample(&m, "mlnode_neuron_model_loads_total", &core),
                Some(2.0)
            );
            assert_eq!(
                sample(&m, "mlnode_neuron_inferences_total", &core),
                Some((1000 + c) as f64)
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
                sample(&m, "mlnode_neuron_core_busy_seconds_total", &core),
                Some(5.0),
                "nc_time_in_use is in microseconds"
            );
        }
    }
    assert_eq!(m.matches("mlnode_neuron_model_loads_total{").count(), 24);
    assert!(
        !m.contains("mlnode_neuron_sysfs_read_errors_total{"),
        "a complete tree reads without errors"
    );
}

#[test]
fn trn1_32xlarge_numbers_32_cores() {
    let tree = NeuronTree::new("trn1.32xlarge", 16, 2);
    let m = scraper(&tree)();
    assert_eq!(sample(&m, "mlnode_neuron_device_count", &[]), Some(16.0));
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_model_loads_total",
            &[
                ("neuron_device_index", "15"),
                ("neuroncore", "31"),
                ("instance_type", "trn1.32xlarge")
            ]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_device_info",
            &[("neuron_device_index", "0"), ("device_name", "Trainium")]
        ),
        Some(1.0)
    );
}

#[test]
fn newer_layout_with_moved_and_missing_nodes() {
    let tree = NeuronTree::new("inf2.xlarge", 1, 2);
    let dev = tree.device(0);
    // Counters as directories with total/present; a status a later driver may add (made up: the
    // reader discovers names, it keeps no list); host memory and power gone.
    std::fs::remove_file(dev.join("stats/hardware/mem_ecc_uncorrected")).unwrap();
    write(&dev.join("stats/hardware/mem_ecc_uncorrected/total"), 3);
    write(&dev.join("stats/hardware/mem_ecc_uncorrected/present"), 1);
    write(
        &tree
            .core_stats(0, 1)
            .join("status/execute_sw_future_error/total"),
        9,
    );
    std::fs::remove_dir_all(dev.join("stats/memory_usage/host_mem")).unwrap();
    std::fs::remove_dir_all(dev.join("stats/power")).unwrap();
    std::fs::remove_dir_all(tree.core_stats(0, 0).join("other_info")).unwrap();
    let m = scraper(&tree)();
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_hardware_ecc_events_total",
            &[("event_type", "mem_ecc_uncorrected")]
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_execution_status_total",
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
            "mlnode_neuron_model_loads_total",
            &[("neuroncore", "0")]
        ),
        None
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_neuron_model_loads_total",
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
    let tree = NeuronTree::new("inf2.xlarge", 1, 2);
    let core = tree.core_stats(0, 0);
    write(&core.join("other_info/inference_count"), "lots");
    write(&core.join("status/success/total"), "");
    // A FIFO where a value should be: must neither block nor crash.
    let fifo = core.join("other_info/model_load_count");
    std::fs::remove_file(&fifo).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // A directory where a value file should be.
    let power = tree.device(0).join("stats/power/utilization");
    std::fs::remove_file(&power).unwrap();
    std::fs::create_dir(&power).unwrap();
    let scrape = scraper(&tree);
    let started = std::time::Instant::now();
    let m = scrape();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        sample(&m, "mlnode_neuron_inferences_total", &[("neuroncore", "0")]),
        None
    );
    assert_eq!(
        sample(&m, "mlnode_neuron_inferences_total", &[("neuroncore", "1")]),
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
    let tree = NeuronTree::new("inf2.xlarge", 1, 2);
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
    let tree = NeuronTree::new("inf2.xlarge", 1, 2);
    let completed = tree.core_stats(0, 1).join("status/success/total");
    let scrape = scraper(&tree);
    let value = |m: &str| {
        sample(
            m,
            "mlnode_neuron_execution_status_total",
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
    let tree = NeuronTree::new("inf2.xlarge", 1, 2);
    let file = tree.core_stats(0, 0).join("other_info/inference_count");
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
            "mlnode_neuron_inferences_total",
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
fn the_agent_serves_neuron_series_with_pod_labels() {
    let tree = NeuronTree::new("inf2.48xlarge", 12, 2);
    let kubelet = common::kubelet::FakeKubelet::serve(common::kubelet::response(&[
        ("llama-0", "aws.amazon.com/neuron", &["3"]),
        ("mistral-0", "aws.amazon.com/neuroncore", &["10"]),
    ]));
    let config = format!(
        "models: []\nnvml:\n  enabled: false\nneuron:\n  sysfs_root: {:?}\n  availability_zone: us-east-2a\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        tree.root().display().to_string(),
        kubelet.socket().display().to_string()
    );
    let agent = Agent::start(&config);
    agent.wait_for("pod labels", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_neuron_model_loads_total",
            &[("neuroncore", "7"), ("pod", "llama-0")],
        )
        .is_some()
            && sample(
                m,
                "mlnode_neuron_model_loads_total",
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
    // Device 3 (cores 6 and 7) belongs to llama-0; core 10 alone to mistral-0; core 11 to nobody.
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
    assert!(sample(
        &m,
        "mlnode_neuron_model_loads_total",
        &[("neuroncore", "6"), ("pod", "llama-0")]
    )
    .is_some());
    let core11 = m
        .lines()
        .find(|l| {
            l.starts_with("mlnode_neuron_model_loads_total{") && l.contains("neuroncore=\"11\"")
        })
        .unwrap();
    assert!(!core11.contains("pod="), "{core11}");
}
