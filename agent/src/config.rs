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

use serde::{Deserialize, Deserializer};
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

/// The keys of [`Config`], for telling config variables from other `MLNODE_*` variables.
const TOP_LEVEL_KEYS: [&str; 7] = [
    "listen",
    "node_name",
    "log_format",
    "models",
    "verify",
    "nvml",
    "kubelet",
];

#[derive(Clone, Debug, Deserialize)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// JSON when standard error is not a terminal (a container's log), text otherwise.
    Auto,
    Json,
    Text,
}

#[derive(Clone, Debug, Deserialize)]
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
    /// PEM key that must have signed a model_signing bundle.
    #[serde(default)]
    pub public_key: Option<PathBuf>,
    #[serde(default)]
    pub allow_unsigned: bool,
    #[serde(default)]
    pub fail_on_extra: bool,
    /// Where the cache is on the node, when the agent sees it at another path (`root` is the path
    /// inside the agent's container): how pods mounting it by hostPath are matched to the model.
    #[serde(default)]
    pub host_path: Option<PathBuf>,
    /// The PersistentVolumeClaim pods mount the cache from, if they do.
    #[serde(default)]
    pub pvc: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifySettings {
    /// Hashing threads shared by all models; 0 = one per core.
    pub threads: usize,
    /// Full re-verification, for what no file event reports (bit rot, a missed event).
    #[serde(deserialize_with = "duration")]
    pub full_rescan_interval: Duration,
    /// How long file events are collected before the files they name are re-verified.
    #[serde(deserialize_with = "duration")]
    pub debounce: Duration,
    /// A verification whose hashed byte count does not move for this long makes /healthz fail.
    #[serde(deserialize_with = "duration")]
    pub stall_timeout: Duration,
}

impl Default for VerifySettings {
    fn default() -> Self {
        VerifySettings {
            threads: 0,
            full_rescan_interval: Duration::from_secs(24 * 3600),
            debounce: Duration::from_millis(500),
            stall_timeout: Duration::from_secs(300),
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

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlSettings {
    pub enabled: Toggle,
    /// The NVML library: a name the dynamic loader finds, or a path.
    pub library: PathBuf,
    /// How often every GPU is read (also the resolution of the clock-event-reason seconds).
    #[serde(deserialize_with = "duration")]
    pub sample_interval: Duration,
    /// Also export dcgm-exporter's DCGM_FI_* series, for nodes that run no dcgm-exporter.
    pub dcgm_names: bool,
    /// `Hostname` (dcgm-exporter 3.x and before) or `hostname` (its newer releases): with
    /// `hostname`, GPU series carry both.
    pub hostname_label: String,
    /// `current` (`pod`, `namespace`, `container`) or `legacy` (`pod_name`, `pod_namespace`,
    /// `container_name`, dcgm-exporter before 2.x).
    pub pod_labels: String,
}

impl Default for NvmlSettings {
    fn default() -> Self {
        NvmlSettings {
            enabled: Toggle::Auto,
            library: PathBuf::from("libnvidia-ml.so.1"),
            sample_interval: Duration::from_secs(1),
            dcgm_names: false,
            hostname_label: "Hostname".into(),
            pod_labels: "current".into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NeuronSettings {
    /// `auto`: on where `sysfs_root` exists.
    pub enabled: Toggle,
    pub sysfs_root: PathBuf,
    /// The `instance_type` label; empty: what the driver reports in `info/architecture/instance_type`.
    /// Set it from the node's `node.kubernetes.io/instance-type` label; the agent never asks the
    /// instance metadata service.
    pub instance_type: String,
    /// Adds an `availability_zone` label (the node's `topology.kubernetes.io/zone`) when set.
    pub availability_zone: String,
}

impl Default for NeuronSettings {
    fn default() -> Self {
        NeuronSettings {
            enabled: Toggle::Auto,
            sysfs_root: PathBuf::from("/sys/devices/virtual/neuron_device"),
            instance_type: String::new(),
            availability_zone: String::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletSettings {
    /// The kubelet pod-resources API (read-only), for the pod/namespace/container of each device.
    pub pod_resources_socket: PathBuf,
    /// Extended resource names whose devices are NVIDIA GPUs (device ids are GPU UUIDs).
    pub gpu_resource_names: Vec<String>,
    /// Extended resources whose device ids are Neuron device indexes.
    pub neuron_device_resource_names: Vec<String>,
    /// Extended resources whose device ids are global NeuronCore indexes.
    pub neuron_core_resource_names: Vec<String>,
    /// How often the assignments are listed again.
    #[serde(deserialize_with = "duration")]
    pub pod_resources_interval: Duration,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        KubeletSettings {
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            gpu_resource_names: vec!["nvidia.com/gpu".into()],
            neuron_device_resource_names: vec![
                "aws.amazon.com/neuron".into(),
                "aws.amazon.com/neurondevice".into(),
            ],
            neuron_core_resource_names: vec!["aws.amazon.com/neuroncore".into()],
            pod_resources_interval: Duration::from_secs(10),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaintMode {
    /// Remove the taint once, the first time every gate passes; never add it back.
    BootstrapOnly,
    /// Keep the taint exactly while a gate fails (a corrupted cache drains new pods away).
    Continuous,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadinessSettings {
    /// `auto`: on where a Kubernetes config is found (in-cluster or KUBECONFIG).
    pub enabled: Toggle,
    /// `key[=value]:Effect` of a taint to remove when every gate first passes; empty: none.
    pub startup_taint: String,
    pub taint_mode: TaintMode,
    /// XIDs that fail `AcceleratorHealthy` (NVIDIA's "reset the GPU or drain the node" list).
    pub fatal_xids: Vec<u64>,
    /// How often the gates are evaluated.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Conditions are rewritten at least this often even when unchanged.
    #[serde(deserialize_with = "duration")]
    pub heartbeat: Duration,
}

impl Default for ReadinessSettings {
    fn default() -> Self {
        ReadinessSettings {
            enabled: Toggle::Auto,
            startup_taint: String::new(),
            taint_mode: TaintMode::BootstrapOnly,
            fatal_xids: vec![48, 62, 63, 64, 74, 79, 92, 94, 95],
            interval: Duration::from_secs(10),
            heartbeat: Duration::from_secs(300),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StartupSettings {
    /// `auto`: only inside a cluster; `true`: also with a KUBECONFIG.
    pub enabled: Toggle,
    /// `mlnode_pod_startup_last_phase_seconds` keeps this many most recent pods...
    pub recent_pods: usize,
    /// ...and none older than this.
    #[serde(deserialize_with = "duration")]
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

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "{text:?} is not a duration such as \"500ms\", \"30s\" or \"24h\": {e}"
        ))
    })
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

/// Where an override came from, so an error can name it.
pub struct Override {
    pub origin: String,
    pub key: String,
    pub value: String,
}

impl Override {
    /// `MLNODE_VERIFY__THREADS=4` → `verify.threads`. Only variables that address one of the
    /// config's top-level keys count: Kubernetes injects `MLNODE_AGENT_SERVICE_HOST` and the like
    /// for a Service named mlnode-agent, and those must not stop the agent.
    pub fn from_env() -> Vec<Override> {
        let mut overrides: Vec<Override> = std::env::vars()
            .filter_map(|(name, value)| {
                let key = name
                    .strip_prefix("MLNODE_")?
                    .to_ascii_lowercase()
                    .replace("__", ".");
                let top = key.split('.').next().unwrap_or_default();
                TOP_LEVEL_KEYS.contains(&top).then(|| Override {
                    origin: format!("variable {name}"),
                    key,
                    value,
                })
            })
            .collect();
        overrides.sort_by(|a, b| a.key.cmp(&b.key));
        overrides
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

/// Builds the configuration from an optional YAML file and overrides, and checks it.
pub fn load(file: Option<&Path>, overrides: &[Override]) -> Result<Config, ConfigError> {
    let (origin, text) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            (format!("file {}", path.display()), text)
        }
        None => ("embedded default".to_string(), embedded_default_yaml()),
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
            origin,
            key: "$".into(),
            reason: "the top level must be a mapping of keys".into(),
        });
    }
    for o in overrides {
        apply(&mut tree, o)?;
    }
    let mut config: Config =
        serde_path_to_error::deserialize(tree).map_err(|e| ConfigError::Invalid {
            origin: origin.clone(),
            key: e.path().to_string(),
            reason: e.into_inner().to_string(),
        })?;
    if config.node_name.is_empty() {
        config.node_name = default_node_name();
    }
    validate(&config).map_err(|(key, reason)| ConfigError::Invalid {
        origin,
        key,
        reason,
    })?;
    Ok(config)
}

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

fn default_node_name() -> String {
    if let Ok(name) = std::env::var("NODE_NAME") {
        if !name.is_empty() {
            return name;
        }
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

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
        if model.public_key.is_some() && model.allow_unsigned {
            return Err((
                key("allow_unsigned"),
                "contradicts public_key: give one or the other".into(),
            ));
        }
    }
    let verify = &config.verify;
    if verify.full_rescan_interval < Duration::from_secs(60) {
        return Err((
            "verify.full_rescan_interval".into(),
            "must be at least 1m".into(),
        ));
    }
    if verify.debounce > Duration::from_secs(30) {
        return Err((
            "verify.debounce".into(),
            "must be at most 30s, or a corrupted file goes unreported for that long".into(),
        ));
    }
    if verify.stall_timeout < Duration::from_secs(10) {
        return Err(("verify.stall_timeout".into(), "must be at least 10s".into()));
    }
    let readiness = &config.readiness;
    if !readiness.startup_taint.is_empty() {
        crate::readiness::node::parse_taint(&readiness.startup_taint)
            .map_err(|reason| ("readiness.startup_taint".to_string(), reason))?;
    }
    if readiness.interval < Duration::from_millis(100) || readiness.heartbeat < readiness.interval {
        return Err((
            "readiness.interval".into(),
            "must be at least 100ms and at most readiness.heartbeat".into(),
        ));
    }
    let nvml = &config.nvml;
    if !["Hostname", "hostname"].contains(&nvml.hostname_label.as_str()) {
        return Err((
            "nvml.hostname_label".into(),
            format!("{:?}: expected Hostname or hostname", nvml.hostname_label),
        ));
    }
    if !["current", "legacy"].contains(&nvml.pod_labels.as_str()) {
        return Err((
            "nvml.pod_labels".into(),
            format!("{:?}: expected current or legacy", nvml.pod_labels),
        ));
    }
    if nvml.sample_interval < Duration::from_millis(100)
        || nvml.sample_interval > Duration::from_secs(60)
    {
        return Err((
            "nvml.sample_interval".into(),
            "must be between 100ms and 60s".into(),
        ));
    }
    Ok(())
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
                "at least 1m",
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

    #[test]
    fn every_top_level_key_is_addressable_by_a_variable() {
        for key in TOP_LEVEL_KEYS {
            let value = match key {
                "listen" => "127.0.0.1:1",
                "models" => "[]",
                "verify" => "{threads: 1}",
                "log_format" => "json",
                "nvml" => "{enabled: false}",
                "neuron" => "{enabled: false}",
                "readiness" => "{taint_mode: continuous}",
                "startup" => "{recent_pods: 10}",
                "kubelet" => "{gpu_resource_names: [nvidia.com/gpu]}",
                _ => "x",
            };
            let o = Override {
                origin: "test".into(),
                key: key.into(),
                value: value.into(),
            };
            from_yaml("", &[o]).unwrap_or_else(|e| panic!("{key}: {e}"));
        }
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
