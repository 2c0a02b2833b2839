//! What a BackendActor handles: a session's messages (attach, prepare, chunks, turns,
//! interrupt, reconfigure, drain, detach), the pool's `Stop`, and `Run` (owner-thread calls) and
//! `Control` (any-thread calls) from an edge that drives the backend itself (a node's link).
//! [`WorkerPort`] is how the others address it.

use std::time::{Duration, Instant};

use actix::prelude::*;

use std::sync::Arc;

use crate::domain::{BackendInfo, DuplexChunk, Mode, SessionSetup, StepOutcome, TurnInput, TurnPiece, TurnSummary};
use crate::edge::backend::{Backend, BackendError};
use crate::ids::WorkerId;
use crate::protocol::ProtocolError;

/// What a session hears when one of its messages to a worker is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// An attach: the worker is gone before the session took it.
    Attach,
    /// Work the session waits on: the worker is gone.
    Work,
    /// A drain: there is nothing left to wait for.
    Drain,
}

/// Sent with every message a session waits on. Handled, it is disarmed; dropped unhandled
/// (the worker's actor is gone and its mailbox dropped the message), it tells the session.
pub struct Delivery {
    to: Option<Recipient<BackendEvent>>,
    lost: Lost,
}

impl Delivery {
    /// Armed: if the message is dropped unhandled, `to` hears what `lost` says.
    pub fn new(to: Recipient<BackendEvent>, lost: Lost) -> Delivery {
        Delivery { to: Some(to), lost }
    }

    /// The message reached the worker: nothing to say on drop.
    pub fn handled(mut self) -> Recipient<BackendEvent> {
        self.to.take().expect("a delivery is handled once")
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        let Some(to) = self.to.take() else { return };
        to.do_send(match self.lost {
            Lost::Attach => BackendEvent::Attached(Err(ProtocolError::WorkerConnectFailed(
                "the worker stopped before the session could take it".into(),
            ))),
            Lost::Work => BackendEvent::Failed { reason: "the worker stopped".into() },
            Lost::Drain => BackendEvent::Drained,
        });
    }
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
    /// The session's mode, which the pool shows and times the session by.
    pub mode: Mode,
    /// Where the answer and the session's backend events go.
    pub reply: Delivery,
}

/// Starts the session on the backend; answered with `Prepared` or `PrepareFailed`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Prepare {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
    /// What the backend starts the session with.
    pub setup: SessionSetup,
    /// Where the session hears if the message is lost.
    pub reply: Delivery,
}

/// One duplex chunk, numbered by the session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubmitChunk {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
    /// The chunk's number in the session (`input_N`); its results and drop notices carry it.
    pub seq: u64,
    /// The audio and frames to step on.
    pub chunk: DuplexChunk,
}

/// One turn-mode request, numbered by the session; answered in order.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubmitTurn {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
    /// The request's number in the session (`input_N`); its answer's pieces carry it.
    pub seq: u64,
    /// The conversation to answer.
    pub input: TurnInput,
    /// Where the session hears if the message is lost.
    pub reply: Delivery,
}

/// The session is over: the backend is reset, then the worker is offered again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Detach {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
    /// When the session ended (the hand-over to the next session is timed from here).
    pub ended: Instant,
}

/// Starts the session over with new settings: the backlog is dropped, the job in flight
/// cut short, the backend reset and prepared again; answered with `Prepared` or
/// `PrepareFailed`. The worker stays with the session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
    /// The settings the backend is prepared with again.
    pub setup: SessionSetup,
    /// Where the session hears if the message is lost.
    pub reply: Delivery,
}

/// Cuts the current output short: the backend is force-listened and the step or answer
/// in flight interrupted; answers still queued end as interrupted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Interrupt {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
}

/// The session is ending (server shutdown): drop its backlog, finish the job in flight,
/// then tell it with `BackendEvent::Drained`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain {
    /// The attached session's key; a message with any other is ignored.
    pub key: u64,
    /// Where the session hears `Drained`, also if the message is lost.
    pub reply: Delivery,
}

/// The server is stopping (or a worker lent for one session is given back): the thread
/// finishes, closes the backend and exits. Answers whether that happened within `within`.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Stop {
    /// How long the backend has to close before the answer is `false`.
    pub within: Duration,
}

/// An owner-thread call made by an edge that drives the backend itself rather than through a
/// session (a node's link to a gateway, which sends the backend's own calls). It runs as one
/// job, in order with the rest and under the step watchdog; `call` sends its own answer, and
/// returns an error only when the backend is broken for good (its process died): the worker
/// then fails. Only the attached key may run calls.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Run {
    /// The attached key; a call from any other is ignored.
    pub key: u64,
    /// The call to make on the owner thread.
    pub call: RunCall,
}

/// An owner-thread call of [`Run`].
pub type RunCall = Box<dyn FnOnce(&mut dyn Backend) -> Result<(), BackendError> + Send>;

/// An any-thread call from the same kind of edge, made at once (mid-call) on the backend's
/// control: it never waits behind the job in flight.
#[derive(Message, Debug, Clone, Copy, PartialEq, Eq)]
#[rtype(result = "()")]
pub enum Control {
    /// Cut the call in flight short (the backend's `interrupt`).
    Interrupt {
        /// The attached key; a call from any other is ignored.
        key: u64,
    },
    /// Set or clear the backend's force-listen (its `set_force_listen`).
    ForceListen {
        /// The attached key; a call from any other is ignored.
        key: u64,
        /// `true`: the current speech ends and the next duplex step listens; `false` clears it.
        on: bool,
    },
    /// End the backend at once (a gateway's step watchdog gave up on it): the worker fails
    /// and its pool restarts it.
    Terminate {
        /// The attached key; a call from any other is ignored.
        key: u64,
    },
}

/// Where a session reaches its worker's BackendActor.
#[derive(Clone)]
pub struct SessionCalls {
    /// Takes the worker for a session ([`Attach`]).
    pub attach: Recipient<Attach>,
    /// Starts the session on the backend ([`Prepare`]).
    pub prepare: Recipient<Prepare>,
    /// One duplex chunk ([`SubmitChunk`]).
    pub chunk: Recipient<SubmitChunk>,
    /// One turn-mode request ([`SubmitTurn`]).
    pub turn: Recipient<SubmitTurn>,
    /// The session is over ([`Detach`]).
    pub detach: Recipient<Detach>,
    /// New settings for the session ([`Reconfigure`]).
    pub reconfigure: Recipient<Reconfigure>,
    /// Cuts the current output short ([`Interrupt`]).
    pub interrupt: Recipient<Interrupt>,
    /// The session is ending with the server ([`Drain`]).
    pub drain: Recipient<Drain>,
}

/// Where an edge that drives the backend itself (a node's link to a gateway) reaches a
/// worker's BackendActor: it attaches and detaches as a session does, and runs the backend's
/// own calls.
#[derive(Clone)]
pub struct LinkCalls {
    /// Takes the worker for the link ([`Attach`]).
    pub attach: Recipient<Attach>,
    /// The link is done with the worker ([`Detach`]).
    pub detach: Recipient<Detach>,
    /// An owner-thread call of the backend ([`Run`]).
    pub run: Recipient<Run>,
    /// An any-thread call of the backend ([`Control`]).
    pub control: Recipient<Control>,
}

/// A worker's BackendActor, as the pool hands it on: a session's side and a node link's side.
#[derive(Clone)]
pub struct WorkerPort {
    /// The messages of a session.
    pub session: SessionCalls,
    /// The messages of an edge that drives the backend itself.
    pub link: LinkCalls,
}

impl WorkerPort {
    /// The ports of a BackendActor (or a stand-in's, in tests), and where it is stopped.
    pub fn of<A>(addr: &Addr<A>) -> (WorkerPort, Recipient<Stop>)
    where
        A: Actor<Context = Context<A>>
            + Handler<Attach>
            + Handler<Prepare>
            + Handler<SubmitChunk>
            + Handler<SubmitTurn>
            + Handler<Detach>
            + Handler<Reconfigure>
            + Handler<Interrupt>
            + Handler<Drain>
            + Handler<Stop>
            + Handler<Run>
            + Handler<Control>,
    {
        let session = SessionCalls {
            attach: addr.clone().recipient(),
            prepare: addr.clone().recipient(),
            chunk: addr.clone().recipient(),
            turn: addr.clone().recipient(),
            detach: addr.clone().recipient(),
            reconfigure: addr.clone().recipient(),
            interrupt: addr.clone().recipient(),
            drain: addr.clone().recipient(),
        };
        let link = LinkCalls {
            attach: addr.clone().recipient(),
            detach: addr.clone().recipient(),
            run: addr.clone().recipient(),
            control: addr.clone().recipient(),
        };
        (WorkerPort { session, link }, addr.clone().recipient())
    }
}

/// A worker as handed to a session: its id in the pool, its name, its BackendActor, and what
/// its backend can do.
#[derive(Clone)]
pub struct WorkerLink {
    /// The worker's id in the pool.
    pub id: WorkerId,
    /// The worker's name, as configured; `NODE/WORKER` for a node's worker.
    pub name: String,
    /// Shared: a session reaches its worker through it on every chunk, and a clone of the
    /// recipients themselves would allocate each time.
    pub port: Arc<WorkerPort>,
    /// What its backend can do, as it reported when it opened.
    pub info: Arc<BackendInfo>,
}

/// What the worker's BackendActor tells its session.
#[derive(Message)]
#[rtype(result = "()")]
pub enum BackendEvent {
    /// The backend is prepared with the session's setup (after `Prepare`, or after `Reconfigure`).
    Prepared {
        /// The backend's KV cache length after the system prompt, in tokens.
        prompt_length: u64,
        /// What the backend can do, for the client (transcripts, settings applied).
        backend: Box<BackendInfo>,
    },
    /// The backend refused the setup (or cannot run its kind of session): why.
    PrepareFailed(BackendError),
    /// The worker could not take the session's first setup for now, through no fault of the
    /// client: its backend had no room for it (it answered its prepare
    /// [`BackendError::Unavailable`]: a model server's session slots all taken, a node busy). The
    /// worker is let go and retried with backoff, and the session waits at the head of the queue
    /// for the next one. A backend with a capacity rule of its own says so this way, and nothing
    /// of the actors changes for it.
    NoRoom {
        /// Why, for the log (the server and its words).
        reason: String,
    },
    /// The step that answered chunk `seq`.
    Step {
        /// The chunk's number in the session (`input_N`).
        seq: u64,
        /// The step's merged output, or why it failed.
        result: Result<StepOutcome, BackendError>,
        /// Time the step took on the backend's thread.
        elapsed: Duration,
    },
    /// Chunk `seq` was dropped unprocessed (the client ran ahead).
    Dropped {
        /// The chunk's number in the session (`input_N`).
        seq: u64,
    },
    /// One piece of the answer to turn-mode request `seq`.
    TurnPiece {
        /// The request's number in the session (`input_N`).
        seq: u64,
        /// The piece.
        piece: TurnPiece,
    },
    /// The answer to turn-mode request `seq` is over: its totals, or why it ended early
    /// (`Interrupted` for one cut short).
    TurnDone {
        /// The request's number in the session (`input_N`).
        seq: u64,
        /// The answer's totals, or why it failed.
        result: Result<TurnSummary, BackendError>,
    },
    /// The worker failed for good (hang past the step timeout, crash).
    Failed {
        /// Why, for the logs.
        reason: String,
    },
    /// After `Drain`: the job in flight is done, nothing is pending.
    Drained,
    /// The answer to `Attach`: the worker is this session's, or why not.
    Attached(Result<(), ProtocolError>),
}
