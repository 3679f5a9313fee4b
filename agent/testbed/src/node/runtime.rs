//! A node's container runtime, the real one: containerd 2.4 with runc (seccomp on) and the CNCF
//! registry, built from their Go modules (tests/programs/node, pinned by its go.mod and go.sum) by
//! scripts/test.sh, running in a mount, network and PID namespace of their own. The machine's
//! `/run`, `/var/lib`, `/var/log`, kernel settings, links and mounts are left as they were: the
//! namespace gets tmpfs over those folders, copies over the kernel settings the kubelet writes, its
//! own loopback and a bridge (`mlnode0`, the node's address), and every mount made in it (the
//! snapshots' overlays, the containers' roots) goes with it; the registry listens on the
//! namespace's loopback only. Images are made and pushed with crane (go-containerregistry).
//! crate::node::one_node_cluster adds the kubelet and a control plane of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cluster::control_plane::{spawn_for_the_run, spawn_for_the_run_ended_by};

/// Where scripts/test.sh puts the node's programs.
pub fn programs() -> Result<PathBuf, String> {
    let runc = crate::built_program(
        "MLNODE_TEST_NODE_RUNC",
        "node/runc",
        "the node's programs (containerd, runc, the registry, crane: tests/programs/node)",
    )?;
    Ok(runc.parent().unwrap().to_path_buf())
}

/// The registry's address inside the namespace.
pub const REGISTRY: &str = "127.0.0.1:5000";

/// Where the node's containerd pulls the registry's images from: a forwarder that holds the
/// registry's answers to [`REGISTRY_RATE`], as a node's link to its registry holds a pull.
pub const REGISTRY_LINK: &str = "127.0.0.1:5001";

/// The rate of the node's link to its registry, bytes a second.
pub const REGISTRY_RATE: u64 = 32 << 20;

/// The node's address: its bridge's, inside the namespace.
pub const NODE_IP: &str = "10.201.0.1";

/// The `kubernetes` Service's cluster IP (the control plane's `--service-cluster-ip-range`'s
/// first address), where pods' in-cluster clients dial the server: an address of the node's own,
/// with no kube-proxy, where a forwarder listens.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// Folders of the node's filesystem (inside its namespace) and the folders of the node's folder
/// bound there.
pub const NODE_FOLDERS: [(&str, &str); 3] = [
    ("/var/lib/kubelet", "kubelet-root"),
    ("/var/lib/models", "models"),
    ("/var/lib/containerd", "containerd/root"),
];

/// The kernel settings the kubelet sets at start (pkg/kubelet/cm's setupKernelTunables, with
/// `protectKernelDefaults: false`): each covered, in the namespace, by a copy of the machine's
/// value, which the kubelet may write.
pub const KERNEL_TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Every node of this test process gets a number, for its folder and cgroup root.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The node's runtime, started in namespaces of its own; stopped when dropped, or with the test
/// process at the latest.
pub struct Runtime {
    namespace: Child,
    /// The namespaces' first process (unshare's child, the script): the one whose PID namespace
    /// is the node's, as unshare itself stays in the machine's.
    first: u32,
    programs: PathBuf,
    dir: PathBuf,
    /// The node's cgroup root, in each of the machine's cgroup v1 hierarchies (the namespace
    /// shares them): the containers' cgroups are made under it, and it is removed with the node,
    /// or by the next test run where the node's test process ended first.
    cgroup_root: String,
}

impl Runtime {
    /// containerd (its CRI off: containers run through its own API) and the registry started in
    /// namespaces of their own; see [`Runtime::launch`].
    pub fn start() -> Result<Runtime, String> {
        Runtime::launch(false)
    }

    /// containerd with its CRI on, for a kubelet: the CNI plugins on the node's bridge, the
    /// registry's images pulled over plain HTTP, the tests' pause image as the pod sandbox's.
    pub fn start_for_kubelet() -> Result<Runtime, String> {
        Runtime::launch(true)
    }

    /// containerd and the registry in namespaces of their own (mount, network, PID: every process
    /// of the node dies with the namespace's first, and that one with the test process); a
    /// component that does not come up fails the test, naming it, with its log's tail. Err: the
    /// programs are not built.
    fn launch(cri: bool) -> Result<Runtime, String> {
        let programs = programs()?;
        let runs = crate::target_tmpdir();
        remove_stale_nodes(&runs);
        let name = format!(
            "mlnode-test-node-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = runs.join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kernel"))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let at = dir.as_path();
        std::fs::write(
            at.join("registry.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {REGISTRY}\n",
                at.join("registry").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        std::fs::write(
            at.join("containerd.toml"),
            containerd_config(at, &programs, cri),
        )
        .map_err(|e| e.to_string())?;
        if cri {
            write_cni_config(at).map_err(|e| e.to_string())?;
            std::fs::write(at.join("soci.toml"), soci_config()).map_err(|e| e.to_string())?;
        }
        let covers: String = KERNEL_TUNABLES
            .iter()
            .map(|tunable| {
                let copy = at.join("kernel").join(tunable.replace('/', "."));
                format!(
                    "cat /proc/sys/{tunable} >{copy}\nmount --bind {copy} /proc/sys/{tunable}\n",
                    copy = copy.display()
                )
            })
            .collect();
        // The node's own folders where a node has them: the kubelet's (its pod-resources
        // socket where the agent's hostPath points) and the model caches', kept in the node's
        // folder, where the tests write models.
        let node_folders: String = NODE_FOLDERS
            .iter()
            .map(|(path, folder)| {
                let folder = at.join(folder);
                std::fs::create_dir_all(&folder).unwrap();
                format!(
                    "mkdir -p {path}\nmount --bind {} {path}\n",
                    folder.display()
                )
            })
            .collect();
        let script = format!(
            "set -e\nmount -t tmpfs tmpfs /run\nmount -t tmpfs tmpfs /var/lib\nmount -t tmpfs tmpfs /var/log\n{covers}{node_folders}\
             ip link set lo up\nip link add mlnode0 type bridge\nip addr add {NODE_IP}/24 dev mlnode0\n\
             ip addr add {KUBERNETES_SERVICE_IP}/32 dev mlnode0\nip link set mlnode0 up\n\
             registry serve {dir}/registry.yml >{dir}/registry.log 2>&1 &\n{soci}\
             containerd --config {dir}/containerd.toml >{dir}/containerd.log 2>&1 &\nwait\n",
            dir = at.display(),
            // The SOCI snapshotter before containerd, which dials it as a proxy plugin: its
            // socket is there first.
            soci = if cri {
                format!(
                    "soci-snapshotter-grpc --config {dir}/soci.toml --address {SOCI_SOCKET} >{dir}/soci.log 2>&1 &\n\
                     while [ ! -S {SOCI_SOCKET} ]; do sleep 0.05; done\n",
                    dir = at.display()
                )
            } else {
                String::new()
            }
        );
        let mut command = Command::new("unshare");
        command
            .args([
                "--mount",
                "--net",
                "--pid",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                "--kill-child=SIGKILL",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .env("PATH", path_with(&programs))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(at.join("namespace.log")).map_err(|e| e.to_string())?);
        // unshare ignores SIGTERM while its child runs.
        let namespace = spawn_for_the_run_ended_by(&mut command, Signal::SIGKILL)
            .map_err(|e| format!("unshare (the node's namespace): {e}"))?;
        let first = first_child(namespace.id());
        let runtime = Runtime {
            namespace,
            first,
            programs,
            cgroup_root: name,
            dir,
        };
        let socket = runtime.socket();
        if cri {
            runtime.await_up(
                "the SOCI snapshotter",
                "soci.log",
                &["test", "-S", SOCI_SOCKET],
            );
        }
        runtime.await_up(
            "containerd",
            "containerd.log",
            &["ctr", "--address", &socket, "version"],
        );
        runtime.await_up(
            "the registry",
            "registry.log",
            &["crane", "catalog", "--insecure", REGISTRY],
        );
        Ok(runtime)
    }

    /// containerd's socket, which the kubelet and ctr dial.
    pub fn socket(&self) -> String {
        self.dir.join("containerd.sock").display().to_string()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn programs(&self) -> &Path {
        &self.programs
    }

    /// The node's cgroup root, as the kubelet's `cgroupRoot` names it.
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.cgroup_root)
    }

    /// The node's cgroup root made in every hierarchy, as a node's init system would have it
    /// before the kubelet starts (the kubelet refuses a `cgroupRoot` that does not exist).
    pub fn make_cgroup_root(&self) {
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let root = hierarchy.path().join(&self.cgroup_root);
            std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
        }
    }

    /// The cgroup path for a container of the node: under the node's own root.
    pub fn cgroup(&self, container: &str) -> String {
        format!("/{}/{container}", self.cgroup_root)
    }

    /// The node's cgroup root in each hierarchy of the machine, where one exists.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        cgroup_dirs(&self.cgroup_root)
    }

    /// Waits for `probe` to succeed inside the namespace; fails naming `what` with its log's tail.
    pub(crate) fn await_up(&self, what: &str, log: &str, probe: &[&str]) {
        let log = self.dir.join(log);
        crate::wait::wait_until(
            &format!("{what} up in the node's namespace"),
            Duration::from_secs(30),
            || {
                let output = self.inside(probe);
                output.status.success().then_some(()).ok_or_else(|| {
                    format!(
                        "{}\n{what}'s log:\n{}",
                        String::from_utf8_lossy(&output.stderr),
                        crate::cluster::control_plane::log_tail(&log, 20)
                    )
                })
            },
        )
    }

    /// The fake NVML's scenario the `nvidia` runtime handler's containers see (its two GPUs), to
    /// change a GPU's state: `change` edits it, and it is replaced whole.
    pub fn gpu_scenario(&self, change: impl FnOnce(&mut serde_json::Value)) {
        let path = self.dir.join("nvidia/scenario.json");
        let mut scenario: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        change(&mut scenario);
        let replacement = path.with_extension("json.new");
        std::fs::write(&replacement, scenario.to_string()).unwrap();
        std::fs::rename(&replacement, &path).unwrap();
    }

    /// A program run inside the node's namespaces, with the node's programs on its PATH.
    pub fn inside(&self, command: &[&str]) -> Output {
        self.nsenter(command)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("nsenter {command:?}: {e}"))
    }

    /// A long-running program of the node started inside its namespaces, its output appended to
    /// `log` under the node's folder (a restarted program's after its earlier run's); it dies
    /// with the namespace at the latest.
    pub fn spawn_inside(&self, command: &[&str], log: &str) -> Child {
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(log))
            .unwrap();
        spawn_for_the_run(
            self.nsenter(command)
                .stdin(Stdio::null())
                .stdout(output.try_clone().unwrap())
                .stderr(output),
        )
        .unwrap_or_else(|e| panic!("nsenter {command:?}: {e}"))
    }

    fn nsenter(&self, command: &[&str]) -> Command {
        let mut nsenter = Command::new("nsenter");
        nsenter
            .args([
                "-t",
                &self.first.to_string(),
                "--mount",
                "--net",
                // The namespace's /proc is its PID namespace's: a program sees itself there only
                // from inside it.
                "--pid",
                "--",
            ])
            .args(command)
            .env("PATH", path_with(&self.programs));
        nsenter
    }

    /// `ctr` against the node's containerd; panics with its output if it fails.
    pub fn ctr(&self, args: &[&str]) -> String {
        let socket = self.socket();
        let mut command = vec!["ctr", "--address", &socket];
        command.extend_from_slice(args);
        checked(&command, self.inside(&command))
    }

    /// `crane` against the node's registry; panics with its output if it fails.
    pub fn crane(&self, args: &[&str]) -> String {
        let mut command = vec!["crane"];
        command.extend_from_slice(args);
        command.push("--insecure");
        checked(&command, self.inside(&command))
    }

    /// An image of `files` (each copied to the image's root, executable) pushed to the registry as
    /// `name`, for linux/amd64, running `entrypoint`; its digest as the registry reports it.
    pub fn push_image(&self, name: &str, files: &[&Path], entrypoint: &str) -> String {
        let layer = self
            .dir
            .join(format!("{}.layer", name.replace(['/', ':'], "_")));
        std::fs::create_dir_all(&layer).unwrap();
        for file in files {
            std::fs::copy(file, layer.join(file.file_name().unwrap())).unwrap();
        }
        self.push_layer(name, &layer, &["--entrypoint", entrypoint])
    }

    /// The registry's image `source` with a SOCI index, made as soci-snapshotter's guide audits it:
    /// the image pulled as an OCI layout, `soci convert --standalone --format oci-dir` (a zTOC for
    /// every layer, `--min-layer-size 0`), the converted layout pushed as `target` with its index.
    /// The digest the registry reports, checked to be the converted layout's.
    pub fn push_soci_converted(&self, source: &str, target: &str) -> String {
        let stem = target.replace(['/', ':'], "_");
        let layout = self.dir.join(format!("{stem}.oci"));
        let converted = self.dir.join(format!("{stem}.soci"));
        let _ = std::fs::remove_dir_all(&layout);
        let _ = std::fs::remove_dir_all(&converted);
        let (layout_arg, converted_arg) = (layout.to_str().unwrap(), converted.to_str().unwrap());
        let source = format!("{REGISTRY}/{source}");
        let target = format!("{REGISTRY}/{target}");
        self.crane(&["pull", "--format", "oci", &source, layout_arg]);
        let convert = [
            "soci",
            "convert",
            "--standalone",
            "--format",
            "oci-dir",
            "--min-layer-size",
            "0",
            layout_arg,
            converted_arg,
        ];
        checked(&convert, self.inside(&convert));
        self.crane(&["push", converted_arg, &target]);
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(converted.join("index.json")).unwrap())
                .unwrap();
        let converted_digest = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let pushed = self.crane(&["digest", &target]).trim().to_string();
        assert_eq!(
            pushed, converted_digest,
            "the registry holds the converted image as soci wrote it"
        );
        pushed
    }

    /// The SOCI snapshotter's metrics, as Prometheus would scrape them on the node.
    pub fn soci_metrics(&self) -> String {
        let curl = [
            "curl",
            "-sf",
            "--unix-socket",
            SOCI_METRICS,
            "http://soci-snapshotter/metrics",
        ];
        checked(&curl, self.inside(&curl))
    }

    /// An image of one layer, the folder `layer` as its root, pushed to the registry as `name`
    /// for linux/amd64, its configuration set by `config` (crane mutate's flags: `--entrypoint`,
    /// `--cmd`, `--user`); its digest as the registry reports it.
    pub fn push_layer(&self, name: &str, layer: &Path, config: &[&str]) -> String {
        let tar = self
            .dir
            .join(format!("{}.tar", name.replace(['/', ':'], "_")));
        let output = Command::new("tar")
            .arg("-C")
            .arg(layer)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        checked(&["tar"], output);
        let image = format!("{REGISTRY}/{name}");
        self.crane(&["append", "-f", tar.to_str().unwrap(), "-t", &image]);
        let mut mutate = vec!["mutate", &image, "--set-platform", "linux/amd64"];
        mutate.extend_from_slice(config);
        self.crane(&mutate);
        let _ = std::fs::remove_file(tar);
        self.crane(&["digest", &image]).trim().to_string()
    }
}

/// The mounts of the machine's own namespace under `dir` (a node's folder), as its mount table
/// lists them.
pub fn machine_mounts_under(dir: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    mounts
        .lines()
        .filter(|l| l.contains(&dir))
        .map(str::to_string)
        .collect()
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // unshare kills the namespace's first process (--kill-child), and the kernel every other
        // one of its PID namespace; the mounts go with the last.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.namespace.id() as i32),
            Signal::SIGKILL,
        );
        let _ = self.namespace.wait();
        remove_cgroup_root(&self.cgroup_root);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first child of `parent`, once it has forked it.
fn first_child(parent: u32) -> u32 {
    crate::wait::wait_until(
        "the node's namespace's first process",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                .ok()
                .and_then(|children| children.split_whitespace().next()?.parse().ok())
                .ok_or_else(|| format!("unshare ({parent}) has not forked yet"))
        },
    )
}

/// `root` in each of the machine's cgroup hierarchies, where it exists.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|hierarchies| {
            hierarchies
                .filter_map(|h| Some(h.ok()?.path().join(root)))
                .filter(|dir| dir.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// A node's cgroup root removed from every hierarchy, deepest first: a cgroup goes only once it
/// has no children and no processes.
fn remove_cgroup_root(root: &str) {
    for dir in cgroup_dirs(root) {
        let mut dirs: Vec<PathBuf> = walkdir::WalkDir::new(&dir)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_dir())
            .map(|e| e.into_path())
            .collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The folders and cgroup roots of nodes whose test process has ended: a node shared by a run
/// lives until its process exits, which runs no destructor.
fn remove_stale_nodes(runs: &Path) {
    let ended = |name: &str| {
        name.strip_prefix("mlnode-test-node-")
            .and_then(|rest| rest.split('-').next())
            .is_some_and(|pid| !Path::new("/proc").join(pid).exists())
    };
    let roots = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|hierarchy| {
            std::fs::read_dir(hierarchy.path())
                .into_iter()
                .flatten()
                .flatten()
        });
    for root in roots {
        let name = root.file_name().to_string_lossy().into_owned();
        if ended(&name) {
            remove_cgroup_root(&name);
        }
    }
    for entry in std::fs::read_dir(runs).into_iter().flatten().flatten() {
        if ended(&entry.file_name().to_string_lossy()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// containerd's configuration: its state under the namespace's `/run`, its content and snapshots
/// in the node's folder; with `cri`, the CRI plugin as a kubelet needs it.
fn containerd_config(dir: &Path, programs: &Path, cri: bool) -> String {
    let mut config = format!(
        "version = 3\nroot = {root:?}\nstate = \"/run/containerd\"\n[grpc]\n  address = {socket:?}\n",
        root = CONTAINERD_ROOT,
        socket = dir.join("containerd.sock").display().to_string(),
    );
    if !cri {
        config.push_str(
            "disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.runtime\", \"io.containerd.cri.v1.images\"]\n",
        );
        return config + DEBUG_LOG;
    }
    // The NVIDIA container toolkit's work as a runtime handler of its own (`nvidia`, as the GPU
    // Operator installs it): the driver's NVML library (here the fake's) where the image's loader
    // finds it, and the fake driver's state beside it, bound into every container it runs. The
    // state's folder is bound, not its file, so that a test replacing the file (a rename: a fake
    // NVML never reads half of it) is seen inside ([`Runtime::gpu_scenario`]).
    let default_spec = Command::new(programs.join("ctr"))
        .args(["oci", "spec"])
        .output()
        .unwrap();
    assert!(
        default_spec.status.success(),
        "ctr oci spec: {default_spec:?}"
    );
    let mut nvidia_spec: serde_json::Value = serde_json::from_slice(&default_spec.stdout).unwrap();
    let gpus = dir.join("nvidia");
    std::fs::create_dir_all(&gpus).unwrap();
    let scenario = gpus.join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::json!({
            "driver_version": "580.95.05",
            "devices": [crate::devices::fake_nvml::device(0), crate::devices::fake_nvml::device(1)],
        })
        .to_string(),
    )
    .unwrap();
    for (source, target) in [
        (
            crate::devices::fake_nvml::fake_nvml(),
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ),
        (gpus.as_path(), "/run/fake-nvml"),
    ] {
        nvidia_spec["mounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "destination": target,
                "type": "bind",
                "source": source,
                "options": ["rbind", "ro"],
            }));
    }
    let nvidia_spec_file = gpus.join("runtime-spec.json");
    std::fs::write(&nvidia_spec_file, nvidia_spec.to_string()).unwrap();
    let registry_hosts = dir.join("registry-hosts");
    let hosts = registry_hosts.join(REGISTRY);
    std::fs::create_dir_all(&hosts).unwrap();
    // containerd's hosts.toml: the registry answers plain HTTP on the namespace's loopback, and
    // pulls go through the rate-held link.
    std::fs::write(
        hosts.join("hosts.toml"),
        format!("server = \"http://{REGISTRY}\"\n[host.\"http://{REGISTRY_LINK}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
    )
    .unwrap();
    // The SOCI snapshotter as EKS's SOCI nodes run it (soci-snapshotter's docs/kubernetes.md):
    // containerd's proxy snapshotter and the CRI's default, handed the images' annotations so it
    // can find their SOCI index; an image without one is pulled whole, as by overlayfs.
    config.push_str(&format!(
        "[proxy_plugins.soci]\n  type = \"snapshot\"\n  address = {SOCI_SOCKET:?}\n\
         [proxy_plugins.soci.exports]\n  root = \"/var/lib/soci-snapshotter-grpc\"\n\
         [plugins.'io.containerd.cri.v1.images']\n  snapshotter = \"soci\"\n  disable_snapshot_annotations = false\n\
         [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"{REGISTRY}/{PAUSE_IMAGE}\"\n\
         [plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = {hosts:?}\n\
         [plugins.'io.containerd.cri.v1.runtime']\n\
         \x20 # runc cannot raise oom_score_adj: the machine withholds CAP_SYS_RESOURCE.\n\
         \x20 restrict_oom_score_adj = true\n\
         [plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = [{bin:?}]\n  conf_dir = {conf:?}\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n\
         \x20 runtime_type = \"io.containerd.runc.v2\"\n  base_runtime_spec = {nvidia:?}\n",
        nvidia = nvidia_spec_file.display().to_string(),
        hosts = registry_hosts.display().to_string(),
        bin = programs.display().to_string(),
        conf = dir.join("cni").display().to_string(),
    ));
    config + DEBUG_LOG
}

/// At debug level containerd's log records each layer's apply ("diff applied"): an image pull's
/// ground truth (crate::node::containerd_log). A table of its own: the configuration's last.
const DEBUG_LOG: &str = "[debug]\n  level = \"debug\"\n";

/// Where the node's SOCI snapshotter listens for containerd.
const SOCI_SOCKET: &str = "/run/soci-snapshotter-grpc/soci-snapshotter-grpc.sock";

/// Where the node's SOCI snapshotter serves its Prometheus metrics: a unix socket in a folder of
/// its own, which the agent's soci component mounts read-only (never the snapshotter's own
/// folder, where its gRPC socket for containerd is).
pub const SOCI_METRICS: &str = "/run/soci-snapshotter-grpc-metrics/metrics.sock";

/// Registry names of links of their own (crate::node::one_node_cluster::OneNodeCluster::registry_at):
/// each a rate-held link to the registry that listens at that name, known to the SOCI
/// snapshotter from the start (its resolver is configured once), so that its look for an image's
/// SOCI index goes there as containerd's pulls do, rather than retrying a name it cannot reach
/// for seconds before every pull.
pub const OTHER_LINKS: [&str; 2] = ["127.0.0.1:5100", "127.0.0.1:5101"];

/// containerd's root on the node, its default: the agent's soci component mounts its content
/// store from there.
const CONTAINERD_ROOT: &str = "/var/lib/containerd";

/// The SOCI snapshotter's configuration (soci-snapshotter's docs/config.md): its metrics on, and
/// the registry's layers fetched through the rate-held link, as containerd's are (a mirror's
/// `host` must be a URL, or the snapshotter takes it for a path).
fn soci_config() -> String {
    format!(
        "metrics_network = \"unix\"\nmetrics_address = {SOCI_METRICS:?}\n\
         [pull_modes.soci_v2]\n  enable = true\n\
         [[resolver.host.{REGISTRY:?}.mirrors]]\n  host = \"http://{REGISTRY_LINK}\"\n  insecure = true\n{others}",
        others = OTHER_LINKS
            .iter()
            .map(|link| format!(
                "[[resolver.host.{link:?}.mirrors]]\n  host = \"http://{link}\"\n  insecure = true\n"
            ))
            .collect::<String>()
    )
}

/// The pod sandbox's image, which tests/programs/node/pause's program runs.
pub const PAUSE_IMAGE: &str = "pause:test";

/// The pods' network: the CNI bridge plugin with host-local addresses (its state in the node's
/// folder); containerd adds the loopback plugin itself.
fn write_cni_config(dir: &Path) -> std::io::Result<()> {
    let conf = dir.join("cni");
    std::fs::create_dir_all(&conf)?;
    let network = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "mlnode-test",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.88.0.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": dir.join("cni-addresses"),
            },
        }],
    });
    std::fs::write(conf.join("10-mlnode-test.conflist"), network.to_string())
}

fn path_with(programs: &Path) -> String {
    format!(
        "{}:{}",
        programs.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn checked(command: &[&str], output: Output) -> String {
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}
