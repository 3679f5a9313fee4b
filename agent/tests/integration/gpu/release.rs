//! Letting go of NVML so a GPU can be reset or reconfigured (the driver's reset, the release
//! annotation, the MIG manager), bounded by a timeout, and a GPU unbound and bound again.

use super::*;

/// The files of `dir` the process `pid` holds open, as `fuser` and `nvidia-smi --gpu-reset` see
/// them: its `/proc/<pid>/fd` links.
fn held_files(pid: u32, dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// The driver asks for a reset of GPU 0 (recovery action GPU_RESET): the agent closes every NVML
/// handle (the fake's inits and shutdowns balance, no device file is held), says so in the gate and
/// a metric, keeps serving with GPU 0's series absent, and takes NVML back once GPU 0 has left the
/// bus and returned, its series back with their labels.
#[test]
fn the_agent_lets_go_of_nvml_for_a_reset_and_takes_it_back_after() {
    let mut scenario = Scenario::new(2);
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = start_watched(&scenario, &api.kubeconfig(), api.name(), "");
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let devices = scenario.device_dir();
    assert_eq!(
        held_files(agent.pid(), &devices).len(),
        2,
        "NVML holds both GPUs' files"
    );
    scenario.set(0, "recovery_action", json!(1));
    let condition = wait_condition(&agent, &api, "released", |c| {
        c["reason"] == "GPUResetRequired"
            && c["message"]
                .as_str()
                .unwrap_or_default()
                .contains("closed every NVML handle")
    });
    assert!(
        condition["message"].as_str().unwrap().contains(
            "the driver asks for a GPU reset of GPU-00000000-1111-2222-3333-444444444440 (0000:07:00.0): the agent closed every NVML handle"
        ),
        "{condition}"
    );
    let ledger = scenario.ledger();
    assert_eq!(ledger["initialized"], 0, "{ledger}");
    assert_eq!(ledger["inits"], ledger["shutdowns"], "{ledger}");
    assert!(
        held_files(agent.pid(), &devices).is_empty(),
        "no device file held"
    );
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "mlnode_gpu_nvml_released", &[]), Some(1.0));
    assert_eq!(
        sample(&metrics, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]),
        None,
        "GPU 0's series are absent"
    );
    assert!(
        !metrics.contains("GPU-00000000-1111"),
        "nothing of GPU 0 is said"
    );
    // The reset: the GPU leaves the bus and comes back; the driver then asks for nothing.
    let bdf = "0000:07:00.0";
    scenario.remove_pci_gpu(bdf);
    agent.wait_for("GPU 0 off the bus", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_pci_devices", &[]) == Some(1.0)
    });
    scenario.set(0, "recovery_action", json!(0));
    scenario.restore_pci_gpu(bdf);
    wait_condition(&agent, &api, "taken back", |c| c["status"] == "True");
    agent.wait_for("GPU 0 read again", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "0")]) == Some(40.0)
    });
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "mlnode_gpu_nvml_released", &[]), Some(0.0));
    assert_eq!(
        sample(
            &metrics,
            "mlnode_gpu_nvml_reattaches_total",
            &[("after", "reset")]
        ),
        Some(1.0)
    );
    assert_eq!(scenario.ledger()["inits"], 2);
    assert_eq!(held_files(agent.pid(), &devices).len(), 2);
}

/// An operator or a reset janitor asks through the node annotation `mlnode.dev/release-gpus`, seen
/// through one watch of the node on the real API server (the agent's pod's token, the shipped
/// RBAC): every GPU is let go of (no device file held, NVML shut down), the gate says who asked
/// (`GPUsReleased`), and NVML is taken back when the annotation is removed.
#[test]
fn the_release_annotation_lets_go_of_every_gpu_until_it_is_removed() {
    let control_plane = testbed::needs!(testbed::cluster::control_plane::shared());
    let objects = testbed::needs!(testbed::renderers::kustomize::render_with(
        "overlays/gpu",
        &[]
    ));
    let on = testbed::cluster::control_plane::AgentOnNode::start(
        control_plane,
        &objects,
        &control_plane.unique("node"),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = control_plane.token_kubeconfig(&on.token, dir.path());
    let scenario = Scenario::new(2);
    let agent = start_watched(&scenario, &kubeconfig, &on.node, "");
    let condition = |what: &str, check: &dyn Fn(&Value) -> bool| {
        testbed::wait_until(what, Duration::from_secs(30), || {
            let node = control_plane.get(&["node", &on.node]);
            let condition = testbed::cluster::control_plane::condition(&node, "AcceleratorHealthy");
            if check(&condition) {
                Ok(condition)
            } else {
                Err(format!(
                    "AcceleratorHealthy is {condition}\n{}",
                    agent.log()
                ))
            }
        })
    };
    condition("healthy at start", &|c| c["status"] == "True");
    let devices = scenario.device_dir();
    let annotation = "mlnode.dev/release-gpus=janitor: reset GPU 1";
    control_plane.admin(&["annotate", "node", &on.node, annotation], "");
    let released = condition("released", &|c| c["reason"] == "GPUsReleased");
    assert!(
        released["message"].as_str().unwrap().contains(
            "the node's mlnode.dev/release-gpus annotation (\"janitor: reset GPU 1\") asks for a release of GPU-00000000-1111-2222-3333-444444444440 (0000:07:00.0), GPU-00000001-1111-2222-3333-444444444441 (0000:17:00.0)"
        ),
        "{released}"
    );
    assert!(
        held_files(agent.pid(), &devices).is_empty(),
        "no device file held"
    );
    assert_eq!(scenario.ledger()["initialized"], 0);
    let metrics = agent.metrics();
    assert!(
        sample(
            &metrics,
            "mlnode_kube_requests_total",
            &[("verb", "watch"), ("resource", "nodes"), ("code", "200")]
        )
        .is_some(),
        "one watch of the node: {metrics}"
    );
    assert_eq!(
        testbed::cluster::control_plane::refused_requests(&metrics),
        Vec::<String>::new()
    );
    control_plane.admin(
        &["annotate", "node", &on.node, "mlnode.dev/release-gpus-"],
        "",
    );
    condition("taken back", &|c| c["status"] == "True");
    read_again_after(&agent, "annotation_removed", &devices);
}

/// The GPU Operator's MIG manager reconfiguring the node, its states set on the Node's
/// `nvidia.com/mig.config.state` label as NVIDIA/mig-parted's reconfigure-mig.sh sets them, seen
/// through the agent's one watch of its node on the real API server: NVML is let go of while it
/// is `pending` (no device file held, the gate and the log say why) and taken back at `success`;
/// once it says `rebooting`, NVML stays released whatever follows, until the agent restarts.
#[test]
fn the_mig_managers_reconfiguration_releases_nvml_until_it_is_done() {
    let scenario = Scenario::new(2);
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = start_watched(&scenario, &api.kubeconfig(), api.name(), "");
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let devices = scenario.device_dir();
    // A finished reconfiguration from before asks for nothing.
    api.label_node("nvidia.com/mig.config.state", "success");
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(held_files(agent.pid(), &devices).len(), 2);
    api.label_node("nvidia.com/mig.config.state", "pending");
    let released = wait_condition(&agent, &api, "released", |c| {
        c["reason"] == "MIGReconfiguring"
    });
    let message = released["message"].as_str().unwrap();
    assert!(
        message.contains("the GPU Operator's MIG manager is changing the MIG layout (nvidia.com/mig.config.state=pending) of GPU-00000000-1111-2222-3333-444444444440 (0000:07:00.0), GPU-00000001-1111-2222-3333-444444444441 (0000:17:00.0): the agent closed every NVML handle")
            && message.contains("once it is done (the label leaves pending), or after 10m"),
        "{released}"
    );
    assert!(held_files(agent.pid(), &devices).is_empty());
    assert_eq!(scenario.ledger()["initialized"], 0);
    assert!(agent.log().contains("MIG manager is reconfiguring"));
    api.label_node("nvidia.com/mig.config.state", "success");
    wait_condition(&agent, &api, "taken back", |c| c["status"] == "True");
    read_again_after(&agent, "mig_config_done", &devices);
    // A MIG mode change that needs a reboot: released until the agent starts again.
    api.label_node("nvidia.com/mig.config.state", "pending");
    wait_condition(&agent, &api, "released again", |c| {
        c["reason"] == "MIGReconfiguring"
    });
    api.label_node("nvidia.com/mig.config.state", "rebooting");
    let rebooting = wait_condition(&agent, &api, "until the restart", |c| {
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("when the agent starts again after the node's reboot")
    });
    assert!(
        !rebooting["message"]
            .as_str()
            .unwrap()
            .contains("nvml.release_timeout"),
        "{rebooting}"
    );
    api.label_node("nvidia.com/mig.config.state", "success");
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_nvml_released", &[]),
        Some(1.0)
    );
    assert!(held_files(agent.pid(), &devices).is_empty());
    assert_eq!(
        testbed::cluster::control_plane::refused_requests(&agent.metrics()),
        Vec::<String>::new()
    );
}

/// Waits until NVML is taken back `after` a release, both GPUs read again and their device files
/// held again.
fn read_again_after(agent: &Agent, after: &str, devices: &Path) {
    agent.wait_for("read again", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_nvml_reattaches_total", &[("after", after)]) == Some(1.0)
            && sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "1")]) == Some(41.0)
    });
    assert_eq!(held_files(agent.pid(), devices).len(), 2);
}

/// A reset that never comes: NVML is taken back after `nvml.release_timeout`, said once, and not
/// let go again while the driver keeps asking for the same GPU: the gate then says what the driver
/// asks for.
#[test]
fn a_release_is_bounded_by_its_timeout() {
    let mut scenario = Scenario::new(1);
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = start_watched(
        &scenario,
        &api.kubeconfig(),
        api.name(),
        "  release_timeout: 5s\n",
    );
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    scenario.set(0, "recovery_action", json!(1));
    let released = |c: &Value| {
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("closed every NVML handle")
    };
    wait_condition(&agent, &api, "released", |c| released(c));
    wait_condition(&agent, &api, "taken back", |c| {
        c["reason"] == "GPUResetRequired" && !released(c)
    });
    agent.wait_for("the timeout counted", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_nvml_reattaches_total",
            &[("after", "timeout")],
        ) == Some(1.0)
    });
    wait_rounds_of_readiness(&agent, 3.0);
    assert_eq!(
        sample(&agent.metrics(), "mlnode_gpu_nvml_released", &[]),
        Some(0.0)
    );
    assert_eq!(scenario.ledger()["inits"], 2, "released once only");
    assert!(
        agent
            .log()
            .contains("no reset seen within nvml.release_timeout"),
        "{}",
        agent.log()
    );
}

/// A GPU unbound from the driver (for a VM, or a reset by unbind and bind) and bound again, with no
/// restart: NVML is initialised again each time, the gone GPU's series disappear and return with
/// its labels, and the count verdict names it while it is off the driver.
#[test]
fn a_gpu_unbound_and_bound_again_is_followed_without_a_restart() {
    let mut scenario = Scenario::new(2);
    let api = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let agent = start_watched(&scenario, &api.kubeconfig(), api.name(), "");
    wait_condition(&agent, &api, "healthy at start", |c| c["status"] == "True");
    let bdf = "0000:17:00.0";
    scenario.set(1, "bound", json!(false));
    scenario.unbind(bdf);
    let condition = wait_condition(&agent, &api, "GPU 1 unbound", |c| {
        c["reason"] == "GPUCountMismatch"
    });
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("not listed 0000:17:00.0"),
        "{condition}"
    );
    agent.wait_for("one GPU listed", Duration::from_secs(20), |m| {
        sample(m, "mlnode_gpu_count", &[]) == Some(1.0)
            && sample(m, "mlnode_gpu_temperature_celsius", &[("gpu", "1")]).is_none()
    });
    assert!(
        !agent.metrics().contains("GPU-00000001-1111"),
        "GPU 1's series are gone"
    );
    scenario.set(1, "bound", json!(true));
    scenario.bind(bdf);
    wait_condition(&agent, &api, "GPU 1 back", |c| c["status"] == "True");
    agent.wait_for("GPU 1 read again", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_gpu_temperature_celsius",
            &[
                ("gpu", "1"),
                ("UUID", "GPU-00000001-1111-2222-3333-444444444441"),
            ],
        ) == Some(41.0)
    });
    let metrics = agent.metrics();
    assert_eq!(
        sample(&metrics, "mlnode_gpu_nvml_reinits_total", &[]),
        Some(2.0),
        "once for each change"
    );
}
