//! SessionActor: one per client connection. It owns the protocol state machine
//! (`SessionState`) and the output rules (`Flow`), the session's time limit counted from
//! the upgrade, and the routing between the client (through its [`Dialect`]), the queue and
//! the worker's BackendActor. It tells the subscribers ([`crate::observe::events`]: the
//! recorder, usage accounting, webhooks...) what happens, and feeds the metrics. A session
//! that ends for any reason releases its ticket or its worker in `stopped()`.
//!
//! It is not the socket: a transport's edge (the WebSocket's, in the server) owns frames,
//! fragments, pings, the message rate and close codes, hands it whole messages
//! ([`messages::FromClient`]) and carries out what it says ([`messages::ToClient`]). So the
//! session runs on a plain context, and its rules are tested with a stand-in edge
//! (`tests.rs`).
//!
//! What the backend says and how it reaches the client is in `output`.
//!
//! A session whose connection is lost without a close is held for its client when
//! `[server] resume_grace_s` is set ([`resume`]): its line goes away (what it says is kept,
//! not sent), its place in the queue or its worker and its conversation stay, and a
//! [`resume::Resume`] within the grace hands it a new line, on which the client first gets
//! what it missed.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use bytestring::ByteString;

use crate::domain::Mode;
use crate::edge::dialect::{DecodeError, Dialect, Emit, Outbox};
use crate::edge::redact::RecordedMedia;
use crate::messages::queue::{Claim, Join, Leave, QueuePort};
use crate::messages::worker::{
    Attach, Delivery, Detach, Drain, Interrupt, Lost, Prepare, Reconfigure, SubmitChunk, SubmitTurn, WorkerLink,
};
use crate::observe::metrics;
use crate::observe::{Interest, SessionEvent, SessionSinks};
use crate::observe::{RecordingSummary, SessionMeta, timestamp};
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError, Violation, bounded};

mod flow;
mod hold;
mod output;
mod registry;
pub mod resume;
mod setups;
mod state;
#[cfg(test)]
mod tests;

pub use registry::{AddressCaps, Admission, Labels, Refusal, Registry};

use crate::edge::client::{
    CallSettings, CallerAudio, ClientLine, FromClient, FromLine, Keypress, ModelAudio, Notice, Playback, ToClient,
};
use crate::messages::queue::QueueNotice;
use crate::messages::session::Shutdown;
use crate::messages::transcribe::{Transcribe, Transcribed};
use crate::messages::worker::BackendEvent;
use flow::Flow;
use resume::{Replay, Resume, ResumeTerms};
use setups::Setups;
use state::{Phase, SessionState};

/// A client's reason for closing is echoed and recorded up to this many bytes.
pub const MAX_CLOSE_REASON: usize = 64;

/// What a session is allowed, from the configuration.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// The mode the client asked for.
    pub mode: Mode,
    /// Counted from the upgrade: queueing, initialisation and silence count.
    pub time_limit: Duration,
    /// A KV length that reaches this ends the session with `context_full`.
    pub context_tokens: u64,
    /// Turn-mode answers outstanding at once (one in progress, the rest waiting).
    pub max_turns: usize,
    /// The session is refused at once with this error (e.g. an unknown model), after the upgrade.
    pub reject: Option<ProtocolError>,
    /// Whether and how long it is held for its client when its connection drops.
    pub resume: ResumeTerms,
}

/// Who is on the other end, for logs and recordings.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    /// The client's address and port (`unknown` when the transport does not say).
    pub addr: String,
    /// The client's `User-Agent` header, when it sent one.
    pub user_agent: Option<String>,
    /// How it reaches the gateway (`websocket`, `webrtc`), for status and recordings.
    pub transport: &'static str,
    /// Its edge carries audio itself, as samples ([`messages::CallerAudio`],
    /// [`messages::ModelAudio`]), rather than in the dialect's events.
    pub carries_audio: bool,
    /// The id of the API key it came with (a client secret's: its minting key's); only a
    /// caller with the same key may resume the session.
    pub key_id: Option<String>,
}

/// What a session is connected to.
pub struct SessionLinks {
    /// Its client's transport.
    pub edge: Box<dyn ClientLine>,
    /// The connection's number ([`crate::ids::connection`]), as its subscribers know it.
    pub conn: u64,
    /// Where the session joins, leaves and claims from its queue.
    pub queue: QueuePort,
    /// Every open session, for admission, status and the shutdown broadcast.
    pub registry: Arc<Registry>,
    /// Its place under the per-address caps, released with the session.
    pub admission: Option<Admission>,
    /// The subscribers' sinks for this session ([`crate::observe::events`]).
    pub sinks: SessionSinks,
    /// Who the client is, for logs and recordings.
    pub client: ClientInfo,
    /// The gateway's recogniser, when `[transcription]` is on.
    pub transcription: Option<crate::messages::transcribe::TranscriptionPort>,
}

/// One client connection's session; see the module's documentation.
pub struct SessionActor {
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    links: SessionLinks,
    conn: u64,
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
    /// Its worker had no room for its first setup (`BackendEvent::NoRoom`): it waits at the
    /// head of the queue, and the next worker is asked the same setup. The client saw
    /// `session.queue_done` already and hears nothing of this but a later `session.created`.
    reseating: bool,
    session_id: Option<String>,
    /// The dialect it was active under (for the active-sessions gauge).
    active_as: Option<&'static str>,
    /// The server is stopping: the job in flight finishes, then the session ends.
    draining: bool,
    end: Option<CloseReason>,
    /// When `end` was decided.
    ended_at: Option<Instant>,
    /// What the dialect hands the client, reused from one message to the next.
    outbox: Outbox,
    /// What it said to its client, numbered and kept for a resume, and whether the client is
    /// away.
    replay: Replay,
    /// The number of its current line (0: the connection it started on); what an earlier
    /// line's edge hands it is not heard.
    line_no: u64,
    /// The resume token, until it goes out in the session's first message.
    token_first: Option<String>,
    /// Why its connection was lost, while it is held.
    away_reason: Option<CloseReason>,
    /// Holds so far: a grace's end concerns its own hold only.
    holds: u64,
    /// The last place in the queue it was told, told again to a client resumed while waiting.
    last_queue: Option<crate::protocol::QueueInfo>,
}

impl SessionActor {
    /// A session for one connection, upgraded now (its time limit counts from here), speaking
    /// `dialect`.
    pub fn new(settings: SessionSettings, dialect: Box<dyn Dialect>, links: SessionLinks) -> SessionActor {
        let now = Instant::now();
        let kept = if settings.resume.on() { settings.resume.replay_bytes } else { 0 };
        SessionActor {
            flow: Flow::new(settings.max_turns),
            settings,
            dialect,
            conn: links.conn,
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
        }
    }

    /// Names the session in logs: its id once it has one, else its connection number.
    fn who(&self) -> String {
        match &self.session_id {
            Some(id) => id.clone(),
            None => format!("c{}", self.conn),
        }
    }

    /// Starts the session with a mailbox of no fixed capacity: its edge bounds what it hands
    /// the session by the bytes not yet handled (and waits for each message's handling), and a
    /// `send` into a full mailbox would wait and could overtake a client's earlier message.
    pub fn start_for_edge(self) -> Addr<SessionActor> {
        SessionActor::create(move |ctx| {
            ctx.set_mailbox_capacity(0);
            self
        })
    }

    fn worker_name(&self) -> &str {
        self.worker.as_ref().map_or("-", |w| w.name.as_str())
    }

    fn mode_label(&self) -> [&'static str; 1] {
        [self.settings.mode.as_str()]
    }

    /// Encodes an event, sends what the dialect made of it, and records it as sent. While
    /// the client is away the model's voice is left out of it (and counted), and a new place
    /// in the queue is only remembered.
    fn emit(&mut self, event: Outbound<'_>) {
        if let Outbound::Queued(info) | Outbound::QueueUpdate(info) = &event {
            self.last_queue = Some(*info);
        }
        if self.replay.away() {
            return self.emit_while_away(event);
        }
        self.encode_and_send(event);
    }

    /// The outbox for a call of the dialect, saying whether text frames are read now: by the
    /// client's side (a phone line with no app on its call reads none), or by the recording.
    fn take_outbox(&mut self) -> Outbox {
        let mut out = std::mem::take(&mut self.outbox);
        out.set_wants_text(self.links.edge.wants_text() || self.links.sinks.wants(Interest::WIRE));
        out
    }

    /// A notice of what became of the session, for its edge (while its client is there).
    fn notice(&mut self, notice: Notice) {
        if !self.replay.away() {
            self.links.edge.tell(ToClient::Notice(notice));
        }
    }

    fn encode_and_send(&mut self, event: Outbound<'_>) {
        let mut out = self.take_outbox();
        self.dialect.encode(event, &mut out);
        self.send_all(&mut out);
        self.outbox = out;
    }

    /// An event while the client is away: said without the model's voice, which it would
    /// otherwise hear late as if fresh.
    fn emit_while_away(&mut self, event: Outbound<'_>) {
        match event {
            Outbound::QueueUpdate(_) => {}
            Outbound::Step { session_id, response_id, input_id, outcome } if !outcome.audio.is_empty() => {
                self.replay.skip_voice(outcome.audio.len());
                let quiet = crate::domain::StepOutcome { audio: Vec::new(), ..outcome.clone() };
                self.encode_and_send(Outbound::Step { session_id, response_id, input_id, outcome: &quiet });
            }
            other => {
                let (quiet, samples) = other.without_voice();
                self.replay.skip_voice(samples);
                self.encode_and_send(quiet);
            }
        }
    }

    /// Sends everything in `out`, in order; `out` is empty afterwards.
    fn send_all(&mut self, out: &mut Outbox) {
        for item in out.drain() {
            match item {
                Emit::Text(frame) => self.send_frame(ByteString::from(frame)),
                Emit::Audio(audio) => self.send_audio(audio),
            }
        }
    }

    /// A message for the client: recorded, numbered and kept on its line (the session's
    /// first carries its resume token, which the recording never sees), and sent unless the
    /// client is away.
    fn send_frame(&mut self, frame: ByteString) {
        self.record_out(frame.as_bytes().clone());
        // Kept without the token: a message sent again never carries a token already used.
        if self.replay.say(&frame) {
            let frame = match self.token_first.take() {
                Some(token) => resume::with_token(&frame, &token),
                None => frame,
            };
            self.links.edge.tell(ToClient::Text(frame));
        }
    }

    /// A message for the client, to the wire's subscribers (the recording).
    fn record_out(&mut self, frame: bytes::Bytes) {
        if self.links.sinks.wants(Interest::WIRE) {
            self.links.sinks.publish(SessionEvent::WireOut { frame: &frame, audio: None });
        }
    }

    /// The model's voice to an edge that carries audio; recorded as a `model.audio` event.
    fn send_audio(&mut self, audio: ModelAudio) {
        if self.links.sinks.wants(Interest::WIRE)
            && let ModelAudio::Delta { response, samples, rate } = &audio
        {
            let frame = serde_json::json!({"type": "model.audio", "response_id": response, "rate": rate, "audio": ""});
            let bytes = bytes::Bytes::from(frame.to_string());
            self.links.sinks.publish(SessionEvent::WireOut { frame: &bytes, audio: Some(samples) });
        }
        if !self.replay.away() {
            self.links.edge.tell(ToClient::Audio(audio));
        } else if let ModelAudio::Delta { samples, rate, .. } = &audio {
            self.replay.skip_voice(samples.len() * 24_000 / (*rate).max(1) as usize);
        }
    }

    fn send_error(&mut self, ctx: &mut Context<Self>, e: &ProtocolError) {
        self.count_error(e);
        self.emit(Outbound::Error(e));
        self.notice(Notice::Error(e.clone()));
        if let Some(reason) = CloseReason::rejected(e) {
            self.finish(ctx, reason);
        }
    }

    /// An error the client is about to hear: logged, counted, and told the subscribers.
    fn count_error(&mut self, e: &ProtocolError) {
        log::debug!("session {}: error {}: {e}", self.who(), e.code());
        metrics().errors.with_label_values(&[e.code()]).inc();
        if self.links.sinks.wants(Interest::ERRORS) {
            let message = e.to_string();
            self.links.sinks.publish(SessionEvent::Error { code: e.code(), message: &message });
        }
    }

    /// Ends the session: `session.closed` when the client should hear it, the close (its
    /// edge closes the connection), then the actor stops (and `stopped()` releases what it
    /// held).
    fn finish(&mut self, ctx: &mut Context<Self>, reason: CloseReason) {
        if self.end.is_some() {
            return;
        }
        if reason.announced() {
            let session_id = self.session_id.clone();
            self.emit(Outbound::Closed { session_id: session_id.as_deref(), reason: &reason });
        }
        self.links.edge.tell(ToClient::Close(reason.clone()));
        self.state.close();
        self.end = Some(reason);
        self.ended_at = Some(Instant::now());
        ctx.stop();
    }

    /// Ends the session without a word to its client, whose connection is gone: the actor
    /// stops (and `stopped()` releases what it held).
    fn end_untold(&mut self, reason: CloseReason, ctx: &mut Context<Self>) {
        self.end = Some(reason);
        self.ended_at = Some(Instant::now());
        self.state.close();
        ctx.stop();
    }

    /// The caller's voice, from an edge that carries audio.
    fn handle_audio(&mut self, audio: CallerAudio, ctx: &mut Context<Self>) {
        let mut replies = self.take_outbox();
        let rate = audio.rate;
        let Some(decoded) = self.decode_with(ctx, "audio", |dialect| dialect.hear(audio, &mut replies)) else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = self.media_of(&decoded);
            let frame = serde_json::json!({"type": "caller.audio", "rate": rate, "audio": ""});
            let frame = bytes::Bytes::from(frame.to_string());
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies, ctx);
        self.outbox = replies;
    }

    /// A key the caller pressed: the dialect's to tell and to carry into the conversation.
    fn handle_key(&mut self, key: Keypress, ctx: &mut Context<Self>) {
        let mut replies = self.take_outbox();
        let Some(decoded) = self.decode_with(ctx, "a key", |dialect| dialect.press(key, &mut replies)) else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            // Which key is the recording's to keep (in the dialect's event), not the wire log's.
            let media = self.media_of(&decoded);
            let frame = bytes::Bytes::from_static(br#"{"type":"caller.key"}"#);
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies, ctx);
        self.outbox = replies;
    }

    /// A call's settings from its edge: the dialect's to apply as its client's own.
    fn handle_configure(&mut self, settings: CallSettings, ctx: &mut Context<Self>) {
        let mut replies = self.take_outbox();
        let Some(decoded) = self.decode_with(ctx, "call settings", |dialect| dialect.configure(settings, &mut replies))
        else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = self.media_of(&decoded);
            let frame = bytes::Bytes::from_static(br#"{"type":"caller.settings"}"#);
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies, ctx);
        self.outbox = replies;
    }

    /// What the caller heard of the model's voice: the dialect's to tell its client.
    fn handle_playback(&mut self, playback: Playback) {
        let mut out = self.take_outbox();
        self.dialect.played(playback, &mut out);
        self.send_all(&mut out);
        self.outbox = out;
    }

    /// What the dialect made of the client's input (`what`: for the log). A dialect bug costs
    /// this session only, not the arbiter thread it shares: a panic closes it (`None`).
    fn decode_with(
        &mut self,
        ctx: &mut Context<Self>,
        what: &str,
        decode: impl FnOnce(&mut dyn Dialect) -> Result<Vec<Inbound>, DecodeError>,
    ) -> Option<Result<Vec<Inbound>, DecodeError>> {
        match catch_unwind(AssertUnwindSafe(|| decode(self.dialect.as_mut()))) {
            Ok(decoded) => Some(decoded),
            Err(_) => {
                log::error!("session {}: the {} dialect panicked on {what}; closing", self.who(), self.dialect.name());
                self.finish(ctx, CloseReason::ProtocolViolation(Violation::InternalError));
                None
            }
        }
    }

    /// The media a decoded input brought, for the recording: the dialect's word, else the
    /// audio and images of its commands.
    fn media_of(&mut self, decoded: &Result<Vec<Inbound>, DecodeError>) -> RecordedMedia {
        match (decoded, self.dialect.take_recorded_media()) {
            (_, Some(media)) => media,
            (Ok(commands), None) => recorded_media(commands),
            (Err(_), None) => (Vec::new(), Vec::new()),
        }
    }

    /// Sends what a decode answered, then carries out its commands (or tells its error).
    fn carry_out(&mut self, decoded: Result<Vec<Inbound>, DecodeError>, replies: &mut Outbox, ctx: &mut Context<Self>) {
        match decoded {
            Err(DecodeError::Unparseable(why)) => {
                log::info!("session {}: unparseable frame ({why}); closing with 1003", self.who());
                self.finish(ctx, CloseReason::ProtocolViolation(Violation::InvalidJson));
            }
            Err(DecodeError::Protocol(e)) => {
                replies.clear();
                self.send_error(ctx, &e)
            }
            Ok(commands) => {
                self.send_all(replies);
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

    /// A whole message from the client.
    fn handle_text(&mut self, text: ByteString, ctx: &mut Context<Self>) {
        let mut replies = self.take_outbox();
        let Some(decoded) = self.decode_with(ctx, "a frame", |dialect| dialect.decode(&text, &mut replies)) else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = self.media_of(&decoded);
            let frame = match &decoded {
                // A frame the dialect refused is kept whole only when small: a client cannot
                // turn junk into disk writes (what was refused is in the error sent back).
                Err(e) if text.len() > MAX_REFUSED_RECORDED => refused_stub(text.len(), e),
                _ => text.as_bytes().clone(),
            };
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies, ctx);
        self.outbox = replies;
    }

    /// A user item's audio to the gateway's recogniser; without one, the client hears why.
    fn transcribe(&mut self, item_id: String, audio: Vec<f32>, ctx: &mut Context<Self>) {
        match &self.links.transcription {
            Some(port) => {
                port.submit(Transcribe { session: self.who(), item_id, audio, reply: ctx.address().recipient() })
            }
            None => {
                let why =
                    "the model does not transcribe speech and the gateway's transcription is off ([transcription])";
                self.emit(Outbound::UserTranscript { item_id: &item_id, result: Err(why) });
            }
        }
    }

    /// Asks the backend again for the setup it had, after it refused a new one.
    fn restore(&mut self, setup: crate::domain::SessionSetup, ctx: &mut Context<Self>) {
        let Some(port) = self.worker.as_ref().map(|w| w.port.clone()) else {
            return;
        };
        self.flow.cut();
        let reply = Delivery::new(ctx.address().recipient(), Lost::Work);
        port.session.reconfigure.do_send(Reconfigure { key: self.conn, setup, reply });
    }

    fn command(&mut self, cmd: Inbound, ctx: &mut Context<Self>) {
        if let Err(e) = self.state.admit(&cmd) {
            return self.send_error(ctx, &e);
        }
        if let Inbound::Close { reason } = cmd {
            let reason = reason.map_or_else(|| "user_stop".into(), |r| bounded(&r, MAX_CLOSE_REASON).to_string());
            return self.finish(ctx, CloseReason::Client(reason));
        }
        // Everything else is admitted only with a worker attached.
        let Some(port) = self.worker.as_ref().map(|w| w.port.clone()) else {
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
                self.setups.asked(setup.clone());
                let transport = self.links.client.transport;
                self.links.registry.label(key, Labels { session_id, dialect, transport });
                port.session.prepare.do_send(Prepare { key, setup, reply: reply(Lost::Work) });
            }
            Inbound::Chunk(chunk) => {
                let seq = self.flow.chunk(chunk.force_listen, Instant::now());
                metrics().chunks_received.with_label_values(&self.mode_label()).inc();
                let (samples, frames) = (chunk.audio.len(), chunk.frames.len());
                self.links.sinks.publish(SessionEvent::ChunkReceived { seq, samples, frames });
                port.session.chunk.do_send(SubmitChunk { key, seq, chunk });
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
                    port.session.turn.do_send(SubmitTurn { key, seq, input, reply: reply(Lost::Work) })
                }
                Err(e) => {
                    metrics().buffer_refusals.with_label_values(&["turns"]).inc();
                    self.send_error(ctx, &e)
                }
            },
            Inbound::Reconfigure(setup) => {
                // Output of everything sent so far is void.
                self.flow.cut();
                self.setups.asked(setup.clone());
                port.session.reconfigure.do_send(Reconfigure { key, setup, reply: reply(Lost::Work) });
            }
            Inbound::Interrupt => {
                self.flow.cut();
                port.session.interrupt.do_send(Interrupt { key });
            }
            Inbound::Transcribe { item_id, audio } => self.transcribe(item_id, audio, ctx),
        }
    }

    /// Carries out the commands the dialect issued on its own (bounded: a dialect cannot
    /// keep the actor busy forever).
    fn dialect_commands(&mut self, ctx: &mut Context<Self>) {
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

/// The largest frame the dialect refused that the wire's subscribers (the recording) get
/// whole; a larger one reaches them as `refused_stub`.
pub const MAX_REFUSED_RECORDED: usize = 1024;

/// What the wire's subscribers get of a refused frame over [`MAX_REFUSED_RECORDED`]: its size
/// and why it was refused, as an event of type `unrecorded`.
fn refused_stub(bytes: usize, why: &DecodeError) -> bytes::Bytes {
    let code = match why {
        DecodeError::Unparseable(_) => "invalid_json",
        DecodeError::Protocol(e) => e.code(),
    };
    serde_json::json!({"type": "unrecorded", "bytes": bytes, "refused": code}).to_string().into()
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
            Inbound::Init(_)
            | Inbound::Close { .. }
            | Inbound::Reconfigure(_)
            | Inbound::Interrupt
            | Inbound::Transcribe { .. } => {}
        }
    }
    (audio, frames)
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        log::debug!("session c{}: connected from {} ({} mode)", self.conn, self.links.client.addr, self.settings.mode);
        metrics().connections_total.inc();
        metrics().connections_open.inc();
        self.links.registry.register(self.conn, ctx.address().recipient());
        if self.settings.resume.on() {
            self.token_first = Some(self.issue_token(ctx));
        }
        if let Some(e) = self.settings.reject.clone() {
            return self.send_error(ctx, &e);
        }
        if self.links.client.carries_audio && !self.dialect.carry_audio() {
            log::warn!(
                "session c{}: its {} edge carries audio, which the {} dialect cannot take as samples",
                self.conn,
                self.links.client.transport,
                self.dialect.name()
            );
        }
        if let Some(every) = self.dialect.tick_interval() {
            ctx.run_interval(every, |act, ctx| {
                if act.end.is_some() {
                    return;
                }
                let mut out = act.take_outbox();
                act.dialect.tick(Instant::now(), &mut out);
                act.send_all(&mut out);
                act.outbox = out;
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
        self.links.registry.tokens().revoke(self.conn);
        if self.replay.away() {
            metrics().sessions_held.dec();
        }
        self.links.queue.leave.do_send(Leave { conn: self.conn });
        if self.attach_sent
            && let Some(w) = &self.worker
        {
            w.port.session.detach.do_send(Detach { key: self.conn, ended: self.ended_at.unwrap_or_else(Instant::now) });
        }
        let meta = self.meta(&reason);
        self.links.sinks.publish(SessionEvent::Closed { meta: &meta });
        self.links.registry.unregister(self.conn);
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
}

/// What a test's stand-in edge sends, as on the session's first line (edges reach it through
/// their [`messages::SessionPort`]).
#[cfg(test)]
impl Handler<FromClient> for SessionActor {
    type Result = ();

    /// What the client sent on the session's first line.
    fn handle(&mut self, msg: FromClient, ctx: &mut Self::Context) {
        self.handle(FromLine { line: 0, msg }, ctx);
    }
}

impl Handler<FromLine> for SessionActor {
    type Result = ();

    fn handle(&mut self, FromLine { line, msg }: FromLine, ctx: &mut Self::Context) {
        if self.end.is_some() {
            return;
        }
        if line != self.line_no {
            // A line the session has left (it was resumed on another): not its client's now.
            return;
        }
        match msg {
            FromClient::Text(text) => self.handle_text(text, ctx),
            FromClient::Audio(audio) => self.handle_audio(audio, ctx),
            FromClient::Key(key) => self.handle_key(key, ctx),
            FromClient::Configure(settings) => self.handle_configure(settings, ctx),
            FromClient::Playback(playback) => self.handle_playback(playback),
            FromClient::Refused(e) => self.send_error(ctx, &e),
            FromClient::Ended(reason) => {
                // The edge has closed the connection: nothing more reaches the client.
                log::debug!("session {}: its connection ended ({})", self.who(), reason.as_str());
                self.end_untold(reason, ctx);
            }
            FromClient::Lost(reason) => self.lose(reason, ctx),
        }
    }
}

impl Handler<Resume> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Resume, ctx: &mut Self::Context) {
        self.resume(msg, ctx);
        self.dialect_commands(ctx);
    }
}

impl SessionActor {
    fn join_queue(&mut self, front: bool, ctx: &mut Context<Self>) {
        let join = Join { conn: self.conn, mode: self.settings.mode, notify: ctx.address().recipient(), front };
        self.links.queue.join.do_send(join);
    }

    fn on_queue_notice(&mut self, notice: QueueNotice, ctx: &mut Context<Self>) {
        if self.end.is_some() {
            return;
        }
        match notice {
            QueueNotice::Queued(info) if self.reseating => {
                log::info!(
                    "session c{}: waiting again at position {} of {}",
                    self.conn,
                    info.position,
                    info.queue_length
                );
            }
            QueueNotice::Queued(info) => {
                log::info!("session c{}: waiting at position {} of {}", self.conn, info.position, info.queue_length);
                self.links.sinks.publish(SessionEvent::Queued { position: info.position });
                self.emit(Outbound::Queued(info));
                self.notice(Notice::Queued(info));
            }
            QueueNotice::Update(info) => {
                if self.state.phase() == Phase::Queued && self.worker.is_none() {
                    self.emit(Outbound::QueueUpdate(info));
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
                worker.port.session.attach.do_send(attach);
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

    /// Its worker had no room for the first setup (see [`Self::reseating`]): back to the head of
    /// the queue, as many times as it takes (each time the worker is retried with backoff).
    pub(super) fn reseat(&mut self, reason: &str, ctx: &mut Context<Self>) {
        log::warn!(
            "session c{}: worker {} has no room for it now ({reason}); back to the head of the queue",
            self.conn,
            self.worker_name()
        );
        self.worker = None;
        self.attach_sent = false;
        self.reseating = true;
        self.join_queue(true, ctx);
    }

    /// A worker took a session whose setup the last one had no room for: it is asked the same.
    fn prepare_again(&mut self, ctx: &mut Context<Self>) {
        self.reseating = false;
        if self.draining {
            return;
        }
        let (Some(port), Some(setup)) = (self.worker.as_ref().map(|w| w.port.clone()), self.setups.pending().cloned())
        else {
            return;
        };
        log::info!("session c{}: asking worker {} for its setup", self.conn, self.worker_name());
        let reply = Delivery::new(ctx.address().recipient(), Lost::Work);
        port.session.prepare.do_send(Prepare { key: self.conn, setup, reply });
    }

    /// The worker it was assigned could not be taken: once, the session goes back to the
    /// head of the queue; a second time, it ends with the error (close 1013). A session waiting
    /// again because its last worker had no room goes back each time.
    fn attach_failed(&mut self, e: ProtocolError, ctx: &mut Context<Self>) {
        let worker = self.worker_name().to_string();
        self.worker = None;
        self.attach_sent = false;
        if self.reseating || (!self.requeued && self.state.phase() == Phase::Queued) {
            self.requeued |= !self.reseating;
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

impl Handler<Transcribed> for SessionActor {
    type Result = ();

    fn handle(&mut self, t: Transcribed, ctx: &mut Self::Context) {
        if self.end.is_some() {
            return;
        }
        let why = t.result.as_ref().err().map(ToString::to_string);
        let result = match (&t.result, &why) {
            (Ok(text), _) => Ok(text.as_str()),
            (Err(_), Some(why)) => Err(why.as_str()),
            (Err(_), None) => Err(""),
        };
        self.emit(Outbound::UserTranscript { item_id: &t.item_id, result });
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
                worker.port.session.drain.do_send(Drain { key: self.conn, reply });
                ctx.run_later(msg.grace, |act, ctx| act.finish(ctx, CloseReason::ServerShutdown));
            }
            _ => self.finish(ctx, CloseReason::ServerShutdown),
        }
    }
}
