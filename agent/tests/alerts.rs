//! The alert rules in deploy/daemonset/base/prometheusrule.yaml: `promtool check rules` and
//! `promtool test rules` with a test per alert that fires and one that stays silent
//! (tests/alerts/mlnode.test.yaml). promtool comes with Debian's prometheus package, installed by
//! the test command.

use std::path::Path;
use std::process::Command;

#[test]
fn alert_rules_check_and_pass_their_unit_tests() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text =
        std::fs::read_to_string(repo.join("deploy/daemonset/base/prometheusrule.yaml")).unwrap();
    let rule: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
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
    assert!(checked.contains("SUCCESS: 11 rules found"), "{checked}");
    run(&["test", "rules", "mlnode.test.yaml"]);
}
