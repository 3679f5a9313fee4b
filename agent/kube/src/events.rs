//! Events the agent posts, shaped as node-problem-detector and the kubelet post theirs: on its
//! Node (in `default`, where the kubelet records node events) and on the node's pods (in theirs).
//! A failure is logged, never fatal: an event is a courtesy to whoever runs `kubectl describe`.

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

/// What an event is about: the object's reference as `involvedObject` carries it.
pub struct About {
    pub namespace: String,
    pub reference: Value,
    /// The object's name, the stem of the event's generated name.
    pub name: String,
}

impl About {
    pub fn node(name: &str) -> About {
        About {
            namespace: "default".into(),
            reference: json!({"kind": "Node", "apiVersion": "v1", "name": name, "uid": name}),
            name: name.into(),
        }
    }

    pub fn pod(namespace: &str, name: &str, uid: &str) -> About {
        About {
            namespace: namespace.into(),
            reference: json!({"kind": "Pod", "apiVersion": "v1", "namespace": namespace, "name": name, "uid": uid}),
            name: name.into(),
        }
    }
}

/// Posts one event from this node's agent; `kind` is `Normal` or `Warning`.
pub async fn post(
    client: &kube::Client,
    node_name: &str,
    about: &About,
    kind: &str,
    reason: &str,
    message: &str,
) {
    let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let event: Event = match serde_json::from_value(json!({
        "metadata": {"generateName": format!("{}.", about.name), "namespace": about.namespace},
        "involvedObject": about.reference,
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": "mlnode-agent", "host": node_name},
        "reportingComponent": "mlnode-agent",
        "reportingInstance": node_name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    })) {
        Ok(event) => event,
        Err(e) => return tracing::warn!(error = %e, reason, "cannot build an event"),
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &about.namespace);
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(error = %e, reason, namespace = %about.namespace, "cannot post an event");
    }
}
