//! What a queue handles, local ([`crate::queue::QueueActor`]) or a cluster's
//! ([`crate::queue::ClusterQueueActor`]) alike: from sessions and routes (join, leave, claim,
//! cancel, snapshot: [`QueuePort`]), from the pool (its workers' availability and the workers
//! it lent: [`QueueFeed`]), and a replica's own (grants pushed by nodes).

use std::time::Duration;

use actix::prelude::*;

use crate::domain::Mode;
use crate::edge::coordinator::Grant;
use crate::ids::{TicketId, WorkerId};
use crate::protocol::{ProtocolError, QueueInfo};

use super::worker::WorkerLink;

/// One waiting ticket as reported by `/status`.
#[derive(Debug, Clone, PartialEq)]
pub struct TicketStatus {
    /// The ticket's number.
    pub ticket: TicketId,
    /// The mode it waits for.
    pub mode: Mode,
    /// Its place in the queue, 1-based.
    pub position: usize,
    /// How long it has waited so far.
    pub waited: Duration,
    /// Its estimated wait, in seconds.
    pub estimated_wait_s: f64,
    /// In a cluster: the replica whose client holds it.
    pub replica: Option<String>,
}

/// A session asks for a worker. `conn` identifies it in `Leave` and `Claim`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Join {
    /// The session's connection number.
    pub conn: u64,
    /// The mode it needs a worker for.
    pub mode: Mode,
    /// Where the session hears its position, its worker, or why it is refused.
    pub notify: Recipient<QueueNotice>,
    /// It was assigned a worker that was gone before it could take it: it goes back to the
    /// head of the queue.
    pub front: bool,
}

/// The session is gone (or no longer needs a worker).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Leave {
    /// The connection number it joined with.
    pub conn: u64,
}

/// The session took the worker it was assigned.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Claim {
    /// The connection number it joined with.
    pub conn: u64,
}

/// An operator cancels a waiting ticket. Answers whether it was waiting.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Cancel {
    /// The ticket's number, as `/status` shows it.
    pub ticket: TicketId,
}

/// Every waiting ticket, for `/status`.
#[derive(Message)]
#[rtype(result = "Vec<TicketStatus>")]
pub struct QueueSnapshot;

/// Where sessions and routes reach the queue: a [`crate::queue::QueueActor`] (one process),
/// or a [`crate::queue::ClusterQueueActor`] (replicas sharing a store).
#[derive(Clone)]
pub struct QueuePort {
    /// A session asks for a worker ([`Join`]).
    pub join: Recipient<Join>,
    /// A session is gone ([`Leave`]).
    pub leave: Recipient<Leave>,
    /// A session took its worker ([`Claim`]).
    pub claim: Recipient<Claim>,
    /// An operator cancels a ticket ([`Cancel`]).
    pub cancel: Recipient<Cancel>,
    /// Every waiting ticket, for `/status` ([`QueueSnapshot`]).
    pub snapshot: Recipient<QueueSnapshot>,
}

impl QueuePort {
    /// The ports of a queue actor.
    pub fn of<A>(queue: &Addr<A>) -> QueuePort
    where
        A: Actor<Context = Context<A>>
            + Handler<Join>
            + Handler<Leave>
            + Handler<Claim>
            + Handler<Cancel>
            + Handler<QueueSnapshot>,
    {
        QueuePort {
            join: queue.clone().recipient(),
            leave: queue.clone().recipient(),
            claim: queue.clone().recipient(),
            cancel: queue.clone().recipient(),
            snapshot: queue.clone().recipient(),
        }
    }
}

/// What the pool tells the queue of its own workers (a gateway's queue, a node's lender), in
/// one message: each queue takes what it needs of it.
#[derive(Message)]
#[rtype(result = "()")]
pub enum WorkerReport {
    /// A worker is ready for a session.
    Idle(WorkerLink),
    /// A worker is (re)starting: it will serve once idle. Why it is starting again (its last
    /// failure).
    Starting {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// Why it is starting again: its last failure.
        reason: String,
    },
    /// A worker cannot serve until it recovers (its backend does not open).
    Down {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// Why its backend did not open.
        reason: String,
    },
    /// A worker's backend serves only `modes` of those it was configured for (it reported no
    /// vision: no video).
    Modes {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The modes it serves now.
        modes: Vec<Mode>,
    },
    /// A worker joined the pool after start (a node's); `worker` is the id the pool gave it.
    Joined {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The modes it is configured for.
        modes: Vec<Mode>,
    },
    /// A source of workers (a node) was reached: its workers, if any, joined just before.
    Reached,
    /// A session of `mode` ended after `length` (for the ETAs).
    Finished {
        /// The session's mode.
        mode: Mode,
        /// How long the worker was busy with it, from its attach to its detach (or failure).
        length: Duration,
    },
}

/// What the pool tells a cluster's queue of a worker it asked the pool to lend to `ticket`
/// ([`crate::messages::pool::Lend`]).
#[derive(Message)]
#[rtype(result = "()")]
pub enum LendReport {
    /// The worker is open: the ticket's session may take it.
    Opened {
        /// The ticket the worker was lent to.
        ticket: TicketId,
        /// The worker, as handed to the ticket's session.
        link: WorkerLink,
    },
    /// It could not be taken (its node refused the grant, or is out of reach).
    Failed {
        /// The ticket the worker was to be lent to.
        ticket: TicketId,
        /// Why it could not be taken.
        reason: String,
    },
}

/// How the pool tells its queue about its workers: a queue that owns them hears their news; a
/// cluster's queue, whose workers the pool only borrows, hears how each lend went.
#[derive(Clone)]
pub enum QueueFeed {
    /// A gateway's queue, a node's lender.
    Owned(Recipient<WorkerReport>),
    /// A replica's cluster queue.
    Lent(Recipient<LendReport>),
}

/// A grant a node pushed to this replica on a link it keeps open to the node (the link
/// attached already: the opener finds it by the grant's nonce).
#[derive(Message)]
#[rtype(result = "()")]
pub struct GrantPushed(pub Grant);

/// What the queue tells a session.
#[derive(Message)]
#[rtype(result = "()")]
pub enum QueueNotice {
    /// It must wait (the first notice).
    Queued(QueueInfo),
    /// Its position or ETA changed.
    Update(QueueInfo),
    /// A worker is reserved for it; it must claim it.
    Assigned {
        /// The session's ticket.
        ticket: TicketId,
        /// The worker reserved for it.
        worker: WorkerLink,
    },
    /// It cannot be served: queue full, or no worker for its mode.
    Rejected(ProtocolError),
    /// An operator cancelled its ticket.
    Cancelled,
}
