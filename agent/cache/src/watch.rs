//! One file watch for every model. inotify instances are few (`fs.inotify.max_user_instances`, 128
//! by default, shared by every process of the user: as UID 0 the agent shares them with every root
//! process on the node), so the agent opens one, and each model subscribes to the paths it needs.
//! Events are handed to the subscribers whose paths hold them; a path two models need (a manifest
//! directory they share) is watched once and unwatched with its last subscriber.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc::UnboundedSender;

pub type EventSender = UnboundedSender<notify::Result<notify::Event>>;

/// A path a subscriber wants events for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchedPath {
    pub path: PathBuf,
    pub recursive: bool,
}

impl WatchedPath {
    fn holds(&self, path: &Path) -> bool {
        if self.recursive {
            path.starts_with(&self.path)
        } else {
            path == self.path || path.parent() == Some(&self.path)
        }
    }
}

#[derive(Debug)]
pub struct WatchError {
    pub reason: String,
    /// The kernel's limit on watches or instances was reached.
    pub limit: bool,
}

impl WatchError {
    fn of(path: &Path, e: notify::Error) -> WatchError {
        let limit = matches!(e.kind, notify::ErrorKind::MaxFilesWatch)
            || matches!(&e.kind, notify::ErrorKind::Io(io) if io.raw_os_error() == Some(libc::EMFILE));
        WatchError {
            reason: format!("{}: {e}", path.display()),
            limit,
        }
    }
}

struct Subscriber {
    id: u64,
    paths: Vec<WatchedPath>,
    events: EventSender,
}

/// Subscribers are read on notify's event thread and written by [`FileWatch::subscribe`]; the
/// watcher itself has a lock of its own, never held while the subscribers' is: notify's `watch`
/// waits for its event thread, which may be handing an event out.
struct Shared {
    subscribers: RwLock<Vec<Subscriber>>,
    watcher: Mutex<Watching>,
}

#[derive(Default)]
struct Watching {
    /// Opened on the first subscription, so an agent without models opens no instance.
    watcher: Option<notify::RecommendedWatcher>,
    /// How many subscriptions hold each path, and whether any wants it recursively.
    held: HashMap<PathBuf, (usize, bool)>,
    next_id: u64,
}

/// The agent's one file watch. Cloning shares it.
#[derive(Clone)]
pub struct FileWatch(Arc<Shared>);

impl Default for FileWatch {
    fn default() -> Self {
        FileWatch(Arc::new(Shared {
            subscribers: RwLock::new(Vec::new()),
            watcher: Mutex::new(Watching::default()),
        }))
    }
}

/// A model's paths, watched until this is dropped.
pub struct Subscription {
    watch: FileWatch,
    id: u64,
    paths: Vec<WatchedPath>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watch.unsubscribe(self.id, &self.paths);
    }
}

impl FileWatch {
    /// Watches `paths` and sends every event under them to `events`, until the subscription is
    /// dropped. Fails as a whole: on an error nothing stays watched for it.
    pub fn subscribe(
        &self,
        paths: Vec<WatchedPath>,
        events: EventSender,
    ) -> Result<Subscription, WatchError> {
        let id = {
            let mut watching = self.0.watcher.lock().unwrap_or_else(|p| p.into_inner());
            watching.next_id += 1;
            watching.next_id
        };
        // Listed before the watch is added, so that no event of it is missed.
        self.0
            .subscribers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(Subscriber {
                id,
                paths: paths.clone(),
                events,
            });
        // Dropped on an error below, undoing what was held so far.
        let mut subscription = Subscription {
            watch: self.clone(),
            id,
            paths: Vec::new(),
        };
        for path in &paths {
            self.hold(path)?;
            subscription.paths.push(path.clone());
        }
        Ok(subscription)
    }

    fn hold(&self, wanted: &WatchedPath) -> Result<(), WatchError> {
        let mut watching = self.0.watcher.lock().unwrap_or_else(|p| p.into_inner());
        let (count, recursive) = watching
            .held
            .get(&wanted.path)
            .copied()
            .unwrap_or((0, false));
        let needs_watch = count == 0 || (wanted.recursive && !recursive);
        if needs_watch {
            if watching.watcher.is_none() {
                let shared = Arc::downgrade(&self.0);
                let watcher = notify::recommended_watcher(move |event| {
                    if let Some(shared) = shared.upgrade() {
                        dispatch(&shared, event);
                    }
                })
                .map_err(|e| WatchError::of(&wanted.path, e))?;
                watching.watcher = Some(watcher);
            }
            let mode = if wanted.recursive || recursive {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            let watcher = watching.watcher.as_mut().expect("opened above");
            watcher
                .watch(&wanted.path, mode)
                .map_err(|e| WatchError::of(&wanted.path, e))?;
        }
        watching.held.insert(
            wanted.path.clone(),
            (count + 1, recursive || wanted.recursive),
        );
        Ok(())
    }

    fn unsubscribe(&self, id: u64, paths: &[WatchedPath]) {
        self.0
            .subscribers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| s.id != id);
        let mut watching = self.0.watcher.lock().unwrap_or_else(|p| p.into_inner());
        for path in paths {
            let Some((count, _)) = watching.held.get_mut(&path.path) else {
                continue;
            };
            *count -= 1;
            if *count == 0 {
                watching.held.remove(&path.path);
                if let Some(watcher) = watching.watcher.as_mut() {
                    // Gone already when the directory went: nothing to undo then.
                    let _ = watcher.unwatch(&path.path);
                }
            }
        }
    }

    /// How many paths are watched (each once, whoever needs it).
    pub fn watched_paths(&self) -> usize {
        self.0
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held
            .len()
    }
}

/// Hands an event to every subscriber with a path that holds one of its paths; an event naming no
/// path (the kernel's queue overflowed) or an error naming none goes to all of them.
fn dispatch(shared: &Shared, event: notify::Result<notify::Event>) {
    let subscribers = shared.subscribers.read().unwrap_or_else(|p| p.into_inner());
    let paths: &[PathBuf] = match &event {
        Ok(event) => &event.paths,
        Err(e) => &e.paths,
    };
    for subscriber in subscribers.iter() {
        let concerned = paths.is_empty()
            || paths
                .iter()
                .any(|p| subscriber.paths.iter().any(|w| w.holds(p)));
        if concerned {
            let copy = match &event {
                Ok(event) => Ok(event.clone()),
                Err(e) => Err(copy_error(e)),
            };
            let _ = subscriber.events.send(copy);
        }
    }
}

/// notify's errors hold an `io::Error`, which cannot be cloned: each subscriber gets the kind that
/// matters (the watch limit) and the words.
fn copy_error(e: &notify::Error) -> notify::Error {
    let mut copy = match e.kind {
        notify::ErrorKind::MaxFilesWatch => notify::Error::new(notify::ErrorKind::MaxFilesWatch),
        _ => notify::Error::generic(&e.to_string()),
    };
    copy.paths = e.paths.clone();
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn recursive(path: &Path) -> WatchedPath {
        WatchedPath {
            path: path.to_path_buf(),
            recursive: true,
        }
    }

    type Events = tokio::sync::mpsc::UnboundedReceiver<notify::Result<notify::Event>>;

    /// Reads events until one names `path`; returns every path seen on the way.
    async fn until_path(rx: &mut Events, path: &Path) -> Vec<PathBuf> {
        let mut seen = Vec::new();
        while !seen.iter().any(|p| p == path) {
            let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no event for {} within 10 s: {seen:?}", path.display()))
                .expect("the channel is open")
                .expect("no watch error");
            seen.extend(event.paths);
        }
        seen
    }

    /// Two models and a manifest directory they share: one watch each path, each event to the
    /// models whose paths hold it, and the shared directory unwatched with its last subscriber.
    #[tokio::test]
    async fn events_reach_the_models_whose_paths_hold_them() {
        let dir = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        let (a, b, manifests) = (dir.join("a"), dir.join("b"), dir.join("manifests"));
        for d in [&a, &b, &manifests] {
            std::fs::create_dir(d).unwrap();
        }
        let watch = FileWatch::default();
        let shared_dir = WatchedPath {
            path: manifests.clone(),
            recursive: false,
        };
        let (tx_a, mut rx_a) = tokio::sync::mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = tokio::sync::mpsc::unbounded_channel();
        let sub_a = watch
            .subscribe(vec![recursive(&a), shared_dir.clone()], tx_a)
            .unwrap();
        let sub_b = watch
            .subscribe(vec![recursive(&b), shared_dir], tx_b)
            .unwrap();
        assert_eq!(watch.watched_paths(), 3);

        std::fs::write(a.join("weights"), b"x").unwrap();
        until_path(&mut rx_a, &a.join("weights")).await;
        std::fs::write(manifests.join("m.json"), b"{}").unwrap();
        until_path(&mut rx_a, &manifests.join("m.json")).await;
        let seen_by_b = until_path(&mut rx_b, &manifests.join("m.json")).await;
        assert!(
            seen_by_b.iter().all(|p| !p.starts_with(&a)),
            "b sees nothing of a's files: {seen_by_b:?}"
        );

        drop(sub_a);
        assert_eq!(watch.watched_paths(), 2, "the shared directory stays for b");
        std::fs::write(b.join("weights"), b"y").unwrap();
        until_path(&mut rx_b, &b.join("weights")).await;
        drop(sub_b);
        assert_eq!(watch.watched_paths(), 0);
    }

    /// A subscription that cannot be set up (a path that does not exist) leaves nothing watched.
    #[tokio::test]
    async fn a_failed_subscription_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let watch = FileWatch::default();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let failed = watch.subscribe(
            vec![recursive(dir.path()), recursive(&dir.path().join("gone"))],
            tx,
        );
        let error = failed
            .err()
            .expect("the missing path fails the subscription");
        assert!(error.reason.contains("gone"), "{}", error.reason);
        assert!(!error.limit);
        assert_eq!(watch.watched_paths(), 0);
    }
}
