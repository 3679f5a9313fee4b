//! The pods on this node as the API server describes them, by UID: written by the one watch of the
//! node's pods, read by whatever names a process's or a device's pod (the GPU series' pod labels
//! for a process, from its cgroup).

use std::collections::BTreeMap;

use crate::shared::Shared;

/// What names a pod and its containers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Each container's runtime id (the API's `containerStatuses[].containerID` after its
    /// `<runtime>://`), to its name; init and ephemeral containers too.
    pub containers: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDirectory(BTreeMap<String, PodIdentity>);

impl PodDirectory {
    pub fn from_pods(pods: impl IntoIterator<Item = PodIdentity>) -> PodDirectory {
        PodDirectory(pods.into_iter().map(|p| (p.uid.clone(), p)).collect())
    }

    pub fn insert(&mut self, pod: PodIdentity) {
        self.0.insert(pod.uid.clone(), pod);
    }

    pub fn remove(&mut self, uid: &str) {
        self.0.remove(uid);
    }

    pub fn get(&self, uid: &str) -> Option<&PodIdentity> {
        self.0.get(uid)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

pub type SharedPods = Shared<PodDirectory>;
