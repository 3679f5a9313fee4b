//! A control plane of one test's or benchmark's own, with etcd and kube-apiserver as two processes
//! (tests/programs/control-plane's `--etcd-url-file` and `--etcd` modes), as in a cluster: each one's CPU
//! and memory measured apart, kube-apiserver stopped and started again on etcd's data while etcd
//! runs on, etcd compacted, and an audit log of what the server was asked. The shared control
//! plane (crate::cluster::control_plane) serves every other test; this one is for tests that restart or
//! load the server, which would disturb the others.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::control_plane::{self, log_tail, spawn_for_the_run_ended_by, ControlPlane};

/// A cold start of kube-apiserver on a loaded 2-core machine takes seconds; this bounds one that
/// never becomes ready.
const START_LIMIT: Duration = Duration::from_secs(180);

/// A control plane of one test's own: etcd and kube-apiserver, each a process.
pub struct PrivateControlPlane {
    binary: PathBuf,
    dir: PathBuf,
    etcd: Child,
    etcd_url: String,
    apiserver: Option<Child>,
    port: u16,
    apiserver_flags: Vec<String>,
    audit_logs: Vec<PathBuf>,
}

impl PrivateControlPlane {
    /// etcd, then kube-apiserver on it with `apiserver_flags` beside the program's own and an audit
    /// log kept by `audit_policy` (a policy.audit.k8s.io/v1 Policy, YAML), in `dir`; with the
    /// admin's view of it. Err when the program is not built (see `needs!`); a program that is
    /// built but does not start panics with its log.
    pub fn start(
        dir: &Path,
        audit_policy: &str,
        apiserver_flags: &[&str],
    ) -> Result<(PrivateControlPlane, ControlPlane), String> {
        let binary = control_plane::binary()?;
        std::fs::create_dir_all(dir).unwrap();
        let policy = dir.join("audit-policy.yaml");
        std::fs::write(&policy, audit_policy).unwrap();
        let url_file = dir.join("etcd.url");
        let _ = std::fs::remove_file(&url_file);
        let etcd_log = dir.join("etcd.log");
        let mut etcd = spawn(
            Command::new(&binary)
                .arg("--dir")
                .arg(dir.join("state"))
                .arg("--etcd-url-file")
                .arg(&url_file),
            &etcd_log,
        );
        let etcd_url = await_file(&url_file, &mut etcd, &etcd_log);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let mut apiserver_flags: Vec<String> =
            apiserver_flags.iter().map(|f| f.to_string()).collect();
        apiserver_flags.extend([
            format!("--audit-policy-file={}", policy.display()),
            "--audit-log-format=json".to_string(),
            // Written as each request ends, so a reader that has seen the answer finds the entry.
            "--audit-log-mode=blocking".to_string(),
        ]);
        let mut own = PrivateControlPlane {
            binary,
            dir: dir.to_path_buf(),
            etcd,
            etcd_url,
            apiserver: None,
            port,
            apiserver_flags,
            audit_logs: Vec::new(),
        };
        let admin = own.start_apiserver();
        Ok((own, admin))
    }

    /// kube-apiserver started (again) on the same etcd, port and certificates: every client's
    /// address and token stay valid. Returns the admin's view once it answers /readyz; its audit
    /// log is a file of its own (see [`PrivateControlPlane::audit_logs`]).
    pub fn start_apiserver(&mut self) -> ControlPlane {
        assert!(self.apiserver.is_none(), "kube-apiserver is running");
        let kubeconfig = self.dir.join("admin.kubeconfig");
        let _ = std::fs::remove_file(&kubeconfig);
        let audit_log = self
            .dir
            .join(format!("audit-{}.log", self.audit_logs.len()));
        let log = self
            .dir
            .join(format!("apiserver-{}.log", self.audit_logs.len()));
        let mut command = Command::new(&self.binary);
        command
            .arg("--dir")
            .arg(self.state())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--etcd")
            .arg(&self.etcd_url)
            .arg(format!("--port={}", self.port))
            .arg("--")
            .args(&self.apiserver_flags)
            .arg(format!("--audit-log-path={}", audit_log.display()));
        let apiserver = self.apiserver.insert(spawn(&mut command, &log));
        self.audit_logs.push(audit_log);
        await_file(&kubeconfig, apiserver, &log);
        ControlPlane::at(kubeconfig, &self.state()).unwrap()
    }

    /// kube-apiserver stopped: with `graceful`, as its static pod is on an upgrade (SIGTERM,
    /// then its graceful shutdown: every watch ended within
    /// `--shutdown-watch-termination-grace-period`, in-flight requests answered); without, as the
    /// kernel's OOM killer ends it (SIGKILL: connections cut, nothing sent).
    pub fn stop_apiserver(&mut self, graceful: bool) {
        let mut apiserver = self
            .apiserver
            .take()
            .expect("kube-apiserver is not running");
        if graceful {
            terminate(&mut apiserver);
        } else {
            let _ = apiserver.kill();
            let _ = apiserver.wait();
        }
    }

    /// etcd's history compacted up to its head revision, as kube-apiserver's own compactor does
    /// every `--etcd-compaction-interval`; the revision.
    pub fn compact(&self) -> u64 {
        let output = Command::new(&self.binary)
            .arg("--compact")
            .arg(&self.etcd_url)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "etcd compaction: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap()
    }

    /// Its `--dir`: etcd's data, the cluster's CA and the service-account key.
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn etcd_pid(&self) -> u32 {
        self.etcd.id()
    }

    /// The running kube-apiserver's process id.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver
            .as_ref()
            .expect("kube-apiserver is not running")
            .id()
    }

    /// Every audit log written so far, one per start of kube-apiserver, oldest first.
    pub fn audit_logs(&self) -> &[PathBuf] {
        &self.audit_logs
    }
}

impl Drop for PrivateControlPlane {
    fn drop(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            terminate(&mut apiserver);
        }
        terminate(&mut self.etcd);
    }
}

fn spawn(command: &mut Command, log: &Path) -> Child {
    let output = std::fs::File::create(log).unwrap();
    command
        .stdin(Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output);
    // Drop stops them gracefully, kube-apiserver first; at the end of the run (a control plane
    // shared by it is never dropped) both are killed, since kube-apiserver's graceful stop waits
    // on an etcd that stops at the same time.
    spawn_for_the_run_ended_by(command, nix::sys::signal::Signal::SIGKILL)
        .unwrap_or_else(|e| panic!("the control plane program: {e}"))
}

/// The file's content once the program has written it (through a rename); panics with the end of
/// `log` when the program exits first, or has not written it after [`START_LIMIT`].
fn await_file(file: &Path, program: &mut Child, log: &Path) -> String {
    let started = Instant::now();
    let content = crate::wait_until(&format!("{} written", file.display()), START_LIMIT, || {
        if let Ok(Some(status)) = program.try_wait() {
            panic!(
                "the control plane program exited ({status}) before writing {}; its log ({}) ends:\n{}",
                file.display(),
                log.display(),
                log_tail(log, 30)
            );
        }
        std::fs::read_to_string(file).map_err(|_| log_tail(log, 30))
    });
    eprintln!(
        "{} after {:.1} s",
        file.display(),
        started.elapsed().as_secs_f64()
    );
    content
}

fn terminate(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}
