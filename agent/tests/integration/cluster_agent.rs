//! The agent binary end to end against a real kube-apiserver (testbed::cluster::control_plane), as its
//! DaemonSet runs it: the shipped RBAC and admission policies installed, its token bound to its
//! pod on its node. What it writes lands (node conditions, the repair engines' condition, the
//! startup taint removed beside a foreign one, model labels, pods' gates, the node's Event), no
//! request of its own is refused.

use std::path::Path;
use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{sample, Agent};
use testbed::cluster::control_plane::{self, condition, AgentOnNode, ControlPlane};
use testbed::models::PlainModel;
use testbed::needs;

const GATE: &str = "mlnode.dev/ModelVerified";

/// The overlay with every component whose writes the agent makes here.
fn agent_on_node(control_plane: &ControlPlane) -> AgentOnNode {
    let objects = testbed::renderers::kustomize::render_with(
        "overlays/gpu",
        &[
            "components/startup-taint",
            "components/model-labels",
            "components/repair-condition",
        ],
    )
    .unwrap_or_else(|reason| panic!("kustomize (kubectl) is needed: {reason}"));
    AgentOnNode::start(control_plane, &objects, &control_plane.unique("node"))
}

/// The agent binary with its pod's token, on its node, with `config` (the test's harness adds
/// its listen address).
fn run(control_plane: &ControlPlane, on: &AgentOnNode, dir: &Path, config: &str) -> Agent {
    let kubeconfig = control_plane.token_kubeconfig(&on.token, dir);
    Agent::start_with_env(
        config,
        &[
            ("KUBECONFIG", &kubeconfig),
            ("MLNODE_NODE_NAME", Path::new(&on.node)),
        ],
    )
}

fn wait_for(what: &str, check: impl Fn() -> Result<(), String>) {
    testbed::wait_until(what, Duration::from_secs(60), check);
}

#[test]
fn the_agents_verdicts_land_on_its_node_and_pods_and_nothing_it_sends_is_refused() {
    let control_plane = needs!(control_plane::shared());
    let on = agent_on_node(control_plane);
    control_plane.taint_gpu_node(&on.node);
    let inference = control_plane.namespace("inference", json!({}));
    let name = control_plane.unique("vllm");
    control_plane.create_pod(
        &inference,
        &testbed::cluster::pods::gated_vllm_pod(
            "",
            &name,
            &on.node,
            "/var/lib/models",
            json!({"mlnode.dev/model": "llama"}),
        ),
    );
    let model = PlainModel::new();
    let (dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1h\n  startup_taint: mlnode.dev/not-ready:NoSchedule\n  model_labels: true\n  repair_condition: AcceleratedHardwareReady\n{}    host_path: /var/lib/models/llama\n",
        testbed::agent::model_config("llama", model.root(), &manifest)
    );
    let agent = run(control_plane, &on, dir.path(), &config);

    wait_for("the node's verdicts, taint and label", || {
        let node = control_plane.get(&["node", &on.node]);
        let statuses: Vec<Value> = [
            "ModelCacheVerified",
            "AcceleratorHealthy",
            "AcceleratedHardwareReady",
        ]
        .iter()
        .map(|kind| condition(&node, kind)["status"].clone())
        .collect();
        let done = statuses == [json!("True"), json!("True"), json!("True")]
            && node["spec"]["taints"]
                == json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
            && node["metadata"]["labels"]["models.mlnode.dev/llama"] == "v1";
        if done {
            Ok(())
        } else {
            Err(format!("{node:#}\nagent log:\n{}", agent.log()))
        }
    });
    let node = control_plane.get(&["node", &on.node]);
    assert_eq!(
        condition(&node, "Ready")["reason"],
        "KubeletReady",
        "the kubelet's condition as it was"
    );
    wait_for("the pod's gate True", || {
        let pod = control_plane.get(&["pod", &name, "-n", &inference]);
        (condition(&pod, GATE)["status"] == "True")
            .then_some(())
            .ok_or(format!("{pod:#}"))
    });
    // The taint's removal is said on the Node, in `default`, where node events go.
    wait_for("the StartupTaintRemoved event", || {
        let events = control_plane.get(&[
            "events",
            "-n",
            "default",
            &format!(
                "--field-selector=involvedObject.name={},reason=StartupTaintRemoved",
                on.node
            ),
        ]);
        (!events["items"].as_array().unwrap().is_empty())
            .then_some(())
            .ok_or(events.to_string())
    });
    let metrics = agent.metrics();
    let refused = control_plane::refused_requests(&metrics);
    assert_eq!(refused, Vec::<String>::new(), "{}", agent.log());
    assert!(
        sample(
            &metrics,
            "mlnode_kube_requests_total",
            &[("resource", "nodes/status"), ("code", "200")]
        )
        .is_some(),
        "{metrics}"
    );
}

/// One install, two pools serving different models: each model's `node_selector` picks its
/// nodes by their labels, which each agent reads from its own Node. The GPU pool's agent keeps its
/// model and not the Inferentia pool's, and the other way round; a node neither selects keeps none
/// and says so in ModelCacheVerified.
#[test]
fn each_pool_keeps_the_models_its_labels_select() {
    let control_plane = needs!(control_plane::shared());
    let objects = testbed::renderers::kustomize::render_with("overlays/gpu", &[])
        .unwrap_or_else(|reason| panic!("kustomize (kubectl) is needed: {reason}"));
    let gpu_model = PlainModel::new();
    let inf_model = PlainModel::new();
    let (dir, gpu_manifest) = testbed::write_temp(&gpu_model.manifest_json("g1", true));
    let inf_manifest = dir.path().join("inf.json");
    std::fs::write(&inf_manifest, inf_model.manifest_json("i1", true)).unwrap();
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\nmodels:\n  - name: qwen-gpu\n    root: {:?}\n    manifest: {:?}\n    node_selector: {{pool: gpu-inference}}\n  - name: llama-neuron\n    root: {:?}\n    manifest: {:?}\n    node_selector: {{pool: inf2-inference, karpenter.k8s.aws/instance-accelerator-manufacturer: aws}}\n",
        gpu_model.root(),
        gpu_manifest,
        inf_model.root(),
        inf_manifest,
    );
    let pool = |labels: Value| {
        let name = control_plane.unique("node");
        let node = control_plane::node(&name, json!({"metadata": {"labels": labels}}));
        AgentOnNode::start_on(control_plane, &objects, &node)
    };
    let on_gpu = pool(json!({"pool": "gpu-inference"}));
    let on_inf = pool(
        json!({"pool": "inf2-inference", "karpenter.k8s.aws/instance-accelerator-manufacturer": "aws"}),
    );
    // The Inferentia pool's label without the second one its model asks for.
    let on_neither = pool(json!({"pool": "inf2-inference"}));
    let dirs = [
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    ];
    let agents: Vec<Agent> = [&on_gpu, &on_inf, &on_neither]
        .iter()
        .zip(&dirs)
        .map(|(on, dir)| run(control_plane, on, dir.path(), &config))
        .collect();
    for ((on, agent), (kept, reason)) in [&on_gpu, &on_inf, &on_neither].iter().zip(&agents).zip([
        (Some("qwen-gpu"), "AllModelCachesVerified"),
        (Some("llama-neuron"), "AllModelCachesVerified"),
        (None, "NoModelsConfigured"),
    ]) {
        wait_for("ModelCacheVerified True", || {
            let node = control_plane.get(&["node", &on.node]);
            let verified = condition(&node, "ModelCacheVerified");
            (verified["status"] == "True" && verified["reason"] == reason)
                .then_some(())
                .ok_or_else(|| format!("{verified}\n{}", agent.log()))
        });
        let metrics = agent.metrics();
        for model in ["qwen-gpu", "llama-neuron"] {
            let verified = sample(
                &metrics,
                "mlnode_model_cache_verified",
                &[("model_name", model)],
            );
            assert_eq!(
                verified.is_some(),
                Some(model) == kept,
                "{}: {model}: {verified:?}\n{}",
                on.node,
                agent.log()
            );
        }
    }
}
