//! WorkerPoolActor: owns every worker's BackendActor, in every role. It starts one per
//! configured worker, per worker of a node once reached ([`crate::messages::pool::JoinWorkers`]), and per
//! worker a cluster lends this replica for one session ([`crate::messages::pool::Lend`]). What becomes of
//! each worker is its rules' (`state::PoolState`): the actor hands them its BackendActors'
//! reports and carries out what they decide (`state::Effect`: offer a worker to the queue,
//! hand a lent one to its ticket, tell the queue a worker is starting or down, restart it
//! with backoff, stop its actor). It tells its queue through a [`QueueFeed`], and the
//! subscribers of worker events every state change.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::domain::BackendInfo;
use crate::edge::backend::{BackendFactory, Opener};
use crate::ids::WorkerId;
use crate::messages::queue::{LendReport, QueueFeed, WorkerReport};
use crate::messages::worker::{Stop, WorkerLink, WorkerPort};
use crate::observe::{Subscribers, WorkerChange, metrics};
use crate::status::{ServerStatus, StatusQuery};

mod state;

pub use state::backoff;

use crate::messages::pool::{
    GiveBack, JoinWorkers, Lend, ShutdownPool, StartWorker, WorkerEvent, WorkerSetup, WorkerStart,
};
use state::{Effect, PoolState, WorkerState};

/// How long a BackendActor lent for one session has to close its link once the session ends.
const GIVE_BACK_WITHIN: Duration = Duration::from_secs(2);

/// What the pool knows of a worker besides its rules' state: how to start it again, its
/// actor, and what its backend can do.
struct Entry {
    /// `None` for a lent worker: it is never restarted here.
    factory: Option<BackendFactory>,
    /// Its BackendActor's ports, and where it is stopped.
    actor: Option<(Arc<WorkerPort>, Recipient<Stop>)>,
    /// What its backend can do, once open.
    info: Option<Arc<BackendInfo>>,
}

/// The pool of workers; see the module's documentation.
pub struct WorkerPoolActor {
    state: PoolState,
    entries: Vec<Entry>,
    feed: QueueFeed,
    start: StartWorker,
    /// Told of every worker's state change.
    subscribers: Subscribers,
    /// The server is stopping: no more restarts.
    stopping: bool,
}

impl WorkerPoolActor {
    /// A pool of `setups`, telling its queue through `feed`, starting BackendActors with
    /// `start`.
    pub fn new(
        setups: Vec<WorkerSetup>,
        feed: QueueFeed,
        start: StartWorker,
        subscribers: Subscribers,
    ) -> WorkerPoolActor {
        let state =
            PoolState::new(setups.iter().map(|s| (s.name.clone(), s.backend.clone(), s.modes.clone(), s.node.clone())));
        let entries = setups.into_iter().map(|s| Entry { factory: Some(s.factory), actor: None, info: None }).collect();
        WorkerPoolActor { state, entries, feed, start, subscribers, stopping: false }
    }

    fn start_backend(&mut self, id: WorkerId, opener: Opener, ctx: &mut Context<Self>) {
        let w = self.state.worker(id);
        let (port, stop) = (self.start)(WorkerStart {
            id,
            name: w.name.clone(),
            generation: w.generation,
            opener,
            pool: ctx.address().recipient(),
        });
        self.entries[id].actor = Some((Arc::new(port), stop));
    }

    fn report(&self, report: WorkerReport) {
        match &self.feed {
            QueueFeed::Owned(queue) => queue.do_send(report),
            // A session's length on a borrowed worker: the cluster learns it from the node's beat.
            QueueFeed::Lent(_) if matches!(report, WorkerReport::Finished { .. }) => {}
            QueueFeed::Lent(_) => log::warn!("pool: a worker of its own on a pool that only borrows workers"),
        }
    }

    fn lend_report(&self, report: LendReport) {
        match &self.feed {
            QueueFeed::Lent(queue) => queue.do_send(report),
            QueueFeed::Owned(_) => log::warn!("pool: a lent worker on a pool whose workers are its own"),
        }
    }

    /// The worker as handed to a session.
    fn link(&self, id: WorkerId) -> Option<WorkerLink> {
        let entry = &self.entries[id];
        let ((port, _), info) = (entry.actor.as_ref()?, entry.info.as_ref()?);
        Some(WorkerLink { id, name: self.state.worker(id).name.clone(), port: port.clone(), info: info.clone() })
    }

    /// Carries out what the rules decided, in order.
    fn carry_out(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                Effect::Offer(id) => {
                    if let Some(link) = self.link(id) {
                        self.report(WorkerReport::Idle(link));
                    }
                }
                Effect::LentOpened { worker, ticket } => {
                    if let Some(link) = self.link(worker) {
                        self.lend_report(LendReport::Opened { ticket, link });
                    }
                }
                Effect::LendFailed { ticket, reason } => self.lend_report(LendReport::Failed { ticket, reason }),
                Effect::Starting { worker, reason } => self.report(WorkerReport::Starting { worker, reason }),
                Effect::Down { worker, reason } => self.report(WorkerReport::Down { worker, reason }),
                Effect::Modes { worker, modes } => {
                    let shown: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
                    log::warn!(
                        "worker {}: its backend has no vision, so it serves no video (modes now: {})",
                        self.state.worker(worker).name,
                        shown.join(", ")
                    );
                    self.report(WorkerReport::Modes { worker, modes });
                }
                Effect::Finished { mode, length } => self.report(WorkerReport::Finished { mode, length }),
                Effect::Restart { worker, after } => self.schedule_restart(worker, after, ctx),
                Effect::Stop(id) => {
                    if let Some((_, stop)) = self.entries[id].actor.take() {
                        stop.do_send(Stop { within: GIVE_BACK_WITHIN });
                    }
                }
                Effect::Forget(id) => self.entries[id].actor = None,
            }
        }
    }

    fn schedule_restart(&mut self, id: WorkerId, after: Duration, ctx: &mut Context<Self>) {
        self.entries[id].actor = None;
        let name = &self.state.worker(id).name;
        log::warn!("worker {name}: restarting in {} ms", after.as_millis());
        ctx.run_later(after, move |act, ctx| {
            let Some(factory) = act.entries[id].factory.clone() else { return };
            if act.stopping {
                return;
            }
            let mut generation = 0;
            act.tracked(id, |act| generation = act.state.restart(id));
            let name = act.state.worker(id).name.clone();
            metrics().worker_restarts.with_label_values(&[name.as_str()]).inc();
            log::info!("worker {name}: restart (generation {generation})");
            act.start_backend(id, Opener::Factory(factory), ctx);
        });
    }

    /// Runs `change` on worker `id` and moves it between the per-state gauges (O(1), not a
    /// count over every worker), telling the subscribers of worker events.
    fn tracked<T>(&mut self, id: WorkerId, change: impl FnOnce(&mut Self) -> T) -> T {
        let before = self.state.worker(id).state.status().as_str();
        let out = change(self);
        let after = self.state.worker(id).state.status().as_str();
        if before != after {
            let m = &metrics().workers;
            m.with_label_values(&[before]).dec();
            m.with_label_values(&[after]).inc();
            let w = self.state.worker(id);
            let reason = match &w.state {
                WorkerState::Failed { reason } => Some(reason.clone()),
                _ => None,
            };
            let change = WorkerChange { worker: w.name.clone(), node: w.node.clone(), from: before, to: after, reason };
            self.subscribers.worker(&change);
        }
        out
    }

    /// A BackendActor's report, through the rules.
    fn on_event(&mut self, event: WorkerEvent) -> Vec<Effect> {
        let now = Instant::now();
        match event {
            WorkerEvent::Opened { worker, generation, process_id, info } => {
                match self.state.opened(worker, generation, process_id, info.vision) {
                    Some(effects) => {
                        self.entries[worker].info = Some(info);
                        effects
                    }
                    None => Vec::new(),
                }
            }
            WorkerEvent::OpenFailed { worker, generation, reason, transient } => {
                self.state.open_failed(worker, generation, reason, transient)
            }
            WorkerEvent::Busy { worker, generation, conn, mode } => {
                self.state.busy(worker, generation, conn, mode, now);
                Vec::new()
            }
            WorkerEvent::Resetting { worker, generation } => self.state.resetting(worker, generation, now),
            WorkerEvent::Released { worker, generation } => self.state.released(worker, generation),
            WorkerEvent::Failed { worker, generation, reason } => self.state.failed(worker, generation, reason, now),
            WorkerEvent::NoRoom { worker, generation, reason } => self.state.no_room(worker, generation, reason, now),
        }
    }
}

impl Actor for WorkerPoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        for w in self.state.workers() {
            metrics().workers.with_label_values(&[w.state.status().as_str()]).inc();
        }
        for id in 0..self.entries.len() {
            if let Some(factory) = self.entries[id].factory.clone() {
                self.start_backend(id, Opener::Factory(factory), ctx);
            }
        }
    }
}

impl Handler<JoinWorkers> for WorkerPoolActor {
    type Result = ();
    fn handle(&mut self, msg: JoinWorkers, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        for setup in msg.0 {
            let id = self.state.add(setup.name.clone(), setup.backend.clone(), setup.modes.clone(), setup.node.clone());
            metrics().workers.with_label_values(&[self.state.worker(id).state.status().as_str()]).inc();
            self.report(WorkerReport::Joined { worker: id, modes: setup.modes.clone() });
            log::info!("worker {} joins the pool ({})", setup.name, setup.backend);
            self.entries.push(Entry { factory: Some(setup.factory.clone()), actor: None, info: None });
            self.start_backend(id, Opener::Factory(setup.factory), ctx);
        }
        self.report(WorkerReport::Reached);
    }
}

impl Handler<Lend> for WorkerPoolActor {
    type Result = ();
    fn handle(&mut self, msg: Lend, ctx: &mut Context<Self>) {
        if self.stopping {
            // Dropped: the opener's link goes back to its node.
            return;
        }
        let known = self.state.workers().len();
        let (name, backend, node, mode, ticket) = (msg.slot, msg.backend, msg.node, msg.mode, msg.ticket);
        let existing = self.state.workers().iter().position(|w| w.lendable && w.name == name);
        let (id, generation, effects) = match existing {
            Some(id) => self.tracked(id, |act| act.state.lend(&name, backend, node, mode, ticket)),
            None => {
                // A new entry counts in the gauges from its first state.
                let lent = self.state.lend(&name, backend, node, mode, ticket);
                metrics().workers.with_label_values(&[self.state.worker(known).state.status().as_str()]).inc();
                self.entries.push(Entry { factory: None, actor: None, info: None });
                lent
            }
        };
        // An actor of its last grant still stopping is left to stop.
        self.carry_out(effects, ctx);
        log::debug!("worker {name}: lent to ticket {ticket} (generation {generation})");
        self.start_backend(id, msg.opener, ctx);
    }
}

impl Handler<GiveBack> for WorkerPoolActor {
    type Result = ();
    fn handle(&mut self, msg: GiveBack, ctx: &mut Context<Self>) {
        if msg.worker < self.state.workers().len() {
            let effects = self.tracked(msg.worker, |act| act.state.given_back(msg.worker));
            self.carry_out(effects, ctx);
        }
    }
}

impl Handler<WorkerEvent> for WorkerPoolActor {
    type Result = ();

    fn handle(&mut self, event: WorkerEvent, ctx: &mut Context<Self>) {
        let worker = event.worker();
        let effects = self.tracked(worker, |act| act.on_event(event));
        self.carry_out(effects, ctx);
    }
}

impl Handler<ShutdownPool> for WorkerPoolActor {
    type Result = ResponseFuture<usize>;
    fn handle(&mut self, msg: ShutdownPool, _: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        let stops: Vec<_> = self
            .entries
            .iter_mut()
            .filter_map(|e| e.actor.take())
            .map(|(_, stop)| stop.send(Stop { within: msg.within }))
            .collect();
        Box::pin(async move {
            let mut closed = 0;
            for stop in stops {
                closed += stop.await.unwrap_or(true) as usize;
            }
            closed
        })
    }
}

impl Handler<StatusQuery> for WorkerPoolActor {
    type Result = MessageResult<StatusQuery>;
    fn handle(&mut self, _: StatusQuery, _: &mut Context<Self>) -> Self::Result {
        MessageResult(ServerStatus { workers: self.state.workers().iter().map(|w| w.row()).collect(), cluster: None })
    }
}
