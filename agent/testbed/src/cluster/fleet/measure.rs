//! What the kernel and the server's own metrics say of a phase.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::process_stats::cpu_seconds;

/// The largest CPU use of the process in any one second, in cores, until `running` is false.
pub(super) fn peak_cores(running: &AtomicBool, pid: &AtomicU32) -> f64 {
    let mut peak: f64 = 0.0;
    let sample = || {
        let pid = pid.load(Ordering::Relaxed);
        (pid, Instant::now(), cpu_seconds(pid))
    };
    let mut last = sample();
    while running.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        let now = sample();
        let elapsed = now.1.duration_since(last.1).as_secs_f64();
        // A new kube-apiserver is measured from its first sample, not from its start's CPU.
        if now.0 != last.0 || now.2 < last.2 {
            last = now;
        } else if elapsed >= 1.0 {
            peak = peak.max((now.2 - last.2) / elapsed);
            last = now;
        }
    }
    peak
}

/// The sum of every series of counter `name` whose labels hold `label`.
pub(super) fn sum_of(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter(|rest| rest.contains(label))
        .filter_map(|rest| rest.rsplit_once("} ")?.1.trim().parse::<f64>().ok())
        .sum::<f64>()
        // An empty sum is -0.0.
        + 0.0
}

/// A counter's increase; a server restarted meanwhile counts from zero.
pub(super) fn delta(before: f64, after: f64) -> f64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

/// The bucket bound under which 99% of the requests (but WATCH and CONNECT) the server answered
/// between the two scrapes fell.
pub(super) fn request_p99(before: &str, after: &str) -> Option<f64> {
    let buckets = |text: &str| {
        let mut by_bound = BTreeMap::<String, f64>::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_duration_seconds_bucket{") else {
                continue;
            };
            if rest.contains("verb=\"WATCH\"") || rest.contains("verb=\"CONNECT\"") {
                continue;
            }
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Some(bound) = labels
                .split("le=\"")
                .nth(1)
                .and_then(|b| b.split('"').next())
            else {
                continue;
            };
            *by_bound.entry(bound.to_string()).or_default() +=
                value.trim().parse::<f64>().unwrap_or(0.0);
        }
        by_bound
    };
    let before = buckets(before);
    let mut cumulative: Vec<(f64, f64)> = buckets(after)
        .into_iter()
        .map(|(bound, count)| {
            let increase = delta(before.get(&bound).copied().unwrap_or(0.0), count);
            (bound.parse::<f64>().unwrap_or(f64::INFINITY), increase)
        })
        .collect();
    cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = cumulative.last()?.1;
    if total == 0.0 {
        return None;
    }
    cumulative
        .iter()
        .find(|(_, count)| *count >= 0.99 * total)
        .map(|(bound, _)| *bound)
}
