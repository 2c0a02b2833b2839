//! The queue: who waits for a worker, in which order, and who is told what.
//!
//! - `state`: the rules of one process's queue (FIFO across modes, positions, ETAs), a plain
//!   struct; [`QueueActor`] delivers messages to it.
//! - `cluster`: a replica's queue, shared with other replicas through a
//!   [`crate::edge::coordinator::Coordinator`]: its rules are `cluster::state::ClusterState`,
//!   its actor [`ClusterQueueActor`].
//! - `pacer`: how position updates are coalesced and spread (both queues).
//! - [`crate::messages::queue`]: what a queue handles, from sessions ([`crate::messages::queue::QueuePort`]) and from the
//!   pool ([`crate::messages::queue::QueueFeed`]). Either queue fits both ports.

mod cluster;
mod local;
mod pacer;
mod state;

/// The rules every cluster store must pass (a store's own tests run them).
#[cfg(any(test, feature = "testing"))]
pub use cluster::suite;
pub use cluster::{ClusterQueueActor, ClusterSetup, GrantOpener};
pub use local::QueueActor;
/// The queue's rules, for the queue's benchmark.
#[cfg(feature = "testing")]
pub use state::{JoinOutcome, ModeSet, QueueState};
