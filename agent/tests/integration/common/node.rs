//! A node's container runtime, the real one: containerd 2.4 with runc (seccomp on) and the CNCF
//! registry, built from their Go modules (tests/node, pinned by its go.mod and go.sum) by
//! scripts/test.sh, running in a network and mount namespace of their own. The machine's `/run`,
//! links and mounts are left as they were: the namespace gets a `/run` tmpfs and its own loopback,
//! every mount made in it (the snapshots' overlays, the containers' roots) goes with it, and the
//! registry listens on the namespace's loopback only. Images are made and pushed with crane
//! (go-containerregistry). This is the first part of the tests' real node (kubelet next).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::control_plane::stopped_with_spawner;

/// Where scripts/test.sh puts the node's programs.
pub fn programs() -> Result<PathBuf, String> {
    let runc = super::built_program(
        "MLNODE_TEST_NODE_RUNC",
        "node/runc",
        "the node's programs (containerd, runc, the registry, crane: tests/node)",
    )?;
    Ok(runc.parent().unwrap().to_path_buf())
}

/// The registry's address inside the namespace.
pub const REGISTRY: &str = "127.0.0.1:5000";

pub struct Runtime {
    namespace: Child,
    programs: PathBuf,
    dir: tempfile::TempDir,
    /// The node's cgroup root, in each of the machine's cgroup v1 hierarchies (the namespace
    /// shares them): created by runc under it, removed with the node.
    cgroup_root: String,
}

impl Runtime {
    /// containerd and the registry started in namespaces of their own (mount, network, PID: every
    /// process of the node dies with the namespace's first); a component that does not come up
    /// fails the test, naming it, with its log's tail. Err: the programs are not built.
    pub fn start() -> Result<Runtime, String> {
        let programs = programs()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let at = dir.path().to_path_buf();
        let at = at.as_path();
        std::fs::write(
            at.join("registry.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {REGISTRY}\n",
                at.join("registry").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        // CRI off: this part runs containers through containerd's own API (ctr), no kubelet yet.
        std::fs::write(
            at.join("containerd.toml"),
            format!(
                "version = 3\nroot = {root:?}\nstate = {state:?}\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.runtime\", \"io.containerd.cri.v1.images\"]\n[grpc]\n  address = {socket:?}\n",
                root = at.join("containerd/root").display().to_string(),
                state = "/run/containerd",
                socket = at.join("containerd.sock").display().to_string(),
            ),
        )
        .map_err(|e| e.to_string())?;
        let script = format!(
            "set -e\nmount -t tmpfs tmpfs /run\nip link set lo up\nregistry serve {dir}/registry.yml >{dir}/registry.log 2>&1 &\ncontainerd --config {dir}/containerd.toml >{dir}/containerd.log 2>&1 &\nwait\n",
            dir = at.display()
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
            .stderr(Stdio::null());
        stopped_with_spawner(&mut command);
        let namespace = command
            .spawn()
            .map_err(|e| format!("unshare (the node's namespace): {e}"))?;
        let runtime = Runtime {
            namespace,
            programs,
            cgroup_root: format!(
                "mlnode-test-node-{}",
                at.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .trim_start_matches('.')
            ),
            dir,
        };
        let socket = runtime.socket();
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

    fn socket(&self) -> String {
        self.dir
            .path()
            .join("containerd.sock")
            .display()
            .to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cgroup path for a container of the node: under the node's own root.
    pub fn cgroup(&self, container: &str) -> String {
        format!("/{}/{container}", self.cgroup_root)
    }

    /// The node's cgroup root in each hierarchy of the machine, where one exists.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir("/sys/fs/cgroup")
            .map(|hierarchies| {
                hierarchies
                    .filter_map(|h| Some(h.ok()?.path().join(&self.cgroup_root)))
                    .filter(|root| root.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits for `probe` to succeed inside the namespace; fails naming `what` with its log's tail.
    fn await_up(&self, what: &str, log: &str, probe: &[&str]) {
        let log = self.dir.path().join(log);
        super::wait::wait_until(
            &format!("{what} up in the node's namespace"),
            Duration::from_secs(30),
            || {
                let output = self.inside(probe);
                output.status.success().then_some(()).ok_or_else(|| {
                    format!(
                        "{}\n{what}'s log:\n{}",
                        String::from_utf8_lossy(&output.stderr),
                        super::control_plane::log_tail(&log, 20)
                    )
                })
            },
        )
    }

    /// A program run inside the node's namespaces, with the node's programs on its PATH.
    pub fn inside(&self, command: &[&str]) -> Output {
        Command::new("nsenter")
            .args([
                "-t",
                &self.namespace.id().to_string(),
                "--mount",
                "--net",
                // The namespace's /proc is its PID namespace's: a program sees itself there only
                // from inside it.
                "--pid",
                "--",
            ])
            .args(command)
            .env("PATH", path_with(&self.programs))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("nsenter {command:?}: {e}"))
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
    /// `name`, for linux/amd64; its digest as the registry reports it.
    pub fn push_image(&self, name: &str, files: &[&Path]) -> String {
        let layer = self
            .dir
            .path()
            .join(format!("{}.layer", name.replace(['/', ':'], "_")));
        std::fs::create_dir_all(&layer).unwrap();
        for file in files {
            std::fs::copy(file, layer.join(file.file_name().unwrap())).unwrap();
        }
        let tar = layer.with_extension("tar");
        let output = Command::new("tar")
            .arg("-C")
            .arg(&layer)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        checked(&["tar"], output);
        let image = format!("{REGISTRY}/{name}");
        self.crane(&["append", "-f", tar.to_str().unwrap(), "-t", &image]);
        self.crane(&["mutate", &image, "--set-platform", "linux/amd64"]);
        self.crane(&["digest", &image]).trim().to_string()
    }

    /// Whether any mount of the machine's own namespace is under the node's folder.
    pub fn host_mounts_under_dir(&self) -> Vec<String> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let dir = self.dir.path().display().to_string();
        mounts
            .lines()
            .filter(|l| l.contains(&dir))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // unshare kills the namespace's first process (--kill-child), and the kernel every other
        // one of its PID namespace; the mounts go with the last.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.namespace.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.namespace.wait();
        // Deepest first: a cgroup goes only once it has no children and no processes.
        for root in self.cgroup_dirs() {
            let mut dirs: Vec<PathBuf> = walkdir::WalkDir::new(&root)
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
