//! Node labels that advertise the models verified on the node (`readiness.model_labels`):
//! `models.mlnode.dev/<name>: <revision>` while the model verifies, gone when it stops, so that a
//! Deployment can prefer or require nodes that hold its model verified (`nodeAffinity`). The agent
//! owns the prefix on its node: a label under it that names no verified model is removed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Map, Value};

use super::gates::ModelFacts;
use mlnode_core::state::Readiness;

pub const MODEL_LABEL_PREFIX: &str = "models.mlnode.dev/";

/// The longest label name (after the prefix) and value Kubernetes allows.
const LABEL_LIMIT: usize = 63;

/// Why `text` cannot be a label name or value, by Kubernetes' rule (apimachinery
/// `validation.IsQualifiedName`'s name part, `IsValidLabelValue`): at most 63 characters,
/// alphanumerics with `-`, `_` or `.` between, beginning and ending alphanumeric. A value may be
/// empty; a name may not.
pub fn label_syntax_problem(text: &str, is_name: bool) -> Option<String> {
    if text.is_empty() {
        return is_name.then(|| "is empty".to_string());
    }
    if text.len() > LABEL_LIMIT {
        return Some(format!(
            "is {} characters, more than {LABEL_LIMIT}",
            text.len()
        ));
    }
    let bytes = text.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_alphanumeric();
    if !alphanumeric(&bytes[0]) || !alphanumeric(&bytes[bytes.len() - 1]) {
        return Some("must begin and end with a letter or digit".into());
    }
    if let Some(bad) = text
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "has {bad:?}: only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    None
}

/// The labels the node should carry: each verified model's revision (empty when its manifest
/// names none, or the revision cannot be a label value).
pub fn wanted(models: &[ModelFacts]) -> BTreeMap<String, String> {
    models
        .iter()
        .filter_map(|m| match &m.readiness {
            Readiness::Verified { revision } => {
                let value = revision
                    .as_deref()
                    .filter(|r| label_syntax_problem(r, false).is_none())
                    .unwrap_or_default();
                Some((format!("{MODEL_LABEL_PREFIX}{}", m.name), value.to_string()))
            }
            _ => None,
        })
        .collect()
}

/// The node's labels under the agent's prefix.
pub fn current(node: &Node) -> BTreeMap<String, String> {
    node.metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(MODEL_LABEL_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The merge patch that turns `current` into `wanted` (null removes a label), or None when they
/// agree. A merge patch touches only the keys it names: labels others write are never sent.
pub fn patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Option<Value> {
    let mut labels = Map::new();
    for (key, value) in wanted {
        if current.get(key) != Some(value) {
            labels.insert(key.clone(), json!(value));
        }
    }
    for key in current.keys().filter(|k| !wanted.contains_key(*k)) {
        labels.insert(key.clone(), Value::Null);
    }
    (!labels.is_empty()).then(|| json!({"metadata": {"labels": labels}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::gates::tests::model;

    #[test]
    fn label_syntax_as_kubernetes_checks_it() {
        for good in ["llama-3.1-8b", "Qwen2.5_7B", "a", &"x".repeat(63)] {
            assert_eq!(label_syntax_problem(good, true), None, "{good}");
        }
        assert!(label_syntax_problem("meta-llama/Llama-3.1-8B", true)
            .unwrap()
            .contains("'/'"));
        assert!(label_syntax_problem(&"x".repeat(64), true)
            .unwrap()
            .contains("64 characters"));
        assert!(label_syntax_problem("-llama", true).is_some());
        assert!(label_syntax_problem("llama.", true).is_some());
        assert!(label_syntax_problem("", true).is_some());
        assert_eq!(
            label_syntax_problem("", false),
            None,
            "an empty value is a value"
        );
    }

    #[test]
    fn verified_models_are_labelled_and_the_rest_removed() {
        let models = [
            model(
                "llama",
                Readiness::Verified {
                    revision: Some("0e9e39f249a16976918f6564b8830bc894c89659".into()),
                },
            ),
            model(
                "mistral",
                Readiness::Failed {
                    reason: "config.json digest_mismatch".into(),
                },
            ),
            model(
                "qwen",
                Readiness::Verified {
                    revision: Some("refs/pr/1".into()),
                },
            ),
            model("phi", Readiness::Starting),
        ];
        let wanted = wanted(&models);
        assert_eq!(
            wanted,
            BTreeMap::from([
                (
                    "models.mlnode.dev/llama".to_string(),
                    "0e9e39f249a16976918f6564b8830bc894c89659".to_string()
                ),
                ("models.mlnode.dev/qwen".to_string(), String::new()),
            ])
        );
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n", "labels": {
            "kubernetes.io/hostname": "n",
            "models.mlnode.dev/mistral": "5f0e2b0",
            "models.mlnode.dev/qwen": "",
        }}}))
        .unwrap();
        let current = current(&node);
        assert_eq!(current.len(), 2, "only the agent's prefix");
        assert_eq!(
            patch(&current, &wanted),
            Some(json!({"metadata": {"labels": {
                "models.mlnode.dev/llama": "0e9e39f249a16976918f6564b8830bc894c89659",
                "models.mlnode.dev/mistral": null,
            }}}))
        );
        assert_eq!(patch(&wanted, &wanted), None);
    }
}
