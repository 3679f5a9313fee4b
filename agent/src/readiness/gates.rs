//! The gates, as plain data decided from what the agent knows. Positive polarity: True is good, so
//! a node-readiness-controller rule (`requiredStatus: True`) or an alert uses them as they are.

use std::collections::BTreeMap;

use crate::cache::state::Readiness;
use crate::gpu::health::Problem;

pub const MODEL_CACHE_VERIFIED: &str = "ModelCacheVerified";
pub const ACCELERATOR_HEALTHY: &str = "AcceleratorHealthy";

/// A node condition's content, without times (the controller adds those).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    pub condition_type: &'static str,
    pub ok: bool,
    /// CamelCase, as Kubernetes reasons are.
    pub reason: String,
    /// Short: what failed and where.
    pub message: String,
}

/// Kubernetes caps a condition message at 32 KiB; kubectl shows one line. Keep it readable.
const MESSAGE_LIMIT: usize = 1000;

fn truncate(mut message: String) -> String {
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
}

/// `ModelCacheVerified`: every configured model verified. A model whose files cannot be watched
/// does not hold the node (its last verdict stands), but the message says it is not continuously
/// verified.
pub fn model_cache_gate(models: &[ModelFacts]) -> Gate {
    let mut failing = Vec::new();
    let mut starting = Vec::new();
    for ModelFacts {
        name, readiness, ..
    } in models
    {
        match readiness {
            Readiness::Verified { .. } => {}
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
    Gate {
        condition_type: MODEL_CACHE_VERIFIED,
        ok,
        reason: reason.into(),
        message: truncate(message),
    }
}

/// What the accelerator collectors report, reduced to what the gate needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceleratorFacts {
    /// A collector that should be there (`enabled: true`) but is not: name and why.
    pub missing_collectors: Vec<String>,
    /// What the GPU collector found unfit, its verdicts already made ([`crate::gpu::health`]).
    pub gpu_problems: Vec<Problem>,
    /// Uncorrected ECC events since the agent started, per Neuron device index.
    pub neuron_uncorrected_ecc: BTreeMap<u32, u64>,
    /// Inferentia/Trainium devices on the PCI bus, where the bus could be read: more than the
    /// driver lists (`neuron_devices`) is a device it did not bring up.
    pub neuron_pci_devices: Option<usize>,
    pub gpus: usize,
    pub neuron_devices: usize,
    /// What the condition's message must carry for a restarted agent (`memory::trailer`): kept
    /// whole, after the readable part.
    pub memory: String,
}

/// `AcceleratorHealthy`: every required collector running, no GPU problem (the driver's recovery
/// action, a held XID, a lost or unreadable GPU, a silent NVML), no uncorrected Neuron ECC since
/// the agent started. The first problem's reason is the condition's; every message is kept.
pub fn accelerator_gate(facts: &AcceleratorFacts) -> Gate {
    let mut problems: Vec<(&str, String)> = Vec::new();
    for reason in &facts.missing_collectors {
        problems.push(("CollectorUnavailable", reason.clone()));
    }
    for problem in &facts.gpu_problems {
        problems.push((problem.reason.as_str(), problem.message.clone()));
    }
    if let Some(on_bus) = facts
        .neuron_pci_devices
        .filter(|&n| n > facts.neuron_devices)
    {
        problems.push((
            "NeuronDeviceCountMismatch",
            format!(
                "the PCI bus has {on_bus} Inferentia/Trainium device(s) and the Neuron driver lists {}",
                facts.neuron_devices
            ),
        ));
    }
    for (device, count) in &facts.neuron_uncorrected_ecc {
        if *count > 0 {
            problems.push((
                "NeuronUncorrectedECC",
                format!("Neuron device {device}: {count} uncorrected ECC error(s)"),
            ));
        }
    }
    let gate = |ok, reason: &str, message: String| Gate {
        condition_type: ACCELERATOR_HEALTHY,
        ok,
        reason: reason.into(),
        message: truncate(message) + &facts.memory,
    };
    match problems.first() {
        Some((reason, _)) => gate(
            false,
            reason,
            problems
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
        None if facts.gpus + facts.neuron_devices == 0 => gate(
            true,
            "NoAcceleratorsMonitored",
            "no GPU or Neuron device is monitored on this node".into(),
        ),
        None => gate(
            true,
            "AcceleratorsHealthy",
            format!(
                "{} GPU(s), {} Neuron device(s) healthy",
                facts.gpus, facts.neuron_devices
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, readiness: Readiness) -> ModelFacts {
        ModelFacts {
            name: name.into(),
            readiness,
            watched: true,
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
        let gate = model_cache_gate(&models);
        assert!(!gate.ok);
        assert_eq!(gate.reason, "ModelCacheNotVerified");
        assert_eq!(gate.message, "mistral: model.safetensors digest_mismatch");
        let gate = model_cache_gate(&[model("llama", Readiness::Starting)]);
        assert_eq!(
            (gate.ok, gate.reason.as_str()),
            (false, "VerificationInProgress"),
            "never a premature True"
        );
        assert!(model_cache_gate(&[model("llama", Readiness::Verified { revision: None })]).ok);
    }

    #[test]
    fn model_gate_says_which_models_are_not_continuously_verified() {
        let mut unwatched = model("mistral", Readiness::Verified { revision: None });
        unwatched.watched = false;
        let gate = model_cache_gate(&[
            model("llama", Readiness::Verified { revision: None }),
            unwatched,
        ]);
        assert!(gate.ok, "its last verdict stands");
        assert_eq!(gate.reason, "AllModelCachesVerified");
        assert!(
            gate.message.ends_with("not continuously verified (their files cannot be watched, so changes are only found by rescans): mistral"),
            "{}",
            gate.message
        );
    }

    #[test]
    fn the_first_problem_names_the_condition_and_every_one_is_said() {
        let facts = AcceleratorFacts {
            gpus: 8,
            gpu_problems: vec![
                Problem {
                    reason: "GPUResetRequired".into(),
                    message: "the driver asks for a GPU reset of GPU 5".into(),
                },
                Problem {
                    reason: "FatalXID".into(),
                    message: "GPU 5 reported XID 79".into(),
                },
            ],
            ..Default::default()
        };
        let gate = accelerator_gate(&facts);
        assert_eq!((gate.ok, gate.reason.as_str()), (false, "GPUResetRequired"));
        assert_eq!(
            gate.message,
            "the driver asks for a GPU reset of GPU 5; GPU 5 reported XID 79"
        );
        let healthy = accelerator_gate(&AcceleratorFacts {
            gpus: 8,
            ..Default::default()
        });
        assert_eq!(
            (healthy.ok, healthy.reason.as_str()),
            (true, "AcceleratorsHealthy")
        );
    }

    /// A device on the bus the Neuron driver did not bring up fails the gate; an unreadable bus
    /// (None) and an equal count do not.
    #[test]
    fn a_neuron_device_the_driver_does_not_list_fails_it() {
        let facts = |on_bus| AcceleratorFacts {
            neuron_devices: 15,
            neuron_pci_devices: on_bus,
            ..Default::default()
        };
        let gate = accelerator_gate(&facts(Some(16)));
        assert_eq!(
            (gate.ok, gate.reason.as_str()),
            (false, "NeuronDeviceCountMismatch")
        );
        assert!(gate
            .message
            .contains("16 Inferentia/Trainium device(s) and the Neuron driver lists 15"));
        assert!(accelerator_gate(&facts(Some(15))).ok);
        assert!(accelerator_gate(&facts(None)).ok);
    }

    #[test]
    fn neuron_ecc_and_missing_collectors_fail_it() {
        let ecc = AcceleratorFacts {
            neuron_devices: 12,
            neuron_uncorrected_ecc: [(4, 1)].into(),
            ..Default::default()
        };
        let gate = accelerator_gate(&ecc);
        assert_eq!(
            (gate.ok, gate.reason.as_str()),
            (false, "NeuronUncorrectedECC")
        );
        let missing = AcceleratorFacts {
            missing_collectors: vec!["nvml: cannot load libnvidia-ml.so.1".into()],
            ..Default::default()
        };
        assert!(!accelerator_gate(&missing).ok);
        let long = AcceleratorFacts {
            neuron_devices: 600,
            neuron_uncorrected_ecc: (0..600).map(|d| (d, 1)).collect(),
            ..Default::default()
        };
        assert!(accelerator_gate(&long).message.len() <= MESSAGE_LIMIT + 4);
    }
}
