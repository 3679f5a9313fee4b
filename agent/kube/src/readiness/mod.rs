//! Node readiness gates: node conditions the agent writes about its own node, and an optional
//! startup taint it removes once the node is fit to serve, so that inference pods land only where
//! model caches are verified and accelerators healthy.
//!
//! [`gates`] decides the gates from the agent's state (pure); [`memory`] writes and reads back
//! what a failing `AcceleratorHealthy` must keep across an agent restart (pure); [`plan`] decides when to read, write,
//! move the taint and wait (pure); [`node`] turns decisions into the exact API requests (pure);
//! [`controller`] runs the loop against the API server.

pub mod controller;
pub mod gates;
pub mod labels;
mod memory;
pub(crate) mod node;
pub mod plan;
pub mod settings;
