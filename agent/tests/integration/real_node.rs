//! The tests' real node (common::node::cluster): a kubelet that registers with a node's own
//! certificate and is judged by the Node authorizer, an endpoint that asks the server who may
//! read it, a pod placed by the real scheduler, pulled from the node's registry, started under
//! runc with the runtime's default seccomp filter, and probed Ready by the kubelet; and nothing
//! of it left on the machine's kernel settings, `/run`, links or cgroup hierarchies.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use common::node::cluster::{MachineState, OneNodeCluster, NODE};
use common::node::{NODE_IP, REGISTRY, REGISTRY_RATE};

#[test]
fn the_kubelet_registers_its_node_as_system_nodes_and_leaves_the_machine_as_it_was() {
    let cluster = common::needs!(common::node::cluster::shared());
    let node = cluster.node().expect("the kubelet registered its node");
    let addresses = node["status"]["addresses"].as_array().unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == NODE_IP),
        "the node's address is its bridge's: {addresses:?}"
    );
    // The server's audit log says who the kubelet was: the node's identity, in system:nodes.
    let node_status_writers: Vec<(String, Vec<String>)> = common::audit::AuditReader::default()
        .read(cluster.audit_logs())
        .into_iter()
        .filter(|r| r.resource == "nodes/status" && r.is_write())
        .map(|r| (r.user, r.groups))
        .collect();
    assert!(
        node_status_writers.iter().any(|(user, groups)| *user
                == format!("system:node:{NODE}")
                && groups.iter().any(|g| g == "system:nodes")),
        "the kubelet writes its node's status as system:node:{NODE} in system:nodes: {node_status_writers:?}"
    );
    // The Node authorizer lets a node read only what its pods need: no Secret of its choosing.
    let kubeconfig = cluster.runtime.dir().join("kubelet/kubelet.kubeconfig");
    let as_node = cluster.runtime.inside(&[
        "kubectl",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "get",
        "secrets",
        "-n",
        "kube-system",
    ]);
    assert!(
        !as_node.status.success() && String::from_utf8_lossy(&as_node.stderr).contains("Forbidden"),
        "the node may not list Secrets: {}",
        String::from_utf8_lossy(&as_node.stderr)
    );

    // The kubelet's own endpoint: no anonymous reader, and a token only as far as the server's
    // SubjectAccessReview grants it (nodes/proxy for /pods).
    let namespace = cluster.namespace("kubelet-endpoint");
    let granted = "pod-lister";
    for account in ["nobody", granted] {
        cluster
            .admin
            .admin(&["create", "serviceaccount", "-n", &namespace, account], "");
    }
    let role = format!("{namespace}-nodes-proxy");
    cluster.admin.admin(
        &[
            "create",
            "clusterrole",
            &role,
            "--verb=get",
            "--resource=nodes/proxy",
        ],
        "",
    );
    cluster.admin.admin(
        &[
            "create",
            "clusterrolebinding",
            &role,
            "--clusterrole",
            &role,
            &format!("--serviceaccount={namespace}:{granted}"),
        ],
        "",
    );
    let endpoint = format!("https://{NODE_IP}:10250/pods");
    let status_for = |token: Option<String>| {
        let mut curl = vec![
            "curl".to_string(),
            "-sk".into(),
            "-o".into(),
            "/dev/null".into(),
            "-w".into(),
            "%{http_code}".into(),
        ];
        if let Some(token) = token {
            curl.extend(["-H".into(), format!("Authorization: Bearer {token}")]);
        }
        curl.push(endpoint.clone());
        let curl: Vec<&str> = curl.iter().map(String::as_str).collect();
        String::from_utf8_lossy(&cluster.runtime.inside(&curl).stdout).to_string()
    };
    assert_eq!(
        status_for(None),
        "401",
        "no anonymous reader of the kubelet"
    );
    assert_eq!(
        status_for(Some(cluster.admin.token(&namespace, "nobody", &[]))),
        "403",
        "a token the server grants nothing on the node"
    );
    assert_eq!(
        status_for(Some(cluster.admin.token(&namespace, granted, &[]))),
        "200",
        "a token the server grants nodes/proxy"
    );

    // The kubelet's kernel settings, the runtime's state, the node's links and the pods' cgroups
    // all stayed in the node's namespaces and under its cgroup root.
    assert_eq!(
        &MachineState::read(),
        cluster.machine_before(),
        "the machine as it was before the node started"
    );
    let kubepods = format!(
        "/sys/fs/cgroup/memory{}/kubepods",
        cluster.runtime.cgroup_root()
    );
    assert!(
        std::path::Path::new(&kubepods).is_dir(),
        "the kubelet's pods' cgroups under the node's own root, {kubepods}"
    );
}

#[test]
fn a_pod_is_placed_by_the_scheduler_pulled_started_and_probed_ready_by_the_kubelet() {
    let cluster = common::needs!(common::node::cluster::shared());
    let _node_as_it_is = cluster.sharing();
    let programs = cluster.runtime.programs().to_path_buf();
    let digest = cluster.runtime.push_image(
        "workload:placed",
        &[&programs.join("workload")],
        "/workload",
    );
    let image = format!("{REGISTRY}/workload:placed");
    let model = common::PlainModel::new();
    // The server runs as a user of its own, as inference images do; the model is readable by all.
    open_to_all(model.root());
    let namespace = cluster.namespace("placed");
    let pod = workload_pod("server", &image, model.root(), 1);
    cluster
        .admin
        .admin(&["create", "-n", &namespace, "-f", "-"], &pod.to_string());
    let ready = await_pod_ready(cluster, &namespace, "server");
    assert_eq!(ready["spec"]["nodeName"], NODE);
    let pod_ip = ready["status"]["podIP"].as_str().unwrap_or_default();
    assert!(
        pod_ip.starts_with("10.88.0."),
        "the pod's address from the CNI bridge's range: {pod_ip:?}"
    );
    assert_eq!(
        ready["status"]["containerStatuses"][0]["imageID"],
        format!("{image}@{digest}").replacen(":placed", "", 1),
        "the kubelet reports the image by the registry's digest"
    );

    let events = events_of(cluster, &namespace, "server");
    let event = |reason: &str| {
        events
            .iter()
            .find(|e| e["reason"] == reason)
            .unwrap_or_else(|| panic!("no {reason} event: {events:#?}"))
            .clone()
    };
    assert_eq!(
        event("Scheduled")["reportingComponent"],
        "default-scheduler",
        "the real scheduler placed it"
    );
    let pulled = event("Pulled")["message"].as_str().unwrap().to_string();
    assert!(
        pulled.starts_with(&format!("Successfully pulled image \"{image}\" in ")),
        "{pulled}"
    );
    event("Started");

    let lines = container_output(cluster, &namespace, "server", "server");
    let line = |name: &str| {
        lines
            .iter()
            .find(|l| l["event"] == name)
            .unwrap_or_else(|| panic!("no {name} in the container's output: {lines:?}"))
            .clone()
    };
    assert_eq!(
        line("started")["seccomp"],
        "2",
        "RuntimeDefault: containerd's default filter"
    );
    assert_eq!(
        line("model_loaded")["bytes"],
        model.files.values().map(|f| f.len() as u64).sum::<u64>()
    );
    line("ready");
    cluster
        .admin
        .admin(&["delete", "namespace", &namespace, "--wait=false"], "");
}

#[test]
fn the_shipped_gpu_overlay_runs_the_agent_whose_startup_taint_the_scheduler_honours() {
    let cluster = common::needs!(common::node::cluster::shared());
    let objects = common::needs!(common::kustomize::render_with(
        "overlays/gpu",
        &[
            "components/startup-taint",
            "components/nvidia-runtime-class"
        ]
    ));
    let _node_wide = cluster.exclusive();
    // A new GPU node as GPU Feature Discovery labels it and Karpenter's startupTaints hold it.
    cluster.admin.admin(
        &[
            "label",
            "node",
            NODE,
            "nvidia.com/gpu.present=true",
            "--overwrite",
        ],
        "",
    );
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
    let model = common::PlainModel::new();
    let on_node = cluster.runtime.dir().join("models/llama-3.1-8b");
    for (path, bytes) in &model.files {
        let file = on_node.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
    open_to_all(&on_node);
    let manifest = model.manifest_json("0e9e39f249a16976918f6564b8830bc894c89659", true);

    // An inference pod that does not tolerate the startup taint: the scheduler holds it.
    let namespace = cluster.namespace("held");
    let pod = workload_pod(
        "server",
        &format!("{REGISTRY}/workload:held"),
        std::path::Path::new("/var/lib/models/llama-3.1-8b"),
        2,
    );
    // 64 MiB beside the server in its image, incompressible: two seconds over the node's link.
    let programs = cluster.runtime.programs().to_path_buf();
    let filler = cluster.runtime.dir().join("filler.bin");
    let mut bytes = vec![0u8; 64 << 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    std::fs::write(&filler, bytes).unwrap();
    cluster.runtime.push_image(
        "workload:held",
        &[&programs.join("workload"), &filler],
        "/workload",
    );
    cluster
        .admin
        .admin(&["create", "-n", &namespace, "-f", "-"], &pod.to_string());
    let held = common::wait_until(
        "the scheduler refusing the pod the startup taint",
        Duration::from_secs(60),
        || {
            let pod = cluster.admin.get(&["pod", "-n", &namespace, "server"]);
            let scheduled = common::control_plane::condition(&pod, "PodScheduled");
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

    // The agent installed as the README says, its image from the node's registry, the handler's
    // RuntimeClass made as the GPU Operator makes it.
    let image = cluster.agent_image().to_string();
    let objects: Vec<Value> = objects
        .into_iter()
        // The Prometheus Operator's kinds: no operator on this cluster.
        .filter(|o| {
            !o["apiVersion"]
                .as_str()
                .unwrap()
                .starts_with("monitoring.coreos.com/")
        })
        .map(|mut o| {
            if o["kind"] == "DaemonSet" {
                o["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
            }
            if o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-model-manifests" {
                o["data"]["llama-3.1-8b.json"] = json!(manifest);
            }
            o
        })
        .collect();
    cluster.admin.create(&json!({
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }));
    cluster.admin.apply(&objects).unwrap();
    let agent = common::wait_until(
        "the DaemonSet's pod Ready on the node",
        Duration::from_secs(180),
        || {
            let pods = cluster.admin.get(&[
                "pods",
                "-n",
                "mlnode-system",
                "-l",
                "app.kubernetes.io/name=mlnode-agent",
            ]);
            let pod = pods["items"].get(0).cloned().unwrap_or(Value::Null);
            (common::control_plane::condition(&pod, "Ready")["status"] == "True")
                .then(|| pod.clone())
                .ok_or_else(|| format!("{:#}\n{}", pod["status"], cluster.logs()))
        },
    );
    assert_eq!(agent["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
    assert_eq!(agent["spec"]["nodeName"], NODE);
    common::wait_until(
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
    for condition in ["ModelCacheVerified", "AcceleratorHealthy"] {
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
    let agent_pod = agent["metadata"]["name"].as_str().unwrap();
    phases_agree_with_the_kubelet_and_the_server(cluster, agent_pod, &namespace, "server");
    let image = format!("{REGISTRY}/workload:held");
    a_second_pod_on_the_image_is_a_cache_hit(cluster, agent_pod, &namespace, &image);
    the_kubelet_folds_the_agents_gate_into_ready(cluster, &namespace, &image, &on_node);

    // The kubelet ran the agent as the manifest says, under the runtime's default seccomp filter:
    // UID 0 with no capability in any set, no new privileges; and its requests carried the
    // service-account token the kubelet projected, bound to its pod on this node.
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
    let agent_requests: Vec<common::audit::Request> = common::audit::AuditReader::default()
        .read(cluster.audit_logs())
        .into_iter()
        .filter(|r| r.user == "system:serviceaccount:mlnode-system:mlnode-agent")
        .collect();
    assert!(
        !agent_requests.is_empty() && agent_requests.iter().all(|r| r.node == NODE),
        "the agent's requests with its projected token, bound to {NODE}: {agent_requests:?}"
    );
}

/// The agent's startup phases for `pod` against ground truth: `image_pull` is the kubelet's own
/// figure; `container_start` ends, `model_load` spans and `readiness` spans, within a second, what
/// the server logged with its own clock (its first line, its last weight file read, its readiness
/// endpoint turning 200 plus the probe's period).
fn phases_agree_with_the_kubelet_and_the_server(
    cluster: &OneNodeCluster,
    agent_pod: &str,
    namespace: &str,
    pod: &str,
) {
    let startup = await_agent_startups(cluster, agent_pod, namespace, pod, 1).remove(0);
    let phase = |name: &str| {
        startup["phases"][name]
            .as_f64()
            .unwrap_or_else(|| panic!("no {name} phase: {startup}"))
    };
    let events = events_of(cluster, namespace, pod);
    let pulled = events
        .iter()
        .find(|e| e["reason"] == "Pulled")
        .unwrap_or_else(|| panic!("no Pulled event: {events:#?}"));
    let message = pulled["message"].as_str().unwrap();
    let kubelet_pull = message
        .split_once("\" in ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(go_duration)
        .unwrap_or_else(|| panic!("the kubelet's pull time in {message:?}"));
    assert!(
        (phase("image_pull") - kubelet_pull).abs() < 1e-6,
        "image_pull {} against the kubelet's {message:?}",
        phase("image_pull")
    );
    // What the node's link allows: the image's blobs at its rate, plus the pull's own work.
    let image = pulled["message"]
        .as_str()
        .unwrap()
        .split('"')
        .nth(1)
        .unwrap();
    let manifest: Value =
        serde_json::from_str(&cluster.runtime.crane(&["manifest", image])).unwrap();
    let blobs: u64 = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .chain([&manifest["config"]])
        .map(|b| b["size"].as_u64().unwrap())
        .sum();
    let transfer = blobs as f64 / REGISTRY_RATE as f64;
    eprintln!(
        "{namespace}/{pod} image_pull: agent {:.3} s, kubelet {kubelet_pull:.3} s, {blobs} bytes at the link's rate {transfer:.3} s",
        phase("image_pull")
    );
    assert!(
        phase("image_pull") >= transfer * 0.95 && phase("image_pull") <= transfer + 3.0,
        "image_pull {:.3} s for {blobs} bytes at {REGISTRY_RATE} bytes/s ({transfer:.3} s)",
        phase("image_pull")
    );
    let lines = container_output(cluster, namespace, pod, pod);
    let at = |event: &str| {
        let line = lines
            .iter()
            .find(|l| l["event"] == event)
            .unwrap_or_else(|| panic!("no {event} in the server's output: {lines:?}"));
        seconds(line["at"].as_str().unwrap())
    };
    let pull_end = seconds(
        pulled["lastTimestamp"]
            .as_str()
            .or(pulled["eventTime"].as_str())
            .unwrap(),
    );
    let agree = |name: &str, truth: f64| {
        eprintln!(
            "{namespace}/{pod} {name}: agent {:.3} s, ground truth {truth:.3} s",
            phase(name)
        );
        assert!(
            (phase(name) - truth).abs() <= 1.0,
            "{name}: the agent says {:.3} s, the server's own clock {truth:.3} s: {startup}",
            phase(name)
        );
    };
    agree("container_start", at("started") - pull_end);
    agree("model_load", at("model_loaded") - at("started"));
    agree("readiness", at("ready") - at("model_loaded"));
    assert_eq!(startup["model_name"], "llama-3.1-8b");
}

/// A second pod on an image the node holds: the kubelet's "already present" event, counted by
/// the agent as a cache hit of no pull time.
fn a_second_pod_on_the_image_is_a_cache_hit(
    cluster: &OneNodeCluster,
    agent_pod: &str,
    namespace: &str,
    image: &str,
) {
    let pod = workload_pod(
        "server-2",
        image,
        std::path::Path::new("/var/lib/models/llama-3.1-8b"),
        0,
    );
    cluster
        .admin
        .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
    await_pod_ready(cluster, namespace, "server-2");
    let startup = await_agent_startups(cluster, agent_pod, namespace, "server-2", 1).remove(0);
    assert_eq!(startup["phases"]["image_pull"], 0.0, "{startup}");
    assert_eq!(startup["pulls"][0]["cache_hit"], true, "{startup}");
    assert!(
        events_of(cluster, namespace, "server-2")
            .iter()
            .any(|e| e["reason"] == "Pulled"
                && e["message"]
                    .as_str()
                    .unwrap()
                    .contains("already present on machine")),
        "the kubelet found the image on the node"
    );
}

/// A pod with the model's readiness gate: the kubelet's `Ready` turns True only once the agent's
/// gate condition is, and False when the model no longer verifies; the kubelet's own
/// `ContainersReady` stays True throughout, and the agent's condition is left as it wrote it.
fn the_kubelet_folds_the_agents_gate_into_ready(
    cluster: &OneNodeCluster,
    namespace: &str,
    image: &str,
    model_on_node: &std::path::Path,
) {
    let mut pod = workload_pod(
        "gated",
        image,
        std::path::Path::new("/var/lib/models/llama-3.1-8b"),
        0,
    );
    pod["metadata"]["annotations"] = json!({"mlnode.dev/model": "llama-3.1-8b"});
    pod["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    cluster
        .admin
        .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
    let ready = await_pod_ready(cluster, namespace, "gated");
    let gate = common::control_plane::condition(&ready, GATE);
    assert_eq!(gate["status"], "True", "{gate}");
    let transition = |condition: &Value| seconds(condition["lastTransitionTime"].as_str().unwrap());
    assert!(
        transition(&common::control_plane::condition(&ready, "Ready")) >= transition(&gate),
        "Ready turned True no earlier than the agent's gate: {:#}",
        ready["status"]["conditions"]
    );

    // A weight file rewritten: the agent re-verifies it and turns the gate False; the kubelet
    // folds that into Ready, the container still running and ready.
    let shard = model_on_node.join("model-00001-of-00002.safetensors");
    let original = std::fs::read(&shard).unwrap();
    let mut corrupt = original.clone();
    corrupt[0] ^= 0xff;
    std::fs::write(&shard, &corrupt).unwrap();
    let unready = common::wait_until(
        "the kubelet's Ready False on the agent's gate",
        Duration::from_secs(60),
        || {
            let pod = cluster.admin.get(&["pod", "-n", namespace, "gated"]);
            let ready = common::control_plane::condition(&pod, "Ready");
            (ready["status"] == "False")
                .then(|| pod.clone())
                .ok_or_else(|| format!("{:#}", pod["status"]["conditions"]))
        },
    );
    assert_eq!(
        common::control_plane::condition(&unready, GATE)["status"],
        "False"
    );
    assert_eq!(
        common::control_plane::condition(&unready, "ContainersReady")["status"],
        "True",
        "the agent leaves the kubelet's conditions alone"
    );
    std::fs::write(&shard, &original).unwrap();
    let ready = await_pod_ready(cluster, namespace, "gated");
    assert_eq!(
        common::control_plane::condition(&ready, GATE)["status"],
        "True"
    );
}

/// The pod readiness gate the agent keeps for a pod's model.
const GATE: &str = "mlnode.dev/ModelVerified";

/// The breakdowns of `pod`'s startups the agent logged ("pod startup" lines), once it has logged
/// `count` of them.
fn await_agent_startups(
    cluster: &OneNodeCluster,
    agent_pod: &str,
    namespace: &str,
    pod: &str,
    count: usize,
) -> Vec<Value> {
    common::wait_until(
        &format!("the agent's startup of {namespace}/{pod}"),
        Duration::from_secs(60),
        || {
            let lines = container_output(cluster, "mlnode-system", agent_pod, "agent");
            let startups: Vec<Value> = lines
                .iter()
                .filter(|l| {
                    l["message"] == "pod startup" && l["namespace"] == namespace && l["pod"] == pod
                })
                .map(|l| serde_json::from_str(l["phases"].as_str().unwrap()).unwrap())
                .collect();
            (startups.len() >= count)
                .then(|| startups.clone())
                .ok_or_else(|| format!("{} lines of the agent's, none for {pod}", lines.len()))
        },
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

/// A Go duration as the kubelet prints a pull's: `812ms`, `1.5s`, `2m3.5s`.
fn go_duration(text: &str) -> Option<f64> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|ms| ms / 1000.0);
    }
    let (minutes, rest) = text.split_once('m').unwrap_or(("0", text));
    Some(minutes.parse::<f64>().ok()? * 60.0 + rest.strip_suffix('s')?.parse::<f64>().ok()?)
}

/// The tests' inference server as a pod: non-root, nothing added, RuntimeDefault seccomp, its
/// model through a read-only hostPath, its readiness endpoint probed every second.
fn workload_pod(name: &str, image: &str, model: &std::path::Path, ready_after_s: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": name,
                "image": image,
                "args": [
                    "--model", "/model",
                    "--listen", "0.0.0.0:8000",
                    "--ready-after", format!("{ready_after_s}s"),
                ],
                "ports": [{"containerPort": 8000}],
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": 8000},
                    "periodSeconds": 1,
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "model", "mountPath": "/model", "readOnly": true}],
            }],
            "volumes": [{
                "name": "model",
                "hostPath": {"path": model, "type": "Directory"},
            }],
        },
    })
}

fn open_to_all(root: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in walkdir::WalkDir::new(root).into_iter().flatten() {
        let mode = if entry.file_type().is_dir() {
            0o755
        } else {
            0o644
        };
        std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// The pod once the kubelet reports it Ready; fails with its state and the node's logs.
fn await_pod_ready(cluster: &OneNodeCluster, namespace: &str, name: &str) -> Value {
    common::wait_until(
        &format!("pod {namespace}/{name} Ready"),
        Duration::from_secs(120),
        || {
            let pod = cluster.admin.get(&["pod", "-n", namespace, name]);
            let ready = common::control_plane::condition(&pod, "Ready");
            if ready["status"] == "True" {
                Ok(pod)
            } else {
                Err(format!("{:#}\n{}", pod["status"], cluster.logs()))
            }
        },
    )
}

fn events_of(cluster: &OneNodeCluster, namespace: &str, pod: &str) -> Vec<Value> {
    let events = cluster.admin.get(&[
        "events",
        "-n",
        namespace,
        "--field-selector",
        &format!("involvedObject.name={pod}"),
    ]);
    events["items"].as_array().cloned().unwrap_or_default()
}

/// The JSON lines a container wrote, from the kubelet's log of it (CRI format: time, stream,
/// tag, line) under the node's `/var/log/pods`.
fn container_output(
    cluster: &OneNodeCluster,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Vec<Value> {
    let script = format!("cat /var/log/pods/{namespace}_{pod}_*/{container}/*.log");
    let output = cluster.runtime.inside(&["sh", "-c", &script]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.splitn(4, ' ').nth(3))
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}
