//! ClusterQueueActor: the queue of a gateway replica that shares its queue and its workers
//! (node workers) with other replicas through a [`Coordinator`]. Sessions reach it exactly as
//! they reach the [`super::local::QueueActor`] (a [`crate::messages::queue::QueuePort`]), and the pool feeds it as it
//! feeds that one (a [`crate::messages::queue::QueueFeed`]). What it decides is [`state::ClusterState`]'s: this actor
//! makes the store's calls, asks the pool to lend granted workers, arms the timers, and tells
//! the sessions. A beat every third of the lease keeps this replica known; the store's version
//! is read every [`POLL`], and a view of the whole queue when it changed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::edge::backend::Opener;
use crate::edge::coordinator::{ClusterError, ClusterView, Coordinator, Grant};
use crate::messages::pool::{GiveBack, Lend, PoolPort};
use crate::messages::queue::QueueNotice;
use crate::messages::queue::{Cancel, Claim, GrantPushed, Join, Leave, LendReport, QueueSnapshot};
use crate::observe::metrics;
use crate::status::{ClusterStatus, ServerStatus, StatusQuery};

mod state;
#[cfg(any(test, feature = "testing"))]
pub mod suite;
mod view;

use state::{ClusterRules, ClusterState, Effect, Tell, Timer};

/// How often the store's version is read (a change triggers a new view).
pub(super) const POLL: Duration = Duration::from_millis(100);

/// Opens the backend of a grant: a link to the node's worker, attached with the nonce (a
/// factory, run on the worker's thread), or the link the node pushed the grant on, attached
/// already (open at once).
pub type GrantOpener = Arc<dyn Fn(&Grant) -> Opener + Send + Sync>;

/// What a replica's queue is built from.
pub struct ClusterSetup {
    /// The cluster's store, as this replica reaches it.
    pub coordinator: Arc<dyn Coordinator>,
    /// Opens the backend of each grant this replica's tickets get.
    pub opener: GrantOpener,
    /// Where granted workers are lent and given back.
    pub pool: PoolPort,
    /// The most tickets waiting across the cluster; one more is refused with `queue_full`.
    pub max_waiting: usize,
    /// Session length per mode (chat, video, audio) assumed before the store has learnt one.
    pub typical: [Duration; 3],
    /// How often every waiting client is told a fresh ETA (`queue.update_interval_s`).
    pub update_interval: Duration,
    /// The replica's lease in the store: it beats every third of it, and is retired when one passes
    /// without a beat.
    pub lease: Duration,
}

/// A gateway replica's queue; see the module's documentation.
pub struct ClusterQueueActor {
    coordinator: Arc<dyn Coordinator>,
    opener: GrantOpener,
    pool: PoolPort,
    lease: Duration,
    max_waiting: usize,
    state: ClusterState<Recipient<QueueNotice>>,
}

impl ClusterQueueActor {
    /// A queue on `setup`'s store; it beats as soon as it starts.
    pub fn new(setup: ClusterSetup) -> ClusterQueueActor {
        let rules = ClusterRules {
            replica: setup.coordinator.replica().to_string(),
            typical: setup.typical,
            update_interval: setup.update_interval,
        };
        ClusterQueueActor {
            state: ClusterState::new(rules, Instant::now()),
            coordinator: setup.coordinator,
            opener: setup.opener,
            pool: setup.pool,
            lease: setup.lease,
            max_waiting: setup.max_waiting,
        }
    }

    /// Carries out what the rules decided.
    fn apply(&mut self, effects: Vec<Effect<Recipient<QueueNotice>>>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                Effect::Enqueue { conn, mode, ticket } => {
                    let call = self.coordinator.enqueue(mode, ticket, self.max_waiting);
                    ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                        let effects = act.state.enqueued(conn, result, Instant::now());
                        act.apply(effects, ctx);
                    }));
                }
                Effect::Beat => self.beat(ctx),
                Effect::Lend(grant) => {
                    let opener = (self.opener)(&grant);
                    let node = grant.slot.split_once('/').map_or(grant.slot.as_str(), |(n, _)| n).to_string();
                    self.pool.lend.do_send(Lend {
                        ticket: grant.ticket,
                        backend: format!("node {node} ({})", grant.addr),
                        slot: grant.slot,
                        node,
                        mode: grant.mode,
                        opener,
                    });
                }
                Effect::GiveBack(worker) => self.pool.give_back.do_send(GiveBack { worker }),
                Effect::Leave(ticket) => self.call(self.coordinator.leave(ticket), "leave the queue", ticket, ctx),
                Effect::Requeue(grant) => {
                    let ticket = grant.ticket;
                    self.call(self.coordinator.requeue(&grant), "go back to its place", ticket, ctx)
                }
                Effect::Claim(ticket) => {
                    // The node admitted the session: the store learns it at the node's next beat.
                    self.call(self.coordinator.claim(ticket), "record its claim", ticket, ctx)
                }
                Effect::Tell(to, tell) => to.do_send(match tell {
                    Tell::Queued(info) => QueueNotice::Queued(info),
                    Tell::Update(info) => QueueNotice::Update(info),
                    Tell::Rejected(e) => QueueNotice::Rejected(e),
                    Tell::Cancelled => QueueNotice::Cancelled,
                }),
                Effect::After(timer, after) => {
                    ctx.run_later(after, move |act, ctx| {
                        let effects = match timer {
                            Timer::SendUpdates => act.state.send_updates(),
                            Timer::TellLater => act.state.tell_later(Instant::now()),
                        };
                        act.apply(effects, ctx);
                    });
                }
            }
        }
        metrics().queue_length.set(self.state.waiting() as i64);
    }

    /// A store call whose answer changes nothing here: a failure is logged.
    fn call<T: 'static>(
        &mut self,
        call: crate::edge::coordinator::ClusterFuture<T>,
        what: &'static str,
        ticket: u64,
        ctx: &mut Context<Self>,
    ) {
        ctx.spawn(call.into_actor(self).map(move |result, _, _| {
            if let Err(e) = result {
                log::warn!("cluster: ticket {ticket}: cannot {what}: {e}");
            }
        }));
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        let call = self.coordinator.beat();
        ctx.spawn(call.into_actor(self).map(|result, act, ctx| {
            let effects = act.state.beaten(result);
            metrics().cluster_store_up.set(act.state.store_up() as i64);
            act.apply(effects, ctx);
        }));
    }

    /// Reads the store's version; a change (or the refresh falling due) reads a new view.
    fn poll(&mut self, ctx: &mut Context<Self>) {
        let Some((seen, due)) = self.state.poll(Instant::now()) else { return };
        let coordinator = self.coordinator.clone();
        let read = async move {
            let version = coordinator.version().await?;
            if version == seen && !due {
                return Ok(None);
            }
            coordinator.snapshot().await.map(Some)
        };
        ctx.spawn(read.into_actor(self).map(|result: Result<Option<ClusterView>, ClusterError>, act, ctx| {
            let view = result.unwrap_or_else(|e| {
                log::debug!("cluster: cannot read the queue: {e}");
                None
            });
            let effects = act.state.viewed(view, Instant::now());
            metrics().cluster_waiting.set(act.state.view().tickets.len() as i64);
            act.apply(effects, ctx);
        }));
    }

    fn grants_loop(&mut self, ctx: &mut Context<Self>) {
        let call = self.coordinator.grants(Duration::from_secs(1));
        ctx.spawn(call.into_actor(self).map(|result, act, ctx| match result {
            Ok(grants) => {
                for grant in grants {
                    let effects = act.state.granted(grant, Instant::now());
                    act.apply(effects, ctx);
                }
                act.grants_loop(ctx);
            }
            Err(e) => {
                log::debug!("cluster: cannot read grants: {e}");
                ctx.run_later(POLL, |act, ctx| act.grants_loop(ctx));
            }
        }));
    }
}

impl Actor for ClusterQueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.beat(ctx);
        ctx.run_interval(self.lease / 3, |act, ctx| act.beat(ctx));
        ctx.run_interval(POLL, |act, ctx| act.poll(ctx));
        self.grants_loop(ctx);
    }
}

impl Handler<GrantPushed> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: GrantPushed, ctx: &mut Context<Self>) {
        let effects = self.state.granted(msg.0, Instant::now());
        self.apply(effects, ctx);
    }
}

impl Handler<Join> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: Join, ctx: &mut Context<Self>) {
        let effects = self.state.join(msg.conn, msg.mode, msg.notify, msg.front);
        self.apply(effects, ctx);
    }
}

impl Handler<Leave> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: Leave, ctx: &mut Context<Self>) {
        let effects = self.state.leave(msg.conn);
        self.apply(effects, ctx);
    }
}

impl Handler<Claim> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: Claim, ctx: &mut Context<Self>) {
        let effects = self.state.claim(msg.conn);
        self.apply(effects, ctx);
    }
}

impl Handler<Cancel> for ClusterQueueActor {
    type Result = ResponseActFuture<Self, bool>;
    fn handle(&mut self, msg: Cancel, _: &mut Context<Self>) -> Self::Result {
        let call = self.coordinator.cancel(msg.ticket);
        Box::pin(call.into_actor(self).map(move |result, act, ctx| {
            let cancelled = result.unwrap_or(false);
            let effects = act.state.cancelled(msg.ticket, cancelled);
            act.apply(effects, ctx);
            cancelled
        }))
    }
}

impl Handler<QueueSnapshot> for ClusterQueueActor {
    type Result = MessageResult<QueueSnapshot>;
    fn handle(&mut self, _: QueueSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.tickets(Instant::now()))
    }
}

impl Handler<StatusQuery> for ClusterQueueActor {
    type Result = ResponseActFuture<Self, ServerStatus>;
    /// Every node's worker as the store has it, with what this replica knows of those it was
    /// lent (their sessions here, their counters and failures).
    fn handle(&mut self, _: StatusQuery, _: &mut Context<Self>) -> Self::Result {
        let lent = self.pool.status.send(StatusQuery);
        Box::pin(lent.into_actor(self).map(|lent, act, _| {
            let lent = lent.map(|s| s.workers).unwrap_or_default();
            let cluster = ClusterStatus {
                replica: act.state.replica().to_string(),
                store_up: act.state.store_up(),
                store_error: act.state.store_error().map(str::to_string),
            };
            ServerStatus { workers: view::rows(act.state.view(), &lent), cluster: Some(cluster) }
        }))
    }
}

impl Handler<LendReport> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, report: LendReport, ctx: &mut Context<Self>) {
        match report {
            LendReport::Opened { ticket, link } => match self.state.lent(ticket, link.id) {
                Ok((ticket, to)) => to.do_send(QueueNotice::Assigned { ticket, worker: link }),
                Err(effects) => self.apply(effects, ctx),
            },
            LendReport::Failed { ticket, reason } => {
                let effects = self.state.lend_failed(ticket, &reason);
                self.apply(effects, ctx);
            }
        }
    }
}
