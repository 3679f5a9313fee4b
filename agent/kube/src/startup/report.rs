//! `mlnode-agent startup-report`: the phases of the Ready pods on a node, as a table, from the same
//! computation the agent exports.

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};

use super::phases::{compute, Phase, Startup};
use crate::models::{model_of, ModelMount};

/// Lists the node's pods (or the one named) and their events, and computes each startup.
pub async fn collect(
    node: &str,
    namespace: Option<&str>,
    pod: Option<&str>,
    models: &[ModelMount],
) -> Result<Vec<Startup>, String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("no Kubernetes API (in-cluster or KUBECONFIG): {e}"))?;
    let pods: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut fields = format!("spec.nodeName={node}");
    if let Some(name) = pod {
        fields.push_str(&format!(",metadata.name={name}"));
    }
    let listed = pods
        .list(&ListParams::default().fields(&fields))
        .await
        .map_err(|e| format!("cannot list pods on {node}: {e}"))?;
    let mut startups = Vec::new();
    for pod in listed.items {
        let (Some(ns), Some(uid)) = (pod.metadata.namespace.clone(), pod.metadata.uid.clone())
        else {
            continue;
        };
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let events = events
            .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
            .await
            .map_err(|e| {
                format!(
                    "cannot list the events of {ns}/{}: {e}",
                    pod.metadata.name.clone().unwrap_or_default()
                )
            })?;
        if let Some(startup) = compute(&pod, &events.items, model_of(&pod, models), None, None) {
            startups.push(startup);
        }
    }
    Ok(startups)
}

/// Seconds with one decimal, `-` for a phase whose source is missing.
pub fn table(startups: &[Startup]) -> String {
    let mut out = format!("{:<16} {:<32} {:<16}", "NAMESPACE", "POD", "MODEL");
    for phase in Phase::ALL {
        out.push_str(&format!(" {:>15}", phase.as_str().to_uppercase()));
    }
    out.push_str(&format!(" {:>10}\n", "TOTAL"));
    for s in startups {
        out.push_str(&format!(
            "{:<16} {:<32} {:<16}",
            s.namespace,
            s.pod,
            s.model_name.as_deref().unwrap_or("-")
        ));
        for phase in Phase::ALL {
            let cell = s
                .phases
                .get(&phase)
                .map_or("-".to_string(), |v| format!("{v:.1}s"));
            out.push_str(&format!(" {cell:>15}"));
        }
        out.push_str(&format!(" {:>10}\n", format!("{:.1}s", s.total_seconds)));
    }
    out
}
