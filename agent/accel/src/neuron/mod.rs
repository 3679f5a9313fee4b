//! AWS Neuron devices (Inf1, Inf2, Trn1, Trn2) from the Neuron driver's sysfs tree, readable
//! without privileges, exported with neuron-monitor-prometheus's label names.
//!
//! [`sysfs`] reads the tree into plain data, discovering devices, cores, categories and counter
//! names from the directories; [`cores`] groups physical cores into the runtime's logical ones;
//! [`utilization`] turns the live tensor-engine cycle counters into a ratio; [`counters`] keeps
//! exported counters monotonic across resets; [`collector`] builds the series at scrape time.
//! docs/neuron.md says which values are live and which move only when a runtime exits.

pub mod collector;
mod cores;
pub mod health;
pub mod monitor_input;
mod monitor_names;
pub mod settings;
pub mod sysfs;
mod utilization;

use k8s_openapi::api::core::v1::Node;

use mlnode_core::assignments::SharedAssignments;
use mlnode_core::pods::PodNames;
use mlnode_core::settings::Toggle;
use mlnode_core::shared::Shared;
use settings::NeuronSettings;

/// The EC2 instance type and zone of this node, as its Node object's well-known labels say;
/// empty until read (or outside a cluster). Config values take precedence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLabels {
    pub instance_type: String,
    pub availability_zone: String,
    pub region: String,
    /// From the Node's `spec.providerID` (`aws:///<zone>/<instance id>`).
    pub instance_id: String,
}

pub type SharedNodeLabels = Shared<NodeLabels>;

impl NodeLabels {
    /// `node.kubernetes.io/instance-type` and `topology.kubernetes.io/zone`, which the kubelet
    /// sets from the cloud provider on every EKS node.
    pub fn of(node: &Node) -> NodeLabels {
        let label = |key: &str| {
            node.metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(key))
                .cloned()
                .unwrap_or_default()
        };
        let instance_id = node
            .spec
            .as_ref()
            .and_then(|spec| spec.provider_id.as_deref())
            .filter(|id| id.starts_with("aws://"))
            .and_then(|id| id.rsplit('/').next())
            .filter(|id| id.starts_with("i-"))
            .unwrap_or_default()
            .to_string();
        NodeLabels {
            instance_type: label("node.kubernetes.io/instance-type"),
            availability_zone: label("topology.kubernetes.io/zone"),
            region: label("topology.kubernetes.io/region"),
            instance_id,
        }
    }

    /// What the collector labels with: each config value, else the Node's.
    pub fn resolve(&self, settings: &NeuronSettings) -> NodeLabels {
        let pick = |configured: &str, read: &str| {
            if configured.is_empty() {
                read.to_string()
            } else {
                configured.to_string()
            }
        };
        NodeLabels {
            instance_type: pick(&settings.instance_type, &self.instance_type),
            availability_zone: pick(&settings.availability_zone, &self.availability_zone),
            ..self.clone()
        }
    }
}

/// Registers the Neuron collector, which labels each device and core by the container holding it
/// under the extended resources named (devices, cores); returns how many devices it found. Err says
/// why there is none; the agent runs on without it.
pub fn start(
    settings: &NeuronSettings,
    (device_resources, core_resources): (Vec<String>, Vec<String>),
    assignments: SharedAssignments,
    node_labels: SharedNodeLabels,
    runtimes: Option<monitor_input::SharedRuntimes>,
    pod_names: PodNames,
    registry: &prometheus::Registry,
) -> Result<usize, String> {
    if settings.enabled == Toggle::Off {
        return Err("disabled (neuron.enabled: false)".into());
    }
    let root = settings.sysfs_root.as_path();
    if !root.is_dir() {
        return Err(format!(
            "{} does not exist: no Neuron driver on this node",
            root.display()
        ));
    }
    let devices =
        sysfs::device_indexes(root).map_err(|e| format!("cannot list {}: {e}", root.display()))?;
    let collector = collector::NeuronCollector::new(
        settings.clone(),
        assignments,
        node_labels,
        runtimes,
        device_resources,
        core_resources,
        pod_names,
    )
    .map_err(|e| e.to_string())?;
    registry
        .register(Box::new(collector))
        .map_err(|e| e.to_string())?;
    Ok(devices.len())
}

/// `neuron<N>` → N.
fn index_after(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_labels_fill_what_config_leaves_empty() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ip-10-0-1-2.ec2.internal", "labels": {
                "node.kubernetes.io/instance-type": "trn2.48xlarge",
                "topology.kubernetes.io/region": "us-east-2",
                "topology.kubernetes.io/zone": "us-east-2b"}},
            "spec": {"providerID": "aws:///us-east-2b/i-0123456789abcdef0"}
        }))
        .unwrap();
        let read = NodeLabels::of(&node);
        assert_eq!(read.instance_type, "trn2.48xlarge");
        let configured = NeuronSettings {
            availability_zone: "use2-az2".into(),
            ..NeuronSettings::default()
        };
        assert_eq!(
            read.resolve(&configured),
            NodeLabels {
                instance_type: "trn2.48xlarge".into(),
                availability_zone: "use2-az2".into(),
                region: "us-east-2".into(),
                instance_id: "i-0123456789abcdef0".into(),
            },
            "config wins where set"
        );
        assert_eq!(
            NodeLabels::of(&Node::default()).resolve(&NeuronSettings::default()),
            NodeLabels::default(),
            "a node without the labels gives none"
        );
    }
}
