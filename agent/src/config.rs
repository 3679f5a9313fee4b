//! The agent's configuration: one YAML file (a ConfigMap in the cluster), every key overridable.
//!
//! Precedence, lowest first: built-in defaults, the YAML file, `MLNODE_*` environment variables,
//! `--set key=value` flags, the dedicated flags (`--listen`). Overrides address keys by path:
//! `verify.threads` is `--set verify.threads=4` or `MLNODE_VERIFY__THREADS=4` (`__` between levels,
//! because keys themselves hold `_`). Values are YAML, so `MLNODE_MODELS='[{name: a, ...}]'` works.
//! Everything is checked once, at start, and an error names the key (or the variable) and the reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Used when `serve` is started without a config: the example model shipped in the repository,
/// on loopback, so `cargo run -- serve` shows the whole loop on a laptop.
pub fn embedded_default_yaml() -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    format!(
        "listen: \"127.0.0.1:9400\"\nmodels:\n  - name: tiny-model\n    root: {root:?}\n    manifest: {manifest:?}\n",
        root = fixtures.join("tiny-model").display().to_string(),
        manifest = fixtures.join("tiny-model.manifest.json").display().to_string(),
    )
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the HTTP server (/metrics, /healthz, /readyz).
    pub listen: SocketAddr,
    /// The node's name, exported as the `Hostname` label. Empty: `$NODE_NAME`, else the hostname.
    pub node_name: String,
    pub log_format: LogFormat,
    pub models: Vec<ModelConfig>,
    pub verify: VerifySettings,
    pub nvml: NvmlSettings,
    pub neuron: NeuronSettings,
    pub kubelet: KubeletSettings,
    pub readiness: ReadinessSettings,
    pub startup: StartupSettings,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 9400)),
            node_name: String::new(),
            log_format: LogFormat::Auto,
            models: Vec::new(),
            verify: VerifySettings::default(),
            nvml: NvmlSettings::default(),
            neuron: NeuronSettings::default(),
            kubelet: KubeletSettings::default(),
            readiness: ReadinessSettings::default(),
            startup: StartupSettings::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// JSON when standard error is not a terminal (a container's log), text otherwise.
    Auto,
    Json,
    Text,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The served model name (vLLM's `--served-model-name`), exported as `model_name`.
    pub name: String,
    /// A plain model directory or a Hugging Face repo cache folder.
    pub root: PathBuf,
    /// Native manifest or model_signing bundle.
    pub manifest: PathBuf,
    #[serde(default)]
    pub revision: Option<String>,
    /// PEM key that must have signed a model_signing bundle (`model_signing verify key`).
    #[serde(default)]
    pub public_key: Option<PathBuf>,
    /// PEM certificates the bundle's signing certificate must chain to (`verify certificate`).
    #[serde(default)]
    pub certificate_chain: Vec<PathBuf>,
    /// Keyless (`verify sigstore`): the signer's certificate identity, and its OpenID issuer.
    #[serde(default)]
    pub identity: Option<String>,
    #[serde(default)]
    pub identity_provider: Option<String>,
    /// Keyless: a private Sigstore deployment's trusted_root.json.
    #[serde(default)]
    pub trust_root: Option<PathBuf>,
    /// Keyless: signed with Sigstore's staging instance.
    #[serde(default)]
    pub use_staging: bool,
    #[serde(default)]
    pub allow_unsigned: bool,
    /// Paths under `root` (files or folders) neither checked nor extra, besides a bundle's own list.
    #[serde(default)]
    pub ignore_paths: Vec<String>,
    #[serde(default)]
    pub fail_on_extra: bool,
    /// With a signed bundle, files it does not list pass (model_signing's
    /// `--ignore_unsigned_files`); by default they fail, as model_signing fails them.
    #[serde(default)]
    pub ignore_unsigned_files: bool,
    /// Where the cache is on the node, when the agent sees it at another path (`root` is the path
    /// inside the agent's container): how pods mounting it by hostPath are matched to the model.
    #[serde(default)]
    pub host_path: Option<PathBuf>,
    /// The PersistentVolumeClaim pods mount the cache from, if they do.
    #[serde(default)]
    pub pvc: Option<String>,
}

impl ModelConfig {
    /// The signer fields, for the one check of what they mean together
    /// ([`crate::cache::manifest::TrustChoice::policy`]).
    pub fn trust_choice(&self) -> crate::cache::manifest::TrustChoice<'_> {
        crate::cache::manifest::TrustChoice {
            public_key: self.public_key.as_deref(),
            certificate_chain: &self.certificate_chain,
            identity: self.identity.as_deref(),
            identity_provider: self.identity_provider.as_deref(),
            trust_root: self.trust_root.as_deref(),
            use_staging: self.use_staging,
            allow_unsigned: self.allow_unsigned,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifySettings {
    /// Hashing threads shared by all models; 0 = one per core.
    pub threads: usize,
    /// Full re-verification, for what no file event reports (bit rot, a missed event).
    #[serde(with = "duration_text")]
    pub full_rescan_interval: Duration,
    /// How long file events are collected before the files they name are re-verified.
    #[serde(with = "duration_text")]
    pub debounce: Duration,
    /// A verification whose hashed byte count does not move for this long makes /healthz fail.
    #[serde(with = "duration_text")]
    pub stall_timeout: Duration,
    /// CPU and I/O priority of `serve`'s hashing (docs/cache-verification.md, "Priority").
    pub priority: PrioritySetting,
    /// The most bytes per second `serve` reads from all model caches together, for network file
    /// systems where a full re-read costs money and bandwidth; unset: no limit.
    pub max_bytes_per_second: Option<ByteRate>,
}

/// A read rate in bytes per second: a number (`104857600`) or a size with a unit (`100MiB`,
/// `1.5 GB`; `Mi`/`MiB` are powers of 1,024, `M`/`MB` of 1,000, as in Kubernetes quantities).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRate(pub u64);

impl Serialize for ByteRate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match NumberOrText::deserialize(deserializer)? {
            NumberOrText::Number(n) => Ok(ByteRate(n)),
            NumberOrText::Text(text) => {
                let size = text.trim().trim_end_matches("/s");
                size.parse::<bytesize::ByteSize>()
                    .map(|size| ByteRate(size.as_u64()))
                    .map_err(|e| {
                        serde::de::Error::custom(format!(
                            "{text:?} is not a byte rate such as 104857600, \"100MiB\" or \"1GB\": {e}"
                        ))
                    })
            }
        }
    }
}

/// `auto`: full speed while the node is held for this agent (its startup taint is on the node, or a
/// model's first verification before any pod has opened its weights), the kernel's idle classes
/// otherwise. `idle` and `normal` force one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrioritySetting {
    Auto,
    Idle,
    Normal,
}

impl Default for VerifySettings {
    fn default() -> Self {
        VerifySettings {
            threads: 0,
            full_rescan_interval: Duration::from_secs(24 * 3600),
            debounce: Duration::from_millis(500),
            stall_timeout: Duration::from_secs(300),
            priority: PrioritySetting::Auto,
            max_bytes_per_second: None,
        }
    }
}

/// `auto` (use it where it is present), `true` (use it; its absence is logged as an error), `false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toggle {
    Auto,
    On,
    Off,
}

/// A setting written as a number or as text (`100MiB`, `auto`).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

/// `neuron.logical_nc_config`: `auto`, 1 or 2 (the only values the Neuron runtime accepts).
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

impl Serialize for Toggle {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Toggle::Auto => serializer.serialize_str("auto"),
            Toggle::On => serializer.serialize_bool(true),
            Toggle::Off => serializer.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Toggle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Bool(true) => Ok(Toggle::On),
            Raw::Bool(false) => Ok(Toggle::Off),
            Raw::Text(t) if t == "auto" => Ok(Toggle::Auto),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "{t:?}: expected auto, true or false"
            ))),
        }
    }
}

/// The spelling of the node label on GPU series, after dcgm-exporter's releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum HostnameLabel {
    /// `Hostname` only (dcgm-exporter 3.x and before; every series has it from the registry).
    Hostname,
    /// `hostname` as well (newer dcgm-exporter releases).
    #[serde(rename = "hostname")]
    Lowercase,
}

/// The names of the labels that say which container holds a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodLabels {
    /// `pod`, `namespace`, `container`.
    Current,
    /// `pod_name`, `pod_namespace`, `container_name` (dcgm-exporter before 2.x).
    Legacy,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlSettings {
    pub enabled: Toggle,
    /// The NVML library: a name the dynamic loader finds, or a path.
    pub library: PathBuf,
    /// How often every GPU is read (also the resolution of the clock-event-reason seconds).
    #[serde(with = "duration_text")]
    pub sample_interval: Duration,
    /// Also export dcgm-exporter's DCGM_FI_* series, for nodes that run no dcgm-exporter.
    pub dcgm_names: bool,
    /// `Hostname` (dcgm-exporter 3.x and before) or `hostname` (its newer releases): with
    /// `hostname`, GPU series carry both.
    pub hostname_label: HostnameLabel,
    /// `current` (`pod`, `namespace`, `container`) or `legacy` (`pod_name`, `pod_namespace`,
    /// `container_name`, dcgm-exporter before 2.x).
    pub pod_labels: PodLabels,
    /// Where the kernel lists PCI devices: NVML's GPUs are checked against the NVIDIA GPUs there.
    pub pci_devices: PathBuf,
    /// The GPUs this node should have (8 on a p5.48xlarge): fewer on the PCI bus fails
    /// `AcceleratorHealthy`, which catches a GPU gone from the bus itself. Unset: not checked.
    pub expected_gpus: Option<u32>,
    /// How far back `DCGM_EXP_XID_ERRORS_COUNT` counts XIDs (dcgm-exporter's
    /// `--xid-count-window-size`, 5 minutes by default there too).
    #[serde(with = "duration_text")]
    pub xid_count_window: Duration,
}

impl Default for NvmlSettings {
    fn default() -> Self {
        NvmlSettings {
            enabled: Toggle::Auto,
            library: PathBuf::from("libnvidia-ml.so.1"),
            sample_interval: Duration::from_secs(1),
            dcgm_names: false,
            hostname_label: HostnameLabel::Hostname,
            pod_labels: PodLabels::Current,
            pci_devices: PathBuf::from("/sys/bus/pci/devices"),
            expected_gpus: None,
            xid_count_window: Duration::from_secs(300),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
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
    pub gpu_dra_drivers: Vec<String>,
    /// Extended resources whose device ids are Neuron device indexes.
    pub neuron_device_resource_names: Vec<String>,
    /// Extended resources whose device ids are global NeuronCore indexes.
    pub neuron_core_resource_names: Vec<String>,
    /// How often the assignments are listed again.
    #[serde(with = "duration_text")]
    pub pod_resources_interval: Duration,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        KubeletSettings {
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            gpu_resource_names: vec!["nvidia.com/gpu".into(), "nvidia.com/mig-*".into()],
            gpu_dra_drivers: vec!["gpu.nvidia.com".into()],
            neuron_device_resource_names: vec![
                "aws.amazon.com/neuron".into(),
                "aws.amazon.com/neurondevice".into(),
            ],
            neuron_core_resource_names: vec!["aws.amazon.com/neuroncore".into()],
            pod_resources_interval: Duration::from_secs(10),
        }
    }
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
#[serde(deny_unknown_fields, default)]
pub struct ReadinessSettings {
    /// `auto`: on where a Kubernetes config is found (in-cluster or KUBECONFIG).
    pub enabled: Toggle,
    /// `key[=value]:Effect` of a taint to remove when every gate first passes; empty: none.
    #[serde(with = "taint_text")]
    pub startup_taint: Option<TaintSpec>,
    pub taint_mode: TaintMode,
    /// Changes to NVIDIA's XID catalog for `AcceleratorHealthy`: by default the XIDs whose
    /// immediate action is a GPU reset or a machine restart hold the node.
    pub fatal_xids: XidOverride,
    /// How often the gates are evaluated.
    #[serde(with = "duration_text")]
    pub interval: Duration,
    /// Conditions are rewritten at least this often even when unchanged.
    #[serde(with = "duration_text")]
    pub heartbeat: Duration,
    /// The kernel's boot id: held XIDs written into `AcceleratorHealthy` are kept by a restarted
    /// agent on the same boot, and cleared by a new one.
    pub boot_id_file: PathBuf,
    /// Also write the condition a node-repair engine acts on; off by default.
    pub repair_condition: Option<RepairCondition>,
}

/// `readiness.repair_condition`: a condition type that node-repair engines replace or reboot a
/// node on, written beside `AcceleratorHealthy` with the engine's polarity (False: repair).
/// Karpenter's AWS provider (`RepairPolicies`, False for 10 min) and EKS node auto repair (Replace
/// or Reboot after 10 min) act on `AcceleratedHardwareReady`, the type eks-node-monitoring-agent
/// writes; docs/readiness.md has the sources.
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
            fatal_xids: XidOverride::default(),
            interval: Duration::from_secs(10),
            heartbeat: Duration::from_secs(300),
            boot_id_file: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            repair_condition: None,
        }
    }
}

/// `readiness.fatal_xids`: XIDs that also hold the node (`add`), and XIDs that never do (`remove`),
/// on top of NVIDIA's catalog.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct XidOverride {
    pub add: Vec<u64>,
    pub remove: Vec<u64>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct XidOverrideFields {
    add: Vec<u64>,
    remove: Vec<u64>,
}

/// A map of the two lists; the plain list this key held before the catalog is refused saying what
/// to write instead, not read as something else.
impl<'de> Deserialize<'de> for XidOverride {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = XidOverride;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map {add: [XID, ...], remove: [XID, ...]} of changes to NVIDIA's XID catalog")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<XidOverride, A::Error> {
                let fields = XidOverrideFields::deserialize(
                    serde::de::value::MapAccessDeserializer::new(map),
                )?;
                Ok(XidOverride {
                    add: fields.add,
                    remove: fields.remove,
                })
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                _: A,
            ) -> Result<XidOverride, A::Error> {
                Err(serde::de::Error::custom(
                    "a plain list of XIDs is the form before NVIDIA's catalog decided: write {add: [XID, ...]} for XIDs that should also hold the node and {remove: [XID, ...]} for ones that never should",
                ))
            }
        }
        deserializer.deserialize_any(Form)
    }
}

/// XIDs are small numbers (the driver's newest is in the 170s; NVML reports 999 for one it cannot
/// name): anything past this is a typo.
const MAX_XID: u64 = 999;

impl XidOverride {
    fn check(&self) -> Result<(), (String, String)> {
        for (list, xids) in [("add", &self.add), ("remove", &self.remove)] {
            if let Some(bad) = xids.iter().find(|&&x| x == 0 || x > MAX_XID) {
                return Err((
                    format!("readiness.fatal_xids.{list}"),
                    format!("{bad} is not an XID: XIDs are 1 to {MAX_XID}"),
                ));
            }
        }
        if let Some(both) = self.add.iter().find(|x| self.remove.contains(x)) {
            return Err((
                "readiness.fatal_xids".into(),
                format!("XID {both} is both added and removed: keep it in one list"),
            ));
        }
        Ok(())
    }

    /// The policy the GPU collector's health facts apply.
    pub fn policy(&self) -> crate::gpu::health::XidPolicy {
        crate::gpu::health::XidPolicy {
            add: self.add.iter().copied().collect(),
            remove: self.remove.iter().copied().collect(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StartupSettings {
    /// `auto`: only inside a cluster; `true`: also with a KUBECONFIG.
    pub enabled: Toggle,
    /// `mlnode_pod_startup_last_phase_seconds` keeps this many most recent pods...
    pub recent_pods: usize,
    /// ...and none older than this.
    #[serde(with = "duration_text")]
    pub recent_max_age: Duration,
}

impl Default for StartupSettings {
    fn default() -> Self {
        StartupSettings {
            enabled: Toggle::Auto,
            recent_pods: 100,
            recent_max_age: Duration::from_secs(6 * 3600),
        }
    }
}

/// Durations as people write them in YAML: "500ms", "30s", "24h".
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration such as \"500ms\", \"30s\" or \"24h\": {e}"
            ))
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML: {reason}")]
    Yaml { path: PathBuf, reason: String },
    #[error("config {origin}: {key}: {reason}")]
    Invalid {
        origin: String,
        key: String,
        reason: String,
    },
}

/// One value set from outside the config file, with where it came from, so an error or
/// `mlnode-agent config` can name it.
#[derive(Clone, Debug)]
pub struct Override {
    pub origin: String,
    pub key: String,
    pub value: String,
}

/// The config's top-level keys, read off the type itself: a section added to [`Config`] is
/// addressable by a variable without anyone remembering to list it.
pub fn top_level_keys() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

impl Override {
    /// `MLNODE_VERIFY__THREADS=4` → `verify.threads`. Only variables that address one of the
    /// config's top-level keys count: Kubernetes injects `MLNODE_AGENT_SERVICE_HOST` and the like
    /// for a Service named mlnode-agent, and those must not stop the agent. A config variable whose
    /// value is not UTF-8 is an error naming it; any other variable is none of the agent's business.
    pub fn from_env() -> Result<Vec<Override>, ConfigError> {
        Override::from_vars(std::env::vars_os())
    }

    pub fn from_vars(
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Vec<Override>, ConfigError> {
        let keys = top_level_keys();
        let mut overrides = Vec::new();
        for (name, value) in vars {
            let Some(name) = name.to_str() else { continue };
            let Some(path) = name.strip_prefix("MLNODE_") else {
                continue;
            };
            let key = path.to_ascii_lowercase().replace("__", ".");
            let top = key.split('.').next().unwrap_or_default();
            if !keys.iter().any(|k| k == top) {
                continue;
            }
            let origin = format!("variable {name}");
            let value = value.into_string().map_err(|raw| ConfigError::Invalid {
                origin: origin.clone(),
                key: key.clone(),
                reason: format!("the value {:?} is not UTF-8 text", raw.to_string_lossy()),
            })?;
            overrides.push(Override { origin, key, value });
        }
        overrides.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(overrides)
    }

    /// `--set verify.threads=4`.
    pub fn from_flag(text: &str) -> Result<Override, ConfigError> {
        let (key, value) = text.split_once('=').ok_or_else(|| ConfigError::Invalid {
            origin: format!("flag --set {text}"),
            key: text.to_string(),
            reason: "expected KEY=VALUE, such as verify.threads=4".into(),
        })?;
        Ok(Override {
            origin: format!("flag --set {text}"),
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

/// Where the values of a loaded config came from: the file (or the embedded default), then each
/// override in the order applied.
#[derive(Clone, Debug)]
pub struct Sources {
    base: String,
    overrides: Vec<(String, String)>,
    /// Where `node_name` came from when neither the file nor an override set it.
    node_name: Option<String>,
}

impl Sources {
    /// The origin of the value at `path` (`readiness.startup_taint`, `models[0].root`): the last
    /// override that set it or a key above it, else the file. `detail` is the error text: serde
    /// reports an unknown field at its parent's path and names the field only there.
    pub fn origin_of(&self, path: &str, detail: &str) -> String {
        let path = path.trim_start_matches('.');
        let covers = |key: &str| {
            path == key
                || path.starts_with(&format!("{key}."))
                || path.starts_with(&format!("{key}["))
        };
        let names_field_below = |key: &str| {
            let below = if path.is_empty() {
                Some(key)
            } else {
                key.strip_prefix(path)
                    .and_then(|rest| rest.strip_prefix('.'))
            };
            below.is_some_and(|rest| {
                let field = rest.split('.').next().unwrap_or(rest);
                detail.contains(&format!("`{field}`"))
            })
        };
        if let Some((_, origin)) = self
            .overrides
            .iter()
            .rev()
            .find(|(key, _)| covers(key) || names_field_below(key))
        {
            return origin.clone();
        }
        match (&self.node_name, path) {
            (Some(origin), "node_name") => origin.clone(),
            _ => self.base.clone(),
        }
    }
}

/// Builds the configuration from an optional YAML file and overrides, and checks it.
pub fn load(file: Option<&Path>, overrides: &[Override]) -> Result<Config, ConfigError> {
    load_with_sources(file, overrides).map(|(config, _)| config)
}

/// [`load`], and where each value came from.
pub fn load_with_sources(
    file: Option<&Path>,
    overrides: &[Override],
) -> Result<(Config, Sources), ConfigError> {
    let (base, text) = match file {
        Some(path) => {
            let text =
                crate::files::read_bounded_text(path, CONFIG_FILE_LIMIT).map_err(|source| {
                    ConfigError::Read {
                        path: path.to_path_buf(),
                        source,
                    }
                })?;
            (format!("file {}", path.display()), text)
        }
        None => ("embedded default".to_string(), embedded_default_yaml()),
    };
    let mut sources = Sources {
        base: base.clone(),
        overrides: Vec::new(),
        node_name: None,
    };
    let mut tree: Value = if text.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_saphyr::from_str(&text).map_err(|e| ConfigError::Yaml {
            path: file
                .map(Path::to_path_buf)
                .unwrap_or_else(|| "<embedded>".into()),
            reason: e.to_string(),
        })?
    };
    if !tree.is_object() {
        return Err(ConfigError::Invalid {
            origin: base,
            key: "$".into(),
            reason: "the top level must be a mapping of keys".into(),
        });
    }
    for o in overrides {
        apply(&mut tree, o)?;
        sources.overrides.push((o.key.clone(), o.origin.clone()));
    }
    let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
        let key = e.path().to_string();
        let reason = e.into_inner().to_string();
        ConfigError::Invalid {
            origin: sources.origin_of(&key, &reason),
            key,
            reason,
        }
    })?;
    if config.node_name.is_empty() {
        let (name, origin) = default_node_name();
        config.node_name = name;
        sources.node_name = Some(origin);
    }
    validate(&config).map_err(|(key, reason)| ConfigError::Invalid {
        origin: sources.origin_of(&key, &reason),
        key,
        reason,
    })?;
    Ok((config, sources))
}

/// A config file is small; a larger one is a mistake (or not a config file).
const CONFIG_FILE_LIMIT: u64 = 4 << 20;

fn apply(tree: &mut Value, o: &Override) -> Result<(), ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        origin: o.origin.clone(),
        key: o.key.clone(),
        reason,
    };
    // A YAML scalar or collection; a value that does not parse as YAML is taken as a string.
    let value: Value =
        serde_saphyr::from_str(&o.value).unwrap_or_else(|_| Value::String(o.value.clone()));
    // Plain words stay strings even where YAML would read them otherwise ("no", "on", "0x1").
    let value = match value {
        Value::Bool(_) | Value::Number(_)
            if o.key.ends_with("name") || o.key.ends_with("revision") =>
        {
            Value::String(o.value.clone())
        }
        other => other,
    };
    let mut node = tree;
    let parts: Vec<&str> = o.key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            return Err(invalid("empty key component".into()));
        }
        let Value::Object(map) = node else {
            return Err(invalid(format!(
                "{} is not a mapping",
                parts[..i].join(".")
            )));
        };
        if i == parts.len() - 1 {
            map.insert(part.to_string(), value);
            return Ok(());
        }
        node = map
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    Ok(())
}

/// The node's name and where it came from: `$NODE_NAME` (the DaemonSet sets it from
/// `spec.nodeName`), else the hostname.
fn default_node_name() -> (String, String) {
    if let Some(name) = std::env::var_os("NODE_NAME").and_then(|n| n.into_string().ok()) {
        if !name.is_empty() {
            return (name, "variable NODE_NAME".into());
        }
    }
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    (host, "the host name".into())
}

/// Inclusive bounds of a duration setting, with the reason a user is told.
fn check_duration(
    key: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), (String, String)> {
    if value < min || value > max {
        return Err((
            key.to_string(),
            format!(
                "{} is out of bounds: must be between {} and {}",
                humantime::format_duration(value),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

fn check_count(key: &str, value: usize, min: usize, max: usize) -> Result<(), (String, String)> {
    if value < min || value > max {
        return Err((
            key.to_string(),
            format!("{value} is out of bounds: must be between {min} and {max}"),
        ));
    }
    Ok(())
}

/// Below 1 MiB/s a 140 GB model takes 40 hours to re-read, longer than the daily rescan; above
/// 100 GiB/s no storage a node has is limited.
fn check_byte_rate(key: &str, rate: u64) -> Result<(), (String, String)> {
    const MIN: u64 = 1 << 20;
    const MAX: u64 = 100 << 30;
    if !(MIN..=MAX).contains(&rate) {
        return Err((
            key.to_string(),
            format!(
                "{rate} bytes/s is out of bounds: must be between {MIN} (1 MiB/s) and {MAX} (100 GiB/s)"
            ),
        ));
    }
    Ok(())
}

/// Hashing threads beyond this only cost memory and start-up time: hashing is bound by cores and
/// storage long before.
pub const MAX_THREADS: usize = 256;

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn validate(config: &Config) -> Result<(), (String, String)> {
    let mut names = std::collections::HashSet::new();
    for (i, model) in config.models.iter().enumerate() {
        let key = |field: &str| format!("models[{i}].{field}");
        if model.name.trim().is_empty() {
            return Err((
                key("name"),
                "must not be empty: it is the model_name label".into(),
            ));
        }
        if !names.insert(model.name.as_str()) {
            return Err((
                key("name"),
                format!("{:?} is used by two models", model.name),
            ));
        }
        if model.root.as_os_str().is_empty() {
            return Err((key("root"), "must name the model directory".into()));
        }
        if model.manifest.as_os_str().is_empty() {
            return Err((key("manifest"), "must name the manifest file".into()));
        }
        if let Err(conflict) = model.trust_choice().policy() {
            return Err((key(conflict.field), conflict.why));
        }
    }
    let verify = &config.verify;
    check_count("verify.threads", verify.threads, 0, MAX_THREADS)?;
    // Past 30 days a "periodic" rescan is no rescan, and far beyond it the monitor's clock overflows.
    check_duration(
        "verify.full_rescan_interval",
        verify.full_rescan_interval,
        MINUTE,
        30 * DAY,
    )?;
    check_duration(
        "verify.debounce",
        verify.debounce,
        Duration::ZERO,
        30 * SECOND,
    )
    .map_err(|(key, reason)| {
        (
            key,
            format!("{reason}: a longer debounce leaves a corrupted file unreported for that long"),
        )
    })?;
    check_duration(
        "verify.stall_timeout",
        verify.stall_timeout,
        10 * SECOND,
        DAY,
    )?;
    if let Some(ByteRate(rate)) = verify.max_bytes_per_second {
        check_byte_rate("verify.max_bytes_per_second", rate)?;
    }
    if config.neuron.monitor_input.is_some() && !config.neuron.monitor_names {
        return Err((
            "neuron.monitor_input".into(),
            "exports neuron-monitor's names: set neuron.monitor_names: true as well".into(),
        ));
    }
    let readiness = &config.readiness;
    readiness.fatal_xids.check()?;
    check_duration("readiness.heartbeat", readiness.heartbeat, SECOND, HOUR)?;
    check_duration(
        "readiness.interval",
        readiness.interval,
        100 * MS,
        readiness.heartbeat,
    )?;
    let nvml = &config.nvml;
    check_duration(
        "nvml.sample_interval",
        nvml.sample_interval,
        100 * MS,
        MINUTE,
    )?;
    if let Some(expected) = nvml.expected_gpus {
        check_count("nvml.expected_gpus", expected as usize, 1, 64)?;
    }
    check_duration("nvml.xid_count_window", nvml.xid_count_window, SECOND, DAY)?;
    check_duration(
        "kubelet.pod_resources_interval",
        config.kubelet.pod_resources_interval,
        100 * MS,
        HOUR,
    )?;
    for (i, driver) in config.kubelet.gpu_dra_drivers.iter().enumerate() {
        if !is_dns_subdomain(driver) {
            return Err((
                format!("kubelet.gpu_dra_drivers[{i}]"),
                format!(
                    "{driver:?} is not a DRA driver name (a DNS subdomain such as gpu.nvidia.com)"
                ),
            ));
        }
    }
    let startup = &config.startup;
    check_count("startup.recent_pods", startup.recent_pods, 1, 10_000)?;
    check_duration(
        "startup.recent_max_age",
        startup.recent_max_age,
        MINUTE,
        7 * DAY,
    )?;
    Ok(())
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

/// What `mlnode-agent config` prints: the effective configuration as YAML, then every value that
/// differs from the built-in default with where it came from.
pub fn describe(config: &Config, sources: &Sources) -> String {
    let mut out = String::from("# The effective configuration of mlnode-agent serve.\n");
    match serde_saphyr::to_string(config) {
        Ok(yaml) => out.push_str(&yaml),
        Err(e) => out.push_str(&format!("# cannot render as YAML: {e}\n")),
    }
    let effective = serde_json::to_value(config).unwrap_or(Value::Null);
    let default = serde_json::to_value(Config::default()).unwrap_or(Value::Null);
    let mut changed = Vec::new();
    changed_leaves("", &effective, &default, &mut changed);
    out.push_str("# Values that differ from the built-in default, and where they came from:\n");
    if changed.is_empty() {
        out.push_str("#   (none)\n");
    }
    let width = changed.iter().map(String::len).max().unwrap_or(0);
    for key in changed {
        let origin = sources.origin_of(&key, "");
        out.push_str(&format!("#   {key:<width$}  {origin}\n"));
    }
    out
}

/// Paths of the leaves (scalars and lists, taken whole) where `a` differs from `b`.
fn changed_leaves(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                changed_leaves(&path, value, b.get(key).unwrap_or(&Value::Null), out);
            }
        }
        (a, b) if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_yaml(yaml: &str, overrides: &[Override]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        load(Some(&path), overrides)
    }

    const ONE_MODEL: &str =
        "models:\n  - name: llama\n    root: /models/llama\n    manifest: /m/llama.json\n";

    #[test]
    fn file_values_and_defaults() {
        let config = from_yaml(&format!("listen: 127.0.0.1:9999\nnode_name: gpu-1\n{ONE_MODEL}verify:\n  full_rescan_interval: 12h\n"), &[]).unwrap();
        assert_eq!(config.listen.port(), 9999);
        assert_eq!(config.node_name, "gpu-1");
        assert_eq!(config.models[0].name, "llama");
        assert_eq!(
            config.verify.full_rescan_interval,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(config.verify.threads, 0);
    }

    #[test]
    fn overrides_replace_file_values_by_key_path() {
        let overrides = [
            Override::from_flag("verify.threads=3").unwrap(),
            Override::from_flag("models=[{name: a, root: /a, manifest: /a.json}]").unwrap(),
            Override::from_flag("node_name=123").unwrap(),
        ];
        let config = from_yaml(ONE_MODEL, &overrides).unwrap();
        assert_eq!(config.verify.threads, 3);
        assert_eq!(config.models.len(), 1);
        assert_eq!(config.models[0].root, PathBuf::from("/a"));
        assert_eq!(
            config.node_name, "123",
            "a name stays a string even when it looks like a number"
        );
    }

    #[test]
    fn errors_name_the_key_and_the_reason() {
        let cases = [
            (
                "verify:\n  threads: many\n",
                "verify.threads",
                "invalid type",
            ),
            (
                "verify:\n  full_rescan_interval: soon\n",
                "verify.full_rescan_interval",
                "not a duration",
            ),
            ("listen: not-an-address\n", "listen", "address"),
            ("lisen: 1.2.3.4:1\n", ".", "unknown field `lisen`"),
            (
                "models:\n  - name: a\n    root: /a\n",
                "models[0]",
                "missing field `manifest`",
            ),
            (
                &format!("{ONE_MODEL}  - name: llama\n    root: /b\n    manifest: /b.json\n"),
                "models[1].name",
                "used by two models",
            ),
            (
                "verify:\n  full_rescan_interval: 1s\n",
                "verify.full_rescan_interval",
                "must be between 1m and 30days",
            ),
        ];
        for (yaml, key, reason) in cases {
            let message = from_yaml(yaml, &[]).unwrap_err().to_string();
            assert!(
                message.contains(key) && message.contains(reason),
                "{yaml:?}: {message}"
            );
            assert!(message.contains("config.yaml"), "names the file: {message}");
        }
    }

    #[test]
    fn override_errors_name_the_flag() {
        let message = from_yaml(
            ONE_MODEL,
            &[Override::from_flag("verify.threads=lots").unwrap()],
        )
        .unwrap_err()
        .to_string();
        assert!(message.contains("verify.threads"), "{message}");
        assert!(Override::from_flag("no-equals-sign").is_err());
    }

    fn env(vars: &[(&str, &str)]) -> Result<Vec<Override>, ConfigError> {
        Override::from_vars(vars.iter().map(|(k, v)| (k.into(), v.into())))
    }

    #[test]
    fn every_section_is_addressable_by_a_variable() {
        // Read off the type, not a list kept beside it: every field of Config has a key.
        let keys = top_level_keys();
        assert_eq!(keys.len(), 10, "{keys:?}");
        let values = [
            ("MLNODE_LISTEN", "127.0.0.1:1"),
            ("MLNODE_NODE_NAME", "gpu-7"),
            ("MLNODE_LOG_FORMAT", "json"),
            ("MLNODE_MODELS", "[{name: a, root: /a, manifest: /a.json}]"),
            ("MLNODE_VERIFY__THREADS", "3"),
            ("MLNODE_NVML__ENABLED", "false"),
            ("MLNODE_NEURON__ENABLED", "true"),
            ("MLNODE_KUBELET__GPU_RESOURCE_NAMES", "[example.com/gpu]"),
            (
                "MLNODE_READINESS__STARTUP_TAINT",
                "mlnode.dev/not-ready:NoSchedule",
            ),
            ("MLNODE_STARTUP__RECENT_PODS", "10"),
        ];
        let overrides = env(&values).unwrap();
        assert_eq!(overrides.len(), keys.len(), "one variable per section");
        for key in &keys {
            assert!(
                overrides
                    .iter()
                    .any(|o| o.key.split('.').next() == Some(key)),
                "{key} has no variable in this test"
            );
        }
        let config = from_yaml("", &overrides).unwrap();
        assert_eq!(config.listen.port(), 1);
        assert_eq!(config.node_name, "gpu-7");
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(config.models[0].name, "a");
        assert_eq!(config.verify.threads, 3);
        assert_eq!(config.nvml.enabled, Toggle::Off);
        assert_eq!(config.neuron.enabled, Toggle::On);
        assert_eq!(config.kubelet.gpu_resource_names, ["example.com/gpu"]);
        assert_eq!(
            config.readiness.startup_taint,
            Some("mlnode.dev/not-ready:NoSchedule".parse().unwrap())
        );
        assert_eq!(config.startup.recent_pods, 10);
    }

    #[test]
    fn variables_that_are_not_config_are_ignored_and_bad_ones_are_named() {
        // Service links of a Service named mlnode-agent, and the config path itself.
        let ignored = env(&[
            ("MLNODE_AGENT_SERVICE_HOST", "10.0.0.1"),
            ("MLNODE_AGENT_PORT_9400_TCP", "tcp://10.0.0.1:9400"),
            ("MLNODE_CONFIG", "/etc/mlnode/config.yaml"),
            ("PATH", "/bin"),
        ])
        .unwrap();
        assert!(ignored.is_empty(), "{ignored:?}");

        let cases = [
            (
                "MLNODE_READINESS__ENABLED",
                "garbage",
                "expected auto, true or false",
            ),
            (
                "MLNODE_READINESS__STARTUP_TAIN",
                "x:NoSchedule",
                "unknown field `startup_tain`",
            ),
            (
                "MLNODE_NEURON__ENABLED",
                "maybe",
                "expected auto, true or false",
            ),
            ("MLNODE_STARTUP__RECENT_PODS", "0", "out of bounds"),
            (
                "MLNODE_KUBELET__POD_RESOURCES_INTERVAL",
                "0s",
                "out of bounds",
            ),
        ];
        for (name, value, reason) in cases {
            let overrides = env(&[(name, value)]).unwrap();
            let message = from_yaml(ONE_MODEL, &overrides).unwrap_err().to_string();
            assert!(
                message.contains(&format!("variable {name}")) && message.contains(reason),
                "{name}={value}: {message}"
            );
            assert!(
                !message.contains("config.yaml"),
                "blames the file: {message}"
            );
        }
    }

    #[test]
    fn a_non_utf8_config_variable_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStringExt;
        let vars = [
            (
                "UNRELATED".into(),
                std::ffi::OsString::from_vec(vec![0xff, 0xfe]),
            ),
            (
                "MLNODE_NODE_NAME".into(),
                std::ffi::OsString::from_vec(vec![b'n', 0xff]),
            ),
        ];
        let message = Override::from_vars(vars).unwrap_err().to_string();
        assert!(
            message.contains("variable MLNODE_NODE_NAME") && message.contains("UTF-8"),
            "{message}"
        );
        let unrelated = [("UNRELATED".into(), std::ffi::OsString::from_vec(vec![0xff]))];
        assert!(Override::from_vars(unrelated).unwrap().is_empty());
    }

    /// `readiness.fatal_xids` changes NVIDIA's catalog; the list form it had before the catalog
    /// is refused saying what to write, and so are non-XIDs and an XID both added and removed.
    #[test]
    fn fatal_xids_override_the_catalog_and_are_checked() {
        let with = |xids: &str| {
            from_yaml(
                &format!("{ONE_MODEL}readiness:\n  fatal_xids: {xids}\n"),
                &[],
            )
        };
        let config = with("{add: [13], remove: [74]}").unwrap();
        let policy = config.readiness.fatal_xids.policy();
        assert!(policy.holds(13) && !policy.holds(74) && policy.holds(79));
        for (xids, says) in [
            (
                "[48, 79]",
                "a plain list of XIDs is the form before NVIDIA's catalog",
            ),
            ("{add: [0]}", "0 is not an XID: XIDs are 1 to 999"),
            ("{remove: [100000]}", "100000 is not an XID"),
            (
                "{add: [13], remove: [13]}",
                "XID 13 is both added and removed",
            ),
            ("{ad: [13]}", "unknown field `ad`"),
        ] {
            let message = with(xids).unwrap_err().to_string();
            assert!(
                message.contains("readiness.fatal_xids") && message.contains(says),
                "{xids}: {message}"
            );
        }
    }

    /// The one type repair engines act on for accelerators, by its exact name; anything else is
    /// refused naming the key and the accepted value.
    #[test]
    fn the_repair_condition_is_the_one_engines_act_on() {
        let with = |value: &str| {
            from_yaml(
                &format!("{ONE_MODEL}readiness:\n  repair_condition: {value}\n"),
                &[],
            )
        };
        assert_eq!(
            with("AcceleratedHardwareReady")
                .unwrap()
                .readiness
                .repair_condition,
            Some(RepairCondition::AcceleratedHardwareReady)
        );
        assert_eq!(with("null").unwrap().readiness.repair_condition, None);
        let message = with("AcceleratorHealthy").unwrap_err().to_string();
        assert!(
            message.contains("readiness.repair_condition")
                && message.contains("AcceleratedHardwareReady"),
            "{message}"
        );
    }

    #[test]
    fn durations_and_counts_are_bounded_and_errors_say_the_bounds() {
        let cases = [
            ("verify.full_rescan_interval", "18446744073709551615s"),
            ("verify.full_rescan_interval", "1s"),
            ("verify.stall_timeout", "1s"),
            ("verify.debounce", "1m"),
            ("verify.threads", "100000"),
            ("kubelet.pod_resources_interval", "0s"),
            ("nvml.sample_interval", "10ms"),
            ("nvml.expected_gpus", "0"),
            ("nvml.xid_count_window", "500ms"),
            ("nvml.xid_count_window", "2d"),
            ("readiness.interval", "1ms"),
            ("readiness.heartbeat", "30d"),
            ("startup.recent_max_age", "1s"),
            ("verify.max_bytes_per_second", "0"),
            ("verify.max_bytes_per_second", "512KiB"),
            ("verify.max_bytes_per_second", "1PB"),
            ("verify.max_bytes_per_second", "fast"),
            ("neuron.logical_nc_config", "4"),
            ("neuron.logical_nc_config", "lnc2"),
        ];
        for (key, value) in cases {
            let o = Override::from_flag(&format!("{key}={value}")).unwrap();
            let message = from_yaml(ONE_MODEL, &[o]).unwrap_err().to_string();
            assert!(
                message.contains(&format!("flag --set {key}={value}"))
                    && message.contains(key)
                    && [
                        "must be between",
                        "not a duration",
                        "not a byte rate",
                        "not a logical NeuronCore config",
                    ]
                    .iter()
                    .any(|reason| message.contains(reason)),
                "{key}={value}: {message}"
            );
        }
    }

    #[test]
    fn a_model_has_one_signer_and_keyless_needs_identity_and_issuer() {
        let model = |extra: &str| {
            from_yaml(&format!("{ONE_MODEL}{extra}"), &[])
                .map(|c| c.models[0].clone())
                .map_err(|e| e.to_string())
        };
        let keyless = model("    identity: ci@example.com\n    identity_provider: https://token.actions.githubusercontent.com\n    trust_root: /etc/sigstore/root.json\n").unwrap();
        assert_eq!(keyless.identity.as_deref(), Some("ci@example.com"));
        let chain =
            model("    certificate_chain: [/pki/root.pem, /pki/intermediate.pem]\n").unwrap();
        assert_eq!(chain.certificate_chain.len(), 2);
        for (extra, key, reason) in [
            ("    public_key: /k.pem\n    certificate_chain: [/c.pem]\n", "certificate_chain", "contradicts public_key"),
            ("    certificate_chain: [/c.pem]\n    identity: a@b.c\n    identity_provider: https://x\n", "identity", "contradicts certificate_chain"),
            ("    identity: a@b.c\n", "identity_provider", "needs both"),
            ("    identity_provider: https://x\n", "identity", "needs both"),
            ("    trust_root: /r.json\n", "trust_root", "keyless"),
            ("    use_staging: true\n", "use_staging", "keyless"),
            ("    identity: a@b.c\n    identity_provider: https://x\n    trust_root: /r.json\n    use_staging: true\n", "use_staging", "contradicts trust_root"),
            ("    certificate_chain: [/c.pem]\n    allow_unsigned: true\n", "allow_unsigned", "contradicts certificate_chain"),
        ] {
            let message = model(extra).unwrap_err();
            assert!(
                message.contains(&format!("models[0].{key}")) && message.contains(reason),
                "{extra}: {message}"
            );
        }
    }

    #[test]
    fn dra_drivers_are_driver_names_or_none() {
        let drivers = |list: &str| {
            from_yaml(
                &format!("{ONE_MODEL}kubelet:\n  gpu_dra_drivers: {list}\n"),
                &[],
            )
            .map(|c| c.kubelet.gpu_dra_drivers)
            .map_err(|e| e.to_string())
        };
        assert_eq!(
            drivers("[gpu.nvidia.com, gpu.example.com]").unwrap(),
            ["gpu.nvidia.com", "gpu.example.com"]
        );
        assert!(drivers("[]").unwrap().is_empty());
        for bad in [
            "[GPU.nvidia.com]",
            "[\"\"]",
            "[gpu..nvidia.com]",
            "[nvidia.com/gpu]",
        ] {
            let message = drivers(bad).unwrap_err();
            assert!(
                message.contains("kubelet.gpu_dra_drivers[0]") && message.contains("DNS subdomain"),
                "{bad}: {message}"
            );
        }
    }

    #[test]
    fn the_neuron_monitor_input_needs_its_names() {
        let o = Override::from_flag("neuron.monitor_input=/run/neuron-monitor/report").unwrap();
        let message = from_yaml(ONE_MODEL, &[o]).unwrap_err().to_string();
        assert!(
            message.contains("neuron.monitor_input") && message.contains("monitor_names: true"),
            "{message}"
        );
    }

    #[test]
    fn the_logical_nc_config_is_auto_1_or_2() {
        let lnc = |value: &str| {
            let o = Override::from_flag(&format!("neuron.logical_nc_config={value}")).unwrap();
            from_yaml(ONE_MODEL, &[o]).unwrap().neuron.logical_nc_config
        };
        assert_eq!(lnc("auto"), LogicalNcConfig::Auto);
        assert_eq!(lnc("1"), LogicalNcConfig::Fixed(1));
        assert_eq!(lnc("2"), LogicalNcConfig::Fixed(2));
    }

    #[test]
    fn a_byte_rate_is_a_number_or_a_size_with_kubernetes_style_units() {
        let rate = |value: &str| {
            let o = Override::from_flag(&format!("verify.max_bytes_per_second={value}")).unwrap();
            from_yaml(ONE_MODEL, &[o])
                .unwrap()
                .verify
                .max_bytes_per_second
        };
        assert_eq!(rate("2000000"), Some(ByteRate(2_000_000)));
        assert_eq!(rate("100MiB"), Some(ByteRate(100 << 20)));
        assert_eq!(rate("100Mi"), Some(ByteRate(100 << 20)));
        assert_eq!(rate("100M"), Some(ByteRate(100_000_000)));
        assert_eq!(rate("1.5 GB/s"), Some(ByteRate(1_500_000_000)));
        assert_eq!(
            from_yaml(ONE_MODEL, &[])
                .unwrap()
                .verify
                .max_bytes_per_second,
            None,
            "no limit unless set"
        );
    }

    #[test]
    fn the_listen_flag_is_blamed_for_its_own_value() {
        let o = Override {
            origin: "flag --listen".into(),
            key: "listen".into(),
            value: "nowhere".into(),
        };
        let message = from_yaml(ONE_MODEL, &[o]).unwrap_err().to_string();
        assert!(
            message.starts_with("config flag --listen: listen:"),
            "{message}"
        );
    }

    #[test]
    fn describe_names_where_each_changed_value_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, format!("node_name: gpu-1\n{ONE_MODEL}")).unwrap();
        let overrides = env(&[(
            "MLNODE_READINESS__STARTUP_TAINT",
            "mlnode.dev/not-ready:NoSchedule",
        )])
        .unwrap();
        let (config, sources) = load_with_sources(Some(&path), &overrides).unwrap();
        let text = describe(&config, &sources);
        let line = |key: &str| {
            text.lines()
                .find(|l| l.starts_with("#   ") && l[4..].starts_with(&format!("{key} ")))
                .unwrap_or_else(|| panic!("no origin line for {key}:\n{text}"))
                .to_string()
        };
        assert!(
            line("readiness.startup_taint").ends_with("variable MLNODE_READINESS__STARTUP_TAINT")
        );
        assert!(line("models").ends_with(&format!("file {}", path.display())));
        assert!(line("node_name").ends_with(&format!("file {}", path.display())));
        assert!(
            !text.contains("#   verify.threads"),
            "defaults are not listed:\n{text}"
        );
        // The YAML part is the config itself: it loads back to the same values.
        let reloaded: Config = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(
            reloaded.readiness.startup_taint,
            config.readiness.startup_taint
        );
        assert_eq!(
            reloaded.verify.full_rescan_interval,
            config.verify.full_rescan_interval
        );
    }

    #[test]
    fn truncated_yaml_is_an_error_naming_the_file() {
        let message = from_yaml("models:\n  - name: \"unterminated\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("config.yaml") && message.contains("YAML"),
            "{message}"
        );
    }

    #[test]
    fn embedded_default_points_at_the_example_model() {
        let config = load(None, &[]).unwrap();
        assert_eq!(config.listen, "127.0.0.1:9400".parse().unwrap());
        assert!(config.models[0].root.join("model.safetensors").is_file());
        assert!(config.models[0].manifest.is_file());
    }
}
