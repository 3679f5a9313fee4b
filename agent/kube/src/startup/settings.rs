//! The settings of the startup-phase tracker (`startup`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use mlnode_core::settings::{bounds, days, hours, millis, minutes, seconds, Toggle, Within};

bounds! {
    pub RecentPods: usize = 1, 10_000;
    pub RecentMaxAge: Duration = minutes(1), days(7);
    pub SampleInterval: Duration = millis(100), seconds(10), "a reading's rise is spread over the phases it spans: longer blurs them";
    pub MaxSamples: usize = 10, 100_000;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StartupSettings {
    /// `auto`: only inside a cluster; `true`: also with a KUBECONFIG.
    pub enabled: Toggle,
    /// `mlnode_pod_startup_last_phase_seconds` keeps this many most recent pods...
    pub recent_pods: Within<RecentPods>,
    /// ...and none older than this.
    pub recent_max_age: Within<RecentMaxAge>,
    /// containerd's content store (the folder holding `blobs/`), mounted read-only
    /// (components/image-pull, components/soci): each image pull split into transfer and
    /// unpack, and a lazily loaded image's layers named. Unset (the default), neither.
    pub content_store: Option<HostFile>,
    /// Where a lazily loaded image's bytes were fetched, from the SOCI snapshotter: off unless
    /// `metrics_socket` is set.
    pub soci: SociSettings,
}

/// `startup.soci`: the SOCI snapshotter's metrics, read-only; the image's layers are named from
/// `startup.content_store`, which it needs.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SociSettings {
    /// The snapshotter's metrics as a unix socket (`metrics_network = "unix"` and
    /// `metrics_address` in its config.toml), in a folder of its own mounted read-only; unset
    /// (the default), nothing is read.
    pub metrics_socket: Option<HostFile>,
    /// How often the metrics are read while a pod on the node is starting (never otherwise).
    pub sample_interval: Within<SampleInterval>,
    /// Readings kept for the startups in progress; the oldest go first, and a startup they no
    /// longer reach back to gets no figures for its earliest phases.
    pub max_samples: Within<MaxSamples>,
}

impl Default for SociSettings {
    fn default() -> Self {
        SociSettings {
            metrics_socket: None,
            sample_interval: Within::default_of(seconds(1)),
            max_samples: Within::default_of(1800),
        }
    }
}

/// An absolute path on the node, as the agent's container mounts it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "PathBuf", into = "PathBuf")]
pub struct HostFile(PathBuf);

impl HostFile {
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl TryFrom<PathBuf> for HostFile {
    type Error = String;

    fn try_from(path: PathBuf) -> Result<Self, String> {
        if path.is_absolute() {
            Ok(HostFile(path))
        } else {
            Err(format!(
                "{} is not an absolute path: give the path the agent's container mounts it at",
                path.display()
            ))
        }
    }
}

impl From<HostFile> for PathBuf {
    fn from(file: HostFile) -> PathBuf {
        file.0
    }
}

impl Default for StartupSettings {
    fn default() -> Self {
        StartupSettings {
            enabled: Toggle::Auto,
            recent_pods: Within::default_of(100),
            recent_max_age: Within::default_of(hours(6)),
            content_store: None,
            soci: SociSettings::default(),
        }
    }
}
