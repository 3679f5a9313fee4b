//! A node at kubelet's default maximum of 110 pods, churned: the agent (release binary) follows
//! them through the fake API server while every pod is replaced several times. Prints the agent's
//! CPU and memory and the API requests per pod startup (target: one events list each, no polling).
//!
//! `cargo bench --bench startup_churn -- [ROUNDS]`

#[allow(dead_code)]
#[path = "../tests/integration/common/kube.rs"]
mod kube;
#[path = "../tests/integration/common/wait.rs"]
mod wait;
use wait::wait_until;
#[allow(dead_code)]
#[path = "../tests/integration/common/pods.rs"]
mod pods;

use std::time::{Duration, Instant};

use pods::{kubelet_event, unix_now, vllm_pod, PodTimes, NODE};

const PODS: usize = 110;

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = fields
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    ticks / 100.0
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    let api = kube::FakeApiServer::start(kube::gpu_node(NODE));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(&config, format!("listen: 127.0.0.1:{port}\nnode_name: {NODE}\nmodels: []\nnvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: false\nstartup:\n  enabled: true\n")).unwrap();
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_mlnode-agent"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("KUBECONFIG", api.kubeconfig())
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = agent.id();
    std::thread::sleep(Duration::from_millis(500));
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let mut startups = 0;
    for round in 0..rounds {
        let now = unix_now().floor();
        let times = |ready| PodTimes {
            created: now - 60.0,
            scheduled: now - 59.0,
            started: now - 10.0,
            ready,
            restart_count: 0,
            last_finished: None,
        };
        for i in 0..PODS {
            let (uid, name) = (format!("uid-{round}-{i}"), format!("vllm-{round}-{i}"));
            api.add_event(kubelet_event(
                &uid,
                &name,
                "Pulled",
                "Container image \"vllm/vllm-openai:v0.11.0\" already present on machine",
                Some("spec.containers{vllm}"),
                now - 12.0,
            ));
            api.put_pod(vllm_pod(&uid, &name, "/var/lib/models/llama", &times(None)));
        }
        for i in 0..PODS {
            api.put_pod(vllm_pod(
                &format!("uid-{round}-{i}"),
                &format!("vllm-{round}-{i}"),
                "/var/lib/models/llama",
                &times(Some(now)),
            ));
            startups += 1;
        }
        // Wait until the agent has measured this round, then replace every pod.
        let expected = startups;
        kube::wait(|| event_lists(&api) >= expected, Duration::from_secs(60));
        for i in 0..PODS {
            api.delete_pod(&format!("uid-{round}-{i}"));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_before;
    let rss = rss_mib(pid);
    let requests = api.requests();
    let pod_lists = requests
        .iter()
        .filter(|r| r.path.starts_with("/api/v1/pods?") && !r.path.contains("watch="))
        .count();
    let watches = requests
        .iter()
        .filter(|r| r.path.starts_with("/api/v1/pods?") && r.path.contains("watch="))
        .count();
    let other = requests.len() - pod_lists - watches - event_lists(&api);
    let _ = agent.kill();
    let _ = agent.wait();
    println!("| pods on the node | startups | events lists per startup | pod lists | pod watches | other requests | agent CPU ms per startup | agent CPU % over the run | RSS MiB |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {PODS} | {startups} | {:.2} | {pod_lists} | {watches} | {other} | {:.2} | {:.1} | {rss:.1} |",
        event_lists(&api) as f64 / startups as f64,
        1000.0 * cpu / startups as f64,
        100.0 * cpu / elapsed
    );
}

fn event_lists(api: &kube::FakeApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path.contains("/events?"))
        .count()
}
