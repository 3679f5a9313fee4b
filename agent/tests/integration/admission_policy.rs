//! The ValidatingAdmissionPolicies in deploy/daemonset, evaluated with a CEL engine over a table of
//! admission requests shaped as the API server builds them: the agent's own condition, taint and
//! `models.mlnode.dev/` label changes pass; another node, a kubelet condition, a foreign taint or
//! label, capacity and cordoning are denied; on pods, only the `mlnode.dev/` conditions of its own
//! node's pods pass; requests from anyone else are not the policies' business.

use crate::common;

use std::path::Path;

use serde_json::{json, Value};

const AGENT: &str = "system:serviceaccount:mlnode-system:mlnode-agent";
const NODE: &str = "ip-10-0-1-23.us-east-2.compute.internal";

/// The policy named `name` in the base file.
fn policy_named(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/daemonset/base/validating-admission-policy.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no policy {name}"))
}

fn policy() -> Value {
    policy_named("mlnode-agent-own-node")
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"providerID": "aws:///us-east-2a/i-0123", "podCIDRs": ["10.1.0.0/24"], "taints": [
            {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "192", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "191450m", "nvidia.com/gpu": "8"},
            "addresses": [{"type": "InternalIP", "address": "10.0.1.23"}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "ModelCacheVerified", "status": "False", "reason": "VerificationInProgress"}]
        }
    })
}

fn request(user: &str, claim: Option<&str>, sub_resource: &str) -> Value {
    let extra = match claim {
        Some(node) => {
            json!({"authentication.kubernetes.io/node-name": [node], "authentication.kubernetes.io/pod-name": ["mlnode-agent-x7k2p"]})
        }
        None => json!({}),
    };
    json!({"operation": "UPDATE", "subResource": sub_resource, "userInfo": {"username": user, "extra": extra}})
}

fn admit(request: Value, old: &Value, new: &Value) -> Result<(), String> {
    common::admission::admit(&policy(), request, old, new)
}

fn with_own_condition(mut node: Value, status: &str) -> Value {
    node["status"]["conditions"][1] =
        json!({"type": "ModelCacheVerified", "status": status, "reason": "AllModelCachesVerified"});
    node
}

#[test]
fn the_agent_may_write_its_own_conditions_on_its_own_node() {
    let old = node();
    assert_eq!(
        admit(
            request(AGENT, Some(NODE), "status"),
            &old,
            &with_own_condition(node(), "True")
        ),
        Ok(())
    );
    let mut added = node();
    added["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "AcceleratorHealthy", "status": "True"}));
    assert_eq!(
        admit(request(AGENT, Some(NODE), "status"), &old, &added),
        Ok(())
    );
}

#[test]
fn another_node_or_no_node_claim_is_denied() {
    let old = node();
    let new = with_own_condition(node(), "True");
    let denied = admit(
        request(
            AGENT,
            Some("ip-10-0-9-99.us-east-2.compute.internal"),
            "status",
        ),
        &old,
        &new,
    );
    assert!(denied.unwrap_err().contains("only the node it runs on"));
    assert!(
        admit(request(AGENT, None, "status"), &old, &new).is_err(),
        "a token without the node claim (Kubernetes < 1.32)"
    );
}

#[test]
fn a_kubelet_condition_or_capacity_is_not_the_agents_to_change() {
    let old = node();
    let mut ready = node();
    ready["status"]["conditions"][0]["status"] = json!("False");
    assert!(admit(request(AGENT, Some(NODE), "status"), &old, &ready)
        .unwrap_err()
        .contains("own condition types"));
    let mut removed = node();
    removed["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    assert!(admit(request(AGENT, Some(NODE), "status"), &old, &removed).is_err());
    let mut gpus = node();
    gpus["status"]["capacity"]["nvidia.com/gpu"] = json!("16");
    assert!(admit(request(AGENT, Some(NODE), "status"), &old, &gpus)
        .unwrap_err()
        .contains("capacity"));
}

#[test]
fn only_the_agents_own_taint_may_change() {
    let old = node();
    let mut ours_removed = node();
    ours_removed["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    assert_eq!(
        admit(request(AGENT, Some(NODE), ""), &old, &ours_removed),
        Ok(())
    );
    let mut foreign_removed = node();
    foreign_removed["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    assert!(
        admit(request(AGENT, Some(NODE), ""), &old, &foreign_removed)
            .unwrap_err()
            .contains("only its own taint")
    );
    let mut foreign_added = node();
    foreign_added["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "example.com/evict", "effect": "NoExecute"}));
    assert!(admit(request(AGENT, Some(NODE), ""), &old, &foreign_added).is_err());
}

#[test]
fn only_the_agents_model_labels_may_change() {
    let old = node();
    let mut ours = node();
    ours["metadata"]["labels"]["models.mlnode.dev/llama-3.1-8b"] =
        json!("0e9e39f249a16976918f6564b8830bc894c89659");
    assert_eq!(admit(request(AGENT, Some(NODE), ""), &old, &ours), Ok(()));
    assert_eq!(
        admit(request(AGENT, Some(NODE), ""), &ours, &old),
        Ok(()),
        "and removed"
    );
    let mut label = node();
    label["metadata"]["labels"]["nvidia.com/gpu.present"] = json!("false");
    assert!(admit(request(AGENT, Some(NODE), ""), &old, &label)
        .unwrap_err()
        .contains("own node labels"));
    let mut removed = node();
    removed["metadata"]["labels"] = json!({});
    assert!(admit(request(AGENT, Some(NODE), ""), &old, &removed).is_err());
    let mut changed = node();
    changed["metadata"]["labels"]["kubernetes.io/hostname"] = json!("other");
    assert!(admit(request(AGENT, Some(NODE), ""), &old, &changed).is_err());
}

#[test]
fn annotations_and_cordoning_are_denied() {
    let old = node();
    let mut annotated = node();
    annotated["metadata"]["annotations"]["example.com/x"] = json!("1");
    assert!(admit(request(AGENT, Some(NODE), ""), &old, &annotated)
        .unwrap_err()
        .contains("annotations"));
    let mut cordon = node();
    cordon["spec"]["unschedulable"] = json!(true);
    assert!(admit(request(AGENT, Some(NODE), ""), &old, &cordon)
        .unwrap_err()
        .contains("cordon"));
}

#[test]
fn requests_from_anyone_else_are_not_this_policys_business() {
    let old = node();
    let mut ready = node();
    ready["status"]["conditions"][0]["status"] = json!("False");
    assert_eq!(
        admit(
            request(
                "system:node:ip-10-0-1-23.us-east-2.compute.internal",
                None,
                "status"
            ),
            &old,
            &ready
        ),
        Ok(())
    );
}

/// components/repair-condition lets the agent write `AcceleratedHardwareReady` too, and sets the
/// setting that makes it; without the component the policy denies that type, and the kubelet's
/// conditions stay denied either way.
#[test]
fn the_repair_condition_component_allows_exactly_that_type_more() {
    let objects = common::kustomize::render_with("overlays/gpu", &["components/repair-condition"])
        .unwrap_or_else(|reason| panic!("kustomize (kubectl) is needed: {reason}"));
    let with_component = common::kustomize::find(
        &objects,
        "ValidatingAdmissionPolicy",
        "mlnode-agent-own-node",
    );
    let old = node();
    let mut repair = node();
    repair["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "AcceleratedHardwareReady", "status": "False", "reason": "GPUResetRequired"}));
    let status = || request(AGENT, Some(NODE), "status");
    assert_eq!(
        common::admission::admit(with_component, status(), &old, &repair),
        Ok(())
    );
    assert!(admit(status(), &old, &repair)
        .unwrap_err()
        .contains("own condition types"));
    let mut ready = node();
    ready["status"]["conditions"][0]["status"] = json!("False");
    assert!(common::admission::admit(with_component, status(), &old, &ready).is_err());

    let ds = common::kustomize::daemonset(&objects);
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(env.contains(
        &json!({"name": "MLNODE_READINESS__REPAIR_CONDITION", "value": "AcceleratedHardwareReady"})
    ));
}

/// A vLLM pod on `node`, as the API server stores it (common::pods), with the readiness gate.
fn gated_pod(node: &str) -> Value {
    common::pods::gated_vllm_pod("u1", "vllm-0", node, "/var/lib/models", json!({}))
}

fn with_pod_condition(mut pod: Value, condition: Value) -> Value {
    pod["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(condition);
    pod
}

fn admit_pod(claim: Option<&str>, old: &Value, new: &Value) -> Result<(), String> {
    let policy = policy_named("mlnode-agent-own-pods");
    assert!(common::admission::matches(&policy, "UPDATE", "pods/status"));
    common::admission::admit(&policy, request(AGENT, claim, "status"), old, new)
}

#[test]
fn the_agent_may_write_its_own_condition_on_its_own_nodes_pods_only() {
    let verified = json!({"type": "mlnode.dev/ModelVerified", "status": "True", "reason": "ModelVerified", "message": "model llama verified"});
    let old = gated_pod(NODE);
    let new = with_pod_condition(old.clone(), verified.clone());
    assert_eq!(admit_pod(Some(NODE), &old, &new), Ok(()));
    let other = "ip-10-0-9-99.us-east-2.compute.internal";
    assert!(admit_pod(Some(other), &old, &new)
        .unwrap_err()
        .contains("pods bound to the node it runs on"));
    let old_there = gated_pod(other);
    let new_there = with_pod_condition(old_there.clone(), verified);
    assert!(
        admit_pod(Some(NODE), &old_there, &new_there).is_err(),
        "another node's pod"
    );
    assert!(admit_pod(None, &old, &new).is_err(), "no node claim");
}

#[test]
fn a_pods_other_conditions_and_status_are_not_the_agents_to_change() {
    let old = gated_pod(NODE);
    let mut ready = old.clone();
    for condition in ready["status"]["conditions"].as_array_mut().unwrap() {
        if condition["type"] == "Ready" {
            condition["status"] = json!("True");
        }
    }
    assert!(admit_pod(Some(NODE), &old, &ready)
        .unwrap_err()
        .contains("own pod condition types"));
    let foreign = with_pod_condition(
        old.clone(),
        json!({"type": "example.com/Other", "status": "True"}),
    );
    assert!(
        admit_pod(Some(NODE), &old, &foreign).is_err(),
        "a foreign condition type"
    );
    let mut phase = old.clone();
    phase["status"]["phase"] = json!("Failed");
    assert!(admit_pod(Some(NODE), &old, &phase)
        .unwrap_err()
        .contains("phase"));
    let mut restarted = old.clone();
    restarted["status"]["containerStatuses"][0]["restartCount"] = json!(3);
    assert!(admit_pod(Some(NODE), &old, &restarted)
        .unwrap_err()
        .contains("container statuses"));
    let mut labelled = old.clone();
    labelled["metadata"]["labels"]["app"] = json!("other");
    assert!(admit_pod(Some(NODE), &old, &labelled)
        .unwrap_err()
        .contains("labels"));
}

/// deploy/examples/vllm-with-model-gate.yaml's pod, bound to the agent's node: the condition the
/// agent writes on it (the agent's own patch body, merged on `type`) is admitted.
#[test]
fn the_agents_write_on_the_example_pod_is_admitted() {
    let old = common::pods::gated_example_pod("e1", "vllm-llama-3-1-8b-7d9f8c6b5-x2k4p", NODE);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(old.clone()).unwrap();
    let verdicts = std::collections::BTreeMap::from([(
        "llama-3.1-8b".to_string(),
        mlnode_agent::cache::state::Readiness::Verified {
            revision: Some("0e9e39f249a16976918f6564b8830bc894c89659".into()),
        },
    )]);
    let gate = mlnode_agent::workloads::gate::decide(&pod, &verdicts).unwrap();
    assert!(gate.ok(), "{gate:?}");
    let patch = mlnode_agent::workloads::gate::condition_patch(&gate, None, "2026-12-01T10:00:00Z");
    let new = with_pod_condition(old.clone(), patch["status"]["conditions"][0].clone());
    assert_eq!(admit_pod(Some(NODE), &old, &new), Ok(()));
}
