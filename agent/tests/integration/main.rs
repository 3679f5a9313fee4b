//! The integration tests of the agent, one binary: the agent run as users run it (its command line,
//! its HTTP server, the manifests as kustomize renders them, a container as the kubelet would start
//! it) against fakes shaped like the real components, and the real ones where users have them
//! (Prometheus, promtool, kubectl, the dashboards' schema). What they stand up is the
//! mlnode-testbed crate (agent/testbed).

mod admission_policy;
mod alerts;
mod api_budget;
mod architecture;
mod as_deployed;
mod cli;
mod cluster_agent;
mod cluster_install;
mod dashboards;
mod dcgm_dashboard;
mod deploy;
mod exposition;
mod fleet;
mod fuzz;
mod gpu;
mod helm;
mod kernel_log;
mod metrics_doc;
mod neuron;
mod neuron_monitor;
mod node_runtime;
mod nvidia_mocks;
mod pod_gates;
mod process_attribution;
mod rdma;
mod readiness;
mod readme_install;
mod real_node;
mod repair_engines;
mod restart;
mod scrape;
mod serve;
mod startup;
mod verify;
