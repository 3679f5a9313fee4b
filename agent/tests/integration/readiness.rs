//! The readiness controller in the agent binary against the real kube-apiserver
//! (testbed::cluster::control_plane), as its DaemonSet runs it (the shipped RBAC and admission policies, its
//! pod's bound token), through the proxy that records what it sends and pushes back on demand
//! (testbed::cluster::fault_proxy): the exact requests (paths, content types, bodies), kubelet's conditions
//! untouched, heartbeat skipping, the startup taint removed beside a foreign one and retried when
//! another writer changes the list under it, and an API server that is down at start.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::fault_proxy::Recorded;
use testbed::models::PlainModel;

fn tainted(node: &ApiOnlyNode) -> bool {
    node.node()["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == "mlnode.dev/not-ready")
}

fn nvidia_taint() -> Value {
    json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
}

fn start(node: &ApiOnlyNode, model: &PlainModel, manifest: &Path, extra: &str) -> Agent {
    let readiness =
        "  startup_taint: mlnode.dev/not-ready:NoSchedule\n  interval: 200ms\n  heartbeat: 1s\n";
    start_with(node, readiness, model.root(), manifest, extra)
}

/// The agent with the readiness settings `readiness` (indented lines of its section) and the
/// model `llama` at `root`, against `node`'s server through its proxy.
fn start_with(
    node: &ApiOnlyNode,
    readiness: &str,
    root: &Path,
    manifest: &Path,
    extra: &str,
) -> Agent {
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n{readiness}{extra}{}",
        testbed::agent::model_config("llama", root, manifest)
    );
    node.start_agent(&config)
}

fn wait_until(what: &str, limit: Duration, check: impl Fn() -> bool) {
    testbed::wait_until(what, limit, || {
        check().then_some(()).ok_or_else(String::new)
    })
}

/// Readiness rounds the agent has finished (written, skipped or failed): the controller's own
/// clock, to wait on instead of the wall's.
fn rounds(agent: &Agent) -> f64 {
    let metrics = agent.metrics();
    ["written", "skipped", "error"]
        .iter()
        .filter_map(|result| {
            sample(
                &metrics,
                "mlnode_node_condition_updates_total",
                &[("result", result)],
            )
        })
        .sum()
}

/// Until the controller has finished `n` more rounds.
fn wait_rounds(agent: &Agent, n: f64) {
    let from = rounds(agent);
    wait_until("readiness rounds", Duration::from_secs(20), || {
        rounds(agent) >= from + n
    });
}

/// The PATCHes of `path` (its query aside).
fn patches<'a>(requests: &'a [Recorded], path: &str) -> Vec<&'a Recorded> {
    requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.resource_path() == path)
        .collect()
}

#[test]
fn conditions_and_taint_are_written_exactly_and_only_ours() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let kubelet_before: Vec<_> = node.node()["status"]["conditions"]
        .as_array()
        .unwrap()
        .clone();
    let agent = start(&node, &model, &manifest, "");
    wait_until("taint removed", Duration::from_secs(20), || {
        node.node()["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["key"] != "mlnode.dev/not-ready")
    });
    // The event follows the patch: wait for it too before reading the record.
    wait_until("taint event", Duration::from_secs(10), || {
        node.requests()
            .iter()
            .any(|r| r.method == "POST" && r.body["reason"] == "StartupTaintRemoved")
    });
    let requests = node.requests();

    // Conditions: a strategic-merge patch of nodes/<name>/status with only the agent's types.
    let status_patches = patches(&requests, &format!("{}/status", node.path()));
    assert!(!status_patches.is_empty());
    for patch in &status_patches {
        assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
        let types: Vec<&str> = patch.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            ["ModelCacheVerified", "AcceleratorHealthy"],
            "{:#}",
            patch.body
        );
        assert_eq!(
            patch.body.as_object().unwrap().len(),
            1,
            "nothing but status: {:#}",
            patch.body
        );
    }
    let verified = node.condition("ModelCacheVerified");
    assert_eq!(
        (verified["status"].as_str(), verified["reason"].as_str()),
        (Some("True"), Some("AllModelCachesVerified"))
    );
    assert_eq!(node.condition("AcceleratorHealthy")["status"], "True");
    // kubelet's conditions are exactly as they were.
    let kubelet_after: Vec<_> = node.node()["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            !["ModelCacheVerified", "AcceleratorHealthy"].contains(&c["type"].as_str().unwrap())
        })
        .cloned()
        .collect();
    assert_eq!(kubelet_after, kubelet_before);

    // The taint: a JSON patch that tests the list it read and keeps the other taint.
    let taint_patches = patches(&requests, &node.path());
    assert_eq!(taint_patches.len(), 1, "{taint_patches:#?}");
    assert_eq!(taint_patches[0].content_type, "application/json-patch+json");
    assert_eq!(
        taint_patches[0].body,
        json!([
            {"op": "test", "path": "/spec/taints", "value": [
                {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"},
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            {"op": "replace", "path": "/spec/taints", "value": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        ])
    );
    assert_eq!(
        node.node()["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );

    // Node events, as node-problem-detector posts them.
    let events: Vec<&Recorded> = requests.iter().filter(|r| r.method == "POST").collect();
    assert!(
        events
            .iter()
            .all(|e| e.path == "/api/v1/namespaces/default/events"
                && e.body["involvedObject"]["kind"] == "Node"
                && e.body["involvedObject"]["name"] == node.on.node.as_str()),
        "{events:#?}"
    );
    let reasons: Vec<&str> = events
        .iter()
        .map(|e| e.body["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons.contains(&"AllModelCachesVerified") && reasons.contains(&"StartupTaintRemoved"),
        "{reasons:?}"
    );

    // Bootstrap-only: corrupting the cache flips the condition but never re-adds the taint.
    std::fs::write(model.path("config.json"), b"{\"model_type\": \"evil\"}").unwrap();
    wait_until("condition False", Duration::from_secs(10), || {
        node.condition("ModelCacheVerified")["status"] == "False"
    });
    assert!(node.condition("ModelCacheVerified")["message"]
        .as_str()
        .unwrap()
        .contains("config.json"));
    // Rounds after the failure: none puts the taint back.
    wait_rounds(&agent, 3.0);
    assert_eq!(patches(&node.requests(), &node.path()).len(), 1);
    let metrics = agent.metrics();
    assert_eq!(
        sample(
            &metrics,
            "mlnode_readiness_gate",
            &[("gate", "ModelCacheVerified")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_readiness_gate",
            &[("gate", "AcceleratorHealthy")]
        ),
        Some(1.0)
    );
}

#[test]
fn unchanged_conditions_are_skipped_until_the_heartbeat() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = start(&node, &model, &manifest, "");
    wait_until("verified", Duration::from_secs(20), || {
        node.condition("ModelCacheVerified")["status"] == "True"
    });
    let written_at = patches(&node.requests(), &format!("{}/status", node.path())).len();
    let started = Instant::now();
    wait_rounds(&agent, 12.0);
    let took = started.elapsed();
    let written = patches(&node.requests(), &format!("{}/status", node.path())).len() - written_at;
    // 12 rounds at 200 ms, a 1 s heartbeat: a write a second (2 or 3 when the rounds keep time),
    // not one a round.
    let heartbeats = took.as_secs() as usize + 1;
    assert!(
        (1..=heartbeats).contains(&written) && written < 12,
        "{written} writes in 12 rounds over {took:?}"
    );
    let metrics = agent.metrics();
    assert!(
        sample(
            &metrics,
            "mlnode_node_condition_updates_total",
            &[("result", "skipped")]
        )
        .unwrap()
            >= 3.0,
        "rounds with nothing to write are skipped, not written"
    );
    let heartbeat = node.condition("ModelCacheVerified");
    assert_ne!(
        heartbeat["lastHeartbeatTime"], heartbeat["lastTransitionTime"],
        "a heartbeat does not move the transition time"
    );
}

#[test]
fn a_taint_list_that_changes_under_us_is_reread_and_retried() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    // Another controller adds a taint between the agent's read of the node and its write.
    let (control_plane, name) = (node.control_plane, node.on.node.clone());
    let path = node.path();
    node.api.before_next(
        move |method, target| method == "PATCH" && target == path,
        move || {
            let taints = json!([{"key": "mlnode.dev/not-ready", "effect": "NoSchedule"}, nvidia_taint(),
                {"key": "example.com/maintenance", "effect": "NoExecute"}]);
            control_plane.set_taints(&name, taints);
        },
    );
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let _agent = start(&node, &model, &manifest, "");
    wait_until("taint removed", Duration::from_secs(20), || {
        node.node()["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["key"] != "mlnode.dev/not-ready")
    });
    let taint_patches = patches(&node.requests(), &node.path()).len();
    assert_eq!(
        taint_patches, 2,
        "the first failed its test and was retried after a fresh read"
    );
    assert_eq!(
        node.node()["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, {"key": "example.com/maintenance", "effect": "NoExecute"}]),
        "the taint added between our read and our write survives"
    );
}

#[test]
fn an_api_server_that_is_down_delays_but_never_fakes_the_conditions() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    node.api.state.down.store(true, Ordering::Relaxed);
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = start(&node, &model, &manifest, "");
    agent.wait_for("errors counted", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_node_condition_updates_total",
            &[("result", "error")],
        )
        .is_some_and(|n| n >= 2.0)
    });
    assert_eq!(
        agent.get("/healthz").0,
        200,
        "an unreachable API server is not a sick agent"
    );
    let up = |m: &str| sample(m, "mlnode_collector_up", &[("collector", "readiness")]);
    assert_eq!(
        up(&agent.metrics()),
        Some(0.0),
        "failing syncs: the collector is not up"
    );
    assert!(
        node.requests().iter().all(|r| r.method == "GET"),
        "nothing written while down"
    );
    assert_eq!(
        node.condition("ModelCacheVerified"),
        serde_json::Value::Null
    );
    node.api.state.down.store(false, Ordering::Relaxed);
    wait_until("written after recovery", Duration::from_secs(10), || {
        node.condition("ModelCacheVerified")["status"] == "True"
    });
    agent.wait_for("up again", Duration::from_secs(10), |m| up(m) == Some(1.0));
    assert_eq!(
        agent.log().matches("cannot sync node conditions").count(),
        1,
        "logged once, not per retry"
    );
}

#[test]
fn continuous_mode_puts_the_taint_back_when_a_gate_fails() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = start(&node, &model, &manifest, "  taint_mode: continuous\n");
    let tainted = || tainted(&node);
    wait_until("taint removed", Duration::from_secs(20), || !tainted());
    let original = model.files["config.json"].clone();
    std::fs::write(model.path("config.json"), b"{\"model_type\": \"evil\"}").unwrap();
    wait_until("taint back", Duration::from_secs(10), tainted);
    std::fs::write(model.path("config.json"), original).unwrap();
    wait_until("taint removed again", Duration::from_secs(10), || {
        !tainted()
    });
    // verify.priority auto: the corruption was found on a node in service, in the idle classes;
    // the re-verification that cleared it ran while the node held the taint, at full speed.
    let log = agent.log();
    let last_incremental = |outcome: &str| {
        log.lines()
            .rev()
            .find(|l| {
                l.contains(&format!(r#""outcome":"{outcome}""#))
                    && l.contains(r#""kind":"incremental""#)
            })
            .unwrap_or_else(|| panic!("no incremental verification {outcome}: {log}"))
    };
    assert!(last_incremental("failed").contains(r#""priority":"idle""#));
    assert!(last_incremental("verified").contains(r#""priority":"normal""#));
    let nvidia = node.node()["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["key"] == "nvidia.com/gpu")
        .count();
    assert_eq!(nvidia, 1, "the other taint is never touched");

    // Someone else puts the taint back while the cache is healthy: the agent reads the node at
    // its next write (the heartbeat, 1 s here) and takes it off again...
    let set_ours = |present: bool| {
        let mut taints = vec![nvidia_taint()];
        if present {
            taints.push(json!({"key": "mlnode.dev/not-ready", "effect": "NoSchedule"}));
        }
        node.set_taints(json!(taints));
    };
    set_ours(true);
    wait_until(
        "a foreign re-add reconciled",
        Duration::from_secs(10),
        || !tainted(),
    );
    // ...and while the cache is corrupt, a taint someone else removed is put back.
    std::fs::write(model.path("config.json"), b"{\"model_type\": \"evil\"}").unwrap();
    wait_until(
        "taint back for the corruption",
        Duration::from_secs(10),
        tainted,
    );
    set_ours(false);
    wait_until(
        "a foreign removal reconciled",
        Duration::from_secs(10),
        tainted,
    );
}

/// A model's verdict reaches its condition when the verification ends, not a round later: with
/// rounds an hour apart, the cache that appears after the first round still turns the condition
/// True within seconds, because the controller waits on the models' state as well as its clock.
#[test]
fn a_verdict_is_written_when_the_verification_ends_not_a_round_later() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&["components/startup-taint"]));
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let later = tempfile::tempdir().unwrap();
    let root = later.path().join("llama");
    let _agent = start_with(
        &node,
        "  interval: 1h\n  heartbeat: 1h\n",
        &root,
        &manifest,
        "",
    );
    wait_until("the first round", Duration::from_secs(20), || {
        node.condition("ModelCacheVerified")["status"] == "False"
    });
    std::fs::rename(model.root(), &root).unwrap();
    wait_until(
        "the verdict, long before the next round",
        Duration::from_secs(30),
        || node.condition("ModelCacheVerified")["status"] == "True",
    );
}
