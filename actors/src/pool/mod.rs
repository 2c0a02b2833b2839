//! WorkerPoolActor: owns every worker's BackendActor, in every role. It starts one per
//! configured worker, per worker of a node once reached ([`messages::JoinWorkers`]), and per
//! worker a cluster lends this replica for one session ([`messages::Lend`]); it tracks their
//! states in a [`PoolState`], tells its queue through a [`WorkerFeed`] which workers are idle,
//! starting, down or lent, restarts failed workers with backoff, and tells the subscribers of
//! worker events every state change. A worker whose session ended is offered again only after
//! its backend reset.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::domain::{BackendInfo, Mode};
use crate::ids::WorkerId;
use crate::observe::metrics;
use crate::observe::{Subscribers, WorkerChange};
use crate::queue::messages::{
    LendFailed, LentOpened, SessionFinished, WorkerDown, WorkerFeed, WorkerIdle, WorkerJoined, WorkerModes,
    WorkerStarting,
};
use crate::worker::messages::{Stop, WorkerLink, WorkerPort};
use crate::worker::{BackendFactory, Opener};

pub mod messages;
mod state;

pub use state::backoff;

use messages::{
    GiveBack, JoinWorkers, Lend, PoolSnapshot, ShutdownPool, StartWorker, WorkerEvent, WorkerSetup, WorkerStart,
};
use state::{PoolState, WorkerState};

/// How long a BackendActor lent for one session has to close its link once the session ends.
const GIVE_BACK_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// What the pool knows of a worker besides its state: how to start it again, and its actor.
struct Entry {
    /// `None` for a lent worker: it is never restarted here.
    factory: Option<BackendFactory>,
    actor: Option<WorkerPort>,
    /// What its backend can do, once open.
    info: Option<Arc<BackendInfo>>,
}

pub struct WorkerPoolActor {
    state: PoolState,
    entries: Vec<Entry>,
    feed: WorkerFeed,
    start: StartWorker,
    /// Told of every worker's state change.
    subscribers: Subscribers,
    /// The server is stopping: no more restarts.
    stopping: bool,
}

impl WorkerPoolActor {
    pub fn new(
        setups: Vec<WorkerSetup>,
        feed: WorkerFeed,
        start: StartWorker,
        subscribers: Subscribers,
    ) -> WorkerPoolActor {
        let mut state = PoolState::new(setups.iter().map(|s| (s.name.clone(), s.backend.clone(), s.modes.clone())));
        for (id, s) in setups.iter().enumerate() {
            state.set_node(id, s.node.clone());
        }
        let entries = setups.into_iter().map(|s| Entry { factory: Some(s.factory), actor: None, info: None }).collect();
        WorkerPoolActor { state, entries, feed, start, subscribers, stopping: false }
    }

    fn start_backend(&mut self, id: WorkerId, opener: Opener, ctx: &mut Context<Self>) {
        let w = self.state.worker(id);
        let port = (self.start)(WorkerStart {
            id,
            name: w.name.clone(),
            generation: w.generation,
            opener,
            pool: ctx.address().recipient(),
        });
        self.entries[id].actor = Some(port);
    }

    fn schedule_restart(&mut self, id: WorkerId, after: std::time::Duration, ctx: &mut Context<Self>) {
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

    fn session_finished(&self, id: WorkerId) {
        if let WorkerState::Busy { mode, since, .. } = self.state.worker(id).state {
            self.feed.finished.do_send(SessionFinished { mode, length: since.elapsed() });
        }
    }

    fn link(&self, id: WorkerId, port: WorkerPort, info: Arc<BackendInfo>) -> WorkerLink {
        WorkerLink { id, name: self.state.worker(id).name.clone(), port: Arc::new(port), info }
    }

    /// A lent worker's session is over (or never came): its actor stops and its link goes
    /// back to its node.
    fn give_back(&mut self, id: WorkerId) {
        if let Some(actor) = self.entries[id].actor.take() {
            actor.stop.do_send(Stop { within: GIVE_BACK_WITHIN });
        }
    }
}

impl Actor for WorkerPoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        for w in self.state.workers() {
            metrics().workers.with_label_values(&[w.state.name()]).inc();
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
            let id = self.state.add(setup.name.clone(), setup.backend.clone(), setup.modes.clone());
            self.state.set_node(id, setup.node.clone());
            metrics().workers.with_label_values(&[self.state.worker(id).state.name()]).inc();
            self.feed.joined.do_send(WorkerJoined { worker: id, modes: setup.modes.clone() });
            log::info!("worker {} joins the pool ({})", setup.name, setup.backend);
            self.entries.push(Entry { factory: Some(setup.factory.clone()), actor: None, info: None });
            self.start_backend(id, Opener::Factory(setup.factory), ctx);
        }
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
        let mut lent = (0, 0);
        let (name, backend, node) = (msg.slot, msg.backend, msg.node);
        let (mode, ticket) = (msg.mode, msg.ticket);
        // A new entry counts in the gauges from its first state.
        let id = self.state.workers().iter().position(|w| w.lendable && w.name == name).unwrap_or(known);
        if id == known {
            lent = self.state.lend(&name, backend, node, mode, ticket);
            metrics().workers.with_label_values(&[self.state.worker(id).state.name()]).inc();
            self.entries.push(Entry { factory: None, actor: None, info: None });
        } else {
            self.tracked(id, |act| lent = act.state.lend(&name, backend, node, mode, ticket));
        }
        // A worker still stopping from its last grant is left to stop.
        self.give_back(id);
        log::debug!("worker {name}: lent to ticket {ticket} (generation {})", lent.1);
        self.start_backend(id, msg.opener, ctx);
    }
}

impl Handler<GiveBack> for WorkerPoolActor {
    type Result = ();
    fn handle(&mut self, msg: GiveBack, _: &mut Context<Self>) {
        let id = msg.worker;
        if self.state.workers().get(id).is_some_and(|w| w.lendable) {
            self.give_back(id);
            self.tracked(id, |act| act.state.given_back(id));
        }
    }
}

impl Handler<WorkerEvent> for WorkerPoolActor {
    type Result = ();

    fn handle(&mut self, event: WorkerEvent, ctx: &mut Context<Self>) {
        let worker = event.worker();
        self.tracked(worker, |act| act.apply(event, ctx));
    }
}

impl WorkerPoolActor {
    /// Runs `change` on worker `id` and moves it between the per-state gauges (O(1), not a
    /// count over every worker), telling the subscribers of worker events.
    fn tracked(&mut self, id: WorkerId, change: impl FnOnce(&mut Self)) {
        let before = self.state.worker(id).state.name();
        change(self);
        let after = self.state.worker(id).state.name();
        if before != after {
            let m = &metrics().workers;
            m.with_label_values(&[before]).dec();
            m.with_label_values(&[after]).inc();
            let w = self.state.worker(id);
            let reason = match &w.state {
                WorkerState::Failed { reason, .. } => Some(reason.clone()),
                _ => None,
            };
            let change = WorkerChange { worker: w.name.clone(), node: w.node.clone(), from: before, to: after, reason };
            self.subscribers.worker(&change);
        }
    }

    fn apply(&mut self, event: WorkerEvent, ctx: &mut Context<Self>) {
        let now = Instant::now();
        match event {
            WorkerEvent::Opened { worker, generation, port, process_id, info } => {
                if !self.state.opened(worker, generation) {
                    return;
                }
                self.state.set_process(worker, process_id);
                self.entries[worker].info = Some(info.clone());
                if let Some(ticket) = self.state.worker(worker).lent {
                    self.entries[worker].actor = Some(port.clone());
                    let link = self.link(worker, port, info);
                    return self.feed.lent.do_send(LentOpened { ticket, link });
                }
                let name = self.state.worker(worker).name.clone();
                if !info.vision && self.state.worker(worker).modes.contains(&Mode::Video) {
                    let modes: Vec<Mode> =
                        self.state.worker(worker).modes.iter().copied().filter(|m| *m != Mode::Video).collect();
                    log::warn!(
                        "worker {name}: its backend has no vision, so it serves no video (modes now: {})",
                        modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
                    );
                    self.state.set_modes(worker, modes.clone());
                    self.feed.modes.do_send(WorkerModes { worker, modes });
                }
                self.feed.idle.do_send(WorkerIdle { link: self.link(worker, port, info) });
            }
            WorkerEvent::OpenFailed { worker, generation, reason, transient } => {
                if let Some(ticket) = self.state.worker(worker).lent {
                    if self.state.lend_failed(worker, generation) {
                        self.entries[worker].actor = None;
                        self.feed.lend_failed.do_send(LendFailed { ticket, reason });
                    }
                    return;
                }
                if let Some(restart) = self.state.open_failed(worker, generation, reason.clone(), now) {
                    if transient {
                        self.feed.starting.do_send(WorkerStarting { worker, reason: Some(reason) });
                    } else {
                        self.feed.down.do_send(WorkerDown { worker, reason });
                    }
                    self.schedule_restart(worker, restart.after, ctx);
                }
            }
            WorkerEvent::Busy { worker, generation, session, mode } => {
                if self.state.worker(worker).generation == generation {
                    self.state.assigned(worker, session, mode, now);
                }
            }
            WorkerEvent::Identified { worker, generation, session, dialect, transport } => {
                if self.state.worker(worker).generation == generation {
                    self.state.identified(worker, session, dialect, transport);
                }
            }
            WorkerEvent::Resetting { worker, generation } => {
                if self.state.worker(worker).generation == generation {
                    self.session_finished(worker);
                    self.state.resetting(worker, generation);
                }
            }
            WorkerEvent::Released { worker, generation } => {
                let lent = self.state.worker(worker).lendable;
                if !self.state.released(worker, generation) {
                    return;
                }
                if lent {
                    // Its link went back to its node with the session: the actor has nothing left.
                    return self.give_back(worker);
                }
                if let (Some(port), Some(info)) =
                    (self.entries[worker].actor.clone(), self.entries[worker].info.clone())
                {
                    self.feed.idle.do_send(WorkerIdle { link: self.link(worker, port, info) });
                }
            }
            WorkerEvent::Failed { worker, generation, reason } => {
                if self.state.worker(worker).generation == generation {
                    self.session_finished(worker);
                }
                let lent = self.state.worker(worker).lendable;
                if let Some(restart) = self.state.failed(worker, generation, reason.clone(), now) {
                    if lent {
                        // Its node restarts it, and offers it again when it is back.
                        self.entries[worker].actor = None;
                        return;
                    }
                    // It will be back: the queue keeps counting it as able to serve.
                    self.feed.starting.do_send(WorkerStarting { worker, reason: Some(reason) });
                    self.schedule_restart(worker, restart.after, ctx);
                }
            }
        }
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
            .map(|a| a.stop.send(Stop { within: msg.within }))
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

impl Handler<PoolSnapshot> for WorkerPoolActor {
    type Result = MessageResult<PoolSnapshot>;
    fn handle(&mut self, _: PoolSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.workers().to_vec())
    }
}
