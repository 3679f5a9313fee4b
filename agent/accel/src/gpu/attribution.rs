//! A shared GPU's use per container: its processes (NVML) grouped by the container their cgroup
//! names, the container named by the pod the API server describes. Pure: the readings, the pods
//! and the kubelet's assignments in, one row per container out.

use std::collections::BTreeMap;

use super::GpuProcess;
use mlnode_core::assignments::{Assignment, Assignments};
use mlnode_core::cgroup::CgroupOwner;
use mlnode_core::pods::PodDirectory;

/// One container's use of a GPU or MIG device. Empty names: a process no pod owns (the node's
/// own), or of a pod the agent has not seen described.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerUse {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub pod_uid: String,
    /// The replica of the device the kubelet gave the container (`<uuid>::<n>` under
    /// time-slicing or MPS), as dcgm-exporter's `vgpu` label names it.
    pub vgpu: Option<String>,
    /// Framebuffer bytes its processes hold; None when NVML could tell for none of them.
    pub memory_bytes: Option<u64>,
    /// Its processes' SM use, 0-1 of the device; None where NVML gives no per-process use.
    pub sm_ratio: Option<f64>,
}

/// The use of device `device_id` (a `GPU-` or `MIG-` UUID) per container, from its processes. A
/// process whose owner cannot be told (it exited, an unknown cgroup form) is left out, counted
/// where it was read: never given to a wrong pod.
pub fn per_container(
    processes: &[GpuProcess],
    device_id: &str,
    pods: &PodDirectory,
    assignments: &Assignments,
) -> Vec<ContainerUse> {
    let mut rows: BTreeMap<(String, String, String, String), ContainerUse> = BTreeMap::new();
    for process in processes {
        let Ok(owner) = &process.owner else { continue };
        let (pod_uid, container_id) = match owner {
            CgroupOwner::Container {
                pod_uid,
                container_id,
            } => (pod_uid.as_str(), Some(container_id.as_str())),
            CgroupOwner::Pod { pod_uid } => (pod_uid.as_str(), None),
            CgroupOwner::NoPod => ("", None),
        };
        let identity = pods.get(pod_uid);
        let holder = Assignment {
            namespace: identity.map(|p| p.namespace.clone()).unwrap_or_default(),
            pod: identity.map(|p| p.name.clone()).unwrap_or_default(),
            container: identity
                .zip(container_id)
                .and_then(|(p, id)| p.containers.get(id).cloned())
                .unwrap_or_default(),
        };
        let key = (
            holder.namespace.clone(),
            holder.pod.clone(),
            holder.container.clone(),
            pod_uid.to_string(),
        );
        let row = rows.entry(key).or_insert_with(|| ContainerUse {
            vgpu: assignments.replica(device_id, &holder).map(str::to_string),
            namespace: holder.namespace,
            pod: holder.pod,
            container: holder.container,
            pod_uid: pod_uid.to_string(),
            memory_bytes: None,
            sm_ratio: process.sm_ratio.map(|_| 0.0),
        });
        if let Some(bytes) = process.memory_bytes {
            *row.memory_bytes.get_or_insert(0) += bytes;
        }
        if let (Some(sum), Some(ratio)) = (row.sm_ratio.as_mut(), process.sm_ratio) {
            *sum = (*sum + ratio).min(1.0);
        }
    }
    rows.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlnode_core::pods::PodIdentity;

    const UID_A: &str = "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b";
    const UID_B: &str = "5d0e2a1b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn process(
        pid: u32,
        owner: Result<CgroupOwner, &'static str>,
        mib: u64,
        sm: f64,
    ) -> GpuProcess {
        GpuProcess {
            pid,
            memory_bytes: Some(mib << 20),
            sm_ratio: Some(sm),
            owner,
        }
    }

    fn in_container(uid: &str, id: &str) -> Result<CgroupOwner, &'static str> {
        Ok(CgroupOwner::Container {
            pod_uid: uid.into(),
            container_id: id.into(),
        })
    }

    fn pods() -> PodDirectory {
        PodDirectory::from_pods([PodIdentity {
            namespace: "inference".into(),
            name: "vllm-0".into(),
            uid: UID_A.into(),
            containers: [("aaaa".to_string(), "vllm".to_string())].into(),
            labels: Default::default(),
        }])
    }

    #[test]
    fn a_containers_processes_are_summed_and_named_by_its_pod() {
        let mut assignments = Assignments::default();
        let holder = Assignment {
            pod: "vllm-0".into(),
            namespace: "inference".into(),
            container: "vllm".into(),
        };
        assignments.assign_replica("GPU-1", "2", holder);
        let rows = per_container(
            &[
                process(10, in_container(UID_A, "aaaa"), 1000, 0.25),
                process(11, in_container(UID_A, "aaaa"), 500, 0.5),
                process(12, Ok(CgroupOwner::NoPod), 100, 0.0),
                process(13, in_container(UID_B, "bbbb"), 200, 0.1),
                process(14, Err("process_exited"), 9999, 0.9),
            ],
            "GPU-1",
            &pods(),
            &assignments,
        );
        let named = rows.iter().find(|r| r.pod == "vllm-0").unwrap();
        assert_eq!(named.container, "vllm");
        assert_eq!(named.memory_bytes, Some(1500 << 20));
        assert_eq!(named.sm_ratio, Some(0.75));
        assert_eq!(named.vgpu.as_deref(), Some("2"));
        let node = rows.iter().find(|r| r.pod_uid.is_empty()).unwrap();
        assert_eq!(
            (node.pod.as_str(), node.memory_bytes),
            ("", Some(100 << 20)),
            "the node's own process: empty labels, not dropped"
        );
        let unknown = rows.iter().find(|r| r.pod_uid == UID_B).unwrap();
        assert_eq!(unknown.pod, "", "a pod the agent has not seen is not named");
        assert_eq!(rows.len(), 3, "the exited process is left out: {rows:?}");
    }

    #[test]
    fn without_per_process_utilisation_the_ratio_is_absent() {
        let mut p = process(10, in_container(UID_A, "aaaa"), 1, 0.0);
        p.sm_ratio = None;
        let rows = per_container(&[p], "MIG-1", &pods(), &Assignments::default());
        assert_eq!(rows[0].sm_ratio, None);
        assert_eq!(rows[0].vgpu, None);
    }
}
