//! How the agent's watches back off.

use kube::runtime::watcher;

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
