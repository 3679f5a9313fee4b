//! Which container holds each accelerator device: written by the kubelet's pod-resources poller,
//! read by the collectors for their series' `pod`/`namespace`/`container` labels.

use std::collections::BTreeMap;

use crate::shared::Shared;

/// The container a device is assigned to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
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
pub struct Assignments {
    first: BTreeMap<(String, String), Assignment>,
    /// The replica of a shared device each container holds (time-slicing and MPS hand out
    /// `<uuid>::<n>`): (device id, holder) → `n`.
    replicas: BTreeMap<(String, Assignment), String>,
}

impl Assignments {
    /// The container holding device `id` under any of `resources`.
    pub fn find(&self, resources: &[String], id: &str) -> Option<&Assignment> {
        resources
            .iter()
            .find_map(|r| self.first.get(&(r.clone(), id.to_string())))
    }

    /// The devices held under any of `resources` (as the poller keeps them: under the pattern
    /// that named them), by id.
    pub fn of<'a>(
        &'a self,
        resources: &'a [String],
    ) -> impl Iterator<Item = (&'a str, &'a Assignment)> + 'a {
        self.first
            .iter()
            .filter(|((resource, _), _)| resources.contains(resource))
            .map(|((_, id), holder)| (id.as_str(), holder))
    }

    /// Every container holding a device under any of `resources`, a shared device's replica
    /// holders with its first: (device id, holder), a holder of several replicas once for each.
    pub fn every_holder<'a>(
        &'a self,
        resources: &'a [String],
    ) -> impl Iterator<Item = (&'a str, &'a Assignment)> + 'a {
        self.of(resources).flat_map(move |(id, first)| {
            let replicas = self
                .replicas
                .keys()
                .filter(move |(device, holder)| device == id && holder != first)
                .map(|(_, holder)| holder);
            std::iter::once(first).chain(replicas).map(move |h| (id, h))
        })
    }

    /// Records that `holder` holds replica `replica` of the shared device `id`.
    pub fn assign_replica(&mut self, id: &str, replica: &str, holder: Assignment) {
        self.replicas
            .insert((id.to_string(), holder), replica.to_string());
    }

    /// Whether device `id` is shared: the kubelet gave out replicas of it.
    pub fn is_shared(&self, id: &str) -> bool {
        self.replicas.keys().any(|(device, _)| device == id)
    }

    /// The holders of replicas of device `id`, with the replica each holds.
    pub fn holders(&self, id: &str) -> Vec<(&Assignment, &str)> {
        self.replicas
            .iter()
            .filter(|((device, _), _)| device == id)
            .map(|((_, holder), replica)| (holder, replica.as_str()))
            .collect()
    }

    /// The replica of device `id` that `holder` holds, if it holds one (`::<n>`).
    pub fn replica(&self, id: &str, holder: &Assignment) -> Option<&str> {
        self.replicas
            .get(&(id.to_string(), holder.clone()))
            .map(String::as_str)
    }

    /// Records that `holder` holds device `id` of `resource`, unless a container already does:
    /// a shared device (time-slicing replicas, a shared DRA claim) keeps its first holder.
    pub fn assign(&mut self, resource: &str, id: &str, holder: impl FnOnce() -> Assignment) {
        self.first
            .entry((resource.to_string(), id.to_string()))
            .or_insert_with(holder);
    }

    pub fn len(&self) -> usize {
        self.first.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }
}

/// Shared between the poller and the collectors that label by it.
pub type SharedAssignments = Shared<Assignments>;
