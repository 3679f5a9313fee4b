//! A real Prometheus (Debian's package, installed by the test command) on loopback, scraping the
//! given targets every second, and its query API.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::agent::{http_get, logged_port};

/// A running Prometheus, stopped when dropped: its port and its folder.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Prometheus with one scrape job per (job name, port on 127.0.0.1).
pub fn start_prometheus(jobs: &[(&str, u16)]) -> Prometheus {
    let mut jobs_yaml = String::new();
    for (job, port) in jobs {
        jobs_yaml.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ));
    }
    start_with_scrape_configs(&jobs_yaml)
}

/// Starts Prometheus with `scrape_configs` (YAML list items, indented two spaces), scraping every
/// second.
pub fn start_with_scrape_configs(scrape_configs: &str) -> Prometheus {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    let text = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{scrape_configs}"
    );
    std::fs::write(&config, text).unwrap();
    let log = dir.path().join("prometheus.log");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        // Port 0, and the port it got from its log: nothing can take it between choosing and binding.
        .arg("--web.listen-address=127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("prometheus is installed by the test command (apt-get install prometheus)");
    let port = logged_port(
        || std::fs::read_to_string(&log).unwrap_or_default(),
        "msg=\"Listening on\"",
        &["address="],
    );
    Prometheus {
        child,
        port,
        _dir: dir,
    }
}

fn encode(promql: &str) -> String {
    promql
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An instant query's whole answer: Err carries Prometheus's error (a parse error, say).
pub fn query_raw(port: u16, promql: &str) -> Result<serde_json::Value, String> {
    let (status, body) = http_get(port, &format!("/api/v1/query?query={}", encode(promql)))?;
    let value: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if value["status"] != "success" {
        return Err(format!(
            "{promql}: {} {}",
            value["errorType"], value["error"]
        ));
    }
    Ok(value["data"]["result"].clone())
}

/// Runs an instant query; returns the result vector once it is non-empty.
pub fn query(port: u16, promql: &str) -> Option<serde_json::Value> {
    let result = query_raw(port, promql).ok()?;
    (result.as_array().is_some_and(|r| !r.is_empty())).then_some(result)
}

/// Waits until `promql` has a result, and returns it.
pub fn wait_query(port: u16, promql: &str) -> serde_json::Value {
    crate::wait_until(
        &format!("a result for {promql}"),
        Duration::from_secs(30),
        || query(port, promql).ok_or_else(|| "no result yet".to_string()),
    )
}

/// Serves tests/fixtures/vllm-metrics.txt on a loopback port, as vLLM's /metrics.
pub fn serve_vllm_fixture() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = std::fs::read_to_string(crate::repo_root().join("tests/fixtures/vllm-metrics.txt"))
        .unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    port
}

/// (title, PromQL expressions) of every panel of a Grafana dashboard file that has a query,
/// rows' nested panels included.
pub fn dashboard_panels(path: &std::path::Path) -> Vec<(String, Vec<String>)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, Vec<String>)>) {
        for panel in panels.as_array().into_iter().flatten() {
            let exprs: Vec<String> = panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str().map(str::to_string))
                .collect();
            if !exprs.is_empty() {
                out.push((
                    panel["title"].as_str().unwrap_or_default().to_string(),
                    exprs,
                ));
            }
            walk(&panel["panels"], out);
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The titles of the panels whose every query returns data now, and of those that do not.
pub fn panels_with_data(
    port: u16,
    panels: &[(String, Vec<String>)],
    resolve: impl Fn(&str) -> String,
) -> (Vec<String>, Vec<String>) {
    let (with, without): (Vec<_>, Vec<_>) = panels
        .iter()
        .partition(|(_, exprs)| exprs.iter().all(|e| query(port, &resolve(e)).is_some()));
    let titles = |p: Vec<&(String, Vec<String>)>| p.into_iter().map(|(t, _)| t.clone()).collect();
    (titles(with), titles(without))
}
