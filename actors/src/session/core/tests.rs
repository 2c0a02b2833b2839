//! The session's core without a runtime: inputs in, what its client hears and its effects out,
//! time as the test's own instants.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{CoreLinks, Effect, SessionCore, ToWorker};
use crate::domain::{BackendInfo, DuplexChunk, Mode, SessionKind, SessionSetup};
use crate::edge::client::{ClientLine, FromClient, FromLine, ToClient};
use crate::edge::dialect::{DecodeError, Dialect, Outbox};
use crate::edge::redact::{Direction, MediaSink, Recorded, RecordedMedia, Redact};
use crate::messages::queue::QueueNotice;
use crate::messages::worker::{BackendEvent, WorkerLink, WorkerPort};
use crate::observe::Subscribers;
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError, QueueInfo};
use crate::session::registry::Registry;
use crate::session::resume::ResumeTerms;
use crate::session::{ClientInfo, SessionSettings};

/// A dialect of words: `init`, `chunk`, `close`; it names what it is told to encode, and after
/// `queue_done` it initialises its session itself when `self_init`; `loop` makes it issue a
/// command on every event it encodes (a dialect gone wrong).
struct Words {
    self_init: bool,
    looping: bool,
}

impl Dialect for Words {
    fn name(&self) -> &'static str {
        "words"
    }

    fn decode(&mut self, text: &bytestring::ByteString, _: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        match &**text {
            "init" => Ok(vec![Inbound::Init(SessionSetup::new(SessionKind::Duplex))]),
            "chunk" => Ok(vec![Inbound::Chunk(DuplexChunk { audio: vec![0.0; 16], ..Default::default() })]),
            "close" => Ok(vec![Inbound::Close { reason: None }]),
            "loop" => {
                self.looping = true;
                Ok(vec![Inbound::Init(SessionSetup::new(SessionKind::Duplex))])
            }
            other => Err(DecodeError::Unparseable(other.to_string())),
        }
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        let word = match event {
            Outbound::Queued(q) => format!("queued {}", q.position),
            Outbound::QueueUpdate(q) => format!("update {}", q.position),
            Outbound::QueueDone => "queue_done".into(),
            Outbound::Created { .. } => "created".into(),
            Outbound::Step { .. } => "step".into(),
            Outbound::Error(e) => format!("error {}", e.code()),
            Outbound::Closed { reason, .. } => format!("closed {}", reason.as_str()),
            _ => "other".into(),
        };
        let queue_done = word == "queue_done";
        out.push(word);
        if queue_done && self.self_init {
            out.commands([Inbound::Init(SessionSetup::new(SessionKind::Duplex))]);
        }
        if self.looping {
            // An init of a session already initialised: refused, told, and issued again.
            out.commands([Inbound::Init(SessionSetup::new(SessionKind::Duplex))]);
        }
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        struct Nothing;
        impl Redact for Nothing {
            fn redact(
                &self,
                _: Direction,
                _: &[u8],
                _: RecordedMedia,
                _: &mut dyn MediaSink,
            ) -> std::io::Result<Recorded> {
                Ok(Recorded::Raw(String::new()))
            }
        }
        Arc::new(Nothing)
    }
}

/// A client's line that keeps what it is told.
#[derive(Clone, Default)]
struct Heard(Arc<Mutex<Vec<String>>>);

impl ClientLine for Heard {
    fn tell(&self, msg: ToClient) {
        self.0.lock().push(match msg {
            ToClient::Text(t) => t.to_string(),
            ToClient::Close(r) => format!("CLOSE {}", r.as_str()),
            ToClient::Notice(n) => format!("NOTICE {n:?}"),
            ToClient::Audio(_) => "AUDIO".into(),
        });
    }
}

impl Heard {
    /// What was told since the last look, notices left out.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock()).into_iter().filter(|t| !t.starts_with("NOTICE")).collect()
    }
}

const LIMIT: Duration = Duration::from_secs(60);

fn core(words: Words, resume: ResumeTerms, t0: Instant) -> (SessionCore, Heard) {
    let heard = Heard::default();
    let settings = SessionSettings {
        mode: Mode::Audio,
        time_limit: LIMIT,
        context_tokens: 1000,
        max_turns: 4,
        reject: None,
        resume,
    };
    let mut links = core_links(&heard, t0);
    // Where a resumed connection reaches it, when it may be resumed.
    links.resumable = resume.on().then(resumable);
    let mut core = SessionCore::new(settings, Box::new(words), links, t0);
    core.start(t0);
    (core, heard)
}

/// The effects waiting, by name.
fn effects(core: &mut SessionCore) -> Vec<String> {
    std::iter::from_fn(|| core.poll_effect())
        .map(|e| match e {
            Effect::Worker(ToWorker::Chunk(seq, _)) => format!("Chunk {seq}"),
            Effect::Worker(ToWorker::Prepare(_)) => "Prepare".into(),
            Effect::Worker(ToWorker::Detach(_)) => "Detach".into(),
            Effect::Worker(w) => format!("{w:?}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// A worker whose recipients go nowhere: the core only keeps it and names it.
fn worker() -> WorkerLink {
    struct Nowhere;
    impl actix::Actor for Nowhere {
        type Context = actix::Context<Self>;
    }
    macro_rules! nowhere {
        ($($m:ty),*) => {$(impl actix::Handler<$m> for Nowhere { type Result = (); fn handle(&mut self, _: $m, _: &mut Self::Context) {} })*};
    }
    use crate::messages::worker::{
        Attach, Control, Detach, Drain, Interrupt, Prepare, Reconfigure, Run, Stop, SubmitChunk, SubmitTurn,
    };
    nowhere!(Attach, Prepare, SubmitChunk, SubmitTurn, Detach, Reconfigure, Interrupt, Drain, Run, Control);
    impl actix::Handler<Stop> for Nowhere {
        type Result = bool;
        fn handle(&mut self, _: Stop, _: &mut Self::Context) -> bool {
            true
        }
    }
    // An address of an actor never started: its mailbox takes what is sent and nothing runs.
    let (tx, _rx) = actix::dev::channel::channel::<Nowhere>(16);
    let addr = actix::Addr::new(tx);
    WorkerLink {
        id: 0,
        name: "w".into(),
        port: Arc::new(WorkerPort::of(&addr).0),
        info: Arc::new(BackendInfo::default()),
    }
}

/// Where a resumed connection would reach the session: an actor never started.
fn resumable() -> crate::session::resume::Resumable {
    struct Nowhere;
    impl actix::Actor for Nowhere {
        type Context = actix::Context<Self>;
    }
    impl actix::Handler<crate::session::resume::Resume> for Nowhere {
        type Result = ();
        fn handle(&mut self, _: crate::session::resume::Resume, _: &mut Self::Context) {}
    }
    impl actix::Handler<FromLine> for Nowhere {
        type Result = ();
        fn handle(&mut self, _: FromLine, _: &mut Self::Context) {}
    }
    let (tx, _rx) = actix::dev::channel::channel::<Nowhere>(16);
    let addr = actix::Addr::new(tx);
    crate::session::resume::Resumable { resume: addr.clone().recipient(), port: addr.recipient() }
}

fn say(core: &mut SessionCore, text: &str) {
    core.client(0, FromClient::Text(text.to_string().into()));
}

fn info(position: usize) -> QueueInfo {
    QueueInfo { ticket: 1, position, estimated_wait_s: 1.0, queue_length: 2, measured: true }
}

/// Queued, assigned, attached, initialised and prepared: the session is live.
fn live(core: &mut SessionCore, heard: &Heard) {
    assert_eq!(effects(core), ["Join { front: false }"]);
    core.queue(QueueNotice::Queued(info(2)));
    core.queue(QueueNotice::Assigned { ticket: 1, worker: worker() });
    assert_eq!(effects(core), ["Claim", "Attach"]);
    core.backend(BackendEvent::Attached(Ok(())));
    say(core, "init");
    assert_eq!(effects(core), ["Prepare"]);
    core.backend(BackendEvent::Prepared { prompt_length: 1, backend: Box::default() });
    assert_eq!(heard.take(), ["queued 2", "queue_done", "created"]);
}

#[test]
fn a_session_goes_from_its_queue_to_its_worker_as_data() {
    let t0 = Instant::now();
    let (mut core, heard) = core(Words { self_init: false, looping: false }, ResumeTerms::OFF, t0);
    live(&mut core, &heard);
    say(&mut core, "chunk");
    say(&mut core, "chunk");
    assert_eq!(effects(&mut core), ["Chunk 1", "Chunk 2"], "numbered in order");
    say(&mut core, "close");
    assert_eq!(heard.take(), ["closed user_stop", "CLOSE user_stop"]);
    assert_eq!(effects(&mut core), ["Leave", "Detach", "Stop"], "released once, then stopped");
    assert!(core.is_over() && core.deadline().is_none());
    core.stopped();
    assert!(effects(&mut core).is_empty(), "nothing is released twice");
}

#[test]
fn the_time_limit_is_a_deadline_and_passes_as_data() {
    let t0 = Instant::now();
    let (mut core, heard) = core(Words { self_init: false, looping: false }, ResumeTerms::OFF, t0);
    assert_eq!(effects(&mut core), ["Join { front: false }"]);
    assert_eq!(core.deadline(), Some(t0 + LIMIT), "the time limit counts from the upgrade");
    core.timeout(t0 + LIMIT - Duration::from_millis(1));
    assert!(!core.is_over(), "not before its time");
    core.timeout(t0 + LIMIT);
    assert_eq!(heard.take(), ["closed timeout", "CLOSE timeout"]);
    assert_eq!(effects(&mut core), ["Leave", "Stop"]);
}

#[test]
fn the_commands_a_dialect_issues_are_carried_out_in_the_one_queue_after_its_words() {
    let t0 = Instant::now();
    let (mut core, heard) = core(Words { self_init: true, looping: false }, ResumeTerms::OFF, t0);
    assert_eq!(effects(&mut core), ["Join { front: false }"]);
    core.queue(QueueNotice::Assigned { ticket: 1, worker: worker() });
    effects(&mut core);
    // The worker is taken: the dialect says queue_done and initialises its session itself,
    // with no word of the client's.
    core.backend(BackendEvent::Attached(Ok(())));
    assert_eq!(heard.take(), ["queue_done"]);
    assert_eq!(effects(&mut core), ["Prepare"]);
}

#[test]
fn a_dialect_that_issues_commands_without_end_is_closed_not_followed() {
    let t0 = Instant::now();
    let (mut core, heard) = core(Words { self_init: false, looping: false }, ResumeTerms::OFF, t0);
    live(&mut core, &heard);
    // Every command's event makes it issue another: the work stops at its bound.
    say(&mut core, "loop");
    let told = heard.take();
    assert_eq!(told.last().map(String::as_str), Some("CLOSE internal_error"), "{told:?}");
    let out = effects(&mut core);
    assert!(out.len() <= super::MAX_WORK + 3 && out.ends_with(&["Leave".into(), "Detach".into(), "Stop".into()]));
}

#[test]
fn a_lost_connection_is_held_for_its_grace_and_ends_untold_when_it_passes() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(30);
    let (mut core, heard) =
        core(Words { self_init: false, looping: false }, ResumeTerms { grace, replay_bytes: 1 << 16 }, t0);
    live(&mut core, &heard);
    let lost = Instant::now();
    core.client(0, FromClient::Lost(CloseReason::ClientGone));
    assert!(!core.is_over(), "held");
    let deadline = core.deadline().unwrap();
    assert!(deadline >= lost + grace && deadline <= Instant::now() + grace, "the grace is the next deadline");
    // What it says while away is kept, not sent.
    core.backend(BackendEvent::Step {
        seq: 1,
        result: Ok(crate::domain::StepOutcome::listen(1)),
        elapsed: Duration::ZERO,
    });
    assert!(heard.take().is_empty());
    core.timeout(deadline);
    assert!(core.is_over());
    assert!(heard.take().is_empty(), "its client is gone: nothing more is said");
    assert_eq!(effects(&mut core), ["Leave", "Detach", "Stop"]);
}

#[test]
fn a_shutdown_drains_the_step_in_flight_within_its_grace() {
    let t0 = Instant::now();
    let (mut core, heard) = core(Words { self_init: false, looping: false }, ResumeTerms::OFF, t0);
    live(&mut core, &heard);
    let now = Instant::now();
    core.shutdown(Duration::from_secs(5), now);
    assert_eq!(effects(&mut core), ["Drain"]);
    assert_eq!(core.deadline(), Some(now + Duration::from_secs(5)), "the drain's grace, before the time limit");
    core.backend(BackendEvent::Drained);
    assert_eq!(heard.take(), ["closed server_shutdown", "CLOSE server_shutdown"]);
    assert_eq!(effects(&mut core), ["Leave", "Detach", "Stop"]);
    // A session refused by its settings is told and ended at its start.
    let (mut refused, heard) = {
        let heard = Heard::default();
        let mut links = core_links(&heard, Instant::now());
        links.conn = 8;
        let settings = SessionSettings {
            mode: Mode::Audio,
            time_limit: LIMIT,
            context_tokens: 1000,
            max_turns: 4,
            reject: Some(ProtocolError::ModelNotFound("no such model".into())),
            resume: ResumeTerms::OFF,
        };
        (SessionCore::new(settings, Box::new(Words { self_init: false, looping: false }), links, t0), heard)
    };
    refused.start(t0);
    assert_eq!(heard.take(), ["error model_not_found", "CLOSE model_not_found"]);
    assert_eq!(effects(&mut refused), ["Leave", "Stop"], "never joined");
}

/// The links of a core on connection 7, upgraded at `upgraded`.
fn core_links(heard: &Heard, upgraded: Instant) -> CoreLinks {
    CoreLinks {
        line: Box::new(heard.clone()),
        conn: 7,
        registry: Registry::new(),
        admission: None,
        sinks: Subscribers::new(Vec::new()).session(&crate::observe::SessionInfo {
            conn: 7,
            mode: Mode::Audio,
            client_addr: "test".into(),
            user_agent: None,
            key_id: None,
            upgraded,
            upgraded_at: std::time::SystemTime::now(),
        }),
        client: ClientInfo::default(),
        transcribes: false,
        decides: false,
        resumable: None,
    }
}
