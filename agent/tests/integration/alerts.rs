//! The alert rules in deploy/daemonset/components/prometheus-operator/prometheusrule.yaml: `promtool check rules` and
//! `promtool test rules` with a test per alert that fires and one that stays silent
//! (tests/alerts/mlnode.test.yaml). promtool comes with Debian's prometheus package, installed by
//! the test command.

use std::path::Path;
use std::process::Command;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shipped PrometheusRule object.
fn prometheus_rule() -> serde_json::Value {
    let text = std::fs::read_to_string(
        repo().join("deploy/daemonset/components/prometheus-operator/prometheusrule.yaml"),
    )
    .unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[test]
fn alert_rules_check_and_pass_their_unit_tests() {
    let repo = repo();
    let rule = prometheus_rule();
    let dir = tempfile::tempdir().unwrap();
    // promtool reads YAML, of which JSON is a subset: the PrometheusRule's spec is a rule file.
    std::fs::write(dir.path().join("rules.json"), rule["spec"].to_string()).unwrap();
    std::fs::copy(
        repo.join("tests/alerts/mlnode.test.yaml"),
        dir.path().join("mlnode.test.yaml"),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let output = Command::new("promtool")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("promtool is installed by the test command");
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "promtool {args:?}:\n{text}");
        text
    };
    let checked = run(&["check", "rules", "rules.json"]);
    let rules: usize = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().unwrap().len())
        .sum();
    assert!(
        checked.contains(&format!("SUCCESS: {rules} rules found")),
        "{checked}"
    );
    run(&["test", "rules", "mlnode.test.yaml"]);
}

/// Every alert follows the severity policy of docs/runbooks.md and links a section there that
/// exists: a `runbook_url` to nowhere is found here, not at 3 a.m.
#[test]
fn every_alert_has_a_severity_and_a_runbook_section() {
    let rule = prometheus_rule();
    let runbooks = std::fs::read_to_string(repo().join("docs/runbooks.md")).unwrap();
    let anchors: Vec<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let alerts: Vec<&serde_json::Value> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r.get("alert").is_some())
        .collect();
    assert!(alerts.len() >= 17);
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap();
        let severity = alert["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let url = alert["annotations"]["runbook_url"].as_str().unwrap_or("");
        let anchor = url.rsplit_once('#').map(|(_, a)| a).unwrap_or("");
        assert_eq!(anchor, name.to_ascii_lowercase(), "{name}: {url}");
        assert!(
            anchors.iter().any(|a| a == anchor),
            "{name}: no section `## {name}` in docs/runbooks.md"
        );
    }
}

/// Every alert has a case in tests/alerts/mlnode.test.yaml where it fires and one where it must
/// stay silent (`exp_alerts: []`): a rule that cannot fire and one that fires on anything both fail.
#[test]
fn every_alert_has_a_firing_and_a_silent_unit_test() {
    let rule = prometheus_rule();
    let tests: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("tests/alerts/mlnode.test.yaml")).unwrap(),
    )
    .unwrap();
    let cases: Vec<(&str, bool)> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .map(|case| {
            let fires = case["exp_alerts"]
                .as_array()
                .is_some_and(|alerts| !alerts.is_empty());
            (case["alertname"].as_str().unwrap(), fires)
        })
        .collect();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for alert in group["rules"].as_array().unwrap() {
            let Some(name) = alert["alert"].as_str() else {
                continue;
            };
            for (fires, what) in [(true, "fires"), (false, "stays silent")] {
                assert!(
                    cases.contains(&(name, fires)),
                    "{name}: no unit test case where it {what}"
                );
            }
        }
    }
}
