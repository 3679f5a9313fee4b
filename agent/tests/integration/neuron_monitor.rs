//! `neuron.monitor_names: true`: neuron-monitor-prometheus's series from a driver-shaped trn2 tree
//! and this machine's real /proc, and AWS's own Neuron Grafana dashboard
//! (tests/fixtures/dashboards/neuron-monitor-grafana.json, unchanged) run against the agent through
//! a real Prometheus: every panel sysfs and procfs can feed returns data, the ones that need the
//! Neuron runtime's own data are exactly those docs/neuron.md lists, and with neuron-monitor's
//! reports written to `neuron.monitor_input` (a FIFO, as a sidecar would) every panel does.

use std::collections::BTreeSet;
use std::time::Duration;

use mlnode_agent::neuron::collector::NeuronCollector;
use mlnode_agent::neuron::settings::NeuronSettings;
use mlnode_agent::neuron::NodeLabels;
use mlnode_testbed as testbed;
use testbed::agent::{sample, Agent};
use testbed::devices::neuron_sysfs::{NeuronTree, TRN2_48XLARGE};
use testbed::prometheus::{dashboard_panels, panels_with_data, start_prometheus, wait_query};

/// 4M cycles on every physical core; logical core 0 (device 0, physical 4 and 5) half busy.
fn advance_cycles(tree: &NeuronTree) {
    for device in 0..tree.instance.devices {
        for core in 0..8 {
            tree.set_cycles(device, core, 0, 0, 8_000_000);
        }
    }
    tree.set_cycles(0, 4, 3_000_000, 1_000_000, 4_000_000);
    tree.set_cycles(0, 5, 0, 0, 8_000_000);
}

#[test]
fn neuron_monitor_series_come_from_sysfs_and_procfs() {
    let tree = NeuronTree::new(TRN2_48XLARGE);
    let registry = mlnode_agent::metrics::registry("trn2-node");
    let node_labels = mlnode_agent::neuron::SharedNodeLabels::default();
    node_labels.set(NodeLabels {
        instance_type: "trn2.48xlarge".into(),
        availability_zone: "us-east-2b".into(),
        region: "us-east-2".into(),
        instance_id: "i-0123456789abcdef0".into(),
    });
    let settings = NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        class_root: tree.class_root().to_path_buf(),
        monitor_names: true,
        ..NeuronSettings::default()
    };
    let collector = NeuronCollector::new(
        settings,
        Default::default(),
        node_labels,
        None,
        vec![],
        vec![],
        Default::default(),
    )
    .unwrap();
    registry.register(Box::new(collector)).unwrap();
    let scrape = || mlnode_agent::metrics::encode(&registry);
    scrape();
    advance_cycles(&tree);
    testbed::devices::neuron_sysfs::write(
        &tree.device(3).join("stats/hardware/mem_ecc_uncorrected"),
        "2\n",
    );
    let m = scrape();
    let instance = [
        ("instance_id", "i-0123456789abcdef0"),
        ("instance_type", "trn2.48xlarge"),
        ("availability_zone", "us-east-2b"),
        ("region", "us-east-2"),
    ];
    assert_eq!(sample(&m, "instance_info", &instance), Some(1.0));
    assert_eq!(
        sample(
            &m,
            "neuron_hardware_info",
            &[
                ("neuron_device_count", "16"),
                ("neuroncore_per_device_count", "4")
            ]
        ),
        Some(1.0),
        "logical cores per device, as neuron-monitor counts them"
    );
    let core0 = [instance[1], ("neuroncore", "0")];
    assert_eq!(
        sample(&m, "neuroncore_utilization_ratio", &core0),
        Some(0.5),
        "physical 4: 4M busy of 4M cycles, physical 5: 0 of 4M"
    );
    assert_eq!(
        m.matches("\nneuroncore_utilization_ratio{").count(),
        64,
        "one per logical core"
    );
    assert_eq!(
        sample(
            &m,
            "neuroncore_memory_usage_tensors",
            &[("neuroncore", "63"), ("memory_location", "None")]
        ),
        Some((2u64 << 28) as f64),
        "both physical cores of the logical core"
    );
    // 16 devices x 8 host categories x (1,000,000 + device index); device memory 128 cores x 11 x 2^28.
    let host: u64 = (0..16u64).map(|d| 8 * (1_000_000 + d)).sum();
    assert_eq!(
        sample(
            &m,
            "neuron_runtime_memory_used_bytes",
            &[("memory_location", "host")]
        ),
        Some(host as f64)
    );
    assert_eq!(
        sample(
            &m,
            "neuron_runtime_memory_used_bytes",
            &[("memory_location", "neuron_device")]
        ),
        Some((128u64 * (11 << 28)) as f64)
    );
    assert_eq!(
        sample(
            &m,
            "hardware_ecc_events_total",
            &[
                ("neuron_device_index", "3"),
                ("event_type", "mem_ecc_uncorrected")
            ]
        ),
        Some(2.0),
        "the rise since the agent's first read"
    );
    // procfs against the kernel's own answers through other calls.
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    assert_eq!(sample(&m, "system_vcpu_count", &[]), Some(online as f64));
    // SAFETY: sysinfo is plain integers, for which all zeroes is a valid value.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable sysinfo for the call to fill.
    assert_eq!(unsafe { libc::sysinfo(&mut info) }, 0);
    assert_eq!(
        sample(&m, "system_memory_total_bytes", &[]),
        Some(info.totalram as f64 * f64::from(info.mem_unit))
    );
    let used = sample(&m, "system_memory_used_bytes", &[]).unwrap();
    assert!(used > 0.0 && used < info.totalram as f64 * f64::from(info.mem_unit));
    let user = sample(&m, "system_vcpu_usage_ratio", &[("usage_type", "user")]);
    assert!(user.is_some_and(|u| (0.0..=1.0).contains(&u)), "{user:?}");
    for absent in [
        "execution_status_total",
        "execution_latency_seconds",
        "neuron_runtime_vcpu_usage_ratio",
    ] {
        assert!(!m.contains(absent), "{absent} needs the runtime's data");
    }
}

#[test]
fn awss_neuron_dashboard_runs_unchanged_against_the_agent() {
    let panels = dashboard_panels(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/dashboards/neuron-monitor-grafana.json"
    )));
    assert_eq!(panels.len(), 17, "the dashboard as AWS ships it");

    let tree = NeuronTree::new(TRN2_48XLARGE);
    let shared = tempfile::tempdir().unwrap();
    let fifo = shared.path().join("report");
    let config = format!(
        "models: []\nnvml:\n  enabled: false\nneuron:\n  sysfs_root: {:?}\n  class_root: {:?}\n  instance_type: trn2.48xlarge\n  availability_zone: us-east-2b\n  monitor_names: true\n  monitor_input: {:?}\n",
        tree.root().display().to_string(),
        tree.class_root().display().to_string(),
        fifo.display().to_string(),
    );
    let agent = Agent::start(&config);
    agent.wait_for("the Neuron collector", Duration::from_secs(20), |m| {
        sample(m, "neuron_hardware_info", &[]).is_some()
    });
    advance_cycles(&tree);
    let prometheus = start_prometheus(&[("neuron-monitor", agent.port())]);
    // A panel's data is there once Prometheus has two scrapes with an interval behind them.
    wait_query(prometheus.port, "count(neuroncore_utilization_ratio > 0)");
    wait_query(prometheus.port, "system_vcpu_usage_ratio");

    let (with_data, without) = panels_with_data(prometheus.port, &panels, str::to_string);
    let without: BTreeSet<String> = without.into_iter().collect();
    // The five that need the Neuron runtime's own report (neuron-monitor's execution_stats and
    // neuron_runtime_vcpu_usage groups); docs/neuron.md lists them.
    assert_eq!(
        without,
        [
            "Execution Error Rate",
            "Execution Latency",
            "Execution Status Rates",
            "Execution Success Rate",
            "Neuron Runtime vCPU Usage",
        ]
        .map(String::from)
        .into(),
        "with data: {with_data:?}"
    );
    assert_eq!(with_data.len(), 12, "{with_data:?}");
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/neuron.md")).unwrap();
    for title in &without {
        assert!(
            docs.contains(&format!("\"{title}\"")),
            "docs/neuron.md does not list {title}"
        );
    }
}
