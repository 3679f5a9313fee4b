//! The Prometheus registry and the agent's own series.
//!
//! Every series carries the node's name, set once on the registry, so any series joins with
//! dcgm-exporter's by node: as `Hostname` (its released spelling), `hostname` (its main branch's,
//! dcgm-exporter #655) or both ([`NodeLabel`]). Each family of series lives next to the code
//! that produces it (`cache::metrics` for the model caches) and is registered in one place,
//! the agent's daemon.

pub mod family;

use prometheus::{IntGaugeVec, Opts, Registry};
use serde::{Deserialize, Serialize};

/// The spelling of the node's label on every series (`hostname_label`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum NodeLabel {
    /// `Hostname`, as every dcgm-exporter release so far writes it.
    #[default]
    Hostname,
    /// `hostname`, as dcgm-exporter's main branch writes it (#655) for its next release.
    #[serde(rename = "hostname")]
    Lowercase,
    /// Both, for a fleet where both spellings are queried.
    #[serde(rename = "both")]
    Both,
}

impl NodeLabel {
    pub fn names(self) -> &'static [&'static str] {
        match self {
            NodeLabel::Hostname => &["Hostname"],
            NodeLabel::Lowercase => &["hostname"],
            NodeLabel::Both => &["Hostname", "hostname"],
        }
    }
}

/// A registry whose every series is labelled `Hostname=<node_name>`.
pub fn registry(node_name: &str) -> Registry {
    registry_labelled(node_name, NodeLabel::Hostname)
}

/// A registry whose every series carries the node's name under `label`'s names.
pub fn registry_labelled(node_name: &str, label: NodeLabel) -> Registry {
    let labels = label
        .names()
        .iter()
        .map(|name| (name.to_string(), node_name.to_string()))
        .collect();
    Registry::new_custom(None, Some(labels)).expect("a constant label set is valid")
}

/// The subsystems `mlnode_collector_up{collector}` reports on (named apart from
/// `prometheus::core::Collector`, which the collectors implement); each is also its config
/// section's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subsystem {
    ModelCache,
    Nvml,
    Neuron,
    Rdma,
    Readiness,
    Startup,
    /// The SOCI snapshotter's metrics, for the startups' fetch figures (`startup.soci`).
    Soci,
    PodGates,
}

impl Subsystem {
    pub const ALL: [Subsystem; 8] = [
        Subsystem::ModelCache,
        Subsystem::Nvml,
        Subsystem::Neuron,
        Subsystem::Rdma,
        Subsystem::Readiness,
        Subsystem::Startup,
        Subsystem::Soci,
        Subsystem::PodGates,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Subsystem::ModelCache => "model_cache",
            Subsystem::Nvml => "nvml",
            Subsystem::Neuron => "neuron",
            Subsystem::Rdma => "rdma",
            Subsystem::Readiness => "readiness",
            Subsystem::Startup => "startup",
            Subsystem::Soci => "soci",
            Subsystem::PodGates => "pod_gates",
        }
    }
}

/// `mlnode_build_info` and `mlnode_collector_up`: what is running and which collectors work.
#[derive(Clone)]
pub struct AgentMetrics {
    collector_up: IntGaugeVec,
}

/// What `mlnode_build_info` says: the binary's version and the source revision it was built from.
#[derive(Clone, Copy, Debug)]
pub struct Build {
    pub version: &'static str,
    pub revision: &'static str,
}

impl AgentMetrics {
    pub fn register(registry: &Registry, build: Build) -> prometheus::Result<AgentMetrics> {
        let build_info = IntGaugeVec::new(
            Opts::new(
                "mlnode_build_info",
                "Version and source revision of the running agent; always 1.",
            ),
            &["version", "revision"],
        )?;
        build_info
            .with_label_values(&[build.version, build.revision])
            .set(1);
        registry.register(Box::new(build_info))?;
        let collector_up = IntGaugeVec::new(
            Opts::new(
                "mlnode_collector_up",
                "1 when the collector works, 0 when it is failing or absent.",
            ),
            &["collector"],
        )?;
        registry.register(Box::new(collector_up.clone()))?;
        Ok(AgentMetrics { collector_up })
    }

    pub fn set_up(&self, collector: Subsystem, up: bool) {
        self.collector_up
            .with_label_values(&[collector.as_str()])
            .set(i64::from(up));
    }
}

/// The text exposition of everything registered.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut out) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    out
}
