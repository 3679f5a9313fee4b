//! The agent as its manifests say: its privileges as the kubelet ran it, its token, and the
//! shipped admission policies as the type checker finds them.

use super::*;

/// The kubelet ran the agent as the manifest says, under the runtime's default seccomp filter:
/// UID 0 with no capability in any set, no new privileges; and its requests carried the
/// service-account token the kubelet projected, bound to its pod on this node.
#[test]
fn the_agent_runs_as_its_manifest_says() {
    let on = testbed::needs!(on_overlay());
    let cluster = on.cluster;
    let status = cluster.runtime.inside(&[
        "sh",
        "-c",
        "cat /proc/$(pgrep -f 'mlnode-agent serve' | head -n1)/status",
    ]);
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("no {name} in the agent's status: {status}"))
    };
    assert_eq!(field("Uid"), "0 0 0 0");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(set), "0000000000000000", "{set}");
    }
    assert_eq!(field("NoNewPrivs"), "1");
    assert_eq!(field("Seccomp"), "2");
    let agent_requests: Vec<testbed::cluster::audit::Request> =
        testbed::cluster::audit::AuditReader::default()
            .read(cluster.audit_logs())
            .into_iter()
            .filter(|r| r.user == "system:serviceaccount:mlnode-system:mlnode-agent")
            .collect();
    assert!(
        !agent_requests.is_empty() && agent_requests.iter().all(|r| r.node == NODE),
        "the agent's requests with its projected token, bound to {NODE}: {agent_requests:?}"
    );
}

/// The shipped ValidatingAdmissionPolicies as the controller manager's type checker finds them:
/// every expression checked against the types it reads, no warning.
#[test]
fn the_admission_policies_type_check_without_warnings() {
    let on = testbed::needs!(on_overlay());
    let cluster = on.cluster;
    let objects = testbed::needs!(overlay_objects());
    let mut get = vec!["validatingadmissionpolicies"];
    get.extend(
        objects
            .iter()
            .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
            .map(|o| o["metadata"]["name"].as_str().unwrap()),
    );
    assert!(get.len() > 1, "the install ships admission policies");
    let policies = testbed::wait_until(
        "the type checker's verdict on every shipped policy",
        Duration::from_secs(60),
        || {
            let policies = cluster.admin.get(&get);
            let items = policies["items"].as_array().cloned().unwrap_or_default();
            items
                .iter()
                .all(|p| !p["status"]["typeChecking"].is_null())
                .then_some(items)
                .ok_or_else(|| format!("{policies:#}"))
        },
    );
    for policy in policies {
        assert_eq!(
            policy["status"]["typeChecking"]["expressionWarnings"],
            Value::Null,
            "{}: {:#}",
            policy["metadata"]["name"],
            policy["status"]
        );
    }
}
