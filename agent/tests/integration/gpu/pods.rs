//! Whose GPU it is: the kubelet's pod-resources answer and DRA's ResourceSlices name the holder on
//! its GPU's series only, in either label style; hashing yields to pods holding GPUs.

use super::*;

fn gpu3_assigned() -> fake_kubelet::api::ListPodResourcesResponse {
    testbed::node::pod_resources::response(&[
        (
            "vllm-llama-0",
            "nvidia.com/gpu",
            &["GPU-00000003-1111-2222-3333-444444444443"],
        ),
        (
            "fpga-job",
            "example.com/fpga",
            &["GPU-00000004-1111-2222-3333-444444444444"],
        ),
    ])
}

#[test]
fn pod_labels_from_the_kubelet_on_the_assigned_gpu_only() {
    let scenario = Scenario::new(8);
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(gpu3_assigned());
    let extra = format!(
        "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n{extra}",
        fake_nvml().display().to_string()
    );
    // An API server is configured, but the kubelet reports no DRA device: nothing asks it for
    // ResourceSlices.
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = Agent::start_with_env(
        &config,
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    agent.wait_for("pod labels", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_temperature_celsius",
            &[
                ("gpu", "3"),
                ("pod", "vllm-llama-0"),
                ("namespace", "inference"),
                ("container", "vllm"),
            ],
        ) == Some(43.0)
    });
    let metrics = agent.metrics();
    let labelled: Vec<&str> = metrics.lines().filter(|l| l.contains("pod=\"")).collect();
    assert!(
        labelled.iter().all(|l| l.contains("gpu=\"3\"")),
        "only GPU 3 is assigned: {labelled:#?}"
    );
    assert!(
        !metrics.contains("fpga-job"),
        "other resources' devices are not GPUs"
    );
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.path.contains("resourceslices")),
        "{:#?}",
        api.requests()
    );
}

#[test]
fn gpus_allocated_through_dra_are_named_by_the_drivers_resource_slices() {
    let mut scenario = Scenario::new(2);
    scenario.set(
        1,
        "mig",
        json!({"enabled": true, "monitor_capability": false, "instances": [
            {"uuid": "MIG-11111111-2222-3333-4444-555555555555", "gpu_instance_id": 7, "compute_instance_id": 0, "profile": "1g.10gb",
             "memory": {"total": 10_737_418_240u64, "used": 1u64 << 30, "free": 9_663_676_416u64, "reserved": 0}}]}),
    );
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(
        fake_kubelet::api::ListPodResourcesResponse {
            pod_resources: vec![
                testbed::node::pod_resources::dra_claim("vllm-0", api.name(), &["gpu-0"]),
                testbed::node::pod_resources::dra_claim(
                    "vllm-small-0",
                    api.name(),
                    &["gpu-1-mig-1g10gb-19-0"],
                ),
            ],
        },
    );
    let extra = format!(
        "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n{extra}",
        fake_nvml().display().to_string()
    );
    let agent = Agent::start_with_env(
        &config,
        &[
            ("FAKE_NVML_SCENARIO", &scenario.path()),
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(api.name())),
        ],
    );
    // The kubelet's first DRA device starts a watch of this node's slices; the driver has published
    // none yet, so nothing can be named.
    testbed::wait_until(
        "a watch of the node's slices",
        Duration::from_secs(20),
        || {
            api.requests()
                .iter()
                .any(|r| r.path.contains("resourceslices") && r.path.contains("watch=true"))
                .then_some(())
                .ok_or_else(String::new)
        },
    );
    let slice_requests: Vec<String> = api
        .requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("resourceslices"))
        .collect();
    assert!(
        slice_requests.iter().all(
            |p| p.starts_with("/apis/resource.k8s.io/v1/resourceslices?")
                && p.contains(&format!("fieldSelector=spec.nodeName%3D{}", api.name()))
        ),
        "{slice_requests:#?}"
    );
    assert!(!agent.metrics().contains("pod=\""));

    // The driver publishes its slice; the watch delivers it and the next List is named.
    api.put_resource_slice(testbed::cluster::api_only_node::nvidia_resource_slice(
        api.name(),
    ));
    agent.wait_for(
        "DRA-allocated GPUs labelled",
        Duration::from_secs(20),
        |m| {
            sample(
                m,
                "mlnode_gpu_temperature_celsius",
                &[("gpu", "0"), ("pod", "vllm-0"), ("container", "vllm")],
            )
            .is_some()
                && sample(
                    m,
                    "mlnode_gpu_mig_memory_used_bytes",
                    &[("gpu", "1"), ("GPU_I_ID", "7"), ("pod", "vllm-small-0")],
                ) == Some(1_073_741_824.0)
        },
    );
    let metrics = agent.metrics();
    assert!(
        !metrics
            .lines()
            .any(|l| l.contains("gpu=\"1\"") && l.contains("pod=\"") && !l.contains("GPU_I_ID")),
        "the claim holds a MIG device of GPU 1, not GPU 1"
    );
}

#[test]
fn legacy_pod_label_names() {
    let scenario = Scenario::new(8);
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(gpu3_assigned());
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pod_labels: legacy\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        fake_nvml().display().to_string(),
        kubelet.socket().display().to_string()
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    agent.wait_for("legacy labels", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_lost",
            &[
                ("gpu", "3"),
                ("pod_name", "vllm-llama-0"),
                ("pod_namespace", "inference"),
                ("container_name", "vllm"),
            ],
        )
        .is_some()
    });
}

#[test]
fn absent_pod_resources_socket_logs_once_and_changes_nothing_else() {
    let scenario = Scenario::new(8);
    let config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\nkubelet:\n  pod_resources_socket: /nonexistent/kubelet.sock\n  pod_resources_interval: 100ms\n",
        fake_nvml().display().to_string()
    );
    let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
    // Several failed Lists, counted: the log must still say it once.
    agent.wait_for("GPUs and failed Lists", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(8.0)
            && sample(m, "mlnode_kubelet_pod_resources_errors_total", &[]).is_some_and(|n| n >= 4.0)
    });
    let log = agent.log();
    assert_eq!(
        log.matches("pod-resources API is not available").count(),
        1,
        "{log}"
    );
    assert!(log.contains("/nonexistent/kubelet.sock"));
    assert_eq!(agent.get("/healthz").0, 200);
}

/// `verify.priority: auto` decides from what the kubelet says, not from the opens the agent saw:
/// after a restart on a node whose pods hold GPUs (it never saw their weights opened) a
/// re-verification yields to them, in the idle classes; where no pod holds an accelerator it runs
/// at full speed. Before, an agent that had seen no open ran its first verification at full speed
/// on a serving node (0.58 of the workload's throughput kept, against 0.98 idle).
#[test]
fn hashing_yields_on_a_node_whose_pods_hold_gpus() {
    let cases = [
        (gpu3_assigned(), "idle"),
        (testbed::node::pod_resources::response(&[]), "normal"),
    ];
    for (kubelet_says, wanted) in cases {
        let scenario = Scenario::new(8);
        let kubelet = testbed::node::pod_resources::FakeKubelet::serve(kubelet_says);
        let model = testbed::models::PlainModel::new();
        let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
        let config = format!(
            "nvml:\n  library: {:?}\n  sample_interval: 100ms\nkubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\nverify:\n  debounce: 50ms\n{}",
            fake_nvml().display().to_string(),
            kubelet.socket().display().to_string(),
            testbed::agent::model_config("llama", model.root(), &manifest)
        );
        let agent = Agent::start_with_env(&config, &[("FAKE_NVML_SCENARIO", &scenario.path())]);
        let verified = |m: &str| {
            sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0)
        };
        agent.wait_for("verified", Duration::from_secs(20), verified);
        // The kubelet has answered once the devices carry (or do not carry) its pods.
        agent.wait_for("the kubelet's answer", Duration::from_secs(20), |m| {
            sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "3")]).is_some()
        });
        std::fs::write(model.path("config.json"), b"{\"changed\": true}").unwrap();
        agent.wait_for_log("the re-verification", Duration::from_secs(20), |log| {
            log.lines()
                .any(|l| l.contains(r#""kind":"incremental""#) && l.contains("failed verification"))
        });
        let log = agent.log();
        let line = log
            .lines()
            .find(|l| l.contains(r#""kind":"incremental""#))
            .unwrap();
        assert!(
            line.contains(&format!(r#""priority":"{wanted}""#)),
            "{wanted}: {line}"
        );
    }
}
