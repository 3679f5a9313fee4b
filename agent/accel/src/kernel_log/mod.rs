//! The node's kernel log as a health source: the faults NVML and sysfs never show (a GPU fallen
//! off the bus, NVSwitch SXids, the Neuron runtime's `NEURON_HW_ERR` lines), and the XIDs logged
//! before the agent started, which NVML's event set cannot deliver.
//!
//! [`parse`] reads the drivers' lines (pure); [`facts`] keeps what this boot's log has said
//! (pure, bounded); [`journal`] reads the journal in a thread of its own, through libsystemd
//! loaded at run time ([`libsystemd`]), on the files [`files`] lists and checks. The GPU and Neuron
//! verdicts read the facts (`gpu::health`, `neuron::health`).

pub mod facts;
pub mod files;
pub mod journal;
pub mod libsystemd;
pub mod parse;
pub mod settings;
