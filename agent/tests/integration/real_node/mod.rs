//! The tests' real node (testbed::node::one_node_cluster), one scenario per test:
//!
//! - the node itself: `registration`, `scheduling`;
//! - the shipped GPU overlay on it, installed by the first scenario that asks and left for the
//!   next, each holding the node exclusively: the install under the startup taint
//!   (`startup_taint`); the startup phases of one pod after another (`cache_hit`,
//!   `init_containers`, `crash_restart`, `failed_pull`, `lazy`); an image pull split into its
//!   transfer and its unpack (`image_split`); the agent as its manifest says
//!   (`manifest`); weights downloaded by an init container, then loaded (`model_download`); the
//!   model's readiness gate (`readiness_gate`); each pod's accelerator gate,
//!   with the tests' device plugin (`device_gate`); a rollout (`rollout`); a kubelet restart
//!   (`kubelet_restart`);
//! - the chart installed by Helm, on the node without the overlay (`helm_chart`);
//! - a start that downloads and verifies its model before its server runs, beside whatever is
//!   installed (`verified_download`).
//!
//! `cargo test --test integration real_node::rollout` runs one (docs/testing.md).

mod cache_hit;
mod crash_restart;
mod device_gate;
mod failed_pull;
mod helm_chart;
mod image_split;
mod init_containers;
mod kubelet_restart;
mod lazy;
mod manifest;
mod model_download;
mod readiness_gate;
mod registration;
mod rollout;
mod scheduling;
mod startup_taint;
mod verified_download;

use std::sync::OnceLock;
use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};

use testbed::node::one_node_cluster::{MachineState, NodeWide, OneNodeCluster, NODE};
use testbed::node::runtime::{NODE_IP, REGISTRY, REGISTRY_RATE};
use testbed::node::workload::{
    agent_pods, agent_startup_lines, await_agent_pod, await_agent_startups, await_pod_ready,
    container_output, events_of, first_with, for_this_cluster, go_duration, image_with_weights,
    lazy_image_with_weights, model_store, open_to_all, pull_seconds, ready_agent_pod,
    weights_in_image_pod, with_download_step, workload_pod,
};

/// The shipped GPU overlay as the scenarios run against it: installed by the first that asks,
/// and left for the next.
const OVERLAY: &str = "the GPU overlay";

/// What the overlay's install made.
struct Overlay {
    /// The inference pods' namespace, the held server Ready in it.
    namespace: String,
    /// The held server's image (the workload and 64 MiB beside it), on the node since.
    image: String,
    /// The model's cache, in the node's folder.
    on_node: std::path::PathBuf,
    /// The held server's startup as the agent that saw it start reported it (a rolled agent
    /// reports none for it).
    server_startup: Value,
}

/// The overlay as its scenarios install it: with the startup taint, the NVIDIA runtime class and
/// SOCI; rendered once per run, whichever scenario asks first.
fn overlay_objects() -> Result<&'static [Value], String> {
    static RENDERED: OnceLock<Result<Vec<Value>, String>> = OnceLock::new();
    RENDERED
        .get_or_init(|| {
            testbed::renderers::kustomize::render_with(
                "overlays/gpu",
                &[
                    "components/startup-taint",
                    "components/nvidia-runtime-class",
                    "components/soci",
                ],
            )
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// An overlay scenario's start: the node held exclusively with the overlay installed, and the
/// agent's pod now (a rollout replaces it).
struct OnOverlay {
    cluster: &'static OneNodeCluster,
    node: NodeWide<'static>,
    agent_pod: String,
}

impl OnOverlay {
    fn overlay(&self) -> &Overlay {
        self.node.state()
    }

    /// The inference pods' namespace.
    fn namespace(&self) -> &str {
        &self.overlay().namespace
    }
}

/// The node held with the overlay installed, as an earlier scenario left it or now; Err when the
/// node or the overlay cannot be had (see `needs!`).
fn on_overlay() -> Result<OnOverlay, String> {
    let cluster = testbed::node::one_node_cluster::shared()?;
    let objects = overlay_objects()?;
    let node = cluster.exclusive_with(
        OVERLAY,
        |cluster| install_overlay(cluster, objects),
        |cluster| remove_overlay(cluster, objects),
    );
    Ok(OnOverlay {
        cluster,
        agent_pod: agent_pod(cluster),
        node,
    })
}

/// The overlay installed on a new GPU node its startup taint holds, the user's model and a
/// server pod waiting on it: [`held_until_the_agent_lifts_its_startup_taint`].
fn install_overlay(cluster: &OneNodeCluster, objects: &[Value]) -> Overlay {
    // 64 MiB beside the server in its image, incompressible: two seconds over the node's link.
    let filler = cluster.runtime.dir().join("filler.bin");
    let mut bytes = vec![0u8; 64 << 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    std::fs::write(&filler, bytes).unwrap();
    let held =
        held_until_the_agent_lifts_its_startup_taint(cluster, "held", &[&filler], |manifest| {
            let config = testbed::renderers::kustomize::config_with_readme_model(objects);
            let installed: Vec<Value> = for_this_cluster(cluster, objects.to_vec())
                .into_iter()
                .map(|mut o| {
                    if o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-model-manifests"
                    {
                        o["data"]["llama-3.1-8b.json"] = json!(manifest);
                    }
                    if o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-agent-config" {
                        o["data"]["config.yaml"] = json!(config);
                    }
                    o
                })
                .collect();
            cluster.admin.apply(&installed).unwrap();
        });
    let server_startup =
        await_agent_startups(cluster, &agent_pod(cluster), &held.namespace, "server", 1).remove(0);
    Overlay {
        namespace: held.namespace,
        image: held.image,
        on_node: held.on_node,
        server_startup,
    }
}

/// Removes what [`install_overlay`] made, as far as it got.
fn remove_overlay(cluster: &OneNodeCluster, objects: &[Value]) {
    let objects = for_this_cluster(cluster, objects.to_vec());
    cluster.admin.admin(
        &["delete", "--ignore-not-found", "--wait", "-f", "-"],
        &testbed::cluster::control_plane::list(objects).to_string(),
    );
    await_no_agent(cluster, "held");
}

/// The agent's pod on the node, Ready: the name the scenarios read its startups by.
fn agent_pod(cluster: &OneNodeCluster) -> String {
    await_agent_pod(cluster, None)["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string()
}

/// What an install held by the startup taint made.
struct Held {
    /// The inference pods' namespace.
    namespace: String,
    /// The held server's image.
    image: String,
    /// The model's cache, in the node's folder.
    on_node: std::path::PathBuf,
}

/// A new GPU node as GPU Feature Discovery labels it and Karpenter's startupTaints hold it, the
/// user's model where the manifests' hostPath points, and an inference pod (its image the
/// workload and `extra` files) that does not tolerate the taint: the real scheduler holds it.
/// Then `install` (given the model's manifest, README step 2) installs the agent: its DaemonSet's
/// pod runs, the agent verifies the model, sets its conditions and lifts the taint, and the held
/// pod is placed and turns Ready.
fn held_until_the_agent_lifts_its_startup_taint(
    cluster: &OneNodeCluster,
    prefix: &str,
    extra: &[&std::path::Path],
    install: impl FnOnce(String),
) -> Held {
    // A new GPU node as GPU Feature Discovery labels it and Karpenter's startupTaints hold it.
    cluster.label_as_gpu_node();
    cluster.admin.admin(
        &[
            "taint",
            "node",
            NODE,
            "mlnode.dev/not-ready:NoSchedule",
            "--overwrite",
        ],
        "",
    );
    // The user's model where the overlay's hostPath points, and its manifest (README step 2).
    let model = testbed::models::PlainModel::new();
    let on_node = cluster.runtime.dir().join("models/llama-3.1-8b");
    for (path, bytes) in &model.files {
        let file = on_node.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
    open_to_all(&on_node);
    let manifest = model.manifest_json("0e9e39f249a16976918f6564b8830bc894c89659", true);
    // Older than the racy window when the agent hashes it: the rolled agent trusts it unchanged.
    testbed::models::wait_until_settled(&on_node);

    // An inference pod that does not tolerate the startup taint: the scheduler holds it. Its
    // image is new to the node at every install, so that it is pulled.
    let namespace = cluster.namespace(prefix);
    cluster.admin.admin(
        &[
            "label",
            "namespace",
            &namespace,
            &format!("{INSTALLED_BY}={prefix}"),
        ],
        "",
    );
    let image = format!("workload:{namespace}");
    let pod = workload_pod(
        "server",
        &format!("{REGISTRY}/{image}"),
        &model_on_node(),
        2,
    );
    let workload = cluster.runtime.programs().join("workload");
    let mut files = vec![workload.as_path()];
    files.extend(extra);
    cluster.runtime.push_image(&image, &files, "/workload");
    cluster
        .admin
        .admin(&["create", "-n", &namespace, "-f", "-"], &pod.to_string());
    let held = testbed::wait_until(
        "the scheduler refusing the pod the startup taint",
        Duration::from_secs(60),
        || {
            let pod = cluster.admin.get(&["pod", "-n", &namespace, "server"]);
            let scheduled = testbed::cluster::control_plane::condition(&pod, "PodScheduled");
            (scheduled["reason"] == "Unschedulable")
                .then(|| scheduled.clone())
                .ok_or_else(|| format!("{scheduled}"))
        },
    );
    assert!(
        held["message"]
            .as_str()
            .is_some_and(|m| m.contains("untolerated taint")),
        "{held}"
    );
    // The scheduler does not name the taint: the node's only one is the startup taint.
    let taints = cluster.node().unwrap()["spec"]["taints"].clone();
    assert_eq!(
        taints,
        json!([{"key": "mlnode.dev/not-ready", "effect": "NoSchedule"}])
    );

    // The handler's RuntimeClass, made as the GPU Operator makes it.
    if !cluster
        .admin
        .kubectl(&["get", "runtimeclass", "nvidia"], "")
        .status
        .success()
    {
        cluster.admin.create(&json!({
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }));
    }
    install(manifest);
    let agent = await_agent_pod(cluster, None);
    assert_eq!(agent["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
    assert_eq!(agent["spec"]["nodeName"], NODE);
    testbed::wait_until(
        "the agent lifting its startup taint",
        Duration::from_secs(60),
        || {
            let taints = cluster.node().unwrap()["spec"]["taints"].clone();
            taints
                .as_array()
                .into_iter()
                .flatten()
                .all(|t| t["key"] != "mlnode.dev/not-ready")
                .then_some(())
                .ok_or_else(|| format!("{taints}"))
        },
    );
    for condition in AGENTS_CONDITIONS {
        assert_eq!(
            cluster.node_condition(condition).unwrap_or_default()["status"],
            "True",
            "{condition}: {:?}",
            cluster.node_condition(condition)
        );
    }
    // The pod the taint held, placed once it was lifted.
    let ready = await_pod_ready(cluster, &namespace, "server");
    assert_eq!(ready["spec"]["nodeName"], NODE);
    Held {
        namespace,
        image: format!("{REGISTRY}/{image}"),
        on_node,
    }
}

/// The label naming the install a namespace of inference pods belongs to.
const INSTALLED_BY: &str = "mlnode-test/installed-by";

/// Deletes the namespaces of the inference pods of the installs held by `prefix`, lifts the
/// startup taint where an install stopped before the agent did, and waits until the agent's pods
/// are gone.
fn await_no_agent(cluster: &OneNodeCluster, prefix: &str) {
    cluster.admin.admin(
        &[
            "delete",
            "namespace",
            "-l",
            &format!("{INSTALLED_BY}={prefix}"),
            "--wait=false",
        ],
        "",
    );
    cluster.admin.kubectl(
        &["taint", "node", NODE, "mlnode.dev/not-ready:NoSchedule-"],
        "",
    );
    testbed::wait_until("the agent uninstalled", Duration::from_secs(120), || {
        let pods = agent_pods(cluster);
        pods.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{pods:#?}"))
    })
}

/// The model's cache as the node's pods mount it.
fn model_on_node() -> std::path::PathBuf {
    std::path::PathBuf::from("/var/lib/models/llama-3.1-8b")
}

/// The node conditions the agent writes on this node (the gpu overlay's, no fabric).
const AGENTS_CONDITIONS: [&str; 2] = ["ModelCacheVerified", "AcceleratorHealthy"];

/// A phase of the agent's startup report, in seconds; fails naming it where it is absent.
fn phase_of(startup: &Value, name: &str) -> f64 {
    startup["phases"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("no {name} phase: {startup}"))
}

/// The agent's `name` phase within a second of `truth`, what the server's own clock says.
fn agrees_with_the_server(startup: &Value, name: &str, truth: f64) {
    let agent = phase_of(startup, name);
    eprintln!(
        "{}/{} {name}: agent {agent:.3} s, ground truth {truth:.3} s",
        startup["namespace"].as_str().unwrap_or_default(),
        startup["pod"].as_str().unwrap_or_default()
    );
    assert!(
        (agent - truth).abs() <= 1.0,
        "{name}: the agent says {agent:.3} s, the server's own clock {truth:.3} s: {startup}"
    );
}

/// The main container's `startedAt`, as the API keeps it (whole seconds), of `pod`.
fn started_at(cluster: &OneNodeCluster, namespace: &str, pod: &str) -> f64 {
    seconds(
        cluster.admin.get(&["pod", "-n", namespace, pod])["status"]["containerStatuses"][0]
            ["state"]["running"]["startedAt"]
            .as_str()
            .unwrap(),
    )
}

/// An RFC 3339 time as Unix seconds.
fn seconds(time: &str) -> f64 {
    humantime::parse_rfc3339(time)
        .unwrap_or_else(|e| panic!("{time}: {e}"))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `pod` created in `namespace`, once the kubelet reports it Ready.
fn create_and_await_ready(cluster: &OneNodeCluster, namespace: &str, pod: &Value) -> Value {
    cluster
        .admin
        .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
    await_pod_ready(
        cluster,
        namespace,
        pod["metadata"]["name"].as_str().unwrap(),
    )
}

/// The agent's metrics, scraped at its pod's address from the node, as Prometheus would.
fn agent_metrics(cluster: &OneNodeCluster, agent: &Value) -> String {
    let url = format!(
        "http://{}:9400/metrics",
        agent["status"]["podIP"].as_str().unwrap()
    );
    let output = cluster.runtime.inside(&["curl", "-sf", &url]);
    assert!(output.status.success(), "{url}: {output:?}");
    String::from_utf8_lossy(&output.stdout).to_string()
}
