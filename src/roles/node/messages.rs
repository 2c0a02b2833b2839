//! What the node's actors handle: the [`super::lender::Lender`] (which worker goes to which
//! gateway link; reached through a [`LenderPort`]), and a [`super::link::GatewayLink`] (a grant
//! pushed on a link a replica keeps open).

use actix::prelude::*;
use omni_actors::domain::Mode;
use omni_actors::messages::worker::WorkerLink;

use omni_backend_host::link::wire::{AttachGrant, NodeWorker, PushedGrant};

/// A gateway link asks for worker `worker`, for itself (`link`). In a cluster only with the
/// grant the worker is offered under (its nonce is then spent). Answers the worker, or why not.
#[derive(Message)]
#[rtype(result = "Result<Lent, Refusal>")]
pub(super) struct Borrow {
    pub worker: String,
    pub link: u64,
    /// Names the gateway in logs.
    pub gateway: String,
    pub grant: Option<AttachGrant>,
}

/// Link `link` ended (`why`): its worker, reset meanwhile, is free for the next gateway.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct GiveBack {
    pub worker: String,
    pub link: u64,
    pub why: String,
}

/// What discovery answers: every worker, as it is now.
#[derive(Message)]
#[rtype(result = "Vec<NodeWorker>")]
pub(super) struct Describe;

/// A link replica `replica` keeps open for grants: it takes the next one pushed to that replica
/// (on `to`), until it is gone.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Standby {
    pub replica: String,
    pub link: u64,
    pub to: Recipient<Push>,
    /// Ends the link when its replica is revoked.
    pub revoked: Recipient<Revoked>,
}

/// The node's `[cluster] revoked_replicas` is now `replicas` (read again on SIGHUP): the links
/// they keep open for grants end, and a link of theirs registered later is ended at once (a
/// handshake that finished just before the reload).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Revoke {
    pub replicas: Vec<String>,
}

/// A link kept open for grants by a replica the node revoked: it ends.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Revoked;

/// A link kept open for grants ended before it took one.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct StandbyEnded {
    pub replica: String,
    pub link: u64,
}

/// A grant for the link that takes it: the lender reserved `worker` for it; the link attaches
/// it and tells the replica `pushed`. Answers whether the replica was told (else the lender
/// tries the replica's next link, then hands the grant to the store).
#[derive(Message)]
#[rtype(result = "bool")]
pub(super) struct Push {
    pub worker: WorkerLink,
    pub mode: Mode,
    pub pushed: PushedGrant,
}

/// Why a gateway is refused a worker. Sent to the gateway as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    #[error("this node has no worker {0}")]
    NoSuchWorker(String),
    #[error("worker {0} is attached to another gateway")]
    Attached(String),
    #[error("worker {0} serves a cluster: attach with a grant from its store")]
    NeedsGrant(String),
    #[error("stale grant for ticket {ticket}: worker {worker} is no longer offered under it")]
    StaleGrant { ticket: u64, worker: String },
    #[error("worker {worker} failed: {reason}")]
    Failed { worker: String, reason: String },
    #[error("worker {0} is starting (its backend is opening)")]
    Starting(String),
}

/// What a borrowed worker is lent as: the worker, and the mode its session runs (for status).
pub(super) struct Lent {
    pub worker: WorkerLink,
    pub mode: Mode,
}

/// The node joins its cluster's store: the lender beats every `every` (the first at once) and
/// offers its free workers.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct JoinCluster {
    pub cluster: super::offers::Cluster,
    pub every: std::time::Duration,
}

/// Where links reach the lender.
#[derive(Clone)]
pub(super) struct LenderPort {
    pub borrow: Recipient<Borrow>,
    pub give_back: Recipient<GiveBack>,
    pub describe: Recipient<Describe>,
    pub standby: Recipient<Standby>,
    pub standby_ended: Recipient<StandbyEnded>,
}

impl LenderPort {
    pub(super) fn of<A>(addr: &Addr<A>) -> LenderPort
    where
        A: Actor<Context = Context<A>>
            + Handler<Borrow>
            + Handler<GiveBack>
            + Handler<Describe>
            + Handler<Standby>
            + Handler<StandbyEnded>,
    {
        LenderPort {
            borrow: addr.clone().recipient(),
            give_back: addr.clone().recipient(),
            describe: addr.clone().recipient(),
            standby: addr.clone().recipient(),
            standby_ended: addr.clone().recipient(),
        }
    }
}
