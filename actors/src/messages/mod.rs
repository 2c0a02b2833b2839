//! What the actors say to each other: each file is one conversation, its messages and the port
//! its receiver is reached through, on domain types only. No actor imports another: a session,
//! the queue, the pool and the workers meet here.
//!
//! - [`queue`]: a session (or a route) and its queue: join, leave, claim, cancel, a snapshot,
//!   and what the queue tells the session ([`queue::QueueNotice`]); the pool's news of its
//!   workers to the queue ([`queue::QueueFeed`]).
//! - [`worker`]: a session (or a node's link) and its worker's BackendActor: attach, prepare,
//!   chunks and turns, interrupts, detach, and what the worker answers
//!   ([`worker::BackendEvent`]); a worker as handed to a session ([`worker::WorkerLink`]).
//! - [`pool`]: the pool and its workers, and what the queue asks of the pool (lend, give
//!   back).
//! - [`transcribe`]: a session and the gateway's recogniser.
//! - [`delegate`]: a session and the decider beside its voice.
//! - [`session`]: the server and its sessions (shutdown).

pub mod delegate;
pub mod pool;
pub mod queue;
pub mod session;
pub mod transcribe;
pub mod worker;
