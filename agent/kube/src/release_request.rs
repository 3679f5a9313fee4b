//! The operator's (or a repair engine's) word to let go of the GPUs: the node annotation
//! [`RELEASE_ANNOTATION`], read through one watch of the node (`metadata.name=<node>`) into a slot
//! the NVML thread reads each round. Set: the agent closes every NVML handle; removed: it takes
//! NVML back (or after `nvml.release_timeout`).

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;

use crate::watch::watch_config;
use mlnode_core::shared::Shared;

pub use mlnode_accel::gpu::release::RELEASE_ANNOTATION;

/// The longest value carried into a condition message.
const MAX_VALUE: usize = 256;

/// The annotation's value on `node`, if set (cut to [`MAX_VALUE`] characters).
pub fn requested(node: &Node) -> Option<String> {
    let value = node
        .metadata
        .annotations
        .as_ref()?
        .get(RELEASE_ANNOTATION)?;
    Some(value.chars().take(MAX_VALUE).collect())
}

/// Keeps `slot` at the annotation's value until `shutdown`. A failing watch is said once and keeps
/// the last value (a release stays bounded by its timeout); kube's back-off retries it.
pub async fn run(
    client: kube::Client,
    node_name: String,
    slot: Shared<Option<String>>,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let config = watch_config(&format!("metadata.name={node_name}"));
    // Retried after kube's back-off, as the ResourceSlice watch (kubelet::dra) is.
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut failing = String::new();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                let message = e.to_string();
                if message != failing {
                    tracing::warn!(error = %message, annotation = RELEASE_ANNOTATION, "the node watch failed; the release annotation last seen stands until it resumes (retrying with backoff)");
                    failing = message;
                }
            }
            Some(Ok(event)) => {
                failing.clear();
                match event {
                    watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                        let value = requested(&node);
                        if slot.get() != value {
                            match &value {
                                Some(v) => {
                                    tracing::warn!(annotation = RELEASE_ANNOTATION, value = %v, "the node asks the agent to let go of the GPUs")
                                }
                                None => tracing::info!(
                                    annotation = RELEASE_ANNOTATION,
                                    "the node no longer asks the agent to let go of the GPUs"
                                ),
                            }
                            slot.set(value);
                        }
                    }
                    watcher::Event::Delete(_) => slot.set(None),
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
    fn the_annotation_is_read_and_bounded() {
        let mut node = Node::default();
        assert_eq!(requested(&node), None);
        node.metadata.annotations =
            Some([(RELEASE_ANNOTATION.to_string(), "x".repeat(1000))].into());
        assert_eq!(requested(&node).map(|v| v.len()), Some(MAX_VALUE));
    }
}
