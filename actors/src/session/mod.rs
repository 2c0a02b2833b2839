//! A session: one per client connection. Its decisions are one clock-free state machine,
//! [`core::SessionCore`] (its phases, the flow of its inputs and answers, its dialect and so its
//! conversation, its hold and resume, its time), tested without a runtime. The
//! [`SessionActor`] around it only delivers: what reaches it goes to the core, what the core
//! decides ([`core::Effect`]s) goes to the queue, the worker, the recogniser; what its client
//! hears goes out on the client's line as the core says it; and it arms the one timer the
//! core asks for ([`core::SessionCore::deadline`]).
//!
//! It is not the socket: a transport's edge owns frames, fragments, pings, the message rate and
//! close codes, hands it whole messages ([`crate::edge::client::FromClient`]) and carries out
//! what it says ([`crate::edge::client::ToClient`]). So the session runs on a plain context, and
//! its rules are tested with a stand-in edge (`tests.rs`) and without any (`core/tests.rs`).
//!
//! A session whose connection is lost without a close is held for its client when
//! `[server] resume_grace_s` is set ([`resume`]): its line goes away (what it says is kept,
//! not sent), its place in the queue or its worker and its conversation stay, and a
//! [`resume::Resume`] within the grace hands it a new line, on which the client first gets
//! what it missed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::domain::Mode;
use crate::edge::client::{ClientLine, FromLine};
use crate::edge::dialect::Dialect;
use crate::messages::delegate::{Decide, Decided, DelegationPort};
use crate::messages::queue::{Claim, Join, Leave, QueueNotice, QueuePort};
use crate::messages::session::Shutdown;
use crate::messages::transcribe::{Transcribe, Transcribed, TranscriptionPort};
use crate::messages::worker::{
    Attach, BackendEvent, Delivery, Detach, Drain, Interrupt, Lost, Prepare, Reconfigure, SubmitChunk, SubmitTurn,
};
use crate::observe::SessionSinks;
use crate::protocol::ProtocolError;

pub mod core;
mod flow;
mod registry;
pub mod resume;
mod setups;
mod state;
#[cfg(test)]
mod tests;

pub use registry::{AddressCaps, Admission, Labels, Refusal, Registry};

use self::core::{CoreLinks, Effect, SessionCore, ToWorker};
use resume::{Resumable, Resume, ResumeTerms};

/// A client's reason for closing is echoed and recorded up to this many bytes.
pub const MAX_CLOSE_REASON: usize = 64;

/// The largest frame the dialect refused that the wire's subscribers (the recording) get
/// whole; a larger one reaches them as `refused_stub`.
pub const MAX_REFUSED_RECORDED: usize = 1024;

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
    /// Its edge carries audio itself, as samples ([`crate::edge::client::CallerAudio`],
    /// [`crate::edge::client::ModelAudio`]), rather than in the dialect's events.
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
    pub transcription: Option<TranscriptionPort>,
    /// The decider beside a voice that calls no tools, when `[delegation]` is on.
    pub delegation: Option<DelegationPort>,
}

/// One client connection's session: its core, and where the core's effects go; see the
/// module's documentation.
pub struct SessionActor {
    core: SessionCore,
    mode: Mode,
    queue: QueuePort,
    registry: Arc<Registry>,
    transcription: Option<TranscriptionPort>,
    delegation: Option<DelegationPort>,
    /// The one timer armed: the core's deadline, and its handle.
    timer: Option<(Instant, SpawnHandle)>,
}

impl SessionActor {
    /// A session for one connection, upgraded now (its time limit counts from here), speaking
    /// `dialect`.
    pub fn new(settings: SessionSettings, dialect: Box<dyn Dialect>, links: SessionLinks) -> SessionActor {
        let SessionLinks { edge, conn, queue, registry, admission, sinks, client, transcription, delegation } = links;
        let mode = settings.mode;
        let core_links = CoreLinks {
            line: edge,
            conn,
            registry: registry.clone(),
            admission,
            sinks,
            client,
            transcribes: transcription.is_some(),
            decides: delegation.is_some(),
            resumable: None,
        };
        let core = SessionCore::new(settings, dialect, core_links, Instant::now());
        SessionActor { core, mode, queue, registry, transcription, delegation, timer: None }
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

    /// Delivers what the core decided, in order, and arms its next deadline.
    fn deliver(&mut self, ctx: &mut Context<Self>) {
        while let Some(effect) = self.core.poll_effect() {
            match effect {
                Effect::Join { front } => {
                    let notify = ctx.address().recipient();
                    self.queue.join.do_send(Join { conn: self.core.conn(), mode: self.mode, notify, front });
                }
                Effect::Leave => self.queue.leave.do_send(Leave { conn: self.core.conn() }),
                Effect::Claim => self.queue.claim.do_send(Claim { conn: self.core.conn() }),
                Effect::Worker(call) => self.to_worker(call, ctx),
                Effect::Transcribe { item_id, audio } => {
                    if let Some(port) = &self.transcription {
                        let reply = ctx.address().recipient();
                        port.submit(Transcribe { session: self.core.label(), item_id, audio, reply });
                    }
                }
                Effect::Decide { id, request } => {
                    if let Some(port) = &self.delegation {
                        let reply = ctx.address().recipient();
                        port.submit(Decide { session: self.core.label(), id, request, reply });
                    }
                }
                Effect::Stop => ctx.stop(),
            }
        }
        self.arm(ctx);
    }

    /// A call for the session's worker, with where its answers (or its loss) reach the session.
    fn to_worker(&mut self, call: ToWorker, ctx: &mut Context<Self>) {
        let Some(worker) = self.core.worker() else { return };
        let (port, key) = (&worker.port.session, self.core.conn());
        let reply = |lost| Delivery::new(ctx.address().recipient(), lost);
        match call {
            ToWorker::Attach => {
                let label = format!("c{key}");
                port.attach.do_send(Attach { key, label, mode: self.mode, reply: reply(Lost::Attach) })
            }
            ToWorker::Prepare(setup) => port.prepare.do_send(Prepare { key, setup, reply: reply(Lost::Work) }),
            ToWorker::Chunk(seq, chunk) => port.chunk.do_send(SubmitChunk { key, seq, chunk }),
            ToWorker::Turn(seq, input) => port.turn.do_send(SubmitTurn { key, seq, input, reply: reply(Lost::Work) }),
            ToWorker::Reconfigure(setup) => {
                port.reconfigure.do_send(Reconfigure { key, setup, reply: reply(Lost::Work) })
            }
            ToWorker::Interrupt => port.interrupt.do_send(Interrupt { key }),
            ToWorker::Drain => port.drain.do_send(Drain { key, reply: reply(Lost::Drain) }),
            ToWorker::Detach(ended) => port.detach.do_send(Detach { key, ended }),
        }
    }

    /// Arms the one timer for the core's deadline (again only when it moved).
    fn arm(&mut self, ctx: &mut Context<Self>) {
        let next = self.core.deadline();
        if self.timer.as_ref().map(|(at, _)| *at) == next {
            return;
        }
        if let Some((_, handle)) = self.timer.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = next {
            let handle = ctx.run_later(at.saturating_duration_since(Instant::now()), move |act, ctx| {
                act.timer = None;
                // The timer fired for `at`: its deadline has come, whatever the clock's grain.
                act.core.timeout(Instant::now().max(at));
                act.deliver(ctx);
            });
            self.timer = Some((at, handle));
        }
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.registry.register(self.core.conn(), ctx.address().recipient());
        self.core.resumable(Resumable { resume: ctx.address().recipient(), port: ctx.address().recipient() });
        self.core.start(Instant::now());
        self.deliver(ctx);
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.core.stopped();
        while let Some(effect) = self.core.poll_effect() {
            match effect {
                Effect::Leave => self.queue.leave.do_send(Leave { conn: self.core.conn() }),
                Effect::Worker(call @ ToWorker::Detach(_)) => self.to_worker(call, ctx),
                _ => {}
            }
        }
    }
}

/// What a test's stand-in edge sends, as on the session's first line (edges reach it through
/// their [`crate::edge::client::SessionPort`]).
#[cfg(test)]
impl Handler<crate::edge::client::FromClient> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: crate::edge::client::FromClient, ctx: &mut Self::Context) {
        self.handle(FromLine { line: 0, msg, receipt: None }, ctx);
    }
}

impl Handler<FromLine> for SessionActor {
    type Result = ();

    fn handle(&mut self, FromLine { line, msg, receipt }: FromLine, ctx: &mut Self::Context) {
        self.core.client(line, msg);
        self.deliver(ctx);
        // Handled: its edge may read more of its client.
        drop(receipt);
    }
}

impl Handler<Resume> for SessionActor {
    type Result = ();

    fn handle(&mut self, Resume { line, line_no, received }: Resume, ctx: &mut Self::Context) {
        self.core.resumed(line, line_no, received, Instant::now());
        self.deliver(ctx);
    }
}

impl Handler<QueueNotice> for SessionActor {
    type Result = ();

    fn handle(&mut self, notice: QueueNotice, ctx: &mut Self::Context) {
        self.core.queue(notice);
        self.deliver(ctx);
    }
}

impl Handler<BackendEvent> for SessionActor {
    type Result = ();

    fn handle(&mut self, event: BackendEvent, ctx: &mut Self::Context) {
        self.core.backend(event);
        self.deliver(ctx);
    }
}

impl Handler<Decided> for SessionActor {
    type Result = ();

    fn handle(&mut self, d: Decided, ctx: &mut Self::Context) {
        self.core.decided(d.id, &d.result);
        self.deliver(ctx);
    }
}

impl Handler<Transcribed> for SessionActor {
    type Result = ();

    fn handle(&mut self, t: Transcribed, ctx: &mut Self::Context) {
        let why = t.result.as_ref().err().map(ToString::to_string);
        let result = match (&t.result, &why) {
            (Ok(text), _) => Ok(text.as_str()),
            (Err(_), Some(why)) => Err(why.as_str()),
            (Err(_), None) => Err(""),
        };
        self.core.transcribed(&t.item_id, result);
        self.deliver(ctx);
    }
}

impl Handler<Shutdown> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) {
        self.core.shutdown(msg.grace, Instant::now());
        self.deliver(ctx);
    }
}
