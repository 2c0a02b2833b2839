//! What a queue handles, local ([`super::local::QueueActor`]) or a cluster's
//! ([`super::cluster::ClusterQueueActor`]) alike: from sessions and routes (join, leave, claim,
//! cancel, snapshot: [`QueuePort`]), from the pool (its workers' availability and the workers
//! it lent: [`WorkerFeed`]), and a replica's own (grants pushed by nodes, cluster status).

use std::time::Duration;

use actix::prelude::*;

use crate::domain::Mode;
use crate::edge::coordinator::{ClusterView, Grant};
pub use crate::queue::state::TicketStatus;
use crate::queue::state::{TicketId, WorkerId};
use crate::session::messages::QueueNotice;
use crate::worker::messages::WorkerLink;

/// A session asks for a worker. `conn` identifies it in `Leave` and `Claim`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Join {
    pub conn: u64,
    pub mode: Mode,
    pub notify: Recipient<QueueNotice>,
    /// It was assigned a worker that was gone before it could take it: it goes back to the
    /// head of the queue.
    pub front: bool,
}

/// The session is gone (or no longer needs a worker).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Leave {
    pub conn: u64,
}

/// The session took the worker it was assigned.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Claim {
    pub conn: u64,
}

/// An operator cancels a waiting ticket. Answers whether it was waiting.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Cancel {
    pub ticket: TicketId,
}

/// Every waiting ticket, for `/status`.
#[derive(Message)]
#[rtype(result = "Vec<TicketStatus>")]
pub struct QueueSnapshot;

/// Where sessions and routes reach the queue: a [`super::local::QueueActor`] (one process),
/// or a [`super::cluster::ClusterQueueActor`] (replicas sharing a store).
#[derive(Clone)]
pub struct QueuePort {
    pub join: Recipient<Join>,
    pub leave: Recipient<Leave>,
    pub claim: Recipient<Claim>,
    pub cancel: Recipient<Cancel>,
    pub snapshot: Recipient<QueueSnapshot>,
}

impl QueuePort {
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

/// A worker is ready for a session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerIdle {
    pub link: WorkerLink,
}

/// A worker is (re)starting: it will serve once idle.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerStarting {
    pub worker: WorkerId,
    /// Why it is starting again (its last failure), if it failed.
    pub reason: Option<String>,
}

/// A worker cannot serve until it recovers (its backend does not open).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerDown {
    pub worker: WorkerId,
    pub reason: String,
}

/// A worker's backend serves only `modes` of those it was configured for (it reported no
/// vision: no video).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerModes {
    pub worker: WorkerId,
    pub modes: Vec<Mode>,
}

/// A worker joined the pool after start (a node's); `worker` is the id the pool gave it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerJoined {
    pub worker: WorkerId,
    pub modes: Vec<Mode>,
}

/// A session of `mode` ended after `length` (for the ETAs).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SessionFinished {
    pub mode: Mode,
    pub length: Duration,
}

/// A worker the pool was asked to lend to `ticket` ([`crate::pool::messages::Lend`]) is open:
/// the ticket's session may take it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LentOpened {
    pub ticket: TicketId,
    pub link: WorkerLink,
}

/// A worker the pool was asked to lend to `ticket` could not be taken (its node refused the
/// grant, or is out of reach).
#[derive(Message)]
#[rtype(result = "()")]
pub struct LendFailed {
    pub ticket: TicketId,
    pub reason: String,
}

/// How the pool tells its queue about its workers. Every queue takes all of it: a local queue
/// has no use for lent workers, a cluster's for the availability of workers it does not own.
#[derive(Clone)]
pub struct WorkerFeed {
    pub idle: Recipient<WorkerIdle>,
    pub starting: Recipient<WorkerStarting>,
    pub down: Recipient<WorkerDown>,
    pub modes: Recipient<WorkerModes>,
    pub joined: Recipient<WorkerJoined>,
    pub finished: Recipient<SessionFinished>,
    pub lent: Recipient<LentOpened>,
    pub lend_failed: Recipient<LendFailed>,
}

impl WorkerFeed {
    pub fn of<A>(queue: &Addr<A>) -> WorkerFeed
    where
        A: Actor<Context = Context<A>>
            + Handler<WorkerIdle>
            + Handler<WorkerStarting>
            + Handler<WorkerDown>
            + Handler<WorkerModes>
            + Handler<WorkerJoined>
            + Handler<SessionFinished>
            + Handler<LentOpened>
            + Handler<LendFailed>,
    {
        WorkerFeed {
            idle: queue.clone().recipient(),
            starting: queue.clone().recipient(),
            down: queue.clone().recipient(),
            modes: queue.clone().recipient(),
            joined: queue.clone().recipient(),
            finished: queue.clone().recipient(),
            lent: queue.clone().recipient(),
            lend_failed: queue.clone().recipient(),
        }
    }
}

/// A grant a node pushed to this replica on a link it keeps open to the node (the link
/// attached already: the opener finds it by the grant's nonce).
#[derive(Message)]
#[rtype(result = "()")]
pub struct GrantPushed(pub Grant);

/// What `/status` shows of the cluster: this replica, whether it reaches the store, and the
/// last view of the whole queue and every node's workers.
#[derive(Message)]
#[rtype(result = "ClusterStatus")]
pub struct ClusterStatusQuery;

#[derive(Debug, Clone)]
pub struct ClusterStatus {
    pub replica: String,
    pub store_up: bool,
    pub view: ClusterView,
}
