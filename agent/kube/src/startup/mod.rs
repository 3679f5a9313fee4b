//! Pod startup phases: scheduling, image pull, container start, model load and readiness, per pod
//! on this node, each from its own source.
//!
//! [`phases`] computes them from Pod and Event objects (pure, tested on objects shaped as a real
//! cluster returns them); [`tracker`] follows the node's pods through the API server and exports the result;
//! [`image_pull`] splits an image pull into its transfer and its unpack by containerd's content
//! store (pure); [`lazy`] splits a lazily loaded image's fetching over the phases.

pub mod image_pull;
pub mod lazy;
pub mod phases;
pub mod report;
pub mod settings;
pub mod tracker;
