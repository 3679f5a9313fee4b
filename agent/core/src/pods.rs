//! The pods on this node as the API server describes them, by UID: written by the one watch of the
//! node's pods, read by whatever names a process's or a device's pod (the GPU series' pod labels
//! for a process, from its cgroup).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use regex::Regex;
use serde::{Deserialize, Serialize};

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
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
}

/// By UID, and by namespace and name (the kubelet's pod-resources names pods so).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDirectory {
    pods: BTreeMap<String, PodIdentity>,
    by_name: BTreeMap<(String, String), String>,
}

impl PodDirectory {
    pub fn from_pods(pods: impl IntoIterator<Item = PodIdentity>) -> PodDirectory {
        let mut directory = PodDirectory::default();
        for pod in pods {
            directory.insert(pod);
        }
        directory
    }

    pub fn insert(&mut self, pod: PodIdentity) {
        self.by_name
            .insert((pod.namespace.clone(), pod.name.clone()), pod.uid.clone());
        self.pods.insert(pod.uid.clone(), pod);
    }

    pub fn remove(&mut self, uid: &str) {
        if let Some(pod) = self.pods.remove(uid) {
            self.by_name.remove(&(pod.namespace, pod.name));
        }
    }

    pub fn get(&self, uid: &str) -> Option<&PodIdentity> {
        self.pods.get(uid)
    }

    pub fn find(&self, namespace: &str, name: &str) -> Option<&PodIdentity> {
        let uid = self
            .by_name
            .get(&(namespace.to_string(), name.to_string()))?;
        self.pods.get(uid)
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

pub type SharedPods = Shared<PodDirectory>;

/// The node's pods, and what of a device holder's pod its devices' series carry: what a
/// collector that labels devices by their holder needs.
#[derive(Clone, Debug, Default)]
pub struct PodNames {
    pub pods: SharedPods,
    pub holder: HolderLabels,
}

impl PodNames {
    /// [`HolderLabels::of`] the pod `namespace/pod`, from the pods as they are now.
    pub fn of_holder(
        &self,
        namespace: &str,
        pod: &str,
        taken: &[(&'static str, String)],
    ) -> Vec<(&'static str, String)> {
        if self.holder.is_off() {
            return Vec::new();
        }
        self.holder.of(&self.pods.borrow(), namespace, pod, taken)
    }
}

/// A pattern a pod label's key must match to be copied onto its devices' series
/// (`kubelet.pod_labels`, as dcgm-exporter's `--kubernetes-pod-label-allowlist-regex`); the whole
/// key must match.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct LabelPattern(Regex);

impl TryFrom<String> for LabelPattern {
    type Error = String;

    fn try_from(pattern: String) -> Result<LabelPattern, String> {
        Regex::new(&format!("^(?:{pattern})$"))
            .map(LabelPattern)
            .map_err(|e| format!("{pattern:?} is not a regular expression: {e}"))
    }
}

impl From<LabelPattern> for String {
    fn from(pattern: LabelPattern) -> String {
        let anchored = pattern.0.as_str();
        anchored[4..anchored.len() - 2].to_string()
    }
}

/// What of a device's holder goes on the device's series beside `pod`, `namespace` and
/// `container`: its UID (`kubelet.pod_uid`), and the pod labels whose keys match (at most `max`,
/// by key order), named as dcgm-exporter names them (every character outside `[a-zA-Z0-9_]`
/// becomes `_`). Read from the pods the agent watches: no API call per scrape.
#[derive(Clone, Debug, Default)]
pub struct HolderLabels {
    pub pod_uid: bool,
    pub copy: Vec<LabelPattern>,
    pub max: usize,
    /// dcgm-exporter's `--kubernetes-virtual-gpus` (`kubelet.virtual_gpus`): a shared device's
    /// DCGM_* series once per replica holder, with `vgpu`, rather than under its first holder.
    pub virtual_gpus: bool,
}

/// The most distinct copied label names the agent exports: each is interned for the process's
/// life, so the total is bounded whatever the pods' labels are.
const MAX_COPIED_NAMES: usize = 64;

impl HolderLabels {
    /// Whether nothing of a holder's pod is asked for: the pods need not be watched for it.
    pub fn is_off(&self) -> bool {
        !self.pod_uid && self.copy.is_empty()
    }

    /// The labels to add for the pod `namespace/pod`, leaving out any name `taken` already has.
    pub fn of(
        &self,
        pods: &PodDirectory,
        namespace: &str,
        pod: &str,
        taken: &[(&'static str, String)],
    ) -> Vec<(&'static str, String)> {
        let Some(identity) = pods.find(namespace, pod) else {
            return Vec::new();
        };
        // The registry's node labels, and Prometheus's reserved `__` names, are never a pod's.
        let free = |name: &str| {
            !taken.iter().any(|(t, _)| *t == name)
                && !["Hostname", "hostname"].contains(&name)
                && !name.starts_with("__")
        };
        let mut out = Vec::new();
        if self.pod_uid && free("pod_uid") {
            out.push(("pod_uid", identity.uid.clone()));
        }
        let copied = identity
            .labels
            .iter()
            .filter(|(key, _)| self.copy.iter().any(|p| p.0.is_match(key)))
            .filter_map(|(key, value)| Some((intern(&sanitize(key))?, value.clone())))
            .filter(|(name, _)| free(name) && *name != "pod_uid")
            .take(self.max);
        out.extend(copied);
        out
    }
}

/// dcgm-exporter's `SanitizeLabelName`: `[^a-zA-Z0-9_]` to `_` (and a leading digit made legal).
fn sanitize(key: &str) -> String {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// `name` as a `&'static str`, the same one each time; None once [`MAX_COPIED_NAMES`] are taken.
fn intern(name: &str) -> Option<&'static str> {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = names.get(name) {
        return Some(known);
    }
    if names.len() >= MAX_COPIED_NAMES {
        return None;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    Some(leaked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory() -> PodDirectory {
        PodDirectory::from_pods([PodIdentity {
            namespace: "inference".into(),
            name: "vllm-0".into(),
            uid: "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b".into(),
            containers: BTreeMap::new(),
            labels: [
                ("app.kubernetes.io/name", "vllm"),
                ("team", "search"),
                ("pod", "impostor"),
                ("Hostname", "impostor"),
                ("pod-template-hash", "7d9f8c6b5"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        }])
    }

    fn patterns(list: &[&str]) -> Vec<LabelPattern> {
        list.iter()
            .map(|p| LabelPattern::try_from(p.to_string()).unwrap())
            .collect()
    }

    #[test]
    fn matching_labels_are_copied_sanitised_bounded_and_never_over_a_series_own() {
        let holder = HolderLabels {
            pod_uid: true,
            copy: patterns(&["app\\.kubernetes\\.io/.*", "team", "pod"]),
            max: 8,
            virtual_gpus: false,
        };
        let taken = [("pod", "vllm-0".to_string())];
        let labels = holder.of(&directory(), "inference", "vllm-0", &taken);
        assert_eq!(
            labels,
            [
                ("pod_uid", "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b".to_string()),
                ("app_kubernetes_io_name", "vllm".to_string()),
                ("team", "search".to_string()),
            ],
            "the pod's own `pod` label does not replace the series'; pod-template-hash is not asked for"
        );
        let one = HolderLabels { max: 1, ..holder };
        assert_eq!(one.of(&directory(), "inference", "vllm-0", &taken).len(), 2);
        assert!(one
            .of(&directory(), "inference", "other", &taken)
            .is_empty());
    }

    #[test]
    fn a_pattern_matches_the_whole_key_and_a_bad_one_is_named() {
        let team = LabelPattern::try_from("tea".to_string()).unwrap();
        assert!(!team.0.is_match("team"));
        assert_eq!(String::from(team), "tea");
        let error = LabelPattern::try_from("team(".to_string()).unwrap_err();
        assert!(error.contains("\"team(\""), "{error}");
        assert_eq!(sanitize("9lives.x"), "_9lives_x");
    }
}
