//! The queue: who waits for a worker, in which order, and who is told what.
//!
//! - [`state`]: the rules of one process's queue (FIFO across modes, positions, ETAs), a plain
//!   struct; [`local::QueueActor`] delivers messages to it.
//! - [`cluster`]: a replica's queue, shared with other replicas through a
//!   [`crate::edge::coordinator::Coordinator`]: its rules are [`cluster::state::ClusterState`],
//!   its actor [`cluster::ClusterQueueActor`].
//! - [`pacer`]: how position updates are coalesced and spread (both queues).
//! - [`messages`]: what a queue handles, from sessions ([`messages::QueuePort`]) and from the
//!   pool ([`messages::WorkerFeed`]). Either queue fits both ports.

pub mod cluster;
pub mod local;
pub mod messages;
pub mod pacer;
pub mod state;
