//! SessionActor: one per WebSocket. It owns the protocol state machine
//! ([`SessionState`]), the session's time limit counted from the upgrade, the heartbeat,
//! and the routing between the client (through its [`Dialect`]), the queue and the
//! worker's BackendActor. A session that ends for any reason releases its ticket or its
//! worker in `stopped()`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web_actors::ws;

use crate::backend::BackendError;
use crate::backend_actor::{Attach, Detach, Prepare, SubmitChunk, SubmitTurn};
use crate::dialect::{DecodeError, Dialect};
use crate::domain::{Mode, StepKind, StepOutcome, TurnPiece, TurnSummary};
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError};
use crate::queue_actor::{Claim, Join, Leave, QueueActor, QueueNotice, WorkerLink};
use crate::session_state::{Phase, SessionState};

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
}

/// Counts for logs (and, later, recordings).
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
    text: String,
    audio: Vec<f32>,
}

pub struct SessionActor {
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    queue: Addr<QueueActor>,
    conn: u64,
    peer: String,
    state: SessionState,
    upgraded: Instant,
    last_heard: Instant,
    worker: Option<WorkerLink>,
    attach_sent: bool,
    session_id: Option<String>,
    next_seq: u64,
    /// The model turn being spoken in duplex mode.
    response: Option<String>,
    responses: u64,
    /// Speech answering chunks numbered below this is void (a force-listen came after them).
    cancel_below: u64,
    turns: HashMap<u64, TurnAnswer>,
    /// A message arriving in continuation frames.
    fragment: Option<Vec<u8>>,
    end: Option<CloseReason>,
    frames: Vec<String>,
    counters: SessionCounters,
}

impl SessionActor {
    pub fn new(
        settings: SessionSettings,
        dialect: Box<dyn Dialect>,
        queue: Addr<QueueActor>,
        peer: String,
    ) -> SessionActor {
        let now = Instant::now();
        SessionActor {
            settings,
            dialect,
            queue,
            conn: crate::ids::connection(),
            peer,
            state: SessionState::default(),
            upgraded: now,
            last_heard: now,
            worker: None,
            attach_sent: false,
            session_id: None,
            next_seq: 0,
            response: None,
            responses: 0,
            cancel_below: 0,
            turns: HashMap::new(),
            fragment: None,
            end: None,
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

    /// Pings the client and ends the session when it has been silent too long.
    fn hb(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            if act.last_heard.elapsed() > act.settings.heartbeat_timeout {
                log::info!(
                    "session {}: no frame or pong for {:?}; the client is gone",
                    act.who(),
                    act.settings.heartbeat_timeout
                );
                act.finish(ctx, CloseReason::HeartbeatTimeout);
                return;
            }
            ctx.ping(b"");
        });
    }

    fn emit(&mut self, ctx: &mut ws::WebsocketContext<Self>, event: Outbound<'_>) {
        let mut frames = std::mem::take(&mut self.frames);
        self.dialect.encode(event, &mut frames);
        for frame in frames.drain(..) {
            ctx.text(frame);
        }
        self.frames = frames;
    }

    fn send_error(&mut self, ctx: &mut ws::WebsocketContext<Self>, e: &ProtocolError) {
        log::debug!("session {}: error {}: {e}", self.who(), e.code());
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
            self.emit(
                ctx,
                Outbound::Closed {
                    session_id: session_id.as_deref(),
                    reason: &reason,
                },
            );
        }
        let description = match &reason {
            CloseReason::BackendError(why) => Some(why.clone()),
            other => Some(other.as_str().to_string()),
        };
        ctx.close(Some(ws::CloseReason {
            code: ws::CloseCode::from(reason.close_code()),
            description,
        }));
        self.state.close();
        self.end = Some(reason);
        ctx.stop();
    }

    fn on_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        let mut replies = Vec::new();
        match self.dialect.decode(text, &mut replies) {
            Err(DecodeError::Unparseable(why)) => {
                log::info!(
                    "session {}: unparseable frame ({why}); closing with 1003",
                    self.who()
                );
                self.finish(ctx, CloseReason::ProtocolViolation("invalid_json"));
            }
            Err(DecodeError::Protocol(e)) => self.send_error(ctx, &e),
            Ok(commands) => {
                for frame in replies {
                    ctx.text(frame);
                }
                for cmd in commands {
                    if self.end.is_some() {
                        break;
                    }
                    self.command(cmd, ctx);
                }
            }
        }
    }

    fn command(&mut self, cmd: Inbound, ctx: &mut ws::WebsocketContext<Self>) {
        if let Err(e) = self.state.admit(&cmd) {
            return self.send_error(ctx, &e);
        }
        let Some(backend) = self.worker.as_ref().map(|w| w.backend.clone()) else {
            // Only Close is admitted before a worker is attached.
            if let Inbound::Close { reason } = cmd {
                self.finish(
                    ctx,
                    CloseReason::Client(reason.unwrap_or_else(|| "user_stop".into())),
                );
            }
            return;
        };
        let key = self.conn;
        match cmd {
            Inbound::Close { reason } => {
                self.finish(
                    ctx,
                    CloseReason::Client(reason.unwrap_or_else(|| "user_stop".into())),
                );
            }
            Inbound::Init(setup) => {
                let session_id = self.dialect.new_session_id();
                log::info!(
                    "session {session_id}: c{} ({} mode, {} dialect, {}) initialising on worker {}",
                    self.conn,
                    self.settings.mode,
                    self.dialect.name(),
                    self.peer,
                    self.worker_name()
                );
                self.session_id = Some(session_id.clone());
                self.state.initializing();
                let dialect = self.dialect.name();
                backend.do_send(Prepare {
                    key,
                    session_id,
                    dialect,
                    setup,
                });
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
                backend.do_send(SubmitChunk { key, seq, chunk });
            }
            Inbound::Turn { input, streaming } => {
                self.next_seq += 1;
                let seq = self.next_seq;
                let response_id = self.new_response_id();
                self.counters.turns += 1;
                self.turns.insert(
                    seq,
                    TurnAnswer {
                        response_id,
                        streaming,
                        text: String::new(),
                        audio: Vec::new(),
                    },
                );
                backend.do_send(SubmitTurn { key, seq, input });
            }
        }
    }

    fn new_response_id(&mut self) -> String {
        self.responses += 1;
        format!("resp_{}", self.responses)
    }

    fn on_step(
        &mut self,
        seq: u64,
        result: Result<StepOutcome, BackendError>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let outcome = match result {
            Ok(o) => o,
            Err(BackendError::ContextFull(why)) => {
                log::info!("session {}: context full ({why})", self.who());
                return self.finish(ctx, CloseReason::ContextFull);
            }
            Err(e) => {
                log::warn!(
                    "session {}: step for input_{seq} failed on worker {}: {e}",
                    self.who(),
                    self.worker_name()
                );
                return self.send_error(ctx, &ProtocolError::Inference(e.to_string()));
            }
        };
        if outcome.kind == StepKind::Speak && seq < self.cancel_below {
            // Speech computed before a force-listen: never sent.
            log::debug!(
                "session {}: discarding speech for input_{seq} after force_listen",
                self.who()
            );
            return;
        }
        self.counters.chunks_answered += 1;
        let response_id = match outcome.kind {
            StepKind::Listen => {
                self.response = None;
                None
            }
            StepKind::Speak => {
                if self.response.is_none() {
                    self.response = Some(self.new_response_id());
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
        if outcome.end_of_turn {
            self.response = None;
        }
        if outcome.kv_length >= self.settings.context_tokens {
            log::info!(
                "session {}: KV length {} reached the context limit",
                self.who(),
                outcome.kv_length
            );
            self.finish(ctx, CloseReason::ContextFull);
        }
    }

    fn on_turn_piece(&mut self, seq: u64, piece: TurnPiece, ctx: &mut ws::WebsocketContext<Self>) {
        let session_id = self.session_id.clone().unwrap_or_default();
        let Some(answer) = self.turns.get_mut(&seq) else {
            return;
        };
        if answer.streaming {
            let response_id = answer.response_id.clone();
            answer.text.push_str(&piece.text);
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
            answer.text.push_str(&piece.text);
            answer.audio.extend_from_slice(&piece.audio);
        }
    }

    fn on_turn_done(
        &mut self,
        seq: u64,
        result: Result<TurnSummary, BackendError>,
        ctx: &mut ws::WebsocketContext<Self>,
    ) {
        let Some(answer) = self.turns.remove(&seq) else {
            return;
        };
        match result {
            Ok(summary) => {
                let session_id = self.session_id.clone().unwrap_or_default();
                let audio = (!answer.streaming && !answer.audio.is_empty())
                    .then_some(answer.audio.as_slice());
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
                    },
                );
                if summary.kv_length >= self.settings.context_tokens {
                    self.finish(ctx, CloseReason::ContextFull);
                }
            }
            Err(BackendError::ContextFull(_)) => self.finish(ctx, CloseReason::ContextFull),
            Err(e) => {
                log::warn!(
                    "session {}: answer {} failed: {e}",
                    self.who(),
                    answer.response_id
                );
                self.send_error(ctx, &ProtocolError::Inference(e.to_string()));
            }
        }
    }

    fn attached(&mut self, ctx: &mut ws::WebsocketContext<Self>) {
        if self.end.is_some() {
            return;
        }
        self.state.connected();
        log::info!(
            "session c{}: worker {} assigned after {} ms in the queue",
            self.conn,
            self.worker_name(),
            self.upgraded.elapsed().as_millis()
        );
        self.emit(ctx, Outbound::QueueDone);
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
}

impl Actor for SessionActor {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        log::debug!(
            "session c{}: connected from {} ({} mode)",
            self.conn,
            self.peer,
            self.settings.mode
        );
        self.hb(ctx);
        let limit = self
            .settings
            .time_limit
            .saturating_sub(self.upgraded.elapsed());
        ctx.run_later(limit, |act, ctx| {
            log::info!(
                "session {}: time limit of {:?} reached",
                act.who(),
                act.settings.time_limit
            );
            act.finish(ctx, CloseReason::Timeout);
        });
        self.queue.do_send(Join {
            conn: self.conn,
            mode: self.settings.mode,
            notify: ctx.address().recipient(),
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let reason = self.end.clone().unwrap_or(CloseReason::ClientGone);
        self.state.close();
        self.queue.do_send(Leave { conn: self.conn });
        if self.attach_sent
            && let Some(w) = &self.worker
        {
            w.backend.do_send(Detach { key: self.conn });
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
            Ok(ws::Message::Text(text)) => self.on_text(&text, ctx),
            Ok(ws::Message::Binary(_)) => {
                log::info!("session {}: binary frame; closing with 1003", self.who());
                self.finish(ctx, CloseReason::ProtocolViolation("binary_frame"));
            }
            Ok(ws::Message::Continuation(item)) => match item {
                Item::FirstText(data) => {
                    self.fragment = Some(Vec::with_capacity(data.len()));
                    self.append_fragment(&data, ctx);
                }
                Item::FirstBinary(_) => {
                    self.finish(ctx, CloseReason::ProtocolViolation("binary_frame"))
                }
                Item::Continue(data) => {
                    self.append_fragment(&data, ctx);
                }
                Item::Last(data) => {
                    if self.append_fragment(&data, ctx) {
                        let bytes = self.fragment.take().unwrap_or_default();
                        match String::from_utf8(bytes) {
                            Ok(text) => self.on_text(&text, ctx),
                            Err(_) => {
                                self.finish(ctx, CloseReason::ProtocolViolation("invalid_utf8"))
                            }
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
        if self.end.is_some() {
            return;
        }
        match notice {
            QueueNotice::Queued(info) => {
                log::info!(
                    "session c{}: waiting at position {} of {}",
                    self.conn,
                    info.position,
                    info.queue_length
                );
                self.emit(ctx, Outbound::Queued(info));
            }
            QueueNotice::Update(info) => {
                if self.state.phase() == Phase::Queued && self.worker.is_none() {
                    self.emit(ctx, Outbound::QueueUpdate(info));
                }
            }
            QueueNotice::Assigned { worker, .. } => {
                self.queue.do_send(Claim { conn: self.conn });
                let attach = Attach {
                    key: self.conn,
                    label: format!("c{}", self.conn),
                    mode: self.settings.mode,
                    events: ctx.address().recipient(),
                };
                let request = worker.backend.send(attach);
                self.worker = Some(worker);
                self.attach_sent = true;
                ctx.spawn(
                    request
                        .into_actor(self)
                        .map(|result, act, ctx| match result {
                            Ok(Ok(())) => act.attached(ctx),
                            Ok(Err(e)) => act.send_error(ctx, &e),
                            Err(_) => act.send_error(
                                ctx,
                                &ProtocolError::WorkerConnectFailed("the worker stopped".into()),
                            ),
                        }),
                );
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
        if self.end.is_some() {
            return;
        }
        match event {
            BackendEvent::Prepared { prompt_length } => {
                self.state.created();
                let session_id = self.session_id.clone().unwrap_or_default();
                let queue_wait_ms = self.upgraded.elapsed().as_millis() as u64;
                self.emit(
                    ctx,
                    Outbound::Created {
                        session_id: &session_id,
                        kind: self.settings.mode.session_kind(),
                        prompt_length,
                        queue_wait_ms,
                    },
                );
            }
            BackendEvent::PrepareFailed(e) => {
                self.state.init_failed();
                match e {
                    BackendError::ContextFull(_) => self.finish(ctx, CloseReason::ContextFull),
                    BackendError::InvalidArgument(why) => {
                        self.send_error(ctx, &ProtocolError::InvalidPayload(why))
                    }
                    BackendError::Unsupported(why) => {
                        self.send_error(ctx, &ProtocolError::ServiceUnavailable(why))
                    }
                    other => self.send_error(ctx, &ProtocolError::Inference(other.to_string())),
                }
            }
            BackendEvent::Step { seq, result, .. } => self.on_step(seq, result, ctx),
            BackendEvent::Dropped { seq } => {
                self.counters.chunks_dropped += 1;
                log::debug!(
                    "session {}: input_{seq} dropped (client ahead of the worker)",
                    self.who()
                );
            }
            BackendEvent::TurnPiece { seq, piece } => self.on_turn_piece(seq, piece, ctx),
            BackendEvent::TurnDone { seq, result } => self.on_turn_done(seq, result, ctx),
            BackendEvent::Failed { reason } => {
                log::error!(
                    "session {}: worker {} failed: {reason}",
                    self.who(),
                    self.worker_name()
                );
                self.finish(ctx, CloseReason::BackendError(reason));
            }
        }
    }
}
