//! A node at the kubelet's default maximum of 110 pods, churned on the real API server
//! (testbed::cluster::control_plane: kube-apiserver and etcd, built by scripts/test.sh): the agent (release
//! binary, its shipped RBAC and admission policies, a token bound to its pod on the node) follows
//! the pods while every pod is replaced several times. Prints the agent's CPU and memory and the
//! API requests per pod startup (target: one events list each, no polling), as the proxy in front
//! of the server recorded them.
//!
//! `cargo bench --bench startup_churn -- [ROUNDS]` after `scripts/test.sh` has built the control
//! plane (or with `MLNODE_TEST_CONTROL_PLANE` naming one) and put kubectl under target/tools.

use std::time::{Duration, Instant};

use mlnode_testbed as testbed;
use serde_json::Value;

use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::pods::{
    bound_vllm_pod, in_namespace, kubelet_event, unix, vllm_pod, PodTimes,
};
use testbed::process_stats::{cpu_seconds, rss_mib};

const PODS: usize = 110;

/// The pod's moments as the kubelet records them, all at its creation (the server's clock):
/// what is measured here is the agent's cost per startup, not the phases.
fn times(created: &Value, ready: bool) -> PodTimes {
    let at = unix(created);
    PodTimes {
        created: at,
        scheduled: at,
        started: at,
        ready: ready.then_some(at),
        restart_count: 0,
        last_finished: None,
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    let node = match ApiOnlyNode::gpu(&[]) {
        Ok(node) => node,
        Err(why) => {
            eprintln!("startup_churn: {why}");
            std::process::exit(1);
        }
    };
    let control_plane = node.control_plane;
    let agent = node.start_agent("models: []\nnvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: false\nstartup:\n  enabled: true\n");
    agent.wait_for_log("the tracker started", Duration::from_secs(30), |log| {
        log.contains("pod startup tracker started")
    });
    let pid = agent.pid();
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let mut startups = 0;
    for round in 0..rounds {
        // Their statuses are the kubelet's to write, below.
        let pods: Vec<Value> = (0..PODS)
            .map(|i| {
                bound_vllm_pod(
                    &format!("vllm-{round}-{i}"),
                    "/var/lib/models/llama",
                    node.name(),
                )
            })
            .collect();
        let created = control_plane.create_pods(&node.inference, &pods);
        let events: Vec<Value> = created
            .iter()
            .map(|pod| {
                let t = times(&pod["metadata"]["creationTimestamp"], false);
                let event = kubelet_event(
                    pod["metadata"]["uid"].as_str().unwrap(),
                    pod["metadata"]["name"].as_str().unwrap(),
                    "Pulled",
                    "Container image \"vllm/vllm-openai:v0.11.0\" already present on machine",
                    Some("spec.containers{vllm}"),
                    t.started,
                );
                in_namespace(event, &node.inference)
            })
            .collect();
        control_plane.create(&testbed::cluster::control_plane::list(events));
        let status = |ready: bool| -> Vec<(String, Value)> {
            created
                .iter()
                .map(|pod| {
                    let name = pod["metadata"]["name"].as_str().unwrap();
                    let t = times(&pod["metadata"]["creationTimestamp"], ready);
                    let built = vllm_pod("", name, "/var/lib/models/llama", &t);
                    (name.to_string(), built["status"].clone())
                })
                .collect()
        };
        control_plane.write_pod_statuses(&node.inference, &status(false));
        control_plane.write_pod_statuses(&node.inference, &status(true));
        startups += PODS;
        // Wait until the agent has measured this round, then replace every pod.
        let expected = startups;
        testbed::wait_until("every startup measured", Duration::from_secs(120), || {
            let lists = event_lists(&node);
            (lists >= expected)
                .then_some(())
                .ok_or_else(|| format!("{lists} events lists for {expected} startups"))
        });
        control_plane.admin(
            &[
                "delete",
                "pods",
                "--all",
                "-n",
                &node.inference,
                "--grace-period=0",
                "--force",
                "--wait=false",
            ],
            "",
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_before;
    let rss = rss_mib(pid);
    let requests = node.requests();
    let pod_lists = requests
        .iter()
        .filter(|r| r.path.starts_with("/api/v1/pods?") && !r.path.contains("watch="))
        .count();
    let watches = requests
        .iter()
        .filter(|r| r.path.starts_with("/api/v1/pods?") && r.path.contains("watch="))
        .count();
    let event_lists = event_lists(&node);
    let other = requests.len() - pod_lists - watches - event_lists;
    println!("| pods on the node | startups | events lists per startup | pod lists | pod watches | other requests | agent CPU ms per startup | agent CPU % over the run | RSS MiB |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {PODS} | {startups} | {:.2} | {pod_lists} | {watches} | {other} | {:.2} | {:.1} | {rss:.1} |",
        event_lists as f64 / startups as f64,
        1000.0 * cpu / startups as f64,
        100.0 * cpu / elapsed
    );
}

fn event_lists(node: &ApiOnlyNode) -> usize {
    node.requests()
        .iter()
        .filter(|r| r.path.contains("/events?"))
        .count()
}
