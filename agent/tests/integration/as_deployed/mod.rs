//! The agent as the shipped manifests deploy it, not as a test would like to start it. Each overlay
//! is rendered by real kustomize (its Pod Security admission is cluster_install.rs's, on a real
//! kube-apiserver); the container is started the way the kubelet and
//! containerd start it (testbed::node::emulated_container): the image built as the Dockerfile builds it, every
//! ConfigMap and hostPath at its mountPath, the service-account token and CA where a pod finds
//! them, the container's env (fieldRefs filled in) and args, its UID, no capabilities, a read-only
//! root. It talks TLS to a real kube-apiserver (testbed::cluster::control_plane) with the rendered RBAC and
//! ValidatingAdmissionPolicies installed, as its own pod bound to its node, with the token
//! TokenRequest gives that pod, and reads a fake kubelet pod-resources socket at the mounted host
//! path. Whatever the manifests get wrong (a dropped setting, a missing permission, a
//! socket the UID cannot open) fails here.

mod components;
mod gpu_node;
mod neuron_node;
mod pod_monitor;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{http_get, sample};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::control_plane::{self, gpu_taints};
use testbed::node::emulated_container::{self, ContainerSpec, Image, Mount};
use testbed::node::pod_resources::{response, FakeKubelet};
use testbed::renderers::kustomize::{self, find};

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
    let gpu = testbed::needs!(kustomize::render_with("overlays/gpu", &[]));
    let neuron = testbed::needs!(kustomize::render_with("overlays/neuron", &[]));
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
    cluster: &'a ApiOnlyNode,
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
            emulated_container::atomic_volume(&dir, &files);
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
        emulated_container::atomic_volume(
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
            source: testbed::devices::fake_nvml::fake_nvml().to_path_buf(),
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
    let mut pod =
        testbed::cluster::pods::gated_vllm_pod(uid, name, node, "/var/lib/models", annotations);
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
        child: emulated_container::start(spec, &log),
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
    let model = testbed::models::PlainModel::new();
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
    cluster: ApiOnlyNode,
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
    let objects = testbed::renderers::helm::render(values)?
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
    emulated_container::supported()?;
    let host = Host::new();
    prepare(&host)?;
    let manifest = user_model(&host);
    let control_plane = control_plane::shared()?;
    let name = control_plane.unique("ip-10-0-1-23.us-east-2.compute.internal");
    let labels =
        json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}});
    let cluster = ApiOnlyNode::start(
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
        .push(testbed::node::pod_resources::dra_claim(
            "dra-0",
            &name,
            &["gpu-0"],
        ));
    let kubelet = FakeKubelet::serve_in(&socket_dir, pods);
    let mut slice = testbed::cluster::api_only_node::nvidia_resource_slice(&name);
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
