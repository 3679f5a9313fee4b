//! Which pod and container a process belongs to, from its `/proc/<pid>/cgroup`: the kubelet puts
//! each pod in a cgroup named after its UID, and the container runtime each container in one named
//! after the container's id, under it. Pure: the text in, the owner out.
//!
//! The forms, from their sources:
//! - the kubelet's cgroup names (kubernetes `pkg/kubelet/cm/pod_container_manager_linux.go`:
//!   `pod<uid>` under `kubepods`, `kubepods/burstable` or `kubepods/besteffort`), written by the
//!   cgroupfs driver as `/kubepods/burstable/pod<uid>` and by the systemd driver as
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice` with the UID's
//!   `-` escaped as `_` (`pkg/kubelet/cm/cgroup_manager_linux.go`, `ToSystemd` and
//!   `escapeSystemdCgroupName`);
//! - the container's cgroup under it: its 64-hex id with cgroupfs; with systemd a scope named by
//!   the runtime: `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` (CRI-O, whose
//!   `crio-conmon-<id>.scope` is the monitor process, not the container), `docker-<id>.scope`
//!   (cri-dockerd);
//! - the file itself (cgroups(7)): one `hierarchy-ID:controllers:path` line per v1 hierarchy, or
//!   the single `0::path` of cgroup v2. Paths are relative to the reader's cgroup namespace, so a
//!   containerised reader sees `/../../kubepods.slice/...`: the components are matched wherever
//!   they are, not from the root.

/// Who a process belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CgroupOwner {
    /// A pod's container: the pod's UID and the container's runtime id (as the API's
    /// `containerStatuses[].containerID` ends, after `containerd://`).
    Container {
        pod_uid: String,
        container_id: String,
    },
    /// In a pod's cgroup, but not in a container's of a known form.
    Pod { pod_uid: String },
    /// No pod: a process of the node itself.
    NoPod,
}

/// Why an owner cannot be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CgroupTrouble {
    /// Under `kubepods`, but the pod's cgroup is of no form above.
    UnknownForm,
}

impl CgroupTrouble {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupTrouble::UnknownForm => "cgroup_unknown_form",
        }
    }
}

/// The owner of the process whose `/proc/<pid>/cgroup` is `text`.
pub fn owner(text: &str) -> Result<CgroupOwner, CgroupTrouble> {
    let mut under_kubepods = false;
    for line in text.lines() {
        // `hierarchy-ID:controllers:path`; the path may itself hold ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let components: Vec<&str> = path.split('/').collect();
        under_kubepods |= components.iter().any(|c| c.starts_with("kubepods"));
        if let Some(at) = components.iter().position(|c| pod_uid(c).is_some()) {
            let pod_uid = pod_uid(components[at]).unwrap_or_default();
            return Ok(match components.get(at + 1).and_then(|c| container_id(c)) {
                Some(container_id) => CgroupOwner::Container {
                    pod_uid,
                    container_id,
                },
                None => CgroupOwner::Pod { pod_uid },
            });
        }
    }
    if under_kubepods {
        Err(CgroupTrouble::UnknownForm)
    } else {
        Ok(CgroupOwner::NoPod)
    }
}

/// The pod UID a cgroup component names: `pod<uid>` (cgroupfs) or
/// `kubepods[-<qos>]-pod<uid with _>.slice` (systemd).
fn pod_uid(component: &str) -> Option<String> {
    let name = match component.strip_suffix(".slice") {
        Some(slice) if slice.starts_with("kubepods") => slice.rsplit_once("-pod")?.1,
        Some(_) => return None,
        None => component.strip_prefix("pod")?,
    };
    let uid = name.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A UID as the API server writes it: 8-4-4-4-12 hex digits.
fn is_uid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The container id a cgroup component names.
fn container_id(component: &str) -> Option<String> {
    let id = match component.strip_suffix(".scope") {
        Some(scope) => ["cri-containerd-", "crio-", "docker-"]
            .iter()
            .find_map(|prefix| scope.strip_prefix(prefix))?,
        None => component,
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b";
    const ID: &str = "0b2f6c1d9e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c";

    fn container() -> CgroupOwner {
        CgroupOwner::Container {
            pod_uid: UID.into(),
            container_id: ID.into(),
        }
    }

    #[test]
    fn cgroup_v2_with_the_systemd_driver_and_containerd() {
        let text = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n", UID.replace('-', "_"));
        assert_eq!(owner(&text), Ok(container()));
    }

    #[test]
    fn a_guaranteed_pod_with_cri_o_seen_from_the_agents_own_cgroup_namespace() {
        // Guaranteed pods sit directly under kubepods (no QoS slice).
        let text = format!(
            "0::/../../kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(owner(&text), Ok(container()));
        let conmon = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(
            owner(&conmon),
            Ok(CgroupOwner::Pod {
                pod_uid: UID.into()
            })
        );
    }

    #[test]
    fn cgroup_v1_with_the_cgroupfs_driver() {
        let text = format!(
            "12:pids:/kubepods/besteffort/pod{UID}/{ID}\n11:memory:/kubepods/besteffort/pod{UID}/{ID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{ID}\n"
        );
        assert_eq!(owner(&text), Ok(container()));
    }

    #[test]
    fn a_process_of_the_node_is_no_pods_and_an_unknown_form_is_told() {
        assert_eq!(
            owner("0::/system.slice/containerd.service\n"),
            Ok(CgroupOwner::NoPod)
        );
        assert_eq!(owner(""), Ok(CgroupOwner::NoPod));
        assert_eq!(
            owner("0::/kubepods.slice/kubepods-burstable.slice/something-else.slice\n"),
            Err(CgroupTrouble::UnknownForm)
        );
        // A UID cut short is not a pod's.
        assert_eq!(
            owner("0::/kubepods/burstable/pod3f9a1c2e-7b4d/abc\n"),
            Err(CgroupTrouble::UnknownForm)
        );
    }
}
