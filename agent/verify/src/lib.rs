//! mlnode-verify: model-cache verification, usable alone (the agent's `verify` command, its
//! continuous monitor and its init-container gate are all built on it). It links no async
//! runtime, no Kubernetes client and no metrics.
//!
//! The pipeline is a chain of plain data types with the file-system side effects at the edges:
//!
//! 1. [`manifest`] turns a manifest file (native JSON or an OpenSSF model_signing bundle) into a
//!    [`manifest::Manifest`]: the trusted list of paths, sizes and digests.
//! 2. [`layout`] works out where those paths live under ROOT (a plain directory or a Hugging Face
//!    repo cache) and which revision is on disk.
//! 3. [`verify`] opens every file through [`safe_open`] (never leaving ROOT), hashes them in
//!    parallel with [`hasher`] (under a read rate, [`throttle`]; leaving the page cache as found,
//!    [`page_cache`]), and produces a [`report::Report`]. [`generate`] writes a native manifest
//!    from a cache the same way.

pub mod fingerprint;
pub mod generate;
pub mod hasher;
pub mod layout;
pub mod manifest;
pub mod own_opens;
pub mod page_cache;
pub mod paths;
pub mod report;
pub mod safe_open;
pub mod throttle;
pub mod verify;
pub mod walk;

pub use manifest::{Manifest, TrustPolicy};
pub use report::{FileStatus, Report};
pub use verify::{verify, VerifyOptions};
