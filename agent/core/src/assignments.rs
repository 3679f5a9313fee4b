//! Which container holds each accelerator device: written by the kubelet's pod-resources poller,
//! read by the collectors for their series' `pod`/`namespace`/`container` labels.

use std::collections::BTreeMap;

use crate::shared::Shared;

/// The container a device is assigned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

/// (resource name, device id) → the container holding it. Device ids are only unique within a
/// resource: `aws.amazon.com/neuron` "3" is device 3, `aws.amazon.com/neuroncore` "3" is core 3.
/// Devices allocated through DRA are kept under their driver's name and their UUID
/// (`gpu.nvidia.com`, `GPU-…`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignments(BTreeMap<(String, String), Assignment>);

impl Assignments {
    /// The container holding device `id` under any of `resources`.
    pub fn find(&self, resources: &[String], id: &str) -> Option<&Assignment> {
        resources
            .iter()
            .find_map(|r| self.0.get(&(r.clone(), id.to_string())))
    }

    /// Records that `holder` holds device `id` of `resource`, unless a container already does:
    /// a shared device (time-slicing replicas, a shared DRA claim) keeps its first holder.
    pub fn assign(&mut self, resource: &str, id: &str, holder: impl FnOnce() -> Assignment) {
        self.0
            .entry((resource.to_string(), id.to_string()))
            .or_insert_with(holder);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Shared between the poller and the collectors that label by it.
pub type SharedAssignments = Shared<Assignments>;
