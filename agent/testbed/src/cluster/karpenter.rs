//! Karpenter's node repair decision over Nodes, made by Karpenter's own code: tests/programs/karpenter-repair
//! runs core Karpenter's matcher (v1.15.0) over its AWS provider's `RepairPolicies()`, or with
//! [`Policies::Legacy`] the legacy controller over the legacy policies (Karpenter 1.14's).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Which of Karpenter's policies judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policies {
    /// Node repair as a disruption method, `NodeRepair=true`: Karpenter 1.15's default.
    Current,
    /// [`Policies::Current`] with the provider's `RebootForRepair` feature gate.
    RebootForRepair,
    /// `--legacy-node-repair`: the legacy controller and policies, as Karpenter 1.14 had them.
    Legacy,
}

impl Policies {
    /// Every policy set the tests judge a node under.
    pub const ALL: [Policies; 3] = [
        Policies::Current,
        Policies::RebootForRepair,
        Policies::Legacy,
    ];

    fn flags(self) -> &'static [&'static str] {
        match self {
            Policies::Current => &[],
            Policies::RebootForRepair => &["--reboot-for-repair"],
            Policies::Legacy => &["--legacy"],
        }
    }
}

/// What Karpenter decides for one node condition a policy covers.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub node: String,
    pub condition: String,
    pub status: String,
    pub reason: String,
    /// `ReplaceNode` or `RebootNode`.
    pub action: String,
    /// The reason matched no reason-specific policy: Karpenter's catch-all decided.
    pub fallback: bool,
    /// The reason-specific policy's regular expression, as Karpenter's provider writes it.
    pub reason_regex: Option<String>,
    /// From the condition's `lastTransitionTime` to the repair.
    pub toleration: Option<Duration>,
}

/// Karpenter's repair matcher, as `scripts/test.sh` builds it (tests/programs/karpenter-repair),
/// or why there is none.
pub fn binary() -> Result<PathBuf, String> {
    crate::built_program(
        "MLNODE_TEST_KARPENTER_REPAIR",
        "karpenter-repair/karpenter-repair",
        "Karpenter's repair matcher (tests/programs/karpenter-repair)",
    )
}

/// Karpenter's decision, under `policies`, for every condition of `nodes` (a Node or a List) that a
/// policy covers, as of `now` (RFC 3339).
pub fn decide(nodes: &Value, now: &str, policies: Policies) -> Result<Vec<Decision>, String> {
    let mut child = Command::new(binary()?)
        .args(policies.flags())
        .args(["--now", now])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("karpenter-repair: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(nodes.to_string().as_bytes())
        .map_err(|e| format!("karpenter-repair's input: {e}"))?;
    let output = child
        .wait_with_output()
        .map_err(|e| format!("karpenter-repair: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "karpenter-repair {policies:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).map_err(|e| format!("{line}: {e}")))
        .filter(|line| !line.as_ref().is_ok_and(|l| l["resolved"] == true))
        .map(|line| line.map(|l| decision(&l)))
        .collect()
}

fn decision(line: &Value) -> Decision {
    let text = |key: &str| line[key].as_str().unwrap_or_default().to_string();
    Decision {
        node: text("node"),
        condition: text("condition"),
        status: text("status"),
        reason: text("reason"),
        action: text("action"),
        fallback: line["fallback"] == true,
        reason_regex: line["reasonRegex"].as_str().map(str::to_string),
        toleration: line["tolerationSeconds"]
            .as_f64()
            .map(Duration::from_secs_f64),
    }
}

/// Karpenter's decision for `node`'s `condition` as of now under each of [`Policies::ALL`], in
/// that order: None where no policy covers it.
pub fn decisions_for(node: &Value, condition: &str) -> Result<Vec<Option<Decision>>, String> {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    Policies::ALL
        .iter()
        .map(|&policies| {
            decide(node, &now, policies)
                .map(|all| all.into_iter().find(|d| d.condition == condition))
        })
        .collect()
}

/// A decision in the words of docs/runbooks.md's table: `replace after 10 min, `.*XID(…).*``,
/// `… catch-all`, `… any reason` (a policy on the condition's type and status alone), or `nothing`.
pub fn said(decision: &Option<Decision>) -> String {
    let Some(decision) = decision else {
        return "nothing".to_string();
    };
    let action = match decision.action.as_str() {
        "ReplaceNode" => "replace",
        "RebootNode" => "reboot",
        other => other,
    };
    let minutes = decision.toleration.map_or(0, |t| t.as_secs() / 60);
    let policy = match &decision.reason_regex {
        _ if decision.fallback => "catch-all".to_string(),
        Some(regex) if regex != ".*" => format!("`{regex}`"),
        _ => "any reason".to_string(),
    };
    format!("{action} after {minutes} min, {policy}")
}
