//! One scrape's cost, as /metrics pays it: the registry encoded in the exposition format.

use std::time::Instant;

/// (series, microseconds per scrape, bytes per scrape) of `registry` over `scrapes` encodings.
pub fn measure(registry: &prometheus::Registry, scrapes: usize) -> (usize, f64, usize) {
    let series = mlnode_agent::metrics::encode(registry)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    let started = Instant::now();
    let mut bytes = 0;
    for _ in 0..scrapes {
        bytes += mlnode_agent::metrics::encode(registry).len();
    }
    let micros = started.elapsed().as_secs_f64() * 1e6 / scrapes as f64;
    (series, micros, bytes / scrapes)
}
