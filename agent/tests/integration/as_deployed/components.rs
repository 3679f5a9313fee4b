//! The opt-in components as deployed: the kernel log's, process attribution's and non-root's.

use super::*;

/// components/kernel-log as deployed: the host's journal holds, from before the agent started, an
/// XID only the kernel log can show now (NVML's events were not registered then); the agent, UID 0
/// with no capability and the journal mounted read-only, holds the node on it at start.
#[test]
fn the_kernel_log_component_holds_the_node_on_an_xid_from_before_the_start() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let objects = testbed::needs!(kustomize::render_with(
        "overlays/gpu",
        &["components/kernel-log"]
    ));
    let (_, spec) = pod_template(&objects);
    let container = &spec["containers"][0];
    assert_eq!(
        container["securityContext"]["capabilities"],
        json!({"drop": ["ALL"]}),
        "no capability added"
    );
    let journal_mounts: Vec<&Value> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["mountPath"].as_str().unwrap().ends_with("/log/journal"))
        .collect();
    assert_eq!(journal_mounts.len(), 2);
    assert!(journal_mounts.iter().all(|m| m["readOnly"] == true));
    let gpu = h100(1);
    let slot = testbed::devices::journal::driver_slot(gpu["pci_bus_id"].as_str().unwrap());
    let line = format!("NVRM: Xid (PCI:{slot}): 119, pid=2211, name=vllm, Timeout after 6s of waiting for RPC response from GPU1 GSP!");
    let GpuNode {
        cluster,
        mut agent,
        _kubelet,
        _dirs,
        ..
    } = testbed::needs!(gpu_node_prepared(objects, 0, |host| {
        std::fs::create_dir_all(host.path("/run/log/journal")).unwrap();
        let dir = host.path("/var/log/journal/4f1c2d3e4b5a69788796a5b4c3d2e1f0");
        testbed::devices::journal::write(
            &dir,
            "system.journal",
            &[testbed::devices::journal::kernel(&line, 120)],
        )
        .map(drop)
    }));
    agent.wait(
        "AcceleratorHealthy False on the logged XID",
        Duration::from_secs(60),
        |_| cluster.condition("AcceleratorHealthy")["reason"] == "FatalXID",
    );
    let message = cluster.condition("AcceleratorHealthy")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains(gpu["uuid"].as_str().unwrap())
            && message.contains("the kernel log has XID 119"),
        "{message}"
    );
    let metrics = agent.metrics().unwrap();
    assert_eq!(sample(&metrics, "mlnode_kernel_log_up", &[]), Some(1.0));
    assert_eq!(
        sample(&metrics, "mlnode_kernel_log_entries_read_total", &[]),
        Some(1.0)
    );
}

/// components/process-attribution as deployed: the pod in the host's PID namespace (the emulation
/// shares it, as hostPID does), no capability added, the variable the component sets; the agent
/// reads each GPU process's cgroup in its own /proc. NVML lists the node's init (pid 1: no pod's,
/// so empty pod labels) and a pid that exists no more (counted, left out).
#[test]
fn the_process_attribution_component_reads_the_hosts_processes_as_deployed() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let objects = testbed::needs!(kustomize::render_with(
        "overlays/gpu",
        &["components/process-attribution"]
    ));
    let (_, spec) = pod_template(&objects);
    assert_eq!(spec["hostPID"], true);
    assert_eq!(
        spec["containers"][0]["securityContext"]["capabilities"],
        json!({"drop": ["ALL"]}),
        "no capability added"
    );
    let GpuNode {
        mut agent,
        _dirs: dirs,
        ..
    } = testbed::needs!(gpu_node_prepared(objects, 0, |_| Ok(())));
    let scenario = dirs.0.root.path().join("nvml-scenario.json");
    let mut nvml: Value =
        serde_json::from_str(&std::fs::read_to_string(&scenario).unwrap()).unwrap();
    // Past the kernel's pid_max (4194304 at most): no such process.
    nvml["devices"][1]["processes"] = json!([
        {"pid": 1, "used_memory": 1u64 << 30, "sm_util": 0},
        {"pid": 4_194_400, "used_memory": 1u64 << 30, "sm_util": 0},
    ]);
    std::fs::write(&scenario, nvml.to_string()).unwrap();
    let uuid = nvml["devices"][1]["uuid"].as_str().unwrap().to_string();
    agent.wait(
        "init's framebuffer, under no pod",
        Duration::from_secs(30),
        |a| {
            a.metrics().is_some_and(|m| {
                sample(
                    &m,
                    "mlnode_gpu_pod_memory_used_bytes",
                    &[("UUID", uuid.as_str()), ("pod", "")],
                ) == Some((1u64 << 30) as f64)
            })
        },
    );
    let metrics = agent.metrics().unwrap();
    assert!(
        sample(
            &metrics,
            "mlnode_gpu_process_attribution_errors_total",
            &[("reason", "process_exited")]
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

/// components/non-root's documented cost, as deployed: UID 65532 cannot open the kubelet's
/// socket, so GPU series come without their owner's labels, and the log says why.
#[test]
fn the_non_root_component_runs_without_pod_labels_and_says_why() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let GpuNode {
        mut agent,
        vllm_gpu,
        _kubelet,
        _dirs,
        ..
    } = testbed::needs!(gpu_node_with(&["components/non-root"], 65532));
    agent.wait(
        "the pod-resources refusal logged",
        Duration::from_secs(30),
        |a| a.log().contains("no pod labels on devices") && a.log().contains("Permission denied"),
    );
    agent.wait("GPU series", Duration::from_secs(30), |a| {
        a.metrics().is_some_and(|m| {
            sample(&m, "mlnode_gpu_utilization_ratio", &[("UUID", &vllm_gpu)]).is_some()
        })
    });
    let metrics = agent.metrics().unwrap();
    assert!(!metrics.contains("pod=\"vllm-0\""), "{metrics}");
    assert_eq!(
        control_plane::refused_requests(&metrics),
        Vec::<String>::new()
    );
}
