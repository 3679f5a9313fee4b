//! A GPU node as the GPU overlay and the chart deploy the agent there, held by the startup taint
//! until the model verifies and the GPUs are healthy.

use super::*;

/// The GPU overlay with the startup taint and the model labels, as the kubelet would start it.
#[test]
fn the_gpu_overlay_with_the_startup_taint_runs_as_deployed() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    runs_as_deployed_with_the_startup_taint(testbed::needs!(gpu_node_with(
        &["components/startup-taint", "components/model-labels"],
        0
    )));
}

/// The chart's GPU DaemonSet with `startupTaint.enabled` and `modelLabels.enabled`: the same run
/// as the overlay's, on the chart's own RBAC, admission policy and ConfigMaps.
#[test]
fn the_charts_gpu_daemonset_with_the_startup_taint_runs_as_deployed() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let objects = testbed::needs!(charted_for(
        "gpu",
        "startupTaint: {enabled: true}\nmodelLabels: {enabled: true}"
    ));
    runs_as_deployed_with_the_startup_taint(testbed::needs!(gpu_node_from(objects, 0)));
}

fn runs_as_deployed_with_the_startup_taint(gpu_node: GpuNode) {
    let GpuNode {
        cluster,
        mut agent,
        node,
        vllm_gpu,
        _kubelet,
        _dirs,
    } = gpu_node;

    agent.wait("own startup taint removed", Duration::from_secs(60), |_| {
        cluster.node()["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["key"] != "mlnode.dev/not-ready")
    });
    let dra_gpu = h100(0)["uuid"].as_str().unwrap().to_string();
    // UID 0 without capabilities opens the kubelet's root-only socket: the GPUs' owners are
    // labelled, the device plugin's by UUID, the DRA claim's through the driver's ResourceSlice.
    agent.wait(
        "GPU series with the vLLM and DRA pods' labels",
        Duration::from_secs(30),
        |a| {
            a.metrics().is_some_and(|m| {
                let labelled = |gpu: &str, pod: &str| {
                    sample(
                        &m,
                        "mlnode_gpu_utilization_ratio",
                        &[("UUID", gpu), ("pod", pod), ("namespace", "inference")],
                    )
                    .is_some()
                };
                labelled(&vllm_gpu, "vllm-0") && labelled(&dra_gpu, "dra-0")
            })
        },
    );
    let metrics = agent.metrics().unwrap();
    for collector in ["model_cache", "nvml", "readiness", "startup"] {
        assert_eq!(
            sample(&metrics, "mlnode_collector_up", &[("collector", collector)]),
            Some(1.0),
            "{collector}\n{}",
            agent.log()
        );
    }
    assert_eq!(
        sample(&metrics, "mlnode_collector_up", &[("collector", "neuron")]),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "mlnode_model_cache_verified",
            &[("model_name", "llama-3.1-8b")]
        ),
        Some(1.0)
    );
    assert_eq!(sample(&metrics, "mlnode_gpu_count", &[]), Some(2.0));

    // Conditions written, the kubelet's and the foreign taint untouched.
    let node_now = cluster.node();
    assert_eq!(cluster.condition("ModelCacheVerified")["status"], "True");
    assert_eq!(
        cluster.condition("AcceleratorHealthy")["status"],
        "True",
        "{}",
        cluster.condition("AcceleratorHealthy")
    );
    assert_eq!(kubelet_conditions(&node_now), kubelet_conditions(&node));
    assert_eq!(
        node_now["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    // The model advertised on the node, through the component's RBAC and the policy's prefix.
    agent.wait("the model label", Duration::from_secs(30), |_| {
        cluster.node()["metadata"]["labels"]["models.mlnode.dev/llama-3.1-8b"]
            == "0e9e39f249a16976918f6564b8830bc894c89659"
    });
    // The gated pod's condition, and the writable mount found: the model's path on the node is
    // derived from the agent's own hostPath mount (the base config sets none).
    agent.wait("the pod's readiness gate", Duration::from_secs(30), |_| {
        cluster.pod_condition("vllm-gated", "mlnode.dev/ModelVerified")["status"] == "True"
    });
    agent.wait("the writable mount", Duration::from_secs(30), |a| {
        a.metrics().is_some_and(|m| {
            sample(
                &m,
                "mlnode_model_cache_writable_mounts",
                &[("model_name", "llama-3.1-8b"), ("pod", "vllm-writable")],
            ) == Some(1.0)
        })
    });
    agent.wait("the pod's Warning event", Duration::from_secs(30), |_| {
        cluster.has_event("ModelCacheWritable")
    });
    assert_eq!(
        sample(
            &agent.metrics().unwrap(),
            "mlnode_model_cache_writable_mounts",
            &[("pod", "vllm-gated")]
        ),
        None
    );
    // Every request authenticated and allowed by the rendered RBAC and admission policies, and
    // the writes each component asks for among them.
    let metrics = agent.metrics().unwrap();
    assert_eq!(
        control_plane::refused_requests(&metrics),
        Vec::<String>::new(),
        "{}",
        agent.log()
    );
    for (verb, resource) in [
        ("patch", "nodes/status"),
        ("patch", "nodes"),
        ("get", "nodes"),
        ("watch", "pods"),
        ("watch", "resourceslices"),
    ] {
        assert!(
            sample(
                &metrics,
                "mlnode_kube_requests_total",
                &[("verb", verb), ("resource", resource), ("code", "200")]
            )
            .is_some(),
            "no {verb} {resource} answered 200:\n{metrics}"
        );
    }
    refused_pod_writes(&cluster);
}

/// What the rendered RBAC allows the agent's token but its admission policies refuse: the status
/// of another node's pod, and a condition type not its own.
fn refused_pod_writes(cluster: &ApiOnlyNode) {
    let control_plane = cluster.control_plane;
    let other = control_plane.unique("ip-10-0-9-99.us-east-2.compute.internal");
    control_plane.create(&control_plane::node(&other, json!({})));
    cluster.put_pod(&gated_vllm_pod("", "vllm-elsewhere", &other, true));
    let write = |pod: &str, condition_type: &str| {
        let patch = json!({"status": {"conditions": [{"type": condition_type, "status": "True"}]}});
        let path = cluster.pod_status_path(pod);
        control_plane.request_as(
            &cluster.on.token,
            "PATCH",
            &path,
            "application/strategic-merge-patch+json",
            &patch,
        )
    };
    for (pod, condition_type, says) in [
        (
            "vllm-elsewhere",
            "mlnode.dev/ModelVerified",
            "pods bound to the node it runs on",
        ),
        (
            "vllm-gated",
            "example.com/Healthy",
            "own pod condition types",
        ),
    ] {
        let (code, answer) = write(pod, condition_type);
        assert_eq!(code, 403, "{pod} {condition_type}: {answer}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{answer}"
        );
    }
    assert_eq!(
        write("vllm-gated", "mlnode.dev/ModelVerified").0,
        200,
        "its own type on its own node's pod"
    );
}
