//! The session's one brain: every decision of a session, in one plain struct with no runtime
//! (the way quinn's `Connection` is a connection's): its phases, the flow of its inputs and
//! answers, its dialect and so its conversation, its hold and resume, its time. What happens
//! to it comes in through a method each ([`SessionCore::client`], [`SessionCore::queue`],
//! [`SessionCore::backend`], [`SessionCore::transcribed`], [`SessionCore::resumed`],
//! [`SessionCore::shutdown`], [`SessionCore::timeout`]); what it decides comes out as
//!
//! - what its client hears, on its line ([`ClientLine`], called at once, in order);
//! - [`Effect`]s for the actors it talks to (its queue, its worker, the recogniser) and its own
//!   end, taken with [`SessionCore::poll_effect`];
//! - its next deadline ([`SessionCore::deadline`]): the time limit, the dialect's next tick, the
//!   end of a hold's grace or of a drain; time is data, and [`SessionCore::timeout`] is called
//!   when it comes.
//!
//! The dialect is part of it: called synchronously, its words go to the line and the commands
//! it issues on its own join the session's one queue of work ([`SessionCore::run_work`]),
//! carried out in order once the input at hand is done. The actor around it
//! (`super::SessionActor`) only delivers messages and arms the one timer the core asks for.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::domain::{DuplexChunk, SessionSetup, TurnInput};
use crate::edge::client::ClientLine;
use crate::edge::dialect::{DecodeError, Dialect, Outbox};
use crate::messages::queue::QueueNotice;
use crate::messages::worker::WorkerLink;
use crate::observe::metrics;
use crate::observe::{RecordingSummary, SessionEvent, SessionMeta, SessionSinks, timestamp};
use crate::protocol::{CloseReason, Inbound, QueueInfo, Violation};

use super::flow::Flow;
use super::registry::{Admission, Registry};
use super::resume::{Replay, Resumable};
use super::setups::Setups;
use super::state::{Phase, SessionState};
use super::{ClientInfo, SessionSettings};

mod client;
mod hold;
mod output;
#[cfg(test)]
mod tests;

/// Commands carried out for one input at most, the dialect's own among them: a dialect that
/// issued commands without end would hold its session's thread.
const MAX_WORK: usize = 1024;

/// What the session asks of the actors around it; the actor delivers each in order.
#[derive(Debug)]
pub enum Effect {
    /// Join the queue (at its head: the session had a worker it lost, or no room on one).
    Join {
        /// At the head of the queue.
        front: bool,
    },
    /// Leave the queue (the session ended while it waited).
    Leave,
    /// Take the worker the queue assigned.
    Claim,
    /// Something for the worker (the one the session was assigned).
    Worker(ToWorker),
    /// A user item's audio for the gateway's recogniser; the answer comes back to
    /// [`SessionCore::transcribed`].
    Transcribe {
        /// The dialect's id of the user item.
        item_id: String,
        /// Its audio, 16 kHz mono.
        audio: Vec<f32>,
    },
    /// The newest user turn for the decider beside the voice; the answer comes back to
    /// [`SessionCore::decided`].
    Decide {
        /// The dialect's number of the decision.
        id: u64,
        /// What the decider is asked.
        request: Box<crate::domain::DecideRequest>,
    },
    /// The session is over: the actor stops.
    Stop,
}

/// What a session asks of its worker's BackendActor.
#[derive(Debug)]
pub enum ToWorker {
    /// Take the worker for this session.
    Attach,
    /// Prepare the backend with the session's setup.
    Prepare(SessionSetup),
    /// One duplex chunk, numbered.
    Chunk(u64, DuplexChunk),
    /// One turn-mode request, numbered.
    Turn(u64, TurnInput),
    /// New settings; output of earlier input is void.
    Reconfigure(SessionSetup),
    /// Cut the current output short.
    Interrupt,
    /// The server stops: finish the job in flight, then say so.
    Drain,
    /// The session is over (at this instant).
    Detach(Instant),
}

/// What the session is connected to, inside: its line, the registry, its sinks.
pub struct CoreLinks {
    /// Where its client hears it.
    pub line: Box<dyn ClientLine>,
    /// The connection's number, as its subscribers know it.
    pub conn: u64,
    /// Every open session (labels, tokens, status).
    pub registry: Arc<Registry>,
    /// Its place under the per-address caps, released with the session.
    pub admission: Option<Admission>,
    /// The subscribers' sinks for this session.
    pub sinks: SessionSinks,
    /// Who the client is.
    pub client: ClientInfo,
    /// Whether the gateway's recogniser is on.
    pub transcribes: bool,
    /// A decider serves sessions whose backend calls no tools (`[delegation]`).
    pub decides: bool,
    /// Where a resumed connection reaches the session (for its tokens); `None`: it is not
    /// resumed.
    pub resumable: Option<Resumable>,
}

/// When the session next needs the time, each of its clocks.
#[derive(Debug, Default)]
struct Timers {
    /// The session's time limit, counted from the upgrade.
    limit: Option<Instant>,
    /// The dialect's next tick.
    tick: Option<Instant>,
    /// The end of a hold's grace (or its next look, while a caller holds its token), and the
    /// hold's number.
    hold: Option<(Instant, u64)>,
    /// The end of a drain's grace.
    drain: Option<Instant>,
}

impl Timers {
    fn earliest(&self) -> Option<Instant> {
        [self.limit, self.tick, self.hold.map(|(t, _)| t), self.drain].into_iter().flatten().min()
    }
}

/// One session's state and rules; see the module's documentation.
pub struct SessionCore {
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    links: CoreLinks,
    state: SessionState,
    /// The setups asked of the backend, and the last it took.
    setups: Setups,
    flow: Flow,
    upgraded: Instant,
    upgraded_at: SystemTime,
    worker: Option<WorkerLink>,
    attach_sent: bool,
    /// It went back to the head of the queue once because its worker was gone.
    requeued: bool,
    /// Its worker had no room for its first setup: it waits at the head of the queue, and the
    /// next worker is asked the same setup. The client saw `session.queue_done` already and
    /// hears nothing of this but a later `session.created`.
    reseating: bool,
    session_id: Option<String>,
    /// The dialect it was active under (for the active-sessions gauge).
    active_as: Option<&'static str>,
    /// The server is stopping: the job in flight finishes, then the session ends.
    draining: bool,
    end: Option<CloseReason>,
    /// When `end` was decided.
    ended_at: Option<Instant>,
    /// What the dialect hands the client, reused from one call to the next.
    outbox: Outbox,
    /// What it said to its client, numbered and kept for a resume, and whether the client is
    /// away.
    replay: Replay,
    /// The number of its current line (0: the connection it started on).
    line_no: u64,
    /// The resume token, until it goes out in the session's first message.
    token_first: Option<String>,
    /// Why its connection was lost, while it is held.
    away_reason: Option<CloseReason>,
    /// Holds so far: a grace's end concerns its own hold only.
    holds: u64,
    /// The last place in the queue it was told, told again to a client resumed while waiting.
    last_queue: Option<QueueInfo>,
    /// The commands to carry out, in order: the client's and the dialect's own.
    work: VecDeque<Inbound>,
    /// What the actor is to deliver, in order.
    effects: VecDeque<Effect>,
    timers: Timers,
    /// `Effect::Stop` went out.
    stopping: bool,
    /// The session was released (`Effect::Leave`/`Detach`, `Closed` told to its subscribers).
    released: bool,
}

impl SessionCore {
    /// A session upgraded at `now`, speaking `dialect`. It starts with [`SessionCore::start`].
    pub fn new(settings: SessionSettings, dialect: Box<dyn Dialect>, links: CoreLinks, now: Instant) -> SessionCore {
        let kept = if settings.resume.on() { settings.resume.replay_bytes } else { 0 };
        SessionCore {
            flow: Flow::new(settings.max_turns),
            timers: Timers { limit: Some(now + settings.time_limit), ..Timers::default() },
            settings,
            dialect,
            links,
            state: SessionState::default(),
            setups: Setups::default(),
            upgraded: now,
            upgraded_at: SystemTime::now(),
            worker: None,
            attach_sent: false,
            requeued: false,
            reseating: false,
            session_id: None,
            active_as: None,
            draining: false,
            end: None,
            ended_at: None,
            outbox: Outbox::default(),
            replay: Replay::new(kept),
            line_no: 0,
            token_first: None,
            away_reason: None,
            holds: 0,
            last_queue: None,
            work: VecDeque::new(),
            effects: VecDeque::new(),
            stopping: false,
            released: false,
        }
    }

    /// The session begins: it is counted, its token made, it is refused at once when its
    /// settings say so, else it joins its queue.
    pub fn start(&mut self, now: Instant) {
        log::debug!(
            "session c{}: connected from {} ({} mode)",
            self.links.conn,
            self.links.client.addr,
            self.settings.mode
        );
        metrics().connections_total.inc();
        metrics().connections_open.inc();
        if self.settings.resume.on() {
            self.token_first = self.issue_token();
        }
        if let Some(e) = self.settings.reject.clone() {
            return self.send_error(&e);
        }
        if self.links.client.carries_audio && !self.dialect.carry_audio() {
            log::warn!(
                "session c{}: its {} edge carries audio, which the {} dialect cannot take as samples",
                self.links.conn,
                self.links.client.transport,
                self.dialect.name()
            );
        }
        if let Some(every) = self.dialect.tick_interval() {
            self.timers.tick = Some(now + every);
        }
        self.effects.push_back(Effect::Join { front: false });
    }

    /// The next thing for the actor to deliver.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// When the session next needs [`SessionCore::timeout`]; `None` once it is over.
    pub fn deadline(&self) -> Option<Instant> {
        if self.end.is_some() { None } else { self.timers.earliest() }
    }

    /// Time passes: whatever was due at `now` happens.
    pub fn timeout(&mut self, now: Instant) {
        if self.end.is_some() {
            return;
        }
        if self.timers.limit.is_some_and(|t| t <= now) {
            self.timers.limit = None;
            log::info!("session {}: time limit of {:?} reached", self.who(), self.settings.time_limit);
            return self.finish(CloseReason::Timeout);
        }
        if self.timers.drain.is_some_and(|t| t <= now) {
            self.timers.drain = None;
            return self.finish(CloseReason::ServerShutdown);
        }
        if let Some((at, hold)) = self.timers.hold
            && at <= now
        {
            self.timers.hold = None;
            self.hold_over(hold, now);
        }
        if let (Some(at), Some(every)) = (self.timers.tick, self.dialect.tick_interval())
            && at <= now
        {
            // A tick late by more than a period is not made up: the next is a period on.
            self.timers.tick = Some((at + every).max(now));
            let mut out = self.take_outbox();
            self.dialect.tick(now, &mut out);
            self.absorb(&mut out);
            self.outbox = out;
        }
        self.run_work();
    }

    /// The queue's news.
    pub fn queue(&mut self, notice: QueueNotice) {
        self.on_queue_notice(notice);
        self.run_work();
    }

    /// The server is stopping: the session ends now when it has no step in flight, else once
    /// the step is done, at the latest after `grace`.
    pub fn shutdown(&mut self, grace: Duration, now: Instant) {
        if self.end.is_some() || self.draining {
            return;
        }
        let busy = matches!(self.state.phase(), Phase::Initializing | Phase::Active);
        if busy && self.worker.is_some() {
            // Let the step in flight finish (its output is sent), then end.
            self.draining = true;
            self.effects.push_back(Effect::Worker(ToWorker::Drain));
            self.timers.drain = Some(now + grace);
        } else {
            self.finish(CloseReason::ServerShutdown);
        }
    }

    /// Whether the session has ended (its actor stops).
    pub fn is_over(&self) -> bool {
        self.end.is_some()
    }

    /// The worker the session was assigned, for its effects' delivery.
    pub fn worker(&self) -> Option<&WorkerLink> {
        self.worker.as_ref()
    }

    /// The connection's number.
    pub fn conn(&self) -> u64 {
        self.links.conn
    }

    /// Where a resumed connection reaches the session (its tokens name it); given before
    /// [`SessionCore::start`], once its actor has an address.
    pub fn resumable(&mut self, session: Resumable) {
        self.links.resumable = Some(session);
    }

    /// Names the session in logs: its id once it has one, else its connection number.
    pub fn label(&self) -> String {
        self.who()
    }

    /// Names the session in logs: its id once it has one, else its connection number.
    fn who(&self) -> String {
        match &self.session_id {
            Some(id) => id.clone(),
            None => format!("c{}", self.links.conn),
        }
    }

    fn worker_name(&self) -> &str {
        self.worker.as_ref().map_or("-", |w| w.name.as_str())
    }

    fn mode_label(&self) -> [&'static str; 1] {
        [self.settings.mode.as_str()]
    }

    /// Carries out the commands waiting, in order (those a command issues join the end), until
    /// none is left or the session ends.
    fn run_work(&mut self) {
        let mut done = 0;
        while let Some(cmd) = self.work.pop_front() {
            if self.end.is_some() {
                self.work.clear();
                break;
            }
            if done == MAX_WORK {
                log::error!("session {}: its dialect issues commands without end; closing", self.who());
                self.work.clear();
                return self.finish(CloseReason::ProtocolViolation(Violation::InternalError));
            }
            done += 1;
            self.command(cmd);
        }
        self.release_if_over();
    }

    /// A call of the dialect on the client's input (`what`: for the log). A dialect bug costs
    /// this session only, not the arbiter thread it shares: a panic closes it (`None`).
    fn decode_with(
        &mut self,
        what: &str,
        decode: impl FnOnce(&mut dyn Dialect) -> Result<Vec<Inbound>, DecodeError>,
    ) -> Option<Result<Vec<Inbound>, DecodeError>> {
        match catch_unwind(AssertUnwindSafe(|| decode(self.dialect.as_mut()))) {
            Ok(decoded) => Some(decoded),
            Err(_) => {
                log::error!("session {}: the {} dialect panicked on {what}; closing", self.who(), self.dialect.name());
                self.finish(CloseReason::ProtocolViolation(Violation::InternalError));
                None
            }
        }
    }

    /// Ends the session: `session.closed` when the client should hear it, the close (its
    /// edge closes the connection), then the actor stops (and the session is released).
    fn finish(&mut self, reason: CloseReason) {
        if self.end.is_some() {
            return;
        }
        if reason.announced() {
            let session_id = self.session_id.clone();
            self.emit(crate::protocol::Outbound::Closed { session_id: session_id.as_deref(), reason: &reason });
        }
        self.links.line.tell(crate::edge::client::ToClient::Close(reason.clone()));
        self.end_untold(reason);
    }

    /// Ends the session without a word to its client, whose connection is gone.
    fn end_untold(&mut self, reason: CloseReason) {
        if self.end.is_some() {
            return;
        }
        self.state.close();
        self.end = Some(reason);
        self.ended_at = Some(Instant::now());
        self.release_if_over();
    }

    /// Once ended: the session lets go of what it held (its ticket, its worker, its token, its
    /// place among the open sessions), tells its subscribers, and asks its actor to stop.
    fn release_if_over(&mut self) {
        if self.end.is_none() || self.released {
            return;
        }
        self.released = true;
        self.release();
        if !self.stopping {
            self.stopping = true;
            self.effects.push_back(Effect::Stop);
        }
    }

    /// The actor stopped, however (its session ended, or the system stops it): what the
    /// session held is let go, once.
    pub fn stopped(&mut self) {
        if self.end.is_none() {
            self.end = Some(CloseReason::ClientGone);
        }
        if !self.released {
            self.released = true;
            self.release();
        }
    }

    fn release(&mut self) {
        let reason = self.end.clone().unwrap_or(CloseReason::ClientGone);
        self.state.close();
        self.links.registry.tokens().revoke(self.links.conn);
        if self.replay.away() {
            metrics().sessions_held.dec();
        }
        self.effects.push_back(Effect::Leave);
        if self.attach_sent && self.worker.is_some() {
            let ended = self.ended_at.unwrap_or_else(Instant::now);
            self.effects.push_back(Effect::Worker(ToWorker::Detach(ended)));
        }
        let meta = self.meta(&reason);
        self.links.sinks.publish(SessionEvent::Closed { meta: &meta });
        self.links.registry.unregister(self.links.conn);
        let m = metrics();
        m.connections_open.dec();
        m.sessions_closed.with_label_values(&[reason.metric_label()]).inc();
        if let Some(dialect) = self.active_as {
            m.sessions_active
                .with_label_values(&[self.settings.mode.as_str(), dialect, self.links.client.transport])
                .dec();
            self.links.registry.set_active(self.settings.mode, false);
        }
        let c = self.flow.counters();
        log::info!(
            "session {}: ended ({}) after {:.1} s on worker {}: {} chunks received, {} dropped, {} answered, {} turns",
            self.who(),
            reason.as_str().escape_debug(),
            self.upgraded.elapsed().as_secs_f64(),
            self.worker_name(),
            c.chunks_received,
            c.chunks_dropped,
            c.chunks_answered,
            c.turns
        );
    }

    fn meta(&self, reason: &CloseReason) -> SessionMeta {
        let (start, _) = timestamp(self.upgraded_at);
        let (end, _) = timestamp(SystemTime::now());
        let c = self.flow.counters();
        SessionMeta {
            session_id: self.session_id.clone().unwrap_or_default(),
            mode: self.settings.mode.as_str().into(),
            dialect: self.dialect.name().into(),
            transport: self.links.client.transport.into(),
            worker: self.worker.as_ref().map(|w| w.name.clone()),
            client_addr: self.links.client.addr.clone(),
            user_agent: self.links.client.user_agent.clone(),
            start,
            end,
            duration_s: self.upgraded.elapsed().as_secs_f64(),
            close_reason: reason.as_str().to_string(),
            chunks_received: c.chunks_received,
            chunks_dropped: c.chunks_dropped,
            chunks_answered: c.chunks_answered,
            turns: c.turns,
            recording: RecordingSummary::default(),
        }
    }
}
