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

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::cache::settings::{ModelConfig, VerifySettings};
use crate::gpu::settings::NvmlSettings;
use crate::kernel_log::settings::KernelLogSettings;
use crate::kubelet::settings::KubeletSettings;
use crate::models::ModelMount;
use crate::neuron::settings::NeuronSettings;
use crate::rdma::settings::RdmaSettings;
use crate::readiness::settings::ReadinessSettings;
use crate::startup::settings::StartupSettings;
use mlnode_core::metrics::NodeLabel;
use mlnode_core::settings::{bounds, seconds, Within};

mod layers;
mod schema;

use layers::apply;
pub use layers::{describe, top_level_keys, Override, Sources};
pub use schema::json_schema;

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
    /// The node's name, exported on every series. Empty: `$NODE_NAME`, else the hostname.
    pub node_name: String,
    /// The label the node's name is exported as: `Hostname` (dcgm-exporter's releases),
    /// `hostname` (its main branch, #655) or `both`.
    pub hostname_label: NodeLabel,
    pub log_format: LogFormat,
    /// The most the agents a rollout starts together spread their first API requests over: each
    /// waits a random delay up to this (docs/configuration.md, "Rollouts").
    pub start_jitter: Within<StartJitter>,
    /// How long a request to the API server other than a watch may go unanswered before it
    /// counts as failed and its loop backs off.
    pub api_request_timeout: Within<ApiRequestTimeout>,
    #[serde(deserialize_with = "crate::cache::settings::unique_names")]
    pub models: Vec<ModelConfig>,
    pub verify: VerifySettings,
    pub nvml: NvmlSettings,
    pub neuron: NeuronSettings,
    pub kubelet: KubeletSettings,
    pub readiness: ReadinessSettings,
    pub startup: StartupSettings,
    pub kernel_log: KernelLogSettings,
    pub rdma: RdmaSettings,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 9400)),
            node_name: String::new(),
            hostname_label: NodeLabel::default(),
            log_format: LogFormat::Auto,
            start_jitter: Within::default_of(Duration::from_secs(1)),
            api_request_timeout: Within::default_of(seconds(30)),
            models: Vec::new(),
            verify: VerifySettings::default(),
            nvml: NvmlSettings::default(),
            neuron: NeuronSettings::default(),
            kubelet: KubeletSettings::default(),
            readiness: ReadinessSettings::default(),
            startup: StartupSettings::default(),
            kernel_log: KernelLogSettings::default(),
            rdma: RdmaSettings::default(),
        }
    }
}

bounds! {
    /// Past a minute the node's readiness gates and the pods' wait on the agent for no gain: a
    /// rollout's own pace (maxUnavailable) spreads its starts far more.
    pub StartJitter: Duration = Duration::ZERO, seconds(60);
    /// Under a second a loaded API server's ordinary latency would count as failures; past five
    /// minutes a hung connection would hold a verdict that long.
    pub ApiRequestTimeout: Duration = seconds(1), seconds(300);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// JSON when standard error is not a terminal (a container's log), text otherwise.
    Auto,
    Json,
    Text,
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
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // A section that blames one of its fields names it after the section's own key.
        let (key, reason) = match crate::settings::blamed_field(&message) {
            Some((field, reason)) => (join_key(&path, field), reason.to_string()),
            None => (path, message),
        };
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
    model_labels_possible(&config, &sources)?;
    process_attribution_possible(&config, &sources)?;
    soci_layers_nameable(&config, &sources)?;
    Ok((config, sources))
}

/// With `readiness.model_labels`, each model's name must be able to be a node label's name (and
/// a configured revision its value): refused at start, naming the model, not found out at the
/// first write.
fn model_labels_possible(config: &Config, sources: &Sources) -> Result<(), ConfigError> {
    use crate::readiness::labels::{label_syntax_problem, MODEL_LABEL_PREFIX};
    if !config.readiness.model_labels {
        return Ok(());
    }
    for (i, model) in config.models.iter().enumerate() {
        let problems = [
            ("name", label_syntax_problem(&model.name, true)),
            (
                "revision",
                model
                    .revision
                    .as_deref()
                    .and_then(|r| label_syntax_problem(r, false)),
            ),
        ];
        if let Some((field, problem)) = problems.into_iter().find_map(|(f, p)| Some((f, p?))) {
            let key = format!("models[{i}].{field}");
            let reason = format!(
                "model {:?}: its {field} cannot be a node label {}{} ({problem}); readiness.model_labels is on. Serve it under a label-safe name, or turn model_labels off",
                model.name,
                MODEL_LABEL_PREFIX,
                if field == "name" { "<name>" } else { "<name>=<revision>" },
            );
            return Err(ConfigError::Invalid {
                origin: sources.origin_of(&key, &reason),
                key,
                reason,
            });
        }
    }
    Ok(())
}

/// With `nvml.process_attribution`, the host's processes must be where `nvml.proc_root` says:
/// refused at start, not found out as every process's cgroup missing.
fn process_attribution_possible(config: &Config, sources: &Sources) -> Result<(), ConfigError> {
    let root = &config.nvml.proc_root;
    if !config.nvml.process_attribution || root.join("self/cgroup").is_file() {
        return Ok(());
    }
    let key = "nvml.proc_root".to_string();
    let reason = format!(
        "{} holds no processes (no self/cgroup); nvml.process_attribution reads each GPU process's cgroup there. Point it at a procfs, with hostPID: true (components/process-attribution)",
        root.display()
    );
    Err(ConfigError::Invalid {
        origin: sources.origin_of(&key, &reason),
        key,
        reason,
    })
}

/// The SOCI snapshotter's figures are per layer, and a pod's image's layers are named from
/// containerd's content store: a socket without the store is refused at start.
fn soci_layers_nameable(config: &Config, sources: &Sources) -> Result<(), ConfigError> {
    let startup = &config.startup;
    let (Some(socket), None) = (&startup.soci.metrics_socket, &startup.content_store) else {
        return Ok(());
    };
    let key = "startup.content_store".to_string();
    let reason = format!(
        "unset, while startup.soci.metrics_socket ({}) is set: the snapshotter's figures are per layer, and a pod's image's layers are read from containerd's content store. Set it where the store is mounted read-only (components/soci does)",
        socket.path().display()
    );
    Err(ConfigError::Invalid {
        origin: sources.origin_of(&key, &reason),
        key,
        reason,
    })
}

/// `models` and `[1].name` make `models[1].name`; `readiness` and `interval`,
/// `readiness.interval`; the top level (`.`) adds nothing.
fn join_key(path: &str, field: &str) -> String {
    match (path, field) {
        (".", field) => field.to_string(),
        (path, "") => path.to_string(),
        (path, field) if field.starts_with('[') => format!("{path}{field}"),
        (path, field) => format!("{path}.{field}"),
    }
}

/// A config file is small; a larger one is a mistake (or not a config file).
const CONFIG_FILE_LIMIT: u64 = 4 << 20;

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

/// Where pods mount `model`'s cache from: what the startup tracker and the pod gates match pods'
/// volumes against.
pub fn model_mount(model: &ModelConfig) -> ModelMount {
    ModelMount {
        name: model.name.clone(),
        root: model.root.clone(),
        host_path: model.host_path.clone(),
        pvc: model.pvc.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cache::manifest::{SigstoreRoot, TrustPolicy};
    use crate::cache::settings::ByteRate;
    use crate::neuron::settings::LogicalNcConfig;
    use crate::readiness::settings::RepairCondition;

    pub(super) fn from_yaml(yaml: &str, overrides: &[Override]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        load(Some(&path), overrides)
    }

    pub(super) const ONE_MODEL: &str =
        "models:\n  - name: llama\n    root: /models/llama\n    manifest: /m/llama.json\n";

    #[test]
    fn a_models_node_selector_selects_nodes_with_every_label_it_names() {
        let config = from_yaml(
            "models:\n  - name: qwen\n    root: /models/qwen\n    manifest: /m/q.json\n    node_selector: {pool: gpu, karpenter.sh/capacity-type: on-demand}\n  - name: any\n    root: /models/any\n    manifest: /m/a.json\n",
            &[],
        )
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let both = labels(&[
            ("pool", "gpu"),
            ("karpenter.sh/capacity-type", "on-demand"),
            ("zone", "a"),
        ]);
        let one = labels(&[("pool", "gpu")]);
        let other = labels(&[("pool", "gpu"), ("karpenter.sh/capacity-type", "spot")]);
        assert!(config.models[0].selects(&both));
        assert!(!config.models[0].selects(&one));
        assert!(!config.models[0].selects(&other));
        assert!(
            config.models[1].selects(&labels(&[])),
            "no selector: every node"
        );
        let refused = from_yaml(
            "models:\n  - name: q\n    root: /q\n    manifest: /q.json\n    node_selector: {pool: [gpu]}\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(refused.contains("models[0].node_selector"), "{refused}");
    }

    #[test]
    fn file_values_and_defaults() {
        let config = from_yaml(&format!("listen: 127.0.0.1:9999\nnode_name: gpu-1\n{ONE_MODEL}verify:\n  full_rescan_interval: 12h\n"), &[]).unwrap();
        assert_eq!(config.listen.port(), 9999);
        assert_eq!(config.node_name, "gpu-1");
        assert_eq!(config.models[0].name, "llama");
        assert_eq!(
            *config.verify.full_rescan_interval,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(*config.verify.threads, 0);
    }

    #[test]
    fn with_model_labels_a_name_that_cannot_be_a_label_is_refused_naming_the_model() {
        let hf_name = "models:\n  - name: meta-llama/Llama-3.1-8B\n    root: /models/llama\n    manifest: /m/llama.json\n";
        assert!(from_yaml(hf_name, &[]).is_ok(), "fine without labels");
        let on = [Override::from_flag("readiness.model_labels=true").unwrap()];
        let error = from_yaml(hf_name, &on).unwrap_err().to_string();
        assert!(
            error.contains("models[0].name")
                && error.contains("\"meta-llama/Llama-3.1-8B\"")
                && error.contains("'/'"),
            "{error}"
        );
        let revision = format!("{ONE_MODEL}    revision: refs/pr/1\n");
        let error = from_yaml(&revision, &on).unwrap_err().to_string();
        assert!(error.contains("models[0].revision"), "{error}");
        assert!(from_yaml(ONE_MODEL, &on).unwrap().readiness.model_labels);
    }

    #[test]
    fn the_soci_socket_without_the_content_store_is_refused_naming_the_setting() {
        let socket = "startup:\n  soci:\n    metrics_socket: /run/soci-metrics/metrics.sock\n";
        let error = from_yaml(socket, &[]).unwrap_err().to_string();
        assert!(
            error.contains("startup.content_store") && error.contains("components/soci"),
            "{error}"
        );
        let both = format!(
            "{socket}  content_store: /var/lib/containerd/io.containerd.content.v1.content\n"
        );
        assert!(from_yaml(&both, &[])
            .unwrap()
            .startup
            .content_store
            .is_some());
    }

    #[test]
    fn process_attribution_without_a_procfs_is_refused_naming_the_setting() {
        let empty = tempfile::tempdir().unwrap();
        let yaml = format!(
            "nvml:\n  process_attribution: true\n  proc_root: {:?}\n",
            empty.path().display().to_string()
        );
        let error = from_yaml(&yaml, &[]).unwrap_err().to_string();
        assert!(
            error.contains("nvml.proc_root") && error.contains("hostPID"),
            "{error}"
        );
        let on = from_yaml("nvml:\n  process_attribution: true\n", &[]).unwrap();
        assert_eq!(on.nvml.proc_root, std::path::Path::new("/proc"));
    }

    #[test]
    fn a_pod_label_pattern_that_is_no_regular_expression_is_refused_naming_it() {
        let error = from_yaml("kubelet:\n  pod_labels: [app, 'team(']\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("kubelet.pod_labels") && error.contains("\"team(\""),
            "{error}"
        );
        let error = from_yaml("kubelet:\n  max_pod_labels: 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("kubelet.max_pod_labels"), "{error}");
        let ok = from_yaml(
            "kubelet:\n  pod_uid: true\n  pod_labels: ['app\\.kubernetes\\.io/.*']\n",
            &[],
        )
        .unwrap();
        assert!(!ok.kubelet.holder_labels().is_off());
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
        let policy = config.readiness.fatal_xids;
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

    /// `readiness.xid_thresholds` replaces the defaults (13 and 31, more than 3 within an hour);
    /// an XID out of range, a count or window out of bounds, a missing key are refused by name.
    #[test]
    fn xid_thresholds_are_checked() {
        let with = |map: &str| {
            from_yaml(
                &format!("{ONE_MODEL}readiness:\n  xid_thresholds: {map}\n"),
                &[],
            )
        };
        let defaults = from_yaml(ONE_MODEL, &[]).unwrap().readiness.xid_thresholds;
        assert_eq!(defaults.0.keys().copied().collect::<Vec<_>>(), [13, 31]);
        let config = with("{43: {count: 2, window: 30m}}").unwrap();
        let thresholds = config.readiness.xid_thresholds.0;
        assert_eq!(thresholds.keys().copied().collect::<Vec<_>>(), [43]);
        assert_eq!(thresholds[&43].count.get(), 2);
        assert_eq!(thresholds[&43].window.get(), Duration::from_secs(1800));
        for (map, says) in [
            (
                "{0: {count: 2, window: 1h}}",
                "0 is not an XID: XIDs are 1 to 999",
            ),
            (
                "{13: {count: 0, window: 1h}}",
                "must be between 1 and 10000",
            ),
            (
                "{13: {count: 2, window: 10s}}",
                "must be between 1m and 7days",
            ),
            ("{13: {count: 2}}", "missing field `window`"),
        ] {
            let message = with(map).unwrap_err().to_string();
            assert!(
                message.contains("readiness.xid_thresholds") && message.contains(says),
                "{map}: {message}"
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
            ("nvml.nvlink_error_window", "30s"),
            ("nvml.release_timeout", "1s"),
            ("nvml.release_timeout", "2h"),
            ("nvml.nvlink_error_window", "2d"),
            ("readiness.interval", "1ms"),
            ("readiness.heartbeat", "30d"),
            ("startup.recent_max_age", "1s"),
            ("verify.max_bytes_per_second", "0"),
            ("verify.max_bytes_per_second", "512KiB"),
            ("verify.max_bytes_per_second", "1PB"),
            ("verify.max_bytes_per_second", "fast"),
            ("neuron.logical_nc_config", "4"),
            ("neuron.logical_nc_config", "lnc2"),
            ("start_jitter", "2m"),
            ("api_request_timeout", "0s"),
            ("verify.restart_jitter", "1h"),
            ("verify.trust_unchanged_after_restart", "sometimes"),
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
                        "expected a boolean",
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
        match keyless.signer {
            TrustPolicy::Sigstore(signer) => {
                assert_eq!(signer.identity, "ci@example.com");
                assert_eq!(
                    signer.root,
                    SigstoreRoot::File("/etc/sigstore/root.json".into())
                );
            }
            other => panic!("{other:?}"),
        }
        let chain =
            model("    certificate_chain: [/pki/root.pem, /pki/intermediate.pem]\n").unwrap();
        assert!(matches!(chain.signer, TrustPolicy::CertificateChain(files) if files.len() == 2));
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
            .map(|c| {
                let drivers = c.kubelet.gpu_dra_drivers.iter();
                drivers.map(|d| d.as_str().to_string()).collect::<Vec<_>>()
            })
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
        assert_eq!(rate("2000000"), Some(ByteRate::new(2_000_000).unwrap()));
        assert_eq!(rate("100MiB"), Some(ByteRate::new(100 << 20).unwrap()));
        assert_eq!(rate("100Mi"), Some(ByteRate::new(100 << 20).unwrap()));
        assert_eq!(rate("100M"), Some(ByteRate::new(100_000_000).unwrap()));
        assert_eq!(
            rate("1.5 GB/s"),
            Some(ByteRate::new(1_500_000_000).unwrap())
        );
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
