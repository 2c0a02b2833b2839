//! What the WorkerPoolActor handles: its BackendActors' reports ([`WorkerEvent`]), workers
//! that join after start ([`JoinWorkers`]: a node's), workers a cluster lends for one session
//! ([`Lend`], [`GiveBack`]), status and shutdown. [`PoolPort`] is how a queue reaches it.

use std::time::Duration;

use actix::prelude::*;

use crate::domain::Mode;
use crate::ids::{TicketId, WorkerId};

use crate::edge::backend::{BackendFactory, Opener};
use crate::messages::worker::{Stop, WorkerPort};
use crate::status::StatusQuery;

/// One configured worker (or one of a node's, once the gateway has reached it).
pub struct WorkerSetup {
    /// The worker's name, unique in the pool; `NODE/WORKER` for a node's.
    pub name: String,
    /// Where its backend comes from, for status ("builtin" or a library path).
    pub backend: String,
    /// The modes it serves, as configured.
    pub modes: Vec<Mode>,
    /// Opens its backend, at start and at every restart.
    pub factory: BackendFactory,
    /// The node it runs on (none: this host).
    pub node: Option<String>,
}

/// Workers that join after start: a node's, once the gateway has reached it. They get the
/// next ids, in order, in the pool and in the queue alike.
#[derive(Message)]
#[rtype(result = "()")]
pub struct JoinWorkers(pub Vec<WorkerSetup>);

/// A worker of a cluster's node, granted by the cluster's store to this replica's ticket
/// `ticket` for one session. The pool starts a BackendActor on `opener` (a link attached
/// with the grant, or being attached); the queue hears `LentOpened` or `LendFailed`. When
/// the session ends the actor stops and the link goes back to the node.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Lend {
    /// The ticket the worker is granted to.
    pub ticket: TicketId,
    /// `NODE/WORKER`.
    pub slot: String,
    /// The node the worker runs on.
    pub node: String,
    /// Where its backend is, for status.
    pub backend: String,
    /// The mode of the ticket's session.
    pub mode: Mode,
    /// How the BackendActor gets the backend: over the link attached with the grant.
    pub opener: Opener,
}

/// A lent worker's client left before it took it: the worker goes back to its node.
#[derive(Message)]
#[rtype(result = "()")]
pub struct GiveBack {
    /// The lent worker's id in the pool.
    pub worker: WorkerId,
}

/// What a BackendActor reports about itself. `generation` tells incarnations apart.
#[derive(Message)]
#[rtype(result = "()")]
pub enum WorkerEvent {
    /// The backend is open and ready.
    Opened {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
        /// The process hosting the backend, when it runs in one of its own.
        process_id: Option<u32>,
        /// What the backend can do (without vision, the worker serves no video).
        info: std::sync::Arc<crate::domain::BackendInfo>,
    },
    /// `transient`: the backend is out of reach for now (a node that is down), not broken:
    /// clients waiting for its modes keep waiting.
    OpenFailed {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
        /// Why the backend did not open.
        reason: String,
        /// The backend is out of reach for now, not broken.
        transient: bool,
    },
    /// A session (connection `conn`, the key it attached with) took the worker.
    Busy {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
        /// The session's connection number.
        conn: u64,
        /// The session's mode.
        mode: Mode,
    },
    /// The session detached; the backend is being reset.
    Resetting {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
    },
    /// The backend was reset after a session: the worker is free again (a lent one goes back
    /// to its node).
    Released {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
    },
    /// The backend failed at work (a crash, a call past its deadline, a failed reset): the actor
    /// stops.
    Failed {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
        /// Why it failed.
        reason: String,
    },
    /// Its backend had no room for the session that took it (a server's slot taken by someone
    /// else): the session waits for another worker, no session was served, and the worker
    /// restarts with backoff as after a failure.
    NoRoom {
        /// The worker's id in the pool.
        worker: WorkerId,
        /// The incarnation of the BackendActor that reports; a report of an older one is ignored.
        generation: u64,
        /// Why.
        reason: String,
    },
}

impl WorkerEvent {
    /// The worker the report is about.
    pub fn worker(&self) -> WorkerId {
        match self {
            WorkerEvent::Opened { worker, .. }
            | WorkerEvent::OpenFailed { worker, .. }
            | WorkerEvent::Busy { worker, .. }
            | WorkerEvent::Resetting { worker, .. }
            | WorkerEvent::Released { worker, .. }
            | WorkerEvent::Failed { worker, .. }
            | WorkerEvent::NoRoom { worker, .. } => *worker,
        }
    }
}

/// The server is stopping: every backend closes. Answers how many closed within `within`.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ShutdownPool {
    /// How long the backends have to close; one that takes longer is not counted.
    pub within: Duration,
}

/// Where a queue (and the routes) reach the pool.
#[derive(Clone)]
pub struct PoolPort {
    /// Runs a worker a cluster lends this replica ([`Lend`]).
    pub lend: Recipient<Lend>,
    /// Gives a lent worker back unused ([`GiveBack`]).
    pub give_back: Recipient<GiveBack>,
    /// Adds a node's workers ([`JoinWorkers`]).
    pub join: Recipient<JoinWorkers>,
    /// Every worker, as every role shows it.
    pub status: Recipient<StatusQuery>,
    /// Closes every backend at shutdown ([`ShutdownPool`]).
    pub shutdown: Recipient<ShutdownPool>,
}

impl PoolPort {
    /// The ports of a pool actor.
    pub fn of<A>(addr: &Addr<A>) -> PoolPort
    where
        A: Actor<Context = Context<A>>
            + Handler<Lend>
            + Handler<GiveBack>
            + Handler<JoinWorkers>
            + Handler<StatusQuery>
            + Handler<ShutdownPool>,
    {
        PoolPort {
            lend: addr.clone().recipient(),
            give_back: addr.clone().recipient(),
            join: addr.clone().recipient(),
            status: addr.clone().recipient(),
            shutdown: addr.clone().recipient(),
        }
    }
}

/// What the pool gives the function that starts a worker's BackendActor
/// ([`crate::worker::starter`] in every role; a stand-in in the pool's tests).
pub struct WorkerStart {
    /// The worker's id in the pool.
    pub id: WorkerId,
    /// The worker's name, for logs (`NODE/WORKER` for a node's).
    pub name: String,
    /// The incarnation to report as ([`WorkerEvent`]'s `generation`).
    pub generation: u64,
    /// How the actor gets its backend.
    pub opener: Opener,
    /// Where the actor reports ([`WorkerEvent`]).
    pub pool: Recipient<WorkerEvent>,
}

/// Starts a worker's BackendActor and answers where it is reached, and stopped.
pub type StartWorker = std::sync::Arc<dyn Fn(WorkerStart) -> (WorkerPort, Recipient<Stop>) + Send + Sync>;
