//! The settings of model-cache verification: the models (`models`) and how they are kept
//! verified (`verify`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::manifest::{SignerFields, TrustPolicy};
use mlnode_core::settings::{
    bounds, days, invalid_field, millis, minutes, seconds, NumberOrText, Within,
};

/// A model to keep verified. Read whole or refused: a model without a name, a root or a manifest,
/// or with contradicting signers, is never built.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ModelConfig {
    /// The served model name (vLLM's `--served-model-name`), exported as `model_name`.
    pub name: String,
    /// A plain model directory or a Hugging Face repo cache folder.
    pub root: PathBuf,
    /// Native manifest or model_signing bundle.
    pub manifest: PathBuf,
    #[serde(default)]
    pub revision: Option<String>,
    /// Who must have signed a model_signing bundle: `public_key` (`model_signing verify key`),
    /// `certificate_chain` (`verify certificate`), `identity` with `identity_provider` and
    /// optionally `trust_root` or `use_staging` (`verify sigstore`), or `allow_unsigned`.
    #[serde(flatten, deserialize_with = "signer")]
    pub signer: TrustPolicy,
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
    /// The labels a node must carry, each with this value, for the model to be kept there: one
    /// install serving other models on other pools (GPU and Inferentia, or two GPU pools). Empty:
    /// every node. Read from the agent's own Node at start.
    #[serde(default)]
    pub node_selector: std::collections::BTreeMap<String, String>,
}

impl ModelConfig {
    /// Whether a node with `labels` is one of the model's.
    pub fn selects(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }
}

impl<'de> Deserialize<'de> for ModelConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let model = ModelConfig::deserialize(deserializer)?;
        if model.name.trim().is_empty() {
            return Err(invalid_field(
                "name",
                "must not be empty: it is the model_name label",
            ));
        }
        if model.root.as_os_str().is_empty() {
            return Err(invalid_field("root", "must name the model directory"));
        }
        if model.manifest.as_os_str().is_empty() {
            return Err(invalid_field("manifest", "must name the manifest file"));
        }
        Ok(model)
    }
}

/// The signer fields flattened into a model, as the one policy they give; a conflict blames its
/// field by its key.
fn signer<'de, D: Deserializer<'de>>(deserializer: D) -> Result<TrustPolicy, D::Error> {
    TrustPolicy::try_from(SignerFields::deserialize(deserializer)?).map_err(|conflict| {
        invalid_field(
            conflict.field.key(),
            conflict.why(|field| field.key().to_string()),
        )
    })
}

impl Serialize for ModelConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ModelConfig::serialize(self, serializer)
    }
}

/// `models`: each name once, since it is the `model_name` label and a pod's annotation.
pub fn unique_names<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ModelConfig>, D::Error> {
    let models = Vec::<ModelConfig>::deserialize(deserializer)?;
    let mut names = std::collections::HashSet::new();
    for (i, model) in models.iter().enumerate() {
        if !names.insert(model.name.as_str()) {
            return Err(invalid_field(
                &format!("[{i}].name"),
                format!("{:?} is used by two models", model.name),
            ));
        }
    }
    Ok(models)
}

bounds! {
    /// Hashing threads beyond this only cost memory and start-up time: hashing is bound by cores
    /// and storage long before. 0 is one per core.
    pub Threads: usize = 0, 256;
    /// Past 30 days a "periodic" rescan is no rescan, and far beyond it the monitor's clock
    /// overflows.
    pub FullRescan: Duration = minutes(1), days(30);
    pub Debounce: Duration = Duration::ZERO, seconds(30),
        "a longer debounce leaves a corrupted file unreported for that long";
    pub StallTimeout: Duration = seconds(10), days(1);
    /// Past half an hour a rollout's hashing is spread thinner than any storage needs, and a
    /// changed cache waits that long to be found.
    pub RestartJitter: Duration = Duration::ZERO, minutes(30);
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifySettings {
    /// Hashing threads shared by all models; 0 = one per core.
    pub threads: Within<Threads>,
    /// Full re-verification, for what no file event reports (bit rot, a missed event).
    pub full_rescan_interval: Within<FullRescan>,
    /// How long file events are collected before the files they name are re-verified.
    pub debounce: Within<Debounce>,
    /// A verification whose hashed byte count does not move for this long makes /healthz fail.
    pub stall_timeout: Within<StallTimeout>,
    /// CPU and I/O priority of `serve`'s hashing (docs/cache-verification.md, "Priority").
    pub priority: PrioritySetting,
    /// The most bytes per second `serve` reads from all model caches together, for network file
    /// systems where a full re-read costs money and bandwidth; unset: no limit.
    pub max_bytes_per_second: Option<ByteRate>,
    /// A restarted agent takes as verified what a previous agent of this boot verified, for every
    /// file that is as it was then (one look at each, no read), and hashes the rest
    /// (docs/cache-verification.md, "Restarts").
    pub trust_unchanged_after_restart: bool,
    /// The most a restarted agent delays a full hash it cannot skip because the previous agent's
    /// record is of another manifest or other settings (a rollout that changed them): a random
    /// delay up to this, so a fleet's agents do not all read shared storage at once. Never while
    /// the node is held by the startup taint.
    pub restart_jitter: Within<RestartJitter>,
}

impl Default for VerifySettings {
    fn default() -> Self {
        VerifySettings {
            threads: Within::default_of(0),
            full_rescan_interval: Within::default_of(days(1)),
            debounce: Within::default_of(millis(500)),
            stall_timeout: Within::default_of(Duration::from_secs(300)),
            priority: PrioritySetting::Auto,
            max_bytes_per_second: None,
            trust_unchanged_after_restart: true,
            restart_jitter: Within::default_of(seconds(60)),
        }
    }
}

/// A read rate in bytes per second: a number (`104857600`) or a size with a unit (`100MiB`,
/// `1.5 GB`; `Mi`/`MiB` are powers of 1,024, `M`/`MB` of 1,000, as in Kubernetes quantities).
/// Below 1 MiB/s a 140 GB model takes 40 hours to re-read, longer than the daily rescan; above
/// 100 GiB/s no storage a node has is limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRate(u64);

impl ByteRate {
    const MIN: u64 = 1 << 20;
    const MAX: u64 = 100 << 30;

    pub fn new(rate: u64) -> Result<ByteRate, String> {
        if !(Self::MIN..=Self::MAX).contains(&rate) {
            return Err(format!(
                "{rate} bytes/s is out of bounds: must be between {} (1 MiB/s) and {} (100 GiB/s)",
                Self::MIN,
                Self::MAX
            ));
        }
        Ok(ByteRate(rate))
    }

    pub fn bytes_per_second(self) -> u64 {
        self.0
    }
}

impl Serialize for ByteRate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let rate = match NumberOrText::deserialize(deserializer)? {
            NumberOrText::Number(n) => n,
            NumberOrText::Text(text) => {
                let size = text.trim().trim_end_matches("/s");
                size.parse::<bytesize::ByteSize>()
                    .map(|size| size.as_u64())
                    .map_err(|e| {
                        serde::de::Error::custom(format!(
                            "{text:?} is not a byte rate such as 104857600, \"100MiB\" or \"1GB\": {e}"
                        ))
                    })?
            }
        };
        ByteRate::new(rate).map_err(serde::de::Error::custom)
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
