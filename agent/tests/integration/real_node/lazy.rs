//! Lazy loading with AWS's SOCI snapshotter on the node, as EKS runs it.

use super::*;

/// SOCI on the node as EKS runs it (containerd's default snapshotter, a proxy plugin): an
/// inference image whose weights are a layer of their own, given a SOCI index by `soci convert
/// --standalone --format oci-dir` and pushed with it, is pulled without its weights; the server
/// then reads them through the snapshotter's FUSE mount, fetched from the registry as it reads.
/// The same image without an index is pulled whole through the rate-held link, as before.
#[test]
fn an_image_with_a_soci_index_is_loaded_lazily_and_one_without_is_pulled_whole() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    let _node_as_it_is = cluster.sharing();
    let runtime = &cluster.runtime;
    let (weights_layer, weights_size, lazy) = lazy_image_with_weights(cluster, "soci-lazy", 0);
    let whole = format!("{REGISTRY}/workload:soci-whole");
    image_with_weights(cluster, "soci-whole", 10);

    let namespace = cluster.namespace("soci");
    let started = |name: &str, image: &str| {
        cluster.admin.admin(
            &["create", "-n", &namespace, "-f", "-"],
            &weights_in_image_pod(name, image).to_string(),
        );
        await_pod_ready(cluster, &namespace, name);
        let events = events_of(cluster, &namespace, name);
        let pulled = first_with(&events, "reason", "Pulled");
        let lines = container_output(cluster, &namespace, name, name);
        assert_eq!(
            first_with(&lines, "event", "model_loaded")["bytes"],
            64u64 << 20,
            "{name} read every weight"
        );
        pull_seconds(pulled["message"].as_str().unwrap())
    };
    let transfer = weights_size as f64 / REGISTRY_RATE as f64;

    // What the snapshotter logs from here on: other scenarios' lazy images came before.
    let soci_log = runtime.dir().join("soci.log");
    let logged_before = std::fs::metadata(&soci_log).map_or(0, |m| m.len()) as usize;
    let lazy_pull = started("lazy", &lazy);
    let log = std::fs::read_to_string(&soci_log).unwrap();
    let log = log.get(logged_before..).unwrap_or_default();
    // The snapshotter names a snapshot by its chain id, so the log is counted: the weights'
    // layer, which no other image has, and the server's layer too where no other image on the
    // node had it first (the other tests' images share it, as a local snapshot).
    let remote = log.matches("\"remote-snapshot-prepared\":\"true\"").count();
    assert!(
        (1..=2).contains(&remote),
        "the snapshotter mounted the weights' layer remotely ({remote}):\n{}",
        log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    assert!(
        lazy_pull < transfer * 0.5,
        "the pull took {lazy_pull:.3} s: the weights ({transfer:.3} s at the link's rate) are not in it"
    );
    assert_eq!(
        soci_bytes_served(cluster, &weights_layer),
        (64u64 << 20) as f64,
        "every weight byte the server read came through the snapshotter"
    );
    assert!(
        testbed::agent::sample(
            &runtime.soci_metrics(),
            "soci_fs_operation_duration_milliseconds_count",
            &[
                ("layer", weights_layer.as_str()),
                ("operation_type", "remote_registry_get")
            ],
        )
        .is_some_and(|fetches| fetches >= 1.0),
        "the weights were fetched from the registry as they were read"
    );

    let whole_pull = started("whole", &whole);
    assert!(
        whole_pull >= transfer * 0.95,
        "without an index the pull took {whole_pull:.3} s, the weights' transfer {transfer:.3} s"
    );
    eprintln!(
        "SOCI: pull {lazy_pull:.3} s with an index, {whole_pull:.3} s without ({weights_size} bytes of weights, {transfer:.3} s at the link's rate)"
    );
    cluster
        .admin
        .admin(&["delete", "namespace", &namespace, "--wait=false"], "");
}

/// The bytes the node's SOCI snapshotter served from `layer` through its FUSE mount (0 before it
/// served any).
fn soci_bytes_served(cluster: &OneNodeCluster, layer: &str) -> f64 {
    testbed::agent::sample(
        &cluster.runtime.soci_metrics(),
        "soci_fs_bytes_served",
        &[
            ("layer", layer),
            ("operation_type", "synchronous_bytes_served"),
        ],
    )
    .unwrap_or(0.0)
}

/// A prefetch, as an image pre-puller does it: a pod on the node pulls a SOCI-indexed image and
/// exits before the server's pod is created. The server's startup is then a cache hit with 0 s
/// of pull in the agent's report, and the image stays lazy: its weights are read through the
/// snapshotter when the server loads them, not before.
#[test]
fn a_prefetched_image_is_a_cache_hit_and_stays_lazy() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let (weights_layer, _, image) = lazy_image_with_weights(cluster, "prefetched", 20);
    // The pre-puller reads none of the weights: the files runc puts under /etc, then it exits.
    let mut prefetch = weights_in_image_pod("prefetch", &image);
    prefetch["spec"]["restartPolicy"] = json!("Never");
    let container = &mut prefetch["spec"]["containers"][0];
    container["args"] = json!(["--model", "/etc", "--exit-after-load"]);
    container.as_object_mut().unwrap().remove("readinessProbe");
    container.as_object_mut().unwrap().remove("ports");
    cluster.admin.admin(
        &["create", "-n", namespace, "-f", "-"],
        &prefetch.to_string(),
    );
    testbed::wait_until("the pre-puller done", Duration::from_secs(60), || {
        let pod = cluster.admin.admin(
            &["get", "pod", "-n", namespace, "prefetch", "-o", "json"],
            "",
        );
        let pod: Value = serde_json::from_str(&pod).unwrap();
        (pod["status"]["phase"] == "Succeeded")
            .then_some(())
            .ok_or_else(|| format!("{:#}", pod["status"]))
    });
    assert_eq!(
        soci_bytes_served(cluster, &weights_layer),
        0.0,
        "the prefetch left the weights in the registry"
    );
    cluster.admin.admin(
        &["create", "-n", namespace, "-f", "-"],
        &weights_in_image_pod("prefetched", &image).to_string(),
    );
    await_pod_ready(cluster, namespace, "prefetched");
    let startup = await_agent_startups(cluster, agent_pod, namespace, "prefetched", 1).remove(0);
    assert_eq!(startup["phases"]["image_pull"], 0.0, "{startup}");
    assert_eq!(startup["pulls"][0]["cache_hit"], true, "{startup}");
    assert_eq!(
        soci_bytes_served(cluster, &weights_layer),
        (64u64 << 20) as f64,
        "the server read every weight through the snapshotter, lazily"
    );
    let load = &startup["lazy_load"];
    assert_eq!(load["lazy"], true, "{startup}");
    assert!(
        load["fetched"]["start_to_ready"]["fetched_bytes"].as_u64() >= Some(60 << 20),
        "the weights fetched as the server read them, after its start: {startup}"
    );
}

/// A lazily loaded image the node has not seen: the kubelet's pull is a tenth of a second, and the
/// agent's fetch figures show where the weights' transfer went instead, after the container's
/// start, at the link's rate. Checked against the snapshotter's own count for the image's layers
/// and the time the layer takes at the rate the test holds the registry's link to.
#[test]
fn a_lazily_loaded_images_fetching_moves_past_its_pull() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let (weights_layer, weights_size, image) = lazy_image_with_weights(cluster, "split", 30);
    let fetched_by_soci = || {
        testbed::agent::samples(
            &cluster.runtime.soci_metrics(),
            "soci_fs_layer_fetched_size_bytes",
            &[("digest", weights_layer.as_str())],
        )
        .into_iter()
        .sum::<f64>()
    };
    assert_eq!(fetched_by_soci(), 0.0, "a layer the node has not mounted");
    cluster.admin.admin(
        &["create", "-n", namespace, "-f", "-"],
        &weights_in_image_pod("split", &image).to_string(),
    );
    await_pod_ready(cluster, namespace, "split");
    let startup = await_agent_startups(cluster, agent_pod, namespace, "split", 1).remove(0);
    let load = &startup["lazy_load"];
    assert_eq!(load["lazy"], true, "{startup}");
    let figure = |stretch: &str, figure: &str| {
        load["fetched"][stretch][figure]
            .as_f64()
            .unwrap_or_else(|| panic!("no {figure} for {stretch}: {startup}"))
    };
    let transfer = weights_size as f64 / REGISTRY_RATE as f64;
    let pull = startup["phases"]["image_pull"].as_f64().unwrap();
    assert!(pull < transfer * 0.5, "the pull took {pull} s: {startup}");
    let after_start = figure("start_to_ready", "fetched_bytes");
    let total: f64 = ["image_pull", "container_start", "start_to_ready"]
        .iter()
        .map(|stretch| figure(stretch, "fetched_bytes"))
        .sum();
    assert!(
        after_start >= weights_size as f64 * 0.9,
        "the weights' {weights_size} bytes fetched after the start: {startup}"
    );
    assert!(
        total <= fetched_by_soci() + 8.0 * 1024.0 * 1024.0,
        "no more than the snapshotter fetched for the image (its weights' layer {}): {startup}",
        fetched_by_soci()
    );
    let fetching = figure("start_to_ready", "fetch_seconds");
    assert!(
        fetching >= transfer * 0.5,
        "{fetching} s of fetching, the layer's transfer {transfer:.3} s at the link's rate: {startup}"
    );
    eprintln!(
        "lazily loaded: pull {pull:.3} s; fetched {:.1} MiB in image_pull, {:.1} MiB in container_start, {:.1} MiB over {fetching:.1} s from start to Ready; the layer's transfer {transfer:.3} s",
        figure("image_pull", "fetched_bytes") / 1048576.0,
        figure("container_start", "fetched_bytes") / 1048576.0,
        after_start / 1048576.0
    );
}
