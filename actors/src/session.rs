//! SessionActor: one per WebSocket. It owns the protocol state machine
//! ([`SessionState`]) and the output rules ([`Flow`]), the session's time limit counted
//! from the upgrade, the heartbeat, what one connection may send ([`MessageRate`],
//! [`Fragments`]), and the routing between the client (through its [`Dialect`]), the
//! queue and the worker's BackendActor. It tells the subscribers ([`crate::events`]: the
//! recorder, usage accounting, webhooks...) what happens, and feeds the metrics.
//! A session that ends for any reason releases its ticket or its worker in `stopped()`.
//!
//! What the backend says and how it reaches the client is in [`output`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web::web::Bytes;
use actix_web_actors::ws;
use bytestring::ByteString;

use crate::backend::BackendError;
use crate::backend_actor::{
    Attach, Delivery, Detach, Drain, Interrupt, Lost, Prepare, Reconfigure, SubmitChunk, SubmitTurn,
};
use crate::dialect::{DecodeError, Dialect, RecordedMedia};
use crate::domain::{BackendInfo, Mode, StepOutcome, TurnPiece, TurnSummary};
use crate::events::{Interest, SessionEvent, SessionSinks};
use crate::inbound_limits::{FragmentBudget, FragmentRefusal, Fragments, MessageRate, RateLimit, Verdict};
use crate::metrics::metrics;
use crate::outgoing::OutgoingLimit;
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError};
use crate::queue_actor::{Claim, Join, Leave, QueueNotice, QueuePort, WorkerLink};
use crate::recording::{RecordingSummary, SessionMeta, timestamp};
use crate::registry::{Admission, Registry, Shutdown};
use crate::session_flow::Flow;
use crate::session_state::{Phase, SessionState};

pub use crate::session_flow::SessionCounters;

mod output;

/// A client's reason for closing is echoed and recorded up to this many bytes.
pub const MAX_CLOSE_REASON: usize = 64;

/// What a session is allowed, from the configuration.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub mode: Mode,
    /// Counted from the upgrade: queueing, initialisation and silence count.
    pub time_limit: Duration,
    /// A KV length that reaches this ends the session with `context_full`.
    pub context_tokens: u64,
    /// Largest message, also across continuation frames.
    pub max_frame_bytes: usize,
    /// How often the server pings.
    pub heartbeat_interval: Duration,
    /// Silence from the client (no frame, no pong) after which it is considered gone.
    pub heartbeat_timeout: Duration,
    /// A fragmented message must be finished this long after its first frame.
    pub message_timeout: Duration,
    /// Messages per second the client may send; `None`: no limit.
    pub rate: Option<RateLimit>,
    /// Turn-mode answers outstanding at once (one in progress, the rest waiting).
    pub max_turns: usize,
    /// The session is refused at once with this error (e.g. an unknown model), after the upgrade.
    pub reject: Option<ProtocolError>,
}

/// Who is on the other end, for logs and recordings.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    pub addr: String,
    pub user_agent: Option<String>,
}

/// What a session is connected to besides its socket.
pub struct SessionLinks {
    /// The connection's number ([`crate::ids::connection`]), as its subscribers know it.
    pub conn: u64,
    pub queue: QueuePort,
    pub registry: Arc<Registry>,
    /// Its place under the per-address caps, released with the session.
    pub admission: Option<Admission>,
    /// The subscribers' sinks for this session ([`crate::events`]).
    pub sinks: SessionSinks,
    pub client: ClientInfo,
    /// The bound on what waits to be sent to a client that does not read; `None`: unbounded.
    pub outgoing: Option<OutgoingLimit>,
    /// What every connection's unfinished fragmented messages may hold together.
    pub fragments: Arc<FragmentBudget>,
}

/// What the worker's BackendActor tells its session.
#[derive(Message)]
#[rtype(result = "()")]
pub enum BackendEvent {
    Prepared {
        prompt_length: u64,
        /// What the backend can do, for the client (transcripts, settings applied).
        backend: Box<BackendInfo>,
    },
    PrepareFailed(BackendError),
    /// The step that answered chunk `seq`.
    Step {
        seq: u64,
        result: Result<StepOutcome, BackendError>,
        elapsed: Duration,
    },
    /// Chunk `seq` was dropped unprocessed (the client ran ahead).
    Dropped {
        seq: u64,
    },
    TurnPiece {
        seq: u64,
        piece: TurnPiece,
    },
    TurnDone {
        seq: u64,
        result: Result<TurnSummary, BackendError>,
    },
    /// The worker failed for good (hang past the step timeout, crash).
    Failed {
        reason: String,
    },
    /// After `Drain`: the job in flight is done, nothing is pending.
    Drained,
    /// The answer to `Attach`: the worker is this session's, or why not.
    Attached(Result<(), ProtocolError>),
}

pub struct SessionActor {
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    links: SessionLinks,
    conn: u64,
    state: SessionState,
    flow: Flow,
    upgraded: Instant,
    upgraded_at: SystemTime,
    last_heard: Instant,
    worker: Option<WorkerLink>,
    attach_sent: bool,
    /// It went back to the head of the queue once because its worker was gone.
    requeued: bool,
    session_id: Option<String>,
    /// The dialect it was active under (for the active-sessions gauge).
    active_as: Option<&'static str>,
    /// A message arriving in continuation frames.
    fragments: Fragments,
    rate: Option<MessageRate>,
    /// The server is stopping: the job in flight finishes, then the session ends.
    draining: bool,
    end: Option<CloseReason>,
    /// When `end` was decided.
    ended_at: Option<Instant>,
    frames: Vec<String>,
}

/// Cuts `text` to at most `max` bytes, at a character boundary.
fn bounded(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl SessionActor {
    pub fn new(settings: SessionSettings, dialect: Box<dyn Dialect>, links: SessionLinks) -> SessionActor {
        let now = Instant::now();
        let fragments = Fragments::new(links.fragments.clone(), settings.max_frame_bytes, settings.message_timeout);
        SessionActor {
            flow: Flow::new(settings.max_turns),
            rate: settings.rate.map(|limit| MessageRate::new(limit, now)),
            settings,
            dialect,
            conn: links.conn,
            links,
            state: SessionState::default(),
            upgraded: now,
            upgraded_at: SystemTime::now(),
            last_heard: now,
            worker: None,
            attach_sent: false,
            requeued: false,
            session_id: None,
            active_as: None,
            fragments,
            draining: false,
            end: None,
            ended_at: None,
            frames: Vec::new(),
        }
    }

    /// Names the session in logs: its id once it has one, else its connection number.
    fn who(&self) -> String {
        match &self.session_id {
            Some(id) => id.clone(),
            None => format!("c{}", self.conn),
        }
    }

    fn worker_name(&self) -> &str {
        self.worker.as_ref().map_or("-", |w| w.name.as_str())
    }

    fn mode_label(&self) -> [&'static str; 1] {
        [self.settings.mode.as_str()]
    }

    /// Pings the client; ends the session when it has been silent too long, or when a
    /// fragmented message stays unfinished past its deadline (pings do not extend it).
    fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            let now = Instant::now();
            if now.saturating_duration_since(act.last_heard) > act.settings.heartbeat_timeout {
                log::info!(
                    "session {}: nothing heard for {:?}; the client is gone",
                    act.who(),
                    act.settings.heartbeat_timeout
                );
                act.finish(ctx, CloseReason::HeartbeatTimeout);
                return;
            }
            if act.fragments.overdue(now) {
                act.message_timeout(ctx);
                return;
            }
            ctx.ping(b"");
        });
    }

    fn message_timeout(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        log::info!(
            "session {}: a fragmented message unfinished after {:?}; closing with 1008",
            self.who(),
            self.settings.message_timeout
        );
        self.finish(ctx, CloseReason::ProtocolViolation("message_timeout"));
    }

    /// Encodes an event, sends its frames, and records them as sent.
    fn emit(&mut self, ctx: &mut ws::WebsocketContext<Self>, event: Outbound<'_>) {
        let mut frames = std::mem::take(&mut self.frames);
        self.dialect.encode(event, &mut frames);
        for frame in frames.drain(..) {
            self.send_frame(ctx, ByteString::from(frame));
        }
        self.frames = frames;
    }

    fn send_frame(&mut self, ctx: &mut ws::WebsocketContext<Self>, frame: ByteString) {
        if let Some(limit) = &self.links.outgoing {
            let waiting = limit.meter.wrote(frame.len());
            if waiting > limit.max_bytes {
                return self.slow_consumer(ctx, waiting);
            }
        }
        metrics().bytes_sent.inc_by(frame.len() as u64);
        if self.links.sinks.wants(Interest::WIRE) {
            let bytes = frame.as_bytes().clone();
            self.links.sinks.publish(SessionEvent::WireOut { frame: &bytes });
        }
        ctx.text(frame);
    }

    /// The client has not read `waiting` bytes: the session ends and its connection is
    /// dropped (a close frame would wait behind the backlog forever).
    fn slow_consumer(&mut self, ctx: &mut ws::WebsocketContext<Self>, waiting: u64) {
        if self.end.is_some() {
            return;
        }
        log::warn!(
            "session {}: the client does not read its output ({waiting} bytes waiting); dropping the connection",
            self.who()
        );
        metrics().slow_consumers.inc();
        self.finish(ctx, CloseReason::SlowConsumer);
        if let Some(limit) = &self.links.outgoing {
            limit.disconnect.disconnect();
        }
    }

    fn send_error(&mut self, ctx: &mut ws::WebsocketContext<Self>, e: &ProtocolError) {
        log::debug!("session {}: error {}: {e}", self.who(), e.code());
        metrics().errors.with_label_values(&[e.code()]).inc();
        if self.links.sinks.wants(Interest::ERRORS) {
            let message = e.to_string();
            self.links.sinks.publish(SessionEvent::Error { code: e.code(), message: &message });
        }
        self.emit(ctx, Outbound::Error(e));
        if e.close_code().is_some() {
            self.finish(ctx, CloseReason::Rejected(e.code()));
        }
    }

    /// Ends the session: `session.closed` when the client should hear it, the close
    /// frame, then the actor stops (and `stopped()` releases what it held).
    fn finish(&mut self, ctx: &mut ws::WebsocketContext<Self>, reason: CloseReason) {
        if self.end.is_some() {
            return;
        }
        if reason.announced() {
            let session_id = self.session_id.clone();
            self.emit(ctx, Outbound::Closed { session_id: session_id.as_deref(), reason: &reason });
        }
        let description = match &reason {
            CloseReason::BackendError(why) => bounded(why, 123).to_string(),
            other => bounded(other.as_str(), 123).to_string(),
        };
        ctx.close(Some(ws::CloseReason {
            code: ws::CloseCode::from(reason.close_code()),
            description: Some(description),
        }));
        self.state.close();
        self.end = Some(reason);
        self.ended_at = Some(Instant::now());
        ctx.stop();
    }

    /// A complete message counts against the rate; `false` when it is not to be processed.
    fn within_rate(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        let Some(rate) = self.rate.as_mut() else { return true };
        match rate.message(Instant::now()) {
            Verdict::Take => true,
            Verdict::Drop => {
                metrics().rate_limited.inc();
                false
            }
            Verdict::DropAndTell { dropped } => {
                metrics().rate_limited.inc();
                let per_s = self.settings.rate.map_or(0.0, |r| r.per_second);
                let e = ProtocolError::RateLimited(format!(
                    "{dropped} message(s) dropped unprocessed: more than {per_s} a second (server.max_messages_per_s)"
                ));
                self.send_error(ctx, &e);
                false
            }
            Verdict::Close => {
                metrics().rate_limited.inc();
                log::warn!("session {}: over the message rate for too long; closing with 1008", self.who());
                self.finish(ctx, CloseReason::ProtocolViolation("rate_limited"));
                false
            }
        }
    }

    fn on_text(&mut self, text: ByteString, ctx: &mut ws::WebsocketContext<Self>) {
        metrics().bytes_received.inc_by(text.len() as u64);
        if self.within_rate(ctx) {
            self.handle_text(text, ctx);
        }
    }

    /// A whole message, taken under the rate.
    fn handle_text(&mut self, text: ByteString, ctx: &mut ws::WebsocketContext<Self>) {
        let mut replies = Vec::new();
        // A decoder bug must cost this session only, not the arbiter thread it shares.
        let decoded = match catch_unwind(AssertUnwindSafe(|| self.dialect.decode(&text, &mut replies))) {
            Ok(decoded) => decoded,
            Err(_) => {
                log::error!("session {}: the {} decoder panicked on a frame; closing", self.who(), self.dialect.name());
                return self.finish(ctx, CloseReason::ProtocolViolation("internal_error"));
            }
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = match (&decoded, self.dialect.take_recorded_media()) {
                (_, Some(media)) => media,
                (Ok(commands), None) => recorded_media(commands),
                (Err(_), None) => (Vec::new(), Vec::new()),
            };
            let frame = text.as_bytes().clone();
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        match decoded {
            Err(DecodeError::Unparseable(why)) => {
                log::info!("session {}: unparseable frame ({why}); closing with 1003", self.who());
                self.finish(ctx, CloseReason::ProtocolViolation("invalid_json"));
            }
            Err(DecodeError::Protocol(e)) => self.send_error(ctx, &e),
            Ok(commands) => {
                for frame in replies {
                    self.send_frame(ctx, ByteString::from(frame));
                }
                for cmd in commands {
                    if self.end.is_some() {
                        break;
                    }
                    self.command(cmd, ctx);
                }
            }
        }
        self.dialect_commands(ctx);
    }

    fn command(&mut self, cmd: Inbound, ctx: &mut ws::WebsocketContext<Self>) {
        if let Err(e) = self.state.admit(&cmd) {
            return self.send_error(ctx, &e);
        }
        if let Inbound::Close { reason } = cmd {
            let reason = reason.map_or_else(|| "user_stop".into(), |r| bounded(&r, MAX_CLOSE_REASON).to_string());
            return self.finish(ctx, CloseReason::Client(reason));
        }
        // Everything else is admitted only with a worker attached.
        let Some(backend) = self.worker.as_ref().map(|w| w.backend.clone()) else {
            return;
        };
        if self.draining {
            return;
        }
        let key = self.conn;
        let reply = |lost| Delivery::new(ctx.address().recipient(), lost);
        match cmd {
            Inbound::Close { .. } => {}
            Inbound::Init(setup) => {
                let session_id = self.dialect.new_session_id();
                let dialect = self.dialect.name();
                log::info!(
                    "session {session_id}: c{} ({} mode, {dialect} dialect, {}) initialising on worker {}",
                    self.conn,
                    self.settings.mode,
                    self.links.client.addr,
                    self.worker_name()
                );
                let redactor = self.dialect.redactor();
                self.links.sinks.publish(SessionEvent::Started {
                    session_id: &session_id,
                    dialect,
                    redactor: &redactor,
                });
                self.session_id = Some(session_id.clone());
                self.state.initializing();
                backend.do_send(Prepare { key, session_id, dialect, setup, reply: reply(Lost::Work) });
            }
            Inbound::Chunk(chunk) => {
                let seq = self.flow.chunk(chunk.force_listen, Instant::now());
                metrics().chunks_received.with_label_values(&self.mode_label()).inc();
                let (samples, frames) = (chunk.audio.len(), chunk.frames.len());
                self.links.sinks.publish(SessionEvent::ChunkReceived { seq, samples, frames });
                backend.do_send(SubmitChunk { key, seq, chunk });
            }
            Inbound::Turn { input, streaming } => match self.flow.turn(streaming, Instant::now()) {
                Ok((seq, _)) => {
                    let m = &input.messages;
                    self.links.sinks.publish(SessionEvent::TurnReceived {
                        seq,
                        messages: m.len(),
                        samples: m.iter().flat_map(|m| &m.audios).map(Vec::len).sum(),
                        images: m.iter().map(|m| m.images.len()).sum(),
                    });
                    backend.do_send(SubmitTurn { key, seq, input, reply: reply(Lost::Work) })
                }
                Err(e) => {
                    metrics().buffer_refusals.with_label_values(&["turns"]).inc();
                    self.send_error(ctx, &e)
                }
            },
            Inbound::Reconfigure(setup) => {
                // Output of everything sent so far is void.
                self.flow.cut();
                backend.do_send(Reconfigure { key, setup, reply: reply(Lost::Work) });
            }
            Inbound::Interrupt => {
                self.flow.cut();
                backend.do_send(Interrupt { key });
            }
        }
    }

    /// Carries out the commands the dialect issued on its own (bounded: a dialect cannot
    /// keep the actor busy forever).
    fn dialect_commands(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        for _ in 0..8 {
            let commands = self.dialect.take_commands();
            if commands.is_empty() || self.end.is_some() {
                return;
            }
            for cmd in commands {
                if self.end.is_some() {
                    return;
                }
                self.command(cmd, ctx);
            }
        }
    }

    fn meta(&self, reason: &CloseReason) -> SessionMeta {
        let (start, _) = timestamp(self.upgraded_at);
        let (end, _) = timestamp(SystemTime::now());
        let c = self.flow.counters();
        SessionMeta {
            session_id: self.session_id.clone().unwrap_or_default(),
            mode: self.settings.mode.as_str().into(),
            dialect: self.dialect.name().into(),
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

    fn on_fragment(&mut self, item: Item, ctx: &mut ws::WebsocketContext<Self>) {
        let result = match item {
            Item::FirstText(data) => {
                if !self.within_rate(ctx) {
                    // The rest of it is refused too: nothing is started.
                    self.fragments.clear();
                    return;
                }
                self.fragments.first(data, Instant::now())
            }
            Item::FirstBinary(_) => return self.finish(ctx, CloseReason::ProtocolViolation("binary_frame")),
            Item::Continue(data) => self.fragments.append(data),
            Item::Last(data) => match self.fragments.finish(data) {
                Ok(bytes) => {
                    metrics().bytes_received.inc_by(bytes.len() as u64);
                    return match ByteString::try_from(Bytes::from(bytes)) {
                        Ok(text) => self.handle_text(text, ctx),
                        Err(_) => self.finish(ctx, CloseReason::ProtocolViolation("invalid_utf8")),
                    };
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => {}
            Err(FragmentRefusal::TooBig) => {
                log::info!(
                    "session {}: message over {} bytes; closing with 1009",
                    self.who(),
                    self.settings.max_frame_bytes
                );
                self.finish(ctx, CloseReason::ProtocolViolation("message_too_big"));
            }
            Err(FragmentRefusal::BudgetFull) => {
                log::warn!(
                    "session {}: every connection's unfinished messages are at their bound \
                     (server.max_fragment_buffer_mb); closing with 1013",
                    self.who()
                );
                self.finish(ctx, CloseReason::ProtocolViolation("fragments_full"));
            }
            Err(FragmentRefusal::NotStarted) => self.finish(ctx, CloseReason::ProtocolViolation("invalid_frame")),
        }
    }
}

/// The audio and images a client event carried, for the recording.
fn recorded_media(commands: &[Inbound]) -> RecordedMedia {
    let (mut audio, mut frames) = (Vec::new(), Vec::new());
    for cmd in commands {
        match cmd {
            Inbound::Chunk(c) => {
                audio.push(c.audio.clone());
                frames.extend(c.frames.iter().cloned());
            }
            Inbound::Turn { input, .. } => {
                for m in &input.messages {
                    audio.extend(m.audios.iter().cloned());
                    frames.extend(m.images.iter().cloned());
                }
            }
            Inbound::Init(_) | Inbound::Close { .. } | Inbound::Reconfigure(_) | Inbound::Interrupt => {}
        }
    }
    (audio, frames)
}

impl Actor for SessionActor {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        log::debug!("session c{}: connected from {} ({} mode)", self.conn, self.links.client.addr, self.settings.mode);
        metrics().connections_total.inc();
        metrics().connections_open.inc();
        self.links.registry.register(self.conn, ctx.address().recipient());
        if let Some(e) = self.settings.reject.clone() {
            return self.send_error(ctx, &e);
        }
        self.hb(ctx);
        if let Some(every) = self.dialect.tick_interval() {
            ctx.run_interval(every, |act, ctx| {
                if act.end.is_some() {
                    return;
                }
                let mut frames = Vec::new();
                act.dialect.tick(Instant::now(), &mut frames);
                for frame in frames {
                    act.send_frame(ctx, ByteString::from(frame));
                }
                act.dialect_commands(ctx);
            });
        }
        let limit = self.settings.time_limit.saturating_sub(self.upgraded.elapsed());
        ctx.run_later(limit, |act, ctx| {
            log::info!("session {}: time limit of {:?} reached", act.who(), act.settings.time_limit);
            act.finish(ctx, CloseReason::Timeout);
        });
        self.join_queue(false, ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let reason = self.end.clone().unwrap_or(CloseReason::ClientGone);
        self.state.close();
        self.fragments.clear();
        self.links.queue.leave.do_send(Leave { conn: self.conn });
        if self.attach_sent
            && let Some(w) = &self.worker
        {
            w.backend.do_send(Detach { key: self.conn, ended: self.ended_at.unwrap_or_else(Instant::now) });
        }
        let meta = self.meta(&reason);
        self.links.sinks.publish(SessionEvent::Closed { meta: &meta });
        self.links.registry.unregister(self.conn);
        let m = metrics();
        m.connections_open.dec();
        m.sessions_closed.with_label_values(&[reason.metric_label()]).inc();
        if let Some(dialect) = self.active_as {
            m.sessions_active.with_label_values(&[self.settings.mode.as_str(), dialect]).dec();
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
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for SessionActor {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        if self.end.is_some() {
            return;
        }
        self.last_heard = Instant::now();
        match msg {
            Ok(ws::Message::Text(text)) => self.on_text(text, ctx),
            Ok(ws::Message::Binary(data)) => {
                metrics().bytes_received.inc_by(data.len() as u64);
                log::info!("session {}: binary frame; closing with 1003", self.who());
                self.finish(ctx, CloseReason::ProtocolViolation("binary_frame"));
            }
            Ok(ws::Message::Continuation(item)) => self.on_fragment(item, ctx),
            Ok(ws::Message::Ping(payload)) => {
                if self.within_rate(ctx) {
                    ctx.pong(&payload);
                }
            }
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(reason)) => {
                log::debug!("session {}: client sent close {:?}", self.who(), reason);
                self.end = Some(CloseReason::ClientGone);
                ctx.close(reason);
                ctx.stop();
            }
            Err(ws::ProtocolError::Overflow) => {
                log::info!(
                    "session {}: frame over {} bytes; closing with 1009",
                    self.who(),
                    self.settings.max_frame_bytes
                );
                self.finish(ctx, CloseReason::ProtocolViolation("message_too_big"));
            }
            Err(ws::ProtocolError::Io(e)) => {
                // The connection broke (reset, or closed mid-frame): the client is gone.
                log::info!("session {}: connection lost: {e}", self.who());
                self.finish(ctx, CloseReason::ClientGone);
            }
            Err(e) => {
                log::info!("session {}: WebSocket protocol error: {e}", self.who());
                self.finish(ctx, CloseReason::ProtocolViolation("protocol_error"));
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        if self.end.is_none() {
            self.end = Some(CloseReason::ClientGone);
        }
        ctx.stop();
    }
}

impl SessionActor {
    fn join_queue(&mut self, front: bool, ctx: &mut ws::WebsocketContext<Self>) {
        let join = Join { conn: self.conn, mode: self.settings.mode, notify: ctx.address().recipient(), front };
        self.links.queue.join.do_send(join);
    }

    fn on_queue_notice(&mut self, notice: QueueNotice, ctx: &mut ws::WebsocketContext<Self>) {
        if self.end.is_some() {
            return;
        }
        match notice {
            QueueNotice::Queued(info) => {
                log::info!("session c{}: waiting at position {} of {}", self.conn, info.position, info.queue_length);
                self.links.sinks.publish(SessionEvent::Queued { position: info.position });
                self.emit(ctx, Outbound::Queued(info));
            }
            QueueNotice::Update(info) => {
                if self.state.phase() == Phase::Queued && self.worker.is_none() {
                    self.emit(ctx, Outbound::QueueUpdate(info));
                }
            }
            QueueNotice::Assigned { worker, .. } => {
                self.links.queue.claim.do_send(Claim { conn: self.conn });
                let attach = Attach {
                    key: self.conn,
                    label: format!("c{}", self.conn),
                    mode: self.settings.mode,
                    reply: Delivery::new(ctx.address().recipient(), Lost::Attach),
                };
                // If the worker's actor is gone, the delivery answers for it.
                worker.backend.do_send(attach);
                self.worker = Some(worker);
                self.attach_sent = true;
            }
            QueueNotice::Rejected(e) => {
                log::info!("session c{}: refused: {e}", self.conn);
                self.send_error(ctx, &e);
            }
            QueueNotice::Cancelled => {
                log::info!("session c{}: ticket cancelled by an operator", self.conn);
                self.finish(ctx, CloseReason::Cancelled);
            }
        }
    }

    /// The worker it was assigned could not be taken: once, the session goes back to the
    /// head of the queue; a second time, it ends with the error (close 1013).
    fn attach_failed(&mut self, e: ProtocolError, ctx: &mut ws::WebsocketContext<Self>) {
        let worker = self.worker_name().to_string();
        self.worker = None;
        self.attach_sent = false;
        if !self.requeued && self.state.phase() == Phase::Queued {
            self.requeued = true;
            log::warn!(
                "session c{}: worker {worker} could not be taken ({e}); back to the head of the queue",
                self.conn
            );
            self.join_queue(true, ctx);
            return;
        }
        log::warn!("session c{}: worker {worker} could not be taken ({e})", self.conn);
        self.send_error(ctx, &e);
    }
}

impl Handler<QueueNotice> for SessionActor {
    type Result = ();

    fn handle(&mut self, notice: QueueNotice, ctx: &mut Self::Context) {
        self.on_queue_notice(notice, ctx);
        self.dialect_commands(ctx);
    }
}

impl Handler<BackendEvent> for SessionActor {
    type Result = ();

    fn handle(&mut self, event: BackendEvent, ctx: &mut Self::Context) {
        self.on_backend_event(event, ctx);
        self.dialect_commands(ctx);
    }
}

impl Handler<Shutdown> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) {
        if self.end.is_some() || self.draining {
            return;
        }
        let busy = matches!(self.state.phase(), Phase::Initializing | Phase::Active);
        match (&self.worker, busy) {
            (Some(worker), true) => {
                // Let the step in flight finish (its output is sent), then end.
                self.draining = true;
                let reply = Delivery::new(ctx.address().recipient(), Lost::Drain);
                worker.backend.do_send(Drain { key: self.conn, reply });
                ctx.run_later(msg.grace, |act, ctx| act.finish(ctx, CloseReason::ServerShutdown));
            }
            _ => self.finish(ctx, CloseReason::ServerShutdown),
        }
    }
}
