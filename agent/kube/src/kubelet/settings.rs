//! The settings of the kubelet's pod-resources client (`kubelet`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use mlnode_core::settings::{bounds, hours, millis, seconds, Within};

bounds! {
    pub PodResourcesInterval: Duration = millis(100), hours(1);
}

/// A DRA driver's name (`gpu.nvidia.com`), as the API server accepts one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct DraDriver(String);

impl DraDriver {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for DraDriver {
    type Error = String;

    fn try_from(name: String) -> Result<DraDriver, String> {
        match is_dns_subdomain(&name) {
            true => Ok(DraDriver(name)),
            false => Err(format!(
                "{name:?} is not a DRA driver name (a DNS subdomain such as gpu.nvidia.com)"
            )),
        }
    }
}

impl From<DraDriver> for String {
    fn from(driver: DraDriver) -> String {
        driver.0
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletSettings {
    /// The kubelet pod-resources API (read-only), for the pod/namespace/container of each device.
    pub pod_resources_socket: PathBuf,
    /// Extended resource names whose devices are NVIDIA GPUs or MIG devices (device ids are GPU or
    /// MIG UUIDs); a trailing `*` matches by prefix.
    pub gpu_resource_names: Vec<String>,
    /// DRA drivers whose devices are NVIDIA GPUs or MIG devices: a container's claimed device
    /// (driver, pool, device) is resolved to its UUID through the driver's ResourceSlices. Empty
    /// turns DRA attribution off.
    pub gpu_dra_drivers: Vec<DraDriver>,
    /// Extended resources whose device ids are Neuron device indexes.
    pub neuron_device_resource_names: Vec<String>,
    /// Extended resources whose device ids are global NeuronCore indexes.
    pub neuron_core_resource_names: Vec<String>,
    /// How often the assignments are listed again.
    pub pod_resources_interval: Within<PodResourcesInterval>,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        KubeletSettings {
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            gpu_resource_names: vec!["nvidia.com/gpu".into(), "nvidia.com/mig-*".into()],
            gpu_dra_drivers: vec![DraDriver("gpu.nvidia.com".into())],
            neuron_device_resource_names: vec![
                "aws.amazon.com/neuron".into(),
                "aws.amazon.com/neurondevice".into(),
            ],
            neuron_core_resource_names: vec!["aws.amazon.com/neuroncore".into()],
            pod_resources_interval: Within::default_of(seconds(10)),
        }
    }
}

/// What the API server accepts as a DRA driver name (RFC 1123 subdomain: lowercase labels of
/// letters, digits and inner hyphens, dot-separated, at most 253 characters).
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label_ok)
}
