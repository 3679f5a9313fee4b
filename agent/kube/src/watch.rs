//! How the agent's watches list.

use kube::runtime::watcher;

/// A watch of the objects `fields` selects (this node's), listed as client-go's informers list:
/// from the API server's watch cache (`resourceVersion=0`), not a quorum read of etcd, which a
/// rollout of thousands of agents would otherwise make at once; bookmarks on (kube's default), so
/// that a resumed watch is rarely too old and relists only on a 410. Unpaged: kube sends
/// `resourceVersion=0` only without a `limit` (kube-core's `ListParams`), and the cache serves
/// a node's few hundred objects in one answer anyway.
pub fn watch_config(fields: &str) -> watcher::Config {
    watcher::Config {
        page_size: None,
        ..watcher::Config::default().fields(fields).any_semantic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_list_from_the_api_servers_cache() {
        let config = watch_config("spec.nodeName=n1");
        assert_eq!(
            config.page_size, None,
            "a limit would drop resourceVersion=0"
        );
        assert_eq!(config.list_semantic, watcher::ListSemantic::Any);
    }
}
