//! The repair condition a GPU's fault sets, and what Karpenter's own matcher decides on it
//! (testbed::cluster::karpenter); repair_engines.rs checks the runbook's table the same way.

use super::*;

const REPAIR: &str = "  repair_condition: AcceleratedHardwareReady\n";

/// With `readiness.repair_condition`, the agent also writes `AcceleratedHardwareReady`, the type
/// Karpenter's AWS RepairPolicies and EKS node auto repair act on, with their polarity: False while
/// the driver asks for a reset (the engine replaces the node after 10 minutes of it), True again
/// when it says NONE. It is written under the agent's field manager, and carries no memory trailer.
#[test]
fn the_repair_condition_hands_a_faulty_gpu_to_the_repair_engines() {
    let mut scenario = Scenario::new(2);
    let api = testbed::needs!(ApiOnlyNode::gpu(&["components/repair-condition"]));
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
/// (tests/programs/karpenter-repair), each on a node of its own: an XID that caused or came with a fault is
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
        let api = testbed::needs!(ApiOnlyNode::gpu(&["components/repair-condition"]));
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
            testbed::cluster::karpenter::decisions_for(&api.node(), "AcceleratedHardwareReady")
                .unwrap();
        let said: Vec<String> = decided
            .iter()
            .map(testbed::cluster::karpenter::said)
            .collect();
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
    let api = testbed::needs!(ApiOnlyNode::gpu(&["components/repair-condition"]));
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
        testbed::cluster::karpenter::decisions_for(&api.node(), "AcceleratedHardwareReady")
            .unwrap();
    assert_eq!(
        decided
            .iter()
            .map(testbed::cluster::karpenter::said)
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
    let node = testbed::needs!(testbed::cluster::api_only_node::ApiOnlyNode::gpu(&[
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
    testbed::wait_until("reset required", Duration::from_secs(30), || {
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
