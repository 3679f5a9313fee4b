//! The tests' inference server and the agent on the real node (crate::node::one_node_cluster): the
//! server's images and pods, the agent's pod, and what each of them and the kubelet logged. Shared
//! by real_node.rs and the lazy-loading bench.

use std::time::Duration;

use serde_json::{json, Value};

use crate::node::one_node_cluster::OneNodeCluster;
use crate::node::runtime::REGISTRY;

/// The agent's rendered objects as the README installs them, on this cluster: its image from the
/// node's registry, and without the Prometheus Operator's kinds (no operator here).
pub fn for_this_cluster(cluster: &OneNodeCluster, objects: Vec<Value>) -> Vec<Value> {
    let image = cluster.agent_image().to_string();
    objects
        .into_iter()
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
            o
        })
        .collect()
}

/// The agent's pod on the node once it is Ready, the one whose uid is not `not` where given.
pub fn await_agent_pod(cluster: &OneNodeCluster, not: Option<&str>) -> Value {
    crate::wait_until(
        "the DaemonSet's pod Ready on the node",
        Duration::from_secs(180),
        || ready_agent_pod(cluster, not),
    )
}

/// The node's one agent pod, if it is Ready (and its uid is not `not` where given).
pub fn ready_agent_pod(cluster: &OneNodeCluster, not: Option<&str>) -> Result<Value, String> {
    let items = agent_pods(cluster);
    match &items[..] {
        [pod]
            if not.is_none_or(|uid| pod["metadata"]["uid"] != uid)
                && crate::cluster::control_plane::condition(pod, "Ready")["status"] == "True" =>
        {
            Ok(pod.clone())
        }
        _ => Err(format!(
            "{:#?}\n{}",
            items.iter().map(|p| &p["status"]).collect::<Vec<_>>(),
            cluster.logs()
        )),
    }
}

/// The agent's pods (of every DaemonSet of the install).
pub fn agent_pods(cluster: &OneNodeCluster) -> Vec<Value> {
    let pods = cluster.admin.get(&[
        "pods",
        "-n",
        "mlnode-system",
        "-l",
        "app.kubernetes.io/name=mlnode-agent",
    ]);
    pods["items"].as_array().cloned().unwrap_or_default()
}

/// The breakdowns of `pod`'s startups the agent logged ("pod startup" lines), once it has logged
/// `count` of them.
pub fn await_agent_startups(
    cluster: &OneNodeCluster,
    agent_pod: &str,
    namespace: &str,
    pod: &str,
    count: usize,
) -> Vec<Value> {
    let startups = crate::wait_until(
        &format!("the agent's startup of {namespace}/{pod}"),
        Duration::from_secs(60),
        || {
            let startups: Vec<Value> = agent_startup_lines(cluster, agent_pod)
                .into_iter()
                .filter(|l| l["namespace"] == namespace && l["pod"] == pod)
                .map(|l| serde_json::from_str(l["phases"].as_str().unwrap()).unwrap())
                .collect();
            (startups.len() >= count)
                .then(|| startups.clone())
                .ok_or_else(|| format!("{} startups for {pod}", startups.len()))
        },
    );
    for startup in &startups {
        eprintln!("{namespace}/{pod} the agent's startup: {startup}");
    }
    startups
}

/// Every "pod startup" line of the agent's log (by its pod's name, restarts included).
pub fn agent_startup_lines(cluster: &OneNodeCluster, agent_pod: &str) -> Vec<Value> {
    container_output(cluster, "mlnode-system", agent_pod, "agent")
        .into_iter()
        .filter(|l| l["message"] == "pod startup")
        .collect()
}

/// The first of `items` whose `key` is `value`; fails with all of them.
pub fn first_with(items: &[Value], key: &str, value: &str) -> Value {
    items
        .iter()
        .find(|item| item[key] == value)
        .unwrap_or_else(|| panic!("none with {key} {value:?} in {items:#?}"))
        .clone()
}

/// The pull time of the kubelet's `Successfully pulled image "x" in 1.5s (…)`.
pub fn pull_seconds(message: &str) -> f64 {
    message
        .split_once("\" in ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(go_duration)
        .unwrap_or_else(|| panic!("the kubelet's pull time in {message:?}"))
}

/// A Go duration as the kubelet prints a pull's: `812ms`, `1.5s`, `2m3.5s`.
pub fn go_duration(text: &str) -> Option<f64> {
    for (unit, scale) in [("µs", 1e-6), ("us", 1e-6), ("ns", 1e-9)] {
        if let Some(value) = text.strip_suffix(unit) {
            return value.parse::<f64>().ok().map(|v| v * scale);
        }
    }
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|ms| ms / 1000.0);
    }
    let (minutes, rest) = text.split_once('m').unwrap_or(("0", text));
    Some(minutes.parse::<f64>().ok()? * 60.0 + rest.strip_suffix('s')?.parse::<f64>().ok()?)
}

/// The tests' inference server as a pod: non-root, nothing added, RuntimeDefault seccomp, its
/// model through a read-only hostPath, its readiness endpoint probed every second.
pub fn workload_pod(name: &str, image: &str, model: &std::path::Path, ready_after_s: u64) -> Value {
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

/// Makes every folder and file under `root` readable by all, as a node's model cache is to its
/// pods' users.
pub fn open_to_all(root: &std::path::Path) {
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
pub fn await_pod_ready(cluster: &OneNodeCluster, namespace: &str, name: &str) -> Value {
    crate::wait_until(
        &format!("pod {namespace}/{name} Ready"),
        Duration::from_secs(120),
        || {
            let pod = cluster.admin.get(&["pod", "-n", namespace, name]);
            let ready = crate::cluster::control_plane::condition(&pod, "Ready");
            if ready["status"] == "True" {
                Ok(pod)
            } else {
                Err(format!("{:#}\n{}", pod["status"], cluster.logs()))
            }
        },
    )
}

/// The Events the cluster holds for `pod`.
pub fn events_of(cluster: &OneNodeCluster, namespace: &str, pod: &str) -> Vec<Value> {
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
pub fn container_output(
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

/// The server's image with 64 MiB of weights in a layer of their own under `/weights`, two shards
/// (two seconds at the link's rate), readable by the server's user, pushed as `workload:<tag>`;
/// `seed` makes the layer one no other image shares, so no snapshot of another image stands in
/// for it. The weights' layer digest and size.
pub fn image_with_weights(cluster: &OneNodeCluster, tag: &str, seed: u8) -> (String, u64) {
    let shards: Vec<Shard> = (1..=2u8)
        .map(|shard| Shard {
            path: format!("model-0000{shard}-of-00002.safetensors"),
            seed: seed + shard,
            bytes: 32 << 20,
        })
        .collect();
    image_with_shards(cluster, tag, &shards)
}

/// One file of an image's weights: its path under `/weights`, its content's seed and its size.
pub struct Shard {
    pub path: String,
    pub seed: u8,
    pub bytes: usize,
}

/// The server's image with `shards` in a layer of their own under `/weights`, readable by the
/// server's user, pushed as `workload:<tag>`. The weights' layer digest and size.
pub fn image_with_shards(cluster: &OneNodeCluster, tag: &str, shards: &[Shard]) -> (String, u64) {
    image_with_layers(cluster, tag, &[shards]).remove(0)
}

/// The server's image with a layer on top of its own for each of `layers`, each holding its
/// shards under `/weights`, readable by the server's user, pushed as `workload:<tag>`. Each
/// added layer's digest and size, in the manifest's order.
pub fn image_with_layers(
    cluster: &OneNodeCluster,
    tag: &str,
    layers: &[&[Shard]],
) -> Vec<(String, u64)> {
    let runtime = &cluster.runtime;
    runtime.push_image(
        "workload:soci-base",
        &[&runtime.programs().join("workload")],
        "/workload",
    );
    let mut append = vec![
        "append".to_string(),
        "-b".into(),
        format!("{REGISTRY}/workload:soci-base"),
    ];
    let mut tars = Vec::new();
    for (n, shards) in layers.iter().enumerate() {
        let weights = runtime.dir().join(format!("soci-weights-{tag}-{n}"));
        for shard in *shards {
            let file = weights.join("weights").join(&shard.path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, crate::models::content(shard.seed, shard.bytes)).unwrap();
        }
        open_to_all(&weights);
        let tar = weights.with_extension("tar");
        let output = std::process::Command::new("tar")
            .arg("-C")
            .arg(&weights)
            .args(["-cf", tar.to_str().unwrap(), "."])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let _ = std::fs::remove_dir_all(&weights);
        append.extend(["-f".to_string(), tar.display().to_string()]);
        tars.push(tar);
    }
    let image = format!("{REGISTRY}/workload:{tag}");
    append.extend(["-t".to_string(), image.clone()]);
    runtime.crane(&append.iter().map(String::as_str).collect::<Vec<_>>());
    for tar in tars {
        let _ = std::fs::remove_file(tar);
    }
    let manifest: Value = serde_json::from_str(&runtime.crane(&["manifest", &image])).unwrap();
    manifest["layers"].as_array().unwrap()[1..]
        .iter()
        .map(|layer| {
            (
                layer["digest"].as_str().unwrap().to_string(),
                layer["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// [`image_with_weights`] given a SOCI index as `workload:<tag>`; its weights' layer digest and
/// size, and its reference.
pub fn lazy_image_with_weights(
    cluster: &OneNodeCluster,
    tag: &str,
    seed: u8,
) -> (String, u64, String) {
    let source = format!("{tag}-source");
    let (layer, size) = image_with_weights(cluster, &source, seed);
    cluster
        .runtime
        .push_soci_converted(&format!("workload:{source}"), &format!("workload:{tag}"));
    (layer, size, format!("{REGISTRY}/workload:{tag}"))
}

/// A server that reads the weights its image holds (`/weights`), with no model volume.
pub fn weights_in_image_pod(name: &str, image: &str) -> Value {
    let mut pod = workload_pod(name, image, std::path::Path::new("/"), 0);
    pod["spec"]["containers"][0]["args"][1] = json!("/weights");
    pod["spec"]["containers"][0]["volumeMounts"] = json!([]);
    pod["spec"]["volumes"] = json!([]);
    pod
}

/// A model store in `namespace`: the tests' workload serving the node's folder
/// `models/<namespace>` at `rate` bytes a second, each response cut after `cut_after` bytes where
/// given (its Content-Length still the whole file's); its URL once it answers.
pub fn model_store(
    cluster: &OneNodeCluster,
    namespace: &str,
    image: &str,
    rate: u64,
    cut_after: Option<u64>,
) -> String {
    let mut serve = vec![
        "--serve".to_string(),
        "/store".into(),
        "--listen".into(),
        "0.0.0.0:8080".into(),
        "--rate".into(),
        rate.to_string(),
    ];
    serve.extend(cut_after.map(|n| format!("--cut-after={n}")));
    cluster.admin.admin(
        &["create", "-n", namespace, "-f", "-"],
        &json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "store"},
            "spec": {
                "containers": [{
                    "name": "store",
                    "image": image,
                    "args": serve,
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "store", "mountPath": "/store", "readOnly": true}],
                }],
                "volumes": [{"name": "store", "hostPath": {"path": format!("/var/lib/models/{namespace}"), "type": "Directory"}}],
            },
        })
        .to_string(),
    );
    let ip = await_pod_ready(cluster, namespace, "store")["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    format!("http://{ip}:8080")
}

/// `pod` given an init container that downloads `files` (comma-separated) from the model store at
/// `store` into its model volume (`/model`) before its server starts, as a download step does:
/// the server's container, run as the download (`--download`), without its probe or port.
pub fn with_download_step(mut pod: Value, store: &str, files: &str) -> Value {
    let mut download = pod["spec"]["containers"][0].clone();
    download["name"] = json!("download");
    download["args"] = json!(["--download", store, "--files", files, "--to", "/model"]);
    download.as_object_mut().unwrap().remove("readinessProbe");
    download.as_object_mut().unwrap().remove("ports");
    pod["spec"]["initContainers"] = json!([download]);
    pod
}

/// The layers of `image` in the node's registry (digest and size, in the manifest's order) and
/// the bytes of those the node's content store does not hold yet: what a pull of it fetches.
pub fn layers_to_fetch(cluster: &OneNodeCluster, image: &str) -> (Vec<(String, u64)>, u64) {
    let manifest: Value =
        serde_json::from_str(&cluster.runtime.crane(&["manifest", image])).unwrap();
    let layers: Vec<(String, u64)> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().unwrap().to_string(),
                l["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let blobs = cluster
        .runtime
        .dir()
        .join("containerd/root/io.containerd.content.v1.content/blobs/sha256");
    let new = layers
        .iter()
        .filter(|(digest, _)| !blobs.join(&digest["sha256:".len()..]).exists())
        .map(|(_, size)| size)
        .sum();
    (layers, new)
}
