//! A start that downloads its model and verifies it before the server runs, as
//! deploy/examples/vllm-with-verified-download.yaml deploys it: the example's pod on the real node,
//! its model served by a store on the node at a held rate, whole and cut short.

use super::*;

/// What the store holds and the example's manifest names: the revision the example pins.
const REVISION: &str = "0e9e39f249a16976918f6564b8830bc894c89659";

/// The store's rate: the model's 505 KB in about two seconds.
const STORE_RATE: u64 = 256 << 10;

/// The whole model downloaded at the store's rate, verified, then loaded: the server starts only
/// after both steps, on every byte.
#[test]
fn a_downloaded_model_is_verified_before_the_server_starts() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    let _node_as_it_is = cluster.sharing();
    let start = VerifiedStart::new(cluster, "download-whole", None);
    let ready = await_pod_ready(cluster, &start.namespace, "server");
    let steps = &ready["status"]["initContainerStatuses"];
    for step in 0..2 {
        assert_eq!(
            steps[step]["state"]["terminated"]["exitCode"], 0,
            "{:#}",
            steps[step]
        );
    }
    let download = container_output(cluster, &start.namespace, "server", "download-model");
    let at = |event: &str| {
        seconds(
            first_with(&download, "event", event)["at"]
                .as_str()
                .unwrap(),
        )
    };
    let took = at("downloaded") - at("download_started");
    let bytes = start.model.files.values().map(Vec::len).sum::<usize>();
    let held = bytes as f64 / STORE_RATE as f64;
    eprintln!(
        "verified start: {bytes} bytes downloaded in {took:.3} s ({held:.3} s at the store's rate)"
    );
    assert!(
        took >= held * 0.9,
        "{bytes} bytes downloaded in {took:.3} s, at the store's rate {held:.3} s"
    );
    let served = container_output(cluster, &start.namespace, "server", "vllm");
    assert_eq!(
        first_with(&served, "event", "model_loaded")["bytes"],
        bytes,
        "the server read the whole model"
    );
    start.remove(cluster);
}

/// The store ends every response after 100,000 bytes and the download step exits 0 all the same,
/// as a download followed by `; echo done` does: the verify step refuses the partial model, the
/// pod stays in its init containers with the verifier's reason as that step's termination message,
/// and the server never starts.
#[test]
fn a_download_cut_short_stops_the_start_with_the_verifiers_reason() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    let _node_as_it_is = cluster.sharing();
    let start = VerifiedStart::new(cluster, "download-cut", Some(100_000));
    let refused = testbed::wait_until(
        "the verify step failing on the partial model",
        Duration::from_secs(60),
        || {
            let pod = cluster
                .admin
                .get(&["pod", "-n", &start.namespace, "server"]);
            let failed = exited(&pod["status"]["initContainerStatuses"][1], 1).is_some();
            failed
                .then(|| pod.clone())
                .ok_or_else(|| format!("{:#}", pod["status"]))
        },
    );
    let status = &refused["status"];
    let download = &status["initContainerStatuses"][0];
    assert!(
        exited(download, 0).is_some(),
        "the download masked its failure: {download:#}"
    );
    let message = exited(&status["initContainerStatuses"][1], 1)
        .and_then(|t| t["message"].as_str())
        .unwrap_or_default();
    eprintln!("verified start, cut short: the verify step's termination message: {message}");
    for said in [
        "size_mismatch",
        "model-00001-of-00002.safetensors",
        "100000 bytes on disk, the manifest says 300000",
        &format!("does not match its manifest (revision {REVISION})"),
    ] {
        assert!(
            message.contains(said),
            "the verify step's termination message says {said:?}: {message}"
        );
    }
    let server = &status["containerStatuses"][0];
    assert!(
        server["state"]["waiting"].is_object()
            && server["lastState"].as_object().is_none_or(|s| s.is_empty()),
        "the server never started: {server:#}"
    );
    start.remove(cluster);
}

/// A container's run that ended with `code`: its state now, or the one before its restart.
fn exited(container: &Value, code: i64) -> Option<&Value> {
    [
        &container["state"]["terminated"],
        &container["lastState"]["terminated"],
    ]
    .into_iter()
    .find(|terminated| terminated["exitCode"] == code)
}

/// The example's pod in a namespace of its own, with the model store it downloads from.
struct VerifiedStart {
    namespace: String,
    model: testbed::models::PlainModel,
}

impl VerifiedStart {
    /// A store serving the model at [`STORE_RATE`] (each response cut after `cut_after` bytes
    /// where given), the manifest in the example's ConfigMap, and the example's pod: its verify
    /// step and shape as shipped, the node's images in place of vLLM's and the agent's registry
    /// name, and the tests' downloader in place of `hf download` (the node has neither it nor the
    /// Hub), told to exit 0 whatever fails where the store cuts.
    fn new(cluster: &OneNodeCluster, prefix: &str, cut_after: Option<u64>) -> VerifiedStart {
        let namespace = cluster.namespace(prefix);
        let model = testbed::models::PlainModel::new();
        let store = cluster.runtime.dir().join("models").join(&namespace);
        for (path, bytes) in &model.files {
            let file = store.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, bytes).unwrap();
        }
        open_to_all(&store);
        let image = format!("workload:{prefix}");
        let workload = cluster.runtime.programs().join("workload");
        cluster
            .runtime
            .push_image(&image, &[&workload], "/workload");
        let image = format!("{REGISTRY}/{image}");

        let store_url = model_store(cluster, &namespace, &image, STORE_RATE, cut_after);

        cluster.admin.admin(
            &["create", "-n", &namespace, "-f", "-"],
            &json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "model-manifests"},
                "data": {"llama-3.1-8b.json": model.manifest_json(REVISION, true)},
            })
            .to_string(),
        );
        let example = std::fs::read_to_string(
            testbed::renderers::kustomize::deploy_dir()
                .join("examples/vllm-with-verified-download.yaml"),
        )
        .unwrap();
        let deployment: Value = serde_saphyr::from_str(&example).unwrap();
        let mut spec = deployment["spec"]["template"]["spec"].clone();
        let download = &mut spec["initContainers"][0];
        assert_eq!(download["name"], "download-model");
        download["image"] = json!(image);
        download.as_object_mut().unwrap().remove("command");
        download.as_object_mut().unwrap().remove("env");
        let mut fetch = vec![
            "--download".to_string(),
            store_url,
            "--files".into(),
            model.files.keys().cloned().collect::<Vec<_>>().join(","),
            "--to".into(),
            "/model".into(),
        ];
        if cut_after.is_some() {
            fetch.push("--keep-going".into());
        }
        download["args"] = json!(fetch);
        let verify = &mut spec["initContainers"][1];
        assert_eq!(verify["name"], "verify-model");
        verify["image"] = json!(cluster.agent_image());
        // The example asks two cores for hashing a GPU node's model; the tests' node has two in
        // all, the agent's own pod and the other tests' among them.
        verify["resources"]["requests"]["cpu"] = json!("100m");
        let server = &mut spec["containers"][0];
        server["image"] = json!(image);
        server["args"] = json!(["--model", "/model", "--listen", "0.0.0.0:8000"]);
        // No GPU on the tests' node: the server's request for one is the one change to it.
        server.as_object_mut().unwrap().remove("resources");
        cluster.admin.admin(
            &["create", "-n", &namespace, "-f", "-"],
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server"}, "spec": spec})
                .to_string(),
        );
        VerifiedStart { namespace, model }
    }

    fn remove(&self, cluster: &OneNodeCluster) {
        cluster.admin.admin(
            &["delete", "namespace", &self.namespace, "--wait=false"],
            "",
        );
    }
}
