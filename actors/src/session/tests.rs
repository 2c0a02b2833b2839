//! The SessionActor's rules, each with stand-ins for its edge, its queue and its worker (no
//! socket, no backend): limits and timeouts, queue notices, force-listen, silent drop,
//! context_full, backend loss, endings.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::registry::Registry;
use super::resume::{ResumeRefusal, ResumeTerms};
use super::{ClientInfo, SessionActor, SessionLinks, SessionSettings};
use crate::domain::{DuplexChunk, Mode, SessionKind, SessionSetup, StepKind, StepOutcome};
use crate::edge::backend::BackendError;
use crate::edge::client::{CallSettings, CallerAudio, ClientLine, FromClient, FromLine, ModelAudio, Notice, ToClient};
use crate::edge::dialect::{DecodeError, Dialect, Outbox};
use crate::edge::redact::{Direction, MediaSink, Recorded, Redact};
use crate::messages::queue::QueueNotice;
use crate::messages::queue::TicketStatus;
use crate::messages::queue::{Cancel, Claim, Join, Leave, QueuePort, QueueSnapshot};
use crate::messages::session::Shutdown;
use crate::messages::worker::BackendEvent;
use crate::messages::worker::{
    Attach, Control, Detach, Drain, Interrupt, Prepare, Reconfigure, Run, Stop, SubmitChunk, SubmitTurn, WorkerLink,
    WorkerPort,
};
use crate::observe::{Interest, SessionEvent, SessionInfo, SessionSink, Subscriber, Subscribers};
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError, QueueInfo, Violation};

/// How long a test waits for anything before it fails.
const WAIT: Duration = Duration::from_secs(5);

/// A dialect of plain words: `init`, `chunk`, `force` (a force-listen chunk), `close`, `bad`
/// (a protocol error), anything else unparseable. Events are encoded as short words.
struct Words;

impl Dialect for Words {
    fn name(&self) -> &'static str {
        "words"
    }

    fn decode(&mut self, text: &bytestring::ByteString, _: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        let chunk =
            |force_listen| Inbound::Chunk(DuplexChunk { audio: vec![0.0; 16], force_listen, ..Default::default() });
        match &**text {
            "init" => Ok(vec![Inbound::Init(SessionSetup::new(SessionKind::Duplex))]),
            "chunk" => Ok(vec![chunk(false)]),
            "force" => Ok(vec![chunk(true)]),
            "close" => Ok(vec![Inbound::Close { reason: None }]),
            "bad" => Err(DecodeError::Protocol(ProtocolError::InvalidPayload("bad".into()))),
            other => Err(DecodeError::Unparseable(format!("'{other}' is not a word"))),
        }
    }

    fn carry_audio(&mut self) -> bool {
        true
    }

    /// The caller's voice as one chunk of its samples, at whatever rate.
    fn hear(&mut self, audio: CallerAudio, _: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        Ok(vec![Inbound::Chunk(DuplexChunk { audio: audio.samples, ..Default::default() })])
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        if let Outbound::Step { outcome, response_id: Some(response), .. } = &event
            && !outcome.audio.is_empty()
        {
            let (response, samples) = (response.to_string(), outcome.audio.clone());
            out.audio(ModelAudio::Delta { response, samples, rate: 24000 });
        }
        out.push(match event {
            Outbound::Queued(i) => format!("queued {}", i.position),
            Outbound::QueueUpdate(i) => format!("update {}", i.position),
            Outbound::QueueDone => "queue_done".into(),
            Outbound::Created { .. } => "created".into(),
            Outbound::Step { input_id, outcome, .. } => format!("step {input_id} {:?}", outcome.kind),
            Outbound::Error(e) => format!("error {}", e.code()),
            Outbound::Closed { reason, .. } => format!("closed {}", reason.as_str()),
            other => format!("{other:?}"),
        });
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        struct Nothing;
        impl Redact for Nothing {
            fn redact(
                &self,
                _: Direction,
                _: &[u8],
                _: crate::edge::redact::RecordedMedia,
                _: &mut dyn MediaSink,
            ) -> std::io::Result<Recorded> {
                Ok(Recorded::Raw(String::new()))
            }
        }
        Arc::new(Nothing)
    }
}

/// What the stand-ins saw, in order (compared through `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
enum Seen {
    /// The edge was told to send this text.
    Text(String),
    /// The edge was told to close.
    Close(CloseReason),
    /// The edge was handed the model's voice.
    Audio(ModelAudio),
    Join {
        front: bool,
    },
    Leave,
    Claim,
    Attach,
    Prepare,
    Chunk {
        seq: u64,
        force_listen: bool,
    },
    Detach,
    Drain,
    Interrupt,
    /// The session's sinks heard it ended with these counters (received, dropped, answered).
    Closed {
        received: u64,
        dropped: u64,
        answered: u64,
    },
}

/// The edge, the queue and the worker in one actor: each hands what it got to the test.
struct Stand {
    seen: UnboundedSender<Seen>,
    /// The edge's notices, apart from what it sends (in order among themselves).
    notices: UnboundedSender<Notice>,
    /// The session's notice recipient, from its Join.
    notify: UnboundedSender<Recipient<QueueNotice>>,
    /// The session's event recipient, from its Attach (answered `Attached` unless refused).
    events: UnboundedSender<Recipient<BackendEvent>>,
    refuse_attach: bool,
    /// Prepare is dropped unhandled (the worker's actor is gone).
    lose_prepare: bool,
}

impl Actor for Stand {
    type Context = Context<Self>;
}

macro_rules! stand {
    ($($message:ty => |$s:ident, $m:ident| $body:expr;)*) => {$(
        impl Handler<$message> for Stand {
            type Result = ();
            fn handle(&mut self, $m: $message, _: &mut Context<Self>) {
                let $s = self;
                $body
            }
        }
    )*};
}

stand! {
    ToClient => |s, m| {
        let _ = s.seen.send(match m {
            ToClient::Text(t) => Seen::Text(t.to_string()),
            ToClient::Audio(a) => Seen::Audio(a),
            ToClient::Close(r) => Seen::Close(r),
            ToClient::Notice(n) => {
                let _ = s.notices.send(n);
                return;
            }
        });
    };
    Join => |s, m| {
        let _ = s.seen.send(Seen::Join { front: m.front });
        let _ = s.notify.send(m.notify);
    };
    Leave => |s, _m| { let _ = s.seen.send(Seen::Leave); };
    Claim => |s, _m| { let _ = s.seen.send(Seen::Claim); };
    Attach => |s, m| {
        let _ = s.seen.send(Seen::Attach);
        let to = m.reply.handled();
        let answer = if s.refuse_attach { Err(ProtocolError::WorkerBusy("busy".into())) } else { Ok(()) };
        to.do_send(BackendEvent::Attached(answer));
        let _ = s.events.send(to);
    };
    Prepare => |s, m| {
        let _ = s.seen.send(Seen::Prepare);
        if !s.lose_prepare {
            m.reply.handled();
        }
    };
    SubmitChunk => |s, m| { let _ = s.seen.send(Seen::Chunk { seq: m.seq, force_listen: m.chunk.force_listen }); };
    SubmitTurn => |_s, _m| {};
    Detach => |s, _m| { let _ = s.seen.send(Seen::Detach); };
    Reconfigure => |_s, _m| {};
    Interrupt => |s, _m| { let _ = s.seen.send(Seen::Interrupt); };
    Drain => |s, m| {
        let _ = s.seen.send(Seen::Drain);
        m.reply.handled();
    };
    Run => |_s, _m| {};
    Control => |_s, _m| {};
}

impl Handler<Stop> for Stand {
    type Result = bool;
    fn handle(&mut self, _: Stop, _: &mut Context<Self>) -> bool {
        true
    }
}

impl Handler<Cancel> for Stand {
    type Result = bool;
    fn handle(&mut self, _: Cancel, _: &mut Context<Self>) -> bool {
        false
    }
}

impl Handler<QueueSnapshot> for Stand {
    type Result = MessageResult<QueueSnapshot>;
    fn handle(&mut self, _: QueueSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(Vec::<TicketStatus>::new())
    }
}

/// A subscriber that reports the counters a session ends with.
struct Ending(UnboundedSender<Seen>);
struct EndingSink(UnboundedSender<Seen>);
impl SessionSink for EndingSink {
    fn event(&mut self, event: &SessionEvent<'_>) {
        if let SessionEvent::Closed { meta } = event {
            let (received, dropped, answered) = (meta.chunks_received, meta.chunks_dropped, meta.chunks_answered);
            let _ = self.0.send(Seen::Closed { received, dropped, answered });
        }
    }
}
impl Subscriber for Ending {
    fn name(&self) -> &str {
        "ending"
    }
    fn interest(&self) -> Interest {
        Interest::LIFECYCLE
    }
    fn session(&self, _: &SessionInfo) -> Option<Box<dyn SessionSink>> {
        Some(Box::new(EndingSink(self.0.clone())))
    }
}

struct Test {
    seen: UnboundedReceiver<Seen>,
    notices: UnboundedReceiver<Notice>,
    /// What the session's sinks heard at its end (on its own thread, so in no order with the
    /// stand-ins' mailbox).
    ended: UnboundedReceiver<Seen>,
    notify: UnboundedReceiver<Recipient<QueueNotice>>,
    events: UnboundedReceiver<Recipient<BackendEvent>>,
    session: Addr<SessionActor>,
    worker: WorkerPort,
    registry: Arc<Registry>,
    stand: Addr<Stand>,
}

#[derive(Default)]
struct Options {
    time_limit: Option<Duration>,
    refuse_attach: bool,
    lose_prepare: bool,
    /// The edge carries audio as samples.
    carries_audio: bool,
    /// How the session is held when its connection is lost (off by default).
    resume: Option<ResumeTerms>,
    /// The edge reads no text (a phone line with no app on its call).
    no_text: bool,
}

/// An edge's line that reads no text.
struct NoText(Recipient<ToClient>);

impl ClientLine for NoText {
    fn tell(&self, msg: ToClient) {
        self.0.do_send(msg);
    }
    fn wants_text(&self) -> bool {
        false
    }
}

fn settings(o: &Options) -> SessionSettings {
    SessionSettings {
        mode: Mode::Audio,
        time_limit: o.time_limit.unwrap_or(Duration::from_secs(600)),
        context_tokens: 1000,
        max_turns: 4,
        reject: None,
        resume: o.resume.unwrap_or(ResumeTerms::OFF),
    }
}

fn start(o: Options) -> Test {
    let (seen_tx, seen) = unbounded_channel();
    let (notices_tx, notices) = unbounded_channel();
    let (notify_tx, notify) = unbounded_channel();
    let (events_tx, events) = unbounded_channel();
    let (ended_tx, ended) = unbounded_channel();
    let stand = Stand {
        seen: seen_tx,
        notices: notices_tx,
        notify: notify_tx,
        events: events_tx,
        refuse_attach: o.refuse_attach,
        lose_prepare: o.lose_prepare,
    }
    .start();
    let subscribers = Subscribers::new(vec![Arc::new(Ending(ended_tx))]);
    let registry = Registry::new();
    let info = SessionInfo {
        conn: 1,
        mode: Mode::Audio,
        client_addr: "test".into(),
        user_agent: None,
        key_id: None,
        upgraded: std::time::Instant::now(),
        upgraded_at: std::time::SystemTime::now(),
    };
    let links = SessionLinks {
        edge: if o.no_text {
            Box::new(NoText(stand.clone().recipient::<ToClient>())) as Box<dyn ClientLine>
        } else {
            Box::new(stand.clone().recipient::<ToClient>())
        },
        conn: 1,
        queue: QueuePort::of(&stand),
        registry: registry.clone(),
        admission: None,
        sinks: subscribers.session(&info),
        client: ClientInfo { carries_audio: o.carries_audio, ..ClientInfo::default() },
        transcription: None,
        delegation: None,
    };
    let session = SessionActor::new(settings(&o), Box::new(Words), links).start();
    Test { seen, notices, ended, notify, events, session, worker: WorkerPort::of(&stand).0, registry, stand }
}

impl Test {
    async fn next(&mut self) -> Seen {
        tokio::time::timeout(WAIT, self.seen.recv()).await.expect("something within the wait").expect("open")
    }

    /// The next notice the edge was told.
    async fn notice(&mut self) -> Notice {
        tokio::time::timeout(WAIT, self.notices.recv()).await.expect("a notice within the wait").expect("open")
    }

    /// The next text the edge was told to send.
    async fn text(&mut self) -> String {
        match self.next().await {
            Seen::Text(t) => t,
            other => panic!("expected a text, got {other:?}"),
        }
    }

    /// The counters the session ended with.
    async fn ended(&mut self, what: &str) {
        let got = tokio::time::timeout(WAIT, self.ended.recv()).await.expect("the end within the wait").unwrap();
        assert_eq!(format!("{got:?}"), what);
    }

    async fn expect(&mut self, what: &str) {
        let got = self.next().await;
        assert_eq!(format!("{got:?}"), what);
    }

    fn client(&self, text: &str) {
        self.session.do_send(FromClient::Text(text.to_string().into()));
    }

    fn step(&self, to: &Recipient<BackendEvent>, seq: u64, kind: StepKind, kv_length: u64) {
        let outcome = StepOutcome { kind, kv_length, ..StepOutcome::listen(kv_length) };
        to.do_send(BackendEvent::Step { seq, result: Ok(outcome), elapsed: Duration::ZERO });
    }

    /// The test's worker, as the queue hands it.
    fn link(&self) -> WorkerLink {
        WorkerLink { id: 0, name: "w".into(), port: Arc::new(self.worker.clone()), info: Default::default() }
    }

    /// Joins, is handed the worker, initialises: the session is active. Returns where its
    /// worker's events go.
    async fn active(&mut self) -> Recipient<BackendEvent> {
        self.expect("Join { front: false }").await;
        let notify = self.notify.recv().await.unwrap();
        notify.do_send(QueueNotice::Assigned { ticket: 1, worker: self.link() });
        self.expect("Claim").await;
        self.expect("Attach").await;
        let events = self.events.recv().await.unwrap();
        assert_eq!(self.text().await, "queue_done");
        self.client("init");
        self.expect("Prepare").await;
        let backend = Box::new(crate::domain::BackendInfo { duplex: true, ..Default::default() });
        events.do_send(BackendEvent::Prepared { prompt_length: 3, backend });
        assert_eq!(self.text().await, "created");
        events
    }
}

#[actix::test]
async fn a_waiting_client_hears_its_place_and_the_time_limit_ends_it() {
    // The clock is the test's: the limit passes as soon as nothing else is left to do.
    tokio::time::pause();
    let mut t = start(Options { time_limit: Some(Duration::from_millis(300)), ..Default::default() });
    t.expect("Join { front: false }").await;
    let notify = t.notify.recv().await.unwrap();
    let info = |position| QueueInfo { ticket: 1, position, estimated_wait_s: 1.0, queue_length: 3, measured: true };
    notify.do_send(QueueNotice::Queued(info(3)));
    assert_eq!(t.text().await, "queued 3");
    notify.do_send(QueueNotice::Update(info(2)));
    assert_eq!(t.text().await, "update 2");
    // The limit counts from the upgrade, waiting included.
    assert_eq!(t.text().await, "closed timeout");
    t.expect("Close(Timeout)").await;
    t.expect("Leave").await;
    t.ended("Closed { received: 0, dropped: 0, answered: 0 }").await;
}

#[actix::test]
async fn the_edge_is_told_what_became_of_its_session_as_typed_notices() {
    let mut t = start(Options::default());
    t.expect("Join { front: false }").await;
    let notify = t.notify.recv().await.unwrap();
    let info = QueueInfo { ticket: 1, position: 2, estimated_wait_s: 1.0, queue_length: 2, measured: true };
    notify.do_send(QueueNotice::Queued(info));
    assert_eq!(t.text().await, "queued 2");
    assert_eq!(t.notice().await, Notice::Queued(info));
    notify.do_send(QueueNotice::Update(QueueInfo { position: 1, ..info }));
    assert_eq!(t.text().await, "update 1");
    t.client("init");
    assert_eq!(t.text().await, "error not_ready");
    assert!(matches!(t.notice().await, Notice::Error(e) if e.code() == "not_ready"), "an error the client hears");
    notify.do_send(QueueNotice::Assigned { ticket: 1, worker: t.link() });
    t.expect("Claim").await;
    t.expect("Attach").await;
    let events = t.events.recv().await.unwrap();
    assert_eq!(t.text().await, "queue_done");
    t.client("init");
    t.expect("Prepare").await;
    events.do_send(BackendEvent::Prepared { prompt_length: 3, backend: Box::default() });
    assert_eq!(t.text().await, "created");
    // No notice for an update of the queue: the next one says the session is live.
    assert!(matches!(t.notice().await, Notice::Created { session_id } if !session_id.is_empty()));
}

#[actix::test]
async fn an_edge_that_reads_no_text_is_sent_none_and_still_told_its_notices() {
    let mut t = start(Options { no_text: true, ..Default::default() });
    t.expect("Join { front: false }").await;
    let notify = t.notify.recv().await.unwrap();
    notify.do_send(QueueNotice::Assigned { ticket: 1, worker: t.link() });
    t.expect("Claim").await;
    t.expect("Attach").await;
    let events = t.events.recv().await.unwrap();
    t.client("init");
    t.expect("Prepare").await;
    events.do_send(BackendEvent::Prepared { prompt_length: 3, backend: Box::default() });
    assert!(matches!(t.notice().await, Notice::Created { .. }));
    // A call's settings the dialect does not take: the edge hears the error as a notice.
    t.session.do_send(FromClient::Configure(CallSettings { voice: Some("alloy".into()), ..Default::default() }));
    assert!(matches!(t.notice().await, Notice::Error(e) if e.code() == "invalid_payload"));
    t.client("close");
    t.expect(r#"Close(Client("user_stop"))"#).await;
    t.expect("Leave").await;
    t.expect("Detach").await;
    assert!(t.seen.try_recv().is_err(), "nothing but the close and the worker's messages: no text");
}

#[actix::test]
async fn a_full_queue_refuses_with_an_error_and_the_close_that_follows_it() {
    let mut t = start(Options::default());
    t.expect("Join { front: false }").await;
    let notify = t.notify.recv().await.unwrap();
    notify.do_send(QueueNotice::Rejected(ProtocolError::QueueFull("full".into())));
    assert_eq!(t.text().await, "error queue_full");
    t.expect(r#"Close(Rejected { code: "queue_full", close_code: 1013 })"#).await;
}

#[actix::test]
async fn an_operator_cancelling_the_ticket_ends_the_session() {
    let mut t = start(Options::default());
    t.expect("Join { front: false }").await;
    t.notify.recv().await.unwrap().do_send(QueueNotice::Cancelled);
    assert_eq!(t.text().await, "closed cancelled");
    t.expect("Close(Cancelled)").await;
}

#[actix::test]
async fn input_before_the_worker_is_refused_as_not_ready() {
    let mut t = start(Options::default());
    t.expect("Join { front: false }").await;
    t.client("init");
    assert_eq!(t.text().await, "error not_ready");
    t.client("chunk");
    assert_eq!(t.text().await, "error not_ready");
}

#[actix::test]
async fn an_edge_that_carries_audio_hands_its_session_samples_and_is_handed_the_models() {
    let mut t = start(Options { carries_audio: true, ..Default::default() });
    let events = t.active().await;
    t.session.do_send(FromClient::Audio(CallerAudio { samples: vec![0.5; 320], rate: 16000 }));
    t.expect("Chunk { seq: 1, force_listen: false }").await;
    // The worker speaks: its voice reaches the edge as samples, in order with the step's text.
    let outcome = StepOutcome { kind: StepKind::Speak, audio: vec![0.25; 480], ..StepOutcome::listen(5) };
    events.do_send(BackendEvent::Step { seq: 1, result: Ok(outcome), elapsed: Duration::ZERO });
    match t.next().await {
        Seen::Audio(ModelAudio::Delta { samples, rate: 24000, .. }) => assert_eq!(samples, vec![0.25; 480]),
        other => panic!("expected the voice, got {other:?}"),
    }
    assert_eq!(t.text().await, "step input_1 Speak");
}

#[actix::test]
async fn a_force_listen_voids_the_speech_of_earlier_input_and_reaches_the_worker_at_once() {
    let mut t = start(Options::default());
    let events = t.active().await;
    t.client("chunk");
    t.expect("Chunk { seq: 1, force_listen: false }").await;
    t.client("force");
    t.expect("Chunk { seq: 2, force_listen: true }").await;
    // Speech computed for chunk 1 before the force-listen is never sent; chunk 2's listen is.
    t.step(&events, 1, StepKind::Speak, 10);
    t.step(&events, 2, StepKind::Listen, 11);
    assert_eq!(t.text().await, "step input_2 Listen");
}

#[actix::test]
async fn a_chunk_the_worker_dropped_is_counted_and_the_session_goes_on() {
    let mut t = start(Options::default());
    let events = t.active().await;
    for seq in 1..=3 {
        t.client("chunk");
        t.expect(&format!("Chunk {{ seq: {seq}, force_listen: false }}")).await;
    }
    events.do_send(BackendEvent::Dropped { seq: 1 });
    t.step(&events, 2, StepKind::Listen, 5);
    assert_eq!(t.text().await, "step input_2 Listen");
    t.client("close");
    assert_eq!(t.text().await, "closed user_stop");
    t.expect(r#"Close(Client("user_stop"))"#).await;
    t.expect("Leave").await;
    t.expect("Detach").await;
    t.ended("Closed { received: 3, dropped: 1, answered: 1 }").await;
}

#[actix::test]
async fn a_step_that_reaches_the_context_limit_ends_the_session_with_context_full() {
    let mut t = start(Options::default());
    let events = t.active().await;
    t.client("chunk");
    t.expect("Chunk { seq: 1, force_listen: false }").await;
    t.step(&events, 1, StepKind::Listen, 1000);
    assert_eq!(t.text().await, "step input_1 Listen");
    assert_eq!(t.text().await, "closed context_full");
    t.expect("Close(ContextFull)").await;
}

#[actix::test]
async fn a_worker_lost_mid_session_ends_it_with_backend_error() {
    let mut t = start(Options { lose_prepare: true, ..Default::default() });
    t.expect("Join { front: false }").await;
    let notify = t.notify.recv().await.unwrap();
    notify.do_send(QueueNotice::Assigned { ticket: 1, worker: t.link() });
    t.expect("Claim").await;
    t.expect("Attach").await;
    assert_eq!(t.text().await, "queue_done");
    // The worker's actor drops the prepare unhandled: the delivery answers for it.
    t.client("init");
    t.expect("Prepare").await;
    assert_eq!(t.text().await, "closed backend_error");
    match t.next().await {
        Seen::Close(CloseReason::BackendError(why)) => assert_eq!(why, "the worker stopped"),
        other => panic!("{other:?}"),
    }
}

#[actix::test]
async fn a_worker_that_cannot_be_taken_sends_the_session_back_to_the_head_once() {
    let mut t = start(Options { refuse_attach: true, ..Default::default() });
    t.expect("Join { front: false }").await;
    t.notify.recv().await.unwrap().do_send(QueueNotice::Assigned { ticket: 1, worker: t.link() });
    t.expect("Claim").await;
    t.expect("Attach").await;
    t.expect("Join { front: true }").await;
    t.notify.recv().await.unwrap().do_send(QueueNotice::Assigned { ticket: 2, worker: t.link() });
    t.expect("Claim").await;
    t.expect("Attach").await;
    assert_eq!(t.text().await, "error worker_busy");
    t.expect(r#"Close(Rejected { code: "worker_busy", close_code: 1013 })"#).await;
}

#[actix::test]
async fn a_worker_with_no_room_sends_the_session_back_to_the_head_and_the_next_is_asked_the_same() {
    let mut t = start(Options::default());
    t.expect("Join { front: false }").await;
    t.notify.recv().await.unwrap().do_send(QueueNotice::Assigned { ticket: 1, worker: t.link() });
    t.expect("Claim").await;
    t.expect("Attach").await;
    let events = t.events.recv().await.unwrap();
    assert_eq!(t.text().await, "queue_done");
    t.client("init");
    t.expect("Prepare").await;
    // Its server's slot was taken by someone else: as often as it takes, the session waits at
    // the head, unheard by the client, and the next worker is asked the setup it was asked.
    for ticket in 2..4 {
        events.do_send(BackendEvent::NoRoom { reason: "no free session slot".into() });
        t.expect("Join { front: true }").await;
        let info = QueueInfo { ticket, position: 1, estimated_wait_s: 1.0, queue_length: 1, measured: true };
        let notify = t.notify.recv().await.unwrap();
        notify.do_send(QueueNotice::Queued(info));
        notify.do_send(QueueNotice::Assigned { ticket, worker: t.link() });
        t.expect("Claim").await;
        t.expect("Attach").await;
        t.expect("Prepare").await;
    }
    let events = t.events.recv().await.unwrap();
    let backend = Box::new(crate::domain::BackendInfo { duplex: true, ..Default::default() });
    events.do_send(BackendEvent::Prepared { prompt_length: 3, backend });
    // No second queue_done, no queue events: the client sees its session created.
    assert_eq!(t.text().await, "created");
}

#[actix::test]
async fn what_the_edge_refuses_is_told_and_what_it_ends_ends_the_session_untold() {
    let mut t = start(Options::default());
    let _events = t.active().await;
    t.session.do_send(FromClient::Refused(ProtocolError::RateLimited("3 dropped".into())));
    assert_eq!(t.text().await, "error rate_limited");
    t.client("bad");
    assert_eq!(t.text().await, "error invalid_payload");
    t.session.do_send(FromClient::Ended(CloseReason::HeartbeatTimeout));
    // No session.closed and no close: the edge has the connection, and it is gone.
    t.expect("Leave").await;
    t.expect("Detach").await;
    t.ended("Closed { received: 0, dropped: 0, answered: 0 }").await;
}

#[actix::test]
async fn an_unparseable_frame_closes_with_its_violation() {
    let mut t = start(Options::default());
    t.expect("Join { front: false }").await;
    t.client("{not a word");
    t.expect(&format!("{:?}", Seen::Close(CloseReason::ProtocolViolation(Violation::InvalidJson)))).await;
}

#[actix::test]
async fn a_shutdown_lets_the_step_in_flight_finish_then_ends_the_session() {
    let mut t = start(Options::default());
    let events = t.active().await;
    t.session.do_send(Shutdown { grace: Duration::from_secs(30) });
    t.expect("Drain").await;
    events.do_send(BackendEvent::Drained);
    assert_eq!(t.text().await, "closed server_shutdown");
    t.expect("Close(ServerShutdown)").await;
}

#[actix::test]
async fn a_backend_error_on_a_step_is_told_and_the_session_goes_on() {
    let mut t = start(Options::default());
    let events = t.active().await;
    t.client("chunk");
    t.expect("Chunk { seq: 1, force_listen: false }").await;
    let failed = Err(BackendError::Inference("out of memory".into()));
    events.do_send(BackendEvent::Step { seq: 1, result: failed, elapsed: Duration::ZERO });
    assert_eq!(t.text().await, "error inference_error");
    t.client("chunk");
    t.expect("Chunk { seq: 2, force_listen: false }").await;
}

fn held() -> Options {
    held_for(Duration::from_secs(30))
}

fn held_for(grace: Duration) -> Options {
    Options { resume: Some(ResumeTerms { grace, replay_bytes: 1 << 20 }), ..Default::default() }
}

fn speak(to: &Recipient<BackendEvent>, seq: u64) {
    let outcome = StepOutcome { kind: StepKind::Speak, audio: vec![0.1; 2400], ..StepOutcome::listen(5) };
    to.do_send(BackendEvent::Step { seq, result: Ok(outcome), elapsed: Duration::ZERO });
}

#[actix::test]
async fn a_lost_connection_is_held_and_a_resume_takes_it_back_with_what_it_missed_and_no_stale_voice() {
    let mut t = start(held());
    let events = t.active().await;
    t.client("chunk");
    t.expect("Chunk { seq: 1, force_listen: false }").await;
    speak(&events, 1);
    assert!(matches!(t.next().await, Seen::Audio(_)));
    assert_eq!(t.text().await, "step input_1 Speak");
    t.session.do_send(FromClient::Lost(CloseReason::ClientGone));
    // Held: the worker stays; what the model says is kept, its voice not sent.
    speak(&events, 2);
    t.step(&events, 3, StepKind::Listen, 6);
    let token = t.registry.tokens().token_of(1).expect("a token");
    assert_eq!(t.registry.tokens().take(&token, Some("another key"), "").err(), Some(ResumeRefusal::OtherKey));
    let taken = t.registry.tokens().take(&token, None, "").expect("its own key");
    assert_eq!(t.registry.tokens().take(&token, None, "").err(), Some(ResumeRefusal::Unknown), "used once");
    let port = taken.hand(Box::new(t.stand.clone().recipient::<ToClient>()), 7, None);
    let resumed = t.text().await;
    assert!(
        resumed.starts_with("Resumed { session_id: Some(")
            && resumed.contains("replayed: 2, lost: 0, voice_skipped_ms: 100"),
        "{resumed}"
    );
    assert!(!resumed.contains(&token), "a new token");
    assert_eq!(t.text().await, "step input_2 Speak", "without its voice");
    assert_eq!(t.text().await, "step input_3 Listen");
    // The old line is no longer heard; the new one is.
    t.client("chunk");
    port.do_send(FromClient::Text("force".to_string().into()));
    t.expect("Chunk { seq: 2, force_listen: true }").await;
    t.session.do_send(FromLine { line: 7, msg: FromClient::Ended(CloseReason::ClientGone), receipt: None });
    t.expect("Leave").await;
    t.expect("Detach").await;
}

#[actix::test]
async fn a_held_session_ends_when_its_grace_passes_and_its_token_with_it() {
    tokio::time::pause();
    // A grace within the test's wait (the paused clock runs to the first timer due).
    let mut t = start(held_for(Duration::from_secs(2)));
    let _events = t.active().await;
    let token = t.registry.tokens().token_of(1).expect("a token");
    t.session.do_send(FromClient::Lost(CloseReason::HeartbeatTimeout));
    // Nothing until the grace passes (the clock is the test's).
    t.expect("Leave").await;
    t.expect("Detach").await;
    t.ended("Closed { received: 0, dropped: 0, answered: 0 }").await;
    assert_eq!(t.registry.tokens().take(&token, None, "").err(), Some(ResumeRefusal::Unknown));
    assert_eq!(t.registry.held(), 0);
}

#[actix::test]
async fn without_a_grace_a_lost_connection_ends_its_session_at_once() {
    let mut t = start(Options::default());
    let _events = t.active().await;
    assert!(t.registry.tokens().token_of(1).is_none(), "no token is issued");
    t.session.do_send(FromClient::Lost(CloseReason::ClientGone));
    t.expect("Leave").await;
    t.expect("Detach").await;
}

#[actix::test]
async fn a_client_back_before_its_loss_was_noticed_closes_its_old_connection() {
    let mut t = start(held());
    let _events = t.active().await;
    let token = t.registry.tokens().token_of(1).expect("a token");
    let taken = t.registry.tokens().take(&token, None, "").unwrap();
    let _port = taken.hand(Box::new(t.stand.clone().recipient::<ToClient>()), 9, Some(1));
    t.expect("Close(Resumed)").await;
    let resumed = t.text().await;
    // It had received `queue_done`, not `created`: that is sent again.
    assert!(resumed.contains("replayed: 1, lost: 0"), "{resumed}");
    assert_eq!(t.text().await, "created");
    // The old connection's loss, noticed now, concerns a line the session left.
    t.session.do_send(FromClient::Lost(CloseReason::HeartbeatTimeout));
    t.client("chunk");
    assert_eq!(t.registry.held(), 0);
}

#[actix::test]
async fn a_token_taken_and_never_handed_goes_back_and_the_hold_still_ends_at_its_grace() {
    tokio::time::pause();
    let mut t = start(held_for(Duration::from_secs(2)));
    let _events = t.active().await;
    let token = t.registry.tokens().token_of(1).expect("a token");
    assert_eq!(
        t.registry.tokens().take(&token, None, "webrtc").err(),
        Some(ResumeRefusal::OtherTransport("")),
        "a session resumes on its own transport"
    );
    t.session.do_send(FromClient::Lost(CloseReason::ClientGone));
    // A caller takes the token past the grace and its connection fails before it hands it.
    let taken = t.registry.tokens().take(&token, None, "").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(t.registry.held(), 1, "held while a caller has its token");
    drop(taken);
    assert_eq!(t.registry.tokens().token_of(1).as_deref(), Some(token.as_str()), "the token is good again");
    // The next look ends it.
    t.expect("Leave").await;
    t.expect("Detach").await;
    t.ended("Closed { received: 0, dropped: 0, answered: 0 }").await;
}
