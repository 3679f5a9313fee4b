//! What a fleet of agents costs a real kube-apiserver and etcd (testbed::cluster::fleet): hundreds of agent
//! processes (release build), each on its own Node with its own gated pods, model and bound token,
//! under the shipped RBAC, admission policies and Priority and Fairness example, through the
//! scenarios of docs/performance.md ("The fleet on a real API server"). The server counts the
//! agents' requests in its audit log; its CPU and memory, and etcd's, come from the kernel.
//!
//! `cargo bench --bench fleet -- [--agents 300] [--pods 2] [--scale 12] [--steady-heartbeats 12]
//! [--rollout-within 60]` after `scripts/test.sh` has built the control plane (or with
//! `MLNODE_TEST_CONTROL_PLANE` naming one) and put kubectl under target/tools. Prints the tables
//! and writes them to target/bench_fleet_real.md.

#[path = "support/args.rs"]
mod args;

use std::fmt::Write;

use args::arg;
use mlnode_testbed as testbed;
use std::time::Duration;

use testbed::cluster::fleet::{percentile, run_scenarios, Fleet, Phase, Settings, Timing};

const HOUR: f64 = 3600.0;
/// The kubelet's writes per node and hour when nothing changes: a Lease renewal every 10 s
/// (nodeLeaseDurationSeconds 40 / 4, pkg/kubelet/nodelease) and a node status every 5 min
/// (nodeStatusReportFrequency).
const KUBELET_WRITES_PER_HOUR: f64 = HOUR / 10.0 + HOUR / 300.0;

fn main() {
    let settings = Settings {
        agents: arg("--agents", 300.0) as usize,
        pods_per_node: arg("--pods", 2.0) as usize,
        scale: arg("--scale", 12.0),
    };
    let timing = Timing {
        steady_heartbeats: arg("--steady-heartbeats", 12.0) as usize,
        rollout_within: Duration::from_secs_f64(arg("--rollout-within", 60.0)),
        limit: Duration::from_secs(600),
    };
    let (agents, scale) = (settings.agents, settings.scale);
    let mut fleet = match Fleet::new(settings) {
        Ok(fleet) => fleet,
        Err(why) => {
            eprintln!("fleet: {why}");
            std::process::exit(1);
        }
    };
    // What the server costs with no agent at all: its own controllers and the harness.
    let idle = fleet.phase("idle", false, |_| {
        std::thread::sleep(Duration::from_secs(20))
    });
    let phases = run_scenarios(&mut fleet, &timing);
    let watched = fleet.watched_nodes().len();
    let table = tables(agents, scale, &idle, &phases, watched);
    println!("{table}");
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench_fleet_real.md");
    std::fs::write(out, table).unwrap();
}

fn tables(n: usize, scale: f64, idle: &Phase, phases: &[Phase], watched: usize) -> String {
    let per_node = |v: usize| v as f64 / n as f64;
    let mut out = String::new();
    let w = &mut out;
    writeln!(w, "{n} agents ({watched} watching their files: the machine's inotify instances are shared), 1 node each; agents' clocks at {scale}x.\n").unwrap();
    writeln!(w, "| phase | seconds | requests / node | writes / node | LISTs / node (cache, etcd) | 429 / node | apiserver CPU s | etcd CPU s | apiserver peak cores | apiserver peak MiB | etcd peak MiB | server p99 s | other client p99 s | APF dispatched, rejected |").unwrap();
    writeln!(w, "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |").unwrap();
    for p in std::iter::once(idle).chain(phases) {
        let lists: Vec<_> = p.requests.iter().filter(|r| r.verb == "list").collect();
        let cached = lists.iter().filter(|r| r.served_by_watch_cache()).count();
        let refused = p.requests.iter().filter(|r| r.code == 429).count();
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        writeln!(
            w,
            "| {} | {:.0} | {:.2} | {:.2} | {:.2}, {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.0} | {:.0} | {} | {} | {:.0}, {:.0} |",
            p.name,
            p.seconds,
            per_node(p.requests.len()),
            per_node(p.writes()),
            per_node(cached),
            per_node(lists.len() - cached),
            per_node(refused),
            p.apiserver_cpu_seconds,
            p.etcd_cpu_seconds,
            p.apiserver_peak_cores,
            p.apiserver_peak_mib,
            p.etcd_peak_mib,
            fmt(p.server_p99),
            fmt(p.other_client_p99()),
            p.dispatched,
            p.rejected,
        )
        .unwrap();
    }

    let steady = phases.iter().find(|p| p.name == "steady").unwrap();
    let beyond = beyond_steady(w, n, steady, phases);
    // The agents' heartbeats run `scale` times faster than real time, their watches at real
    // time: each is brought to one real hour at its own rate.
    // A request every node makes regularly is rated by its mean interval per node, free of where
    // the window's edges fall; any other by its count over the window.
    let hours = steady.seconds / HOUR;
    let per_hour = |verb: &str, resource: &str, code: u16| {
        let which = |r: &testbed::cluster::audit::Request| {
            r.verb == verb && r.resource == resource && r.code == code
        };
        let count = steady.requests.iter().filter(|r| which(r)).count() as f64;
        let real_time = if verb == "watch" { 1.0 } else { scale };
        match steady.mean_interval(which) {
            Some(interval) if count >= 2.0 * n as f64 => HOUR / interval / real_time,
            _ => count / n as f64 / hours / real_time,
        }
    };
    writeln!(w, "\nSteady state, {:.0} s ({:.0} simulated minutes of heartbeats), per node and real hour:\n", steady.seconds, steady.seconds * scale / 60.0).unwrap();
    writeln!(w, "| verb | resource | code | per node and hour | 1,000 nodes (requests/s) | 5,000 nodes (requests/s) |").unwrap();
    writeln!(w, "| --- | --- | --- | ---: | ---: | ---: |").unwrap();
    let (mut all, mut writes) = (0.0, 0.0);
    for ((verb, resource, code), _) in steady.counts() {
        let hourly = per_hour(&verb, &resource, code);
        all += hourly;
        if testbed::cluster::audit::is_write(&verb) {
            writes += hourly;
        }
        writeln!(
            w,
            "| {verb} | {resource} | {code} | {hourly:.1} | {:.2} | {:.2} |",
            hourly * 1000.0 / HOUR,
            hourly * 5000.0 / HOUR
        )
        .unwrap();
    }
    writeln!(
        w,
        "| **all** | | | **{all:.1}** | **{:.2}** | **{:.2}** |",
        all * 1000.0 / HOUR,
        all * 5000.0 / HOUR
    )
    .unwrap();
    writeln!(
        w,
        "| writes | | | {writes:.1} | {:.2} | {:.2} |",
        writes * 1000.0 / HOUR,
        writes * 5000.0 / HOUR
    )
    .unwrap();
    writeln!(w, "| kubelet's writes (Lease 10 s, node status 5 min) | | | {KUBELET_WRITES_PER_HOUR:.0} | {:.1} | {:.1} |", KUBELET_WRITES_PER_HOUR * 1000.0 / HOUR, KUBELET_WRITES_PER_HOUR * 5000.0 / HOUR).unwrap();

    writeln!(
        w,
        "\nWatches open on the server per node in the steady state: {:.2} (every client's, less the idle server's).",
        (steady.open_watches - idle.open_watches) / n as f64
    )
    .unwrap();

    // The server's CPU for the agents: the steady phase's above the idle server's, per request.
    let idle_cores = idle.apiserver_cpu_seconds / idle.seconds;
    let steady_cores = steady.apiserver_cpu_seconds / steady.seconds;
    let per_request =
        (steady_cores - idle_cores).max(0.0) * steady.seconds / steady.requests.len().max(1) as f64;
    let rollout = phases.iter().find(|p| p.name == "rollout").unwrap();
    let (rollout_requests, rollout_writes) = beyond["rollout"];
    writeln!(w, "\nkube-apiserver: {idle_cores:.3} cores idle, {steady_cores:.3} in the steady phase (heartbeats at {scale}x): {:.2} ms of CPU per agent request. At 1,000 nodes the agents' steady {:.2} requests/s cost about {:.3} cores of kube-apiserver; at 5,000, {:.3}.", per_request * 1000.0, all * 1000.0 / HOUR, all * 1000.0 / HOUR * per_request, all * 5000.0 / HOUR * per_request).unwrap();
    writeln!(w, "Rollout: {rollout_requests:.2} requests per restarted agent beyond the steady state, {rollout_writes:.2} of them writes; at 5,000 nodes within one minute, {:.0} requests/s ({:.0} writes/s) for that minute, the steady state included. Server p99 during the rollout {}; another client's p99 {}.",
        5000.0 * (rollout_requests / 60.0 + all / HOUR),
        5000.0 * (rollout_writes / 60.0 + writes / HOUR),
        rollout.server_p99.map_or("-".into(), |v| format!("{v:.3} s")),
        rollout.other_client_p99().map_or("-".into(), |v| format!("{v:.3} s"))).unwrap();
    for p in phases {
        for (what, at) in &p.marks {
            writeln!(
                w,
                "{}: every verdict in place {:.1} s after \"{what}\".",
                p.name,
                p.seconds - at
            )
            .unwrap();
        }
    }
    let push_back = phases.iter().find(|p| p.name == "push-back").unwrap();
    writeln!(w, "Push-back: the server rejected {:.0} of the agents' level's requests; the agents' own 429s {}; another client's p50 {} and p99 {}.",
        push_back.rejected,
        push_back.requests.iter().filter(|r| r.code == 429).count(),
        percentile(&push_back.other_client, 0.5).map_or("-".into(), |v| format!("{v:.3} s")),
        push_back.other_client_p99().map_or("-".into(), |v| format!("{v:.3} s"))).unwrap();
    out
}

/// Each phase's requests per node by verb and resource (and code, where not 2xx), less what the
/// steady state would have sent in as long a window (its heartbeats and watch renewals).
/// Returns each phase's requests and writes per node beyond the steady state.
fn beyond_steady(
    w: &mut String,
    n: usize,
    steady: &Phase,
    phases: &[Phase],
) -> std::collections::BTreeMap<&'static str, (f64, f64)> {
    let mut totals = std::collections::BTreeMap::new();
    writeln!(
        w,
        "\nPer node, beyond the steady state's own share of each window:\n"
    )
    .unwrap();
    writeln!(w, "| phase | requests | writes | by verb and resource |").unwrap();
    writeln!(w, "| --- | ---: | ---: | --- |").unwrap();
    let steady_counts = steady.counts();
    for p in phases.iter().filter(|p| p.name != "steady") {
        let mut extra = std::collections::BTreeMap::<String, f64>::new();
        let (mut requests, mut writes) = (0.0, 0.0);
        let counts = p.counts();
        let mut keys: std::collections::BTreeSet<_> = counts.keys().cloned().collect();
        keys.extend(steady_counts.keys().cloned());
        for key in keys {
            let (verb, resource, code) = &key;
            let during = counts.get(&key).copied().unwrap_or(0) as f64;
            let usual =
                steady_counts.get(&key).copied().unwrap_or(0) as f64 * p.seconds / steady.seconds;
            let beyond = (during - usual) / n as f64;
            requests += beyond;
            if testbed::cluster::audit::is_write(verb) {
                writes += beyond;
            }
            let name = if (200..300).contains(code) {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource} {code}")
            };
            *extra.entry(name).or_default() += beyond;
        }
        let mut named: Vec<(String, f64)> =
            extra.into_iter().filter(|(_, v)| v.abs() >= 0.05).collect();
        named.sort_by(|a, b| b.1.total_cmp(&a.1));
        let named: Vec<String> = named.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        writeln!(
            w,
            "| {} | {requests:.2} | {writes:.2} | {} |",
            p.name,
            named.join(", ")
        )
        .unwrap();
        totals.insert(p.name, (requests, writes));
    }
    totals
}
