//! Cost of one Neuron scrape: the collector reading a sysfs tree shaped as driver 2.25 writes it
//! on an inf2.48xlarge (12 devices x 2 NeuronCores) or a trn2.48xlarge (16 devices x 8 physical
//! NeuronCores, 64 logical) and encoding it, as /metrics does. Prints microseconds per scrape;
//! scripts/bench_neuron.sh also counts its system calls under strace.
//!
//! `cargo bench --bench neuron_scrape -- [SCRAPES] [inf2.48xlarge|trn2.48xlarge]`

// The tests' tree generator; the bench uses only part of it.
use mlnode_testbed::devices::neuron_sysfs as tree;

#[path = "support/scrape.rs"]
mod scrape;

use mlnode_agent::assignments::SharedAssignments;
use mlnode_agent::neuron::collector::NeuronCollector;
use mlnode_agent::neuron::settings::NeuronSettings;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scrapes: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(500);
    let instance = match args.iter().find(|a| a.contains('.')).map(String::as_str) {
        None | Some("inf2.48xlarge") => tree::INF2_48XLARGE,
        Some("trn2.48xlarge") => tree::TRN2_48XLARGE,
        Some(other) => {
            eprintln!("neuron_scrape: unknown shape {other:?}: use inf2.48xlarge or trn2.48xlarge");
            std::process::exit(2);
        }
    };
    let tree = tree::NeuronTree::new(instance);
    let registry = mlnode_agent::metrics::registry("bench");
    let settings = NeuronSettings {
        sysfs_root: tree.root().to_path_buf(),
        class_root: tree.class_root().to_path_buf(),
        ..NeuronSettings::default()
    };
    let collector = NeuronCollector::new(
        settings,
        SharedAssignments::default(),
        Default::default(),
        None,
        vec![],
        vec![],
        Default::default(),
    )
    .expect("collector");
    registry.register(Box::new(collector)).expect("register");
    let (series, micros, bytes) = scrape::measure(&registry, scrapes);
    println!(
        "neuron scrape: {} {} devices x {} physical cores, {series} series, {scrapes} scrapes, {micros:.1} us per scrape, {bytes} bytes per scrape",
        instance.ec2_type,
        instance.devices,
        instance.chip.physical_cores(),
    );
}
