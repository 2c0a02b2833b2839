//! The edge between the actors and a cluster's shared queue: the store that several gateway
//! replicas share (`[cluster] engine = "redis"`), behind [`Coordinator`]. One process needs
//! none of it: its [`crate::queue::QueueActor`] keeps the queue in memory.
//!
//! The store holds who waits (tickets, in one global order), which node workers ("slots")
//! are free, and grants: a slot reserved for a ticket under a nonce its node issued. A grant
//! is only a reservation: the node admits a session only with the nonce it currently offers
//! the slot under, so a store that loses writes can cost a retry, never two sessions on one
//! worker. [`crate::queue::ClusterQueueActor`] drives a coordinator; a node's side of
//! the same store is [`NodeStore`]. `memory::MemoryStore` keeps it all in a process: the
//! reference the tests run the cluster's rules against, beside Redis.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use thiserror::Error;

use crate::domain::Mode;
use crate::ids::TicketId;

/// A store in memory: the reference the cluster's rules are tested against (test support).
#[cfg(any(test, feature = "testing"))]
pub mod memory;

/// Why a call to the cluster's store failed.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum ClusterError {
    /// The store cannot be reached, or refused the call (its error).
    #[error("the cluster's store: {0}")]
    Unreachable(String),
    /// The store answered something this server cannot read (what, and what it was).
    #[error("the cluster's store: unexpected {0}")]
    Unexpected(String),
    /// No master for the store: the Sentinels named none (their error).
    #[error("the cluster's store: no master from the Sentinels: {0}")]
    NoMaster(String),
}

/// The answer of a store call, to be awaited.
pub type ClusterFuture<T> = Pin<Box<dyn Future<Output = Result<T, ClusterError>> + Send>>;

/// A slot reserved for a ticket: connect to `addr` and attach worker `slot` with `nonce`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The ticket the slot is reserved for.
    pub ticket: TicketId,
    /// `NODE/WORKER`.
    pub slot: String,
    /// Where replicas reach the node (`HOST:PORT`).
    pub addr: String,
    /// The nonce the node offered the slot under; the node admits an attach only with it.
    pub nonce: String,
    /// The mode of the ticket's session.
    pub mode: Mode,
    /// The node's signature of its offer (slot, address, nonce): a replica dials a grant only
    /// if it verifies (the store cannot invent one, nor change where it sends the replica).
    pub sig: String,
}

impl Grant {
    /// The worker's name on its node (the part of `slot` after the node's name).
    pub fn worker(&self) -> &str {
        self.slot.split_once('/').map_or(self.slot.as_str(), |(_, w)| w)
    }
}

/// What enqueueing a client came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// A slot was free: it is reserved for the ticket at once.
    Granted(Grant),
    /// No slot is free: the ticket waits.
    Waiting {
        /// The ticket's number (the store's, or the one the client kept).
        ticket: TicketId,
        /// Its place in the queue, 1-based.
        position: usize,
        /// How many tickets are in the queue, across the cluster (those granted and not yet claimed
        /// included).
        length: usize,
    },
    /// `max_waiting` tickets wait already (across the cluster).
    Full {
        /// How many tickets are in the queue.
        length: usize,
    },
    /// No live node has a worker for the mode.
    Unavailable,
    /// The store does not know this replica (yet, or any more): it must beat first.
    UnknownReplica,
}

/// What a beat answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Beat {
    /// False when the store did not know this replica (it was retired after missing its
    /// lease, or the store restarted): every waiting client must be enqueued again.
    pub known: bool,
    /// Tickets of this replica an operator cancelled (on any replica) since the last beat.
    pub cancelled: Vec<TicketId>,
}

/// A ticket as the store has it.
#[derive(Debug, Clone, PartialEq)]
pub struct TicketView {
    /// The ticket's number.
    pub ticket: TicketId,
    /// The mode it waits for.
    pub mode: Mode,
    /// The replica whose client holds it.
    pub replica: String,
    /// Granted a slot, not yet claimed (it keeps its place meanwhile).
    pub granted: bool,
}

/// A node's worker as the store has it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotView {
    /// `NODE/WORKER`.
    pub slot: String,
    /// The node it runs on.
    pub node: String,
    /// The modes it serves.
    pub modes: Vec<Mode>,
    /// Its state.
    pub state: SlotState,
    /// The busy session's mode and since when (ms, the store's clock).
    pub busy: Option<(Mode, u64)>,
}

/// A node's worker's state in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Offered by its node, waiting for a ticket.
    Free,
    /// Granted to a ticket, not yet taken.
    Assigned,
    /// A session holds it.
    Busy,
    /// Its backend is not open on its node (or its node is gone).
    Down,
}

impl SlotState {
    /// The state's word in the store: `free`, `assigned`, `busy` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotState::Free => "free",
            SlotState::Assigned => "assigned",
            SlotState::Busy => "busy",
            SlotState::Down => "down",
        }
    }

    /// The store's word for it (a slot it cannot read is down).
    pub fn parse(s: &str) -> SlotState {
        match s {
            "free" => SlotState::Free,
            "assigned" => SlotState::Assigned,
            "busy" => SlotState::Busy,
            _ => SlotState::Down,
        }
    }
}

/// The whole queue at one instant of the store's clock.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterView {
    /// Bumped on every change.
    pub version: u64,
    /// The store's clock at that instant, in ms since the epoch.
    pub now_ms: u64,
    /// In queue order.
    pub tickets: Vec<TicketView>,
    /// Every worker of the live nodes, by node.
    pub slots: Vec<SlotView>,
    /// Moving average of session length per mode (chat, video, audio), seconds.
    pub average_s: [Option<f64>; 3],
}

/// A cluster's shared queue, as one replica sees it. Every call is one atomic step in the
/// store (no read-modify-write from the replica).
pub trait Coordinator: Send + Sync + 'static {
    /// This replica's name in the store (and in the nodes' logs).
    fn replica(&self) -> &str;
    /// This replica is alive for one more lease; whoever beats retires replicas and nodes
    /// whose lease ran out.
    fn beat(&self) -> ClusterFuture<Beat>;
    /// A client asks for a worker; `ticket` keeps the place of a client enqueued before.
    fn enqueue(&self, mode: Mode, ticket: Option<TicketId>, max_waiting: usize) -> ClusterFuture<Enqueued>;
    /// The session took its grant (the node admitted it).
    fn claim(&self, ticket: TicketId) -> ClusterFuture<()>;
    /// The client left; answers whether it was waiting.
    fn leave(&self, ticket: TicketId) -> ClusterFuture<bool>;
    /// The node refused the grant (stale nonce): the ticket waits again in its place.
    fn requeue(&self, grant: &Grant) -> ClusterFuture<bool>;
    /// An operator cancels a waiting ticket of any replica.
    fn cancel(&self, ticket: TicketId) -> ClusterFuture<bool>;
    /// The store's version: it changes whenever the queue or a worker does (cheap to read).
    fn version(&self) -> ClusterFuture<u64>;
    /// The whole queue as the store has it now.
    fn snapshot(&self) -> ClusterFuture<ClusterView>;
    /// Grants made to this replica's tickets by others (a node freeing a slot): waits up to
    /// `wait` for the first.
    fn grants(&self, wait: std::time::Duration) -> ClusterFuture<Vec<Grant>>;
}

/// What a node's offer came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Offered {
    /// Granted to a ticket; `push`: its replica keeps a link open to the node, and the grant
    /// was not put on the replica's list: the node tells it (the replica's name, the mode).
    Assigned {
        /// The ticket the worker is granted to.
        ticket: TicketId,
        /// The replica's name and the mode of the ticket's session, when the node must push the
        /// grant itself; `None` when it is on the replica's list.
        push: Option<(String, Mode)>,
    },
    /// Nobody waits for its modes: it stays free in the store.
    Free,
    /// The store does not know the node (it must beat first).
    UnknownNode,
}

/// A node offers a free worker of its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// `NODE/WORKER`.
    pub slot: String,
    /// Drawn by the node for this offer: it admits an attach only with it.
    pub nonce: String,
    /// The modes it serves.
    pub modes: Vec<Mode>,
    /// Where replicas reach the node.
    pub addr: String,
    /// The node's signature of slot, address and nonce, carried to the grant.
    pub sig: String,
    /// The mode and length of the session that just ended on it, once.
    pub ended: Option<(Mode, Duration)>,
    /// The replicas that keep a link open to the node: a grant for one of their tickets is
    /// pushed on it by the node rather than put on the replica's list.
    pub linked: Vec<String>,
}

/// A node's worker as its node reports it in a beat (the node's word is the truth; the store
/// follows it).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotReport {
    /// `NODE/WORKER`.
    pub slot: String,
    /// The modes it serves.
    pub modes: Vec<Mode>,
    /// What it is doing.
    pub state: Reported,
}

/// A node's worker's state, as its node reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reported {
    /// The session of this ticket holds it.
    Busy(TicketId),
    /// Its backend is not open.
    Down,
    /// Free, offered under this nonce.
    Offered(String),
    /// Free, its offer under way.
    Pending,
}

/// What a node's beat answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeBeat {
    /// False when the store did not know the node (a first beat, or the store restarted).
    pub known: bool,
    /// Workers to offer again under a new nonce (a grant of them not taken in time, or an
    /// offer the store lost).
    pub again: Vec<String>,
}

/// A cluster's store, as one node sees it. Every call is one atomic step in the store.
pub trait NodeStore: Send + Sync + 'static {
    /// This node's name in the store.
    fn node(&self) -> &str;
    /// Offers a free worker: it goes to the first waiting ticket whose mode it serves, or stays
    /// free.
    fn offer(&self, offer: Offer) -> ClusterFuture<Offered>;
    /// The node, reached at `addr`, is alive for one more lease; a grant not taken within
    /// `attach_timeout` is stale.
    fn node_beat(&self, addr: &str, attach_timeout: Duration, reports: &[SlotReport]) -> ClusterFuture<NodeBeat>;
    /// Puts a grant on `replica`'s list, as an offer would have (a grant the node could not
    /// push on a link of that replica).
    fn deliver(&self, replica: &str, grant: &Grant) -> ClusterFuture<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_names_its_node_and_worker() {
        let g = Grant {
            ticket: 1,
            slot: "gpu1/sim-0".into(),
            addr: "10.0.0.5:7100".into(),
            nonce: "n".into(),
            mode: Mode::Chat,
            sig: String::new(),
        };
        assert_eq!(g.worker(), "sim-0");
    }
}
