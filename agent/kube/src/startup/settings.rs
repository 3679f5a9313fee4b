//! The settings of the startup-phase tracker (`startup`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use mlnode_core::settings::{bounds, days, hours, minutes, Toggle, Within};

bounds! {
    pub RecentPods: usize = 1, 10_000;
    pub RecentMaxAge: Duration = minutes(1), days(7);
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
}

impl Default for StartupSettings {
    fn default() -> Self {
        StartupSettings {
            enabled: Toggle::Auto,
            recent_pods: Within::default_of(100),
            recent_max_age: Within::default_of(hours(6)),
        }
    }
}
