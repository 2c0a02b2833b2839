//! The edge between the actors and an inference backend.
//!
//! A [`Backend`] mirrors the C ABI (`include/omni_backend.h`): it is used from the one
//! thread that opened it (it need not be `Send`), while its [`BackendControl`] is the
//! any-thread half (interrupt, force-listen, KV length), reachable while a step runs.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::domain::{BackendInfo, DuplexChunk, SessionSetup, StepOutcome, StepPiece, TurnInput, TurnPiece};

/// A failure reported by a backend. `code()` names it in logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum BackendError {
    /// A missing, empty or malformed argument, such as a setting the backend refuses
    /// (`OMNI_ERR_INVALID_ARGUMENT`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call the backend's current state does not allow (`OMNI_ERR_BAD_STATE`).
    #[error("call not allowed in this state: {0}")]
    BadState(String),
    /// The model failed on this input; the session may go on (`OMNI_ERR_INFERENCE`).
    #[error("inference failed: {0}")]
    Inference(String),
    /// The KV cache reached the context size; the session ends (`OMNI_ERR_CONTEXT_FULL`).
    #[error("context full: {0}")]
    ContextFull(String),
    /// The call was cut short by an interrupt (`OMNI_ERR_INTERRUPTED`).
    #[error("interrupted")]
    Interrupted,
    /// The backend lacks the capability asked for (`OMNI_ERR_UNSUPPORTED`).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The backend could not be opened (`OMNI_ERR_OPEN_FAILED`).
    #[error("cannot open backend: {0}")]
    Open(String),
    /// Any other failure (`OMNI_ERR_INTERNAL`, or an unknown status).
    #[error("backend failure: {0}")]
    Internal(String),
    /// The backend's process died; the text says whose and how.
    #[error("{0}")]
    Crashed(String),
    /// The backend cannot be reached for now (a node or a remote worker that is down or
    /// busy): its worker keeps trying, and waiting clients keep waiting for it.
    #[error("{0}")]
    Unavailable(String),
}

impl BackendError {
    /// The error's name in logs and metrics (`invalid_argument`, `context_full`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            BackendError::InvalidArgument(_) => "invalid_argument",
            BackendError::BadState(_) => "bad_state",
            BackendError::Inference(_) => "inference_error",
            BackendError::ContextFull(_) => "context_full",
            BackendError::Interrupted => "interrupted",
            BackendError::Unsupported(_) => "unsupported",
            BackendError::Open(_) => "open_failed",
            BackendError::Internal(_) => "internal",
            BackendError::Crashed(_) => "crashed",
            BackendError::Unavailable(_) => "unavailable",
        }
    }

    /// Whether the session can go on after this error (the next input is processed).
    pub fn is_recoverable(&self) -> bool {
        matches!(self, BackendError::Inference(_) | BackendError::Interrupted)
    }
}

/// The owner-thread half of a backend instance.
pub trait Backend {
    /// What the backend can do, as it reported when it opened.
    fn info(&self) -> &BackendInfo;
    /// Starts a session (duplex or turn-mode) with `setup`.
    fn prepare(&mut self, setup: &SessionSetup) -> Result<(), BackendError>;
    /// Ends the session and forgets everything it held.
    fn reset(&mut self) -> Result<(), BackendError>;
    /// The session is over: make the backend ready for the next one (a reset). A backend lent
    /// for one session only (a node's worker granted by a cluster's store) gives itself back
    /// instead: its owner resets it and offers it to the next client at once.
    fn release(&mut self) -> Result<(), BackendError> {
        self.reset()
    }
    /// The first call of a duplex step: prefills one input chunk.
    fn duplex_prefill(&mut self, chunk: &DuplexChunk) -> Result<(), BackendError>;
    /// The step's first output.
    fn duplex_generate(&mut self) -> Result<StepPiece, BackendError>;
    /// The next output of the same step, `None` when the step has no more.
    fn duplex_drain(&mut self) -> Result<Option<StepPiece>, BackendError>;
    /// Ends the step, after its last output.
    fn duplex_finalize(&mut self) -> Result<(), BackendError>;
    /// Prefills a conversation to answer; abandons the rest of an answer not yet done.
    fn turn_prefill(&mut self, input: &TurnInput) -> Result<(), BackendError>;
    /// The next piece of the answer; the last has `done` set.
    fn turn_generate(&mut self) -> Result<TurnPiece, BackendError>;
    /// One whole duplex step (see [`run_duplex_step`]). A backend in another process
    /// overrides it to make the step one round trip.
    fn duplex_step(&mut self, chunk: &DuplexChunk) -> Result<StepOutcome, BackendError> {
        run_duplex_step(self, chunk)
    }
    /// Checks, while no session runs, that the backend can still serve one (a remote worker
    /// asks its own health). Run by the BackendActor as a job on the backend's thread, every
    /// [`BackendControl::idle_check_every`]; an error fails the worker, which the pool then
    /// reopens. The default has nothing to check.
    fn check_idle(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    /// The any-thread half, shared with whoever needs to interrupt this backend.
    fn control(&self) -> Arc<dyn BackendControl>;
}

/// The any-thread half of a backend instance. Calls return promptly, even mid-step.
pub trait BackendControl: Send + Sync {
    /// Cuts the step or piece in flight short.
    fn interrupt(&self);
    /// Ends the current speech; the next duplex step listens.
    fn set_force_listen(&self, on: bool);
    /// The backend's KV cache length now, in tokens.
    fn kv_length(&self) -> u64;
    /// Ends the backend at once, whatever it is doing (a backend in a child process kills
    /// it). Called when the worker fails; the default does nothing (a thread cannot be killed).
    fn terminate(&self) {}
    /// Resolves with a reason if the backend dies on its own (its process exited) while
    /// nothing is calling it. Taken once, by the BackendActor; the default never dies.
    fn take_death_notice(&self) -> Option<tokio::sync::oneshot::Receiver<String>> {
        None
    }
    /// How often [`Backend::check_idle`] is worth running while no session has the worker;
    /// `None` (the default): never.
    fn idle_check_every(&self) -> Option<Duration> {
        None
    }
    /// The session ended with nothing in flight. A backend lent for one session only gives
    /// itself back now, from the caller's thread (without waiting for its owner thread's
    /// [`Backend::release`], which then has nothing left to do); the default does nothing.
    fn release_now(&self) {}
    /// The process hosting the backend, when it is not the gateway's own.
    fn process_id(&self) -> Option<u32> {
        None
    }
    /// Whether `interrupt`, `set_force_listen` and `terminate` only set a flag or queue a
    /// message, whatever the backend is doing (a remote worker's). They are then made from the
    /// actor's thread; by default they get a thread of their own, which a backend whose
    /// interrupt blocks stalls alone (`worker::thread::ControlThread`).
    fn never_blocks(&self) -> bool {
        false
    }
}

/// Runs one whole duplex step: prefill, generate, drain until empty, finalize.
/// The outputs of the step are merged in order.
pub fn run_duplex_step<B: Backend + ?Sized>(backend: &mut B, chunk: &DuplexChunk) -> Result<StepOutcome, BackendError> {
    backend.duplex_prefill(chunk)?;
    let mut outcome = StepOutcome::from_first(backend.duplex_generate()?);
    while let Some(piece) = backend.duplex_drain()? {
        outcome.absorb(piece);
    }
    backend.duplex_finalize()?;
    Ok(outcome)
}

type OpenFn = dyn Fn() -> Result<Box<dyn Backend>, BackendError> + Send + Sync;

/// Opens a backend instance. Called on the thread that becomes its owner: a thread of the
/// worker's own, or its BackendActor's arbiter for a backend whose calls are all quick.
#[derive(Clone)]
pub struct BackendFactory {
    open: Arc<OpenFn>,
    quick: bool,
}

impl BackendFactory {
    /// A factory that opens a backend with `open`, on a thread of its own.
    pub fn new(open: impl Fn() -> Result<Box<dyn Backend>, BackendError> + Send + Sync + 'static) -> BackendFactory {
        BackendFactory { open: Arc::new(open), quick: false }
    }

    /// Every owner-thread call of this backend returns within microseconds and never waits (no
    /// model compute, no sleep, no I/O; the built-in reference backend when nothing paces it), and
    /// its any-thread calls return at once: its BackendActor opens it and runs its calls itself
    /// (`WorkerThread::here`), with no thread of its own.
    pub fn quick(self) -> BackendFactory {
        BackendFactory { quick: true, ..self }
    }

    /// Opened on a thread of its own however quick it is.
    pub fn threaded(self) -> BackendFactory {
        BackendFactory { quick: false, ..self }
    }

    /// Whether its BackendActor opens it and makes its calls itself ([`BackendFactory::quick`]).
    pub fn is_quick(&self) -> bool {
        self.quick
    }

    /// Opens an instance on the calling thread, which becomes its owner.
    pub fn open(&self) -> Result<Box<dyn Backend>, BackendError> {
        (self.open)()
    }
}

/// A backend opened before its thread started, on the caller's thread: a node's worker whose
/// grant came on a link already attached has nothing to wait for. Its thread owns it from then on.
pub type OpenBackend = Box<dyn Backend + Send>;

/// How a BackendActor gets its backend: opened on its thread by a factory, or open already.
pub enum Opener {
    /// Open the backend with this factory: on the worker's thread, or on the actor's own for a
    /// quick one.
    Factory(BackendFactory),
    /// The backend, open already; the worker's thread takes it over.
    Open(OpenBackend),
}

impl From<BackendFactory> for Opener {
    fn from(factory: BackendFactory) -> Opener {
        Opener::Factory(factory)
    }
}
