//! The agent as the shipped manifests deploy it, not as a test would like to start it. Each overlay
//! is rendered by real kustomize (its Pod Security admission is cluster_install.rs's, on a real
//! kube-apiserver); the container is started the way the kubelet and
//! containerd start it (common::container): the image built as the Dockerfile builds it, every
//! ConfigMap and hostPath at its mountPath, the service-account token and CA where a pod finds
//! them, the container's env (fieldRefs filled in) and args, its UID, no capabilities, a read-only
//! root. It talks TLS to a real kube-apiserver (common::control_plane) with the rendered RBAC and
//! ValidatingAdmissionPolicies installed, as its own pod bound to its node, with the token
//! TokenRequest gives that pod, and reads a fake kubelet pod-resources socket at the mounted host
//! path. Whatever the manifests get wrong (a dropped setting, a missing permission, a
//! socket the UID cannot open) fails here.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::agent::{http_get, sample};
use common::cluster_node::ClusterNode;
use common::container::{self, ContainerSpec, Image, Mount};
use common::control_plane::{self, gpu_taints};
use common::kubelet::{response, FakeKubelet};
use common::kustomize::{self, find};
use serde_json::{json, Value};

/// The agent listens on the port its ConfigMap names, in what would be the pod's own network
/// namespace; here it is the host's, so the runs take turns.
static PORT_9400: Mutex<()> = Mutex::new(());

fn pod_template(objects: &[Value]) -> (&Value, &Value) {
    let ds = kustomize::daemonset(objects);
    let template = &ds["spec"]["template"];
    (&template["metadata"], &template["spec"])
}

/// The node labels each overlay's affinity must match: GFD, NFD, Karpenter, EKS Auto Mode for
/// GPUs; instance types and Karpenter/Auto Mode accelerator labels for Neuron.
#[test]
fn every_kind_of_accelerator_node_gets_an_agent() {
    let matches = |objects: &[Value], labels: &Value| {
        let (_, spec) = pod_template(objects);
        let terms = spec["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .as_array()
            .unwrap();
        terms.iter().any(|term| {
            term["matchExpressions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| {
                    let value = labels[e["key"].as_str().unwrap()].as_str();
                    match e["operator"].as_str().unwrap() {
                        "In" => value.is_some_and(|v| {
                            e["values"].as_array().unwrap().iter().any(|x| x == v)
                        }),
                        "Exists" => value.is_some(),
                        other => panic!("operator {other} not modelled"),
                    }
                })
        })
    };
    let gpu = common::needs!(kustomize::render_with("overlays/gpu", &[]));
    let neuron = common::needs!(kustomize::render_with("overlays/neuron", &[]));
    let gpu_nodes = [
        json!({"nvidia.com/gpu.present": "true"}),
        json!({"feature.node.kubernetes.io/pci-10de.present": "true"}),
        json!({"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia"}),
        json!({"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia"}),
    ];
    let neuron_nodes = [
        json!({"node.kubernetes.io/instance-type": "inf1.6xlarge"}),
        json!({"node.kubernetes.io/instance-type": "inf2.48xlarge"}),
        json!({"node.kubernetes.io/instance-type": "trn1n.32xlarge"}),
        json!({"node.kubernetes.io/instance-type": "trn2u.48xlarge"}),
        json!({"karpenter.k8s.aws/instance-accelerator-manufacturer": "aws"}),
        json!({"eks.amazonaws.com/instance-accelerator-manufacturer": "aws"}),
    ];
    for labels in &gpu_nodes {
        assert!(matches(&gpu, labels), "no GPU agent on {labels}");
        assert!(!matches(&neuron, labels), "a Neuron agent on {labels}");
    }
    for labels in &neuron_nodes {
        assert!(matches(&neuron, labels), "no Neuron agent on {labels}");
        assert!(!matches(&gpu, labels), "a GPU agent on {labels}");
    }
    let cpu = json!({"node.kubernetes.io/instance-type": "m7i.4xlarge", "karpenter.k8s.aws/instance-cpu-manufacturer": "intel"});
    assert!(!matches(&gpu, &cpu) && !matches(&neuron, &cpu));
}

/// The host side of a node: a directory standing for `/`, where hostPath volumes resolve.
struct Host {
    root: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        Host {
            root: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
        }
    }

    fn path(&self, host_path: &str) -> PathBuf {
        self.root.path().join(host_path.trim_start_matches('/'))
    }
}

/// What the test puts on the node beside what the manifests ship.
struct NodeSetup<'a> {
    host: &'a Host,
    cluster: &'a ClusterNode,
    /// The NVIDIA container toolkit's injections, for a container that asks for GPUs.
    nvml_scenario: Option<&'a Path>,
    /// The Neuron driver's sysfs tree, under the container's /sys.
    neuron_sysfs: Option<&'a Path>,
    /// Replaces a key of a ConfigMap (namespace-less name, key, content), as README step 2 has the
    /// user put their manifests in.
    configmap_edits: Vec<(&'a str, &'a str, String)>,
}

/// The README's model in the install's config and its manifest beside it (README step 3).
fn readme_model(objects: &[Value], manifest: String) -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            "mlnode-agent-config",
            "config.yaml",
            kustomize::config_with_readme_model(objects),
        ),
        ("mlnode-model-manifests", "llama-3.1-8b.json", manifest),
    ]
}

/// The container the kubelet would start for the rendered DaemonSet, on this node.
fn as_kubelet_would(objects: &[Value], setup: &NodeSetup, volumes_dir: &Path) -> ContainerSpec {
    let (_, spec) = pod_template(objects);
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let ds = kustomize::daemonset(objects);
    let namespace = ds["metadata"]["namespace"].as_str().unwrap();

    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"))
            .unwrap();
    let image = Image::from_dockerfile(&dockerfile);
    let rootfs = volumes_dir.join("rootfs");
    image.unpack(&rootfs, &assert_cmd::cargo::cargo_bin("mlnode-agent"));

    // Volumes, as the kubelet materialises them.
    let mut mounts = Vec::new();
    for mount in c["volumeMounts"].as_array().unwrap() {
        let name = mount["name"].as_str().unwrap();
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volumeMount {name} has no volume"));
        let source = if let Some(cm) = volume.get("configMap") {
            let cm_name = cm["name"].as_str().unwrap();
            let object = objects
                .iter()
                .find(|o| {
                    o["kind"] == "ConfigMap"
                        && o["metadata"]["name"] == cm_name
                        && o["metadata"]["namespace"] == namespace
                })
                .unwrap_or_else(|| panic!("ConfigMap {cm_name} is not in the install"));
            let mut data: Vec<(String, Vec<u8>)> = object["data"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().as_bytes().to_vec()))
                .collect();
            for (edited, key, content) in &setup.configmap_edits {
                if *edited == cm_name {
                    data.retain(|(k, _)| k != key);
                    data.push((key.to_string(), content.as_bytes().to_vec()));
                }
            }
            let dir = volumes_dir.join("configmaps").join(name);
            let files: Vec<(&str, &[u8])> = data
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            container::atomic_volume(&dir, &files);
            dir
        } else if let Some(host_path) = volume.get("hostPath") {
            let path = setup.host.path(host_path["path"].as_str().unwrap());
            match host_path["type"].as_str() {
                Some("Directory") => assert!(
                    path.is_dir(),
                    "hostPath {} (type Directory) does not exist on the node",
                    path.display()
                ),
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&path).unwrap(),
                other => panic!("hostPath type {other:?} not modelled"),
            }
            path
        } else {
            panic!("volume {volume} of a kind the emulation does not model");
        };
        // A configMap volume is always mounted read-only by the kubelet.
        let read_only = mount["readOnly"] == true || volume.get("configMap").is_some();
        mounts.push(Mount {
            source,
            target: mount["mountPath"].as_str().unwrap().into(),
            read_only,
        });
    }
    // The service-account token, CA and namespace (automountServiceAccountToken).
    let sa_name = spec["serviceAccountName"].as_str().unwrap_or("default");
    let sa = find(objects, "ServiceAccount", sa_name);
    if sa["automountServiceAccountToken"] != false && spec["automountServiceAccountToken"] != false
    {
        let dir = volumes_dir.join("serviceaccount");
        container::atomic_volume(
            &dir,
            &[
                ("token", setup.cluster.on.token.as_bytes()),
                ("ca.crt", setup.cluster.control_plane.ca_pem().as_bytes()),
                ("namespace", namespace.as_bytes()),
            ],
        );
        mounts.push(Mount {
            source: dir,
            target: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            read_only: true,
        });
    }
    // The devices every runtime gives a container.
    for dev in ["null", "zero", "random", "urandom"] {
        mounts.push(Mount {
            source: format!("/dev/{dev}").into(),
            target: format!("/dev/{dev}"),
            read_only: false,
        });
    }
    let env_value = |name: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
    };
    // The NVIDIA container toolkit: for NVIDIA_VISIBLE_DEVICES it mounts the driver's NVML library
    // where the image's loader finds it (and, here, the fake driver's state beside it).
    if env_value("NVIDIA_VISIBLE_DEVICES").is_some_and(|v| v != "void" && v != "none") {
        let scenario = setup
            .nvml_scenario
            .expect("a GPU container needs a (fake) GPU on the node");
        mounts.push(Mount {
            source: common::nvml::fake_nvml().to_path_buf(),
            target: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into(),
            read_only: true,
        });
        mounts.push(Mount {
            source: scenario.to_path_buf(),
            target: "/run/fake-nvml/scenario.json".into(),
            read_only: true,
        });
    }
    if let Some(tree) = setup.neuron_sysfs {
        mounts.push(Mount {
            source: tree.to_path_buf(),
            target: "/sys/devices/virtual/neuron_device".into(),
            read_only: true,
        });
    }
    prepare_mount_points(&rootfs, &mounts);

    // The environment: the image's, the runtime's, the kubelet's service variables, the container's.
    let sc = &c["securityContext"];
    let pod_sc = &spec["securityContext"];
    let uid = sc["runAsUser"]
        .as_u64()
        .or(pod_sc["runAsUser"].as_u64())
        .map_or(image.user.0, |u| u as u32);
    let gid = sc["runAsGroup"]
        .as_u64()
        .or(pod_sc["runAsGroup"].as_u64())
        .map_or(image.user.1, |g| g as u32);
    // The kubelet refuses to start a container whose runAsNonRoot contradicts its UID
    // (pkg/kubelet/kuberuntime/security_context_others.go, verifyRunAsNonRoot).
    let non_root = sc["runAsNonRoot"]
        .as_bool()
        .or(pod_sc["runAsNonRoot"].as_bool())
        .unwrap_or(false);
    assert!(
        !(non_root && uid == 0),
        "CreateContainerConfigError: container's runAsUser breaks non-root policy"
    );
    let home = if uid == 0 { "/root" } else { "/home/nonroot" };
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        (
            "SSL_CERT_FILE".into(),
            "/etc/ssl/certs/ca-certificates.crt".into(),
        ),
        ("HOSTNAME".into(), setup.cluster.on.pod.clone()),
        ("HOME".into(), home.into()),
    ];
    let port = setup.cluster.control_plane.port();
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
        ("KUBERNETES_SERVICE_PORT", port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
        ("KUBERNETES_PORT", format!("tcp://127.0.0.1:{port}")),
        ("KUBERNETES_PORT_443_TCP", format!("tcp://127.0.0.1:{port}")),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".into()),
        ("KUBERNETES_PORT_443_TCP_PORT", port.to_string()),
        ("KUBERNETES_PORT_443_TCP_ADDR", "127.0.0.1".into()),
    ] {
        env.push((k.into(), v));
    }
    assert_eq!(
        spec["enableServiceLinks"], false,
        "service links would add variables for every Service in the namespace"
    );
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = match (
            e.get("value"),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.as_str().unwrap().to_string(),
            (None, Some("spec.nodeName")) => setup.cluster.on.node.clone(),
            (None, Some("metadata.name")) => setup.cluster.on.pod.clone(),
            (None, Some("metadata.namespace")) => namespace.into(),
            other => panic!("env {name}: {other:?} not modelled"),
        };
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    }
    let mut argv = match c["command"].as_array() {
        Some(command) => command
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect(),
        None => image.entrypoint.clone(),
    };
    match c["args"].as_array() {
        Some(args) => argv.extend(args.iter().map(|a| a.as_str().unwrap().to_string())),
        None if c["command"].is_null() => argv.extend(image.cmd.iter().cloned()),
        None => {}
    }
    let caps = &sc["capabilities"];
    assert_eq!(
        caps["drop"],
        json!(["ALL"]),
        "the emulation drops every capability"
    );
    assert!(
        caps["add"].as_array().is_none_or(|a| a.is_empty()),
        "the emulation adds no capability"
    );
    ContainerSpec {
        rootfs,
        read_only_root: sc["readOnlyRootFilesystem"] == true,
        mounts,
        uid,
        gid,
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
        env,
        argv,
    }
}

/// Mount points the runtime creates: in the image, or inside the volume a nested mount lands in.
fn prepare_mount_points(rootfs: &Path, mounts: &[Mount]) {
    for (i, mount) in mounts.iter().enumerate() {
        let outer = mounts[..i]
            .iter()
            .filter(|m| mount.target.starts_with(&format!("{}/", m.target)))
            .max_by_key(|m| m.target.len());
        let point = match outer {
            Some(outer) => outer.source.join(&mount.target[outer.target.len() + 1..]),
            None => rootfs.join(mount.target.trim_start_matches('/')),
        };
        if mount.source.is_dir() {
            std::fs::create_dir_all(&point).unwrap();
        } else {
            std::fs::create_dir_all(point.parent().unwrap()).unwrap();
            if !point.exists() {
                std::fs::write(&point, b"").unwrap();
            }
        }
    }
}

/// A vLLM pod serving the base config's model from the node's model directory, with the model's
/// readiness gate, mounting the directory read-only or not.
fn gated_vllm_pod(uid: &str, name: &str, node: &str, read_only: bool) -> Value {
    let annotations = json!({"mlnode.dev/model": "llama-3.1-8b"});
    let mut pod = common::pods::gated_vllm_pod(uid, name, node, "/var/lib/models", annotations);
    pod["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(read_only);
    pod
}

struct Running {
    child: std::process::Child,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(self.log.with_extension("stderr")).unwrap_or_default()
    }

    fn metrics(&self) -> Option<String> {
        match http_get(9400, "/metrics") {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    }

    /// Waits for `check` to hold; panics with the agent's log after `limit`.
    fn wait(&mut self, what: &str, limit: Duration, check: impl Fn(&Running) -> bool) {
        let started = Instant::now();
        while !check(self) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{what}: the agent exited ({status})\n{}", self.log());
            }
            assert!(
                started.elapsed() < limit,
                "{what}: not within {limit:?}\nagent log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(spec: &ContainerSpec, dir: &Path) -> Running {
    if std::net::TcpListener::bind("0.0.0.0:9400").is_err() {
        panic!("port 9400 is taken by another process: the agent's ConfigMap listens there");
    }
    let log = dir.join("agent.log");
    let running = Running {
        child: container::start(spec, &log),
        log,
    };
    // The process is confined as the manifest says, or the run proves nothing.
    let proc = PathBuf::from(format!("/proc/{}", running.child.id()));
    let status = std::fs::read_to_string(proc.join("status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(field("Uid")[1], spec.uid.to_string(), "{status}");
    assert_eq!(field("Gid")[1], spec.gid.to_string(), "{status}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(set)[0], "0000000000000000", "{set}: {status}");
    }
    assert_eq!(
        field("NoNewPrivs")[0],
        if spec.no_new_privs { "1" } else { "0" }
    );
    assert_eq!(
        std::fs::read_link(proc.join("root")).unwrap(),
        spec.rootfs,
        "chrooted into the image"
    );
    running
}

/// The model the user keeps on the node, and the native manifest README step 2 has them put in
/// the manifests ConfigMap (the shipped config.yaml is used as is).
fn user_model(host: &Host) -> String {
    let root = host.path("/var/lib/models/llama-3.1-8b");
    let model = common::PlainModel::new();
    std::fs::create_dir_all(&root).unwrap();
    for (path, bytes) in &model.files {
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, bytes).unwrap();
    }
    model.manifest_json("0e9e39f249a16976918f6564b8830bc894c89659", true)
}

fn h100(i: usize) -> Value {
    json!({"uuid": format!("GPU-{i}a8c7e3b-1d2f-4e5a-9b6c-7d8e9f0a1b2c"), "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": format!("00000000:{:02X}:00.0", 0x18 + i * 0x10),
        "memory": {"total": 85520809984u64, "used": 70000000000u64, "free": 15000000000u64, "reserved": 520809984u64},
        "clocks_event_reasons": 0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 51, "power_mw": 512000,
        "utilization": {"gpu": 93, "memory": 61}, "energy_mj": 987654321u64, "xid_events": [], "lost": false, "unsupported": []})
}

fn kubelet_conditions(node: &Value) -> Vec<Value> {
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            !["ModelCacheVerified", "AcceleratorHealthy"].contains(&c["type"].as_str().unwrap())
        })
        .cloned()
        .collect()
}

/// A GPU node with two H100s, the vLLM pod holding GPU 1, and the agent started from the GPU
/// overlay with `components`.
struct GpuNode {
    cluster: ClusterNode,
    agent: Running,
    /// The Node as registered, before the agent started.
    node: Value,
    vllm_gpu: String,
    _kubelet: FakeKubelet,
    _dirs: (Host, tempfile::TempDir),
}

fn gpu_node_with(components: &[&str], uid: u32) -> Result<GpuNode, String> {
    gpu_node_from(kustomize::render_with("overlays/gpu", components)?, uid)
}

/// The objects the Helm chart renders with `values` that a `kind` node (gpu, neuron) runs: all
/// but the other kind's DaemonSet, whose affinity keeps it off this node.
fn charted_for(kind: &str, values: &str) -> Result<Vec<Value>, String> {
    let objects = common::helm::render(values)?
        .unwrap_or_else(|refused| panic!("helm template refused {values:?}: {refused}"));
    let ours = format!("mlnode-agent-{kind}");
    Ok(objects
        .into_iter()
        .filter(|o| o["kind"] != "DaemonSet" || o["metadata"]["name"] == ours.as_str())
        .collect())
}

fn gpu_node_from(objects: Vec<Value>, uid: u32) -> Result<GpuNode, String> {
    gpu_node_prepared(objects, uid, |_| Ok(()))
}

/// [`gpu_node_from`], with `prepare` putting more on the node before the agent starts.
fn gpu_node_prepared(
    objects: Vec<Value>,
    uid: u32,
    prepare: impl FnOnce(&Host) -> Result<(), String>,
) -> Result<GpuNode, String> {
    container::supported()?;
    let host = Host::new();
    prepare(&host)?;
    let manifest = user_model(&host);
    let control_plane = control_plane::shared()?;
    let name = control_plane.unique("ip-10-0-1-23.us-east-2.compute.internal");
    let labels =
        json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}});
    let cluster = ClusterNode::start(
        control_plane,
        &objects,
        control_plane::node(&name, labels),
        gpu_taints(),
    );
    let node = cluster.node();
    for (pod, read_only) in [("vllm-gated", true), ("vllm-writable", false)] {
        cluster.put_pod(&gated_vllm_pod("", pod, &name, read_only));
    }
    // The kubelet's socket sits where the pod-resources hostPath volume points.
    let socket_dir = host.path("/var/lib/kubelet/pod-resources");
    std::fs::create_dir_all(&socket_dir).unwrap();
    let gpus = [h100(0), h100(1)];
    let vllm_gpu = gpus[1]["uuid"].as_str().unwrap().to_string();
    // GPU 1 through the device plugin; GPU 0 claimed through NVIDIA's DRA driver, whose slice
    // names it.
    let mut pods = response(&[("vllm-0", "nvidia.com/gpu", &[vllm_gpu.as_str()])]);
    pods.pod_resources
        .push(common::kubelet::dra_claim("dra-0", &name, &["gpu-0"]));
    let kubelet = FakeKubelet::serve_in(&socket_dir, pods);
    let mut slice = common::cluster_node::nvidia_resource_slice(&name);
    slice["spec"]["devices"][0]["attributes"]["uuid"]["string"] = gpus[0]["uuid"].clone();
    cluster.put_resource_slice(slice);
    let scenario = host.root.path().join("nvml-scenario.json");
    std::fs::write(
        &scenario,
        json!({"driver_version": "580.95.05", "devices": gpus}).to_string(),
    )
    .unwrap();
    let volumes = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let setup = NodeSetup {
        host: &host,
        cluster: &cluster,
        nvml_scenario: Some(&scenario),
        neuron_sysfs: None,
        configmap_edits: readme_model(&cluster.on.install.objects, manifest),
    };
    let spec = as_kubelet_would(&cluster.on.install.objects, &setup, volumes.path());
    assert_eq!(
        spec.uid, uid,
        "docs/security.md: the UID each variant runs as"
    );
    let agent = run(&spec, volumes.path());
    Ok(GpuNode {
        cluster,
        agent,
        node,
        vllm_gpu,
        _kubelet: kubelet,
        _dirs: (host, volumes),
    })
}

/// The GPU overlay with the startup taint and the model labels, as the kubelet would start it.
#[test]
fn the_gpu_overlay_with_the_startup_taint_runs_as_deployed() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    runs_as_deployed_with_the_startup_taint(common::needs!(gpu_node_with(
        &["components/startup-taint", "components/model-labels"],
        0
    )));
}

/// The chart's GPU DaemonSet with `startupTaint.enabled` and `modelLabels.enabled`: the same run
/// as the overlay's, on the chart's own RBAC, admission policy and ConfigMaps.
#[test]
fn the_charts_gpu_daemonset_with_the_startup_taint_runs_as_deployed() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let objects = common::needs!(charted_for(
        "gpu",
        "startupTaint: {enabled: true}\nmodelLabels: {enabled: true}"
    ));
    runs_as_deployed_with_the_startup_taint(common::needs!(gpu_node_from(objects, 0)));
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

/// components/kernel-log as deployed: the host's journal holds, from before the agent started, an
/// XID only the kernel log can show now (NVML's events were not registered then); the agent, UID 0
/// with no capability and the journal mounted read-only, holds the node on it at start.
#[test]
fn the_kernel_log_component_holds_the_node_on_an_xid_from_before_the_start() {
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let objects = common::needs!(kustomize::render_with(
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
    let slot = common::journal::driver_slot(gpu["pci_bus_id"].as_str().unwrap());
    let line = format!("NVRM: Xid (PCI:{slot}): 119, pid=2211, name=vllm, Timeout after 6s of waiting for RPC response from GPU1 GSP!");
    let GpuNode {
        cluster,
        mut agent,
        _kubelet,
        _dirs,
        ..
    } = common::needs!(gpu_node_prepared(objects, 0, |host| {
        std::fs::create_dir_all(host.path("/run/log/journal")).unwrap();
        let dir = host.path("/var/log/journal/4f1c2d3e4b5a69788796a5b4c3d2e1f0");
        common::journal::write(
            &dir,
            "system.journal",
            &[common::journal::kernel(&line, 120)],
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
    let objects = common::needs!(kustomize::render_with(
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
    } = common::needs!(gpu_node_prepared(objects, 0, |_| Ok(())));
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

/// What the rendered RBAC allows the agent's token but its admission policies refuse: the status
/// of another node's pod, and a condition type not its own.
fn refused_pod_writes(cluster: &ClusterNode) {
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
    } = common::needs!(gpu_node_with(&["components/non-root"], 65532));
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

#[test]
fn the_neuron_overlay_runs_as_deployed_and_requires_the_driver() {
    let objects = common::needs!(kustomize::render_with("overlays/neuron", &[]));
    neuron_runs_as_deployed(objects);
}

/// The chart's Neuron DaemonSet, as the kubelet would start it on an Inf2 node: the same run as
/// the overlay's, on the chart's RBAC, admission policy and ConfigMaps.
#[test]
fn the_charts_neuron_daemonset_runs_as_deployed_and_requires_the_driver() {
    neuron_runs_as_deployed(common::needs!(charted_for("neuron", "")));
}

fn neuron_runs_as_deployed(objects: Vec<Value>) {
    common::needs!(container::supported());
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let control_plane = common::needs!(control_plane::shared());
    let labels = json!({"metadata": {"labels": {
        "node.kubernetes.io/instance-type": "inf2.48xlarge", "topology.kubernetes.io/zone": "us-east-2a"}}});
    let taints =
        json!([{"key": "aws.amazon.com/neuron", "value": "present", "effect": "NoSchedule"}]);
    let tree = common::neuron::NeuronTree::new(common::neuron::INF2_48XLARGE);
    for (driver, expected) in [(Some(tree.root()), "True"), (None, "False")] {
        let host = Host::new();
        let manifest = user_model(&host);
        std::fs::create_dir_all(host.path("/var/lib/kubelet/pod-resources")).unwrap();
        let name = control_plane.unique("ip-10-0-2-40.us-east-2.compute.internal");
        let node = control_plane::node(&name, labels.clone());
        let cluster = ClusterNode::start(control_plane, &objects, node, taints.clone());
        let volumes = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let setup = NodeSetup {
            host: &host,
            cluster: &cluster,
            nvml_scenario: None,
            neuron_sysfs: driver,
            configmap_edits: readme_model(&cluster.on.install.objects, manifest),
        };
        let spec = as_kubelet_would(&cluster.on.install.objects, &setup, volumes.path());
        let mut agent = run(&spec, volumes.path());
        agent.wait(
            "AcceleratorHealthy written",
            Duration::from_secs(60),
            |_| cluster.condition("AcceleratorHealthy")["status"] == expected,
        );
        let metrics = agent.metrics().unwrap();
        let up = |c: &str| sample(&metrics, "mlnode_collector_up", &[("collector", c)]);
        // MLNODE_NVML__ENABLED=false and MLNODE_NEURON__ENABLED=true took effect.
        assert_eq!(up("nvml"), Some(0.0));
        assert!(
            agent.log().contains("nvml.enabled: false"),
            "{}",
            agent.log()
        );
        let healthy = cluster.condition("AcceleratorHealthy");
        match driver {
            Some(_) => {
                assert_eq!(up("neuron"), Some(1.0), "{}", agent.log());
                // The EC2 type and zone come from the Node's labels through the API server; the
                // driver's chip family is neuron_family.
                agent.wait(
                    "instance_type from the Node",
                    Duration::from_secs(30),
                    |a| {
                        a.metrics().is_some_and(|m| {
                            sample(
                                &m,
                                "mlnode_neuron_device_info",
                                &[
                                    ("instance_type", "inf2.48xlarge"),
                                    ("availability_zone", "us-east-2a"),
                                    ("neuron_family", "Inf2"),
                                ],
                            )
                            .is_some()
                        })
                    },
                );
                assert!(
                    healthy["message"]
                        .as_str()
                        .unwrap()
                        .contains("12 Neuron device(s)"),
                    "{healthy}"
                );
            }
            None => {
                // A Neuron node without a driver is not a healthy accelerator node.
                assert_eq!(up("neuron"), Some(0.0));
                assert_eq!(healthy["reason"], "CollectorUnavailable", "{healthy}");
            }
        }
        assert_eq!(
            cluster.node()["spec"]["taints"],
            taints,
            "no startup taint component: taints untouched"
        );
        let refused = control_plane::refused_requests(&agent.metrics().unwrap());
        assert_eq!(refused, Vec::<String>::new(), "{}", agent.log());
    }
}

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
    let objects = common::needs!(kustomize::render_with(
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
    } = common::needs!(gpu_node_with(&[], 0));
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
        common::prometheus::serve_vllm_fixture()
    );
    let prometheus =
        common::prometheus::start_with_scrape_configs(&format!("{shipped}{without}{vllm}"));
    let join = |job: &str| {
        format!("mlnode_gpu_utilization_ratio{{job=\"{job}\"}} * on(namespace, pod) group_left(model_name) vllm:num_requests_running")
    };
    let rows = common::prometheus::wait_query(prometheus.port, &join("mlnode-system/mlnode-agent"));
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["metric"]["UUID"], vllm_gpu.as_str());
    assert_eq!(rows[0]["metric"]["model_name"], "tiny-model");
    // The agent's own series keep the agent's pod: honorLabels only lets scraped labels win.
    let own = common::prometheus::wait_query(
        prometheus.port,
        "mlnode_build_info{job=\"mlnode-system/mlnode-agent\"}",
    );
    assert_eq!(own[0]["metric"]["pod"], pod);
    // Without honorLabels the owner's labels are renamed and the join is empty.
    common::prometheus::wait_query(prometheus.port, "mlnode_gpu_utilization_ratio{job=\"mlnode-system/without-honor-labels\", exported_pod=\"vllm-0\"}");
    let none =
        common::prometheus::query_raw(prometheus.port, &join("mlnode-system/without-honor-labels"))
            .unwrap();
    assert_eq!(none, json!([]), "{none}");
}
