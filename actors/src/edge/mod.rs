//! The traits at the actor system's edges, which the server implements:
//!
//! - [`backend::Backend`]: a model behind a worker (the C ABI, a child process, a node's
//!   worker, a MiniCPM-o worker);
//! - [`dialect::Dialect`]: a wire format a client speaks;
//! - [`coordinator::Coordinator`] and [`coordinator::NodeStore`]: a store that replicas and nodes
//!   of a cluster share (Redis; [`coordinator::memory`] in tests).

pub mod backend;
pub mod coordinator;
pub mod dialect;
