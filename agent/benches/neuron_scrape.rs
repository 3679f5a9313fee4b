//! Cost of one Neuron scrape: the collector reading a generated inf2.48xlarge-shaped sysfs tree
//! (12 devices x 2 NeuronCores) and encoding it, as /metrics does. Prints microseconds per scrape;
//! scripts/bench_neuron.sh also counts its system calls under strace.
//!
//! `cargo bench --bench neuron_scrape -- [SCRAPES]`

// The tests' tree generator; the bench uses only part of it.
#[allow(dead_code)]
#[path = "../tests/common/neuron.rs"]
mod tree;

use std::time::Instant;

use mlnode_agent::config::NeuronSettings;
use mlnode_agent::kubelet::pod_resources::SharedAssignments;
use mlnode_agent::neuron::collector::NeuronCollector;

fn main() {
    let scrapes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let tree = tree::NeuronTree::new("inf2.48xlarge", 12, 2);
    let registry = mlnode_agent::metrics::registry("bench");
    let settings = NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        ..NeuronSettings::default()
    };
    let collector = NeuronCollector::new(settings, SharedAssignments::default(), vec![], vec![])
        .expect("collector");
    registry.register(Box::new(collector)).expect("register");
    let series = mlnode_agent::metrics::encode(&registry)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    let started = Instant::now();
    let mut bytes = 0;
    for _ in 0..scrapes {
        bytes += mlnode_agent::metrics::encode(&registry).len();
    }
    let per_scrape = started.elapsed().as_secs_f64() / scrapes as f64;
    println!(
        "neuron scrape: {} devices x {} cores, {series} series, {scrapes} scrapes, {:.1} us per scrape, {} bytes per scrape",
        tree.devices,
        tree.cores,
        per_scrape * 1e6,
        bytes / scrapes
    );
}
