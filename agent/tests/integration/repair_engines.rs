//! docs/runbooks.md's tables of what the repair engines do, checked against Karpenter's own matcher
//! (testbed::cluster::karpenter): every reason of every row on a Node of its own, judged under Karpenter
//! 1.15's policies, with its `RebootForRepair` gate, and under 1.14's legacy ones; and every reason
//! docs/readiness.md says the agent writes is in a row.

use std::collections::BTreeSet;
use std::path::Path;

use mlnode_testbed as testbed;
use serde_json::json;
use testbed::cluster::karpenter::{decide, said, Policies};

const SECTION: &str = "## What each AcceleratorHealthy reason means to the repair engines";

/// One row: the condition type (from the table's header), the reasons in its first cell, the
/// status, and what it says Karpenter decides under each of [`Policies::ALL`].
#[derive(Debug)]
struct Row {
    condition: String,
    reasons: Vec<String>,
    status: String,
    karpenter: Vec<String>,
}

/// A table's cells, split at the pipes that are not escaped (`\|` inside a regular expression).
fn cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut chars = line.trim().trim_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_string()).collect()
}

/// The CamelCase words in backticks: the reasons, not the file names beside them.
fn reasons_in(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.starts_with(|c: char| c.is_ascii_uppercase())
                && word.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(str::to_string)
        .collect()
}

fn section() -> String {
    let runbooks =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/runbooks.md"))
            .unwrap();
    let section = runbooks
        .split(SECTION)
        .nth(1)
        .unwrap_or_else(|| panic!("docs/runbooks.md has no section {SECTION:?}"));
    section.split("\n## ").next().unwrap().to_string()
}

fn rows() -> Vec<Row> {
    let section = section();
    let mut rows = Vec::new();
    let mut condition = None;
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells = cells(line);
        if cells[0].ends_with(" reason") {
            condition = reasons_in(&cells[0]).into_iter().next();
            assert_eq!(
                &cells[2..5],
                [
                    "Karpenter 1.15",
                    "Karpenter 1.15, `RebootForRepair` gate",
                    "Karpenter 1.14 (legacy policies)"
                ],
                "{line}"
            );
            continue;
        }
        if cells[0].starts_with("---") {
            continue;
        }
        rows.push(Row {
            condition: condition.clone().expect("a row before its table's header"),
            reasons: reasons_in(&cells[0]),
            status: cells[1].clone(),
            karpenter: cells[2..5].to_vec(),
        });
    }
    rows
}

#[test]
fn the_runbooks_repair_table_is_what_karpenters_matcher_decides() {
    testbed::needs!(testbed::cluster::karpenter::binary());
    let rows = rows();
    let conditions: BTreeSet<&str> = rows.iter().map(|r| r.condition.as_str()).collect();
    assert_eq!(
        conditions,
        ["AcceleratedHardwareReady", "NetworkingReady"].into()
    );
    let at = "2026-12-03T12:00:00Z";
    let mut nodes = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        assert!(!row.reasons.is_empty(), "a row names no reason: {row:?}");
        for (j, reason) in row.reasons.iter().enumerate() {
            nodes.push(json!({
                "kind": "Node", "apiVersion": "v1",
                "metadata": {"name": format!("row{i}-{j}"), "creationTimestamp": "2026-12-03T11:00:00Z"},
                "status": {"conditions": [{"type": row.condition, "status": row.status,
                    "reason": reason, "lastTransitionTime": at}]}
            }));
        }
    }
    let list = json!({"kind": "List", "apiVersion": "v1", "items": nodes});
    for (column, policies) in Policies::ALL.into_iter().enumerate() {
        let decided = decide(&list, at, policies).unwrap();
        for (i, row) in rows.iter().enumerate() {
            for (j, reason) in row.reasons.iter().enumerate() {
                let node = format!("row{i}-{j}");
                let decision = decided.iter().find(|d| d.node == node).cloned();
                assert_eq!(
                    said(&decision),
                    row.karpenter[column],
                    "docs/runbooks.md: {} {reason} ({}) under {policies:?}",
                    row.condition,
                    row.status
                );
            }
        }
    }
}

/// Every reason docs/readiness.md lists for `AcceleratorHealthy` and `FabricHealthy` False is a
/// reason of the repair conditions, so each is in the table of its condition, but for those the
/// section says are always named by their XID (agent/accel/src/gpu/health.rs builds them with it).
#[test]
fn every_reason_the_agent_writes_is_in_the_repair_table() {
    let readiness =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/readiness.md"))
            .unwrap();
    let rows = rows();
    let section = section();
    let always_named: BTreeSet<String> = section
        .lines()
        .find(|l| l.starts_with("Always named by their XID"))
        .map(reasons_in)
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert_eq!(always_named.len(), 2, "{always_named:?}");
    for (gate, condition) in [
        ("AcceleratorHealthy", "AcceleratedHardwareReady"),
        ("FabricHealthy", "NetworkingReady"),
    ] {
        let line = readiness
            .lines()
            .find(|l| l.starts_with(&format!("| `{gate}`")))
            .unwrap_or_else(|| panic!("docs/readiness.md has no row for {gate}"));
        // The row's last cell holds its False reasons.
        let written: BTreeSet<String> = reasons_in(cells(line).last().unwrap())
            .into_iter()
            .collect();
        assert!(written.len() > 2, "{gate}: {written:?}");
        let tabled: BTreeSet<String> = rows
            .iter()
            .filter(|r| r.condition == condition)
            .flat_map(|r| r.reasons.iter().cloned())
            .collect();
        let missing: Vec<&String> = written
            .difference(&tabled)
            .filter(|r| !always_named.contains(*r))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/runbooks.md's {condition} table lacks {missing:?}"
        );
    }
}

#[test]
fn reasons_are_read_from_the_cells_and_escaped_pipes_kept() {
    assert_eq!(
        cells("| `A`, `B` (no `libnvidia-ml`) | False | x `.*XID(1\\|2).*` |"),
        ["`A`, `B` (no `libnvidia-ml`)", "False", "x `.*XID(1|2).*`"]
    );
    assert_eq!(
        reasons_in("`GPULost`, `libnvidia-ml`, `NvidiaXID79Error`"),
        ["GPULost", "NvidiaXID79Error"]
    );
}
