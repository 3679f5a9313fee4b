//! How the agent's watches list and back off.

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

/// The pod watch's backoff. kube's `default_backoff` starts again from 800 ms at every event it
/// passes on, and a relist is a burst of events: an API server answering every watch with 410 Gone
/// would be relisted about once a second, forever. Here events do not reset it; only two minutes
/// without an error do (the timer inside kube's `DefaultBackoff`), so a persistent 410 backs off
/// to 30 s between relists.
#[derive(Default)]
pub struct ErrorsOnlyBackoff(watcher::DefaultBackoff);

impl Iterator for ErrorsOnlyBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next()
    }
}

impl kube::runtime::utils::Backoff for ErrorsOnlyBackoff {
    fn reset(&mut self) {}
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

    #[test]
    fn a_relist_does_not_reset_the_watch_backoff() {
        use kube::runtime::utils::Backoff;
        let mut backoff = ErrorsOnlyBackoff::default();
        let mut last = std::time::Duration::ZERO;
        // Error, relist (events reset a default backoff), error, relist, ...
        for _ in 0..6 {
            last = backoff.next().unwrap();
            backoff.reset();
        }
        assert!(
            last >= std::time::Duration::from_secs(5),
            "still {last:?} after 6 failed watches"
        );
    }
}
