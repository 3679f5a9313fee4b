//! The settings of the kubelet's pod-resources client (`kubelet`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use mlnode_core::pods::{HolderLabels, LabelPattern};
use mlnode_core::settings::{bounds, hours, millis, seconds, Within};

bounds! {
    pub PodResourcesInterval: Duration = millis(100), hours(1);
    /// Each copied label is one more on every series of the pod's devices.
    pub MaxPodLabels: usize = 1, 32;
}

/// More patterns than any labelling scheme needs is a list pasted by mistake.
const MAX_PATTERNS: usize = 32;

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
    /// Extended resources whose device ids are RDMA devices, one each (aws-efa-k8s-device-plugin's
    /// `vpc.amazonaws.com/efa`): an id is matched against each device's RDMA, uverbs and PCI names.
    pub rdma_resource_names: Vec<String>,
    /// Extended resources of a shared RDMA pool (Mellanox's k8s-rdma-shared-dev-plugin, named in
    /// its config): every holder is attributed every RDMA device of the node.
    pub rdma_shared_resource_names: Vec<String>,
    /// How often the assignments are listed again.
    pub pod_resources_interval: Within<PodResourcesInterval>,
    /// Add `pod_uid` to every series that names a device's holder (dcgm-exporter's
    /// `--kubernetes-enable-pod-uid`).
    pub pod_uid: bool,
    /// Regular expressions (each matching a whole key): the holder pod's labels whose keys match
    /// are copied onto its devices' series, named as dcgm-exporter names them.
    #[serde(deserialize_with = "bounded_patterns")]
    pub pod_labels: Vec<LabelPattern>,
    /// The most pod labels copied onto one series.
    pub max_pod_labels: Within<MaxPodLabels>,
    /// dcgm-exporter's `--kubernetes-virtual-gpus`: a shared GPU's (time-slicing, MPS) DCGM_*
    /// series once per replica holder, labelled `vgpu`, its framebuffer and utilisation the
    /// holder's own where `nvml.process_attribution` reads them; its mlnode_* series under no
    /// holder.
    pub virtual_gpus: bool,
}

impl KubeletSettings {
    /// What of a device's holder goes on the device's series beside its name.
    pub fn holder_labels(&self) -> HolderLabels {
        HolderLabels {
            pod_uid: self.pod_uid,
            copy: self.pod_labels.clone(),
            max: self.max_pod_labels.get(),
            virtual_gpus: self.virtual_gpus,
        }
    }
}

fn bounded_patterns<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<LabelPattern>, D::Error> {
    let patterns = Vec::<LabelPattern>::deserialize(deserializer)?;
    if patterns.len() > MAX_PATTERNS {
        return Err(serde::de::Error::custom(format!(
            "{} patterns, at most {MAX_PATTERNS}: one pattern can match many keys (app\\.kubernetes\\.io/.*)",
            patterns.len()
        )));
    }
    Ok(patterns)
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
            rdma_resource_names: vec!["vpc.amazonaws.com/efa".into()],
            rdma_shared_resource_names: Vec::new(),
            pod_resources_interval: Within::default_of(seconds(10)),
            pod_uid: false,
            pod_labels: Vec::new(),
            max_pod_labels: Within::default_of(8),
            virtual_gpus: false,
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
