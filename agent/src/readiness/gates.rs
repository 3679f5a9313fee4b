//! The gates, as plain data decided from what the agent knows. Positive polarity: True is good, so
//! a node-readiness-controller rule (`requiredStatus: True`) or an alert uses them as they are.

use std::collections::{BTreeMap, BTreeSet};

use crate::cache::state::Readiness;
use crate::gpu::state::GpuFailure;

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
    /// GPUs NVML cannot read: index, UUID and why.
    pub failed_gpus: Vec<(u32, String, GpuFailure)>,
    /// XIDs seen since the agent started, per GPU index.
    pub xids: BTreeMap<u32, BTreeSet<u64>>,
    /// Uncorrected ECC events since the agent started, per Neuron device index.
    pub neuron_uncorrected_ecc: BTreeMap<u32, u64>,
    pub gpus: usize,
    pub neuron_devices: usize,
}

/// `AcceleratorHealthy`: no lost GPU, no XID from the fatal list since the agent started, no
/// uncorrected Neuron ECC since the agent started, and every required collector running.
pub fn accelerator_gate(facts: &AcceleratorFacts, fatal_xids: &BTreeSet<u64>) -> Gate {
    let mut problems: Vec<(&str, String)> = Vec::new();
    for reason in &facts.missing_collectors {
        problems.push(("CollectorUnavailable", reason.clone()));
    }
    for (index, uuid, failure) in &facts.failed_gpus {
        problems.push(match failure {
            GpuFailure::Lost => ("GPULost", format!("GPU {index} ({uuid}) fell off the bus")),
            GpuFailure::ResetRequired => (
                "GPUResetRequired",
                format!("GPU {index} ({uuid}) needs a reset (NVML: reset required)"),
            ),
            other => (
                "GPUUnreadable",
                format!(
                    "GPU {index} ({uuid}) cannot be read (NVML: {})",
                    other.as_str()
                ),
            ),
        });
    }
    for (index, xids) in &facts.xids {
        let fatal: Vec<String> = xids
            .intersection(fatal_xids)
            .map(|x| x.to_string())
            .collect();
        if !fatal.is_empty() {
            problems.push((
                "FatalXID",
                format!("GPU {index} reported XID {}", fatal.join(", ")),
            ));
        }
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
        message: truncate(message),
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

    fn fatal() -> BTreeSet<u64> {
        [48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120].into()
    }

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
    fn only_fatal_xids_fail_the_accelerator_gate() {
        let mut facts = AcceleratorFacts {
            gpus: 8,
            ..Default::default()
        };
        facts.xids.insert(3, [13, 31].into()); // application errors: not the node's fault
        assert!(accelerator_gate(&facts, &fatal()).ok);
        facts.xids.insert(5, [79].into());
        let gate = accelerator_gate(&facts, &fatal());
        assert_eq!((gate.ok, gate.reason.as_str()), (false, "FatalXID"));
        assert!(
            gate.message.contains("GPU 5 reported XID 79"),
            "{}",
            gate.message
        );
    }

    #[test]
    fn lost_gpu_ecc_and_missing_collectors_fail_it() {
        let lost = AcceleratorFacts {
            gpus: 8,
            failed_gpus: vec![(2, "GPU-abc".into(), GpuFailure::Lost)],
            ..Default::default()
        };
        assert_eq!(accelerator_gate(&lost, &fatal()).reason, "GPULost");
        let reset = AcceleratorFacts {
            gpus: 8,
            failed_gpus: vec![(5, "GPU-def".into(), GpuFailure::ResetRequired)],
            ..Default::default()
        };
        let gate = accelerator_gate(&reset, &fatal());
        assert_eq!((gate.ok, gate.reason.as_str()), (false, "GPUResetRequired"));
        assert!(
            gate.message.contains("GPU 5 (GPU-def) needs a reset"),
            "{}",
            gate.message
        );
        let ecc = AcceleratorFacts {
            neuron_devices: 12,
            neuron_uncorrected_ecc: [(4, 1)].into(),
            ..Default::default()
        };
        let gate = accelerator_gate(&ecc, &fatal());
        assert_eq!(
            (gate.ok, gate.reason.as_str()),
            (false, "NeuronUncorrectedECC")
        );
        let missing = AcceleratorFacts {
            missing_collectors: vec!["nvml: cannot load libnvidia-ml.so.1".into()],
            ..Default::default()
        };
        assert!(!accelerator_gate(&missing, &fatal()).ok);
        let long = AcceleratorFacts {
            neuron_devices: 600,
            neuron_uncorrected_ecc: (0..600).map(|d| (d, 1)).collect(),
            ..Default::default()
        };
        assert!(accelerator_gate(&long, &fatal()).message.len() <= MESSAGE_LIMIT + 4);
    }
}
