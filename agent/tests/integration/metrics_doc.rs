//! docs/metrics.md and the exposition must list the same series with the same types and labels.

use mlnode_testbed as testbed;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The table rows of docs/metrics.md: series name, type, labels cell.
fn rows() -> Vec<(String, String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
            .unwrap();
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((
                name.to_string(),
                cells.get(2)?.to_string(),
                cells.get(4)?.to_string(),
            ))
        })
        .collect()
}

/// `name -> type` from the table rows of docs/metrics.md.
fn documented() -> BTreeMap<String, String> {
    rows()
        .into_iter()
        .map(|(name, kind, _)| (name, kind))
        .collect()
}

/// The label sets the docs' prose defines ("GPU labels", "device labels", "core labels",
/// "physical core labels"): those
/// every series of the set carries, and those only some carry (a GPU assigned to a pod, an option).
fn label_group(name: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    let gpu_optional = vec![
        "pod",
        "namespace",
        "container",
        "hostname",
        "pod_name",
        "pod_namespace",
        "container_name",
    ];
    let neuron_optional = vec![
        "instance_type",
        "availability_zone",
        "pod",
        "namespace",
        "container",
    ];
    match name {
        "GPU labels" => (
            vec![
                "gpu",
                "UUID",
                "pci_bus_id",
                "device",
                "modelName",
                "DCGM_FI_DRIVER_VERSION",
            ],
            gpu_optional,
        ),
        "device labels" => (vec!["neuron_device_index"], neuron_optional),
        "core labels" => (vec!["neuron_device_index", "neuroncore"], neuron_optional),
        "physical core labels" => (
            vec!["neuron_device_index", "neuroncore", "physical_core"],
            neuron_optional,
        ),
        "instance labels" => (
            vec![],
            vec![
                "instance_id",
                "instance_type",
                "availability_zone",
                "region",
            ],
        ),
        other => panic!("docs/metrics.md names a label set it does not define: {other:?}"),
    }
}

/// The label names of one sample line, `Hostname` (on every series) and `le` left out.
fn label_names(line: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Some(open) = line.find('{') else {
        return names;
    };
    let mut rest = &line[open + 1..];
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches(',');
        names.insert(name.to_string());
        // Skip the quoted value, escapes included.
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = 0;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = eq + 2 + i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
        if rest.starts_with('}') {
            break;
        }
    }
    names.remove("Hostname");
    names.remove("le");
    names
}

/// `name -> type` from the `# TYPE` lines of a registry with every collector registered.
fn exposed() -> BTreeMap<String, String> {
    exposition()
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

/// The exposition of a registry with every collector registered, every family with a sample.
fn exposition() -> String {
    let registry = mlnode_agent::metrics::registry("doc-test");
    mlnode_agent::metrics::AgentMetrics::register(&registry, mlnode_agent::BUILD)
        .unwrap()
        .set_up(mlnode_agent::metrics::Subsystem::ModelCache, true);
    let cache = mlnode_agent::cache::metrics::CacheMetrics::register(&registry).unwrap();
    // Give every labelled family one child, or the encoder leaves it out.
    let report = mlnode_agent::cache::Report {
        status: mlnode_agent::cache::report::Verdict::Verified,
        revision: Some("r".into()),
        error: None,
        listing_error: None,
        files: Vec::new(),
        root_digest: None,
        ok_not_kept: 1,
        expected_bytes: 0,
        bytes_hashed: 0,
        seconds: 0.0,
        trusted_files: 0,
        fingerprint: None,
    };
    cache.starting("m", Some("r"), 1);
    cache.priority("m", mlnode_agent::cache::priority::Priority::Idle);
    cache.watched("m", true);
    cache.verified_by(
        "m",
        mlnode_agent::cache::state::VerifiedBy::UnchangedSince(1),
        Some(1),
    );
    cache.throttled("m", std::time::Duration::from_millis(5));
    cache.max_bytes_per_second(&registry, 1 << 20).unwrap();
    mlnode_agent::kubelet::pod_resources::register_errors(&registry).unwrap();
    register_gpu(&registry);
    let readiness =
        mlnode_agent::readiness::controller::ReadinessMetrics::register(&registry).unwrap();
    readiness.set_gate("ModelCacheVerified", true);
    register_kube_requests(&registry);
    let workloads =
        mlnode_agent::workloads::controller::WorkloadMetrics::register(&registry).unwrap();
    workloads.set_gate("inference", "vllm-0", "m", true);
    workloads.set_device_gate("inference", "vllm-0", true);
    workloads.set_writable("m", "inference", "vllm-0", 1);
    register_startup(&registry);
    register_kernel_log(&registry);
    let tree = testbed::devices::neuron_sysfs::NeuronTree::new(
        testbed::devices::neuron_sysfs::INF2_XLARGE,
    );
    // One counter reset and one unreadable file, so those families have samples too.
    register_neuron(&registry, &tree);
    let rdma = testbed::devices::rdma_sysfs::Tree::new();
    rdma.efa("rdmap16s27", "0000:10:1b.0", 1000);
    rdma.infiniband("mlx5_0", "0000:c1:00.0", "4: ACTIVE", "5: LinkUp", 0);
    let settings = mlnode_agent::rdma::settings::RdmaSettings {
        sysfs_root: rdma.class(),
        pci_devices: rdma.pci_devices(),
        ..Default::default()
    };
    let mut held = mlnode_core::assignments::Assignments::default();
    held.assign("vpc.amazonaws.com/efa", "rdmap16s27", || {
        mlnode_core::assignments::Assignment {
            pod: "vllm-0".into(),
            namespace: "inference".into(),
            container: "vllm".into(),
        }
    });
    let holders = mlnode_agent::rdma::collector::Holders {
        assignments: mlnode_core::shared::Shared::new(held),
        exclusive: vec!["vpc.amazonaws.com/efa".into()],
        shared: Vec::new(),
    };
    mlnode_agent::rdma::start(&settings, Some(holders), &registry).unwrap();
    mlnode_agent::metrics::encode(&registry);
    // A driver reload and a value in no format, for the RDMA collector's error families.
    let port = rdma.port("rdmap16s27", 1).join("hw_counters");
    std::fs::write(port.join("rx_bytes"), "0\n").unwrap();
    std::fs::write(port.join("tx_bytes"), "garbage\n").unwrap();
    testbed::devices::neuron_sysfs::write(
        &tree
            .core_stats(0, 0)
            .join("other_info/inference_count/total"),
        0,
    );
    testbed::devices::neuron_sysfs::write(
        &tree
            .core_stats(0, 0)
            .join("other_info/model_load_count/total"),
        "garbage",
    );
    // Cycles pass between the two scrapes, so utilisation has an interval.
    for core in 0..2 {
        tree.set_cycles(0, core, 1_000, 0, 8_000_000);
    }
    cache.observe(
        "m",
        &report,
        mlnode_agent::cache::metrics::VerifyKind::Full,
        0,
        0.1,
    );
    // Host CPU usage needs a jiffy (at most 10 ms) to pass between two of the collector's reads.
    let started = std::time::Instant::now();
    loop {
        let text = mlnode_agent::metrics::encode(&registry);
        if text.contains("\nsystem_vcpu_usage_ratio{") {
            return text;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "no CPU time passed in /proc/stat"
        );
    }
}

/// The API client's layer, with one request answered.
fn register_kube_requests(registry: &prometheus::Registry) {
    use tower::{Layer, ServiceExt};
    let layer =
        mlnode_agent::api::ApiLayer::new(registry, std::time::Duration::from_secs(1)).unwrap();
    let server = tower::service_fn(|_: axum::http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(axum::http::Response::new(()))
    });
    let request = axum::http::Request::get("/api/v1/nodes/n1")
        .body(())
        .unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(layer.layer(server).oneshot(request))
        .unwrap();
}

/// A GPU collector with one GPU whose every field was read, and one XID.
fn register_gpu(registry: &prometheus::Registry) {
    use mlnode_agent::gpu::state::{DeviceRead, GpuFailure, GpuState};
    use mlnode_agent::gpu::{GpuIdentity, GpuReading, MemoryReading};
    let mut state = GpuState {
        last_round: Some(std::time::Instant::now()),
        stall_after: std::time::Duration::from_secs(3600),
        xid_count_window: std::time::Duration::from_secs(300),
        ..GpuState::default()
    };
    let identity = GpuIdentity {
        index: 0,
        uuid: "GPU-1".into(),
        pci_bus_id: "00000000:07:00.0".into(),
        model_name: "H100".into(),
        minor_number: Some(0),
        compute_capability: Some((9, 0)),
    };
    let gpm = mlnode_agent::gpu::GpmReading {
        graphics_active: Some(0.5),
        sm_active: Some(0.5),
        tensor_active: Some(0.5),
        dram_active: Some(0.5),
    };
    // A pod's process, on a replica of the GPU the kubelet gave it.
    let owner = mlnode_core::cgroup::CgroupOwner::Container {
        pod_uid: "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b".into(),
        container_id: "0b2f6c".into(),
    };
    let process = mlnode_agent::gpu::GpuProcess {
        pid: 4101,
        memory_bytes: Some(1),
        sm_ratio: Some(0.5),
        owner: Ok(owner),
    };
    let reading = GpuReading {
        memory: Some(MemoryReading {
            total: 4,
            used: 1,
            free: 2,
            reserved: Some(1),
        }),
        clock_event_reasons: Some(1),
        sm_clock_mhz: Some(1),
        mem_clock_mhz: Some(1),
        temperature_c: Some(1),
        power_mw: Some(1),
        power_limit_mw: Some(700_000),
        utilization_gpu_pct: Some(1),
        energy_mj: Some(1),
        memory_copy_util_pct: Some(1),
        encoder_util_pct: Some(1),
        decoder_util_pct: Some(1),
        pcie_replays: Some(1),
        remapped_rows: Some(mlnode_agent::gpu::RemappedRows::default()),
        memory_temp_c: Some(1),
        pcie_bytes_per_second: Some((1, 1)),
        nvlink_bytes: Some((1, 1)),
        nvlink: Some(mlnode_agent::gpu::NvLinkReading {
            links: vec![(0, true)],
            errors: [Some(1); 4],
        }),
        thermal_margins: [Some(40), Some(30), None, Some(-2)],
        gpm: Some(gpm),
        mig_mode: Some(true),
        mig: vec![mlnode_agent::gpu::MigInstance {
            uuid: "MIG-1".into(),
            gpu_instance_id: 1,
            compute_instance_id: 0,
            profile: "1g.10gb".into(),
            memory: Some(MemoryReading {
                total: 4,
                used: 1,
                free: 3,
                reserved: None,
            }),
            gpm: Some(gpm),
            processes: Some(vec![mlnode_agent::gpu::GpuProcess {
                sm_ratio: None,
                ..process.clone()
            }]),
        }],
        processes: Some(vec![process]),
        attribution_trouble: vec!["process_exited"],
        recovery_action: Some(0),
        fabric: Some(mlnode_agent::gpu::FabricReading {
            state: 3,
            status: 0,
            health_mask: Some(0b10),
        }),
    };
    state.apply(
        0,
        DeviceRead::Read {
            identity: identity.clone(),
            reading: Box::new(reading),
        },
        1.0,
        std::time::Instant::now(),
    );
    state.record_xid(0, 79, None, std::time::Instant::now());
    // GPU 0 with a virtual function, and a GPU handed to a VM.
    state.pci = Some(mlnode_agent::pci::BusScan {
        devices: vec!["0000:07:00.0".into(), "0000:0f:00.0".into()],
        virtual_functions: vec!["0000:07:00.4".into()],
        unreadable: Vec::new(),
        drivers: [
            ("0000:07:00.0".to_string(), "nvidia".to_string()),
            ("0000:0f:00.0".to_string(), "vfio-pci".to_string()),
        ]
        .into(),
    });
    state.cuda_driver_version = Some(13000);
    state.reattached.insert("reset", 1);
    state.record_xid(0, 31, Some(1), std::time::Instant::now());
    // A second GPU that needs a reset, so the failure family is exposed too.
    state.apply(
        1,
        DeviceRead::Read {
            identity: GpuIdentity {
                index: 1,
                ..identity
            },
            reading: Box::default(),
        },
        1.0,
        std::time::Instant::now(),
    );
    state.apply(
        1,
        DeviceRead::Failed(GpuFailure::ResetRequired),
        1.0,
        std::time::Instant::now(),
    );
    let holder = mlnode_core::assignments::Assignment {
        pod: "vllm-0".into(),
        namespace: "inference".into(),
        container: "vllm".into(),
    };
    let mut assignments = mlnode_core::assignments::Assignments::default();
    assignments.assign_replica("GPU-1", "0", holder);
    let pods = mlnode_core::pods::PodDirectory::from_pods([mlnode_core::pods::PodIdentity {
        namespace: "inference".into(),
        name: "vllm-0".into(),
        uid: "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b".into(),
        containers: [("0b2f6c".to_string(), "vllm".to_string())].into(),
        labels: Default::default(),
    }]);
    let collector = mlnode_agent::gpu::collector::GpuCollector::new(
        mlnode_agent::shared::Shared::new(state),
        mlnode_agent::shared::Shared::new(assignments),
        mlnode_core::pods::PodNames {
            pods: mlnode_agent::shared::Shared::new(pods),
            holder: Default::default(),
        },
        Vec::new(),
        Default::default(),
        true,
        None,
    )
    .unwrap();
    registry.register(Box::new(collector)).unwrap();
}

fn register_kernel_log(registry: &prometheus::Registry) {
    let metrics = mlnode_agent::kernel_log::journal::KernelLogMetrics::register(registry).unwrap();
    metrics.unreadable([].iter());
    let mut parser = mlnode_agent::kernel_log::parse::Parser::default();
    for line in [
        "NVRM: GPU 0000:5a:00.0: GPU has fallen off the bus.",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal",
        "NEURON_HW_ERR=DMA_ERROR nd-id=0",
    ] {
        metrics.count(&parser.line(line).unwrap());
    }
}

/// Startup metrics after one startup with every phase, a pull with a size and a cache hit, its
/// split, and a lazily loaded image.
fn register_startup(registry: &prometheus::Registry) {
    use mlnode_agent::startup::lazy::split::{Fetch, LazyLoad, Stretch};
    use mlnode_agent::startup::phases::{Phase, Pull, Startup};
    let metrics = mlnode_agent::startup::tracker::StartupMetrics::register(registry).unwrap();
    let pull = |cache_hit| Pull {
        image: "i".into(),
        seconds: 1.0,
        including_waiting_seconds: None,
        size_bytes: Some(1),
        cache_hit,
        pulled_at: None,
        field_path: None,
    };
    let startup = Startup {
        namespace: "ns".into(),
        pod: "p".into(),
        uid: "u".into(),
        model_name: Some("m".into()),
        phases: Phase::ALL.iter().map(|p| (*p, 1.0)).collect(),
        total_seconds: 5.0,
        pulls: vec![pull(false), pull(true)],
        restarts: 0,
        intervals: Default::default(),
        lazy_load: Some(LazyLoad {
            lazy: Some(true),
            fetched: [(
                Stretch::StartToReady,
                Fetch {
                    fetched_bytes: 1,
                    read_bytes: 1,
                    fetch_seconds: 1.0,
                },
            )]
            .into(),
        }),
        model_download: Some(mlnode_agent::startup::phases::ModelDownload {
            seconds: 1.0,
            bytes: 1,
            files: 1,
            bytes_per_second: Some(1.0),
        }),
        image_pull_split: Some(mlnode_agent::startup::image_pull::PodSplit::Split(
            mlnode_agent::startup::image_pull::Split {
                transfer_seconds: 0.8,
                unpack_seconds: 0.2,
            },
        )),
    };
    metrics.observe(&startup);
    metrics.set_last_phases(&startup);
}

fn register_neuron(
    registry: &prometheus::Registry,
    tree: &testbed::devices::neuron_sysfs::NeuronTree,
) {
    let settings = mlnode_agent::neuron::settings::NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        class_root: tree.class_root().to_path_buf(),
        monitor_names: true,
        ..Default::default()
    };
    // One report from neuron-monitor, so the input's families have samples too.
    let runtimes = mlnode_agent::neuron::monitor_input::SharedRuntimes::default();
    let report: serde_json::Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/neuron-monitor/report.json"
    ))
    .unwrap();
    runtimes.update(|folded| {
        folded
            .apply(&report.to_string(), std::time::Instant::now())
            .unwrap();
        folded
            .apply("not a report", std::time::Instant::now())
            .unwrap_err();
    });
    let collector = mlnode_agent::neuron::collector::NeuronCollector::new(
        settings,
        Default::default(),
        Default::default(),
        Some(runtimes),
        vec![],
        vec![],
        Default::default(),
    )
    .unwrap();
    registry.register(Box::new(collector)).unwrap();
}

#[test]
fn docs_and_exposition_list_the_same_series() {
    let documented = documented();
    assert!(
        documented.len() >= 9,
        "the table was not parsed: {documented:?}"
    );
    assert_eq!(documented, exposed());
}

#[test]
fn docs_name_every_label_of_every_series() {
    let text = exposition();
    let families: BTreeSet<String> = exposed().into_keys().collect();
    let mut exposed_labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let series = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| series.strip_suffix(suffix))
            .filter(|base| families.contains(*base))
            .unwrap_or(series);
        exposed_labels
            .entry(family.to_string())
            .or_default()
            .extend(label_names(line));
    }
    let mut wrong = Vec::new();
    for (name, _, cell) in rows() {
        let (mut required, mut allowed) = (BTreeSet::new(), BTreeSet::new());
        for part in cell.split(',').map(str::trim).filter(|p| *p != "-") {
            match part.strip_prefix('`').and_then(|p| p.strip_suffix('`')) {
                Some(label) => {
                    required.insert(label.to_string());
                }
                None => {
                    let (always, sometimes) = label_group(part);
                    required.extend(always.iter().map(|l| l.to_string()));
                    allowed.extend(sometimes.iter().map(|l| l.to_string()));
                }
            }
        }
        allowed.extend(required.iter().cloned());
        let actual = exposed_labels.get(&name).cloned().unwrap_or_default();
        let undocumented: Vec<_> = actual.difference(&allowed).collect();
        let missing: Vec<_> = required.difference(&actual).collect();
        if !undocumented.is_empty() || !missing.is_empty() {
            wrong.push(format!(
                "{name}: exposed but not documented {undocumented:?}, documented but not exposed {missing:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn label_names_are_read_past_quoted_values() {
    let line = r#"x{a="1",b="NVIDIA H100, \"SXM\"",Hostname="n",le="0.5"} 1"#;
    assert_eq!(
        label_names(line).into_iter().collect::<Vec<_>>(),
        ["a", "b"]
    );
}
