//! The stores a cluster's replicas and nodes share (`[cluster]`: [`config`]), behind
//! `omni_actors::edge::coordinator::{Coordinator, NodeStore}`: [`redis`] (every decision one Lua
//! script). A new store implements both traits and passes the same suite
//! (`omni_actors::queue::suite`).

pub(crate) mod config;
pub mod redis;

pub use config::{ClusterConfig, ClusterSpec};
