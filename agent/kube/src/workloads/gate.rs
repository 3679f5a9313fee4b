//! A pod's readiness gates as plain data, and when one is written: the condition a pod lists in
//! its `readinessGates`, decided by [`decide`] for `mlnode.dev/ModelVerified` (here) or by
//! [`super::device_gate`] for `mlnode.dev/AcceleratorHealthy`. For the model gate, trust never
//! comes from the pod: its annotations only name which of the node's configured models (their
//! manifests and signers are the agent's config) it relies on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use serde_json::{json, Value};

use crate::models::{annotated_model, MODEL_ANNOTATION, REVISION_ANNOTATION};
use crate::readiness::gates::{truncate, Status};
use mlnode_core::state::Readiness;

/// The condition type a pod lists in `spec.readinessGates` to wait for its model.
pub const MODEL_VERIFIED: &str = "mlnode.dev/ModelVerified";
/// Every pod condition the agent writes has this prefix, and the admission policy lets it write
/// no other.
pub const CONDITION_PREFIX: &str = "mlnode.dev/";

/// Whether the pod waits for `condition_type`: it opts in through its own spec.
pub fn has_gate(pod: &Pod, condition_type: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.condition_type == condition_type))
}

/// The condition's content, without times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGate {
    pub condition_type: &'static str,
    /// What the gate is about, for the log: the model the pod names (empty when it names none),
    /// or the devices it holds.
    pub subject: String,
    pub status: Status,
    pub reason: String,
    pub message: String,
}

impl PodGate {
    pub fn ok(&self) -> bool {
        self.status == Status::True
    }
}

/// The gate of a pod that names its model by annotation, from the verdicts of the models
/// configured on this node (by name); None while its model's verdict is not concluded (a restarted
/// agent resuming a previous one's), when the pod's condition is left as it is.
pub fn decide(pod: &Pod, verdicts: &BTreeMap<String, Readiness>) -> Option<PodGate> {
    let model = annotated_model(pod).unwrap_or_default().to_string();
    let required = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION))
        .filter(|r| !r.is_empty());
    let gate = |ok, reason: &str, message: String| {
        Some(PodGate {
            condition_type: MODEL_VERIFIED,
            subject: model.clone(),
            status: Status::of(ok),
            reason: reason.to_string(),
            message: truncate(message),
        })
    };
    let configured = || verdicts.keys().cloned().collect::<Vec<_>>().join(", ");
    if model.is_empty() {
        return gate(
            false,
            "ModelNotNamed",
            format!("the pod names no model: annotate it {MODEL_ANNOTATION}: <name> (configured on this node: {})", configured()),
        );
    }
    match verdicts.get(&model) {
        None => gate(
            false,
            "ModelNotOnNode",
            format!(
                "model {model:?} is not configured on this node (configured: {})",
                configured()
            ),
        ),
        Some(Readiness::Resuming) => None,
        Some(Readiness::Starting) => gate(
            false,
            "VerificationInProgress",
            format!("model {model} is being verified"),
        ),
        Some(Readiness::Failed { reason }) => gate(
            false,
            "ModelNotVerified",
            format!("model {model}: {reason}"),
        ),
        Some(Readiness::Verified { revision }) => match required {
            Some(required) if !revision_matches(required, revision.as_deref()) => gate(
                false,
                "RevisionMismatch",
                format!(
                    "model {model} is verified at revision {}, the pod requires {required}",
                    revision
                        .as_deref()
                        .unwrap_or("(none: its manifest names no revision)")
                ),
            ),
            _ => gate(
                true,
                "ModelVerified",
                format!(
                    "model {model} verified (revision {})",
                    revision.as_deref().unwrap_or("not given")
                ),
            ),
        },
    }
}

/// The revision the pod requires is the verified one, or an abbreviation of its commit (seven or
/// more hex digits, as git abbreviates).
fn revision_matches(required: &str, verified: Option<&str>) -> bool {
    let Some(verified) = verified else {
        return false;
    };
    let abbreviated = required.len() >= 7
        && required.bytes().all(|b| b.is_ascii_hexdigit())
        && verified.len() > required.len()
        && verified.bytes().all(|b| b.is_ascii_hexdigit())
        && verified[..required.len()].eq_ignore_ascii_case(required);
    verified == required || abbreviated
}

/// The pod's `condition_type` condition as the API server has it now.
pub fn current<'a>(pod: &'a Pod, condition_type: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == condition_type)
}

/// Whether `gate` says something other than `current`.
pub fn differs(gate: &PodGate, current: Option<&PodCondition>) -> bool {
    current.is_none_or(|c| {
        c.status != gate.status.as_str()
            || c.reason.as_deref() != Some(gate.reason.as_str())
            || c.message.as_deref() != Some(gate.message.as_str())
    })
}

/// What the agent last wrote to one pod, and when.
#[derive(Clone, Debug)]
pub struct Written {
    pub gate: PodGate,
    pub at: Instant,
}

/// Whether the gate is written now: only when the pod does not show it (never to refresh it: a
/// pod's conditions carry no heartbeat, as the kubelet's own do not). Right after this agent wrote
/// that same gate, the pod is given `settle` to show it (the watch lags the write); still not
/// there then, the write was lost or overwritten, and it is written again. `settle` is None while
/// the pods' watch fails: the pod as last seen is stale, so what the agent wrote is taken as
/// shown until the watch says otherwise.
pub fn due(
    gate: &PodGate,
    current: Option<&PodCondition>,
    last: Option<&Written>,
    now: Instant,
    settle: Option<Duration>,
) -> bool {
    differs(gate, current)
        && last.is_none_or(|last| {
            last.gate != *gate || settle.is_some_and(|settle| now >= last.at + settle)
        })
}

/// The strategic-merge patch body for `pods/<name>/status`: only the agent's condition
/// (conditions merge on `type`, so the kubelet's are never touched). `lastTransitionTime` moves
/// only when the status flips; `lastProbeTime` is null, as in the kubelet's conditions (null
/// removes one an earlier version of the agent wrote).
pub fn condition_patch(gate: &PodGate, current: Option<&PodCondition>, now: &str) -> Value {
    let status = gate.status.as_str();
    let transition = current
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.as_ref())
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or_else(|| json!(now));
    json!({"status": {"conditions": [{
        "type": gate.condition_type,
        "status": status,
        "reason": gate.reason,
        "message": gate.message,
        "lastProbeTime": null,
        "lastTransitionTime": transition,
    }]}})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every verdict the tests give is concluded.
    fn decide(pod: &Pod, verdicts: &BTreeMap<String, Readiness>) -> PodGate {
        super::decide(pod, verdicts).expect("a concluded verdict decides")
    }

    const COMMIT: &str = "0e9e39f249a16976918f6564b8830bc894c89659";

    /// A pod spec with a readiness gate, as kubernetes.io/docs/concepts/workloads/pods/
    /// pod-lifecycle/#pod-readiness-gate shows it, and the kubelet's own conditions in its status.
    fn pod(annotations: serde_json::Value, gate: bool) -> Pod {
        let gates = if gate {
            json!([{"conditionType": MODEL_VERIFIED}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": "vllm-0", "namespace": "inference", "uid": "u1", "annotations": annotations},
            "spec": {"nodeName": "n", "readinessGates": gates, "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady", "message": "corresponding condition of pod readiness gate \"mlnode.dev/ModelVerified\" does not exist.", "lastProbeTime": null, "lastTransitionTime": "2026-12-01T10:00:00Z"},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-12-01T10:00:00Z"},
            ]},
        }))
        .unwrap()
    }

    fn verdicts(readiness: Readiness) -> BTreeMap<String, Readiness> {
        BTreeMap::from([
            ("llama".to_string(), readiness),
            (
                "mistral".to_string(),
                Readiness::Verified { revision: None },
            ),
        ])
    }

    fn verified() -> Readiness {
        Readiness::Verified {
            revision: Some(COMMIT.into()),
        }
    }

    #[test]
    fn only_a_pod_listing_the_gate_waits_for_it() {
        assert!(has_gate(&pod(json!({}), true), MODEL_VERIFIED));
        assert!(!has_gate(
            &pod(json!({"mlnode.dev/model": "llama"}), false),
            MODEL_VERIFIED
        ));
        assert!(!has_gate(
            &pod(json!({}), true),
            "mlnode.dev/AcceleratorHealthy"
        ));
    }

    #[test]
    fn each_reason_from_the_pods_model_and_its_verdict() {
        let decided = |annotations, readiness| {
            let gate = decide(&pod(annotations, true), &verdicts(readiness));
            (gate.status, gate.reason.clone(), gate.message)
        };
        let llama = json!({"mlnode.dev/model": "llama"});
        assert_eq!(
            decided(llama.clone(), verified()),
            (
                Status::True,
                "ModelVerified".to_string(),
                format!("model llama verified (revision {COMMIT})")
            )
        );
        assert_eq!(
            decided(llama.clone(), Readiness::Starting).1,
            "VerificationInProgress"
        );
        let failed = Readiness::Failed {
            reason: "model-00001-of-00004.safetensors digest_mismatch".into(),
        };
        assert_eq!(
            decided(llama.clone(), failed),
            (
                Status::False,
                "ModelNotVerified".to_string(),
                "model llama: model-00001-of-00004.safetensors digest_mismatch".into()
            )
        );
        let (status, reason, message) = decided(json!({"mlnode.dev/model": "qwen"}), verified());
        assert_eq!((status, reason.as_str()), (Status::False, "ModelNotOnNode"));
        assert!(message.contains("configured: llama, mistral"), "{message}");
        assert_eq!(decided(json!({}), verified()).1, "ModelNotNamed");
        assert_eq!(
            decided(json!({"mlnode.dev/model-name": "llama"}), verified()).1,
            "ModelVerified",
            "the startup tracker's earlier annotation names it too"
        );
    }

    #[test]
    fn a_required_revision_is_the_verified_commit_or_its_abbreviation() {
        let with = |revision: &str, readiness| {
            decide(
                &pod(
                    json!({"mlnode.dev/model": "llama", "mlnode.dev/model-revision": revision}),
                    true,
                ),
                &verdicts(readiness),
            )
            .reason
        };
        assert_eq!(with(COMMIT, verified()), "ModelVerified");
        assert_eq!(with("0e9e39f", verified()), "ModelVerified");
        assert_eq!(with("0E9E39F2", verified()), "ModelVerified");
        assert_eq!(
            with("0e9e39", verified()),
            "RevisionMismatch",
            "too short to abbreviate"
        );
        assert_eq!(with("1e9e39f", verified()), "RevisionMismatch");
        assert_eq!(with("main", verified()), "RevisionMismatch");
        assert_eq!(
            with(COMMIT, Readiness::Verified { revision: None }),
            "RevisionMismatch",
            "a manifest without a revision cannot satisfy one"
        );
        assert_eq!(
            with("", verified()),
            "ModelVerified",
            "empty: none required"
        );
    }

    #[test]
    fn written_only_where_the_pod_does_not_show_it_never_to_refresh_it() {
        let t0 = Instant::now();
        let settle = Duration::from_secs(10);
        let pod = pod(json!({"mlnode.dev/model": "llama"}), true);
        let gate = decide(&pod, &verdicts(verified()));
        let shown = |gate: &PodGate| -> PodCondition {
            serde_json::from_value(
                condition_patch(gate, None, "2026-12-01T10:00:01Z")["status"]["conditions"][0]
                    .clone(),
            )
            .unwrap()
        };
        let due_at = |current: Option<&PodCondition>, last: Option<&Written>, after: Duration| {
            due(&gate, current, last, t0 + after, Some(settle))
        };
        let now_shown = shown(&gate);
        assert!(due_at(None, None, Duration::ZERO), "never written");
        assert!(
            !due_at(Some(&now_shown), None, Duration::ZERO),
            "a restarted agent: the pod already shows it"
        );
        let last = Written {
            gate: gate.clone(),
            at: t0,
        };
        for after in [1, 300, 3600, 86_400] {
            assert!(
                !due_at(Some(&now_shown), Some(&last), Duration::from_secs(after)),
                "shown: no write {after} s later"
            );
        }
        assert!(
            !due_at(None, Some(&last), Duration::from_secs(1)),
            "the watch has not caught up yet"
        );
        assert!(
            due_at(None, Some(&last), settle),
            "still not there: lost or overwritten"
        );
        assert!(
            !due(&gate, None, Some(&last), t0 + 10 * settle, None),
            "the pods' watch fails: the pod as last seen says nothing about the write"
        );
        assert!(
            due(&gate, None, None, t0, None),
            "never written: written whether or not the watch works"
        );
        let changed = Written {
            gate: decide(&pod, &verdicts(Readiness::Starting)),
            at: t0,
        };
        assert!(
            due_at(
                Some(&shown(&changed.gate)),
                Some(&changed),
                Duration::from_secs(1)
            ),
            "a new verdict: at once"
        );
    }

    #[test]
    fn the_patch_carries_only_the_agents_condition_and_keeps_the_transition_time() {
        let gate = decide(
            &pod(json!({"mlnode.dev/model": "llama"}), true),
            &verdicts(verified()),
        );
        let first = condition_patch(&gate, None, "2026-12-01T10:00:01Z");
        let conditions = first["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(first.as_object().unwrap().len(), 1, "nothing but status");
        assert_eq!(conditions[0]["type"], MODEL_VERIFIED);
        assert_eq!(conditions[0]["lastTransitionTime"], "2026-12-01T10:00:01Z");
        let shown: PodCondition = serde_json::from_value(conditions[0].clone()).unwrap();
        let again = condition_patch(&gate, Some(&shown), "2026-12-01T10:05:01Z");
        assert_eq!(
            again["status"]["conditions"][0]["lastTransitionTime"],
            "2026-12-01T10:00:01Z"
        );
        assert_eq!(
            again["status"]["conditions"][0]["lastProbeTime"],
            Value::Null
        );
        assert!(!differs(&gate, Some(&shown)));
    }
}
