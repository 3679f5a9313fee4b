//! Each pod's own `mlnode.dev/AcceleratorHealthy` gate, through the agent binary, the real
//! kube-apiserver (with the shipped RBAC and admission policy, through the recording proxy), the
//! fake NVML and the kubelet's pod-resources answer: two single-GPU replicas, a fault on GPU 1,
//! and only the pod holding it written False, then True again, the API server's 429 on the way.

use super::*;
use testbed::cluster::pods::gated_vllm_pod;
use testbed::node::pod_resources::{response_in, FakeKubelet};

const GATE: &str = "mlnode.dev/AcceleratorHealthy";

fn uuid(scenario: &Scenario, gpu: usize) -> String {
    scenario.value["devices"][gpu]["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A vLLM pod on the node listing the device gate, as a user adds it to a Deployment's template.
fn device_gated(api: &ApiOnlyNode, name: &str) -> Value {
    let mut pod = gated_vllm_pod("", name, api.name(), "/unused", json!({}));
    pod["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    pod
}

/// How many times the agent logged `pod`'s device gate changing.
fn changes_of(agent: &Agent, pod: &str) -> usize {
    agent
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["message"] == "pod readiness gate changed"
                && l["condition"] == GATE
                && l["pod"] == pod
        })
        .count()
}

fn status_patches(api: &ApiOnlyNode, pod: &str, from: usize) -> usize {
    let path = api.pod_status_path(pod);
    api.requests()[from..]
        .iter()
        .filter(|r| r.method == "PATCH" && r.resource_path() == path)
        .count()
}

#[test]
fn a_fault_takes_out_only_the_pod_on_that_gpu() {
    let mut scenario = Scenario::new(2);
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let (gpu0, gpu1) = (uuid(&scenario, 0), uuid(&scenario, 1));
    let kubelet = FakeKubelet::serve(response_in(
        &api.inference,
        &[
            ("vllm-0", "nvidia.com/gpu", &[gpu0.as_str()]),
            ("vllm-1", "nvidia.com/gpu", &[gpu1.as_str()]),
        ],
    ));
    for pod in ["vllm-0", "vllm-1"] {
        api.put_pod(&device_gated(&api, pod));
    }
    let kubelet_settings = format!(
        "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n",
        kubelet.socket().display().to_string()
    );
    let agent = start_configured(
        &scenario,
        (&api.kubeconfig(), api.name()),
        Path::new("/proc/sys/kernel/random/boot_id"),
        &kubelet_settings,
    );
    let gate = |pod: &str, what: &str, check: &dyn Fn(&Value) -> bool| -> Value {
        testbed::wait_until(what, Duration::from_secs(20), || {
            let condition = api.pod_condition(pod, GATE);
            check(&condition)
                .then(|| condition.clone())
                .ok_or_else(|| format!("{pod}'s {GATE} is {condition}\n{}", agent.log()))
        })
    };
    let healthy = gate("vllm-0", "vllm-0 healthy", &|c| c["status"] == "True");
    assert_eq!(healthy["reason"], "AcceleratorsHealthy");
    assert_eq!(
        healthy["message"],
        format!("GPU 0 ({gpu0}, 00000000:07:00.0): healthy")
    );
    gate("vllm-1", "vllm-1 healthy", &|c| c["status"] == "True");
    let one_healthy = api.pod_condition("vllm-0", GATE);

    // XID 48 (a double-bit ECC error), then the driver asks for a GPU reset of GPU 1.
    let mark = api.requests().len();
    let changes_before = changes_of(&agent, "vllm-1");
    let injected = std::time::Instant::now();
    scenario.value["devices"][1]["xid_events"] = json!([48]);
    scenario.value["devices"][1]["recovery_action"] = json!(1);
    scenario.write();
    gate("vllm-1", "vllm-1 False", &|c| c["status"] == "False");
    let pod_after = injected.elapsed();
    wait_condition(&agent, &api, "the node's condition False", |c| {
        c["status"] == "False"
    });
    let node_after = injected.elapsed();
    // The XID is an event, judged at once; the driver's action is read at the next sample: the
    // gate may say FatalXID first, then the action.
    let faulty = gate("vllm-1", "vllm-1 saying the driver's action", &|c| {
        c["reason"] == "GPUResetRequired"
    });
    let message = faulty["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "the driver asks for a GPU reset of GPU 1 ({gpu1}, 00000000:17:00.0) (NVML recovery action 1) (XID 48); "
        )),
        "names the GPU, its bus id and the XID: {message}"
    );
    // The other pod's condition is not rewritten: byte for byte what it was, no write sent.
    assert_eq!(api.pod_condition("vllm-0", GATE), one_healthy);
    assert_eq!(status_patches(&api, "vllm-0", mark), 0);
    let verdicts = changes_of(&agent, "vllm-1") - changes_before;
    assert!((1..=2).contains(&verdicts), "{verdicts}");
    assert_eq!(
        status_patches(&api, "vllm-1", mark),
        verdicts,
        "one write per verdict the agent logged"
    );
    eprintln!("fault to the pod's gate False: {pod_after:?}; to the node's condition False: {node_after:?}");

    // GPU 1 then lost: the verdict the pod shows follows it.
    scenario.set(1, "lost", json!(true));
    gate("vllm-1", "vllm-1 shows the lost GPU", &|c| {
        c["reason"] == "GPULost"
    });
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_pod_accelerator_gate",
            &[("pod", "vllm-1")]
        ),
        Some(0.0)
    );

    // The API server pushes back (API Priority and Fairness' 429) while GPU 1 recovers: the
    // write waits its turn, and the verdict it writes when let through is the latest.
    let mark = api.requests().len();
    *api.api.state.throttle.lock().unwrap() = Some(1);
    scenario.value["devices"][1]["lost"] = json!(false);
    scenario.value["devices"][1]["recovery_action"] = json!(0);
    scenario.write();
    agent.wait_for(
        "the readiness controller pushed back",
        Duration::from_secs(20),
        |m| {
            sample(
                m,
                "mlnode_node_condition_updates_total",
                &[("result", "error")],
            )
            .unwrap_or(0.0)
                >= 2.0
        },
    );
    *api.api.state.throttle.lock().unwrap() = None;
    let recovered = gate("vllm-1", "vllm-1 True again", &|c| c["status"] == "True");
    assert_eq!(recovered["reason"], "AcceleratorsHealthy");
    assert_eq!(
        api.pod_condition("vllm-0", GATE),
        one_healthy,
        "never rewritten"
    );
    let written: Vec<Value> = api.requests()[mark..]
        .iter()
        .filter(|r| r.method == "PATCH" && r.resource_path() == api.pod_status_path("vllm-1"))
        .map(|r| r.body["status"]["conditions"][0]["status"].clone())
        .filter(|s| !s.is_null())
        .collect();
    assert_eq!(written.last(), Some(&json!("True")), "{written:?}");
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_pod_accelerator_gate",
            &[("pod", "vllm-1")]
        ),
        Some(1.0)
    );
}
