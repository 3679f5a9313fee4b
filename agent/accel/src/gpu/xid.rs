//! NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors, data file `xid_catalog.tsv`) and
//! dcgm-exporter's XID descriptions (`xid_messages.tsv`): what each XID is, what NVIDIA says to do
//! about it, and which of them hold a node by the operator's policy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use mlnode_core::settings::{bounds, days, minutes, Within};

bounds! {
    /// `readiness.xid_thresholds`: repeats of one XID on one GPU before it holds the node.
    pub RepeatCount: u32 = 1, 10_000;
    pub RepeatWindow: std::time::Duration = minutes(1), days(7);
}

/// The boot's count of each XID of one GPU, each occurrence once whichever source saw it: the
/// kernel log's lines from before the agent started (no NVML event of its could deliver them),
/// then the larger of NVML's count and the log's since (both see the same XIDs from then on: NVML
/// at once, the log within a poll interval, each possibly missing some the other has).
pub fn boot_counts<'a>(
    nvml: &BTreeMap<u64, u64>,
    logged: impl Iterator<Item = (u64, &'a crate::kernel_log::facts::Logged)>,
) -> BTreeMap<u64, u64> {
    let mut counts = nvml.clone();
    for (xid, logged) in logged {
        let since_start = logged.count - logged.before_start;
        let seen_by_nvml = nvml.get(&xid).copied().unwrap_or(0);
        counts.insert(xid, logged.before_start + since_start.max(seen_by_nvml));
    }
    counts
}

/// NVIDIA's catalog entry for one XID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    pub mnemonic: &'static str,
    /// The "Resolution Bucket (Immediate Action)": `RESET_GPU`, `RESTART_APP`, `IGNORE`, ...
    pub action: &'static str,
    /// From a driver branch on, the driver reports a recovery action with this XID (the catalog's
    /// "Xid 154 linkage"): its verdict then decides, and a later NONE clears the XID.
    pub recovery_action_linked: bool,
}

/// The catalog's actions that hold a node out of service: the GPU must be reset, or the machine
/// restarted, before it serves again. XID 48's workflow is a reset (solo) or a drain and reset
/// (with 63/64); an NVLink error's needs its registers decoded, so it holds until the driver's
/// recovery action (R565) says otherwise.
const HOLDING_ACTIONS: [&str; 5] = [
    "RESET_GPU",
    "RESTART_BM",
    "RESTART_VM",
    "WORKFLOW_XID_48",
    "WORKFLOW_NVLINK_ERR",
];

/// The `immediate_action` of an XID the catalog does not list.
pub const NOT_IN_CATALOG: &str = "NOT_IN_CATALOG";

static CATALOG: LazyLock<BTreeMap<u64, CatalogEntry>> = LazyLock::new(|| {
    include_str!("xid_catalog.tsv")
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let xid = fields.next()?.parse().ok()?;
            let mnemonic = fields.next()?;
            let action = match fields.next()? {
                "-" => "NOT_GIVEN",
                action => action,
            };
            let linked = fields.next().is_some_and(|l| l != "-");
            Some((
                xid,
                CatalogEntry {
                    mnemonic,
                    action,
                    recovery_action_linked: linked,
                },
            ))
        })
        .collect()
});

pub fn catalog(xid: u64) -> Option<&'static CatalogEntry> {
    CATALOG.get(&xid)
}

/// The catalog's immediate action for `xid`, the value of the series' `immediate_action` label.
pub fn immediate_action(xid: u64) -> &'static str {
    catalog(xid).map_or(NOT_IN_CATALOG, |e| e.action)
}

/// Which XIDs hold the node: the catalog's, with the operator's additions and removals
/// (`readiness.fatal_xids`, read in [`super::settings`]), removals winning.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct XidPolicy {
    pub add: BTreeSet<u64>,
    pub remove: BTreeSet<u64>,
}

impl XidPolicy {
    pub fn holds(&self, xid: u64) -> bool {
        if self.remove.contains(&xid) {
            return false;
        }
        self.add.contains(&xid)
            || catalog(xid).is_some_and(|entry| HOLDING_ACTIONS.contains(&entry.action))
    }
}

/// `readiness.xid_thresholds`: XIDs that hold the node once they repeat on one GPU more than
/// `count` times within `window`, though one alone holds nothing (read in [`super::settings`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct XidThresholds(pub BTreeMap<u64, XidThreshold>);

#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct XidThreshold {
    pub count: Within<RepeatCount>,
    pub window: Within<RepeatWindow>,
}

/// NVIDIA's catalog resolves XIDs 13 (GR exception) and 31 (MMU fault) by their history: alone,
/// the application's fault (RESTART_APP); repeating on the same GPU, run DCGM's diagnostics and then
/// the field diagnostics (its WORKFLOW_XID_13 / _31). It gives no number: more than 3 within an
/// hour is this project's, a rate a crash-looping pod's restarts (back-off up to 5 minutes) reach
/// and one fault a day does not.
impl Default for XidThresholds {
    fn default() -> Self {
        let threshold = XidThreshold {
            count: Within::default_of(3),
            window: Within::default_of(mlnode_core::settings::hours(1)),
        };
        XidThresholds([(13, threshold), (31, threshold)].into())
    }
}

/// NVIDIA's description of an XID, as dcgm-exporter's `err_msg` gives it (its table,
/// internal/pkg/collector/xid_errors.go, from docs.nvidia.com/deploy/xid-errors; data file
/// `xid_messages.tsv`, see its header), "Unknown Error" past the table.
pub fn xid_message(xid: u64) -> &'static str {
    XID_MESSAGES
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('\t'))
        .find(|(code, _)| code.parse() == Ok(xid))
        .map(|(_, message)| message)
        .unwrap_or("Unknown Error")
}

const XID_MESSAGES: &str = include_str!("xid_messages.tsv");

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalog's own verdicts on the XIDs the old hand-picked list got wrong both ways, and on
    /// the ones it got right (NVIDIA's XID catalog, the "Catalog" sheet of
    /// https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, for H100).
    #[test]
    fn the_policy_is_nvidias_catalog() {
        let policy = XidPolicy::default();
        for xid in [63, 92, 94, 13, 31, 43, 45, 154, 157] {
            assert!(
                !policy.holds(xid),
                "XID {xid} ({}) holds no node",
                immediate_action(xid)
            );
        }
        for xid in [
            46, 109, 110, 136, 140, 143, 156, 158, 151, 48, 62, 64, 74, 79, 95, 119, 120,
        ] {
            assert!(
                policy.holds(xid),
                "XID {xid} ({}) holds the node",
                immediate_action(xid)
            );
        }
        assert_eq!(immediate_action(94), "RESTART_APP");
        assert_eq!(immediate_action(151), "RESTART_VM");
        assert_eq!(immediate_action(79), "RESTART_BM");
        assert_eq!(immediate_action(154), "XID_154");
        assert_eq!(
            immediate_action(175),
            NOT_IN_CATALOG,
            "the driver's newest XIDs"
        );
        assert!(
            !policy.holds(175),
            "an XID the catalog does not know is counted, not gated"
        );
        assert_eq!(CATALOG.len(), 172);
        assert!(catalog(48).unwrap().recovery_action_linked);
        assert!(!catalog(46).unwrap().recovery_action_linked);
    }

    #[test]
    fn the_operator_adds_and_removes_removals_winning() {
        let policy = XidPolicy {
            add: [13, 175].into(),
            remove: [74, 13].into(),
        };
        assert!(policy.holds(175));
        assert!(!policy.holds(74));
        assert!(!policy.holds(13), "a removal wins over an addition");
        assert!(policy.holds(79));
    }

    #[test]
    fn xid_messages_are_nvidias_and_unknown_past_the_table() {
        assert_eq!(xid_message(79), "GPU has fallen off the bus");
        assert_eq!(xid_message(48), "Double Bit ECC Error");
        assert_eq!(xid_message(0), "No Error");
        assert_eq!(xid_message(999), "Unknown Error");
    }

    #[test]
    fn each_xid_of_the_boot_is_counted_once_across_nvml_and_the_log() {
        use crate::kernel_log::facts::LogFacts;
        use crate::kernel_log::parse::{Parser, PciAddress};
        use std::time::{Duration, Instant};
        let started = Instant::now();
        let mut facts = LogFacts::new(started);
        let mut parser = Parser::default();
        let mut log = |xid: u64, at: Instant| {
            let line = format!("NVRM: Xid (PCI:0000:5a:00): {xid}, pid=1, name=vllm, detail");
            facts.apply(parser.line(&line).unwrap(), at);
        };
        let before = started - Duration::from_secs(60);
        let after = started + Duration::from_secs(1);
        log(13, before); // before the start: NVML never saw it
        log(13, before);
        log(13, after); // seen by both
        log(31, after); // only the log saw it
        let gpu = PciAddress::from_nvml("00000000:5A:00.0").unwrap();
        // NVML: the one 13 both saw, a 13 the log has not shown yet, and a 48 only NVML saw.
        let nvml = BTreeMap::from([(13, 2), (48, 1)]);
        let counts = boot_counts(&nvml, facts.xids_of(&gpu));
        assert_eq!(counts, BTreeMap::from([(13, 4), (31, 1), (48, 1)]));
        let log_only = boot_counts(&BTreeMap::new(), facts.xids_of(&gpu));
        assert_eq!(log_only, BTreeMap::from([(13, 3), (31, 1)]));
    }
}
