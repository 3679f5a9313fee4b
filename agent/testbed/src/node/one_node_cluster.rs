//! A cluster of one real node for the tests: a control plane of its own (etcd and kube-apiserver,
//! crate::cluster::private_control_plane, with an audit log), kube-controller-manager and kube-scheduler beside
//! it on the machine's loopback, and the node in namespaces of its own (crate::node::runtime::Runtime):
//! containerd with its CRI, runc, the CNI bridge and the kubelet, every Kubernetes program from
//! the control plane's one build (tests/programs/control-plane's subcommands, v1.36.3).
//!
//! The controllers act on every object of their server, which is why this cluster has a server of
//! its own: on the shared one they would make pods for the DaemonSets other tests install on nodes
//! no kubelet runs, and taint those nodes unreachable.
//!
//! The kubelet authenticates as `system:node:mlnode-test-node` with a client certificate in
//! `system:nodes` signed by the cluster's CA, so the Node authorizer and NodeRestriction judge it;
//! its own endpoint authenticates and authorizes every request through the server (webhook). It
//! reaches the server at 127.0.0.1:6443 inside its namespace, through two forwarders that join
//! the namespace's loopback and the machine's by a unix socket in the node's folder.
//!
//! One cluster per test run, started by the first test that asks and shared: each test works in
//! namespaces of its own. It stops with the test process (every program is spawned for the run:
//! crate::cluster::control_plane::spawn_for_the_run), and the next run removes what it left on disk and
//! in the cgroup hierarchies.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::control_plane::{self, log_tail, spawn_for_the_run, ControlPlane};
use crate::cluster::private_control_plane::PrivateControlPlane;
use crate::node::resident::{Exclusive, ResidentLock, Sharing};
use crate::node::runtime::Runtime;

/// The node's name, as the kubelet registers it and its certificate names it.
pub const NODE: &str = "mlnode-test-node";

/// Where the kubelet and the node's pods reach the API server, inside the node's namespace.
const APISERVER_IN_NODE: &str = "127.0.0.1:6443";

/// The kubelet registers and reports Ready seconds after it starts; a cold one on a loaded 2-core
/// machine takes longer.
const READY_LIMIT: Duration = Duration::from_secs(120);

/// Every request's metadata, once it is answered: who asked what, for the tests that count.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// The one-node cluster held by one test.
pub type NodeWide<'a> = Exclusive<'a, OneNodeCluster>;

/// The one-node cluster: its control plane, its node and what the node must leave as it was.
pub struct OneNodeCluster {
    /// The cluster's admin, on the machine's loopback.
    pub admin: ControlPlane,
    pub runtime: Runtime,
    control_plane: PrivateControlPlane,
    /// The forwarders to the server (one on each side), kube-controller-manager and
    /// kube-scheduler.
    programs: Vec<Child>,
    /// The links of their own [`OneNodeCluster::registry_at`] made.
    links: Mutex<Vec<Child>>,
    kubelet: Mutex<Option<Child>>,
    /// Held exclusively by a test that changes the node for every pod (its taints, the agent
    /// installed on it), shared by tests that only run pods on it; it holds what a test left
    /// installed for the tests after it.
    node_wide: ResidentLock<OneNodeCluster>,
    /// The agent's image, pushed once: its reference by digest.
    agent_image: OnceLock<String>,
    /// What the node must leave as it was on the machine, read before it started.
    machine_before: MachineState,
}

static SHARED: OnceLock<OneNodeCluster> = OnceLock::new();

/// The run's one-node cluster, started on first use; Err when its programs are not built (see
/// `needs!`). A component that does not start fails the test, naming it, with its log's tail.
pub fn shared() -> Result<&'static OneNodeCluster, String> {
    let binary = control_plane::binary()?;
    crate::node::runtime::programs()?;
    Ok(SHARED.get_or_init(|| OneNodeCluster::start(&binary)))
}

impl OneNodeCluster {
    fn start(binary: &Path) -> OneNodeCluster {
        let started = Instant::now();
        let machine_before = MachineState::read();
        let runtime = Runtime::start_for_kubelet().expect("the node's programs are built");
        let runtime_up = started.elapsed();
        let dir = runtime.dir().to_path_buf();
        let (control_plane, admin) =
            PrivateControlPlane::start(&dir.join("control-plane"), AUDIT_POLICY, &[])
                .expect("the control plane is built");
        let control_plane_up = started.elapsed();
        let state = control_plane.state();
        let port = admin.server().rsplit(':').next().unwrap().to_string();
        let socket = dir.join("apiserver.sock");
        // The controllers' and the scheduler's client and serving flags: the admin's kubeconfig,
        // one instance each, no serving port.
        let kubeconfig = format!("--kubeconfig={}", admin.kubeconfig().display());
        let alone = [
            kubeconfig.as_str(),
            "--leader-elect=false",
            "--secure-port=0",
        ];
        let mut programs = vec![
            beside(
                binary,
                &[
                    "--forward",
                    &format!("unix:{}=tcp:127.0.0.1:{port}", socket.display()),
                ],
                &dir.join("forwarder.log"),
            ),
            beside(
                binary,
                &[
                    &["kube-controller-manager"][..],
                    &alone,
                    &[
                        // Each controller with a service account of its own, as kubeadm runs it.
                        "--use-service-account-credentials=true",
                        &format!(
                            "--service-account-private-key-file={}",
                            state.join("pki/service-account.key").display()
                        ),
                        // kube-root-ca.crt in every namespace, which projected tokens mount.
                        &format!("--root-ca-file={}", state.join("pki/ca.crt").display()),
                        // A silent kubelet is Unknown after 8 s rather than 50: its lease is renewed
                        // every second (nodeLeaseDurationSeconds 4).
                        "--node-monitor-grace-period=8s",
                        "--node-monitor-period=1s",
                    ],
                ]
                .concat(),
                &dir.join("controller-manager.log"),
            ),
            beside(
                binary,
                &[&["kube-scheduler"][..], &alone].concat(),
                &dir.join("scheduler.log"),
            ),
        ];
        let binary_path = binary.display().to_string();
        // The kubelet at 127.0.0.1:6443, the pods' in-cluster clients at the `kubernetes`
        // Service's address; containerd's pulls through the registry's rate-held link.
        let to_server = format!("unix:{}", socket.display());
        let rate = format!("--rate={}", crate::node::runtime::REGISTRY_RATE);
        for (listen, to, rate, log) in [
            (
                APISERVER_IN_NODE.to_string(),
                to_server.as_str(),
                None,
                "apiserver-forwarder.log",
            ),
            (
                format!("{}:443", crate::node::runtime::KUBERNETES_SERVICE_IP),
                to_server.as_str(),
                None,
                "service-forwarder.log",
            ),
            (
                crate::node::runtime::REGISTRY_LINK.to_string(),
                &format!("tcp:{}", crate::node::runtime::REGISTRY),
                Some(rate.as_str()),
                "registry-link.log",
            ),
        ] {
            let forward = format!("tcp:{listen}={to}");
            let mut command = vec![binary_path.as_str(), "--forward", &forward];
            command.extend(rate);
            programs.push(runtime.spawn_inside(&command, log));
        }
        let credentials = dir.join("kubelet");
        let output = Command::new(binary)
            .arg("--dir")
            .arg(&state)
            .args([
                "--node-credentials",
                NODE,
                "--server",
                &format!("https://{APISERVER_IN_NODE}"),
                "--out",
            ])
            .arg(&credentials)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "the node's credentials: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let pause = runtime.programs().join("pause");
        runtime.push_image(crate::node::runtime::PAUSE_IMAGE, &[&pause], "/pause");
        runtime.make_cgroup_root();
        std::fs::write(
            credentials.join("config.json"),
            kubelet_config(&runtime, &credentials).to_string(),
        )
        .unwrap();
        let cluster = OneNodeCluster {
            admin,
            runtime,
            control_plane,
            programs,
            links: Mutex::new(Vec::new()),
            kubelet: Mutex::new(None),
            node_wide: ResidentLock::default(),
            agent_image: OnceLock::new(),
            machine_before,
        };
        let kubelet_started = started.elapsed();
        cluster.start_kubelet();
        cluster.await_node_ready();
        eprintln!(
            "the one-node cluster is ready after {:.1} s: containerd and the registry up at {:.1} s, \
             the control plane at {:.1} s, the kubelet started at {:.1} s",
            started.elapsed().as_secs_f64(),
            runtime_up.as_secs_f64(),
            control_plane_up.as_secs_f64(),
            kubelet_started.as_secs_f64(),
        );
        cluster
    }

    /// The registry under another name (one of [`crate::node::runtime::OTHER_LINKS`], in turn),
    /// where a link of its own held to `rate` bytes a second listens: an image pushed as
    /// `<REGISTRY>/name:tag` is pulled as `<that name>/name:tag` at that rate, by containerd and
    /// by the SOCI snapshotter. containerd reads its hosts folder at each pull, so the name works
    /// at once.
    pub fn registry_at(&self, rate: u64) -> String {
        let mut links = self.links.lock().unwrap();
        let n = links.len();
        let name = *crate::node::runtime::OTHER_LINKS
            .get(n)
            .unwrap_or_else(|| panic!("the node has {n} links of their own already"));
        let hosts = self.runtime.dir().join("registry-hosts").join(name);
        std::fs::create_dir_all(&hosts).unwrap();
        std::fs::write(
            hosts.join("hosts.toml"),
            format!("server = \"http://{name}\"\n"),
        )
        .unwrap();
        let binary = control_plane::binary().unwrap();
        let log = format!("registry-link-{n}.log");
        links.push(self.runtime.spawn_inside(
            &[
                binary.to_str().unwrap(),
                "--forward",
                &format!("tcp:{name}=tcp:{}", crate::node::runtime::REGISTRY),
                &format!("--rate={rate}"),
            ],
            &log,
        ));
        self.runtime.await_up(
            &format!("the registry's link at {name}"),
            &log,
            &["curl", "-sf", &format!("http://{name}/v2/")],
        );
        name.to_string()
    }

    /// The kubelet started (again) on the same folder, credentials and configuration.
    pub fn start_kubelet(&self) {
        let mut kubelet = self.kubelet.lock().unwrap();
        assert!(kubelet.is_none(), "the kubelet is running");
        let credentials = self.runtime.dir().join("kubelet");
        let binary = control_plane::binary().unwrap();
        *kubelet = Some(self.runtime.spawn_inside(
            &[
                binary.to_str().unwrap(),
                "kubelet",
                &format!("--config={}", credentials.join("config.json").display()),
                &format!(
                    "--kubeconfig={}",
                    credentials.join("kubelet.kubeconfig").display()
                ),
                &format!("--hostname-override={NODE}"),
                &format!("--node-ip={}", crate::node::runtime::NODE_IP),
                // Its pod startup latency tracker's lines ("Observed pod startup duration").
                "--v=2",
            ],
            "kubelet.log",
        ));
    }

    /// The kubelet killed, as a crash or an OOM kill ends it: its pods' containers run on.
    pub fn stop_kubelet(&self) {
        let mut kubelet = self.kubelet.lock().unwrap();
        let mut nsenter = kubelet.take().expect("the kubelet is not running");
        // nsenter forked the kubelet into the node's PID namespace: it is nsenter's only child.
        let kill = self
            .runtime
            .inside(&["pkill", "-KILL", "-f", "control-plane kubelet"]);
        assert!(kill.status.success(), "pkill the kubelet: {kill:?}");
        let _ = nsenter.wait();
    }

    /// Waits for the node's Ready condition to be True; fails with the node's components' logs.
    pub fn await_node_ready(&self) {
        crate::wait_until(&format!("node {NODE} Ready"), READY_LIMIT, || {
            match self.node_condition("Ready") {
                Some(ready) if ready["status"] == "True" => Ok(()),
                ready => Err(format!("Ready: {ready:?}\n{}", self.logs())),
            }
        })
    }

    /// The Node object, as the admin reads it; None before the kubelet registered it.
    pub fn node(&self) -> Option<Value> {
        let output = self.admin.kubectl(&["get", "node", NODE, "-o", "json"], "");
        output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).unwrap())
    }

    /// The node's condition of `kind`, if the node and it exist.
    pub fn node_condition(&self, kind: &str) -> Option<Value> {
        self.node()?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
    }

    /// The tail of each component's log, for a failure message.
    pub fn logs(&self) -> String {
        let dir = self.runtime.dir();
        [
            "kubelet.log",
            "containerd.log",
            "apiserver-forwarder.log",
            "service-forwarder.log",
            "registry-link.log",
            "namespace.log",
            "forwarder.log",
            "controller-manager.log",
            "scheduler.log",
        ]
        .iter()
        .map(|log| format!("--- {log}:\n{}", log_tail(&dir.join(log), 15)))
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// The TCP sockets the cluster's programs on the machine (etcd, kube-apiserver, the
    /// controller manager, the scheduler, the forwarders) listen on, in the machine's network
    /// namespace, from the kernel's tables (`/proc/net/tcp`, `tcp6`): each local address and
    /// port, and whether it is loopback. The node's own programs listen in its namespace.
    pub fn machine_listeners(&self) -> Vec<(String, bool)> {
        let mut pids = vec![
            self.control_plane.etcd_pid(),
            self.control_plane.apiserver_pid(),
        ];
        pids.extend(self.programs.iter().map(Child::id));
        let sockets: std::collections::HashSet<String> = pids
            .iter()
            .flat_map(|pid| {
                std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter_map(|link| {
                let link = link.to_string_lossy().into_owned();
                Some(
                    link.strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .to_string(),
                )
            })
            .collect();
        // Loopback as the kernel writes it: 127.0.0.0/8 little-endian, ::1 as four
        // little-endian words.
        let loopback = |address: &str| {
            address.len() == 8 && address.ends_with("7F")
                || address == "00000000000000000000000001000000"
        };
        ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .flat_map(|table| {
                std::fs::read_to_string(table)
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
                (*state == "0A" && sockets.contains(*inode)).then(|| {
                    let address = local.split(':').next().unwrap_or_default();
                    (local.to_string(), loopback(address))
                })
            })
            .collect()
    }

    /// What the node must leave as it was on the machine, as read before it started.
    pub fn machine_before(&self) -> &MachineState {
        &self.machine_before
    }

    /// The node labelled as GPU Feature Discovery labels a GPU node: where the gpu overlay's and
    /// the chart's GPU DaemonSet run.
    pub fn label_as_gpu_node(&self) {
        self.admin.admin(
            &[
                "label",
                "node",
                NODE,
                "nvidia.com/gpu.present=true",
                "--overwrite",
            ],
            "",
        );
    }

    /// For a test that changes the node for every pod: no other test's pods meanwhile, and
    /// nothing another test left installed (see [`ResidentLock`]).
    pub fn exclusive(&self) -> NodeWide<'_> {
        self.node_wide.exclusive(self)
    }

    /// The node exclusively, with `name` installed: as an earlier test left it, else installed
    /// now (see [`Exclusive::install`]).
    pub fn exclusive_with<T: Any + Send + Sync>(
        &self,
        name: &'static str,
        install: impl FnOnce(&Self) -> T,
        remove: impl FnOnce(&Self) + Send + Sync + 'static,
    ) -> NodeWide<'_> {
        self.node_wide.exclusive_with(self, name, install, remove)
    }

    /// For a test that runs pods on the node as it is.
    pub fn sharing(&self) -> Sharing<'_, OneNodeCluster> {
        self.node_wide.sharing()
    }

    /// The agent's image in the node's registry, as the Dockerfile's final stage lays it out
    /// (crate::node::emulated_container::Image: the binary, distroless/cc's glibc and loader from this machine,
    /// the libsystemd stage, its entrypoint, arguments and user), from the tests' build of the
    /// agent with its debug sections stripped; its reference by the registry's digest.
    pub fn agent_image(&self) -> &str {
        self.agent_image.get_or_init(|| {
            let dir = self.runtime.dir().join("agent-image");
            let binary = dir.join("mlnode-agent");
            std::fs::create_dir_all(&dir).unwrap();
            let output = Command::new("objcopy")
                .arg("--strip-debug")
                .arg(assert_cmd::cargo::cargo_bin("mlnode-agent"))
                .arg(&binary)
                .output()
                .unwrap();
            assert!(output.status.success(), "objcopy: {output:?}");
            let dockerfile =
                std::fs::read_to_string(crate::repo_root().join("Dockerfile")).unwrap();
            let image = crate::node::emulated_container::Image::from_dockerfile(&dockerfile);
            let rootfs = dir.join("rootfs");
            image.unpack(&rootfs, &binary);
            let flags: Vec<String> = image
                .entrypoint
                .iter()
                .map(|e| format!("--entrypoint={e}"))
                .chain(image.cmd.iter().map(|c| format!("--cmd={c}")))
                .chain([format!("--user={}:{}", image.user.0, image.user.1)])
                .collect();
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let digest = self
                .runtime
                .push_layer("mlnode-agent:test", &rootfs, &flags);
            format!("{}/mlnode-agent@{digest}", crate::node::runtime::REGISTRY)
        })
    }

    /// Every audit log of the cluster's server so far.
    pub fn audit_logs(&self) -> &[PathBuf] {
        self.control_plane.audit_logs()
    }

    /// A namespace of the cluster's, made for one test, once the service account controller has
    /// given it the `default` ServiceAccount that admission requires of a pod.
    pub fn namespace(&self, prefix: &str) -> String {
        let name = self.admin.unique(prefix);
        self.admin.admin(&["create", "namespace", &name], "");
        crate::wait_until(
            &format!("the default ServiceAccount of namespace {name}"),
            Duration::from_secs(60),
            || {
                let output = self
                    .admin
                    .kubectl(&["get", "serviceaccount", "default", "-n", &name], "");
                output
                    .status
                    .success()
                    .then_some(())
                    .ok_or_else(|| self.logs())
            },
        );
        name
    }
}

fn beside(binary: &Path, args: &[&str], log: &Path) -> Child {
    let output = std::fs::File::create(log).unwrap();
    spawn_for_the_run(
        Command::new(binary)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output),
    )
    .unwrap_or_else(|e| panic!("{} {args:?}: {e}", binary.display()))
}

/// What a node could change on the machine and must not: the kernel settings the kubelet
/// writes, the entries of `/run` (containerd's and runc's state, the pods' network namespaces),
/// the network links (the node's bridge, the pods' veths), and the cgroup hierarchies' top level
/// (the kubelet's `kubepods`).
#[derive(Debug, PartialEq)]
pub struct MachineState {
    pub tunables: Vec<(String, String)>,
    pub run: Vec<String>,
    pub links: Vec<String>,
    pub cgroups: Vec<String>,
}

impl MachineState {
    /// The machine's state now.
    pub fn read() -> MachineState {
        let entries = |dir: &str, only_folders: bool| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| !only_folders || e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let tunables = crate::node::runtime::KERNEL_TUNABLES
            .iter()
            .map(|tunable| {
                let value = std::fs::read_to_string(Path::new("/proc/sys").join(tunable))
                    .unwrap_or_else(|e| format!("unreadable: {e}"));
                (tunable.to_string(), value.trim().to_string())
            })
            .collect();
        let cgroups = entries("/sys/fs/cgroup", true)
            .iter()
            .flat_map(|hierarchy| {
                entries(&format!("/sys/fs/cgroup/{hierarchy}"), true)
                    .into_iter()
                    // The tests' own nodes' roots come and go with them.
                    .filter(|name| !name.starts_with("mlnode-test-node-"))
                    .map(move |name| format!("{hierarchy}/{name}"))
            })
            .collect();
        MachineState {
            tunables,
            run: entries("/run", false),
            links: entries("/sys/class/net", false),
            cgroups,
        }
    }
}

/// The kubelet's configuration (kubelet.config.k8s.io/v1beta1), as a cluster's node has it where
/// this machine allows: cgroup v1 through cgroupfs under the node's own root, webhook
/// authentication and authorization of its endpoint, no read-only port.
fn kubelet_config(runtime: &Runtime, credentials: &Path) -> Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // The machine has cgroup v1 only; 1.36's kubelet refuses it unless told.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": runtime.cgroup_root(),
        "containerRuntimeEndpoint": format!("unix://{}", runtime.socket()),
        "address": crate::node::runtime::NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": credentials.join("ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        // Its lease renewed every second (a quarter of it), for the controller manager's 8 s grace.
        "nodeLeaseDurationSeconds": 4,
        // The machine's disk is shared with everything else on it: evict only when it is all but
        // full, not at the default 10 % and 15 % free.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
    })
}
