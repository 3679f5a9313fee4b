//! A real Prometheus (Debian's `prometheus`, installed by the test command) scrapes the running
//! agent on loopback: the exposition must be accepted (`up == 1`) and the series queryable.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::{free_port, http_get, model_config, Agent};
use common::PlainModel;

struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(target_port: u16) -> Prometheus {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: mlnode\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus is installed by the test command (apt-get install prometheus)");
    Prometheus {
        child,
        port,
        _dir: dir,
    }
}

/// Runs an instant query; returns the result vector once it is non-empty.
fn query(port: u16, promql: &str) -> Option<serde_json::Value> {
    let encoded: String = promql
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let (status, body) = http_get(port, &format!("/api/v1/query?query={encoded}")).ok()?;
    if status != 200 {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = value["data"]["result"].as_array()?;
    (!result.is_empty()).then(|| value["data"]["result"].clone())
}

fn wait_query(port: u16, promql: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        if let Some(result) = query(port, promql) {
            return result;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no result for {promql} within 30s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn prometheus_scrapes_the_agent() {
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let agent = Agent::start(&model_config("llama-3.1-8b", model.root(), &manifest));
    let prometheus = start_prometheus(agent.port);

    let up = wait_query(prometheus.port, "up{job=\"mlnode\"} == 1");
    assert_eq!(up[0]["value"][1], "1");
    let verified = wait_query(prometheus.port, "mlnode_model_cache_verified == 1");
    let metric = &verified[0]["metric"];
    assert_eq!(metric["model_name"], "llama-3.1-8b");
    assert_eq!(metric["revision"], "v1");
    assert_eq!(metric["Hostname"], "test-node");
    // A DCGM-style join by node works on the Hostname label.
    wait_query(
        prometheus.port,
        "mlnode_model_cache_verified * on(Hostname) group_left(version) mlnode_build_info",
    );
    // Prometheus kept every sample of the scrape (a malformed exposition would fail it whole).
    let samples = wait_query(
        prometheus.port,
        "scrape_samples_post_metric_relabeling{job=\"mlnode\"}",
    );
    assert!(
        samples[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 20.0
    );
}
