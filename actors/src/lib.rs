//! omni-actors: the actor system of omni-gateway on domain types.
//!
//! The server crate (`src/`) plugs in its edges: wire dialects (JSON codecs) and
//! backends (the C ABI). Nothing in this crate depends on either.

pub mod backend;
pub mod domain;
pub mod worker_thread;

pub use backend::{Backend, BackendControl, BackendError, run_duplex_step};
pub use worker_thread::{BackendFactory, WorkerThread};
