//! A real Prometheus scraping the agent as the shipped PodMonitor says, joining its GPU series with
//! vLLM's.

use super::*;

/// The scrape job prometheus-operator generates for a PodMonitor endpoint
/// (pkg/prometheus/promcfg.go, `generatePodMonitorConfig`; its golden files under
/// pkg/prometheus/testdata), with Kubernetes discovery replaced by a static target carrying the
/// `__meta_kubernetes_*` labels discovery would give the agent's pod. Only the interval is
/// shortened, so the test need not wait 15 s per scrape.
fn pod_monitor_job(monitor: &Value, pod: (&str, &Value), namespace: &str, target: &str) -> String {
    let (pod_name, pod_labels) = pod;
    let spec = &monitor["spec"];
    let endpoint = &spec["podMetricsEndpoints"][0];
    let port = endpoint["port"].as_str().unwrap();
    let name = monitor["metadata"]["name"].as_str().unwrap();
    let monitor_namespace = monitor["metadata"]["namespace"].as_str().unwrap();
    let sanitize = |label: &str| label.replace(['.', '/', '-'], "_");
    let mut meta = vec![
        (
            "__meta_kubernetes_namespace".to_string(),
            namespace.to_string(),
        ),
        ("__meta_kubernetes_pod_name".into(), pod_name.into()),
        (
            "__meta_kubernetes_pod_container_name".into(),
            "agent".into(),
        ),
        (
            "__meta_kubernetes_pod_container_port_name".into(),
            port.into(),
        ),
        ("__meta_kubernetes_pod_phase".into(), "Running".into()),
    ];
    for (k, v) in pod_labels.as_object().unwrap() {
        meta.push((
            format!("__meta_kubernetes_pod_label_{}", sanitize(k)),
            v.as_str().unwrap().into(),
        ));
        meta.push((
            format!("__meta_kubernetes_pod_labelpresent_{}", sanitize(k)),
            "true".into(),
        ));
    }
    let mut relabel = String::from(
        "      - {source_labels: [job], target_label: __tmp_prometheus_job_name}\n      - {action: drop, source_labels: [__meta_kubernetes_pod_phase], regex: (Failed|Succeeded)}\n",
    );
    for (k, v) in spec["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let k = sanitize(k);
        relabel.push_str(&format!(
            "      - {{action: keep, source_labels: [__meta_kubernetes_pod_label_{k}, __meta_kubernetes_pod_labelpresent_{k}], regex: ({});true}}\n",
            v.as_str().unwrap()
        ));
    }
    relabel.push_str(&format!(
        "      - {{action: keep, source_labels: [__meta_kubernetes_pod_container_port_name], regex: {port}}}\n      - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}\n      - {{source_labels: [__meta_kubernetes_pod_container_name], target_label: container}}\n      - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}\n      - {{target_label: job, replacement: {monitor_namespace}/{name}}}\n      - {{target_label: endpoint, replacement: {port}}}\n"
    ));
    let labels: Vec<String> = meta.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
    format!(
        "  - job_name: podMonitor/{monitor_namespace}/{name}/0\n    honor_labels: {}\n    metrics_path: {}\n    static_configs:\n      - targets: ['{target}']\n        labels: {{{}}}\n    relabel_configs:\n{relabel}",
        endpoint["honorLabels"].as_bool().unwrap_or(false),
        endpoint["path"].as_str().unwrap_or("/metrics"),
        labels.join(", "),
    )
}

/// The shipped PodMonitor keeps the GPU owner's labels, so the documented join of a GPU's series
/// with the vLLM server using it, by (namespace, pod), returns rows; the same job without
/// honorLabels (what was shipped before) returns none.
#[test]
fn prometheus_scraping_as_the_pod_monitor_says_joins_gpus_with_vllm() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let objects = testbed::needs!(kustomize::render_with(
        "overlays/gpu",
        &["components/prometheus-operator"]
    ));
    let GpuNode {
        cluster,
        mut agent,
        vllm_gpu,
        _kubelet,
        _dirs,
        ..
    } = testbed::needs!(gpu_node_with(&[], 0));
    let pod = cluster.on.pod.as_str();
    agent.wait("GPU series with pod labels", Duration::from_secs(30), |a| {
        a.metrics().is_some_and(|m| m.contains("pod=\"vllm-0\""))
    });
    let monitor = find(&objects, "PodMonitor", "mlnode-agent");
    let (metadata, _) = pod_template(&objects);
    let namespace = kustomize::daemonset(&objects)["metadata"]["namespace"]
        .as_str()
        .unwrap();
    let shipped = pod_monitor_job(
        monitor,
        (pod, &metadata["labels"]),
        namespace,
        "127.0.0.1:9400",
    );
    let mut unhonoured = monitor.clone();
    unhonoured["metadata"]["name"] = json!("without-honor-labels");
    unhonoured["spec"]["podMetricsEndpoints"][0]["honorLabels"] = json!(false);
    let without = pod_monitor_job(
        &unhonoured,
        (pod, &metadata["labels"]),
        namespace,
        "127.0.0.1:9400",
    );
    // vLLM, as its own PodMonitor labels it: the serving pod's namespace and name.
    let vllm = format!(
        "  - job_name: podMonitor/inference/vllm/0\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n        labels: {{namespace: inference, pod: vllm-0, container: vllm}}\n",
        testbed::prometheus::serve_vllm_fixture()
    );
    let prometheus =
        testbed::prometheus::start_with_scrape_configs(&format!("{shipped}{without}{vllm}"));
    let join = |job: &str| {
        format!("mlnode_gpu_utilization_ratio{{job=\"{job}\"}} * on(namespace, pod) group_left(model_name) vllm:num_requests_running")
    };
    let rows =
        testbed::prometheus::wait_query(prometheus.port, &join("mlnode-system/mlnode-agent"));
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["metric"]["UUID"], vllm_gpu.as_str());
    assert_eq!(rows[0]["metric"]["model_name"], "tiny-model");
    // The agent's own series keep the agent's pod: honorLabels only lets scraped labels win.
    let own = testbed::prometheus::wait_query(
        prometheus.port,
        "mlnode_build_info{job=\"mlnode-system/mlnode-agent\"}",
    );
    assert_eq!(own[0]["metric"]["pod"], pod);
    // Without honorLabels the owner's labels are renamed and the join is empty.
    testbed::prometheus::wait_query(prometheus.port, "mlnode_gpu_utilization_ratio{job=\"mlnode-system/without-honor-labels\", exported_pod=\"vllm-0\"}");
    let none = testbed::prometheus::query_raw(
        prometheus.port,
        &join("mlnode-system/without-honor-labels"),
    )
    .unwrap();
    assert_eq!(none, json!([]), "{none}");
}
