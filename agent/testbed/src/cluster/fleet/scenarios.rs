//! The scenarios of docs/performance.md ("The fleet on a real API server"), each one phase.

use std::time::{Duration, Instant};

use super::{Fleet, Phase};
use crate::agent::sample;

/// How long the scenarios run, and how long any wait may take.
pub struct Timing {
    /// Heartbeats each agent writes in the steady phase, which lasts until every one has.
    pub steady_heartbeats: usize,
    /// The rollout restarts every agent, one after another, spread over this.
    pub rollout_within: Duration,
    /// The most one wait for the fleet may take.
    pub limit: Duration,
}

/// The scenarios of docs/performance.md, in order, each one phase: the start, the steady state,
/// a rollout, a pod churn, kube-apiserver restarted gracefully on etcd's data with a change made
/// on some nodes during the outage, killed and restarted after etcd was compacted past every
/// agent's watch position (the change undone during that outage), and Priority and Fairness
/// pushing back while the pods churn. Each agent runs from the start to the end but for its
/// restart in the rollout.
pub fn run_scenarios(fleet: &mut Fleet, timing: &Timing) -> Vec<Phase> {
    let limit = timing.limit;
    let mut phases = Vec::new();
    phases.push(fleet.phase("start", false, |f| {
        f.start_agents();
        f.await_verdicts("every verdict after the start", limit);
    }));
    let heartbeat = Duration::from_secs_f64(300.0 / fleet.settings.scale);
    phases.push(fleet.phase("steady", false, |f| {
        f.await_each_node(
            "each agent's heartbeats",
            timing.steady_heartbeats,
            limit + heartbeat * (timing.steady_heartbeats as u32 + 1),
            |r| r.verb == "patch" && r.resource == "nodes/status",
        );
    }));
    phases.push(fleet.phase("rollout", true, |f| {
        let began = Instant::now();
        let n = f.nodes.len();
        for i in 0..n {
            f.restart_agent(i);
            // The DaemonSet's pace: restarts spread over the window, not waits for a condition.
            let due = timing.rollout_within.mul_f64((i + 1) as f64 / n as f64);
            if let Some(ahead) = due.checked_sub(began.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
        f.await_each_node("every restarted agent listing its pods", 1, limit, |r| {
            r.verb == "list" && r.resource == "pods"
        });
        f.await_verdicts("every verdict after the rollout", limit);
    }));
    phases.push(fleet.phase("churn", false, |f| {
        f.churn_pods();
        f.await_verdicts("every new pod's gate", limit);
    }));
    let watched = fleet.watched_nodes();
    assert!(!watched.is_empty(), "no agent watches its model's files");
    let changed: Vec<usize> = watched.into_iter().step_by(10).collect();
    let verified = move |f: &Fleet, i: usize, value: f64| {
        let agent = f.nodes[i].agent.as_ref().unwrap();
        agent.wait_for("the agent's own verdict", limit, |metrics| {
            sample(
                metrics,
                "mlnode_model_cache_verified",
                &[("model_name", "llama")],
            ) == Some(value)
        });
    };
    // kube-apiserver restarted with `change` made to each of `changed` during the outage, seen
    // by its agent, and etcd compacted first with `compact`; then every verdict, and every agent
    // watching again (a server just started may refuse the first requests: 403 until its
    // authorizer's informers have synced).
    let outage = |f: &mut Fleet,
                  graceful: bool,
                  compact: bool,
                  change: fn(&mut Fleet, usize),
                  verdict: f64| {
        f.restart_apiserver(graceful, |f| {
            if compact {
                f.server.compact();
            }
            for &i in &changed {
                change(f, i);
                verified(f, i, verdict);
            }
        });
        f.await_verdicts("the verdicts changed during the outage", limit);
        f.await_each_node("every agent watching again", 1, limit, |r| {
            r.verb == "watch" && r.resource == "pods" && r.code == 200
        });
    };
    phases.push(fleet.phase("apiserver restart", true, |f| {
        outage(f, true, false, Fleet::break_model, 0.0)
    }));
    // Killed: the agents' watches are cut, not ended, and etcd is compacted past every position
    // they hold.
    phases.push(fleet.phase("compaction", true, |f| {
        outage(f, false, true, Fleet::repair_model, 1.0)
    }));
    phases.push(fleet.phase("push-back", true, |f| {
        f.narrow_priority_level();
        f.await_level_closed(limit);
        f.flooded(|f| {
            f.churn_pods();
            f.await_each_node("a 429 for every agent", 1, limit, |r| r.code == 429);
        });
        f.widen_priority_level();
        f.mark("level widened");
        f.await_verdicts("every verdict once the level is widened", limit);
    }));
    phases
}
