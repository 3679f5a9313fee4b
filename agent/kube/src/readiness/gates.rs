//! The gates, as plain data decided from what the agent knows. Positive polarity: True is good, so
//! a node-readiness-controller rule (`requiredStatus: True`) or an alert uses them as they are.

use mlnode_core::health::{DeviceKind, Report, XidCause};
use mlnode_core::state::{Readiness, VerifiedBy};

pub const MODEL_CACHE_VERIFIED: &str = "ModelCacheVerified";
pub const ACCELERATOR_HEALTHY: &str = "AcceleratorHealthy";
pub const FABRIC_HEALTHY: &str = "FabricHealthy";
/// The condition eks-node-monitoring-agent writes for the node's networking, which Karpenter's
/// node repair and EKS node auto repair act on (False for 30 minutes: replace).
pub const NETWORKING_READY: &str = "NetworkingReady";

/// A condition's status. Unknown, as Kubernetes means it: the agent cannot tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn of(ok: bool) -> Status {
        if ok {
            Status::True
        } else {
            Status::False
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A node condition's content, without times (the controller adds those).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    pub condition_type: &'static str,
    pub status: Status,
    /// CamelCase, as Kubernetes reasons are.
    pub reason: String,
    /// Short: what failed and where.
    pub message: String,
}

impl Gate {
    pub fn ok(&self) -> bool {
        self.status == Status::True
    }
}

/// Kubernetes caps a condition message at 32 KiB; kubectl shows one line. Keep it readable.
const MESSAGE_LIMIT: usize = 1000;

pub(crate) fn truncate(mut message: String) -> String {
    if message.len() > MESSAGE_LIMIT {
        let cut = (0..=MESSAGE_LIMIT)
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0);
        message.truncate(cut);
        message.push_str(" ...");
    }
    message
}

/// What the model gate reads of one model.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub name: String,
    pub readiness: Readiness,
    /// Its files are watched: a verdict is kept current, not only as fresh as the last rescan.
    pub watched: bool,
    /// How its verdict of verified came about.
    pub verified_by: VerifiedBy,
}

/// `ModelCacheVerified`: every configured model verified. A model whose files cannot be watched
/// does not hold the node (its last verdict stands), but the message says it is not continuously
/// verified; one taken over from a previous agent of this boot says since when it is unchanged.
/// `memory` is what the message must carry for a restarted agent (`memory::records_trailer`): kept
/// whole, after the readable part. None while a restarted agent is resuming a model's verdict:
/// the node's condition is left as it is until then.
pub fn model_cache_gate(models: &[ModelFacts], memory: &str) -> Option<Gate> {
    let mut failing = Vec::new();
    let mut starting = Vec::new();
    let mut unchanged = Vec::new();
    for ModelFacts {
        name,
        readiness,
        verified_by,
        ..
    } in models
    {
        match readiness {
            Readiness::Resuming => return None,
            Readiness::Verified { .. } => {
                if let VerifiedBy::UnchangedSince(at) = verified_by {
                    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(*at);
                    unchanged.push(format!(
                        "{name} since {}",
                        humantime::format_rfc3339_seconds(at)
                    ));
                }
            }
            Readiness::Starting => starting.push(name.clone()),
            Readiness::Failed { reason } => failing.push(format!("{name}: {reason}")),
        }
    }
    let (ok, reason, message) = if !failing.is_empty() {
        (false, "ModelCacheNotVerified", failing.join("; "))
    } else if !starting.is_empty() {
        (
            false,
            "VerificationInProgress",
            format!("verifying {}", starting.join(", ")),
        )
    } else if models.is_empty() {
        (
            true,
            "NoModelsConfigured",
            "no model caches are configured on this node".to_string(),
        )
    } else {
        (
            true,
            "AllModelCachesVerified",
            format!("{} model cache(s) verified", models.len()),
        )
    };
    let unwatched: Vec<&str> = models
        .iter()
        .filter(|m| !m.watched)
        .map(|m| m.name.as_str())
        .collect();
    let message = if unwatched.is_empty() {
        message
    } else {
        format!(
            "{message}; not continuously verified (their files cannot be watched, so changes are only found by rescans): {}",
            unwatched.join(", ")
        )
    };
    let message = if unchanged.is_empty() || !ok {
        message
    } else {
        format!(
            "{message}; unchanged since a previous agent of this boot hashed them: {}",
            unchanged.join(", ")
        )
    };
    Some(Gate {
        condition_type: MODEL_CACHE_VERIFIED,
        status: Status::of(ok),
        reason: reason.into(),
        message: truncate(message) + memory,
    })
}

/// `AcceleratorHealthy` from every accelerator collector's report ([`mlnode_core::health`]): each
/// required collector running and no device problem. The first problem's reason is the
/// condition's; every message is kept. `memory` is what the message must carry for a restarted
/// agent (`memory::trailer`): kept whole, after the readable part.
pub fn accelerator_gate(missing_collectors: &[String], reports: &[Report], memory: &str) -> Gate {
    let problems: Vec<(&str, &str)> = missing_collectors
        .iter()
        .map(|why| ("CollectorUnavailable", why.as_str()))
        .chain(
            accelerators(reports)
                .flat_map(|r| &r.problems)
                .map(|p| (p.reason.as_str(), p.message.as_str())),
        )
        .collect();
    let count = |kind| -> usize {
        reports
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.devices)
            .sum()
    };
    let (gpus, neuron_devices) = (count(DeviceKind::Gpu), count(DeviceKind::Neuron));
    let gate = |ok, reason: &str, message: String| Gate {
        condition_type: ACCELERATOR_HEALTHY,
        status: Status::of(ok),
        reason: reason.into(),
        message: truncate(message) + memory,
    };
    match problems.first() {
        Some((reason, _)) => gate(
            false,
            reason,
            problems
                .iter()
                .map(|(_, m)| *m)
                .collect::<Vec<_>>()
                .join("; "),
        ),
        None if gpus + neuron_devices == 0 => gate(
            true,
            "NoAcceleratorsMonitored",
            "no GPU or Neuron device is monitored on this node".into(),
        ),
        None => gate(
            true,
            "AcceleratorsHealthy",
            format!("{gpus} GPU(s), {neuron_devices} Neuron device(s) healthy"),
        ),
    }
}

/// The reports on accelerators: the fabric has its own condition.
fn accelerators(reports: &[Report]) -> impl Iterator<Item = &Report> {
    reports.iter().filter(|r| r.kind != DeviceKind::Fabric)
}

/// `FabricHealthy` from the RDMA collector's report, when it runs: no device or port problem. None
/// on a node without one: no condition rather than a True about nothing.
pub fn fabric_gate(reports: &[Report]) -> Option<Gate> {
    let fabric: Vec<&Report> = reports
        .iter()
        .filter(|r| r.kind == DeviceKind::Fabric)
        .collect();
    if fabric.is_empty() {
        return None;
    }
    let problems: Vec<_> = fabric.iter().flat_map(|r| &r.problems).collect();
    let devices: usize = fabric.iter().map(|r| r.devices).sum();
    let (ok, reason, message) = match problems.first() {
        Some(first) => (
            false,
            first.reason.clone(),
            problems
                .iter()
                .map(|p| p.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
        None => (
            true,
            "FabricHealthy".to_string(),
            format!("{devices} RDMA device(s), every port active"),
        ),
    };
    Some(Gate {
        condition_type: FABRIC_HEALTHY,
        status: Status::of(ok),
        reason,
        message: truncate(message),
    })
}

/// `NetworkingReady` with `readiness.repair_condition`: `FabricHealthy` under the repair engines'
/// name, where the fabric is judged.
pub fn networking_gate(reports: &[Report]) -> Option<Gate> {
    fabric_gate(reports).map(|gate| Gate {
        condition_type: NETWORKING_READY,
        ..gate
    })
}

/// The condition a node-repair engine acts on (`readiness.repair_condition`), with its polarity:
/// True while the accelerators are healthy, False while a device is at fault (the engine replaces
/// or reboots the node once it has been False long enough), Unknown while the only trouble is a
/// required collector that is not running: a fault of the agent's install, which replacing the node
/// would not mend. The message is `AcceleratorHealthy`'s, without what the agent remembers; the
/// reason too, unless an XID caused or came with a fault: then it names the XID as
/// eks-node-monitoring-agent does ([`xid_reason`]), which is what the engines decide by.
pub fn repair_gate(
    condition_type: &'static str,
    missing_collectors: &[String],
    reports: &[Report],
) -> Gate {
    let health = accelerator_gate(missing_collectors, reports, "");
    let device_fault = accelerators(reports).any(|r| !r.problems.is_empty());
    let status = match health.status {
        Status::True => Status::True,
        _ if device_fault => Status::False,
        _ => Status::Unknown,
    };
    let causes = || {
        accelerators(reports)
            .flat_map(|r| &r.problems)
            .filter_map(|p| p.xid)
    };
    // An XID that holds a GPU by itself speaks before one that only repeated past its threshold.
    let cause = causes().find(|c| !c.repeated).or_else(|| causes().next());
    let reason = match cause {
        Some(cause) if status == Status::False => xid_reason(cause),
        _ => health.reason,
    };
    Gate {
        condition_type,
        status,
        reason,
        ..health
    }
}

/// eks-node-monitoring-agent's reason for a GPU XID, `NvidiaXID[Code]Error` (the EKS user guide,
/// "Detect node health issues with the EKS node monitoring agent", NVIDIA XID error codes), which
/// Karpenter's AWS provider matches with `.*XID(…).*` (`RepairPolicies()`, aws/karpenter-provider-aws
/// v1.15.0 `pkg/cloudprovider/cloudprovider.go`). A repeat past `readiness.xid_thresholds` adds
/// `Repeated`, so that a single XID 13, which holds nothing, is not what `kubectl describe node` seems
/// to say; the engines still find the number.
pub fn xid_reason(cause: XidCause) -> String {
    let repeated = if cause.repeated { "Repeated" } else { "" };
    format!("NvidiaXID{}Error{repeated}", cause.xid)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn model(name: &str, readiness: Readiness) -> ModelFacts {
        ModelFacts {
            name: name.into(),
            readiness,
            watched: true,
            verified_by: VerifiedBy::Hash,
        }
    }

    #[test]
    fn model_gate_names_the_failing_models() {
        let models = vec![
            model("llama", Readiness::Verified { revision: None }),
            model(
                "mistral",
                Readiness::Failed {
                    reason: "model.safetensors digest_mismatch".into(),
                },
            ),
        ];
        let gate = model_cache_gate(&models, "").unwrap();
        assert!(!gate.ok());
        assert_eq!(gate.reason, "ModelCacheNotVerified");
        assert_eq!(gate.message, "mistral: model.safetensors digest_mismatch");
        let gate = model_cache_gate(&[model("llama", Readiness::Starting)], "").unwrap();
        assert_eq!(
            (gate.ok(), gate.reason.as_str()),
            (false, "VerificationInProgress"),
            "never a premature True"
        );
        assert!(model_cache_gate(
            &[model("llama", Readiness::Verified { revision: None })],
            ""
        )
        .unwrap()
        .ok());
    }

    #[test]
    fn model_gate_says_which_models_are_not_continuously_verified() {
        let mut unwatched = model("mistral", Readiness::Verified { revision: None });
        unwatched.watched = false;
        let gate = model_cache_gate(
            &[
                model("llama", Readiness::Verified { revision: None }),
                unwatched,
            ],
            "",
        )
        .unwrap();
        assert!(gate.ok(), "its last verdict stands");
        assert_eq!(gate.reason, "AllModelCachesVerified");
        assert!(
            gate.message.ends_with("not continuously verified (their files cannot be watched, so changes are only found by rescans): mistral"),
            "{}",
            gate.message
        );
    }

    /// A restarted agent says where a verdict came from, keeps its memory whole past the readable
    /// part, and leaves the node's condition alone while it is still looking.
    #[test]
    fn model_gate_of_a_restart_says_since_when_and_waits_while_resuming() {
        let mut resumed = model("llama", Readiness::Verified { revision: None });
        resumed.verified_by = VerifiedBy::UnchangedSince(1_764_633_600);
        let memory = " [mlnode-agent: boot 3f2b; verified llama=x]";
        let gate = model_cache_gate(&[resumed.clone()], memory).unwrap();
        assert!(gate.ok());
        assert_eq!(
            gate.message,
            format!("1 model cache(s) verified; unchanged since a previous agent of this boot hashed them: llama since 2025-12-02T00:00:00Z{memory}")
        );
        assert_eq!(
            model_cache_gate(&[resumed, model("mistral", Readiness::Resuming)], ""),
            None
        );
    }

    fn report(kind: DeviceKind, devices: usize, problems: &[(&str, &str)]) -> Report {
        Report {
            devices,
            problems: problems
                .iter()
                .map(|(reason, message)| {
                    mlnode_core::health::Problem::new(reason, message.to_string())
                })
                .collect(),
            ..Report::new(kind)
        }
    }

    #[test]
    fn the_first_problem_names_the_condition_and_every_one_is_said() {
        let reports = [
            report(
                DeviceKind::Gpu,
                8,
                &[
                    (
                        "GPUResetRequired",
                        "the driver asks for a GPU reset of GPU 5",
                    ),
                    ("FatalXID", "GPU 5 reported XID 79"),
                ],
            ),
            report(
                DeviceKind::Neuron,
                16,
                &[(
                    "NeuronUncorrectedECC",
                    "Neuron device 4: 1 uncorrected ECC error(s)",
                )],
            ),
        ];
        let gate = accelerator_gate(&[], &reports, "");
        assert_eq!(
            (gate.ok(), gate.reason.as_str()),
            (false, "GPUResetRequired")
        );
        assert_eq!(
            gate.message,
            "the driver asks for a GPU reset of GPU 5; GPU 5 reported XID 79; Neuron device 4: 1 uncorrected ECC error(s)"
        );
        let healthy = accelerator_gate(
            &[],
            &[
                report(DeviceKind::Gpu, 8, &[]),
                report(DeviceKind::Neuron, 16, &[]),
            ],
            "",
        );
        assert_eq!(
            (
                healthy.ok(),
                healthy.reason.as_str(),
                healthy.message.as_str()
            ),
            (
                true,
                "AcceleratorsHealthy",
                "8 GPU(s), 16 Neuron device(s) healthy"
            )
        );
        assert_eq!(
            accelerator_gate(&[], &[], "").reason,
            "NoAcceleratorsMonitored"
        );
    }

    /// A required collector that is not running fails the gate before any device problem; the
    /// memory trailer is kept whole however long the readable part is.
    #[test]
    fn missing_collectors_fail_it_and_the_memory_is_kept_whole() {
        let missing = ["nvml: cannot load libnvidia-ml.so.1".to_string()];
        let gate = accelerator_gate(&missing, &[report(DeviceKind::Gpu, 0, &[])], "");
        assert_eq!(
            (gate.ok(), gate.reason.as_str()),
            (false, "CollectorUnavailable")
        );
        let many: Vec<(String, String)> = (0..600)
            .map(|d| {
                (
                    "NeuronUncorrectedECC".into(),
                    format!("Neuron device {d}: 1 uncorrected ECC error(s)"),
                )
            })
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(r, m)| (r.as_str(), m.as_str())).collect();
        let trailer = " [mlnode-agent: boot 3f2b; held GPU-a=79]";
        let gate = accelerator_gate(&[], &[report(DeviceKind::Neuron, 600, &many)], trailer);
        assert!(gate.message.len() <= MESSAGE_LIMIT + 4 + trailer.len());
        assert!(gate.message.ends_with(trailer));
    }

    /// The repair condition says False only for a device fault, Unknown when the agent cannot see
    /// the devices, and True with them healthy; it never carries the agent's memory.
    #[test]
    fn the_repair_condition_fails_only_on_a_device_fault() {
        let gpu = |problems: &[(&str, &str)]| [report(DeviceKind::Gpu, 8, problems)];
        let missing = ["nvml collector required (nvml.enabled: true) but not running".to_string()];
        let fault = gpu(&[("FatalXID", "GPU 5 reported XID 79")]);
        let gate = repair_gate("AcceleratedHardwareReady", &[], &fault);
        assert_eq!(
            (
                gate.condition_type,
                gate.status,
                gate.reason.as_str(),
                gate.message.as_str()
            ),
            (
                "AcceleratedHardwareReady",
                Status::False,
                "FatalXID",
                "GPU 5 reported XID 79"
            )
        );
        assert_eq!(
            repair_gate("AcceleratedHardwareReady", &missing, &fault).status,
            Status::False
        );
        let unknown = repair_gate("AcceleratedHardwareReady", &missing, &gpu(&[]));
        assert_eq!(
            (unknown.status, unknown.reason.as_str()),
            (Status::Unknown, "CollectorUnavailable")
        );
        assert_eq!(
            repair_gate("AcceleratedHardwareReady", &[], &gpu(&[])).status,
            Status::True
        );
    }

    /// The repair condition names the XID behind a fault as eks-node-monitoring-agent does, whichever
    /// problem carries it, an XID holding by itself before a repeated one; without one, or while the
    /// condition is not False, the reason is `AcceleratorHealthy`'s.
    #[test]
    fn the_repair_condition_names_the_xid_behind_a_fault() {
        use mlnode_core::health::Problem;
        let gpus = |problems: Vec<Problem>| {
            [Report {
                devices: 8,
                problems,
                ..Report::new(DeviceKind::Gpu)
            }]
        };
        let reason = |problems: Vec<Problem>| {
            repair_gate("AcceleratedHardwareReady", &[], &gpus(problems)).reason
        };
        let count = Problem::new("GPUCountMismatch", "7 on the bus".into());
        let repeated = Problem::new("XIDRepeated", "XID 13 repeated".into()).with_repeated_xid(13);
        let reset = Problem::new("GPUResetRequired", "reset GPU 2".into()).with_xid(Some(48));
        let fatal = Problem::new("FatalXID", "GPU 5 reported XID 79".into()).with_xid(Some(79));
        assert_eq!(reason(vec![fatal.clone()]), "NvidiaXID79Error");
        assert_eq!(
            reason(vec![count.clone(), repeated.clone(), reset, fatal]),
            "NvidiaXID48Error",
            "the first XID that holds a GPU by itself"
        );
        assert_eq!(
            reason(vec![count.clone(), repeated.clone()]),
            "NvidiaXID13ErrorRepeated"
        );
        assert_eq!(reason(vec![count.clone()]), "GPUCountMismatch");
        let unknown = Problem::new("FatalXID", "XID 171".into()).with_xid(Some(171));
        assert_eq!(
            reason(vec![unknown]),
            "NvidiaXID171Error",
            "a number the catalog lacks still named"
        );
        let gate = repair_gate(
            "AcceleratedHardwareReady",
            &[],
            &gpus(vec![count, repeated]),
        );
        assert_eq!(
            (gate.status, gate.message.as_str()),
            (Status::False, "7 on the bus; XID 13 repeated"),
            "the message is AcceleratorHealthy's"
        );
        assert_eq!(
            accelerator_gate(
                &[],
                &gpus(vec![Problem::new("FatalXID", "m".into()).with_xid(Some(79))]),
                ""
            )
            .reason,
            "FatalXID",
            "AcceleratorHealthy keeps the agent's own reasons"
        );
    }

    #[test]
    fn the_fabric_has_its_own_condition_and_no_say_in_the_accelerators() {
        let fabric = report(
            DeviceKind::Fabric,
            33,
            &[(
                "RDMAPortNotActive",
                "mlx5_0 port 1 is DOWN, physical state Disabled",
            )],
        );
        let gpus = report(DeviceKind::Gpu, 8, &[]);
        let reports = [gpus.clone(), fabric];
        let accelerators = accelerator_gate(&[], &reports, "");
        assert!(accelerators.ok(), "{}", accelerators.message);
        assert_eq!(accelerators.message, "8 GPU(s), 0 Neuron device(s) healthy");
        assert_eq!(
            repair_gate("AcceleratedHardwareReady", &[], &reports).status,
            Status::True
        );
        let gate = fabric_gate(&reports).unwrap();
        assert_eq!(gate.condition_type, FABRIC_HEALTHY);
        assert_eq!(gate.status, Status::False);
        assert_eq!(gate.reason, "RDMAPortNotActive");
        assert!(gate.message.contains("mlx5_0 port 1"));
        assert!(
            fabric_gate(std::slice::from_ref(&gpus)).is_none(),
            "no RDMA collector, no condition"
        );
        let healthy = fabric_gate(&[gpus, report(DeviceKind::Fabric, 32, &[])]).unwrap();
        assert!(healthy.ok());
        assert_eq!(healthy.message, "32 RDMA device(s), every port active");
    }
}
