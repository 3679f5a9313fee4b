//! Where each configured model's cache is, as the node's pods see it: what names the model a pod
//! serves when its annotation does not, and which of a pod's volumes expose a cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};

/// The annotation a pod names the model it serves with: a model name from this node's config.
pub const MODEL_ANNOTATION: &str = "mlnode.dev/model";
/// The revision a pod requires of it, optionally (a commit, or an abbreviation of one).
pub const REVISION_ANNOTATION: &str = "mlnode.dev/model-revision";
/// The startup tracker's spelling before the readiness gate (docs/startup.md), still read so that
/// pods annotated for it keep their `model_name`.
const EARLIER_MODEL_ANNOTATION: &str = "mlnode.dev/model-name";

/// One configured model, as pods mount it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelMount {
    pub name: String,
    /// The cache inside the agent's container (the model's `root`).
    pub root: PathBuf,
    /// The cache on the node, when set (`host_path`) or derived from the agent's own hostPath
    /// mount ([`ModelMount::derive_host_path`]).
    pub host_path: Option<PathBuf>,
    /// The PersistentVolumeClaim pods mount the cache from, if they do.
    pub pvc: Option<String>,
}

impl ModelMount {
    /// The cache's path on the node: as set or derived, else `root` (the agent mounts the cache at
    /// the node's own path).
    pub fn node_path(&self) -> &Path {
        self.host_path.as_deref().unwrap_or(&self.root)
    }

    /// Fills in an unset `host_path` from the agent's own pod: the hostPath volume its containers
    /// mount `root` from (the deepest mount above `root`), with the mount's `subPath` and the rest
    /// of `root` below it. Leaves it unset when that mount is not a hostPath.
    pub fn derive_host_path(&mut self, own_pod: &Pod) {
        if self.host_path.is_some() {
            return;
        }
        let Some(spec) = own_pod.spec.as_ref() else {
            return;
        };
        let mount = spec
            .containers
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .filter(|m| self.root.starts_with(&m.mount_path))
            .max_by_key(|m| Path::new(&m.mount_path).components().count());
        let Some(mount) = mount else {
            return;
        };
        let host = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.host_path.as_ref());
        if let (Some(host), Ok(below)) = (host, self.root.strip_prefix(&mount.mount_path)) {
            let mut path = PathBuf::from(&host.path);
            path.extend(mount.sub_path.as_deref().filter(|s| !s.is_empty()));
            self.host_path = Some(path.join(below));
        }
    }

    /// Whether `volume` gives a pod this model's cache: a hostPath at, above or below it (a
    /// parent directory exposes the cache as much as the cache itself), or the model's PVC.
    pub fn is_exposed_by(&self, volume: &Volume) -> bool {
        let host = self.node_path();
        let by_host_path = volume.host_path.as_ref().is_some_and(|h| {
            let mounted = Path::new(&h.path);
            host.starts_with(mounted) || mounted.starts_with(host)
        });
        let by_claim = volume
            .persistent_volume_claim
            .as_ref()
            .is_some_and(|c| self.pvc.as_deref() == Some(c.claim_name.as_str()));
        by_host_path || by_claim
    }
}

/// The agent's own pod, from the downward API (`POD_NAMESPACE`, `POD_NAME`): where a model's host
/// path is derived from.
#[derive(Clone, Debug)]
pub struct OwnPod {
    pub namespace: String,
    pub name: String,
}

impl OwnPod {
    /// The agent's own pod, as the DaemonSet passes it through the downward API.
    pub fn from_env() -> Option<OwnPod> {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        Some(OwnPod {
            namespace: var("POD_NAMESPACE")?,
            name: var("POD_NAME")?,
        })
    }
}

/// Derives, once, the host path of each model that sets none from the agent's own pod, when the
/// node's pods first show it: every user of the node's pods that matches a pod to a model by its
/// volumes (the pod gates, the startup tracker) needs the cache's path on the node.
#[derive(Debug)]
pub struct HostPaths {
    /// The agent's own pod, until the paths are derived from it.
    pending: Option<OwnPod>,
}

impl HostPaths {
    pub fn new(own_pod: Option<OwnPod>) -> HostPaths {
        HostPaths { pending: own_pod }
    }

    /// Fills in `mounts`' unset host paths from the agent's own pod among `pods`; true the one
    /// time it does.
    pub fn derive(&mut self, mounts: &mut [ModelMount], pods: &[Arc<Pod>]) -> bool {
        let Some(own) = &self.pending else {
            return false;
        };
        let found = pods.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(own.namespace.as_str())
                && p.metadata.name.as_deref() == Some(own.name.as_str())
        });
        let Some(pod) = found else { return false };
        for mount in mounts {
            mount.derive_host_path(pod);
        }
        self.pending = None;
        true
    }
}

/// The model a pod names by annotation ([`MODEL_ANNOTATION`], or its earlier spelling).
pub fn annotated_model(pod: &Pod) -> Option<&str> {
    let annotations = pod.metadata.annotations.as_ref()?;
    annotations
        .get(MODEL_ANNOTATION)
        .or_else(|| annotations.get(EARLIER_MODEL_ANNOTATION))
        .map(String::as_str)
}

/// The model a pod serves: its annotation, else the first configured model whose cache one of its
/// volumes mounts.
pub fn model_of(pod: &Pod, models: &[ModelMount]) -> Option<String> {
    if let Some(name) = annotated_model(pod) {
        return Some(name.to_string());
    }
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    models
        .iter()
        .find(|m| volumes.iter().any(|v| m.is_exposed_by(v)))
        .map(|m| m.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mount(root: &str, host_path: Option<&str>) -> ModelMount {
        ModelMount {
            name: "llama".into(),
            root: root.into(),
            host_path: host_path.map(PathBuf::from),
            pvc: None,
        }
    }

    /// The agent's pod as the base DaemonSet (deploy/daemonset/base/daemonset.yaml) makes it.
    fn agent_pod(models_mount: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "mlnode-agent-x7k2p", "namespace": "mlnode-system"},
            "spec": {"nodeName": "n", "containers": [{"name": "agent", "image": "i", "volumeMounts": [
                {"name": "config", "mountPath": "/etc/mlnode", "readOnly": true},
                models_mount,
            ]}], "volumes": [
                {"name": "config", "configMap": {"name": "mlnode-agent-config"}},
                {"name": "models", "hostPath": {"path": "/var/lib/models", "type": "DirectoryOrCreate"}},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn the_host_path_is_derived_from_the_agents_own_hostpath_mount() {
        let pod = agent_pod(json!({"name": "models", "mountPath": "/models", "readOnly": true}));
        let mut llama = mount("/models/llama-3.1-8b", None);
        llama.derive_host_path(&pod);
        assert_eq!(llama.node_path(), Path::new("/var/lib/models/llama-3.1-8b"));

        let with_sub_path = agent_pod(
            json!({"name": "models", "mountPath": "/models", "subPath": "hf", "readOnly": true}),
        );
        let mut hf = mount("/models/hub/models--x", None);
        hf.derive_host_path(&with_sub_path);
        assert_eq!(
            hf.node_path(),
            Path::new("/var/lib/models/hf/hub/models--x")
        );

        let mut set = mount("/models/llama", Some("/data/llama"));
        set.derive_host_path(&pod);
        assert_eq!(set.node_path(), Path::new("/data/llama"), "a setting wins");

        let mut outside = mount("/srv/llama", None);
        outside.derive_host_path(&pod);
        assert_eq!(outside.host_path, None, "not under a mount: root it is");
        let mut config_map = mount("/etc/mlnode/llama", None);
        config_map.derive_host_path(&pod);
        assert_eq!(config_map.host_path, None, "not a hostPath volume");
    }

    #[test]
    fn host_paths_are_derived_once_the_agents_own_pod_is_among_the_nodes() {
        let own = OwnPod {
            namespace: "mlnode-system".into(),
            name: "mlnode-agent-x7k2p".into(),
        };
        let mut host_paths = HostPaths::new(Some(own));
        let mut mounts = vec![mount("/models/llama-3.1-8b", None)];
        let other: Pod = serde_json::from_value(
            json!({"metadata": {"name": "vllm-0", "namespace": "inference"}}),
        )
        .unwrap();
        assert!(!host_paths.derive(&mut mounts, &[Arc::new(other.clone())]));
        assert_eq!(mounts[0].host_path, None, "not before its own pod is seen");
        let agent = Arc::new(agent_pod(
            json!({"name": "models", "mountPath": "/models", "readOnly": true}),
        ));
        assert!(host_paths.derive(&mut mounts, &[Arc::new(other), agent.clone()]));
        assert_eq!(
            mounts[0].node_path(),
            Path::new("/var/lib/models/llama-3.1-8b")
        );
        assert!(!host_paths.derive(&mut mounts, &[agent]), "once");

        let mut unknown = HostPaths::new(None);
        let mut mounts = vec![mount("/models/llama-3.1-8b", None)];
        assert!(!unknown.derive(&mut mounts, &[]));
        assert_eq!(mounts[0].node_path(), Path::new("/models/llama-3.1-8b"));
    }

    #[test]
    fn a_volume_at_above_or_below_the_cache_exposes_it() {
        let llama = ModelMount {
            pvc: Some("models".into()),
            ..mount("/models/llama", Some("/var/lib/models/llama"))
        };
        let volume = |v: serde_json::Value| -> Volume { serde_json::from_value(v).unwrap() };
        for path in [
            "/var/lib/models/llama",
            "/var/lib/models",
            "/var/lib/models/llama/snapshots",
        ] {
            assert!(
                llama.is_exposed_by(&volume(json!({"name": "m", "hostPath": {"path": path}}))),
                "{path}"
            );
        }
        assert!(!llama.is_exposed_by(&volume(
            json!({"name": "m", "hostPath": {"path": "/var/lib/models/mistral"}})
        )));
        assert!(llama.is_exposed_by(&volume(
            json!({"name": "m", "persistentVolumeClaim": {"claimName": "models"}})
        )));
        assert!(!llama.is_exposed_by(&volume(json!({"name": "m", "emptyDir": {}}))));
    }
}
