//! Each pod's own accelerator gate, folded by the real kubelet: the tests' device plugin
//! (tests/programs/device-plugin, on the kubelet's device-plugin API) registers the fake NVML's two
//! GPUs as `nvidia.com/gpu`, the kubelet allocates one to each of two server pods behind one
//! Service, and a fault on GPU 1 takes the pod holding it out of the Service's EndpointSlice while
//! the other keeps serving.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::Instant;

use super::*;

const GATE: &str = "mlnode.dev/AcceleratorHealthy";
const AGENT: &str = "system:serviceaccount:mlnode-system:mlnode-agent";

/// The tests' device plugin on the node, stopped when dropped (the kubelet then stops offering
/// its GPUs).
struct DevicePlugin(Child);

impl DevicePlugin {
    fn start(cluster: &OneNodeCluster, gpus: &[String]) -> DevicePlugin {
        let program = testbed::built_program(
            "MLNODE_TEST_DEVICE_PLUGIN",
            "device-plugin/device-plugin",
            "the tests' device plugin (scripts/test.sh builds it)",
        )
        .unwrap_or_else(|missing| panic!("{missing}"));
        let devices = gpus.join(",");
        DevicePlugin(cluster.runtime.spawn_inside(
            &[
                program.to_str().unwrap(),
                "--resource",
                "nvidia.com/gpu",
                "--devices",
                &devices,
            ],
            "device-plugin.log",
        ))
    }
}

impl Drop for DevicePlugin {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

/// The fake driver's scenario as it was when made, put back when dropped.
struct DriverRestored<'a> {
    cluster: &'a OneNodeCluster,
    before: Value,
}

impl<'a> DriverRestored<'a> {
    fn new(cluster: &'a OneNodeCluster) -> DriverRestored<'a> {
        let mut before = Value::Null;
        cluster.runtime.gpu_scenario(|s| before = s.clone());
        DriverRestored { cluster, before }
    }
}

impl Drop for DriverRestored<'_> {
    fn drop(&mut self) {
        let before = self.before.clone();
        self.cluster.runtime.gpu_scenario(|s| *s = before);
    }
}

/// A server holding one GPU, its readiness gated on it, behind the `gpu-servers` Service.
fn gpu_server(name: &str, image: &str) -> Value {
    let mut pod = workload_pod(name, image, &model_on_node(), 0);
    pod["metadata"]["labels"] = json!({"app": "gpu-servers"});
    pod["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": 1}});
    pod
}

/// The Service's endpoints by pod name: whether each is ready, as the EndpointSlice controller
/// publishes them (what kube-proxy and every load balancer route by).
fn endpoints(cluster: &OneNodeCluster, namespace: &str) -> BTreeMap<String, bool> {
    let slices = cluster.admin.get(&[
        "endpointslices",
        "-n",
        namespace,
        "-l",
        "kubernetes.io/service-name=gpu-servers",
    ]);
    slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .map(|e| {
            (
                e["targetRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                e["conditions"]["ready"] == true,
            )
        })
        .collect()
}

/// Two servers, one GPU each, behind one Service: XID 79 and the driver's NODE_REBOOT on GPU 1,
/// then GPU 1 lost, turn the pod holding it NotReady and out of the Service's ready endpoints
/// (its gate naming the GPU and the XID), while the other pod stays Ready and in them throughout;
/// the driver's NONE brings it back. The agent's writes, from the server's audit log, are the
/// affected pod's only. The kubelet's own `allocatedResourcesStatus` says what the device plugin
/// says (Healthy): docs/readiness.md says why the two differ.
#[test]
fn a_faulty_gpu_takes_only_its_pod_out_of_the_service() {
    let on = testbed::needs!(on_overlay());
    let (cluster, namespace) = (on.cluster, on.namespace().to_string());
    let gpus: Vec<String> = (0..2)
        .map(|i| {
            testbed::devices::fake_nvml::device(i)["uuid"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let _plugin = DevicePlugin::start(cluster, &gpus);
    // The faults are written into the node's fake driver, which every later agent reads (a rolled
    // one is delivered the XIDs afresh): put back as they were however the test ends.
    let _driver = DriverRestored::new(cluster);
    testbed::wait_until(
        "the kubelet offering the two GPUs",
        Duration::from_secs(60),
        || {
            let allocatable =
                cluster.node().unwrap()["status"]["allocatable"]["nvidia.com/gpu"].clone();
            (allocatable == "2")
                .then_some(())
                .ok_or_else(|| format!("{allocatable}"))
        },
    );
    cluster.admin.admin(
        &["create", "-n", &namespace, "-f", "-"],
        &json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "gpu-servers"},
            "spec": {"selector": {"app": "gpu-servers"}, "ports": [{"port": 8000}]},
        })
        .to_string(),
    );
    let image = on.overlay().image.clone();
    for name in ["gpu-server-a", "gpu-server-b"] {
        create_and_await_ready(cluster, &namespace, &gpu_server(name, &image));
    }
    // Which pod the kubelet gave GPU 1, as the agent's gate names it.
    let gate_of = |pod: &str| {
        let pod = cluster.admin.get(&["pod", "-n", &namespace, pod]);
        testbed::cluster::control_plane::condition(&pod, GATE)
    };
    let (on_gpu1, on_gpu0) = match gate_of("gpu-server-a")["message"]
        .as_str()
        .unwrap_or_default()
        .contains(&gpus[1])
    {
        true => ("gpu-server-a", "gpu-server-b"),
        false => ("gpu-server-b", "gpu-server-a"),
    };
    assert!(gate_of(on_gpu1)["message"]
        .as_str()
        .unwrap()
        .contains(&gpus[1]));
    assert!(gate_of(on_gpu0)["message"]
        .as_str()
        .unwrap()
        .contains(&gpus[0]));
    testbed::wait_until(
        "both servers in the Service's ready endpoints",
        Duration::from_secs(60),
        || {
            let now = endpoints(cluster, &namespace);
            (now.values().filter(|ready| **ready).count() == 2)
                .then_some(())
                .ok_or_else(|| format!("{now:?}"))
        },
    );
    let untouched = gate_of(on_gpu0);
    let mut audit = testbed::cluster::audit::AuditReader::default();
    audit.read(cluster.audit_logs());
    // The other server stays Ready and in the endpoints, its condition as it was, at every look.
    let other_unmoved = || {
        let pod = cluster.admin.get(&["pod", "-n", &namespace, on_gpu0]);
        assert_eq!(
            testbed::cluster::control_plane::condition(&pod, "Ready")["status"],
            "True"
        );
        assert_eq!(
            testbed::cluster::control_plane::condition(&pod, GATE),
            untouched
        );
        assert_eq!(endpoints(cluster, &namespace).get(on_gpu0), Some(&true));
    };
    // Until the faulty GPU's pod's gate gives `reason`, the other pod unmoved meanwhile.
    let gate_says = |reason: &str| {
        testbed::wait_until(
            &format!("the faulty GPU's pod's gate saying {reason}"),
            Duration::from_secs(60),
            || {
                other_unmoved();
                let gate = gate_of(on_gpu1);
                (gate["reason"] == reason)
                    .then(|| gate.clone())
                    .ok_or_else(|| format!("{gate}"))
            },
        )
    };
    let pod_ready = |pod: &str| {
        let pod = cluster.admin.get(&["pod", "-n", &namespace, pod]);
        testbed::cluster::control_plane::condition(&pod, "Ready")["status"].clone()
    };

    // XID 79 (fallen off the bus), and the driver asking for the node's reboot (a GPU_RESET would
    // have the agent let go of NVML for the reset, which no fake driver performs).
    let injected = Instant::now();
    let injected_at = std::time::SystemTime::now();
    cluster.runtime.gpu_scenario(|s| {
        s["devices"][1]["xid_events"] = json!([79]);
        s["devices"][1]["recovery_action"] = json!(2);
    });
    let mut node_false = None;
    let mut pod_false = None;
    let out = testbed::wait_until(
        "the faulty GPU's pod out of the ready endpoints",
        Duration::from_secs(60),
        || {
            other_unmoved();
            let condition = cluster
                .node_condition("AcceleratorHealthy")
                .unwrap_or_default();
            if condition["status"] == "False" && node_false.is_none() {
                node_false = Some(injected.elapsed());
            }
            if pod_ready(on_gpu1) == "False" && pod_false.is_none() {
                pod_false = Some(injected.elapsed());
            }
            let now = endpoints(cluster, &namespace);
            (now.get(on_gpu1) == Some(&false))
                .then(|| injected.elapsed())
                .ok_or_else(|| format!("{now:?}"))
        },
    );
    // Out of the endpoints before a look saw Ready False: Ready turned first.
    let pod_false = pod_false.unwrap_or(out);
    // The XID reaches the agent as an event, the driver's action at its next read: a round may
    // see the one before the other (FatalXID, then NodeRebootRequired), each said as it comes.
    let gate = gate_says("NodeRebootRequired");
    assert_eq!(gate["status"], "False");
    let message = gate["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("GPU 1 ({}, 00000000:17:00.0)", gpus[1]))
            && message.contains("(XID 79)"),
        "{message}"
    );
    let node_false = node_false.unwrap_or_else(|| {
        testbed::wait_until(
            "the node's condition False",
            Duration::from_secs(30),
            || {
                let c = cluster
                    .node_condition("AcceleratorHealthy")
                    .unwrap_or_default();
                (c["status"] == "False")
                    .then(|| injected.elapsed())
                    .ok_or_else(|| format!("{c}"))
            },
        )
    });
    eprintln!("device_gate: fault to the node's condition False {node_false:?}, to the pod's Ready False by {pod_false:?}, to the pod out of the ready endpoints {out:?}");

    // The kubelet's resource health (KEP-4680, on by default in 1.36): the device plugin's
    // verdict, Healthy, for the GPU the agent holds at fault.
    let pod = cluster.admin.get(&["pod", "-n", &namespace, on_gpu1]);
    let allocated = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"].clone();
    assert_eq!(
        allocated,
        json!([{"name": "nvidia.com/gpu", "resources": [{"resourceID": gpus[1], "health": "Healthy"}]}]),
        "the kubelet reports what the device plugin says"
    );

    // GPU 1 then lost: the gate follows, still out.
    cluster
        .runtime
        .gpu_scenario(|s| s["devices"][1]["lost"] = json!(true));
    gate_says("GPULost");

    // The driver says NONE and GPU 1 answers again: the pod returns to the endpoints.
    cluster.runtime.gpu_scenario(|s| {
        s["devices"][1]["lost"] = json!(false);
        s["devices"][1]["recovery_action"] = json!(0);
    });
    testbed::wait_until(
        "the recovered GPU's pod back in the ready endpoints",
        Duration::from_secs(60),
        || {
            other_unmoved();
            let now = endpoints(cluster, &namespace);
            (now.get(on_gpu1) == Some(&true))
                .then_some(())
                .ok_or_else(|| format!("{now:?}"))
        },
    );
    assert_eq!(gate_of(on_gpu1)["status"], "True");

    // The agent's writes meanwhile, as the server recorded them: pods/status of the faulty GPU's
    // pod only, one for each verdict the agent logged it changing to since the fault, none of the
    // other's.
    let requests = audit.read(cluster.audit_logs());
    // Each change is logged once (the condition's words under `detail`: a field named `message`
    // would stand for the log line's own in its JSON).
    let changes = container_output(cluster, "mlnode-system", &on.agent_pod, "agent")
        .into_iter()
        .filter(|l| {
            l["message"] == "pod readiness gate changed"
                && l["condition"] == GATE
                && l["pod"] == on_gpu1
                && l["timestamp"]
                    .as_str()
                    .and_then(|t| humantime::parse_rfc3339(t).ok())
                    .is_some_and(|at| at >= injected_at)
        })
        .count();
    let status_writes = |pod: &str| {
        requests
            .iter()
            .filter(|r| {
                r.user == AGENT
                    && r.is_write()
                    && r.resource == "pods/status"
                    && r.uri.contains(&format!("/pods/{pod}/"))
            })
            .count()
    };
    eprintln!("device_gate: the agent's pods/status writes: {} for the faulty GPU's pod, {} for the other", status_writes(on_gpu1), status_writes(on_gpu0));
    assert_eq!(status_writes(on_gpu0), 0);
    assert!(
        changes >= 3,
        "the fault, the lost GPU, the recovery: {changes}"
    );
    assert_eq!(
        status_writes(on_gpu1),
        changes,
        "one write per verdict, never a refresh"
    );
    cluster.admin.admin(
        &[
            "delete",
            "pod",
            "-n",
            &namespace,
            "gpu-server-a",
            "gpu-server-b",
            "--wait",
        ],
        "",
    );
}
