//! What the WorkerPoolActor handles: its BackendActors' reports ([`WorkerEvent`]), workers
//! that join after start ([`JoinWorkers`]: a node's), workers a cluster lends for one session
//! ([`Lend`], [`GiveBack`]), status and shutdown. [`PoolPort`] is how a queue reaches it.

use std::time::Duration;

use actix::prelude::*;

use crate::domain::Mode;
use crate::ids::{TicketId, WorkerId};

use crate::status::StatusQuery;
use crate::worker::messages::{Stop, WorkerPort};
use crate::worker::{BackendFactory, Opener};

/// One configured worker (or one of a node's, once the gateway has reached it).
pub struct WorkerSetup {
    pub name: String,
    /// Where its backend comes from, for status ("builtin" or a library path).
    pub backend: String,
    pub modes: Vec<Mode>,
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
    pub ticket: TicketId,
    /// `NODE/WORKER`.
    pub slot: String,
    pub node: String,
    /// Where its backend is, for status.
    pub backend: String,
    pub mode: Mode,
    pub opener: Opener,
}

/// A lent worker's client left before it took it: the worker goes back to its node.
#[derive(Message)]
#[rtype(result = "()")]
pub struct GiveBack {
    pub worker: WorkerId,
}

/// What a BackendActor reports about itself. `generation` tells incarnations apart.
#[derive(Message)]
#[rtype(result = "()")]
pub enum WorkerEvent {
    Opened {
        worker: WorkerId,
        generation: u64,
        process_id: Option<u32>,
        /// What the backend can do (without vision, the worker serves no video).
        info: std::sync::Arc<crate::domain::BackendInfo>,
    },
    /// `transient`: the backend is out of reach for now (a node that is down), not broken:
    /// clients waiting for its modes keep waiting.
    OpenFailed {
        worker: WorkerId,
        generation: u64,
        reason: String,
        transient: bool,
    },
    /// A session (connection `conn`, the key it attached with) took the worker.
    Busy {
        worker: WorkerId,
        generation: u64,
        conn: u64,
        mode: Mode,
    },
    Resetting {
        worker: WorkerId,
        generation: u64,
    },
    Released {
        worker: WorkerId,
        generation: u64,
    },
    Failed {
        worker: WorkerId,
        generation: u64,
        reason: String,
    },
}

impl WorkerEvent {
    pub fn worker(&self) -> WorkerId {
        match self {
            WorkerEvent::Opened { worker, .. }
            | WorkerEvent::OpenFailed { worker, .. }
            | WorkerEvent::Busy { worker, .. }
            | WorkerEvent::Resetting { worker, .. }
            | WorkerEvent::Released { worker, .. }
            | WorkerEvent::Failed { worker, .. } => *worker,
        }
    }
}

/// The server is stopping: every backend closes. Answers how many closed within `within`.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ShutdownPool {
    pub within: Duration,
}

/// Where a queue (and the routes) reach the pool.
#[derive(Clone)]
pub struct PoolPort {
    pub lend: Recipient<Lend>,
    pub give_back: Recipient<GiveBack>,
    pub join: Recipient<JoinWorkers>,
    /// Every worker, as every role shows it.
    pub status: Recipient<StatusQuery>,
    pub shutdown: Recipient<ShutdownPool>,
}

impl PoolPort {
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
    pub id: WorkerId,
    pub name: String,
    pub generation: u64,
    pub opener: Opener,
    /// Where the actor reports ([`WorkerEvent`]).
    pub pool: Recipient<WorkerEvent>,
}

/// Starts a worker's BackendActor and answers where it is reached, and stopped.
pub type StartWorker = std::sync::Arc<dyn Fn(WorkerStart) -> (WorkerPort, Recipient<Stop>) + Send + Sync>;
