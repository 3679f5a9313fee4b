//! What the node asks of the agent's hold on the GPUs, read through one watch of the node
//! (`metadata.name=<node>`) into a slot the NVML thread reads each round: the operator's (or a
//! repair engine's) annotation [`RELEASE_ANNOTATION`], and the GPU Operator's MIG manager's state
//! label [`MIG_CONFIG_STATE_LABEL`]. While either asks, the agent closes every NVML handle; it
//! takes NVML back when they stop asking (or after `nvml.release_timeout`).

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;

use crate::watch::watch_config;
use mlnode_core::shared::Shared;

pub use mlnode_accel::gpu::release::{NodeAsks, MIG_CONFIG_STATE_LABEL, RELEASE_ANNOTATION};

/// The longest value carried into a condition message.
const MAX_VALUE: usize = 256;

/// What `node` asks: the annotation's value (cut to [`MAX_VALUE`] characters) and the MIG
/// manager's state, each if set.
pub fn requested(node: &Node) -> NodeAsks {
    let annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RELEASE_ANNOTATION))
        .map(|value| value.chars().take(MAX_VALUE).collect());
    let mig_config_state = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MIG_CONFIG_STATE_LABEL))
        .cloned();
    NodeAsks {
        annotation,
        mig_config_state,
    }
}

/// The change from `before` to `now`, said in the log.
fn say(before: &NodeAsks, now: &NodeAsks) {
    if before.annotation != now.annotation {
        match &now.annotation {
            Some(v) => {
                tracing::warn!(annotation = RELEASE_ANNOTATION, value = %v, "the node asks the agent to let go of the GPUs")
            }
            None => tracing::info!(
                annotation = RELEASE_ANNOTATION,
                "the node no longer asks the agent to let go of the GPUs"
            ),
        }
    }
    if before.mig_config_state != now.mig_config_state {
        tracing::info!(
            label = MIG_CONFIG_STATE_LABEL,
            state = now.mig_config_state.as_deref().unwrap_or("(removed)"),
            "the MIG manager's state changed"
        );
    }
}

/// Keeps `slot` at what the node asks until `shutdown`. A failing watch is said once and keeps the
/// last value (a release stays bounded by its timeout); kube's back-off retries it.
pub async fn run(
    client: kube::Client,
    node_name: String,
    slot: Shared<NodeAsks>,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let config = watch_config(&format!("metadata.name={node_name}"));
    // Retried after kube's back-off, as the ResourceSlice watch (kubelet::dra) is.
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut trouble = mlnode_core::trouble::Trouble::default();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                if let Some(message) = trouble.failed(e.to_string()) {
                    tracing::warn!(error = %message, "the node watch failed; the release annotation and MIG manager state last seen stand until it resumes (retrying with backoff)");
                }
            }
            Some(Ok(event)) => {
                if trouble.recovered() {
                    tracing::info!("the node watch works again");
                }
                match event {
                    watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                        let asks = requested(&node);
                        let before = slot.get();
                        if before != asks {
                            say(&before, &asks);
                            slot.set(asks);
                        }
                    }
                    watcher::Event::Delete(_) => slot.set(NodeAsks::default()),
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_is_read_and_bounded_and_the_mig_state_read() {
        let mut node = Node::default();
        assert_eq!(requested(&node), NodeAsks::default());
        node.metadata.annotations =
            Some([(RELEASE_ANNOTATION.to_string(), "x".repeat(1000))].into());
        node.metadata.labels =
            Some([(MIG_CONFIG_STATE_LABEL.to_string(), "pending".into())].into());
        let asks = requested(&node);
        assert_eq!(asks.annotation.as_ref().map(|v| v.len()), Some(MAX_VALUE));
        assert!(asks.mig_pending());
    }
}
