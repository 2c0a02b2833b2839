//! omni-actors: the actor system of omni-gateway on domain types.
//!
//! - [`queue_actor::QueueActor`] on the rules of [`queue::QueueState`]: fair FIFO, positions, ETA.
//! - [`pool_actor::WorkerPoolActor`] on [`pool::PoolState`]: workers, their states, restarts.
//! - [`session::SessionActor`], one per WebSocket, on [`session_state::SessionState`].
//! - [`backend_actor::BackendActor`], one per worker, owning a [`worker_thread::WorkerThread`];
//!   its mailbox rules are [`worker_policy::WorkerPolicy`] (drop policy: [`pending::Pending`]).
//!
//! The server crate (`src/`) plugs in its edges: wire dialects ([`dialect::Dialect`]) and
//! backends ([`backend::Backend`]). Nothing in this crate knows JSON or C.

pub mod backend;
pub mod backend_actor;
pub mod cluster;
pub mod cluster_queue_actor;
pub mod dialect;
pub mod domain;
pub mod events;
pub mod fanout;
pub mod ids;
pub mod inbound_limits;
pub mod metrics;
pub mod outgoing;
pub mod pending;
pub mod pool;
pub mod pool_actor;
pub mod protocol;
pub mod queue;
pub mod queue_actor;
pub mod recorder;
pub mod recording;
pub mod registry;
pub mod session;
pub mod session_flow;
pub mod session_state;
pub mod spare_threads;
pub mod usage;
pub mod worker_policy;
pub mod worker_thread;

pub use backend::{Backend, BackendControl, BackendError, run_duplex_step};
pub use worker_thread::{BackendFactory, WorkerThread};
