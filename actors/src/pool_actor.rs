//! WorkerPoolActor: starts one BackendActor per configured worker, tracks their states
//! in a [`PoolState`], offers idle workers to the queue, and restarts failed workers with
//! backoff. A worker whose session ended is offered again only after its backend reset.

use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::backend_actor::{BackendActor, BackendLimits, Stop};
use crate::domain::Mode;
use crate::events::{Subscribers, WorkerChange};
use crate::metrics::metrics;
use crate::pool::{PoolState, PoolWorker, WorkerState};
use crate::queue::WorkerId;
use crate::queue_actor::{
    QueueActor, SessionFinished, WorkerDown, WorkerIdle, WorkerJoined, WorkerLink, WorkerModes, WorkerStarting,
};
use crate::worker_thread::BackendFactory;

/// One configured worker.
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

/// What a BackendActor reports about itself. `generation` tells incarnations apart.
#[derive(Message)]
#[rtype(result = "()")]
pub enum WorkerEvent {
    Opened {
        worker: WorkerId,
        generation: u64,
        backend: Addr<BackendActor>,
        process_id: Option<u32>,
        /// The backend accepts video frames (`info().vision`): without, the worker serves no video.
        vision: bool,
    },
    /// `transient`: the backend is out of reach for now (a node that is down), not broken:
    /// clients waiting for its modes keep waiting.
    OpenFailed {
        worker: WorkerId,
        generation: u64,
        reason: String,
        transient: bool,
    },
    Busy {
        worker: WorkerId,
        generation: u64,
        session: String,
        mode: Mode,
    },
    Identified {
        worker: WorkerId,
        generation: u64,
        session: String,
        dialect: &'static str,
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

/// A snapshot of every worker, for `/status` and for tests.
#[derive(Message)]
#[rtype(result = "Vec<PoolWorker>")]
pub struct PoolSnapshot;

pub struct WorkerPoolActor {
    state: PoolState,
    setups: Vec<WorkerSetup>,
    actors: Vec<Option<Addr<BackendActor>>>,
    queue: Addr<QueueActor>,
    limits: BackendLimits,
    /// Told of every worker's state change.
    subscribers: Subscribers,
    /// The server is stopping: no more restarts.
    stopping: bool,
}

impl WorkerPoolActor {
    pub fn new(
        setups: Vec<WorkerSetup>,
        queue: Addr<QueueActor>,
        limits: BackendLimits,
        subscribers: Subscribers,
    ) -> WorkerPoolActor {
        let mut state = PoolState::new(setups.iter().map(|s| (s.name.clone(), s.backend.clone(), s.modes.clone())));
        for (id, s) in setups.iter().enumerate() {
            state.set_node(id, s.node.clone());
        }
        let actors = setups.iter().map(|_| None).collect();
        WorkerPoolActor { state, setups, actors, queue, limits, subscribers, stopping: false }
    }

    fn start_backend(&mut self, id: WorkerId, ctx: &mut Context<Self>) {
        let setup = &self.setups[id];
        let generation = self.state.worker(id).generation;
        let actor = BackendActor::new(
            id,
            setup.name.clone(),
            generation,
            setup.factory.clone(),
            self.limits,
            ctx.address().recipient(),
        );
        self.actors[id] = Some(actor.start());
    }

    fn schedule_restart(&mut self, id: WorkerId, after: std::time::Duration, ctx: &mut Context<Self>) {
        self.actors[id] = None;
        log::warn!("worker {}: restarting in {} ms", self.setups[id].name, after.as_millis());
        ctx.run_later(after, move |act, ctx| {
            if act.stopping {
                return;
            }
            let mut generation = 0;
            act.tracked(id, |act| generation = act.state.restart(id));
            metrics().worker_restarts.with_label_values(&[act.setups[id].name.as_str()]).inc();
            log::info!("worker {}: restart (generation {generation})", act.setups[id].name);
            act.start_backend(id, ctx);
        });
    }

    fn session_finished(&self, id: WorkerId) {
        if let WorkerState::Busy { mode, since, .. } = self.state.worker(id).state {
            self.queue.do_send(SessionFinished { mode, length: since.elapsed() });
        }
    }
}

impl Actor for WorkerPoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        for w in self.state.workers() {
            metrics().workers.with_label_values(&[w.state.name()]).inc();
        }
        for id in 0..self.setups.len() {
            self.start_backend(id, ctx);
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
            self.queue.do_send(WorkerJoined { worker: id, modes: setup.modes.clone() });
            log::info!("worker {} joins the pool ({})", setup.name, setup.backend);
            self.setups.push(setup);
            self.actors.push(None);
            self.start_backend(id, ctx);
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

impl WorkerEvent {
    fn worker(&self) -> WorkerId {
        match self {
            WorkerEvent::Opened { worker, .. }
            | WorkerEvent::OpenFailed { worker, .. }
            | WorkerEvent::Busy { worker, .. }
            | WorkerEvent::Identified { worker, .. }
            | WorkerEvent::Resetting { worker, .. }
            | WorkerEvent::Released { worker, .. }
            | WorkerEvent::Failed { worker, .. } => *worker,
        }
    }
}

impl WorkerPoolActor {
    /// Runs `change` on worker `id` and moves it between the per-state gauges (O(1), not a
    /// count over every worker).
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
            WorkerEvent::Opened { worker, generation, backend, process_id, vision } => {
                if self.state.opened(worker, generation) {
                    self.state.set_process(worker, process_id);
                    let name = self.setups[worker].name.clone();
                    if !vision && self.state.worker(worker).modes.contains(&Mode::Video) {
                        let modes: Vec<Mode> =
                            self.state.worker(worker).modes.iter().copied().filter(|m| *m != Mode::Video).collect();
                        log::warn!(
                            "worker {name}: its backend has no vision, so it serves no video (modes now: {})",
                            modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
                        );
                        self.state.set_modes(worker, modes.clone());
                        self.queue.do_send(WorkerModes { worker, modes });
                    }
                    self.queue.do_send(WorkerIdle { link: WorkerLink { id: worker, name, backend } });
                }
            }
            WorkerEvent::OpenFailed { worker, generation, reason, transient } => {
                if let Some(restart) = self.state.open_failed(worker, generation, reason, now) {
                    if transient {
                        self.queue.do_send(WorkerStarting { worker });
                    } else {
                        self.queue.do_send(WorkerDown { worker });
                    }
                    self.schedule_restart(worker, restart.after, ctx);
                }
            }
            WorkerEvent::Busy { worker, generation, session, mode } => {
                if self.state.worker(worker).generation == generation {
                    self.state.assigned(worker, session, mode, now);
                }
            }
            WorkerEvent::Identified { worker, generation, session, dialect } => {
                if self.state.worker(worker).generation == generation {
                    self.state.identified(worker, session, dialect);
                }
            }
            WorkerEvent::Resetting { worker, generation } => {
                if self.state.worker(worker).generation == generation {
                    self.session_finished(worker);
                    self.state.resetting(worker, generation);
                }
            }
            WorkerEvent::Released { worker, generation } => {
                if self.state.released(worker, generation)
                    && let Some(backend) = self.actors[worker].clone()
                {
                    let name = self.setups[worker].name.clone();
                    self.queue.do_send(WorkerIdle { link: WorkerLink { id: worker, name, backend } });
                }
            }
            WorkerEvent::Failed { worker, generation, reason } => {
                if self.state.worker(worker).generation == generation {
                    self.session_finished(worker);
                }
                if let Some(restart) = self.state.failed(worker, generation, reason, now) {
                    // It will be back: the queue keeps counting it as able to serve.
                    self.queue.do_send(WorkerStarting { worker });
                    self.schedule_restart(worker, restart.after, ctx);
                }
            }
        }
    }
}

/// The server is stopping: every backend closes. Answers how many closed within `within`.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ShutdownPool {
    pub within: Duration,
}

impl Handler<ShutdownPool> for WorkerPoolActor {
    type Result = ResponseFuture<usize>;
    fn handle(&mut self, msg: ShutdownPool, _: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        let stops: Vec<_> =
            self.actors.iter_mut().filter_map(Option::take).map(|a| a.send(Stop { within: msg.within })).collect();
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
