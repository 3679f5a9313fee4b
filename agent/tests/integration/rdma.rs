//! The RDMA collector on device trees shaped from the kernel's and the EFA driver's sources
//! (common::rdma): a p5.48xlarge's 32 EFA devices and an InfiniBand HCA whose port is down, the
//! agent run as `serve`; then what a driver reload, a device that goes away and a value in no
//! format do to the series.

use crate::common;

use std::time::Duration;

use common::agent::{sample, Agent};
use common::rdma::{Tree, EFA_PORT_STATS};
use mlnode_agent::rdma::settings::DEFAULT_COUNTERS;

fn start(tree: &Tree) -> Agent {
    Agent::start(&format!(
        "models: []\nnvml:\n  enabled: false\nneuron:\n  enabled: false\nrdma:\n  sysfs_root: {:?}\n  pci_devices: {:?}\n",
        tree.class().display().to_string(),
        tree.pci_devices().display().to_string()
    ))
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

/// The verdict on a p5 node with one EFA function the driver did not register and an InfiniBand
/// port down: `FabricHealthy` False naming both, `AcceleratorHealthy` untouched, and the startup
/// taint still comes off (a fabric fault does not hold the node: docs/fabric.md).
#[test]
fn a_missing_efa_device_and_a_port_down_fail_fabric_healthy_naming_them() {
    let tree = Tree::new();
    let efa = tree.p5();
    // The function stays on the bus; the driver's device for it is gone.
    std::fs::remove_dir_all(tree.device(&efa[7])).unwrap();
    tree.infiniband("mlx5_0", "0000:c1:00.0", "1: DOWN", "3: Disabled", 0);
    let api = common::kube::FakeApiServer::start(common::kube::gpu_node(common::pods::NODE));
    let model = common::PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let agent = Agent::start_with_env(
        &format!(
            "nvml:\n  enabled: false\nneuron:\n  enabled: false\nrdma:\n  sysfs_root: {:?}\n  pci_devices: {:?}\n  expected_efa_devices: 32\nreadiness:\n  enabled: true\n  startup_taint: mlnode.dev/not-ready:NoSchedule\n  interval: 200ms\n  heartbeat: 1s\n{}",
            tree.class().display().to_string(),
            tree.pci_devices().display().to_string(),
            common::agent::model_config("llama", model.root(), &manifest)
        ),
        &[
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", std::path::Path::new(common::pods::NODE)),
        ],
    );
    common::wait_until("FabricHealthy False", Duration::from_secs(20), || match api
        .condition("FabricHealthy")["status"]
        .as_str()
    {
        Some("False") => Ok(()),
        _ => Err(api.condition("FabricHealthy").to_string()),
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
    common::wait_until("the startup taint off", Duration::from_secs(20), || {
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
