//! The exact requests the gates turn into, as plain JSON: a strategic-merge patch of `nodes/status`
//! that carries only the agent's own condition types (conditions merge on `type`, so kubelet's are
//! never touched), and a JSON patch of `/spec/taints` guarded by a `test` of the list it read
//! (taints are an atomic list: a blind write would drop a taint another controller just added).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use serde_json::{json, Value};

use super::gates::Gate;
use super::settings::TaintSpec;

/// The name the API server records the agent's writes under (`fieldManager`).
pub const FIELD_MANAGER: &str = "mlnode-agent";

/// The API's form of the configured taint.
pub fn taint(spec: &TaintSpec) -> Taint {
    Taint {
        key: spec.key.clone(),
        value: spec.value.clone(),
        effect: spec.effect.as_str().into(),
        time_added: None,
    }
}

/// Whether `node` has `taint` (by key and effect) now.
pub fn has_taint(node: &Node, taint: &Taint) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|list| list.iter().any(|t| same_taint(t, taint)))
}

/// Taints are identified by key and effect (a value change is the same taint).
fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// The agent's own conditions as the node has them now, by type.
pub fn own_conditions(node: &Node, types: &[&str]) -> BTreeMap<String, NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| types.contains(&c.type_.as_str()))
        .map(|c| (c.type_.clone(), c.clone()))
        .collect()
}

/// Another writer of condition `condition_type`, if the node's managed fields name one: the API
/// server records, per field manager, the fields its writes set (a condition is the key
/// `k:{"type":"<type>"}` under `f:status` / `f:conditions`), and moves a field to the manager that
/// last changed it. The agent writes as [`FIELD_MANAGER`]; eks-node-monitoring-agent's writes are
/// recorded under its own name (the API server takes it from the user agent).
pub fn other_writer(node: &Node, condition_type: &str) -> Option<String> {
    let key = format!("k:{}", json!({ "type": condition_type }));
    node.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.manager.as_deref() != Some(FIELD_MANAGER))
        .find(|entry| {
            entry
                .fields_v1
                .as_ref()
                .and_then(|fields| fields.0.pointer("/f:status/f:conditions"))
                .and_then(Value::as_object)
                .is_some_and(|conditions| conditions.contains_key(&key))
        })
        .map(|entry| {
            entry
                .manager
                .clone()
                .unwrap_or_else(|| "an unnamed manager".into())
        })
}

/// Whether `gate` says something other than the node's current condition of its type.
pub fn differs(gate: &Gate, current: Option<&NodeCondition>) -> bool {
    current.is_none_or(|c| {
        c.status != gate.status.as_str()
            || c.reason.as_deref() != Some(gate.reason.as_str())
            || c.message.as_deref() != Some(gate.message.as_str())
    })
}

/// Whether the node's condition changes status or reason with `gate`, not only its message: what
/// earns an Event. A message alone changes at every restart that resumes a verdict and with each
/// model's revision; the condition says those, and an Event each would be a write per node per
/// rollout for nothing.
pub fn transitions(gate: &Gate, current: Option<&NodeCondition>) -> bool {
    current.is_none_or(|c| {
        c.status != gate.status.as_str() || c.reason.as_deref() != Some(gate.reason.as_str())
    })
}

/// The strategic-merge patch body for `nodes/<name>/status`. `lastTransitionTime` moves only when
/// the status flips; `lastHeartbeatTime` is `now`.
pub fn conditions_patch(
    gates: &[Gate],
    current: &BTreeMap<String, NodeCondition>,
    now: &str,
) -> Value {
    let conditions: Vec<Value> = gates
        .iter()
        .map(|gate| {
            let status = gate.status.as_str();
            let transition = current
                .get(gate.condition_type)
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.as_ref())
                .and_then(|t| serde_json::to_value(t).ok())
                .unwrap_or_else(|| json!(now));
            json!({
                "type": gate.condition_type,
                "status": status,
                "reason": gate.reason,
                "message": gate.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": transition,
            })
        })
        .collect();
    json!({ "status": { "conditions": conditions } })
}

/// The JSON patch that makes `taint` present (or absent) on `node`, or None when it already is.
pub fn taint_patch(node: &Node, taint: &Taint, present: bool) -> Option<Value> {
    if has_taint(node, taint) == present {
        return None;
    }
    let current = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    let Some(list) = current else {
        // No taint list yet: nothing to test it against, so the node's resourceVersion guards the add.
        let version = node.metadata.resource_version.clone().unwrap_or_default();
        return Some(json!([
            { "op": "test", "path": "/metadata/resourceVersion", "value": version },
            { "op": "add", "path": "/spec/taints", "value": [taint] },
        ]));
    };
    let mut wanted: Vec<Taint> = list
        .iter()
        .filter(|t| !same_taint(t, taint))
        .cloned()
        .collect();
    if present {
        wanted.push(taint.clone());
    }
    Some(json!([
        { "op": "test", "path": "/spec/taints", "value": list },
        { "op": "replace", "path": "/spec/taints", "value": wanted },
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: Option<Value>) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "resourceVersion": "42"},
            "spec": taints.map(|t| json!({"taints": t})).unwrap_or(json!({})),
        }))
        .unwrap()
    }

    fn parse_taint(text: &str) -> Result<Taint, String> {
        text.parse::<TaintSpec>().map(|spec| taint(&spec))
    }

    #[test]
    fn taint_syntax() {
        let t = parse_taint("mlnode.dev/not-ready:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("mlnode.dev/not-ready", None, "NoSchedule")
        );
        assert_eq!(
            parse_taint("a=b:NoExecute").unwrap().value.as_deref(),
            Some("b")
        );
        assert!(parse_taint("no-effect").is_err());
        assert!(parse_taint("k:Sometimes").is_err());
        assert!(parse_taint(":NoSchedule").is_err());
        let spec: TaintSpec = "a=b:NoExecute".parse().unwrap();
        assert_eq!(spec.to_string(), "a=b:NoExecute", "the text round-trips");
    }

    #[test]
    fn removing_our_taint_keeps_the_others_and_tests_the_list_read() {
        let ours = parse_taint("mlnode.dev/not-ready:NoSchedule").unwrap();
        let taints = json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"},
        ]);
        let patch = taint_patch(&node(Some(taints.clone())), &ours, false).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/spec/taints", "value": taints},
                {"op": "replace", "path": "/spec/taints", "value": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            ])
        );
        assert_eq!(
            taint_patch(&node(Some(json!([]))), &ours, false),
            None,
            "already absent"
        );
        let add = taint_patch(&node(None), &ours, true).unwrap();
        assert_eq!(
            add[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
    }

    #[test]
    fn an_event_is_earned_by_a_new_status_or_reason_not_a_new_message() {
        let gate = |status: bool, reason: &str, message: &str| Gate {
            condition_type: "ModelCacheVerified",
            status: crate::readiness::gates::Status::of(status),
            reason: reason.into(),
            message: message.into(),
        };
        let shown: NodeCondition = serde_json::from_value(json!({"type": "ModelCacheVerified",
            "status": "True", "reason": "AllModelCachesVerified", "message": "1 model cache(s) verified"}))
        .unwrap();
        let resumed = gate(
            true,
            "AllModelCachesVerified",
            "1 model cache(s) verified; unchanged since a previous agent of this boot hashed them",
        );
        assert!(differs(&resumed, Some(&shown)), "written");
        assert!(!transitions(&resumed, Some(&shown)), "but no Event");
        assert!(transitions(
            &gate(false, "AllModelCachesVerified", "x"),
            Some(&shown)
        ));
        assert!(transitions(
            &gate(true, "Other", "1 model cache(s) verified"),
            Some(&shown)
        ));
        assert!(transitions(&resumed, None), "a first write is a transition");
    }

    #[test]
    fn transition_time_moves_only_on_a_flip() {
        let gate = |ok| Gate {
            condition_type: "ModelCacheVerified",
            status: crate::readiness::gates::Status::of(ok),
            reason: "R".into(),
            message: "m".into(),
        };
        let current: Node = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"conditions": [
            {"type": "ModelCacheVerified", "status": "True", "reason": "R", "message": "m",
             "lastHeartbeatTime": "2026-11-30T00:00:00Z", "lastTransitionTime": "2026-11-29T00:00:00Z"},
            {"type": "Ready", "status": "True"}]}}))
        .unwrap();
        let own = own_conditions(&current, &["ModelCacheVerified", "AcceleratorHealthy"]);
        assert_eq!(own.len(), 1, "kubelet's conditions are not ours");
        let same = conditions_patch(&[gate(true)], &own, "2026-11-30T01:00:00Z");
        assert_eq!(
            same["status"]["conditions"][0]["lastTransitionTime"],
            "2026-11-29T00:00:00Z"
        );
        assert_eq!(
            same["status"]["conditions"][0]["lastHeartbeatTime"],
            "2026-11-30T01:00:00Z"
        );
        let flipped = conditions_patch(&[gate(false)], &own, "2026-11-30T01:00:00Z");
        assert_eq!(
            flipped["status"]["conditions"][0]["lastTransitionTime"],
            "2026-11-30T01:00:00Z"
        );
        assert!(!differs(&gate(true), own.get("ModelCacheVerified")));
        assert!(differs(&gate(false), own.get("ModelCacheVerified")));
    }

    /// Managed fields as the API server returns them (kubernetes.io/docs/reference/using-api/
    /// server-side-apply, "Field management"): a condition another manager changed last is its.
    #[test]
    fn another_writer_is_found_in_the_managed_fields() {
        let node = |manager: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n", "managedFields": [
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-30T03:50:00Z",
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}}}}},
                {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-11-30T03:55:00Z",
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"AcceleratedHardwareReady\"}": {".": {}, "f:status": {}, "f:reason": {}}}}}},
            ]}}))
            .unwrap()
        };
        assert_eq!(
            other_writer(
                &node("eks-node-monitoring-agent"),
                "AcceleratedHardwareReady"
            )
            .as_deref(),
            Some("eks-node-monitoring-agent")
        );
        assert_eq!(
            other_writer(&node(FIELD_MANAGER), "AcceleratedHardwareReady"),
            None
        );
        assert_eq!(
            other_writer(&node("eks-node-monitoring-agent"), "AcceleratorHealthy"),
            None
        );
    }
}
