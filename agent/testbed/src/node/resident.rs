//! What a shared node holds between tests: a lock that tests which change the node for every pod
//! take exclusively and tests that only run pods on it share, and the one install a test may
//! leave for the next that asks for it by name (the agent with its inference pods, say), so that
//! a run installs it once rather than once per scenario. Generic over what the install is made
//! on (`C`: the one-node cluster), so that its rules are tested without one.

use std::any::Any;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The lock, and what is installed under it.
pub struct ResidentLock<C> {
    resident: RwLock<Option<Resident<C>>>,
}

/// An install left for later tests: what it made (any type) and how to remove it.
struct Resident<C> {
    name: &'static str,
    /// None until the install has finished.
    state: Option<Box<dyn Any + Send + Sync>>,
    remove: Box<dyn FnOnce(&C) + Send + Sync>,
}

impl<C> Default for ResidentLock<C> {
    fn default() -> Self {
        ResidentLock {
            resident: RwLock::new(None),
        }
    }
}

impl<C> ResidentLock<C> {
    /// For a test that changes the node for every pod: no other test's pods meanwhile, and
    /// nothing another test left installed.
    pub fn exclusive<'a>(&'a self, on: &'a C) -> Exclusive<'a, C> {
        let mut held = self.as_left(on);
        held.remove();
        held
    }

    /// Exclusively, with `name` installed: as an earlier test left it, else installed now (see
    /// [`Exclusive::install`]).
    pub fn exclusive_with<'a, T: Any + Send + Sync>(
        &'a self,
        on: &'a C,
        name: &'static str,
        install: impl FnOnce(&C) -> T,
        remove: impl FnOnce(&C) + Send + Sync + 'static,
    ) -> Exclusive<'a, C> {
        let mut held = self.as_left(on);
        if held.resident.as_ref().is_none_or(|r| r.name != name) {
            held.install(name, install, remove);
        }
        held
    }

    /// For a test that runs pods on the node as it is.
    pub fn sharing(&self) -> Sharing<'_, C> {
        Sharing {
            _held: self.resident.read().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Exclusively, as the last test left it. A test that failed while it held the lock may
    /// have left its install half made or half changed: that install is removed, so that the next
    /// test starts from one it makes itself.
    fn as_left<'a>(&'a self, on: &'a C) -> Exclusive<'a, C> {
        match self.resident.write() {
            Ok(resident) => Exclusive { on, resident },
            Err(poisoned) => {
                self.resident.clear_poison();
                let mut held = Exclusive {
                    on,
                    resident: poisoned.into_inner(),
                };
                if let Some(left) = held.resident.as_ref() {
                    eprintln!(
                        "a test failed while {} was installed: removing it",
                        left.name
                    );
                }
                held.remove();
                held
            }
        }
    }
}

/// Held by tests that run pods on the node as it is.
pub struct Sharing<'a, C> {
    _held: RwLockReadGuard<'a, Option<Resident<C>>>,
}

/// Held by one test, and what is installed.
pub struct Exclusive<'a, C> {
    on: &'a C,
    resident: RwLockWriteGuard<'a, Option<Resident<C>>>,
}

impl<C> Exclusive<'_, C> {
    /// Removes what is installed, then runs `install` and leaves what it made installed for the
    /// next test that asks for `name`. `remove` is known before `install` runs: an install that
    /// fails part way is removed by the next test, so it must remove what exists and pass over
    /// what does not.
    pub fn install<T: Any + Send + Sync>(
        &mut self,
        name: &'static str,
        install: impl FnOnce(&C) -> T,
        remove: impl FnOnce(&C) + Send + Sync + 'static,
    ) -> &T {
        self.remove();
        *self.resident = Some(Resident {
            name,
            state: None,
            remove: Box::new(remove),
        });
        let state = install(self.on);
        self.resident.as_mut().expect("registered above").state = Some(Box::new(state));
        self.state()
    }

    /// What the resident install made; panics naming the type when none of that type is.
    pub fn state<T: Any>(&self) -> &T {
        self.resident
            .as_ref()
            .and_then(|r| r.state.as_ref())
            .and_then(|state| state.downcast_ref())
            .unwrap_or_else(|| panic!("no {} installed", std::any::type_name::<T>()))
    }

    /// Removes what is installed: for a test that changed it beyond what the next may meet.
    pub fn remove(&mut self) {
        if let Some(left) = self.resident.take() {
            (left.remove)(self.on);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// What the installs did, in order.
    #[derive(Default)]
    struct Node(Mutex<Vec<String>>);

    impl Node {
        fn did(&self, what: &str) {
            self.0.lock().unwrap().push(what.to_string());
        }

        fn log(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    fn with_a<'a>(lock: &'a ResidentLock<Node>, node: &'a Node) -> Exclusive<'a, Node> {
        lock.exclusive_with(
            node,
            "a",
            |n| {
                n.did("install a");
                7_u32
            },
            |n| n.did("remove a"),
        )
    }

    #[test]
    fn an_install_is_kept_for_its_name_and_removed_for_another_or_none() {
        let (lock, node) = (ResidentLock::default(), Node::default());
        assert_eq!(*with_a(&lock, &node).state::<u32>(), 7);
        assert_eq!(*with_a(&lock, &node).state::<u32>(), 7);
        assert_eq!(node.log(), ["install a"], "installed once for two tests");
        drop(lock.exclusive_with(&node, "b", |n| n.did("install b"), |n| n.did("remove b")));
        assert_eq!(node.log(), ["remove a", "install b"]);
        drop(lock.sharing());
        drop(lock.exclusive(&node));
        assert_eq!(node.log(), ["remove b"], "a test wanting the node bare");
        drop(lock.exclusive(&node));
        assert_eq!(node.log(), Vec::<String>::new(), "nothing left to remove");
    }

    #[test]
    fn a_test_that_changed_the_install_removes_it() {
        let (lock, node) = (ResidentLock::default(), Node::default());
        with_a(&lock, &node).remove();
        drop(with_a(&lock, &node));
        assert_eq!(node.log(), ["install a", "remove a", "install a"]);
    }

    #[test]
    fn a_test_that_failed_holding_the_node_has_its_install_removed_by_the_next() {
        let (lock, node) = (ResidentLock::default(), Node::default());
        let failed = std::thread::scope(|s| {
            s.spawn(|| {
                let _held = with_a(&lock, &node);
                panic!("the scenario failed");
            })
            .join()
        });
        assert!(failed.is_err());
        assert_eq!(*with_a(&lock, &node).state::<u32>(), 7);
        assert_eq!(node.log(), ["install a", "remove a", "install a"]);
    }

    #[test]
    fn an_install_that_failed_part_way_is_removed_by_the_next_test() {
        let (lock, node) = (ResidentLock::default(), Node::default());
        let failed = std::thread::scope(|s| {
            s.spawn(|| {
                drop(lock.exclusive_with(
                    &node,
                    "a",
                    |n| -> u32 {
                        n.did("half of a");
                        panic!("the install failed");
                    },
                    |n| n.did("remove a"),
                ))
            })
            .join()
        });
        assert!(failed.is_err());
        drop(lock.exclusive(&node));
        assert_eq!(node.log(), ["half of a", "remove a"]);
    }
}
