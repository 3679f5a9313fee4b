//! The settings of the GPU collector (`nvml`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{MapAccess, SeqAccess};
use serde::{Deserialize, Deserializer, Serialize};

use super::xid::{XidPolicy, XidThreshold, XidThresholds};
use mlnode_core::settings::{
    bounds, days, invalid_field, millis, minutes, seconds, Toggle, Within,
};

bounds! {
    pub SampleInterval: Duration = millis(100), minutes(1);
    /// The most GPUs an instance type has is 8 (16 on a few); 64 is a typo's bound.
    pub ExpectedGpus: u32 = 1, 64;
    pub XidCountWindow: Duration = seconds(1), days(1);
    pub NvLinkErrorWindow: Duration = minutes(1), days(1);
    pub ReleaseTimeout: Duration = seconds(5), minutes(60);
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
    pub sample_interval: Within<SampleInterval>,
    /// Also export dcgm-exporter's DCGM_FI_* series, for nodes that run no dcgm-exporter.
    pub dcgm_names: bool,
    /// `current` (`pod`, `namespace`, `container`) or `legacy` (`pod_name`, `pod_namespace`,
    /// `container_name`, dcgm-exporter before 2.x).
    pub pod_labels: PodLabels,
    /// Where the kernel lists PCI devices: NVML's GPUs are checked against the NVIDIA GPUs there.
    pub pci_devices: PathBuf,
    /// The GPUs this node should have (8 on a p5.48xlarge): fewer on the PCI bus fails
    /// `AcceleratorHealthy`, which catches a GPU gone from the bus itself. Unset: not checked.
    pub expected_gpus: Option<Within<ExpectedGpus>>,
    /// How far back `DCGM_EXP_XID_ERRORS_COUNT` counts XIDs (dcgm-exporter's
    /// `--xid-count-window-size`, 5 minutes by default there too).
    pub xid_count_window: Within<XidCountWindow>,
    /// How long a rise in a GPU's NVLink recovery errors (a link retrained) fails
    /// `AcceleratorHealthy` after the last one: a link that keeps recovering is about to drop,
    /// and one quiet for the window is trusted again.
    pub nvlink_error_window: Within<NvLinkErrorWindow>,
    /// Let go of NVML when the driver asks for a GPU reset, so the reset can proceed (on by
    /// default). Off: the agent keeps reading, and a reset tool that needs the GPU free must stop it.
    pub release_for_reset: bool,
    /// The longest the agent holds no NVML handle while a GPU the driver asked to reset is being
    /// reset; then it takes NVML back and says so.
    pub release_timeout: Within<ReleaseTimeout>,
    /// Opt-in (components/process-attribution, the chart's processAttribution.enabled): each
    /// GPU's processes, their framebuffer and SM use, summed per container of the pod that owns
    /// them (`mlnode_gpu_pod_*`). Needs `hostPID: true`: NVML names processes by the host's pids.
    pub process_attribution: bool,
    /// The host's `/proc` as the agent sees it (its own, with hostPID): a pid's cgroup names its
    /// pod and container.
    pub proc_root: PathBuf,
}

impl Default for NvmlSettings {
    fn default() -> Self {
        NvmlSettings {
            enabled: Toggle::Auto,
            library: PathBuf::from("libnvidia-ml.so.1"),
            sample_interval: Within::default_of(seconds(1)),
            dcgm_names: false,
            pod_labels: PodLabels::Current,
            pci_devices: PathBuf::from("/sys/bus/pci/devices"),
            expected_gpus: None,
            xid_count_window: Within::default_of(minutes(5)),
            nvlink_error_window: Within::default_of(minutes(15)),
            release_for_reset: true,
            release_timeout: Within::default_of(minutes(10)),
            process_attribution: false,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// XIDs are small numbers (the driver's newest is in the 170s; NVML reports 999 for one it cannot
/// name): anything past this is a typo.
const MAX_XID: u64 = 999;

/// `readiness.fatal_xids` is the policy itself: a map of the two lists, each XID in range and in
/// one list only. The plain list this key held before the catalog is refused saying what to write
/// instead, not read as something else.
impl<'de> Deserialize<'de> for XidPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Default, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        struct Lists {
            add: BTreeSet<u64>,
            remove: BTreeSet<u64>,
        }

        struct Form;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = Lists;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map {add: [XID, ...], remove: [XID, ...]} of changes to NVIDIA's XID catalog")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Lists, A::Error> {
                Lists::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Lists, A::Error> {
                Err(serde::de::Error::custom(
                    "a plain list of XIDs is the form before NVIDIA's catalog decided: write {add: [XID, ...]} for XIDs that should also hold the node and {remove: [XID, ...]} for ones that never should",
                ))
            }
        }

        let lists = deserializer.deserialize_any(Form)?;
        for (list, xids) in [("add", &lists.add), ("remove", &lists.remove)] {
            if let Some(bad) = xids.iter().find(|&&x| x == 0 || x > MAX_XID) {
                return Err(invalid_field(
                    list,
                    format!("{bad} is not an XID: XIDs are 1 to {MAX_XID}"),
                ));
            }
        }
        if let Some(both) = lists.add.intersection(&lists.remove).next() {
            return Err(serde::de::Error::custom(format!(
                "XID {both} is both added and removed: keep it in one list"
            )));
        }
        Ok(XidPolicy {
            add: lists.add,
            remove: lists.remove,
        })
    }
}

/// `readiness.xid_thresholds`: a map of XID to `{count, window}`, each XID in range. Listing an
/// XID that the catalog (or `readiness.fatal_xids`) already holds on the first sighting is allowed
/// and changes nothing for it.
impl<'de> Deserialize<'de> for XidThresholds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let thresholds =
            std::collections::BTreeMap::<u64, XidThreshold>::deserialize(deserializer)?;
        if let Some(bad) = thresholds.keys().find(|&&x| x == 0 || x > MAX_XID) {
            return Err(serde::de::Error::custom(format!(
                "{bad} is not an XID: XIDs are 1 to {MAX_XID}"
            )));
        }
        Ok(XidThresholds(thresholds))
    }
}
