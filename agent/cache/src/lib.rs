//! mlnode-cache: model caches kept verified on a node. The verifier core is the `mlnode-verify`
//! crate (`agent/verify`), usable alone and re-exported here under its own module names; this crate
//! adds what a node agent needs around it: continuous verification as files change ([`watch`],
//! [`events`], [`monitor`]), hashing at a priority that never steals from inference
//! ([`priority`]), each model's state for the server and the readiness gates ([`state`]), and the
//! cache series ([`metrics`]).

pub use mlnode_verify::{
    fingerprint, generate, hasher, layout, manifest, page_cache, paths, report, safe_open,
    throttle, verify, walk,
};

pub mod events;
pub mod metrics;
pub mod monitor;
pub mod priority;
pub mod settings;
pub mod watch;

pub use mlnode_core::state;

pub use manifest::{Manifest, TrustPolicy};
pub use report::{FileStatus, Report};
pub use verify::VerifyOptions;
