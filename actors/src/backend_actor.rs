//! BackendActor: one per worker. It owns the worker's backend thread and turns the
//! session's messages into jobs on it, one at a time.
//!
//! Its mailbox policy is the gateway's backpressure and interrupt model:
//! - at most `max_pending_chunks` unprocessed duplex chunks per session; the oldest is
//!   dropped silently (the session is told, for its counters);
//! - a force-listen chunk overtakes the backlog: the any-thread calls (set_force_listen,
//!   interrupt) reach the backend at once, without waiting behind pending chunks;
//! - every job has a watchdog: a step slower than `step_timeout` fails the worker, which
//!   the pool replaces; the hung thread is abandoned, never joined.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::backend::{BackendControl, BackendError};
use crate::domain::{BackendInfo, DuplexChunk, Mode, SessionSetup, StepOutcome, TurnInput, TurnSummary};
use crate::metrics::metrics;
use crate::pending::Pending;
use crate::pool_actor::WorkerEvent;
use crate::protocol::ProtocolError;
use crate::queue::WorkerId;
use crate::session::BackendEvent;
use crate::worker_thread::{BackendFactory, Job, Opened, WorkerThread};

#[derive(Debug, Clone, Copy)]
pub struct BackendLimits {
    pub max_pending_chunks: usize,
    pub step_timeout: Duration,
}

/// A session takes this worker; answered with `BackendEvent::Attached`. Sent with
/// `do_send`, so it is queued at once and always ahead of the session's `Detach`: a session
/// that ends right after it cannot leave the worker reserved and never attached.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Attach {
    /// The session's key; every later message carries it.
    pub key: u64,
    /// Names the session in logs and status until it has an id.
    pub label: String,
    pub mode: Mode,
    pub events: Recipient<BackendEvent>,
}

/// Starts the session on the backend; answered with `Prepared` or `PrepareFailed`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Prepare {
    pub key: u64,
    pub session_id: String,
    /// The session's wire dialect, for status.
    pub dialect: &'static str,
    pub setup: SessionSetup,
}

/// One duplex chunk, numbered by the session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubmitChunk {
    pub key: u64,
    pub seq: u64,
    pub chunk: DuplexChunk,
}

/// One turn-mode request, numbered by the session; answered in order.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubmitTurn {
    pub key: u64,
    pub seq: u64,
    pub input: TurnInput,
}

/// The session is over: the backend is reset, then the worker is offered again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Detach {
    pub key: u64,
    /// When the session ended (the hand-over to the next session is timed from here).
    pub ended: Instant,
}

#[derive(Message)]
#[rtype(result = "()")]
struct OpenedMsg(Opened);

#[derive(Message)]
#[rtype(result = "()")]
struct JobDone {
    job: u64,
    outcome: JobOutcome,
}

#[derive(Message)]
#[rtype(result = "()")]
struct TurnProgress {
    job: u64,
}

enum Work {
    Prepare(SessionSetup),
    /// Reset, then prepare with new settings, keeping the session attached.
    Restart(SessionSetup),
    Step(u64, DuplexChunk),
    Turn(u64, TurnInput),
    Reset,
}

/// How a job ended, for the actor's bookkeeping (the session already has the result).
enum JobOutcome {
    /// The result went to the session.
    Delivered,
    /// The backend crashed: the worker fails.
    Crashed(String),
    Reset(Result<(), BackendError>),
}

struct InFlight {
    job: u64,
    /// Metric label: prepare, step, turn or reset.
    kind: &'static str,
    started: Instant,
    interruptible: bool,
    watchdog: SpawnHandle,
}

struct AttachedSession {
    key: u64,
    events: Recipient<BackendEvent>,
}

pub struct BackendActor {
    id: WorkerId,
    name: String,
    generation: u64,
    factory: BackendFactory,
    limits: BackendLimits,
    pool: Recipient<WorkerEvent>,
    thread: Option<WorkerThread>,
    control: Option<Arc<dyn BackendControl>>,
    info: Option<BackendInfo>,
    session: Option<AttachedSession>,
    work: VecDeque<Work>,
    pending: Pending<(u64, DuplexChunk)>,
    in_flight: Option<InFlight>,
    next_job: u64,
    failed: bool,
    /// When its last session detached, while it waits to be handed over.
    released_at: Option<Instant>,
    /// Set by `Interrupt`: the turn-mode answer in flight stops before its next piece.
    turn_cancel: Arc<AtomicBool>,
    /// The session asked to be told once the job in flight is done (graceful shutdown).
    drain: bool,
}

impl BackendActor {
    pub fn new(
        id: WorkerId,
        name: String,
        generation: u64,
        factory: BackendFactory,
        limits: BackendLimits,
        pool: Recipient<WorkerEvent>,
    ) -> BackendActor {
        BackendActor {
            id,
            name,
            generation,
            factory,
            limits,
            pool,
            thread: None,
            control: None,
            info: None,
            session: None,
            work: VecDeque::new(),
            pending: Pending::new(limits.max_pending_chunks),
            in_flight: None,
            next_job: 1,
            failed: false,
            released_at: None,
            turn_cancel: Arc::new(AtomicBool::new(false)),
            drain: false,
        }
    }

    fn owns(&self, key: u64) -> bool {
        self.session.as_ref().is_some_and(|s| s.key == key)
    }

    fn tell_session(&self, event: BackendEvent) {
        if let Some(s) = &self.session {
            s.events.do_send(event);
        }
    }

    fn event(&self, make: impl FnOnce(WorkerId, u64) -> WorkerEvent) {
        self.pool.do_send(make(self.id, self.generation));
    }

    /// The worker is unusable: tell the session and the pool, abandon the thread, stop.
    fn fail(&mut self, ctx: &mut Context<Self>, reason: String) {
        if self.failed {
            return;
        }
        self.failed = true;
        log::error!("worker {}: failed: {reason}", self.name);
        self.tell_session(BackendEvent::Failed { reason: reason.clone() });
        self.event(|worker, generation| WorkerEvent::Failed { worker, generation, reason });
        if let Some(c) = &self.control {
            c.interrupt();
            // A backend in a child process is killed; a thread is abandoned.
            c.terminate();
        }
        // Dropping the handle lets the thread end after its current job; nobody waits.
        self.thread = None;
        ctx.stop();
    }

    fn dispatch_next(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some() || self.failed {
            return;
        }
        let (Some(thread), Some(control)) = (&self.thread, &self.control) else {
            return;
        };
        let work = match self.work.pop_front() {
            Some(w) => w,
            None => match self.pending.pop() {
                Some((seq, chunk)) => Work::Step(seq, chunk),
                None => return,
            },
        };
        let job = self.next_job;
        self.next_job += 1;
        let addr = ctx.address();
        let interruptible = !matches!(work, Work::Reset);
        let reset_first = matches!(work, Work::Restart(_));
        let kind = match work {
            Work::Prepare(_) | Work::Restart(_) => "prepare",
            Work::Step(..) => "step",
            Work::Turn(..) => "turn",
            Work::Reset => "reset",
        };
        // Results go from the thread straight to the session (one thread hop less on the
        // latency path); the actor is told that the job is done, for its bookkeeping.
        let to_session = self.session.as_ref().map(|s| s.events.clone());
        let tell = move |event: BackendEvent| {
            if let Some(s) = &to_session {
                s.do_send(event);
            }
        };
        let closure: Job = match work {
            Work::Prepare(setup) | Work::Restart(setup) => {
                let control = control.clone();
                Box::new(move |b| {
                    let reset = if reset_first { b.reset() } else { Ok(()) };
                    let result = reset.and_then(|_| b.prepare(&setup)).map(|_| control.kv_length());
                    tell(match result {
                        Ok(prompt_length) => BackendEvent::Prepared { prompt_length },
                        Err(e) => BackendEvent::PrepareFailed(e),
                    });
                    addr.do_send(JobDone { job, outcome: JobOutcome::Delivered });
                })
            }
            Work::Step(seq, chunk) => {
                let control = control.clone();
                Box::new(move |b| {
                    let started = Instant::now();
                    let result = match b.duplex_step(&chunk) {
                        // An interrupted step heard its chunk and says nothing: a listen.
                        Err(BackendError::Interrupted) => Ok(StepOutcome::listen(control.kv_length())),
                        Err(BackendError::Crashed(reason)) => {
                            return addr.do_send(JobDone { job, outcome: JobOutcome::Crashed(reason) });
                        }
                        other => other,
                    };
                    tell(BackendEvent::Step { seq, result, elapsed: started.elapsed() });
                    addr.do_send(JobDone { job, outcome: JobOutcome::Delivered });
                })
            }
            Work::Turn(seq, input) => {
                let cancel = self.turn_cancel.clone();
                cancel.store(false, Ordering::SeqCst);
                Box::new(move |b| {
                    let started = Instant::now();
                    let result = (|| {
                        b.turn_prefill(&input)?;
                        let mut summary =
                            TurnSummary { input_tokens: 0, output_tokens: 0, kv_length: 0, duration: Duration::ZERO };
                        loop {
                            // An interrupt between pieces (no call in flight) ends the answer here;
                            // the next turn_prefill abandons the rest.
                            if cancel.load(Ordering::SeqCst) {
                                return Err(BackendError::Interrupted);
                            }
                            let piece = b.turn_generate()?;
                            let done = piece.done;
                            summary.input_tokens += piece.input_tokens;
                            summary.output_tokens += piece.output_tokens;
                            summary.kv_length = piece.kv_length;
                            tell(BackendEvent::TurnPiece { seq, piece });
                            addr.do_send(TurnProgress { job });
                            if done {
                                summary.duration = started.elapsed();
                                return Ok(summary);
                            }
                        }
                    })();
                    if let Err(BackendError::Crashed(reason)) = result {
                        return addr.do_send(JobDone { job, outcome: JobOutcome::Crashed(reason) });
                    }
                    tell(BackendEvent::TurnDone { seq, result });
                    addr.do_send(JobDone { job, outcome: JobOutcome::Delivered });
                })
            }
            Work::Reset => Box::new(move |b| {
                let result = b.reset();
                addr.do_send(JobDone { job, outcome: JobOutcome::Reset(result) });
            }),
        };
        if let Err(e) = thread.submit(closure) {
            self.fail(ctx, e.to_string());
            return;
        }
        let watchdog = self.arm_watchdog(job, ctx);
        self.in_flight = Some(InFlight { job, kind, started: Instant::now(), interruptible, watchdog });
    }

    fn arm_watchdog(&self, job: u64, ctx: &mut Context<Self>) -> SpawnHandle {
        let timeout = self.limits.step_timeout;
        ctx.run_later(timeout, move |act, ctx| {
            if act.in_flight.as_ref().is_some_and(|f| f.job == job) {
                act.fail(ctx, format!("a backend call took longer than step_timeout_ms ({} ms)", timeout.as_millis()));
            }
        })
    }

    /// Drops every pending chunk and queued answer, telling the session.
    fn drop_backlog(&mut self) {
        for (seq, _) in self.pending.clear() {
            self.tell_session(BackendEvent::Dropped { seq });
        }
        for work in std::mem::take(&mut self.work) {
            if let Work::Turn(seq, _) = work {
                self.tell_session(BackendEvent::TurnDone { seq, result: Err(BackendError::Interrupted) });
            }
        }
    }

    fn finish_job(&mut self, job: u64, ctx: &mut Context<Self>) -> bool {
        match &self.in_flight {
            Some(f) if f.job == job => {
                ctx.cancel_future(f.watchdog);
                metrics().step_duration_seconds.with_label_values(&[f.kind]).observe(f.started.elapsed().as_secs_f64());
                self.in_flight = None;
                true
            }
            _ => false,
        }
    }
}

impl Actor for BackendActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        match WorkerThread::spawn(&self.name, self.factory.clone(), move |opened| addr.do_send(OpenedMsg(opened))) {
            Ok(thread) => self.thread = Some(thread),
            Err(e) => {
                let reason = format!("cannot start the worker thread: {e}");
                self.event(|worker, generation| WorkerEvent::OpenFailed { worker, generation, reason });
                ctx.stop();
            }
        }
    }
}

impl Handler<OpenedMsg> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: OpenedMsg, ctx: &mut Context<Self>) {
        match msg.0 {
            Ok((info, control)) => {
                log::info!(
                    "worker {}: backend {} open (duplex {}, turn {}, context {})",
                    self.name,
                    info.name,
                    info.duplex,
                    info.turn,
                    info.context_size
                );
                // A backend process that dies while idle fails the worker at once.
                if let Some(death) = control.take_death_notice() {
                    ctx.spawn(fut::wrap_future::<_, Self>(death).map(|reason, act, ctx| {
                        if let Ok(reason) = reason {
                            act.fail(ctx, reason);
                        }
                    }));
                }
                let process_id = control.process_id();
                self.control = Some(control);
                self.info = Some(info);
                let addr = ctx.address();
                self.event(|worker, generation| WorkerEvent::Opened { worker, generation, backend: addr, process_id });
            }
            Err(e) => {
                let reason = e.to_string();
                log::error!("worker {}: {reason}", self.name);
                self.event(|worker, generation| WorkerEvent::OpenFailed { worker, generation, reason });
                self.thread = None;
                ctx.stop();
            }
        }
    }
}

impl Handler<Attach> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Attach, _: &mut Context<Self>) {
        let events = msg.events.clone();
        events.do_send(BackendEvent::Attached(self.attach(msg)));
    }
}

impl BackendActor {
    fn attach(&mut self, msg: Attach) -> Result<(), ProtocolError> {
        if self.failed || self.control.is_none() {
            return Err(ProtocolError::WorkerConnectFailed(format!("worker {} is not ready", self.name)));
        }
        if self.session.is_some() || !self.work.is_empty() || self.in_flight.is_some() {
            return Err(ProtocolError::WorkerBusy(format!("worker {} is busy", self.name)));
        }
        log::debug!("worker {}: attached to {}", self.name, msg.label);
        if let Some(at) = self.released_at.take() {
            metrics().worker_handover_seconds.observe(at.elapsed().as_secs_f64());
        }
        self.session = Some(AttachedSession { key: msg.key, events: msg.events });
        let (label, mode) = (msg.label, msg.mode);
        self.event(|worker, generation| WorkerEvent::Busy { worker, generation, session: label, mode });
        Ok(())
    }
}

impl Handler<Prepare> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Prepare, ctx: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        if let Some(info) = &self.info
            && !info.supports(msg.setup.kind)
        {
            let what = format!("backend {} cannot run {} sessions", info.name, msg.setup.kind.runtime_name());
            self.tell_session(BackendEvent::PrepareFailed(BackendError::Unsupported(what)));
            return;
        }
        let (session, dialect) = (msg.session_id, msg.dialect);
        self.event(|worker, generation| WorkerEvent::Identified { worker, generation, session, dialect });
        self.work.push_back(Work::Prepare(msg.setup));
        self.dispatch_next(ctx);
    }
}

impl Handler<SubmitChunk> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: SubmitChunk, ctx: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        if msg.chunk.force_listen
            && let Some(control) = &self.control
        {
            // Overtake the backlog: the next step listens, whatever is pending, and a
            // step in flight is cut short.
            control.set_force_listen(true);
            if self.in_flight.as_ref().is_some_and(|f| f.interruptible) {
                control.interrupt();
            }
        }
        if let Some((dropped, _)) = self.pending.push((msg.seq, msg.chunk)) {
            self.tell_session(BackendEvent::Dropped { seq: dropped });
        }
        self.dispatch_next(ctx);
    }
}

impl Handler<SubmitTurn> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: SubmitTurn, ctx: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        self.work.push_back(Work::Turn(msg.seq, msg.input));
        self.dispatch_next(ctx);
    }
}

impl Handler<Detach> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Detach, ctx: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        self.session = None;
        self.released_at = Some(msg.ended);
        self.work.clear();
        self.pending.clear();
        if self.in_flight.as_ref().is_some_and(|f| f.interruptible)
            && let Some(c) = &self.control
        {
            c.interrupt();
        }
        self.work.push_back(Work::Reset);
        self.event(|worker, generation| WorkerEvent::Resetting { worker, generation });
        self.dispatch_next(ctx);
    }
}

impl Handler<TurnProgress> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: TurnProgress, ctx: &mut Context<Self>) {
        // Progress re-arms the watchdog: the timeout bounds each piece, not the answer.
        let Some(f) = &self.in_flight else { return };
        if f.job != msg.job {
            return;
        }
        ctx.cancel_future(f.watchdog);
        let watchdog = self.arm_watchdog(msg.job, ctx);
        if let Some(f) = &mut self.in_flight {
            f.watchdog = watchdog;
        }
    }
}

impl Handler<JobDone> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: JobDone, ctx: &mut Context<Self>) {
        if !self.finish_job(msg.job, ctx) {
            return;
        }
        match msg.outcome {
            JobOutcome::Delivered => {}
            JobOutcome::Crashed(reason) => return self.fail(ctx, reason),
            JobOutcome::Reset(Ok(())) => {
                self.event(|worker, generation| WorkerEvent::Released { worker, generation });
            }
            JobOutcome::Reset(Err(e)) => return self.fail(ctx, format!("reset failed: {e}")),
        }
        if self.drain {
            self.drain = false;
            self.tell_session(BackendEvent::Drained);
        }
        self.dispatch_next(ctx);
    }
}

/// Starts the session over with new settings: the backlog is dropped, the job in flight
/// cut short, the backend reset and prepared again; answered with `Prepared` or
/// `PrepareFailed`. The worker stays with the session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    pub key: u64,
    pub setup: SessionSetup,
}

impl Handler<Reconfigure> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Reconfigure, ctx: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        if let Some(info) = &self.info
            && !info.supports(msg.setup.kind)
        {
            let what = format!("backend {} cannot run {} sessions", info.name, msg.setup.kind.runtime_name());
            self.tell_session(BackendEvent::PrepareFailed(BackendError::Unsupported(what)));
            return;
        }
        self.drop_backlog();
        if self.in_flight.as_ref().is_some_and(|f| f.interruptible)
            && let Some(c) = &self.control
        {
            c.interrupt();
        }
        self.work.push_back(Work::Restart(msg.setup));
        self.dispatch_next(ctx);
    }
}

/// Cuts the current output short: the backend is force-listened and the step or answer
/// in flight interrupted; answers still queued end as interrupted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Interrupt {
    pub key: u64,
}

impl Handler<Interrupt> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Interrupt, _: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        let queued: Vec<u64> =
            self.work.iter().filter_map(|w| if let Work::Turn(seq, _) = w { Some(*seq) } else { None }).collect();
        self.work.retain(|w| !matches!(w, Work::Turn(..)));
        for seq in queued {
            self.tell_session(BackendEvent::TurnDone { seq, result: Err(BackendError::Interrupted) });
        }
        self.turn_cancel.store(true, Ordering::SeqCst);
        if let Some(c) = &self.control {
            c.set_force_listen(true);
            if self.in_flight.as_ref().is_some_and(|f| f.interruptible) {
                c.interrupt();
            }
        }
    }
}

/// The session is ending (server shutdown): drop its backlog, finish the job in flight,
/// then tell it with `BackendEvent::Drained`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain {
    pub key: u64,
}

impl Handler<Drain> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Drain, _: &mut Context<Self>) {
        if !self.owns(msg.key) {
            return;
        }
        self.drop_backlog();
        if self.in_flight.is_some() {
            self.drain = true;
        } else {
            self.tell_session(BackendEvent::Drained);
        }
    }
}

/// The server is stopping: the thread finishes, closes the backend and exits. Answers
/// whether that happened within `within`.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Stop {
    pub within: Duration,
}

impl Handler<Stop> for BackendActor {
    type Result = ResponseActFuture<Self, bool>;
    fn handle(&mut self, msg: Stop, _: &mut Context<Self>) -> Self::Result {
        self.failed = true;
        if let Some(c) = &self.control {
            c.interrupt();
        }
        let exited = self.thread.take().map(WorkerThread::stop);
        let name = self.name.clone();
        Box::pin(
            async move {
                match exited {
                    Some(rx) => actix::clock::timeout(msg.within, rx).await.is_ok(),
                    None => true,
                }
            }
            .into_actor(self)
            .map(move |closed, _, ctx| {
                if !closed {
                    log::warn!("worker {name}: its backend did not close within the grace period");
                }
                ctx.stop();
                closed
            }),
        )
    }
}
