//! The settings of the kernel log source (`kernel_log`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use mlnode_core::settings::{bounds, millis, seconds, Within};

bounds! {
    /// How often a quiet journal is looked at when inotify says nothing (and how soon a stop is
    /// seen): under 100 ms is a busy loop, over a minute a fault reported late.
    pub PollInterval: Duration = millis(100), seconds(60);
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelLogSettings {
    /// Opt-in (components/kernel-log, the chart's kernelLog.enabled): read the node's journal.
    pub enabled: bool,
    /// libsystemd, whose sd-journal API reads the journal: a name the dynamic loader finds, or a
    /// path. The agent's image ships Debian's libsystemd0.
    pub library: PathBuf,
    /// The journal directories, each read when it exists: the persistent one and the volatile one
    /// journald uses when there is none (systemd-journald.service(8)).
    pub journal_dirs: Vec<PathBuf>,
    /// This boot's id: only its kernel entries are read.
    pub boot_id_file: PathBuf,
    pub poll_interval: Within<PollInterval>,
}

impl Default for KernelLogSettings {
    fn default() -> Self {
        KernelLogSettings {
            enabled: false,
            library: PathBuf::from("libsystemd.so.0"),
            journal_dirs: vec!["/var/log/journal".into(), "/run/log/journal".into()],
            boot_id_file: "/proc/sys/kernel/random/boot_id".into(),
            poll_interval: Within::default_of(seconds(1)),
        }
    }
}
