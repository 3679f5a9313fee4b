//! The settings of the Neuron collector (`neuron`).

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use mlnode_core::settings::{invalid_field, NumberOrText, Toggle};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogicalNcConfig {
    Auto,
    Fixed(u32),
}

impl Serialize for LogicalNcConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LogicalNcConfig::Auto => serializer.serialize_str("auto"),
            LogicalNcConfig::Fixed(n) => serializer.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for LogicalNcConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = match NumberOrText::deserialize(deserializer)? {
            NumberOrText::Number(n) => n.to_string(),
            NumberOrText::Text(text) => text,
        };
        match value.trim() {
            "auto" => Ok(LogicalNcConfig::Auto),
            "1" => Ok(LogicalNcConfig::Fixed(1)),
            "2" => Ok(LogicalNcConfig::Fixed(2)),
            other => Err(serde::de::Error::custom(format!(
                "{other:?} is not a logical NeuronCore config: use auto, 1 or 2 (the values NEURON_LOGICAL_NC_CONFIG takes)"
            ))),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct NeuronSettings {
    /// `auto`: on where `sysfs_root` exists.
    pub enabled: Toggle,
    pub sysfs_root: PathBuf,
    /// The driver's class directory, where UltraServer nodes say their node id (`node_id_4`).
    pub class_root: PathBuf,
    /// Physical NeuronCores per logical NeuronCore, as the runtime's `NEURON_LOGICAL_NC_CONFIG`
    /// sets it on this node's pods: `auto` (2 on Trn2, 1 elsewhere, the runtime's default), 1 or 2.
    pub logical_nc_config: LogicalNcConfig,
    /// The `instance_type` label (the EC2 type); empty: the Node's
    /// `node.kubernetes.io/instance-type` label, read through the API server when the agent runs
    /// in a cluster. The agent never asks the instance metadata service.
    pub instance_type: String,
    /// The `availability_zone` label; empty: the Node's `topology.kubernetes.io/zone`, read
    /// through the API server in a cluster.
    pub availability_zone: String,
    /// Also export the series neuron-monitor-prometheus exports, with its names and labels, for
    /// what sysfs and procfs can feed (docs/neuron.md), so its dashboards run unchanged.
    pub monitor_names: bool,
    /// A FIFO a neuron-monitor sidecar writes its reports to (created when absent); its runtime
    /// data is exported under neuron-monitor's names. Needs `monitor_names: true`.
    pub monitor_input: Option<PathBuf>,
    /// Where the kernel lists PCI devices: the driver's devices are checked against the
    /// Inferentia/Trainium devices there.
    pub pci_devices: PathBuf,
}

impl Default for NeuronSettings {
    fn default() -> Self {
        NeuronSettings {
            enabled: Toggle::Auto,
            sysfs_root: PathBuf::from("/sys/devices/virtual/neuron_device"),
            class_root: PathBuf::from("/sys/class/neuron_device"),
            logical_nc_config: LogicalNcConfig::Auto,
            instance_type: String::new(),
            availability_zone: String::new(),
            monitor_names: false,
            monitor_input: None,
            pci_devices: PathBuf::from("/sys/bus/pci/devices"),
        }
    }
}

impl<'de> Deserialize<'de> for NeuronSettings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let settings = NeuronSettings::deserialize(deserializer)?;
        if settings.monitor_input.is_some() && !settings.monitor_names {
            return Err(invalid_field(
                "monitor_input",
                "exports neuron-monitor's names: set neuron.monitor_names: true as well",
            ));
        }
        Ok(settings)
    }
}

impl Serialize for NeuronSettings {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        NeuronSettings::serialize(self, serializer)
    }
}
