//! A real Kubernetes control plane for the tests: kube-apiserver and etcd, built by
//! scripts/test.sh from Kubernetes' own Go modules (tests/programs/control-plane), with RBAC and Node
//! authorization, the default admission plugins (PodSecurity, ValidatingAdmissionPolicy) and API
//! Priority and Fairness. The first test that asks starts it; every later one shares it, each in
//! a namespace and on nodes of its own ([`ControlPlane::unique`], [`Install`]).
//!
//! It is started from a thread that lives as long as the test process and asks the kernel to send
//! it SIGTERM when that thread dies (`PR_SET_PDEATHSIG`), so it stops with the test run however
//! the run ends; it stops gracefully on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A cold start on a loaded 2-core machine (etcd, then every post-start hook of kube-apiserver)
/// takes seconds; this bounds a control plane that never becomes ready.
const START_LIMIT: Duration = Duration::from_secs(180);

/// A client of a real control plane: its address, its admin's kubeconfig, and `kubectl` run
/// against it. The run's shared one is [`shared`].
pub struct ControlPlane {
    kubeconfig: PathBuf,
    server: String,
    ca: PathBuf,
    next: AtomicU32,
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane of this test run; Err when it is not built (under `CI=true` a test given this
/// fails naming it, see `needs!`). One that is built but does not start fails the test with its
/// log.
pub fn shared() -> Result<&'static ControlPlane, String> {
    let binary = binary()?;
    match SHARED.get_or_init(|| start(&binary)) {
        Ok(control_plane) => Ok(control_plane),
        Err(failure) => panic!("{failure}"),
    }
}

/// The control-plane program `scripts/test.sh` builds (tests/programs/control-plane), or why
/// there is none.
pub fn binary() -> Result<PathBuf, String> {
    crate::built_program(
        "MLNODE_TEST_CONTROL_PLANE",
        "control-plane/control-plane",
        "the control plane (kube-apiserver and etcd, tests/programs/control-plane)",
    )
}

fn start(binary: &Path) -> Result<ControlPlane, String> {
    let runs = crate::target_tmpdir();
    remove_stale_runs(&runs);
    let dir = runs.join(format!("control-plane-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let kubeconfig = dir.join("admin.kubeconfig");
    let log = dir.join("control-plane.log");
    // One open file for both streams, so neither writes over the other.
    let output = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut command = Command::new(binary);
    command
        .arg("--dir")
        .arg(dir.join("state"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdin(Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output);
    let mut child = spawn_for_the_run(&mut command).map_err(|e| format!("could not start: {e}"))?;
    let started = Instant::now();
    let fail = |why: String| {
        Err(format!(
            "the control plane {} {why}; its log ({}) ends:\n{}",
            binary.display(),
            log.display(),
            log_tail(&log, 40)
        ))
    };
    while !kubeconfig.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return fail(format!("exited: {status}"));
        }
        if started.elapsed() > START_LIMIT {
            return fail(format!("was not ready within {START_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let control_plane = ControlPlane::at(kubeconfig, &dir.join("state"))?;
    eprintln!(
        "control plane ready at {} in {:.1} s",
        control_plane.server,
        started.elapsed().as_secs_f64()
    );
    Ok(control_plane)
}

/// `items` as one `v1` List, which kubectl creates or applies in one invocation.
pub fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// The last `lines` lines of a log file, for a failure message.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// `command` spawned by a thread that lives as long as the test process, its process sent SIGTERM
/// when that thread dies (`PR_SET_PDEATHSIG`): a program a test starts, or one shared by the run,
/// stops with the test process however the run ends, and not when the test's own thread ends.
pub fn spawn_for_the_run(command: &mut Command) -> std::io::Result<Child> {
    spawn_for_the_run_ended_by(command, nix::sys::signal::Signal::SIGTERM)
}

/// [`spawn_for_the_run`], with `signal` sent when the run ends: SIGKILL for a program that
/// ignores SIGTERM (`unshare --fork` leaves it to its child).
pub fn spawn_for_the_run_ended_by(
    command: &mut Command,
    signal: nix::sys::signal::Signal,
) -> std::io::Result<Child> {
    type Spawn = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Spawn>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (sender, requests) = mpsc::channel::<Spawn>();
        std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                for (mut command, reply) in requests {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("the spawner thread");
        Mutex::new(sender)
    });
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)
        });
    }
    let (reply, spawned) = mpsc::channel();
    let taken = std::mem::replace(command, Command::new(""));
    spawner
        .lock()
        .unwrap()
        .send((taken, reply))
        .expect("the spawner thread lives as long as the run");
    spawned.recv().expect("the spawner thread answers")
}

/// Folders of earlier runs whose test process is gone.
fn remove_stale_runs(runs: &Path) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("control-plane-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

impl ControlPlane {
    /// The control plane whose admin kubeconfig the program wrote at `kubeconfig`, its
    /// certificates under `state` (its `--dir`).
    pub fn at(kubeconfig: PathBuf, state: &Path) -> Result<ControlPlane, String> {
        let config: Value = serde_saphyr::from_str(&std::fs::read_to_string(&kubeconfig).unwrap())
            .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        let server = config["clusters"][0]["cluster"]["server"]
            .as_str()
            .ok_or("no server in the admin kubeconfig")?
            .to_string();
        Ok(ControlPlane {
            kubeconfig,
            server,
            ca: state.join("pki/ca.crt"),
            next: AtomicU32::new(0),
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The CA that signed the server's certificate, DER-encoded, as a client's roots take it.
    pub fn ca_der(&self) -> Vec<u8> {
        ureq::tls::Certificate::from_pem(self.ca_pem().as_bytes())
            .unwrap()
            .der()
            .to_vec()
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A name no other test of this run has: `prefix-N`.
    pub fn unique(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// kubectl as the cluster's admin, `stdin` fed to it.
    pub fn kubectl(&self, args: &[&str], stdin: &str) -> Output {
        run_kubectl(
            &[
                "--kubeconfig",
                self.kubeconfig.to_str().unwrap(),
                "--request-timeout=60s",
            ],
            args,
            stdin,
        )
    }

    /// kubectl as the cluster's admin; its stdout, or the test fails with its stderr.
    pub fn admin(&self, args: &[&str], stdin: &str) -> String {
        ok(self.kubectl(args, stdin), args)
    }

    /// An HTTP client that trusts the server's CA, answers every status as a response, and
    /// keeps its connection for as long as it is used, as a controller's does.
    pub fn client(&self, timeout: Duration) -> ureq::Agent {
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[
                ureq::tls::Certificate::from_der(&self.ca_der()).to_owned(),
            ]))
            .build();
        ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .new_agent()
    }

    /// One request to the API server authenticated by a bearer `token` alone, sent as the agent
    /// sends it (kubectl would read the object first, which the agent may not); the status and
    /// the body.
    pub fn request_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: &Value,
    ) -> (u16, Value) {
        let agent = self.client(Duration::from_secs(60));
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server))
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", content_type)
            .header("Accept", "application/json")
            .body(body.to_string())
            .unwrap();
        let mut response = agent
            .run(request)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The object `kubectl get -o json` shows.
    pub fn get(&self, args: &[&str]) -> Value {
        let mut args = [&["get"], args].concat();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.admin(&args, "")).unwrap()
    }

    /// `objects` created or updated by server-side apply, as the admin; Ok with what the server
    /// warned (kubectl prints each `Warning:` header on stderr), Err with its refusal.
    pub fn apply(&self, objects: &[Value]) -> Result<Vec<String>, String> {
        let output = self.kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=mlnode-tests",
                "-f",
                "-",
            ],
            &list(objects.to_vec()).to_string(),
        );
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if output.status.success() {
            Ok(warnings(&stderr))
        } else {
            Err(stderr)
        }
    }

    /// A bound service-account token for `service_account` in `namespace`, bound to `pod` (which
    /// must exist): what the kubelet asks TokenRequest for and projects into the pod. The server
    /// adds the pod's node name as the `authentication.kubernetes.io/node-name` claim.
    pub fn pod_token(&self, namespace: &str, service_account: &str, pod: &str) -> String {
        self.token(
            namespace,
            service_account,
            &[
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={pod}"),
                "--duration=1h",
            ],
        )
    }

    /// A token for `service_account` in `namespace` from TokenRequest (`kubectl create token`),
    /// with `options` (the object it is bound to, its duration); one bound to no pod carries no
    /// node name.
    pub fn token(&self, namespace: &str, service_account: &str, options: &[&str]) -> String {
        let mut args = vec!["create", "token", service_account, "-n", namespace];
        args.extend(options);
        self.admin(&args, "").trim().to_string()
    }

    /// A kubeconfig with `token` alone, in `dir`: what a pod's client builds from its projected
    /// token and the cluster's CA.
    pub fn token_kubeconfig(&self, token: &str, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority": self.ca}}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "test", "user": "pod"}}],
            "current-context": "pod",
        });
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }
}

fn run_kubectl(connection: &[&str], args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(connection)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("kubectl (scripts/test.sh installs it): {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn ok(output: Output, args: &[&str]) -> String {
    assert!(
        output.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The server's warnings in kubectl's stderr, one per `Warning: ` line.
pub fn warnings(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix("Warning: "))
        .map(str::to_string)
        .collect()
}

/// The shipped objects installed in a namespace of their own, as an install into a namespace
/// other than `mlnode-system` makes them: the namespace replaced wherever it is named (the
/// service account's username in the admission policies' CEL among them), and the cluster-wide
/// objects (ClusterRoles and their bindings, the admission policies and theirs) named after it,
/// so tests that install in parallel never share an object.
pub struct Install {
    pub namespace: String,
    pub objects: Vec<Value>,
}

impl Install {
    /// The rendered `objects`, in a namespace and under names of their own on `control_plane`.
    pub fn new(control_plane: &ControlPlane, objects: &[Value]) -> Install {
        let namespace = control_plane.unique("mlnode");
        let objects = objects
            .iter()
            .map(|object| {
                let text = object.to_string().replace("mlnode-system", &namespace);
                let mut object: Value = serde_json::from_str(&text).unwrap();
                let named = |value: &mut Value| {
                    *value = json!(format!("{}.{namespace}", value.as_str().unwrap()));
                };
                match object["kind"].as_str().unwrap_or_default() {
                    "ClusterRole" | "ValidatingAdmissionPolicy" => {
                        named(&mut object["metadata"]["name"])
                    }
                    "ClusterRoleBinding" => {
                        named(&mut object["metadata"]["name"]);
                        named(&mut object["roleRef"]["name"]);
                    }
                    "ValidatingAdmissionPolicyBinding" => {
                        named(&mut object["metadata"]["name"]);
                        named(&mut object["spec"]["policyName"]);
                    }
                    _ => {}
                }
                object
            })
            .collect();
        Install { namespace, objects }
    }

    /// The objects of `kinds`.
    pub fn of_kinds(&self, kinds: &[&str]) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|o| kinds.contains(&o["kind"].as_str().unwrap_or_default()))
            .cloned()
            .collect()
    }
}

/// A Node as the kubelet registers it (its labels and status, no taint of its own; the
/// TaintNodesByCondition admission plugin adds `node.kubernetes.io/not-ready` while Ready is not
/// True), with `extra` merged over it.
pub fn node(name: &str, extra: Value) -> Value {
    let mut node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true"}},
        "spec": {"providerID": format!("aws:///us-east-2a/i-{name}")},
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152Mi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "191450m", "memory": "2080000Mi", "pods": "110", "nvidia.com/gpu": "8"},
            "addresses": [{"type": "InternalIP", "address": "10.0.1.23"}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
            "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd://2.1.4",
                "architecture": "amd64", "operatingSystem": "linux", "osImage": "Amazon Linux 2023",
                "kernelVersion": "6.12.40", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": "b1"}
        }
    });
    json_patch::merge(&mut node, &extra);
    node
}

/// The taints a GPU node joins with: the agent's startup taint and NVIDIA's.
pub fn gpu_taints() -> Value {
    json!([
        {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
}

/// A namespace for the agent labelled as README tells users to label it: Pod Security enforces
/// `privileged` and audits and warns at `restricted`.
pub fn readme_namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}}})
}

/// The kinds an install needs for the agent to be confined as in a cluster: its namespace,
/// identity, RBAC, admission policies, configuration and DaemonSet (the monitoring objects need
/// prometheus-operator's CRDs and confine nothing).
pub const CONFINING_KINDS: &[&str] = &[
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ConfigMap",
    "DaemonSet",
];

/// The agent as its DaemonSet runs it on a node: the shipped objects installed (see [`Install`]),
/// a Node, the agent's pod bound to it (made from the DaemonSet's template as the DaemonSet
/// controller makes it) and the bound token the kubelet projects into that pod.
pub struct AgentOnNode {
    pub install: Install,
    pub node: String,
    /// The agent's pod's name.
    pub pod: String,
    pub token: String,
}

impl AgentOnNode {
    /// `objects` (a rendered overlay) installed, node `node` registered, the agent's pod on it.
    /// Returns once RBAC and the admission policies are in force for the agent's token (both
    /// reach the server's authorizer and admission through informers).
    pub fn start(control_plane: &ControlPlane, objects: &[Value], node: &str) -> AgentOnNode {
        AgentOnNode::start_on(control_plane, objects, &self::node(node, json!({})))
    }

    /// [`AgentOnNode::start`] on `node`, registered as given.
    pub fn start_on(control_plane: &ControlPlane, objects: &[Value], node: &Value) -> AgentOnNode {
        let install = Install::new(control_plane, objects);
        if install.of_kinds(&["Namespace"]).is_empty() {
            // The chart's objects: Helm installs into a namespace the user made.
            control_plane.create(&readme_namespace(&install.namespace));
        }
        control_plane
            .apply(&install.of_kinds(CONFINING_KINDS))
            .unwrap_or_else(|refusal| panic!("the shipped objects were refused: {refusal}"));
        control_plane.create(node);
        let node = node["metadata"]["name"].as_str().unwrap();
        let daemonset = crate::renderers::kustomize::daemonset(&install.objects);
        let pod = daemonset_pod(daemonset, node, &control_plane.unique("mlnode-agent"));
        let pod_name = pod["metadata"]["name"].as_str().unwrap().to_string();
        control_plane.create(&pod);
        let token = control_plane.pod_token(&install.namespace, "mlnode-agent", &pod_name);
        let agent = AgentOnNode {
            install,
            node: node.to_string(),
            pod: pod_name,
            token,
        };
        agent.await_policies(control_plane);
        agent
    }

    /// A token for the same service account bound to no pod, so without the node-name claim: as
    /// before Kubernetes 1.32, or minted by hand.
    pub fn unbound_token(&self, control_plane: &ControlPlane) -> String {
        control_plane.token(&self.install.namespace, "mlnode-agent", &[])
    }

    /// Waits until a status write the policy denies (the kubelet's Ready condition) is denied by
    /// the policy's own message, in a dry run: RBAC has let it through and the policy is in force.
    fn await_policies(&self, control_plane: &ControlPlane) {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Probe"}]}});
        let path = format!("/api/v1/nodes/{}/status?dryRun=All", self.node);
        crate::wait_until(
            "the agent's RBAC and admission policies in force",
            Duration::from_secs(30),
            || {
                let (_, answer) = control_plane.request_as(
                    &self.token,
                    "PATCH",
                    &path,
                    "application/strategic-merge-patch+json",
                    &patch,
                );
                let message = answer["message"].as_str().unwrap_or_default();
                if message.contains("may change only its own condition types") {
                    Ok(())
                } else {
                    Err(answer.to_string())
                }
            },
        );
    }
}

impl ControlPlane {
    /// `object` created as the admin (a Node's status included, as the kubelet registers it).
    pub fn create(&self, object: &Value) {
        self.admin(&["create", "-f", "-"], &object.to_string());
    }

    /// `node`'s taints set, as the admin: the agent's startup taint and the one NVIDIA's GPU
    /// nodes carry (replacing the `node.kubernetes.io/not-ready` taint admission put on the new
    /// node, as the node lifecycle controller removes it once the node is Ready).
    pub fn taint_gpu_node(&self, node: &str) {
        self.set_taints(node, gpu_taints());
    }

    /// `node`'s taints replaced by `taints`, as the admin.
    pub fn set_taints(&self, node: &str, taints: Value) {
        let patch = json!({"spec": {"taints": taints}});
        self.admin(
            &[
                "patch",
                "node",
                node,
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
            "",
        );
    }

    /// The CA that signed the server's certificate, as a pod's `ca.crt` holds it.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(&self.ca).unwrap()
    }

    /// The port the server listens on (127.0.0.1), as `KUBERNETES_SERVICE_PORT` names it.
    pub fn port(&self) -> u16 {
        self.server.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// A namespace of this test's own, with `labels`, and its `default` service account (which the
    /// controller manager would create; pods name it and the ServiceAccount admission plugin
    /// requires it).
    pub fn namespace(&self, prefix: &str, labels: Value) -> String {
        let name = self.unique(prefix);
        self.create(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}}));
        self.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": name}}));
        name
    }

    /// `pod` (as the API server returns it: the fields the server sets are dropped) created in
    /// `namespace` as the admin, then its status written as the kubelet writes it. Returns the
    /// stored pod.
    pub fn create_pod(&self, namespace: &str, pod: &Value) -> Value {
        self.create_pods(namespace, std::slice::from_ref(pod))
            .pop()
            .unwrap()
    }

    /// [`ControlPlane::create_pod`] for many pods, in three requests whatever their number: the
    /// pods created, their statuses applied to `pods/status` under the kubelet's field manager,
    /// and the stored pods read back (in `pods`' order).
    pub fn create_pods(&self, namespace: &str, pods: &[Value]) -> Vec<Value> {
        let mut statuses = Vec::new();
        let mut created = Vec::new();
        for pod in pods {
            let mut pod = pod.clone();
            let status = pod.as_object_mut().unwrap().remove("status");
            let metadata = pod["metadata"].as_object_mut().unwrap();
            for server_set in [
                "uid",
                "creationTimestamp",
                "resourceVersion",
                "ownerReferences",
            ] {
                metadata.remove(server_set);
            }
            metadata.insert("namespace".into(), json!(namespace));
            if let Some(status) = status {
                statuses.push((
                    pod["metadata"]["name"].as_str().unwrap().to_string(),
                    status,
                ));
            }
            created.push(pod);
        }
        self.create(&list(created));
        self.write_pod_statuses(namespace, &statuses);
        let stored = self.get(&["pods", "-n", namespace]);
        pods.iter()
            .map(|pod| {
                stored["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|s| s["metadata"]["name"] == pod["metadata"]["name"])
                    .cloned()
                    .unwrap()
            })
            .collect()
    }
}

impl ControlPlane {
    /// Each pod's status in `namespace` written in one request, as the kubelet's field manager:
    /// `(name, status)`.
    pub fn write_pod_statuses(&self, namespace: &str, statuses: &[(String, Value)]) {
        if statuses.is_empty() {
            return;
        }
        let items: Vec<Value> = statuses
            .iter()
            .map(|(name, status)| {
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace}, "status": status})
            })
            .collect();
        self.admin(
            &[
                "apply",
                "--server-side",
                "--subresource=status",
                "--force-conflicts",
                "--field-manager=kubelet",
                "-f",
                "-",
            ],
            &list(items).to_string(),
        );
    }

    /// The pod's `status` written as the kubelet writes it: conditions merged by type, so other
    /// writers' conditions (the agent's gate) stay, as the kubelet's strategic merge keeps them.
    pub fn write_pod_status(&self, namespace: &str, name: &str, status: &Value) {
        self.write_pod_statuses(namespace, &[(name.to_string(), status.clone())]);
    }
}

/// A pod of `daemonset` on `node`, as the DaemonSet controller makes it (pkg/controller/daemon:
/// the template, a node affinity on the node's name in place of the template's, the tolerations
/// every daemon pod gets) and the scheduler binds it.
pub fn daemonset_pod(daemonset: &Value, node: &str, name: &str) -> Value {
    let template = &daemonset["spec"]["template"];
    let mut spec = template["spec"].clone();
    spec["nodeName"] = json!(node);
    spec["affinity"]["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}});
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for (key, effect) in [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ] {
        tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
    }
    spec["tolerations"] = json!(tolerations);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": daemonset["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"],
        },
        "spec": spec,
    })
}

/// The CustomResourceDefinitions the shipped objects and examples use, from their projects'
/// own files (tests/fixtures/SOURCES): prometheus-operator's PodMonitor, ServiceMonitor and
/// PrometheusRule, node-readiness-controller's NodeReadinessRule.
const CRDS: &[&str] = &[
    "prometheus-operator/monitoring.coreos.com_podmonitors.yaml",
    "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml",
    "prometheus-operator/monitoring.coreos.com_prometheusrules.yaml",
    "node-readiness-controller/readiness.node.x-k8s.io_nodereadinessrules.yaml",
];

static CRDS_ESTABLISHED: OnceLock<()> = OnceLock::new();

impl ControlPlane {
    /// Installs [`CRDS`] once per run and waits until the server serves each (Established).
    pub fn with_crds(&self) {
        CRDS_ESTABLISHED.get_or_init(|| {
            let fixtures = crate::repo_root().join("tests/fixtures");
            for crd in CRDS {
                let path = fixtures.join(crd);
                self.admin(
                    &["apply", "--server-side", "-f", path.to_str().unwrap()],
                    "",
                );
            }
            let names: Vec<String> = CRDS
                .iter()
                .map(|crd| {
                    let file = crd.rsplit('/').next().unwrap().trim_end_matches(".yaml");
                    let (group, plural) = file.split_once('_').unwrap();
                    format!("crd/{plural}.{group}")
                })
                .collect();
            let mut args = vec!["wait", "--for=condition=Established", "--timeout=120s"];
            args.extend(names.iter().map(String::as_str));
            self.admin(&args, "");
        });
    }
}

/// The requests the agent's metrics (`mlnode_kube_requests_total`) say the API server refused or
/// could not place: every series with a 4xx code and a count above zero.
pub fn refused_requests(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with("mlnode_kube_requests_total{") && l.contains("code=\"4"))
        .filter(|l| l.rsplit_once(' ').is_some_and(|(_, n)| n != "0"))
        .map(str::to_string)
        .collect()
}

/// The condition of type `kind` in an object's (a Node's, a Pod's) status; Null where there is
/// none.
pub fn condition(object: &Value, kind: &str) -> Value {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or(Value::Null)
}
