//! The settings of the readiness controller (`readiness`): the node's conditions, its startup
//! taint and the repair condition.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use mlnode_accel::gpu::xid::{XidPolicy, XidThresholds};
use mlnode_core::settings::{
    bounds, hours, invalid_field, millis, minutes, seconds, Toggle, Within,
};

bounds! {
    /// Never longer than the heartbeat, which is checked as the section is read.
    pub Interval: Duration = millis(100), hours(1);
    pub Heartbeat: Duration = seconds(1), hours(1);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaintMode {
    /// Remove the taint once, the first time every gate passes; never add it back.
    BootstrapOnly,
    /// Keep the taint exactly while a gate fails (a corrupted cache drains new pods away).
    Continuous,
}

/// A node taint as kubectl and `--register-with-taints` write it: `key[=value]:Effect`. Parsed once
/// here; the readiness controller only turns it into the API's type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaintSpec {
    pub key: String,
    pub value: Option<String>,
    pub effect: TaintEffect,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

impl std::str::FromStr for TaintSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<TaintSpec, String> {
        let (key_value, effect) = text.rsplit_once(':').ok_or_else(|| {
            format!(
                "{text:?}: expected key[=value]:Effect, such as mlnode.dev/not-ready:NoSchedule"
            )
        })?;
        let effect = match effect {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            _ => {
                return Err(format!(
                    "{text:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"
                ))
            }
        };
        let (key, value) = match key_value.split_once('=') {
            Some((key, value)) => (key, Some(value.to_string())),
            None => (key_value, None),
        };
        if key.is_empty() {
            return Err(format!("{text:?}: the taint key is empty"));
        }
        Ok(TaintSpec {
            key: key.to_string(),
            value,
            effect,
        })
    }
}

impl std::fmt::Display for TaintSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{}={value}:{}", self.key, self.effect.as_str()),
            None => write!(f, "{}:{}", self.key, self.effect.as_str()),
        }
    }
}

/// A taint as its text; the empty string is no taint.
mod taint_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::TaintSpec;

    pub fn serialize<S: Serializer>(value: &Option<TaintSpec>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.as_ref().map(ToString::to_string).unwrap_or_default())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TaintSpec>, D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(None);
        }
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct ReadinessSettings {
    /// `auto`: on where a Kubernetes config is found (in-cluster or KUBECONFIG).
    pub enabled: Toggle,
    /// `key[=value]:Effect` of a taint to remove when every gate first passes; empty: none.
    #[serde(with = "taint_text")]
    pub startup_taint: Option<TaintSpec>,
    pub taint_mode: TaintMode,
    /// Changes to NVIDIA's XID catalog for `AcceleratorHealthy`: by default the XIDs whose
    /// immediate action is a GPU reset or a machine restart hold the node.
    pub fatal_xids: XidPolicy,
    /// XIDs that hold the node once they repeat on one GPU: per XID, more than `count` within
    /// `window` (by default 13 and 31, more than 3 within an hour, as NVIDIA's catalog resolves them
    /// by their history).
    pub xid_thresholds: XidThresholds,
    /// How often the gates are evaluated.
    pub interval: Within<Interval>,
    /// Conditions are rewritten at least this often even when unchanged.
    pub heartbeat: Within<Heartbeat>,
    /// The kernel's boot id: held XIDs written into `AcceleratorHealthy` are kept by a restarted
    /// agent on the same boot, and cleared by a new one.
    pub boot_id_file: PathBuf,
    /// Also write the condition a node-repair engine acts on; off by default.
    pub repair_condition: Option<RepairCondition>,
    /// Keep a node label `models.mlnode.dev/<name>: <revision>` for each model verified here.
    pub model_labels: bool,
}

/// `readiness.repair_condition`: a condition type that node-repair engines replace or reboot a
/// node on, written beside `AcceleratorHealthy` with the engine's polarity (False: repair).
/// Karpenter's AWS provider (`RepairPolicies`: False for 10 min with a reason naming one of its
/// XIDs, else 30) and EKS node auto repair act on `AcceleratedHardwareReady`, the type
/// eks-node-monitoring-agent writes; docs/readiness.md has the sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum RepairCondition {
    AcceleratedHardwareReady,
}

impl RepairCondition {
    pub fn as_str(self) -> &'static str {
        match self {
            RepairCondition::AcceleratedHardwareReady => "AcceleratedHardwareReady",
        }
    }
}

impl Default for ReadinessSettings {
    fn default() -> Self {
        ReadinessSettings {
            enabled: Toggle::Auto,
            startup_taint: None,
            taint_mode: TaintMode::BootstrapOnly,
            fatal_xids: XidPolicy::default(),
            xid_thresholds: XidThresholds::default(),
            interval: Within::default_of(seconds(10)),
            heartbeat: Within::default_of(minutes(5)),
            boot_id_file: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            repair_condition: None,
            model_labels: false,
        }
    }
}

impl<'de> Deserialize<'de> for ReadinessSettings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let settings = ReadinessSettings::deserialize(deserializer)?;
        if settings.interval.get() > settings.heartbeat.get() {
            return Err(invalid_field(
                "interval",
                format!(
                    "{} is longer than readiness.heartbeat ({}): the gates are evaluated at least as often as the conditions are rewritten",
                    settings.interval, settings.heartbeat
                ),
            ));
        }
        Ok(settings)
    }
}

impl Serialize for ReadinessSettings {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ReadinessSettings::serialize(self, serializer)
    }
}
