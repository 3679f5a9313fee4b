//! Where the configuration's values come from: the file (or the embedded default), `MLNODE_*`
//! variables and `--set` flags layered over it by key path, the origin of each value for errors,
//! and `mlnode-agent config`'s account of what differs from the defaults.

use serde_json::Value;

use super::{Config, ConfigError};

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
    pub(super) base: String,
    pub(super) overrides: Vec<(String, String)>,
    /// Where `node_name` came from when neither the file nor an override set it.
    pub(super) node_name: Option<String>,
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

pub(super) fn apply(tree: &mut Value, o: &Override) -> Result<(), ConfigError> {
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
    use std::path::PathBuf;

    use super::super::tests::{from_yaml, ONE_MODEL};
    use super::super::{load_with_sources, LogFormat};
    use super::*;
    use crate::settings::Toggle;
    use mlnode_core::metrics::NodeLabel;

    #[test]
    fn overrides_replace_file_values_by_key_path() {
        let overrides = [
            Override::from_flag("verify.threads=3").unwrap(),
            Override::from_flag("models=[{name: a, root: /a, manifest: /a.json}]").unwrap(),
            Override::from_flag("node_name=123").unwrap(),
        ];
        let config = from_yaml(ONE_MODEL, &overrides).unwrap();
        assert_eq!(*config.verify.threads, 3);
        assert_eq!(config.models.len(), 1);
        assert_eq!(config.models[0].root, PathBuf::from("/a"));
        assert_eq!(
            config.node_name, "123",
            "a name stays a string even when it looks like a number"
        );
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
        assert_eq!(keys.len(), 15, "{keys:?}");
        let values = [
            ("MLNODE_LISTEN", "127.0.0.1:1"),
            ("MLNODE_NODE_NAME", "gpu-7"),
            ("MLNODE_HOSTNAME_LABEL", "both"),
            ("MLNODE_LOG_FORMAT", "json"),
            ("MLNODE_START_JITTER", "5s"),
            ("MLNODE_API_REQUEST_TIMEOUT", "10s"),
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
            ("MLNODE_KERNEL_LOG__ENABLED", "true"),
            ("MLNODE_RDMA__ENABLED", "false"),
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
        assert_eq!(config.hostname_label, NodeLabel::Both);
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(config.start_jitter.get(), std::time::Duration::from_secs(5));
        assert_eq!(
            config.api_request_timeout.get(),
            std::time::Duration::from_secs(10)
        );
        assert_eq!(config.models[0].name, "a");
        assert_eq!(*config.verify.threads, 3);
        assert_eq!(config.nvml.enabled, Toggle::Off);
        assert_eq!(config.neuron.enabled, Toggle::On);
        assert_eq!(config.kubelet.gpu_resource_names, ["example.com/gpu"]);
        assert_eq!(
            config.readiness.startup_taint,
            Some("mlnode.dev/not-ready:NoSchedule".parse().unwrap())
        );
        assert_eq!(*config.startup.recent_pods, 10);
        assert!(config.kernel_log.enabled);
        assert_eq!(config.rdma.enabled, Toggle::Off);
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
}
