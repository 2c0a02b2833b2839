//! SessionActor: one per WebSocket. It owns the protocol state machine
//! ([`SessionState`]), the session's time limit counted from the upgrade, the heartbeat,
//! and the routing between the client (through its [`Dialect`]), the queue and the
//! worker's BackendActor. It feeds the session's recording and the metrics. A session
//! that ends for any reason releases its ticket or its worker in `stopped()`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web::web::Bytes;
use actix_web_actors::ws;
use bytestring::ByteString;

use crate::backend::BackendError;
use crate::backend_actor::{Attach, Detach, Drain, Interrupt, Prepare, Reconfigure, SubmitChunk, SubmitTurn};
use crate::dialect::{DecodeError, Dialect, RecordedMedia};
use crate::domain::{Mode, StepKind, StepOutcome, TurnPiece, TurnSummary};
use crate::metrics::metrics;
use crate::outgoing::OutgoingLimit;
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError};
use crate::queue_actor::{Claim, Join, Leave, QueueActor, QueueNotice, WorkerLink};
use crate::recorder::{Recording, RecordingSummary, SessionMeta, timestamp};
use crate::registry::{Admission, Registry, Shutdown};
use crate::session_state::{Phase, SessionState};
use std::panic::{AssertUnwindSafe, catch_unwind};

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
    pub queue: Addr<QueueActor>,
    pub registry: Arc<Registry>,
    /// Its place under the per-IP cap, released with the session.
    pub admission: Option<Admission>,
    pub recording: Recording,
    pub client: ClientInfo,
    /// The bound on what waits to be sent to a client that does not read; `None`: unbounded.
    pub outgoing: Option<OutgoingLimit>,
}

/// What the worker's BackendActor tells its session.
#[derive(Message)]
#[rtype(result = "()")]
pub enum BackendEvent {
    Prepared {
        prompt_length: u64,
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

/// Counts for logs, metrics and the recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounters {
    pub chunks_received: u64,
    pub chunks_dropped: u64,
    pub chunks_answered: u64,
    pub turns: u64,
}

struct TurnAnswer {
    response_id: String,
    streaming: bool,
    submitted: Instant,
    heard_audio: bool,
    text: String,
    audio: Vec<f32>,
}

pub struct SessionActor {
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    links: SessionLinks,
    conn: u64,
    state: SessionState,
    upgraded: Instant,
    upgraded_at: SystemTime,
    last_heard: Instant,
    worker: Option<WorkerLink>,
    attach_sent: bool,
    session_id: Option<String>,
    /// The dialect it was active under (for the active-sessions gauge).
    active_as: Option<&'static str>,
    next_seq: u64,
    /// Arrival of chunks not yet answered, for the first-audio latency.
    arrivals: VecDeque<(u64, Instant)>,
    /// The model turn being spoken in duplex mode.
    response: Option<String>,
    responses: u64,
    /// Speech answering chunks numbered below this is void (a force-listen came after them).
    cancel_below: u64,
    turns: HashMap<u64, TurnAnswer>,
    /// A message arriving in continuation frames.
    fragment: Option<Vec<u8>>,
    /// The server is stopping: the job in flight finishes, then the session ends.
    draining: bool,
    end: Option<CloseReason>,
    /// When `end` was decided.
    ended_at: Option<Instant>,
    frames: Vec<String>,
    counters: SessionCounters,
}

impl SessionActor {
    pub fn new(settings: SessionSettings, dialect: Box<dyn Dialect>, links: SessionLinks) -> SessionActor {
        let now = Instant::now();
        SessionActor {
            settings,
            dialect,
            links,
            conn: crate::ids::connection(),
            state: SessionState::default(),
            upgraded: now,
            upgraded_at: SystemTime::now(),
            last_heard: now,
            worker: None,
            attach_sent: false,
            session_id: None,
            active_as: None,
            next_seq: 0,
            arrivals: VecDeque::new(),
            response: None,
            responses: 0,
            cancel_below: 0,
            turns: HashMap::new(),
            fragment: None,
            draining: false,
            end: None,
            ended_at: None,
            frames: Vec::new(),
            counters: SessionCounters::default(),
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

    /// Pings the client and ends the session when it has been silent too long.
    fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            if act.last_heard.elapsed() > act.settings.heartbeat_timeout {
                log::info!(
                    "session {}: nothing heard for {:?}; the client is gone",
                    act.who(),
                    act.settings.heartbeat_timeout
                );
                act.finish(ctx, CloseReason::HeartbeatTimeout);
                return;
            }
            ctx.ping(b"");
        });
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
        if self.links.recording.is_on() {
            self.links.recording.outbound(frame.as_bytes().clone());
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
            CloseReason::BackendError(why) => why.clone(),
            other => other.as_str().to_string(),
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

    fn on_text(&mut self, text: ByteString, ctx: &mut ws::WebsocketContext<Self>) {
        metrics().bytes_received.inc_by(text.len() as u64);
        let mut replies = Vec::new();
        // A decoder bug must cost this session only, not the arbiter thread it shares.
        let decoded = match catch_unwind(AssertUnwindSafe(|| self.dialect.decode(&text, &mut replies))) {
            Ok(decoded) => decoded,
            Err(_) => {
                log::error!("session {}: the {} decoder panicked on a frame; closing", self.who(), self.dialect.name());
                return self.finish(ctx, CloseReason::ProtocolViolation("internal_error"));
            }
        };
        if self.links.recording.is_on() {
            let (audio, frames) = match (&decoded, self.dialect.take_recorded_media()) {
                (_, Some(media)) => media,
                (Ok(commands), None) => recorded_media(commands),
                (Err(_), None) => (Vec::new(), Vec::new()),
            };
            self.links.recording.inbound(text.as_bytes().clone(), audio, frames);
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
            return self.finish(ctx, CloseReason::Client(reason.unwrap_or_else(|| "user_stop".into())));
        }
        // Everything else is admitted only with a worker attached.
        let Some(backend) = self.worker.as_ref().map(|w| w.backend.clone()) else {
            return;
        };
        if self.draining {
            return;
        }
        let key = self.conn;
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
                self.links.recording.start(&session_id, self.dialect.output_audio(), self.upgraded_at);
                self.session_id = Some(session_id.clone());
                self.state.initializing();
                backend.do_send(Prepare { key, session_id, dialect, setup });
            }
            Inbound::Chunk(chunk) => {
                self.next_seq += 1;
                let seq = self.next_seq;
                if chunk.force_listen {
                    // Speech of every earlier chunk is void; the current turn is over.
                    self.cancel_below = seq;
                    self.response = None;
                }
                self.counters.chunks_received += 1;
                metrics().chunks_received.with_label_values(&self.mode_label()).inc();
                self.arrivals.push_back((seq, Instant::now()));
                backend.do_send(SubmitChunk { key, seq, chunk });
            }
            Inbound::Turn { input, streaming } => {
                self.next_seq += 1;
                let seq = self.next_seq;
                let response_id = self.new_response_id();
                self.counters.turns += 1;
                let answer = TurnAnswer {
                    response_id,
                    streaming,
                    submitted: Instant::now(),
                    heard_audio: false,
                    text: String::new(),
                    audio: Vec::new(),
                };
                self.turns.insert(seq, answer);
                backend.do_send(SubmitTurn { key, seq, input });
            }
            Inbound::Reconfigure(setup) => {
                // Output of everything sent so far is void.
                self.cancel_below = self.next_seq + 1;
                self.response = None;
                backend.do_send(Reconfigure { key, setup });
            }
            Inbound::Interrupt => {
                self.cancel_below = self.next_seq + 1;
                self.response = None;
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

    fn new_response_id(&mut self) -> String {
        self.responses += 1;
        format!("resp_{}", self.responses)
    }

    /// When chunk `seq` arrived (forgetting earlier ones, which will not be answered now).
    fn arrival_of(&mut self, seq: u64) -> Option<Instant> {
        while let Some(&(s, at)) = self.arrivals.front() {
            if s > seq {
                return None;
            }
            self.arrivals.pop_front();
            if s == seq {
                return Some(at);
            }
        }
        None
    }

    fn on_step(&mut self, seq: u64, result: Result<StepOutcome, BackendError>, ctx: &mut ws::WebsocketContext<Self>) {
        let arrived = self.arrival_of(seq);
        let outcome = match result {
            Ok(o) => o,
            Err(BackendError::ContextFull(why)) => {
                log::info!("session {}: context full ({why})", self.who());
                return self.finish(ctx, CloseReason::ContextFull);
            }
            Err(e) => {
                log::warn!("session {}: step for input_{seq} failed on worker {}: {e}", self.who(), self.worker_name());
                return self.send_error(ctx, &ProtocolError::Inference(e.to_string()));
            }
        };
        if outcome.kind == StepKind::Speak && seq < self.cancel_below {
            // Speech computed before a force-listen: never sent.
            log::debug!("session {}: discarding speech for input_{seq} after force_listen", self.who());
            return;
        }
        self.counters.chunks_answered += 1;
        metrics().chunks_answered.with_label_values(&self.mode_label()).inc();
        let response_id = match outcome.kind {
            StepKind::Listen => {
                self.response = None;
                None
            }
            StepKind::Speak => {
                if self.response.is_none() {
                    self.response = Some(self.new_response_id());
                    if let (Some(at), false) = (arrived, outcome.audio.is_empty()) {
                        let mode = self.mode_label();
                        metrics().first_audio_seconds.with_label_values(&mode).observe(at.elapsed().as_secs_f64());
                    }
                }
                self.response.clone()
            }
        };
        let input_id = format!("input_{seq}");
        let session_id = self.session_id.clone().unwrap_or_default();
        self.emit(
            ctx,
            Outbound::Step {
                session_id: &session_id,
                response_id: response_id.as_deref(),
                input_id: &input_id,
                outcome: &outcome,
            },
        );
        if let Some(at) = arrived {
            metrics().chunk_latency_seconds.with_label_values(&self.mode_label()).observe(at.elapsed().as_secs_f64());
        }
        if outcome.end_of_turn {
            self.response = None;
        }
        if outcome.kv_length >= self.settings.context_tokens {
            log::info!("session {}: KV length {} reached the context limit", self.who(), outcome.kv_length);
            self.finish(ctx, CloseReason::ContextFull);
        }
    }

    fn on_turn_piece(&mut self, seq: u64, piece: TurnPiece, ctx: &mut ws::WebsocketContext<Self>) {
        let session_id = self.session_id.clone().unwrap_or_default();
        let mode = self.mode_label();
        let Some(answer) = self.turns.get_mut(&seq) else { return };
        if !piece.audio.is_empty() && !answer.heard_audio {
            answer.heard_audio = true;
            metrics().first_audio_seconds.with_label_values(&mode).observe(answer.submitted.elapsed().as_secs_f64());
        }
        answer.text.push_str(&piece.text);
        if answer.streaming {
            let response_id = answer.response_id.clone();
            self.emit(
                ctx,
                Outbound::TurnDelta {
                    session_id: &session_id,
                    response_id: &response_id,
                    text: &piece.text,
                    audio: &piece.audio,
                },
            );
        } else {
            answer.audio.extend_from_slice(&piece.audio);
        }
    }

    fn on_turn_done(
        &mut self,
        seq: u64,
        result: Result<TurnSummary, BackendError>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Some(answer) = self.turns.remove(&seq) else { return };
        let (summary, cancelled) = match result {
            Ok(summary) => (summary, false),
            Err(BackendError::Interrupted) => {
                let duration = answer.submitted.elapsed();
                (TurnSummary { input_tokens: 0, output_tokens: 0, kv_length: 0, duration }, true)
            }
            Err(BackendError::ContextFull(_)) => return self.finish(ctx, CloseReason::ContextFull),
            Err(e) => {
                log::warn!("session {}: answer {} failed: {e}", self.who(), answer.response_id);
                return self.send_error(ctx, &ProtocolError::Inference(e.to_string()));
            }
        };
        let session_id = self.session_id.clone().unwrap_or_default();
        let audio = (!answer.streaming && !answer.audio.is_empty()).then_some(answer.audio.as_slice());
        self.emit(
            ctx,
            Outbound::TurnDone {
                session_id: &session_id,
                response_id: &answer.response_id,
                text: &answer.text,
                audio,
                input_tokens: summary.input_tokens,
                output_tokens: summary.output_tokens,
                kv_length: summary.kv_length,
                duration_ms: summary.duration.as_millis() as u64,
                cancelled,
            },
        );
        if summary.kv_length >= self.settings.context_tokens {
            self.finish(ctx, CloseReason::ContextFull);
        }
    }

    fn attached(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        if self.end.is_some() {
            return;
        }
        self.state.connected();
        let waited = self.upgraded.elapsed();
        metrics().queue_wait_seconds.observe(waited.as_secs_f64());
        log::info!("session c{}: worker {} assigned after {} ms", self.conn, self.worker_name(), waited.as_millis());
        self.emit(ctx, Outbound::QueueDone);
    }

    fn created(&mut self, prompt_length: u64, ctx: &mut ws::WebsocketContext<Self>) {
        self.state.created();
        let dialect = self.dialect.name();
        self.active_as = Some(dialect);
        metrics().sessions_active.with_label_values(&[self.settings.mode.as_str(), dialect]).inc();
        self.links.registry.set_active(self.settings.mode, true);
        let session_id = self.session_id.clone().unwrap_or_default();
        let queue_wait_ms = self.upgraded.elapsed().as_millis() as u64;
        let kind = self.settings.mode.session_kind();
        self.emit(ctx, Outbound::Created { session_id: &session_id, kind, prompt_length, queue_wait_ms });
    }

    fn append_fragment(&mut self, data: &[u8], ctx: &mut ws::WebsocketContext<Self>) -> bool {
        let Some(buf) = self.fragment.as_mut() else {
            self.finish(ctx, CloseReason::ProtocolViolation("invalid_frame"));
            return false;
        };
        if buf.len() + data.len() > self.settings.max_frame_bytes {
            log::info!(
                "session {}: message over {} bytes; closing with 1009",
                self.who(),
                self.settings.max_frame_bytes
            );
            self.finish(ctx, CloseReason::ProtocolViolation("message_too_big"));
            return false;
        }
        buf.extend_from_slice(data);
        true
    }

    fn meta(&self, reason: &CloseReason) -> SessionMeta {
        let (start, _) = timestamp(self.upgraded_at);
        let (end, _) = timestamp(SystemTime::now());
        let c = self.counters;
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
        self.links.queue.do_send(Join { conn: self.conn, mode: self.settings.mode, notify: ctx.address().recipient() });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let reason = self.end.clone().unwrap_or(CloseReason::ClientGone);
        self.state.close();
        self.links.queue.do_send(Leave { conn: self.conn });
        if self.attach_sent
            && let Some(w) = &self.worker
        {
            w.backend.do_send(Detach { key: self.conn, ended: self.ended_at.unwrap_or_else(Instant::now) });
        }
        let meta = self.meta(&reason);
        self.links.recording.finish(meta);
        self.links.registry.unregister(self.conn);
        let m = metrics();
        m.connections_open.dec();
        m.sessions_closed.with_label_values(&[reason.metric_label()]).inc();
        if let Some(dialect) = self.active_as {
            m.sessions_active.with_label_values(&[self.settings.mode.as_str(), dialect]).dec();
            self.links.registry.set_active(self.settings.mode, false);
        }
        let c = self.counters;
        log::info!(
            "session {}: ended ({}) after {:.1} s on worker {}: {} chunks received, {} dropped, {} answered, {} turns",
            self.who(),
            reason.as_str(),
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
            Ok(ws::Message::Continuation(item)) => match item {
                Item::FirstText(data) => {
                    self.fragment = Some(Vec::with_capacity(data.len()));
                    self.append_fragment(&data, ctx);
                }
                Item::FirstBinary(_) => self.finish(ctx, CloseReason::ProtocolViolation("binary_frame")),
                Item::Continue(data) => {
                    self.append_fragment(&data, ctx);
                }
                Item::Last(data) => {
                    if self.append_fragment(&data, ctx) {
                        let bytes = Bytes::from(self.fragment.take().unwrap_or_default());
                        match ByteString::try_from(bytes) {
                            Ok(text) => self.on_text(text, ctx),
                            Err(_) => self.finish(ctx, CloseReason::ProtocolViolation("invalid_utf8")),
                        }
                    }
                }
            },
            Ok(ws::Message::Ping(payload)) => ctx.pong(&payload),
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

impl Handler<QueueNotice> for SessionActor {
    type Result = ();

    fn handle(&mut self, notice: QueueNotice, ctx: &mut Self::Context) {
        self.on_queue_notice(notice, ctx);
        self.dialect_commands(ctx);
    }
}

impl SessionActor {
    fn on_queue_notice(&mut self, notice: QueueNotice, ctx: &mut ws::WebsocketContext<Self>) {
        if self.end.is_some() {
            return;
        }
        match notice {
            QueueNotice::Queued(info) => {
                log::info!("session c{}: waiting at position {} of {}", self.conn, info.position, info.queue_length);
                self.emit(ctx, Outbound::Queued(info));
            }
            QueueNotice::Update(info) => {
                if self.state.phase() == Phase::Queued && self.worker.is_none() {
                    self.emit(ctx, Outbound::QueueUpdate(info));
                }
            }
            QueueNotice::Assigned { worker, .. } => {
                self.links.queue.do_send(Claim { conn: self.conn });
                let attach = Attach {
                    key: self.conn,
                    label: format!("c{}", self.conn),
                    mode: self.settings.mode,
                    events: ctx.address().recipient(),
                };
                if !worker.backend.connected() {
                    return self.send_error(ctx, &ProtocolError::WorkerConnectFailed("the worker stopped".into()));
                }
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
}

impl Handler<BackendEvent> for SessionActor {
    type Result = ();

    fn handle(&mut self, event: BackendEvent, ctx: &mut Self::Context) {
        self.on_backend_event(event, ctx);
        self.dialect_commands(ctx);
    }
}

impl SessionActor {
    fn on_backend_event(&mut self, event: BackendEvent, ctx: &mut ws::WebsocketContext<Self>) {
        if self.end.is_some() {
            return;
        }
        match event {
            BackendEvent::Prepared { prompt_length } if self.state.phase() == Phase::Active => {
                self.emit(ctx, Outbound::Reconfigured { prompt_length })
            }
            BackendEvent::Prepared { prompt_length } => self.created(prompt_length, ctx),
            BackendEvent::PrepareFailed(e) => {
                self.state.init_failed();
                match e {
                    BackendError::ContextFull(_) => self.finish(ctx, CloseReason::ContextFull),
                    BackendError::InvalidArgument(why) => self.send_error(ctx, &ProtocolError::InvalidPayload(why)),
                    BackendError::Unsupported(why) => self.send_error(ctx, &ProtocolError::ServiceUnavailable(why)),
                    other => self.send_error(ctx, &ProtocolError::Inference(other.to_string())),
                }
            }
            BackendEvent::Step { seq, result, .. } => self.on_step(seq, result, ctx),
            BackendEvent::Dropped { seq } => {
                self.counters.chunks_dropped += 1;
                metrics().chunks_dropped.with_label_values(&self.mode_label()).inc();
                log::debug!("session {}: input_{seq} dropped (client ahead of the worker)", self.who());
            }
            BackendEvent::TurnPiece { seq, piece } => self.on_turn_piece(seq, piece, ctx),
            BackendEvent::TurnDone { seq, result } => self.on_turn_done(seq, result, ctx),
            BackendEvent::Failed { reason } => {
                log::error!("session {}: worker {} failed: {reason}", self.who(), self.worker_name());
                self.finish(ctx, CloseReason::BackendError(reason));
            }
            BackendEvent::Drained => self.finish(ctx, CloseReason::ServerShutdown),
            BackendEvent::Attached(Ok(())) => self.attached(ctx),
            BackendEvent::Attached(Err(e)) => self.send_error(ctx, &e),
        }
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
                worker.backend.do_send(Drain { key: self.conn });
                ctx.run_later(msg.grace, |act, ctx| act.finish(ctx, CloseReason::ServerShutdown));
            }
            _ => self.finish(ctx, CloseReason::ServerShutdown),
        }
    }
}
