//! A real Prometheus (Debian's `prometheus`, installed by the test command) scrapes the running
//! agent on loopback: the exposition must be accepted (`up == 1`) and the series queryable.

use mlnode_testbed as testbed;
use testbed::agent::{model_config, Agent};
use testbed::models::PlainModel;
use testbed::prometheus::{start_prometheus, wait_query};

#[test]
fn prometheus_scrapes_the_agent() {
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = Agent::start(&model_config("llama-3.1-8b", model.root(), &manifest));
    let prometheus = start_prometheus(&[("mlnode", agent.port())]);

    let up = wait_query(prometheus.port, "up{job=\"mlnode\"} == 1");
    assert_eq!(up[0]["value"][1], "1");
    let verified = wait_query(prometheus.port, "mlnode_model_cache_verified == 1");
    let metric = &verified[0]["metric"];
    assert_eq!(metric["model_name"], "llama-3.1-8b");
    assert_eq!(metric["revision"], "v1");
    assert_eq!(metric["Hostname"], "test-node");
    // A DCGM-style join by node works on the Hostname label.
    wait_query(
        prometheus.port,
        "mlnode_model_cache_verified * on(Hostname) group_left(version) mlnode_build_info",
    );
    // Prometheus kept every sample of the scrape (a malformed exposition would fail it whole).
    let samples = wait_query(
        prometheus.port,
        "scrape_samples_post_metric_relabeling{job=\"mlnode\"}",
    );
    assert!(
        samples[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 20.0
    );
}
