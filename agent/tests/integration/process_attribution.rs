//! Per-pod use of a shared GPU end to end: the fake NVML lists the GPU's processes (nvml.h's
//! `nvmlProcessInfo_t`, `nvmlProcessUtilizationSample_t`), each process's cgroup names its pod
//! and container as the kubelet and containerd name them (core::cgroup cites the forms), the pods
//! live on the real API server (testbed::cluster::control_plane; their UIDs the server's, their
//! containerStatuses with `containerd://` ids as the kubelet writes them), and the fake kubelet hands out time-slicing replicas `GPU-<uuid>::<n>` as NVIDIA's device
//! plugin does.

use std::path::Path;
use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};

use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::pods::{unix_now, vllm_pod, PodTimes};
use testbed::devices::fake_nvml::{fake_nvml, Scenario};

const GIB: u64 = 1 << 30;

struct Tenant {
    pod: &'static str,
    container_id: &'static str,
    pid: u32,
    memory: u64,
    sm_percent: u32,
    replica: &'static str,
}

const TENANTS: [Tenant; 4] = [
    Tenant {
        pod: "vllm-0",
        container_id: "1111111111111111111111111111111111111111111111111111111111111111",
        pid: 4101,
        memory: 10 * GIB,
        sm_percent: 40,
        replica: "0",
    },
    Tenant {
        pod: "vllm-1",
        container_id: "2222222222222222222222222222222222222222222222222222222222222222",
        pid: 4102,
        memory: 6 * GIB,
        sm_percent: 25,
        replica: "1",
    },
    Tenant {
        pod: "vllm-2",
        container_id: "3333333333333333333333333333333333333333333333333333333333333333",
        pid: 4103,
        memory: 3 * GIB,
        sm_percent: 10,
        replica: "2",
    },
    Tenant {
        pod: "vllm-3",
        container_id: "4444444444444444444444444444444444444444444444444444444444444444",
        pid: 4104,
        memory: GIB,
        sm_percent: 5,
        replica: "3",
    },
];

/// The host's /proc as the agent sees it with hostPID: each process's cgroup file, the tenants'
/// (whose pods have `uids`, in TENANTS' order) and `extra`.
fn host_proc(root: &Path, uids: &[String], extra: &[(u32, String)]) {
    let write = |pid: String, text: &str| {
        std::fs::create_dir_all(root.join(&pid)).unwrap();
        std::fs::write(root.join(pid).join("cgroup"), text).unwrap();
    };
    write("self".into(), "0::/\n");
    for (t, uid) in TENANTS.iter().zip(uids) {
        write(t.pid.to_string(), &cgroup(uid, t.container_id));
    }
    for (pid, text) in extra {
        write(pid.to_string(), text);
    }
}

/// A container's cgroup, cgroup v2 with the kubelet's systemd driver and containerd
/// (`kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`), seen from the agent's own
/// cgroup namespace (`/../..`).
fn cgroup(pod_uid: &str, container_id: &str) -> String {
    format!(
        "0::/../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container_id}.scope\n",
        pod_uid.replace('-', "_")
    )
}

/// UIDs for tests without an API server: the cgroup's alone name the pod.
fn offline_uids() -> Vec<String> {
    (1..=TENANTS.len())
        .map(|n| format!("0a1b2c3d-0000-4000-8000-{n:012}"))
        .collect()
}

/// A vLLM pod named `name` on `node` whose one container has `container_id`.
fn pod(name: &str, node: &ApiOnlyNode, container_id: &str) -> Value {
    let mut pod = vllm_pod("", name, "/models", &times());
    pod["spec"]["nodeName"] = json!(node.name());
    pod["status"]["containerStatuses"][0]["containerID"] =
        json!(format!("containerd://{container_id}"));
    pod
}

/// `pods` created on the node's inference namespace, their status written as the kubelet
/// writes it; the UIDs the server gave them, in order.
fn put_pods(node: &ApiOnlyNode, pods: &[Value]) -> Vec<String> {
    node.control_plane
        .create_pods(&node.inference, pods)
        .iter()
        .map(|p| p["metadata"]["uid"].as_str().unwrap().to_string())
        .collect()
}

/// The tenants' pods on `node` (the first `count`); their UIDs.
fn tenants_on(node: &ApiOnlyNode, count: usize) -> Vec<String> {
    let pods: Vec<Value> = TENANTS[..count]
        .iter()
        .map(|t| pod(t.pod, node, t.container_id))
        .collect();
    put_pods(node, &pods)
}

/// One GPU shared by the four tenants, and a process of the node itself (no pod), a process that
/// has exited by the time its cgroup is read, and one in a cgroup of no known form.
fn scenario() -> (Scenario, u64, u32) {
    let mut scenario = Scenario::new(1);
    let mut processes: Vec<Value> = TENANTS
        .iter()
        .map(|t| json!({"pid": t.pid, "used_memory": t.memory, "sm_util": t.sm_percent}))
        .collect();
    processes.push(json!({"pid": 900, "used_memory": 512u64 << 20, "graphics": true}));
    processes.push(json!({"pid": 4999, "used_memory": GIB, "sm_util": 3}));
    processes.push(json!({"pid": 4998, "used_memory": GIB, "sm_util": 2}));
    let memory: u64 = TENANTS.iter().map(|t| t.memory).sum::<u64>() + (512 << 20) + 2 * GIB;
    let sm: u32 = TENANTS.iter().map(|t| t.sm_percent).sum::<u32>() + 5;
    scenario.set(0, "processes", json!(processes));
    scenario.set(
        0,
        "memory",
        json!({"total": 80 * GIB, "used": memory, "free": 80 * GIB - memory, "reserved": 0}),
    );
    scenario.set(0, "utilization", json!({"gpu": sm, "memory": 20}));
    (scenario, memory, sm)
}

/// NVIDIA's device plugin with time-slicing: each tenant (in `namespace`) holds one replica of
/// the GPU `uuid`.
fn time_slicing_kubelet(namespace: &str, uuid: &str) -> testbed::node::pod_resources::FakeKubelet {
    let ids: Vec<[String; 1]> = TENANTS
        .iter()
        .map(|t| [format!("{uuid}::{}", t.replica)])
        .collect();
    let id_refs: Vec<[&str; 1]> = ids.iter().map(|[id]| [id.as_str()]).collect();
    let held: Vec<(&str, &str, &[&str])> = TENANTS
        .iter()
        .zip(&id_refs)
        .map(|(t, id)| (t.pod, "nvidia.com/gpu", &id[..]))
        .collect();
    testbed::node::pod_resources::FakeKubelet::serve(testbed::node::pod_resources::response_in(
        namespace, &held,
    ))
}

/// The agent with the tenants' pods on a node of the real cluster and their replicas of GPU
/// `uuid` at the kubelet, the tenants' processes in `proc_root`; `nvml` and `kubelet` are more
/// YAML for those sections. The node and the kubelet live as long as what is returned.
fn tenants_sharing(
    scenario: &Scenario,
    uuid: &str,
    proc_root: &Path,
    nvml: &str,
    kubelet: &str,
) -> Result<Sharing, String> {
    let node = ApiOnlyNode::gpu(&[])?;
    let uids = tenants_on(&node, TENANTS.len());
    host_proc(proc_root, &uids, &[]);
    let fake_kubelet = time_slicing_kubelet(&node.inference, uuid);
    let agent = start(
        scenario,
        proc_root,
        Some(&node),
        &format!(
            "{nvml}kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n{kubelet}",
            fake_kubelet.socket().display().to_string()
        ),
    );
    Ok(Sharing {
        agent,
        node,
        uids,
        _kubelet: fake_kubelet,
    })
}

struct Sharing {
    agent: Agent,
    node: ApiOnlyNode,
    /// The tenants' pods' UIDs, in TENANTS' order.
    uids: Vec<String>,
    _kubelet: testbed::node::pod_resources::FakeKubelet,
}

/// The agent with process attribution on, the fake NVML, `proc_root` as the host's /proc, and
/// where given, the cluster `node` it runs on; `extra` is more YAML.
fn start(scenario: &Scenario, proc_root: &Path, node: Option<&ApiOnlyNode>, extra: &str) -> Agent {
    let mut env = vec![("FAKE_NVML_SCENARIO", scenario.path())];
    let mut config = format!(
        "models: []\nnvml:\n  library: {:?}\n  sample_interval: 100ms\n  pci_devices: {:?}\n  process_attribution: true\n  proc_root: {:?}\n{extra}",
        fake_nvml().display().to_string(),
        scenario.pci_devices().display().to_string(),
        proc_root.display().to_string(),
    );
    if let Some(node) = node {
        env.push(("KUBECONFIG", node.kubeconfig()));
        env.push(("MLNODE_NODE_NAME", node.name().into()));
        config.push_str("readiness:\n  enabled: true\n  interval: 200ms\n");
    }
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    Agent::start_with_env(&config, &env)
}

#[test]
fn four_pods_time_slicing_one_gpu_each_show_their_own_use() {
    let (mut scenario, device_memory, device_sm) = scenario();
    let uuid = gpu_uuid(&scenario, 0);
    let proc_root = tempfile::tempdir().unwrap();
    host_proc(
        proc_root.path(),
        &[],
        &[
            (900, "0::/system.slice/nvidia-persistenced.service\n".into()),
            (
                4998,
                "0::/kubepods.slice/kubepods-burstable.slice/odd.slice\n".into(),
            ),
        ],
    );
    let sharing = testbed::needs!(tenants_sharing(&scenario, &uuid, proc_root.path(), "", ""));
    let Sharing {
        agent, node, uids, ..
    } = &sharing;
    agent.wait_for("each pod's own use", Duration::from_secs(20), |m| {
        TENANTS.iter().all(|t| {
            sample(m, "mlnode_gpu_pod_sm_utilization_ratio", &[("pod", t.pod)])
                == Some(f64::from(t.sm_percent) / 100.0)
                && sample(
                    m,
                    "mlnode_gpu_pod_memory_used_bytes",
                    &[("pod", t.pod), ("vgpu", t.replica)],
                )
                .is_some()
        })
    });
    let m = agent.metrics();
    for (t, uid) in TENANTS.iter().zip(uids) {
        let labels = [
            ("UUID", uuid.as_str()),
            ("gpu", "0"),
            ("pod", t.pod),
            ("namespace", node.inference.as_str()),
            ("container", "vllm"),
            ("pod_uid", uid.as_str()),
            ("vgpu", t.replica),
        ];
        assert_eq!(
            sample(&m, "mlnode_gpu_pod_memory_used_bytes", &labels),
            Some(t.memory as f64),
            "{}: {m}",
            t.pod
        );
    }
    // The node's own process: empty pod labels, not dropped.
    assert_eq!(
        sample(
            &m,
            "mlnode_gpu_pod_memory_used_bytes",
            &[("pod", ""), ("pod_uid", "")]
        ),
        Some((512u64 << 20) as f64)
    );
    // The exited process and the unknown cgroup: absent, counted, never someone else's.
    let attributed: f64 = series_sum(&m, "mlnode_gpu_pod_memory_used_bytes");
    assert_eq!(attributed, (device_memory - 2 * GIB) as f64);
    for reason in ["process_exited", "cgroup_unknown_form"] {
        assert!(
            sample(
                &m,
                "mlnode_gpu_process_attribution_errors_total",
                &[("reason", reason)]
            )
            .is_some_and(|n| n >= 1.0),
            "{reason}: {m}"
        );
    }
    // What the pods' processes used adds up to the device's use, less the two left out.
    let sm: f64 = series_sum(&m, "mlnode_gpu_pod_sm_utilization_ratio");
    assert!(
        (sm - f64::from(device_sm - 5) / 100.0).abs() < 1e-9,
        "{sm} against the device's {device_sm} %"
    );
    assert_eq!(
        sample(&m, "mlnode_gpu_utilization_ratio", &[("gpu", "0")]),
        Some(f64::from(device_sm) / 100.0)
    );
    // Device-wide series are the device's, once: not copied per pod.
    assert_eq!(m.matches("\nmlnode_gpu_temperature_celsius{").count(), 1);
    let log = agent.log();
    assert_eq!(
        log.matches(r#""reason":"process_exited""#).count(),
        1,
        "said once: {log}"
    );
    // vllm-3's process ends: its series go with the next sample, the others stay.
    let remaining: Vec<Value> = scenario.value["devices"][0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] != TENANTS[3].pid)
        .cloned()
        .collect();
    scenario.set(0, "processes", json!(remaining));
    agent.wait_for("vllm-3's series gone", Duration::from_secs(10), |m| {
        sample(m, "mlnode_gpu_pod_memory_used_bytes", &[("pod", "vllm-3")]).is_none()
    });
    let m = agent.metrics();
    assert!(sample(&m, "mlnode_gpu_pod_memory_used_bytes", &[("pod", "vllm-2")]).is_some());
}

#[test]
fn pods_sharing_a_mig_device_each_show_their_memory_and_no_utilisation() {
    let mut scenario = Scenario::new(1);
    let mig = "MIG-11111111-2222-3333-4444-555555555555";
    scenario.set(
        0,
        "mig",
        json!({"enabled": true, "instances": [{
            "uuid": mig, "gpu_instance_id": 7, "compute_instance_id": 0, "profile": "3g.40gb",
            "memory": {"total": 40 * GIB, "used": 9 * GIB, "free": 31 * GIB},
            "processes": [
                {"pid": TENANTS[0].pid, "used_memory": 5 * GIB, "sm_util": 30},
                {"pid": TENANTS[1].pid, "used_memory": 4 * GIB, "sm_util": 20},
            ],
        }]}),
    );
    let node = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let uids = tenants_on(&node, 2);
    let proc_root = tempfile::tempdir().unwrap();
    host_proc(proc_root.path(), &uids, &[]);
    let agent = start(&scenario, proc_root.path(), Some(&node), "");
    agent.wait_for(
        "both pods on the MIG device",
        Duration::from_secs(20),
        |m| {
            TENANTS[..2].iter().all(|t| {
                sample(
                    m,
                    "mlnode_gpu_pod_memory_used_bytes",
                    &[
                        ("pod", t.pod),
                        ("GPU_I_ID", "7"),
                        ("GPU_I_PROFILE", "3g.40gb"),
                    ],
                )
                .is_some()
            })
        },
    );
    let m = agent.metrics();
    assert_eq!(
        series_sum(&m, "mlnode_gpu_pod_memory_used_bytes"),
        (9 * GIB) as f64,
        "the instance's memory, split between its pods"
    );
    assert!(
        !m.contains("\nmlnode_gpu_pod_sm_utilization_ratio{"),
        "NVML gives no per-process utilisation on MIG: {m}"
    );
    assert!(!m.contains("reason=\"utilization_not_supported\""), "{m}");
}

/// NVML's refusals: the process list without hostPID (NO_PERMISSION) leaves every per-pod series
/// absent; a driver without per-process utilisation (NOT_SUPPORTED) keeps the memory ones. Each
/// is counted and said once, and the device's own series go on.
#[test]
fn nvml_refusing_per_process_calls_leaves_those_series_absent_and_says_so() {
    for (refusal, call, reason, memory_kept) in [
        (
            "no_permission",
            "processes",
            "processes_no_permission",
            false,
        ),
        (
            "unsupported",
            "process_utilization",
            "utilization_not_supported",
            true,
        ),
    ] {
        let (mut scenario, _, _) = scenario();
        scenario.set(0, refusal, json!([call]));
        let proc_root = tempfile::tempdir().unwrap();
        let uids = offline_uids();
        host_proc(proc_root.path(), &uids, &[]);
        let agent = start(&scenario, proc_root.path(), None, "");
        agent.wait_for("the refusal counted", Duration::from_secs(20), |m| {
            sample(
                m,
                "mlnode_gpu_process_attribution_errors_total",
                &[("reason", reason)],
            )
            .is_some_and(|n| n >= 3.0)
        });
        let m = agent.metrics();
        assert_eq!(
            sample(
                &m,
                "mlnode_gpu_pod_memory_used_bytes",
                &[("pod_uid", uids[0].as_str())]
            )
            .is_some(),
            memory_kept,
            "{reason}: {m}"
        );
        assert!(
            !m.contains("\nmlnode_gpu_pod_sm_utilization_ratio{"),
            "{reason}: {m}"
        );
        assert!(sample(&m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]).is_some());
        assert_eq!(agent.log().matches(reason).count(), 1, "{reason} said once");
    }
}

fn gpu_uuid(scenario: &Scenario, gpu: usize) -> String {
    scenario.value["devices"][gpu]["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn series_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// `kubelet.pod_uid` and `kubelet.pod_labels`: a GPU's holder's UID and the labels asked for (keys
/// named as dcgm-exporter names them) on its series, from the pods the agent watches.
#[test]
fn a_holders_uid_and_chosen_labels_go_on_its_gpus_series() {
    let scenario = Scenario::new(2);
    let uuid = gpu_uuid(&scenario, 0);
    let proc_root = tempfile::tempdir().unwrap();
    host_proc(proc_root.path(), &[], &[]);
    let node = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let mut held = pod(TENANTS[0].pod, &node, TENANTS[0].container_id);
    held["metadata"]["labels"]["app.kubernetes.io/part-of"] = json!("search");
    let uid = put_pods(&node, &[held]).remove(0);
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(
        testbed::node::pod_resources::response_in(
            &node.inference,
            &[(TENANTS[0].pod, "nvidia.com/gpu", &[uuid.as_str()])],
        ),
    );
    let agent = start(
        &scenario,
        proc_root.path(),
        Some(&node),
        &format!(
            "kubelet:\n  pod_resources_socket: {:?}\n  pod_resources_interval: 200ms\n  pod_uid: true\n  pod_labels: [app, 'app\\.kubernetes\\.io/.*']\n",
            kubelet.socket().display().to_string()
        ),
    );
    let want = [
        ("gpu", "0"),
        ("pod", TENANTS[0].pod),
        ("pod_uid", uid.as_str()),
        ("app", "vllm-llama"),
        ("app_kubernetes_io_part_of", "search"),
    ];
    agent.wait_for(
        "the holder's uid and labels",
        Duration::from_secs(20),
        |m| sample(m, "mlnode_gpu_temperature_celsius", &want).is_some(),
    );
    let m = agent.metrics();
    let line = m
        .lines()
        .find(|l| l.starts_with("mlnode_gpu_temperature_celsius{gpu=\"0\""))
        .unwrap();
    assert!(!line.contains("pod_template_hash"), "not asked for: {line}");
    let free = m
        .lines()
        .find(|l| l.starts_with("mlnode_gpu_temperature_celsius{gpu=\"1\""))
        .unwrap();
    assert!(
        !free.contains("pod_uid") && !free.contains("app="),
        "{free}"
    );
}

/// `kubelet.virtual_gpus`, dcgm-exporter's `--kubernetes-virtual-gpus`: a time-sliced GPU's DCGM_*
/// series once per replica holder with `vgpu`, and (its PR #594) framebuffer used and GPU
/// utilisation each holder's own beside the device's; the agent's own series stay the device's.
#[test]
fn virtual_gpus_copy_dcgm_series_per_replica_holder_with_their_own_use() {
    let (scenario, device_memory, _) = scenario();
    let uuid = gpu_uuid(&scenario, 0);
    let proc_root = tempfile::tempdir().unwrap();
    let sharing = testbed::needs!(tenants_sharing(
        &scenario,
        &uuid,
        proc_root.path(),
        "  dcgm_names: true\n",
        "  virtual_gpus: true\n",
    ));
    let agent = &sharing.agent;
    agent.wait_for("every holder's copies", Duration::from_secs(20), |m| {
        TENANTS.iter().all(|t| {
            sample(
                m,
                "DCGM_FI_DEV_GPU_UTIL",
                &[("pod", t.pod), ("vgpu", t.replica)],
            ) == Some(f64::from(t.sm_percent))
        })
    });
    let m = agent.metrics();
    let temperature = sample(&m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]).unwrap();
    for t in &TENANTS {
        let holder = [("gpu", "0"), ("pod", t.pod), ("vgpu", t.replica)];
        assert_eq!(
            sample(&m, "DCGM_FI_DEV_GPU_TEMP", &holder),
            Some(temperature)
        );
        assert_eq!(
            sample(&m, "DCGM_FI_DEV_FB_USED", &holder),
            Some((t.memory >> 20) as f64),
            "{}'s own framebuffer",
            t.pod
        );
    }
    let lines = |family: &str| {
        m.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .collect::<Vec<_>>()
    };
    assert_eq!(lines("DCGM_FI_DEV_GPU_TEMP").len(), 4, "one per holder");
    let used = lines("DCGM_FI_DEV_FB_USED");
    assert_eq!(used.len(), 5, "the device's and one per holder: {used:?}");
    assert!(
        used.iter()
            .any(|l| !l.contains("pod=") && l.ends_with(&format!(" {}", device_memory >> 20))),
        "{used:?}"
    );
    let own = lines("mlnode_gpu_temperature_celsius");
    assert_eq!(own.len(), 1, "{own:?}");
    assert!(
        !own[0].contains("pod="),
        "a shared GPU's own series name no holder: {own:?}"
    );
}

/// The series of a node with 8 GPUs, each time-sliced among 8 pods (one process each), in each
/// mode: what docs/performance.md tabulates ("Series on a shared-GPU node"). Run with
/// `--nocapture` to see the table. The agent's own series do not grow with the pods; per-pod
/// use adds two per container and device; dcgm-exporter's virtual GPUs copy every DCGM_* series
/// per holder (its rule: fields x GPUs x pods, and the device's own framebuffer and utilisation).
#[test]
fn series_on_a_node_with_8_gpus_each_shared_by_8_pods() {
    const GPUS: usize = 8;
    const PODS: usize = 8;
    let mut scenario = Scenario::new(GPUS);
    let proc_root = tempfile::tempdir().unwrap();
    let node = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let mut pods = Vec::new();
    let mut held: Vec<(String, String)> = Vec::new();
    let mut processes: Vec<(u32, String)> = Vec::new();
    for g in 0..GPUS {
        let uuid = gpu_uuid(&scenario, g);
        let mut on_gpu = Vec::new();
        for p in 0..PODS {
            let n = g * PODS + p;
            let container_id = format!("{n:064x}");
            let pid = 5000 + n as u32;
            on_gpu.push(json!({"pid": pid, "used_memory": GIB, "sm_util": 10}));
            pods.push(pod(&format!("vllm-{n}"), &node, &container_id));
            processes.push((pid, container_id));
            held.push((format!("vllm-{n}"), format!("{uuid}::{p}")));
        }
        scenario.set(g, "processes", json!(on_gpu));
    }
    let uids = put_pods(&node, &pods);
    let cgroups: Vec<(u32, String)> = processes
        .iter()
        .zip(&uids)
        .map(|((pid, container_id), uid)| (*pid, cgroup(uid, container_id)))
        .collect();
    host_proc(proc_root.path(), &[], &cgroups);
    let ids: Vec<[&str; 1]> = held.iter().map(|(_, id)| [id.as_str()]).collect();
    let listed: Vec<(&str, &str, &[&str])> = held
        .iter()
        .zip(&ids)
        .map(|((pod, _), id)| (pod.as_str(), "nvidia.com/gpu", &id[..]))
        .collect();
    let kubelet = testbed::node::pod_resources::FakeKubelet::serve(
        testbed::node::pod_resources::response_in(&node.inference, &listed),
    );
    let socket = kubelet.socket().display().to_string();
    let count = |nvml: &str, kubelet_extra: &str| {
        let config = format!(
            "{nvml}kubelet:\n  pod_resources_socket: {socket:?}\n  pod_resources_interval: 200ms\n{kubelet_extra}"
        );
        let agent = start(&scenario, proc_root.path(), Some(&node), &config);
        // GPM's ratios come from the second sample on, the holders with the kubelet's answer.
        let lines = |m: &str, family: &str, with: &str| {
            m.lines()
                .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(with))
                .count()
        };
        agent.wait_for(
            "every GPU, its GPM and its holders",
            Duration::from_secs(30),
            |m| {
                lines(m, "mlnode_gpu_pod_sm_utilization_ratio", "pod=\"vllm-") == GPUS * PODS
                    && lines(m, "mlnode_gpu_sm_active_ratio", "") == GPUS
                    && (lines(m, "DCGM_FI_DEV_GPU_TEMP", "pod=\"vllm-") > 0)
                        == nvml.contains("dcgm")
            },
        );
        let m = agent.metrics();
        let series = |wanted: &dyn Fn(&str) -> bool| {
            m.lines()
                .filter(|l| !l.starts_with('#') && wanted(l))
                .count()
        };
        [
            series(&|l| l.starts_with("mlnode_gpu_") && !l.starts_with("mlnode_gpu_pod_")),
            series(&|l| l.starts_with("mlnode_gpu_pod_")),
            series(&|l| l.starts_with("DCGM_")),
        ]
    };
    let with_use = count("", "");
    let dcgm = count("  dcgm_names: true\n", "");
    let virtual_gpus = count("  dcgm_names: true\n", "  virtual_gpus: true\n");
    println!("| agent: nvml.process_attribution | mlnode_gpu_* of the devices | mlnode_gpu_pod_* | DCGM_* |");
    println!("| --- | --- | --- | --- |");
    for (mode, [devices, per_pod, dcgm]) in [
        ("alone", with_use),
        ("with nvml.dcgm_names", dcgm),
        (
            "with nvml.dcgm_names and kubelet.virtual_gpus",
            virtual_gpus,
        ),
    ] {
        println!("| {mode} | {devices} | {per_pod} | {dcgm} |");
    }
    assert_eq!(with_use[1], 2 * GPUS * PODS, "two per container and GPU");
    assert_eq!(
        [virtual_gpus[0], virtual_gpus[1]],
        [dcgm[0], dcgm[1]],
        "the agent's own series are not copied"
    );
    let fields = dcgm[2] / GPUS;
    assert_eq!(
        virtual_gpus[2],
        GPUS * (PODS * fields + PER_PROCESS_FIELDS),
        "dcgm-exporter's rule: every field per holder, and the device's own framebuffer and utilisation"
    );
}

/// `DCGM_FI_DEV_FB_USED` and `DCGM_FI_DEV_GPU_UTIL`, which dcgm-exporter keeps once per device
/// beside the holders' own.
const PER_PROCESS_FIELDS: usize = 2;

fn times() -> PodTimes {
    let now = unix_now();
    PodTimes {
        created: now - 600.0,
        scheduled: now - 599.0,
        started: now - 590.0,
        ready: Some(now - 500.0),
        restart_count: 0,
        last_finished: None,
    }
}
