//! BackendActor: one per worker. It owns the worker's backend thread and its control
//! thread, and turns the session's messages into jobs, one at a time.
//!
//! Its mailbox rules (silent drop of the oldest pending chunk, force-listen overtaking the
//! backlog, the step watchdog, queued answers) live in `WorkerPolicy`; the actor
//! delivers messages to it and carries out the answers: jobs go to the backend thread,
//! any-thread calls to the control thread (never made on this arbiter), results straight
//! from the backend thread to the session.
//!
//! No session waits forever on a worker: every message a session's progress depends on
//! carries a [`crate::messages::worker::Delivery`], which tells the session if the message is never handled (the
//! actor stopped and its mailbox dropped it). A backend that does not open within
//! `open_timeout` fails the worker, like a step past `step_timeout`.
//!
//! A backend that asks for it ([`BackendControl::idle_check_every`]) has its health checked
//! while no session has the worker: a job on its own thread, like any other, whose failure
//! fails the worker (the pool reopens it when it can).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::domain::{BackendInfo, SessionSetup};
use crate::edge::backend::{BackendControl, BackendError};
use crate::ids::WorkerId;
use crate::messages::pool::WorkerEvent;
use crate::messages::worker::BackendEvent;
use crate::observe::metrics;
use crate::protocol::ProtocolError;

mod jobs;
mod pending;
mod policy;
mod spare_threads;
mod thread;

pub use crate::edge::backend::{BackendFactory, Opener};
pub use thread::WorkerThread;

use crate::messages::pool::{StartWorker, WorkerStart};
use crate::messages::worker::{
    Attach, Control, Detach, Drain, Interrupt, Prepare, Reconfigure, Run, Stop, SubmitChunk, SubmitTurn, WorkerPort,
};
use policy::{Cut, Refusal, Work, WorkerPolicy};
use thread::{ControlThread, Opened};

/// Starts BackendActors with these limits: the pool's [`StartWorker`], in every role.
pub fn starter(limits: BackendLimits) -> StartWorker {
    std::sync::Arc::new(move |s: WorkerStart| {
        let actor = BackendActor::new(s.id, s.name, s.generation, s.opener, limits, s.pool).start();
        WorkerPort::of(&actor)
    })
}

/// The least time an idle health check has before its watchdog fails the worker.
pub const IDLE_CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// The bounds every BackendActor of a role runs under, from `[limits]`.
#[derive(Debug, Clone, Copy)]
pub struct BackendLimits {
    /// Seconds of unprocessed audio a worker holds (in one-second chunks) before it drops the
    /// oldest.
    pub max_pending_chunks: usize,
    /// The longest a backend call may take before the worker fails (`limits.step_timeout_ms`).
    pub step_timeout: Duration,
    /// A backend that has not opened after this long fails the worker.
    pub open_timeout: Duration,
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

/// How a job ended, for the actor's bookkeeping (the session already has the result).
enum JobOutcome {
    /// The result went to the session.
    Delivered,
    /// The backend crashed: the worker fails.
    Crashed(String),
    /// The idle backend's health check failed: the worker fails, unless a session took it while
    /// the check ran (that session's own calls tell).
    Unhealthy(String),
    Reset(Result<(), BackendError>),
    /// The backend had no room for a session's first setup (`BackendError::Unavailable` at
    /// its first prepare: a server's slot taken by someone else). The session is told to wait
    /// for another worker, and this one fails, to be retried with backoff.
    NoRoom(String),
}

struct AttachedSession {
    events: Recipient<BackendEvent>,
}

/// One worker: owns its backend's threads and runs a session's messages as jobs, one at a time (see
/// the module's documentation).
pub struct BackendActor {
    id: WorkerId,
    name: String,
    generation: u64,
    /// Taken when the actor starts.
    opener: Option<Opener>,
    limits: BackendLimits,
    pool: Recipient<WorkerEvent>,
    thread: Option<WorkerThread>,
    control: Option<ControlThread>,
    /// The backend's any-thread half, for the KV length on the backend thread.
    backend_control: Option<Arc<dyn BackendControl>>,
    info: Option<BackendInfo>,
    session: Option<AttachedSession>,
    policy: WorkerPolicy,
    watchdog: Option<SpawnHandle>,
    /// When its last session detached, while it waits to be handed over.
    released_at: Option<Instant>,
    /// Set whenever the job in flight is cut short ([`Self::cut_in_flight`]): a turn-mode
    /// answer stops before its next piece. Cleared as each answer is handed to the thread, so
    /// a cut never reaches a later answer.
    turn_cancel: Arc<AtomicBool>,
    /// The owner-thread calls of an edge that drives the backend itself ([`Run`]), by number,
    /// until the policy hands them out ([`Work::Run`]).
    runs: HashMap<u64, crate::messages::worker::RunCall>,
    next_run: u64,
    /// The backend's death, heard while a call was in flight: that call's own failure (which
    /// says why: a signal, an error) is awaited and this reason used only if it succeeded.
    died: Option<String>,
}

impl BackendActor {
    /// An actor for worker `id` of the pool (incarnation `generation`), opening its backend with
    /// `opener` once started and reporting to `pool`.
    pub fn new(
        id: WorkerId,
        name: String,
        generation: u64,
        opener: impl Into<Opener>,
        limits: BackendLimits,
        pool: Recipient<WorkerEvent>,
    ) -> BackendActor {
        BackendActor {
            id,
            name,
            generation,
            opener: Some(opener.into()),
            limits,
            pool,
            thread: None,
            control: None,
            backend_control: None,
            info: None,
            session: None,
            policy: WorkerPolicy::new(limits.max_pending_chunks),
            watchdog: None,
            released_at: None,
            turn_cancel: Arc::new(AtomicBool::new(false)),
            runs: HashMap::new(),
            next_run: 1,
            died: None,
        }
    }

    /// The backend is open: its control thread, a watch for its death, the timer of its idle
    /// health check (if it asks for one), and the pool told.
    fn opened(&mut self, info: BackendInfo, control: Arc<dyn BackendControl>, ctx: &mut Context<Self>) {
        log::info!(
            "worker {}: backend {} open (duplex {}, turn {}, context {})",
            self.name,
            info.name,
            info.duplex,
            info.turn,
            info.context_size
        );
        let control_thread = match &self.thread {
            Some(thread) if thread.is_here() => ControlThread::inline(control.clone()),
            _ => match ControlThread::spawn(&self.name, control.clone()) {
                Ok(t) => t,
                Err(e) => return self.fail(ctx, format!("cannot start the control thread: {e}")),
            },
        };
        // A backend process that dies while idle fails the worker at once; while a call is in
        // flight, that call's failure says why (it ends when the backend does).
        if let Some(death) = control.take_death_notice() {
            ctx.spawn(fut::wrap_future::<_, Self>(death).map(|reason, act, ctx| match reason {
                Ok(reason) if act.policy.in_flight().is_some() => act.died = Some(reason),
                Ok(reason) => act.fail(ctx, reason),
                Err(_) => {}
            }));
        }
        // While no session has it, its backend's health is checked on its own thread.
        if let Some(every) = control.idle_check_every() {
            ctx.run_interval(every, |act, ctx| {
                if act.policy.check() {
                    act.dispatch_next(ctx);
                }
            });
        }
        let process_id = control.process_id();
        let shared = Arc::new(info.clone());
        self.control = Some(control_thread);
        self.backend_control = Some(control);
        self.info = Some(info);
        self.policy.opened();
        self.event(|worker, generation| WorkerEvent::Opened { worker, generation, process_id, info: shared });
    }

    fn tell_session(&self, event: BackendEvent) {
        if let Some(s) = &self.session {
            s.events.do_send(event);
        }
    }

    fn event(&self, make: impl FnOnce(WorkerId, u64) -> WorkerEvent) {
        self.pool.do_send(make(self.id, self.generation));
    }

    /// The worker is unusable: tell the session and the pool, end the backend, stop.
    fn fail(&mut self, ctx: &mut Context<Self>, reason: String) {
        if !self.policy.fail() {
            return;
        }
        log::error!("worker {}: failed: {reason}", self.name);
        self.tell_session(BackendEvent::Failed { reason: reason.clone() });
        self.event(|worker, generation| WorkerEvent::Failed { worker, generation, reason });
        self.stop_failed(ctx);
    }

    /// Its backend had no room for its session's first setup: the session waits for another
    /// worker, and this one goes as after a failure (no session counted as served).
    fn no_room(&mut self, ctx: &mut Context<Self>, reason: String) {
        if !self.policy.fail() {
            return;
        }
        log::warn!("worker {}: no room for a session: {reason}; tried again with backoff", self.name);
        if let Some(session) = self.session.take() {
            session.events.do_send(BackendEvent::NoRoom { reason: reason.clone() });
        }
        let reason = format!("no room for a session: {reason}");
        self.event(|worker, generation| WorkerEvent::NoRoom { worker, generation, reason });
        self.stop_failed(ctx);
    }

    /// Ends the backend of a failed worker and stops.
    fn stop_failed(&mut self, ctx: &mut Context<Self>) {
        self.cut_in_flight();
        if let Some(c) = &self.control {
            // A backend in a child process is killed; a thread is abandoned.
            c.terminate();
        }
        // Dropping the handle lets the thread end after its current job; nobody waits.
        self.thread = None;
        ctx.stop();
    }

    /// Carries out a cut: the session hears about dropped chunks and cancelled answers,
    /// and the job in flight is interrupted.
    fn apply(&self, cut: Cut) {
        for seq in cut.dropped {
            self.tell_session(BackendEvent::Dropped { seq });
        }
        for seq in cut.cancelled {
            self.tell_session(BackendEvent::TurnDone { seq, result: Err(BackendError::Interrupted) });
        }
        if cut.interrupt {
            self.cut_in_flight();
        }
    }

    /// Cuts the job in flight short. The backend's interrupt stops the call it is in; an
    /// answer between two pieces has no call in flight, and a backend forgets an interrupt
    /// that came between calls (each call starts afresh), so the answer's loop also checks
    /// `turn_cancel` before asking for the next piece. Across a process or a network the time
    /// between two calls is a round trip, long enough for a departing client to fall into it.
    fn cut_in_flight(&self) {
        self.turn_cancel.store(true, Ordering::SeqCst);
        if let Some(c) = &self.control {
            c.interrupt();
        }
    }

    fn dispatch_next(&mut self, ctx: &mut Context<Self>) {
        let (true, Some(control)) = (self.thread.is_some(), self.backend_control.clone()) else {
            return;
        };
        let Some((job, work)) = self.policy.next(Instant::now()) else { return };
        let check = matches!(work, Work::Check);
        let closure = self.job(job, work, control, ctx.address());
        let Some(thread) = &mut self.thread else { return };
        if let Err(e) = thread.submit(closure) {
            self.fail(ctx, e.to_string());
            return;
        }
        self.arm_watchdog(job, check, ctx);
    }

    /// The watchdog of `job`: still in flight after `step_timeout`, the worker fails. An idle
    /// health check (`check`) has at least [`IDLE_CHECK_TIMEOUT`]: its backend bounds it itself
    /// (a MiniCPM-o worker's `connect_timeout_s`), and a short step timeout must not fail an idle
    /// worker whose answer is merely slow.
    fn arm_watchdog(&mut self, job: u64, check: bool, ctx: &mut Context<Self>) {
        if let Some(old) = self.watchdog.take() {
            ctx.cancel_future(old);
        }
        let step_timeout = self.limits.step_timeout;
        let timeout = if check { step_timeout.max(IDLE_CHECK_TIMEOUT) } else { step_timeout };
        self.watchdog = Some(ctx.run_later(timeout, move |act, ctx| {
            if act.policy.is_current(job) {
                let reason = match check {
                    true => format!("its idle health check took longer than {} s", timeout.as_secs_f64()),
                    false => format!("a backend call took longer than step_timeout_ms ({} ms)", timeout.as_millis()),
                };
                act.fail(ctx, reason);
            }
        }));
    }
}

impl Actor for BackendActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        let started = match self.opener.take() {
            // Quick: opened here, on this arbiter, which runs its calls (no thread, no hop).
            Some(Opener::Factory(factory)) if factory.is_quick() => match WorkerThread::here(&self.name, &factory) {
                Ok((thread, info, control)) => Ok((thread, Some((info, control)))),
                Err(e) => return self.open_failed(e, ctx),
            },
            Some(Opener::Factory(factory)) => {
                WorkerThread::spawn(&self.name, factory, move |opened| addr.do_send(OpenedMsg(opened)))
                    .map(|t| (t, None))
            }
            // Open already: the worker is ready now, its thread taking it over meanwhile.
            Some(Opener::Open(backend)) => {
                WorkerThread::adopt(&self.name, backend).map(|(t, info, control)| (t, Some((info, control))))
            }
            None => return,
        };
        match started {
            Ok((thread, open)) => {
                self.thread = Some(thread);
                if let Some((info, control)) = open {
                    self.opened(info, control, ctx);
                }
            }
            Err(e) => {
                let reason = format!("cannot start the worker thread: {e}");
                self.event(|worker, generation| WorkerEvent::OpenFailed {
                    worker,
                    generation,
                    reason,
                    transient: false,
                });
                ctx.stop();
                return;
            }
        }
        let timeout = self.limits.open_timeout;
        ctx.run_later(timeout, move |act, ctx| {
            if act.info.is_none() && !act.policy.failed() {
                let reason = format!(
                    "the backend did not open within limits.open_timeout_s ({} s); its thread is abandoned \
                     (a backend process is killed)",
                    timeout.as_secs_f64()
                );
                log::error!("worker {}: {reason}", act.name);
                act.policy.fail();
                act.event(|worker, generation| WorkerEvent::OpenFailed {
                    worker,
                    generation,
                    reason,
                    transient: false,
                });
                act.thread = None;
                ctx.stop();
            }
        });
    }
}

impl Handler<OpenedMsg> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: OpenedMsg, ctx: &mut Context<Self>) {
        if self.policy.failed() {
            // Opened after the open timeout had failed the worker: too late.
            return;
        }
        match msg.0 {
            Ok((info, control)) => self.opened(info, control, ctx),
            Err(e) => self.open_failed(e, ctx),
        }
    }
}

impl BackendActor {
    /// The backend did not open: the pool hears why (and retries a transient failure).
    fn open_failed(&mut self, e: BackendError, ctx: &mut Context<Self>) {
        let reason = e.to_string();
        let transient = matches!(e, BackendError::Unavailable(_));
        if transient {
            log::warn!("worker {}: {reason}", self.name);
        } else {
            log::error!("worker {}: {reason}", self.name);
        }
        self.policy.fail();
        self.event(|worker, generation| WorkerEvent::OpenFailed { worker, generation, reason, transient });
        self.thread = None;
        ctx.stop();
    }
}

impl Handler<Attach> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Attach, _: &mut Context<Self>) {
        let events = msg.reply.handled();
        let answer = match self.policy.attach(msg.key) {
            Ok(()) => {
                log::debug!("worker {}: attached to {}", self.name, msg.label);
                if let Some(at) = self.released_at.take() {
                    metrics().worker_handover_seconds.observe(at.elapsed().as_secs_f64());
                }
                self.session = Some(AttachedSession { events: events.clone() });
                let (conn, mode) = (msg.key, msg.mode);
                self.event(|worker, generation| WorkerEvent::Busy { worker, generation, conn, mode });
                Ok(())
            }
            Err(Refusal::NotReady) => {
                Err(ProtocolError::WorkerConnectFailed(format!("worker {} is not ready", self.name)))
            }
            Err(Refusal::Busy) => Err(ProtocolError::WorkerBusy(format!("worker {} is busy", self.name))),
        };
        events.do_send(BackendEvent::Attached(answer));
    }
}

impl BackendActor {
    /// Refuses setups the backend cannot run, telling the session.
    fn supports(&self, setup: &SessionSetup) -> bool {
        match &self.info {
            Some(info) if !info.supports(setup.kind) => {
                let what = format!("backend {} cannot run {} sessions", info.name, setup.kind.runtime_name());
                self.tell_session(BackendEvent::PrepareFailed(BackendError::Unsupported(what)));
                false
            }
            _ => true,
        }
    }
}

impl Handler<Prepare> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Prepare, ctx: &mut Context<Self>) {
        msg.reply.handled();
        if !self.policy.owns(msg.key) || !self.supports(&msg.setup) {
            return;
        }
        self.policy.prepare(msg.setup);
        self.dispatch_next(ctx);
    }
}

impl Handler<SubmitChunk> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: SubmitChunk, ctx: &mut Context<Self>) {
        if !self.policy.owns(msg.key) {
            return;
        }
        let fx = self.policy.chunk(msg.seq, msg.chunk);
        if let Some(control) = &self.control {
            // Overtake the backlog: the next step listens, whatever is pending, and a
            // step in flight is cut short.
            if fx.force_listen {
                control.set_force_listen(true);
            }
        }
        if fx.interrupt {
            self.cut_in_flight();
        }
        for &seq in &fx.dropped {
            self.tell_session(BackendEvent::Dropped { seq });
        }
        self.dispatch_next(ctx);
    }
}

impl Handler<SubmitTurn> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: SubmitTurn, ctx: &mut Context<Self>) {
        msg.reply.handled();
        if !self.policy.owns(msg.key) {
            return;
        }
        self.policy.turn(msg.seq, msg.input);
        self.dispatch_next(ctx);
    }
}

impl Handler<Detach> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Detach, ctx: &mut Context<Self>) {
        if !self.policy.owns(msg.key) {
            return;
        }
        self.session = None;
        self.runs.clear();
        self.released_at = Some(msg.ended);
        if self.policy.detach() {
            self.cut_in_flight();
        } else if let (None, Some(b)) = (self.policy.in_flight(), &self.backend_control) {
            // Idle: a worker lent for one session goes back to its node at once (one thread hop
            // fewer than the reset job below).
            b.release_now();
        }
        self.event(|worker, generation| WorkerEvent::Resetting { worker, generation });
        self.dispatch_next(ctx);
    }
}

impl Handler<TurnProgress> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: TurnProgress, ctx: &mut Context<Self>) {
        // Progress renews the watchdog: the timeout bounds each piece, not the answer.
        if self.policy.is_current(msg.job) {
            self.arm_watchdog(msg.job, false, ctx);
        }
    }
}

impl Handler<JobDone> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: JobDone, ctx: &mut Context<Self>) {
        let Some((done, drained)) = self.policy.done(msg.job) else {
            return;
        };
        if let Some(w) = self.watchdog.take() {
            ctx.cancel_future(w);
        }
        // An idle health check is no session's work: not a step's duration.
        if done.kind != "check" {
            metrics()
                .step_duration_seconds
                .with_label_values(&[done.kind])
                .observe(done.started.elapsed().as_secs_f64());
        }
        let reset = match msg.outcome {
            JobOutcome::Delivered => false,
            JobOutcome::Crashed(reason) => return self.fail(ctx, reason),
            JobOutcome::Unhealthy(reason) if self.session.is_some() => {
                log::warn!(
                    "worker {}: its idle health check failed ({reason}) as a session took it: that session's own \
                     calls will tell",
                    self.name
                );
                false
            }
            JobOutcome::Unhealthy(reason) => return self.fail(ctx, format!("idle health check: {reason}")),
            JobOutcome::Reset(Ok(())) => true,
            JobOutcome::Reset(Err(e)) => return self.fail(ctx, format!("reset failed: {e}")),
            JobOutcome::NoRoom(why) => return self.no_room(ctx, why),
        };
        if let Some(reason) = self.died.take() {
            return self.fail(ctx, reason);
        }
        // Free again, unless a session took it while it reset (a node lends a worker again as
        // soon as its link ends: the next session's work queues behind the reset).
        if reset && self.session.is_none() {
            self.event(|worker, generation| WorkerEvent::Released { worker, generation });
        }
        if drained {
            self.tell_session(BackendEvent::Drained);
        }
        self.dispatch_next(ctx);
    }
}

impl Handler<Reconfigure> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Reconfigure, ctx: &mut Context<Self>) {
        msg.reply.handled();
        if !self.policy.owns(msg.key) || !self.supports(&msg.setup) {
            return;
        }
        let cut = self.policy.restart(msg.setup);
        self.apply(cut);
        self.dispatch_next(ctx);
    }
}

impl Handler<Interrupt> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Interrupt, _: &mut Context<Self>) {
        if !self.policy.owns(msg.key) {
            return;
        }
        let cut = self.policy.interrupt();
        if let Some(c) = &self.control {
            c.set_force_listen(true);
        }
        self.apply(cut);
    }
}

impl Handler<Drain> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Drain, _: &mut Context<Self>) {
        msg.reply.handled();
        if !self.policy.owns(msg.key) {
            return;
        }
        let (cut, now) = self.policy.drain();
        self.apply(cut);
        if now {
            self.tell_session(BackendEvent::Drained);
        }
    }
}

impl Handler<Run> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Run, ctx: &mut Context<Self>) {
        if !self.policy.owns(msg.key) {
            return;
        }
        let run = self.next_run;
        self.next_run += 1;
        self.runs.insert(run, msg.call);
        self.policy.run(run);
        self.dispatch_next(ctx);
    }
}

impl Handler<Control> for BackendActor {
    type Result = ();
    fn handle(&mut self, msg: Control, ctx: &mut Context<Self>) {
        let key = match msg {
            Control::Interrupt { key } | Control::ForceListen { key, .. } | Control::Terminate { key } => key,
        };
        if !self.policy.owns(key) {
            return;
        }
        match msg {
            Control::Interrupt { .. } => self.cut_in_flight(),
            Control::ForceListen { on, .. } => {
                if let Some(c) = &self.control {
                    c.set_force_listen(on);
                }
            }
            Control::Terminate { .. } => {
                self.fail(ctx, "its backend was ended by the gateway it serves (that gateway's step watchdog)".into())
            }
        }
    }
}

impl Handler<Stop> for BackendActor {
    type Result = ResponseActFuture<Self, bool>;
    fn handle(&mut self, msg: Stop, _: &mut Context<Self>) -> Self::Result {
        self.policy.fail();
        self.cut_in_flight();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Mode;
    use crate::edge::backend::Backend;
    use crate::messages::worker::{Delivery, Lost};

    /// Collects what a session would hear.
    struct Ear(tokio::sync::mpsc::UnboundedSender<String>);
    impl Actor for Ear {
        type Context = Context<Self>;
    }
    impl Handler<BackendEvent> for Ear {
        type Result = ();
        fn handle(&mut self, e: BackendEvent, _: &mut Context<Self>) {
            let _ = self.0.send(match e {
                BackendEvent::Attached(Err(e)) => format!("attach refused: {}: {e}", e.code()),
                BackendEvent::Attached(Ok(())) => "attached".into(),
                BackendEvent::Failed { reason } => format!("failed: {reason}"),
                BackendEvent::Drained => "drained".into(),
                _ => "other".into(),
            });
        }
    }
    /// Says which of the worker's reports were an open that failed.
    struct Pool(tokio::sync::mpsc::UnboundedSender<bool>);
    impl Actor for Pool {
        type Context = Context<Self>;
    }
    impl Handler<WorkerEvent> for Pool {
        type Result = ();
        fn handle(&mut self, e: WorkerEvent, _: &mut Context<Self>) {
            let _ = self.0.send(matches!(e, WorkerEvent::OpenFailed { .. }));
        }
    }

    fn pool() -> Recipient<WorkerEvent> {
        Pool(tokio::sync::mpsc::unbounded_channel().0).start().recipient()
    }

    /// A turn backend that hands out one piece per permit from the test, never a last one,
    /// and ignores interrupts, as a backend does with one that came between two of its
    /// calls. It says which calls it took.
    struct Gated {
        info: BackendInfo,
        permits: tokio::sync::mpsc::UnboundedReceiver<()>,
        calls: tokio::sync::mpsc::UnboundedSender<&'static str>,
    }
    struct Deaf;
    impl BackendControl for Deaf {
        fn interrupt(&self) {}
        fn set_force_listen(&self, _: bool) {}
        fn kv_length(&self) -> u64 {
            0
        }
        fn never_blocks(&self) -> bool {
            true
        }
    }
    impl Backend for Gated {
        fn info(&self) -> &BackendInfo {
            &self.info
        }
        fn prepare(&mut self, _: &SessionSetup) -> Result<(), BackendError> {
            Ok(())
        }
        fn reset(&mut self) -> Result<(), BackendError> {
            let _ = self.calls.send("reset");
            Ok(())
        }
        fn duplex_prefill(&mut self, _: &crate::domain::DuplexChunk) -> Result<(), BackendError> {
            Err(BackendError::Internal("a turn backend".into()))
        }
        fn duplex_generate(&mut self) -> Result<crate::domain::StepPiece, BackendError> {
            Err(BackendError::Internal("a turn backend".into()))
        }
        fn duplex_drain(&mut self) -> Result<Option<crate::domain::StepPiece>, BackendError> {
            Ok(None)
        }
        fn duplex_finalize(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
        fn turn_prefill(&mut self, _: &crate::domain::TurnInput) -> Result<(), BackendError> {
            Ok(())
        }
        fn turn_generate(&mut self) -> Result<crate::domain::TurnPiece, BackendError> {
            let _ = self.calls.send("turn_generate");
            match self.permits.blocking_recv() {
                Some(()) => Ok(crate::domain::TurnPiece { text: "w ".into(), ..Default::default() }),
                None => Err(BackendError::Inference("the test let no more pieces out".into())),
            }
        }
        fn control(&self) -> Arc<dyn BackendControl> {
            Arc::new(Deaf)
        }
    }

    #[actix::test]
    async fn a_client_leaving_mid_answer_ends_it_before_the_next_piece_whatever_the_backend_heard() {
        let limits = BackendLimits {
            max_pending_chunks: 2,
            step_timeout: Duration::from_secs(30),
            open_timeout: Duration::from_secs(10),
        };
        let (permit, permits) = tokio::sync::mpsc::unbounded_channel();
        let (calls_tx, mut calls) = tokio::sync::mpsc::unbounded_channel();
        let info = BackendInfo { name: "gated".into(), turn: true, ..BackendInfo::default() };
        // Open already: the worker takes a session at once.
        let open = Opener::Open(Box::new(Gated { info, permits, calls: calls_tx }));
        let worker = BackendActor::new(0, "gated".into(), 1, open, limits, pool()).start();
        let (tx, _heard) = tokio::sync::mpsc::unbounded_channel();
        let ear = Ear(tx).start().recipient();
        let reply = || Delivery::new(ear.clone(), Lost::Work);
        let attach = Delivery::new(ear.clone(), Lost::Attach);
        worker.do_send(Attach { key: 1, label: "c1".into(), mode: Mode::Chat, reply: attach });
        worker.do_send(Prepare { key: 1, setup: SessionSetup::new(crate::domain::SessionKind::Turn), reply: reply() });
        worker.do_send(SubmitTurn { key: 1, seq: 1, input: Default::default(), reply: reply() });
        let mut next = async || {
            actix::clock::timeout(Duration::from_secs(10), calls.recv()).await.expect("the backend was called").unwrap()
        };
        // The first piece is asked for and given. The client leaves during the second call,
        // whose backend ignores the interrupt, as every backend does with one that comes
        // between two calls; that piece is let out after the worker heard the client leave.
        assert_eq!(next().await, "turn_generate");
        permit.send(()).unwrap();
        assert_eq!(next().await, "turn_generate");
        worker.send(Detach { key: 1, ended: Instant::now() }).await.unwrap();
        permit.send(()).unwrap();
        drop(permit);
        // No third piece is asked for: the answer ended between the two, and the reset follows.
        assert_eq!(next().await, "reset");
    }

    #[actix::test]
    async fn messages_to_a_worker_that_is_gone_are_answered_not_lost() {
        let limits = BackendLimits {
            max_pending_chunks: 2,
            step_timeout: Duration::from_secs(1),
            open_timeout: Duration::from_secs(10),
        };
        let factory = crate::edge::backend::BackendFactory::new(|| Err(BackendError::Open("no model".into())));
        let (told, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let worker = BackendActor::new(0, "gone".into(), 1, factory, limits, Pool(told).start().recipient()).start();
        // Its backend does not open: it says so, and stops.
        let failed = actix::clock::timeout(Duration::from_secs(10), reports.recv()).await;
        assert_eq!(failed.ok().flatten(), Some(true), "the open failure is reported");
        for _ in 0..100 {
            if !worker.connected() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(!worker.connected(), "the worker's actor stopped");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let ear = Ear(tx).start().recipient();
        let attach =
            Attach { key: 1, label: "c1".into(), mode: Mode::Audio, reply: Delivery::new(ear.clone(), Lost::Attach) };
        worker.do_send(attach);
        let setup = SessionSetup::new(crate::domain::SessionKind::Duplex);
        worker.do_send(Prepare { key: 1, setup, reply: Delivery::new(ear.clone(), Lost::Work) });
        worker.do_send(Drain { key: 1, reply: Delivery::new(ear, Lost::Drain) });
        let mut heard = Vec::new();
        while heard.len() < 3 {
            let next = actix::clock::timeout(Duration::from_secs(10), rx.recv()).await;
            heard.push(next.ok().flatten().unwrap_or_else(|| panic!("answers so far: {heard:?}")));
        }
        assert_eq!(
            heard,
            [
                "attach refused: worker_connect_failed: the worker stopped before the session could take it",
                "failed: the worker stopped",
                "drained",
            ]
        );
    }
}
