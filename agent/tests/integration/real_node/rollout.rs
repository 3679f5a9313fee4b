//! A rollout by the DaemonSet controller.

use super::*;

/// A changed pod template rolled out by the DaemonSet controller (`kubectl rollout restart`, one
/// pod unavailable at a time): the new pod trusts the unchanged cache, reading none of it, and the
/// node's conditions stay True throughout, untouched; the requests of the rollout, from the
/// server's audit log.
#[test]
fn the_daemonset_controller_rolls_the_agent_without_a_read() {
    let on = testbed::needs!(on_overlay());
    let cluster = on.cluster;
    let old = &await_agent_pod(cluster, None);
    let conditions = || {
        AGENTS_CONDITIONS.map(|kind| {
            let c = cluster.node_condition(kind).unwrap_or_default();
            (c["status"].clone(), c["lastTransitionTime"].clone())
        })
    };
    let before = conditions();
    let mut audit = testbed::cluster::audit::AuditReader::default();
    audit.read(cluster.audit_logs());
    let daemonset = old["metadata"]["ownerReferences"][0]["name"]
        .as_str()
        .unwrap();
    cluster.admin.admin(
        &[
            "rollout",
            "restart",
            "-n",
            "mlnode-system",
            &format!("daemonset/{daemonset}"),
        ],
        "",
    );
    let old_uid = old["metadata"]["uid"].as_str().unwrap();
    let new = testbed::wait_until(
        "the rolled agent Ready, its conditions unchanged meanwhile",
        Duration::from_secs(120),
        || {
            let now = conditions();
            assert_eq!(now, before, "the node's conditions during the rollout");
            ready_agent_pod(cluster, Some(old_uid))
        },
    );
    assert_eq!(conditions(), before);
    // Its verdict on the previous agent's record, whichever it is.
    let metrics = testbed::wait_until(
        "the rolled agent's verdict on its predecessor's record",
        Duration::from_secs(60),
        || {
            let metrics = agent_metrics(cluster, &new);
            let verdicts: f64 = ["trusted", "partial", "unusable", "malformed", "none"]
                .iter()
                .filter_map(|result| {
                    testbed::agent::sample(
                        &metrics,
                        "mlnode_model_cache_restart_records_total",
                        &[("model_name", "llama-3.1-8b"), ("result", result)],
                    )
                })
                .sum();
            (verdicts >= 1.0).then_some(metrics.clone()).ok_or(metrics)
        },
    );
    let model = [("model_name", "llama-3.1-8b")];
    assert_eq!(
        testbed::agent::sample(&metrics, "mlnode_model_cache_hashed_bytes_total", &model),
        Some(0.0),
        "no byte of the cache read again"
    );
    assert_eq!(
        testbed::agent::sample(
            &metrics,
            "mlnode_model_cache_restart_records_total",
            &[("model_name", "llama-3.1-8b"), ("result", "trusted")]
        ),
        Some(1.0),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("restart_records") || l.contains("hashed_bytes"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let requests: Vec<testbed::cluster::audit::Request> = audit
        .read(cluster.audit_logs())
        .into_iter()
        .filter(|r| r.user == "system:serviceaccount:mlnode-system:mlnode-agent")
        .collect();
    for ((verb, resource, code), count) in testbed::cluster::audit::counts(&requests) {
        eprintln!("rollout: the agents' {verb} {resource} {code}: {count}");
    }
    // The conditions and the taint already say it all: nothing written to the Node itself, and
    // to its status at most the once a restarted agent finds its heartbeat due (docs/performance.md,
    // "The fleet on a real API server": 0.16 to 0.4 writes per restart).
    let writes = |resource: &str| {
        requests
            .iter()
            .filter(|r| r.is_write() && r.resource == resource)
            .count()
    };
    assert_eq!(writes("nodes"), 0, "{requests:?}");
    assert!(writes("nodes/status") <= 1, "{requests:?}");
}
