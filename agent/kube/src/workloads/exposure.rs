//! Which of a pod's mounts could write a model cache: verification is worth little if the pod
//! serving from a cache can change it. A mount is writable unless its `volumeMounts` entry or (for
//! a PVC) its volume says `readOnly: true`; a hostPath volume has no read-only switch of its own.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::models::ModelMount;

/// One container mounting one model's cache writable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritableMount {
    pub model: String,
    pub container: String,
    pub volume: String,
    pub mount_path: String,
}

/// Every writable mount of a configured model's cache in `pod`, init containers included (a
/// downloader in an init container writes the cache the main container then serves).
pub fn writable_mounts(pod: &Pod, models: &[ModelMount]) -> Vec<WritableMount> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let mut found = Vec::new();
    for container in containers {
        for mount in container.volume_mounts.iter().flatten() {
            if mount.read_only == Some(true) {
                continue;
            }
            let Some(volume) = volumes.iter().find(|v| v.name == mount.name) else {
                continue;
            };
            let claim_read_only = volume
                .persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.read_only == Some(true));
            if claim_read_only {
                continue;
            }
            for model in models.iter().filter(|m| m.is_exposed_by(volume)) {
                found.push(WritableMount {
                    model: model.name.clone(),
                    container: container.name.clone(),
                    volume: volume.name.clone(),
                    mount_path: mount.mount_path.clone(),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;

    fn models() -> Vec<ModelMount> {
        vec![ModelMount {
            name: "llama".into(),
            root: "/models/llama".into(),
            host_path: Some(PathBuf::from("/var/lib/models/llama")),
            pvc: Some("model-cache".into()),
        }]
    }

    /// A vLLM pod with a downloader init container, as the vLLM production stack's Helm chart lays
    /// one out: the same volume in both, mounted as each container's `volumeMounts` entry says.
    fn pod(
        init_read_only: Option<bool>,
        main_read_only: Option<bool>,
        volume: serde_json::Value,
    ) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "vllm-0", "namespace": "inference", "uid": "u1"},
            "spec": {
                "initContainers": [{"name": "download", "image": "python:3.12", "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": init_read_only}]}],
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "volumeMounts": [
                    {"name": "models", "mountPath": "/models", "readOnly": main_read_only},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ]}],
                "volumes": [volume, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
            },
        }))
        .unwrap()
    }

    fn host_path(path: &str) -> serde_json::Value {
        json!({"name": "models", "hostPath": {"path": path, "type": "Directory"}})
    }

    #[test]
    fn unset_or_false_is_writable_true_is_not() {
        let found = writable_mounts(
            &pod(None, Some(false), host_path("/var/lib/models")),
            &models(),
        );
        let containers: Vec<&str> = found.iter().map(|m| m.container.as_str()).collect();
        assert_eq!(containers, ["download", "vllm"]);
        assert_eq!(found[0].model, "llama");
        assert_eq!(found[0].mount_path, "/models");
        assert!(writable_mounts(
            &pod(Some(true), Some(true), host_path("/var/lib/models")),
            &models()
        )
        .is_empty());
        assert!(
            writable_mounts(&pod(None, None, host_path("/var/lib/other")), &models()).is_empty(),
            "another directory: not the cache"
        );
    }

    #[test]
    fn a_read_only_claim_is_read_only_whatever_the_mount_says() {
        let claim = |read_only: bool| json!({"name": "models", "persistentVolumeClaim": {"claimName": "model-cache", "readOnly": read_only}});
        assert!(writable_mounts(&pod(None, None, claim(true)), &models()).is_empty());
        assert_eq!(
            writable_mounts(&pod(Some(true), None, claim(false)), &models()).len(),
            1
        );
    }
}
