//! The agent binary as a child process, and a small client for its HTTP endpoints.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long SIGTERM may take to stop the agent in a test: well under the DaemonSet's termination
/// grace (Kubernetes' default 30 s), and far above the fraction of a second it takes, so that a
/// loaded 2-core machine running the suite in parallel does not fail it (it took 1.1 s once).
/// What it really takes is measured by `scripts/bench_serve.py`, not asserted.
pub const EXIT_BOUND: Duration = Duration::from_secs(5);

/// The agent binary (the tests' build) running as a child process with a config of the test's, its
/// log kept; stopped when dropped.
pub struct Agent {
    child: Child,
    /// The port the agent bound: it listens on port 0 and logs what the kernel gave it, so no other
    /// process can take a port between the test choosing it and the agent binding it.
    port: std::sync::OnceLock<u16>,
    _log_dir: tempfile::TempDir,
    log: PathBuf,
}

impl Agent {
    /// Starts `mlnode-agent serve` on `config_yaml` and waits until it serves.
    pub fn start(config_yaml: &str) -> Agent {
        Agent::start_with_env(config_yaml, &[])
    }

    /// As [`Agent::start`], with `env` set for it (the fake NVML's scenario file, say).
    pub fn start_with_env(config_yaml: &str, env: &[(&str, &Path)]) -> Agent {
        Agent::start_wrapped(config_yaml, env, &[])
    }

    /// Runs the agent under `wrapper` (a command that execs its arguments, such as `setpriv ...`).
    pub fn start_wrapped(config_yaml: &str, env: &[(&str, &Path)], wrapper: &[&str]) -> Agent {
        let log_dir = tempfile::tempdir().unwrap();
        let config = log_dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!("listen: 127.0.0.1:0\nnode_name: test-node\n{config_yaml}"),
        )
        .unwrap();
        let log = log_dir.path().join("agent.log");
        let binary = assert_cmd::cargo::cargo_bin("mlnode-agent");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info,kube_client::client::builder=off")
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent {
            child,
            port: std::sync::OnceLock::new(),
            _log_dir: log_dir,
            log,
        }
    }

    /// The port the agent serves on, from its "mlnode-agent serving" line (text or JSON logs);
    /// waits for the line, which comes right after the bind, before any collector starts.
    pub fn port(&self) -> u16 {
        *self.port.get_or_init(|| {
            logged_port(
                || self.log(),
                "mlnode-agent serving",
                &["listen=", "\"listen\":\""],
            )
        })
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port(), path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}\nagent log:\n{}", self.log()))
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics").1
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls /metrics until `check` holds; panics with the last scrape after `limit`.
    pub fn wait_for(&self, what: &str, limit: Duration, check: impl Fn(&str) -> bool) -> Duration {
        let started = Instant::now();
        crate::wait_until(what, limit, || match http_get(self.port(), "/metrics") {
            Ok((200, body)) if check(&body) => Ok(()),
            Ok((_, body)) => Err(format!("{body}\nagent log:\n{}", self.log())),
            Err(e) => Err(format!(
                "agent not answering: {e}\nagent log:\n{}",
                self.log()
            )),
        });
        started.elapsed()
    }

    /// Polls the agent's log until `check` holds; panics with the log after `limit`.
    pub fn wait_for_log(&self, what: &str, limit: Duration, check: impl Fn(&str) -> bool) {
        crate::wait_until(what, limit, || {
            let log = self.log();
            if check(&log) {
                Ok(())
            } else {
                Err(format!("agent log:\n{log}"))
            }
        })
    }

    pub fn terminate(&mut self) -> (Option<i32>, Duration) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.code(), started.elapsed());
            }
            if started.elapsed() > 3 * EXIT_BOUND {
                let _ = self.child.kill();
                return (None, started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The port a server that bound port 0 logged: on the first line holding `marker`, the
/// `host:port` after any of `keys`. Waits up to 30 s for the line (the bind comes first).
pub fn logged_port(log: impl Fn() -> String, marker: &str, keys: &[&str]) -> u16 {
    crate::wait_until(
        &format!("a {marker:?} line saying the port"),
        Duration::from_secs(30),
        || {
            let text = log();
            text.lines()
                .filter(|l| l.contains(marker))
                .find_map(|line| {
                    let at = keys
                        .iter()
                        .find_map(|key| line.find(key).map(|i| i + key.len()))?;
                    let address = &line[at..];
                    let end = address
                        .find(|c: char| c.is_whitespace() || c == '"')
                        .unwrap_or(address.len());
                    address[..end].rsplit_once(':')?.1.parse().ok()
                })
                .ok_or(format!("log:\n{text}"))
        },
    )
}

/// GET `path` on loopback `port`: the status and the body, or why there is none.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let mut response = agent
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .call()
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// The value of the series whose line starts with `name{` and holds every `label="value"` given.
pub fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    matching(metrics, name, labels).next()
}

/// Every sample of `name` whose labels include `labels` (a layer mounted twice, say).
pub fn samples(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    matching(metrics, name, labels).collect()
}

fn matching<'a>(
    metrics: &'a str,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    metrics.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (label_text, value) = rest.rsplit_once("} ")?;
        labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

/// The `models:` section of a config naming one model: `name` at `root`, checked against
/// `manifest`.
pub fn model_config(name: &str, root: &Path, manifest: &Path) -> String {
    format!("models:\n  - name: {name}\n    root: {root:?}\n    manifest: {manifest:?}\n")
}
