//! Which container holds which RDMA device, from the kubelet's pod-resources answer.
//!
//! Two kinds of device plugin hand out RDMA devices:
//! * one device per id (aws-efa-k8s-device-plugin's `vpc.amazonaws.com/efa`,
//!   `kubelet.rdma_resource_names`). The id's spelling is the plugin's and is not documented; the
//!   agent resolves it against every name the node gives the device (the RDMA device, its
//!   `uverbs` character device, its PCI function) and counts an id that names none, rather than
//!   guess a format;
//! * a shared pool (Mellanox's k8s-rdma-shared-dev-plugin, `kubelet.rdma_shared_resource_names`),
//!   whose ids are slot numbers `0..rdmaHcaMax` (its `pkg/resources/server.go`) and whose every
//!   container gets every device of the pool's selectors. The agent does not read the plugin's
//!   selectors: a holder is attributed every RDMA device of the node.

use std::collections::{BTreeMap, BTreeSet};

use super::sysfs::Device;
use mlnode_core::assignments::{Assignment, Assignments};

/// The devices each holder holds, and the ids that named no device here.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    pub held: BTreeSet<(Assignment, String)>,
    pub unresolved: BTreeSet<String>,
}

/// Resolves the assignments of the RDMA resources against `devices`; `uverbs` maps a `uverbs<N>`
/// name to its RDMA device (the kernel's `/sys/class/infiniband_verbs/uverbs<N>/ibdev`).
pub fn attribute(
    devices: &[Device],
    assignments: &Assignments,
    exclusive: &[String],
    shared: &[String],
    uverbs: &BTreeMap<String, String>,
) -> Attribution {
    let mut out = Attribution::default();
    for (id, holder) in assignments.of(exclusive) {
        let named = devices.iter().find(|d| {
            d.name == id
                || d.pci_bus_id.as_deref() == Some(id)
                || uverbs.get(id).is_some_and(|name| *name == d.name)
        });
        match named {
            Some(device) => {
                out.held.insert((holder.clone(), device.name.clone()));
            }
            None => {
                out.unresolved.insert(id.to_string());
            }
        }
    }
    for (_, holder) in assignments.of(shared) {
        out.held
            .extend(devices.iter().map(|d| (holder.clone(), d.name.clone())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, pci: &str) -> Device {
        Device {
            name: name.into(),
            pci_bus_id: Some(pci.into()),
            ..Device::default()
        }
    }

    fn holder(pod: &str) -> Assignment {
        Assignment {
            pod: pod.into(),
            namespace: "inference".into(),
            container: "vllm".into(),
        }
    }

    /// An id is taken for whichever of the device's names it spells; one spelling none is counted,
    /// never matched by a guess. A shared pool's holders hold every device.
    #[test]
    fn ids_resolve_by_any_name_of_the_device_and_a_pool_gives_all() {
        let devices = [
            device("rdmap16s27", "0000:10:1b.0"),
            device("rdmap32s27", "0000:20:1b.0"),
            device("mlx5_0", "0000:c1:00.0"),
        ];
        let efa = vec!["vpc.amazonaws.com/efa".to_string()];
        let pool = vec!["rdma/hca_shared_devices_a".to_string()];
        let mut assignments = Assignments::default();
        assignments.assign(&efa[0], "rdmap16s27", || holder("prefill-0"));
        assignments.assign(&efa[0], "0000:20:1b.0", || holder("decode-0"));
        assignments.assign(&efa[0], "uverbs2", || holder("decode-1"));
        assignments.assign(&efa[0], "efa-7", || holder("decode-2"));
        assignments.assign(&pool[0], "0", || holder("ib-job-0"));
        assignments.assign("nvidia.com/gpu", "rdmap32s27", || holder("not-rdma"));
        let uverbs = BTreeMap::from([("uverbs2".to_string(), "mlx5_0".to_string())]);
        let found = attribute(&devices, &assignments, &efa, &pool, &uverbs);
        let held: Vec<(&str, &str)> = found
            .held
            .iter()
            .map(|(h, d)| (h.pod.as_str(), d.as_str()))
            .collect();
        assert_eq!(
            held,
            [
                ("decode-0", "rdmap32s27"),
                ("decode-1", "mlx5_0"),
                ("ib-job-0", "mlx5_0"),
                ("ib-job-0", "rdmap16s27"),
                ("ib-job-0", "rdmap32s27"),
                ("prefill-0", "rdmap16s27"),
            ]
        );
        assert_eq!(found.unresolved, ["efa-7".to_string()].into());
    }
}
