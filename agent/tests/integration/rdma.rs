//! The RDMA collector on device trees shaped from the kernel's and the EFA driver's sources
//! (testbed::devices::rdma_sysfs): a p5.48xlarge's 32 EFA devices and an InfiniBand HCA whose port is down, the
//! agent run as `serve`; then what a driver reload, a device that goes away and a value in no
//! format do to the series.

use std::time::Duration;

use mlnode_agent::rdma::settings::DEFAULT_COUNTERS;
use mlnode_testbed as testbed;
use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::devices::rdma_sysfs::{Tree, EFA_PORT_STATS};

fn start(tree: &Tree) -> Agent {
    start_with(tree, "")
}

/// [`start`] with more top-level settings.
fn start_with(tree: &Tree, extra: &str) -> Agent {
    Agent::start(&format!(
        "models: []\nnvml:\n  enabled: false\nneuron:\n  enabled: false\nrdma:\n  sysfs_root: {:?}\n  pci_devices: {:?}\n{extra}",
        tree.class().display().to_string(),
        tree.pci_devices().display().to_string()
    ))
}

/// The kubelet's pod-resources answer names which pod holds which EFA device. The id's spelling is
/// aws-efa-k8s-device-plugin's and undocumented: an id that is the device's RDMA name, its uverbs
/// name or its PCI function is resolved; one that is none of them is counted, not guessed at.
#[test]
fn each_pods_efa_devices_are_named_from_the_kubelet() {
    let tree = Tree::new();
    tree.efa("rdmap16s27", "0000:10:1b.0", 1000);
    tree.efa("rdmap32s27", "0000:20:1b.0", 2000);
    tree.efa("rdmap48s27", "0000:30:1b.0", 3000);
    tree.uverbs(1, "rdmap32s27");
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(
        testbed::node::pod_resources::response(&[
            ("prefill-0", "vpc.amazonaws.com/efa", &["rdmap16s27"]),
            (
                "decode-0",
                "vpc.amazonaws.com/efa",
                &["uverbs1", "0000:30:1b.0"],
            ),
            ("decode-1", "vpc.amazonaws.com/efa", &["efa-7"]),
            ("vllm-0", "nvidia.com/gpu", &["rdmap48s27"]),
        ]),
    );
    let agent = start_with(
        &tree,
        &format!(
            "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
            kubelet.socket().display().to_string()
        ),
    );
    agent.wait_for("the holders", Duration::from_secs(20), |m| {
        sample(m, "mlnode_rdma_pod_device_ids_unresolved", &[]) == Some(1.0)
    });
    let m = agent.metrics();
    let held = |device: &str, pod: &str, container: &str| {
        sample(
            &m,
            "mlnode_rdma_pod_device",
            &[
                ("device", device),
                ("pod", pod),
                ("namespace", "inference"),
                ("container", container),
            ],
        )
    };
    assert_eq!(held("rdmap16s27", "prefill-0", "prefill"), Some(1.0));
    assert_eq!(
        held("rdmap32s27", "decode-0", "decode"),
        Some(1.0),
        "by uverbs name"
    );
    assert_eq!(
        held("rdmap48s27", "decode-0", "decode"),
        Some(1.0),
        "by PCI function"
    );
    assert_eq!(
        m.lines()
            .filter(|l| l.starts_with("mlnode_rdma_pod_device{"))
            .count(),
        3,
        "a GPU's id is no RDMA device's, and the unresolved id names none\n{m}"
    );
    assert!(
        agent.log().contains("efa-7") && agent.log().matches("names no RDMA device").count() == 1,
        "said once, naming the id\n{}",
        agent.log()
    );
}

#[test]
fn a_p5_nodes_efa_devices_and_an_infiniband_port_are_read_as_the_kernel_writes_them() {
    let tree = Tree::new();
    let efa = tree.p5();
    tree.infiniband("mlx5_0", "0000:c1:00.0", "1: DOWN", "3: Disabled", 3);
    std::fs::write(
        tree.port("mlx5_0", 1).join("counters/VL15_dropped"),
        "N/A (no PMA)\n",
    )
    .unwrap();
    let agent = start(&tree);
    agent.wait_for("the RDMA collector", Duration::from_secs(20), |m| {
        sample(m, "mlnode_rdma_device_count", &[]) == Some(33.0)
    });
    let m = agent.metrics();
    assert_eq!(
        sample(&m, "mlnode_collector_up", &[("collector", "rdma")]),
        Some(1.0)
    );
    assert_eq!(sample(&m, "mlnode_rdma_efa_pci_devices", &[]), Some(32.0));
    let first = efa[0].as_str();
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_device_info",
            &[
                ("device", first),
                ("driver", "efa"),
                ("pci_bus_id", "0000:10:00.0")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_state",
            &[("device", first), ("port", "1"), ("link_layer", "Unknown")]
        ),
        Some(4.0),
        "EFA's port is ACTIVE"
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_rate_bytes_per_second",
            &[("device", first), ("port", "1")]
        ),
        Some(12.5e9),
        "100 Gb/sec"
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_hw_counter_total",
            &[("device", efa[31].as_str()), ("counter", "rx_bytes")]
        ),
        Some(32000.0)
    );
    let port_stats = m
        .lines()
        .filter(|l| l.starts_with("mlnode_rdma_port_hw_counter_total{") && l.contains(first))
        .count();
    let exported = EFA_PORT_STATS
        .iter()
        .filter(|s| DEFAULT_COUNTERS.contains(s))
        .count();
    assert_eq!(port_stats, exported, "the default counters, no lifespan");
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_hw_counter_total",
            &[("device", first), ("counter", "tx_pkts")]
        ),
        None,
        "not among the default counters"
    );
    assert!(!m.contains("counter=\"lifespan\""), "lifespan is a setting");
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_device_hw_counter_total",
            &[("device", first), ("counter", "cmds_err")]
        ),
        Some(0.0)
    );
    // The HCA: its port down and disabled, the PMA counters read, the one without a PMA left out.
    let port = [("device", "mlx5_0"), ("port", "1")];
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_state",
            &[port[0], port[1], ("link_layer", "InfiniBand")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&m, "mlnode_rdma_port_physical_state", &port),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_counter_total",
            &[port[0], port[1], ("counter", "link_downed")]
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_counter_total",
            &[port[0], port[1], ("counter", "VL15_dropped")]
        ),
        None,
        "N/A is no value"
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_sysfs_read_errors_total",
            &[("kind", "parse")]
        ),
        None,
        "nothing unparsed"
    );

    // A driver reload: the counters start again from 0; the exported one goes on.
    let rx = tree.port(first, 1).join("hw_counters/rx_bytes");
    std::fs::write(&rx, "10\n").unwrap();
    // A value in no format the kernel writes, and a device gone.
    std::fs::write(tree.port(first, 1).join("hw_counters/tx_bytes"), "lots\n").unwrap();
    std::fs::remove_dir_all(tree.device(efa[5].as_str())).unwrap();
    agent.wait_for("the next read", Duration::from_secs(20), |m| {
        sample(m, "mlnode_rdma_device_count", &[]) == Some(32.0)
    });
    let m = agent.metrics();
    let rx_bytes = [("device", first), ("port", "1"), ("counter", "rx_bytes")];
    assert_eq!(
        sample(&m, "mlnode_rdma_port_hw_counter_total", &rx_bytes),
        Some(1010.0),
        "1000 before the reload, 10 since"
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_counter_resets_total",
            &[("kind", "port_hw")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_rdma_port_hw_counter_total",
            &[("device", first), ("port", "1"), ("counter", "tx_bytes")]
        ),
        None,
        "no value rather than a wrong one"
    );
    assert!(
        sample(
            &m,
            "mlnode_rdma_sysfs_read_errors_total",
            &[("kind", "parse")]
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        !m.contains(&format!("device=\"{}\"", efa[5])),
        "the device gone has no series"
    );
    let said = agent
        .log()
        .lines()
        .filter(|l| l.contains("cannot read part of the RDMA devices"))
        .count();
    assert_eq!(said, 1, "said once: {}", agent.log());
}

/// An agent judging a fabric, and what it needs kept while it runs.
struct Judged {
    agent: Agent,
    _model: testbed::models::PlainModel,
    _manifest: tempfile::TempDir,
}

/// The agent with the RDMA collector on `tree` (32 EFA devices expected), a verified model, and
/// the readiness controller on `node` (the real server, through the proxy) with the startup taint
/// and `readiness` (more lines of its section).
fn start_judged(tree: &Tree, node: &ApiOnlyNode, readiness: &str) -> Judged {
    let model = testbed::models::PlainModel::new();
    let (dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = node.start_agent(
        &format!(
            "nvml:\n  enabled: false\nneuron:\n  enabled: false\nrdma:\n  sysfs_root: {:?}\n  pci_devices: {:?}\n  expected_efa_devices: 32\nreadiness:\n  enabled: true\n  startup_taint: mlnode.dev/not-ready:NoSchedule\n  interval: 200ms\n  heartbeat: 1s\n{readiness}{}",
            tree.class().display().to_string(),
            tree.pci_devices().display().to_string(),
            testbed::agent::model_config("llama", model.root(), &manifest)
        ),
    );
    Judged {
        agent,
        _model: model,
        _manifest: dir,
    }
}

/// A p5 node's EFA devices with the eighth's function left on the bus and its device gone.
fn p5_missing_one() -> Tree {
    let tree = Tree::new();
    let efa = tree.p5();
    std::fs::remove_dir_all(tree.device(&efa[7])).unwrap();
    tree
}

const REPAIR: &str = "  repair_condition: AcceleratedHardwareReady\n";

/// The components the repair condition and the startup taint need (their RBAC and policy).
const WITH_REPAIR: &[&str] = &["components/startup-taint", "components/repair-condition"];

/// With `readiness.repair_condition`, the fabric's verdict is also `NetworkingReady`, the
/// condition eks-node-monitoring-agent writes and the repair engines act on; the accelerators'
/// repair condition stays True.
#[test]
fn the_repair_condition_hands_a_faulty_fabric_to_the_repair_engines() {
    let tree = p5_missing_one();
    let api = testbed::needs!(ApiOnlyNode::gpu(WITH_REPAIR));
    let _judged = start_judged(&tree, &api, REPAIR);
    testbed::wait_until(
        "NetworkingReady False",
        Duration::from_secs(20),
        || match api.condition("NetworkingReady")["status"].as_str() {
            Some("False") => Ok(()),
            _ => Err(api.condition("NetworkingReady").to_string()),
        },
    );
    let networking = api.condition("NetworkingReady");
    assert_eq!(networking["reason"], "EFADeviceMissing");
    assert_eq!(
        networking["message"],
        api.condition("FabricHealthy")["message"]
    );
    assert_eq!(api.condition("AcceleratedHardwareReady")["status"], "True");
}

/// A flapping InfiniBand port (its `link_downed` up by more than `rdma.flap_threshold` within the
/// window) turns `NetworkingReady` False on the real server, and Karpenter's own matcher
/// (tests/programs/karpenter-repair) replaces the node after 30 minutes under every policy set: its
/// `NetworkingReady` policy reads no reason. No heartbeat moves the transition it counts from.
#[test]
fn karpenter_replaces_a_node_whose_infiniband_port_flaps_after_thirty_minutes() {
    let tree = Tree::new();
    tree.p5();
    tree.infiniband("mlx5_0", "0000:c1:00.0", "4: ACTIVE", "5: LinkUp", 0);
    let api = testbed::needs!(ApiOnlyNode::gpu(WITH_REPAIR));
    let judged = start_judged(&tree, &api, REPAIR);
    let networking = |what: &str, check: &dyn Fn(&serde_json::Value) -> bool| {
        testbed::wait_until(what, Duration::from_secs(20), || {
            let condition = api.condition("NetworkingReady");
            if check(&condition) {
                Ok(condition)
            } else {
                Err(format!("{condition}\n{}", judged.agent.log()))
            }
        })
    };
    networking("NetworkingReady True", &|c| c["status"] == "True");
    std::fs::write(tree.port("mlx5_0", 1).join("counters/link_downed"), "5\n").unwrap();
    let flapping = networking("the port flapping", &|c| c["status"] == "False");
    assert_eq!(flapping["reason"], "RDMALinkFlapping", "{flapping}");
    let decided =
        testbed::cluster::karpenter::decisions_for(&api.node(), "NetworkingReady").unwrap();
    assert_eq!(
        decided
            .iter()
            .map(testbed::cluster::karpenter::said)
            .collect::<Vec<_>>(),
        ["replace after 30 min, any reason"; 3]
    );
    let later = networking("a heartbeat", &|c| {
        c["lastHeartbeatTime"] != flapping["lastHeartbeatTime"]
    });
    assert_eq!(later["lastTransitionTime"], flapping["lastTransitionTime"]);
}

/// Where eks-node-monitoring-agent owns `NetworkingReady`, the agent never writes it (it says why,
/// once) and keeps writing the repair condition no one else owns.
#[test]
fn a_networking_condition_another_writer_owns_is_never_taken_over() {
    let tree = p5_missing_one();
    let api = testbed::needs!(ApiOnlyNode::gpu(WITH_REPAIR));
    let theirs = serde_json::json!({"type": "NetworkingReady", "status": "True", "reason": "NetworkingIsReady",
        "message": "Monitoring for the Networking system is active",
        "lastHeartbeatTime": "2026-11-30T03:58:00Z", "lastTransitionTime": "2026-11-30T03:51:00Z"});
    api.control_plane.admin(
        &[
            "patch",
            "node",
            api.name(),
            "--subresource=status",
            "--type=strategic",
            "--field-manager=eks-node-monitoring-agent",
            "-p",
            &serde_json::json!({"status": {"conditions": [theirs]}}).to_string(),
        ],
        "",
    );
    let judged = start_judged(&tree, &api, REPAIR);
    let agent = &judged.agent;
    testbed::wait_until(
        "our repair condition and FabricHealthy",
        Duration::from_secs(20),
        || match (
            api.condition("AcceleratedHardwareReady")["status"].as_str(),
            api.condition("FabricHealthy")["status"].as_str(),
        ) {
            (Some("True"), Some("False")) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    agent.wait_for("the refusal", Duration::from_secs(20), |m| {
        sample(m, "mlnode_readiness_repair_condition_refused", &[]) == Some(1.0)
    });
    assert_eq!(api.condition("NetworkingReady"), theirs, "left as it was");
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.resource_path().ends_with("/status")
                && r.body.to_string().contains("NetworkingReady")),
        "never written"
    );
    let said: Vec<String> = agent
        .log()
        .lines()
        .filter(|l| l.contains("does not take it over"))
        .map(str::to_string)
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("NetworkingReady is written by eks-node-monitoring-agent"),
        "{}",
        said[0]
    );
}

/// The verdict on a p5 node with one EFA function the driver did not register and an InfiniBand
/// port down: `FabricHealthy` False naming both, `AcceleratorHealthy` untouched, and the startup
/// taint still comes off (a fabric fault does not hold the node: docs/fabric.md).
#[test]
fn a_missing_efa_device_and_a_port_down_fail_fabric_healthy_naming_them() {
    let tree = p5_missing_one();
    tree.infiniband("mlx5_0", "0000:c1:00.0", "1: DOWN", "3: Disabled", 0);
    let api = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    let judged = start_judged(&tree, &api, "");
    let agent = &judged.agent;
    testbed::wait_until("FabricHealthy False", Duration::from_secs(20), || match api
        .condition("FabricHealthy")["status"]
        .as_str()
    {
        Some("False") => Ok(()),
        _ => Err(format!(
            "{}\n{}",
            api.condition("FabricHealthy"),
            agent.log()
        )),
    });
    let fabric = api.condition("FabricHealthy");
    let message = fabric["message"].as_str().unwrap();
    assert_eq!(fabric["reason"], "EFADeviceMissing", "{message}");
    assert!(
        message.contains("the EFA function 0000:2c:00.0 is on the PCI bus but has no RDMA device")
            && message.contains("31 of the 32 EFA devices")
            && message.contains("mlx5_0 port 1 is DOWN, physical state Disabled"),
        "{message}"
    );
    assert_eq!(api.condition("AcceleratorHealthy")["status"], "True");
    testbed::wait_until("the startup taint off", Duration::from_secs(20), || {
        let taints = api.node()["spec"]["taints"].clone();
        match taints
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"] == "mlnode.dev/not-ready")
        {
            false => Ok(()),
            true => Err(taints.to_string()),
        }
    });
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_readiness_gate",
            &[("gate", "FabricHealthy")]
        ),
        Some(0.0)
    );
}

/// node_exporter's quantities and the agent's series for them: (node_exporter's name, the
/// agent's family, the kernel's counter (for the agent's `counter` label), how many of the
/// agent's units are one of node_exporter's). The PMA data counters count 4-byte words, which
/// node_exporter turns into bytes and the agent exports as the kernel counts them.
const AS_NODE_EXPORTER_NAMES_THEM: [(&str, &str, Option<&str>, f64); 19] = [
    (
        "node_infiniband_state_id",
        "mlnode_rdma_port_state",
        None,
        1.0,
    ),
    (
        "node_infiniband_physical_state_id",
        "mlnode_rdma_port_physical_state",
        None,
        1.0,
    ),
    (
        "node_infiniband_rate_bytes_per_second",
        "mlnode_rdma_port_rate_bytes_per_second",
        None,
        1.0,
    ),
    (
        "node_infiniband_link_downed_total",
        PMA,
        Some("link_downed"),
        1.0,
    ),
    (
        "node_infiniband_link_error_recovery_total",
        PMA,
        Some("link_error_recovery"),
        1.0,
    ),
    (
        "node_infiniband_multicast_packets_received_total",
        PMA,
        Some("multicast_rcv_packets"),
        1.0,
    ),
    (
        "node_infiniband_multicast_packets_transmitted_total",
        PMA,
        Some("multicast_xmit_packets"),
        1.0,
    ),
    (
        "node_infiniband_port_constraint_errors_received_total",
        PMA,
        Some("port_rcv_constraint_errors"),
        1.0,
    ),
    (
        "node_infiniband_port_constraint_errors_transmitted_total",
        PMA,
        Some("port_xmit_constraint_errors"),
        1.0,
    ),
    (
        "node_infiniband_port_data_received_bytes_total",
        PMA,
        Some("port_rcv_data"),
        4.0,
    ),
    (
        "node_infiniband_port_data_transmitted_bytes_total",
        PMA,
        Some("port_xmit_data"),
        4.0,
    ),
    (
        "node_infiniband_port_discards_received_total",
        PMA,
        Some("port_rcv_discards"),
        1.0,
    ),
    (
        "node_infiniband_port_discards_transmitted_total",
        PMA,
        Some("port_xmit_discards"),
        1.0,
    ),
    (
        "node_infiniband_port_errors_received_total",
        PMA,
        Some("port_rcv_errors"),
        1.0,
    ),
    (
        "node_infiniband_port_packets_received_total",
        PMA,
        Some("port_rcv_packets"),
        1.0,
    ),
    (
        "node_infiniband_port_packets_transmitted_total",
        PMA,
        Some("port_xmit_packets"),
        1.0,
    ),
    (
        "node_infiniband_port_transmit_wait_total",
        PMA,
        Some("port_xmit_wait"),
        1.0,
    ),
    (
        "node_infiniband_unicast_packets_received_total",
        PMA,
        Some("unicast_rcv_packets"),
        1.0,
    ),
    (
        "node_infiniband_unicast_packets_transmitted_total",
        PMA,
        Some("unicast_xmit_packets"),
        1.0,
    ),
];

const PMA: &str = "mlnode_rdma_port_counter_total";

/// node_exporter's own InfiniBand fixture (collector/fixtures/sys.ttar at v1.12.1: an i40iw0 whose
/// PMA counters answer `N/A (no PMA)`, an mlx4_0 with two ports) read by the agent, every quantity
/// both export equal to node_exporter's own expected output (collector/fixtures/e2e-output.txt);
/// what node_exporter exports and the agent does not is named (docs/fabric.md says why).
#[test]
fn node_exporters_infiniband_fixture_reads_as_node_exporter_reads_it() {
    let fixtures = fixtures("node_exporter");
    let (_tree, ours) = read_as_the_agent(&fixtures.join("sys-class-infiniband.ttar"), "sys", 2);
    let expected_file = fixtures.join("e2e-output-infiniband.txt");
    let expected = std::fs::read_to_string(&expected_file).unwrap();
    let mut compared = 0;
    let mut left_out = std::collections::BTreeSet::new();
    for line in expected.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("{}: {line:?}", expected_file.display()));
        let (name, labels) = series.split_once('{').unwrap();
        let value: f64 = value.parse().unwrap();
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches(['"', '}']).to_string())
        };
        let Some((_, family, counter, units)) = AS_NODE_EXPORTER_NAMES_THEM
            .iter()
            .find(|(n, ..)| *n == name)
        else {
            left_out.insert(name.to_string());
            continue;
        };
        let (device, port) = (label("device").unwrap(), label("port").unwrap());
        let mut wanted = vec![("device", device.as_str()), ("port", port.as_str())];
        if let Some(counter) = counter {
            wanted.push(("counter", counter));
        }
        assert_eq!(
            sample(&ours, family, &wanted).map(|v| v * units),
            Some(value),
            "{line}: the agent's {family} {wanted:?}"
        );
        compared += 1;
    }
    assert_eq!(
        compared, 33,
        "every sample of a quantity both export (51, less 2 info and 16 legacy)"
    );
    assert_eq!(
        left_out.into_iter().collect::<Vec<_>>(),
        [
            "node_infiniband_info",
            "node_infiniband_legacy_data_received_bytes_total",
            "node_infiniband_legacy_data_transmitted_bytes_total",
            "node_infiniband_legacy_multicast_packets_received_total",
            "node_infiniband_legacy_multicast_packets_transmitted_total",
            "node_infiniband_legacy_packets_received_total",
            "node_infiniband_legacy_packets_transmitted_total",
            "node_infiniband_legacy_unicast_packets_received_total",
            "node_infiniband_legacy_unicast_packets_transmitted_total",
        ],
        "docs/fabric.md: what node_exporter exports and the agent does not"
    );
    // i40iw0 answers no management datagrams: neither exports a PMA counter for it.
    assert!(
        !ours.contains("device=\"i40iw0\",port=\"1\",counter="),
        "no counter for a port without a PMA"
    );
    assert!(
        !expected.contains("_total{device=\"i40iw0\""),
        "node_exporter's neither"
    );
}

/// procfs's InfiniBand fixture (testdata/fixtures.ttar at v0.23.0: an Omni-Path hfi1_0, an mlx4_0
/// with two ports, an mlx5_0 with its driver's hw_counters) read by the agent with every counter
/// on: no value left unread or misread, each series the value of its file.
#[test]
fn procfs_infiniband_fixture_reads_whole() {
    let archive = fixtures("procfs").join("sys-class-infiniband.ttar");
    let (tree, ours) = read_as_the_agent(&archive, "fixtures/sys", 3);
    assert_eq!(
        sample(
            &ours,
            "mlnode_rdma_sysfs_read_errors_total",
            &[("kind", "parse")]
        ),
        None
    );
    let class = tree.path().join("fixtures/sys/class/infiniband");
    let mut compared = 0;
    let files = walkdir::WalkDir::new(&class)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file());
    for file in files {
        let relative = file.path().strip_prefix(&class).unwrap();
        let parts: Vec<&str> = relative.iter().map(|p| p.to_str().unwrap()).collect();
        let text = std::fs::read_to_string(file.path()).unwrap();
        let (family, labels, value): (&str, Vec<(&str, &str)>, f64) = match parts[..] {
            [device, "ports", port, folder, counter] if counter != "lifespan" => {
                let Ok(value) = text.trim().parse::<u64>() else {
                    assert!(text.starts_with("N/A"), "{}: {text:?}", relative.display());
                    continue;
                };
                let family = match folder {
                    "counters" => PMA,
                    "hw_counters" => "mlnode_rdma_port_hw_counter_total",
                    _ => continue,
                };
                let labels = vec![("device", device), ("port", port), ("counter", counter)];
                (family, labels, value as f64)
            }
            [device, "ports", port, file @ ("state" | "phys_state")] => {
                let family = if file == "state" {
                    "mlnode_rdma_port_state"
                } else {
                    "mlnode_rdma_port_physical_state"
                };
                let id = text.split(':').next().unwrap().parse::<f64>().unwrap();
                (family, vec![("device", device), ("port", port)], id)
            }
            _ => continue,
        };
        assert_eq!(
            sample(&ours, family, &labels),
            Some(value),
            "{}",
            relative.display()
        );
        compared += 1;
    }
    assert!(compared > 60, "{compared} values compared");
}

fn fixtures(upstream: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(upstream)
}

/// `archive` unpacked, its `sys` (at `sys` inside it) read by the agent with every counter on,
/// once it has seen `devices`; the tree (kept while the caller reads it) and the agent's metrics.
fn read_as_the_agent(
    archive: &std::path::Path,
    sys: &str,
    devices: usize,
) -> (tempfile::TempDir, String) {
    let tree = tempfile::tempdir().unwrap();
    testbed::devices::ttar::unpack(&std::fs::read_to_string(archive).unwrap(), tree.path())
        .unwrap_or_else(|e| panic!("{}: {e}", archive.display()));
    let no_pci = tempfile::tempdir().unwrap();
    let agent = Agent::start(&format!(
        "models: []\nnvml:\n  enabled: false\nneuron:\n  enabled: false\nrdma:\n  sysfs_root: {:?}\n  pci_devices: {:?}\n  counters: [\"*\"]\n",
        tree.path().join(sys).join("class/infiniband").display().to_string(),
        no_pci.path().display().to_string()
    ));
    agent.wait_for("the RDMA collector", Duration::from_secs(20), |m| {
        sample(m, "mlnode_rdma_device_count", &[]) == Some(devices as f64)
    });
    let metrics = agent.metrics();
    (tree, metrics)
}

/// A ttar fixture that does not parse fails, naming the line and why.
#[test]
fn a_malformed_ttar_archive_is_refused_naming_the_line() {
    let into = tempfile::tempdir().unwrap();
    let short = "Directory: sys\nMode: 755\nPath: sys/rate\nLines: 2\n100 Gb/sec\n";
    let refused = testbed::devices::ttar::unpack(short, into.path()).unwrap_err();
    assert!(
        refused.starts_with("line 3: fewer lines than it says"),
        "{refused}"
    );
    let unknown = testbed::devices::ttar::unpack("Entry: sys\n", into.path()).unwrap_err();
    assert!(
        unknown.contains("neither Directory, Path nor Mode"),
        "{unknown}"
    );
}
