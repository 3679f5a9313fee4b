//! AcceleratorHealthy from what the GPUs say: the driver's recovery action and NVIDIA's XID
//! catalog, fabric registration, repeated XIDs, memory that cannot heal, NVLink, a GPU NVML does not
//! list, a held fault across a restart, the instance type's GPU count.

use super::*;

/// The driver's verdict first: a recovery action other than NONE (nvml.h's values) turns
/// `AcceleratorHealthy` False with a reason naming it and a message naming the GPU, and NONE
/// again turns it back. XIDs follow NVIDIA's catalog: 94 (RESTART_APP) is counted under its
/// action and holds nothing; 46 (RESET_GPU, no recovery action linked) holds the node through the
/// driver's NONE.
#[test]
fn accelerator_health_follows_the_drivers_recovery_action_and_nvidias_catalog() {
    let mut scenario = Scenario::new(4);
    let (agent, api) = testbed::needs!(start_with_readiness(&scenario));
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
    let (agent, api) = testbed::needs!(start_with_readiness(&scenario));
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
    let (agent, api) = testbed::needs!(start_with_readiness(&scenario));
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

/// XID 13 is the application's fault alone and NVIDIA's catalog resolves it by its history: the
/// node stays in through three on one GPU and is held at the fourth within the threshold's window
/// (`readiness.xid_thresholds`), the reason naming the GPU and the XID; XID 43, not listed, never
/// holds it however often it comes.
#[test]
fn repeated_xids_beyond_their_threshold_hold_the_node() {
    let mut scenario = Scenario::new(2);
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
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
    let (agent, api) = testbed::needs!(start_with_readiness(&scenario));
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
    let (agent, api) = testbed::needs!(start_with_readiness(&scenario));
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
    let (agent, api) = testbed::needs!(start_with_readiness(&scenario));
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
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
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

/// A p5.48xlarge that Karpenter labelled with its instance type's 8 GPUs, with 7 on the bus and no
/// `nvml.expected_gpus`: the label speaks, and `AcceleratorHealthy` names it.
#[test]
fn the_nodes_instance_type_label_says_how_many_gpus_it_has() {
    let scenario = Scenario::new(7);
    let control_plane = testbed::needs!(testbed::cluster::control_plane::shared());
    let objects = testbed::needs!(testbed::renderers::kustomize::render_with(
        "overlays/gpu",
        &[]
    ));
    let labels = json!({"metadata": {"labels": {"karpenter.k8s.aws/instance-gpu-count": "8"}}});
    let node = testbed::cluster::control_plane::node(&control_plane.unique("node"), labels);
    let api = ApiOnlyNode::start(control_plane, &objects, node, gpu_taints());
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
