//! Model-cache verification.
//!
//! The pipeline is a chain of plain data types with the file-system side effects at the edges:
//!
//! 1. [`manifest`] turns a manifest file (native JSON or an OpenSSF model_signing bundle) into a
//!    [`manifest::Manifest`]: the trusted list of paths, sizes and SHA-256 digests.
//! 2. [`layout`] works out where those paths live under ROOT (a plain directory or a Hugging Face
//!    repo cache) and which revision is on disk.
//! 3. [`verify`] opens every file through [`safe_open`] (never leaving ROOT), hashes them in
//!    parallel with [`hasher`], and produces a [`report::Report`].

pub mod events;
pub mod generate;
pub mod hasher;
pub mod layout;
pub mod manifest;
pub mod metrics;
pub mod monitor;
pub mod page_cache;
pub mod paths;
pub mod priority;
pub mod report;
pub mod safe_open;
pub mod state;
pub mod throttle;
pub mod verify;
pub mod walk;
pub mod watch;

pub use manifest::{Manifest, TrustPolicy};
pub use report::{FileStatus, Report};
pub use verify::{verify, VerifyOptions};
