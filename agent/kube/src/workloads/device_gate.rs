//! A pod's `mlnode.dev/AcceleratorHealthy` readiness gate: True while every accelerator it holds
//! is healthy, decided from the collectors' reports ([`mlnode_core::health`]) as the node's
//! `AcceleratorHealthy` is, but only from the problems pinned to the devices the pod holds. So on
//! an 8-GPU node one GPU's fault takes the one pod on it out of its Service's endpoints, and the
//! pods on the seven others keep serving, their conditions untouched.
//!
//! A verdict on the node that no device carries (a count mismatch, NVML not answering, a
//! collector not running) turns no pod's gate: the node's conditions, its taint and the repair
//! engines act on those, by eviction, which respects the pods' disruption budgets; turning every
//! pod's gate at once would take all of a node's replicas out of their Services together, past
//! those budgets, for a fault whose effect on any one pod is not known (docs/readiness.md).

use mlnode_core::health::{Held, PodRef, Problem, Report};

use super::gate::PodGate;
use crate::readiness::gates::{truncate, Status};

/// The condition type a pod lists in `spec.readinessGates` to leave its Service while an
/// accelerator it holds is at fault.
pub const ACCELERATOR_HEALTHY: &str = "mlnode.dev/AcceleratorHealthy";

/// The gate of `pod` from the accelerator collectors' latest reports (None: none taken yet, and
/// the pod's condition is left as it is).
pub fn decide(pod: &PodRef, reports: Option<&[Report]>) -> Option<PodGate> {
    let reports = reports?;
    let held: Vec<&Held> = reports
        .iter()
        .filter_map(|r| r.holdings.get(pod))
        .flatten()
        .collect();
    let subject = held
        .iter()
        .map(|h| h.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let gate = |status, reason: &str, message: String| PodGate {
        condition_type: ACCELERATOR_HEALTHY,
        subject: subject.clone(),
        status,
        reason: reason.to_string(),
        message: truncate(message),
    };
    if reports.is_empty() {
        return Some(gate(
            Status::Unknown,
            "NoAcceleratorMonitored",
            "no GPU or Neuron collector runs on this node: the agent cannot judge the pod's devices"
                .into(),
        ));
    }
    if held.is_empty() {
        return Some(gate(
            Status::Unknown,
            "DevicesNotResolved",
            "the kubelet's pod-resources API lists no GPU, MIG device, Neuron device or core for this pod: does it request one, and does the agent read the kubelet's pod-resources socket?".into(),
        ));
    }
    let at_fault: Vec<(&Held, &Problem)> = held
        .iter()
        .flat_map(|h| {
            reports
                .iter()
                .flat_map(|r| &r.problems)
                .filter(|p| p.concerns(&h.device))
                .map(move |p| (*h, p))
        })
        .collect();
    if let Some((_, first)) = at_fault.first() {
        let said: Vec<String> = at_fault.iter().map(|(h, p)| said(h, p)).collect();
        return Some(gate(Status::False, &first.reason, said.join("; ")));
    }
    let unlisted: Vec<&str> = held
        .iter()
        .filter(|h| !h.listed)
        .map(|h| h.name.as_str())
        .collect();
    if !unlisted.is_empty() {
        return Some(gate(
            Status::Unknown,
            "DeviceNotListed",
            format!("the pod holds {}: it cannot be judged", unlisted.join(", ")),
        ));
    }
    Some(gate(
        Status::True,
        "AcceleratorsHealthy",
        format!("{subject}: healthy"),
    ))
}

/// A problem as the pod's condition says it: the node condition's words, after the device the pod
/// holds where the problem names another (a MIG device's GPU, a core's device), with its XID where
/// the words do not name it.
fn said(held: &Held, problem: &Problem) -> String {
    let mut message = problem.message.clone();
    if !message.contains(&held.name) {
        message = format!("{}: {message}", held.name);
    }
    if let Some(cause) = problem.xid {
        if !message.contains(&format!("XID {}", cause.xid)) {
            message.push_str(&format!(" (XID {})", cause.xid));
        }
    }
    message
}

#[cfg(test)]
mod tests;
