//! The fleet benchmark's scenarios (testbed::cluster::fleet, agent/benches/fleet.rs) run small: three agents,
//! each on its own node with its own gated pods and bound token, on a real kube-apiserver and etcd
//! of their own, counted by the server's audit log. What each scenario must cost, and what must
//! still hold after it, is asserted; the benchmark prints the same figures for hundreds.

use std::time::Duration;

use mlnode_testbed as testbed;
use testbed::cluster::fleet::{run_scenarios, Fleet, Phase, Settings, Timing};

const AGENTS: usize = 3;
const PODS_PER_NODE: usize = 2;
/// The agents' heartbeat (5 min) every 5 s.
const SCALE: f64 = 60.0;

fn phase<'a>(phases: &'a [Phase], name: &str) -> &'a Phase {
    phases.iter().find(|p| p.name == name).unwrap()
}

/// Every LIST the phase's agents made was answered from the watch cache, and no agent had a
/// resource listed more than once (a LIST refused, by a server just started that has not synced
/// its authorizer yet, is retried and not counted).
fn lists_once_from_the_cache(phase: &Phase) {
    for r in phase.requests.iter().filter(|r| r.verb == "list") {
        assert!(
            r.served_by_watch_cache(),
            "{}: a LIST not from the watch cache: {}",
            phase.name,
            r.uri
        );
    }
    for resource in ["pods", "nodes"] {
        assert!(
            phase.most_by_one_node("list", resource, 200) <= 1,
            "{}: an agent listed {resource} more than once: {:?}",
            phase.name,
            phase.counts()
        );
    }
}

/// The node-status writes one agent may make in `phase` for its heartbeat alone, with one more for
/// a heartbeat that falls due as the phase ends.
fn heartbeats_in(phase: &Phase) -> usize {
    (phase.seconds * SCALE / 300.0).floor() as usize + 1
}

#[test]
fn a_fleet_on_a_real_api_server_keeps_its_budget_through_restarts_compaction_and_push_back() {
    let mut fleet = testbed::needs!(Fleet::new(Settings {
        agents: AGENTS,
        pods_per_node: PODS_PER_NODE,
        scale: SCALE,
    }));
    let phases = run_scenarios(
        &mut fleet,
        &Timing {
            steady_heartbeats: 2,
            rollout_within: Duration::ZERO,
            limit: Duration::from_secs(120),
        },
    );
    for p in &phases {
        eprintln!("{}", p.summary());
    }

    let start = phase(&phases, "start");
    lists_once_from_the_cache(start);
    assert!(start.of("watch", "pods") >= AGENTS, "{:?}", start.counts());

    // Steady: the heartbeat and nothing else is written, no more often than once per
    // (simulated) 5 minutes, and nothing is listed.
    let steady = phase(&phases, "steady");
    assert_eq!(
        steady.writes(),
        steady.of("patch", "nodes/status"),
        "steady writes other than the heartbeat: {:?}",
        steady.counts()
    );
    let heartbeat = steady
        .mean_interval(|r| r.verb == "patch" && r.resource == "nodes/status")
        .unwrap();
    assert!(
        heartbeat * SCALE >= 0.95 * 300.0,
        "a heartbeat every {:.0} simulated s, not every 300",
        heartbeat * SCALE
    );
    assert!(
        steady.most_by_one_node("patch", "nodes/status", 200) <= heartbeats_in(steady),
        "more heartbeats than one per 5 simulated minutes in {:.1} s: {:?}",
        steady.seconds,
        steady.counts()
    );
    assert_eq!(steady.of("list", "pods") + steady.of("list", "nodes"), 0);
    assert!(
        steady.open_watches >= AGENTS as f64,
        "{} watches open on the server for {AGENTS} agents",
        steady.open_watches
    );

    // Rollout: a restarted agent lists once from the cache, and rewrites no gate its pods show.
    let rollout = phase(&phases, "rollout");
    lists_once_from_the_cache(rollout);
    assert_eq!(
        rollout.of("patch", "pods/status"),
        0,
        "a restarted agent rewrote gates: {:?}",
        rollout.counts()
    );
    assert!(rollout.most_by_one_node("patch", "nodes/status", 200) <= heartbeats_in(rollout));
    let p99 = rollout.server_p99.expect("the server answered requests");
    assert!(p99 < 1.0, "the server's p99 during the rollout: {p99} s");

    // Churn: each new pod's gate written, and no more than twice (in progress, then verified).
    let churn = phase(&phases, "churn");
    assert!(churn.of("patch", "pods/status") <= 2 * AGENTS * PODS_PER_NODE);
    assert_eq!(churn.of("list", "pods"), 0, "{:?}", churn.counts());

    // The server restarted, gracefully and killed after a compaction: each agent back on its
    // watch and the change made during each outage on the nodes and their pods (run_scenarios
    // waited for both), by at most one LIST from the cache, without a restart of its own.
    for name in ["apiserver restart", "compaction"] {
        lists_once_from_the_cache(phase(&phases, name));
    }
    assert_eq!(
        phase(&phases, "churn").agent_pids,
        phase(&phases, "compaction").agent_pids,
        "an agent restarted during the server's restarts"
    );

    // Push-back: the server refused the agents by Priority and Fairness, other clients kept their
    // latency, every verdict landed once the level was widened.
    let push_back = phase(&phases, "push-back");
    assert!(push_back.rejected > 0.0, "the server rejected nothing");
    assert!(
        push_back.dispatched > 0.0,
        "the agents' level dispatched nothing"
    );
    let other = push_back.other_client_p99().expect("the other client ran");
    assert!(other < 1.0, "another client's p99 was {other:.3} s");
}
