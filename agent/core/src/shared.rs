//! State one part of the agent writes and others read, in one shape: [`Shared`]. Built on tokio's
//! watch channel, whose lock never poisons (a writer that panicked leaves the value as it was
//! written so far, and the next reader goes on), and which wakes whoever waits for a change
//! instead of leaving them to poll.

use std::sync::Arc;

use tokio::sync::watch;

/// A value shared between tasks and threads: the latest one, readable at any time, and a change
/// anyone can wait for ([`Shared::changed`]). Cloning shares the same value.
pub struct Shared<T>(Arc<watch::Sender<T>>);

impl<T> Shared<T> {
    pub fn new(value: T) -> Shared<T> {
        Shared(Arc::new(watch::Sender::new(value)))
    }

    /// Replaces the value and wakes the waiters.
    pub fn set(&self, value: T) {
        self.0.send_replace(value);
    }

    /// Changes the value in place and wakes the waiters.
    pub fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
        let mut result = None;
        self.0.send_modify(|value| result = Some(change(value)));
        result.unwrap_or_else(|| unreachable!("send_modify runs its closure once"))
    }

    /// Reads the value without copying it; hold no lock of another `Shared` inside.
    pub fn read<R>(&self, look: impl FnOnce(&T) -> R) -> R {
        look(&self.0.borrow())
    }

    /// The value, read-locked until the guard is dropped: for a reader that looks at many parts of
    /// it. Hold no lock of another `Shared` while it lives.
    pub fn borrow(&self) -> watch::Ref<'_, T> {
        self.0.borrow()
    }

    /// Waits for the next change after this call.
    pub async fn changed(&self) {
        let mut seen = self.0.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = seen.changed().await;
    }

    /// Waits until the value is changed after this call, or for `until` to hold, whichever comes
    /// first; returns at once when it already holds.
    pub async fn wait_for(&self, until: impl FnMut(&T) -> bool) {
        let mut seen = self.0.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = seen.wait_for(until).await;
    }
}

impl<T: PartialEq> Shared<T> {
    /// Replaces the value and wakes the waiters, only if it differs.
    pub fn set_if_changed(&self, value: T) {
        self.0.send_if_modified(|current| {
            let changed = *current != value;
            if changed {
                *current = value;
            }
            changed
        });
    }
}

impl<T: Clone> Shared<T> {
    pub fn get(&self) -> T {
        self.0.borrow().clone()
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T: Default> Default for Shared<T> {
    fn default() -> Self {
        Shared::new(T::default())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.borrow().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_wakes_a_waiter_and_a_panicking_writer_poisons_nothing() {
        let shared = Shared::new(0u32);
        let waiter = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.wait_for(|n| *n >= 2).await })
        };
        shared.set(1);
        assert_eq!(
            shared.update(|n| {
                *n += 1;
                *n
            }),
            2
        );
        waiter.await.unwrap();

        let writer = shared.clone();
        let panicked = std::thread::spawn(move || writer.update(|_| panic!("a writer's bug")))
            .join()
            .is_err();
        assert!(panicked);
        assert_eq!(shared.get(), 2, "the value stays readable");
        shared.set(3);
        assert_eq!(shared.read(|n| *n), 3, "and writable");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_value_wakes_nobody() {
        let shared = Shared::new("verified");
        let change = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.changed().await })
        };
        tokio::task::yield_now().await;
        shared.set_if_changed("verified");
        let waited = tokio::time::timeout(std::time::Duration::from_secs(60), change).await;
        assert!(waited.is_err(), "the same value again is no change");

        let change = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.changed().await })
        };
        tokio::task::yield_now().await;
        shared.set_if_changed("failed");
        change.await.unwrap();
    }
}
