//! What a SessionActor handles: its client, through the transport's edge ([`FromClient`]);
//! its queue ([`QueueNotice`]); its worker's BackendActor ([`BackendEvent`]); the server
//! stopping ([`Shutdown`]). And what it says to its edge ([`ToClient`]): the one seam a
//! transport (a WebSocket, a WebRTC call, a phone line, a test) implements.
//!
//! The seam is typed: text messages are a dialect's own, but audio crosses it as samples
//! ([`CallerAudio`] in, [`ModelAudio`] out) for an edge that carries audio itself (a WebRTC
//! call's tracks, a raw PCM socket), so that no such edge writes or parses a dialect's JSON
//! to move a voice.

use std::time::Duration;

use actix::prelude::*;
use bytestring::ByteString;

use crate::domain::{BackendInfo, StepOutcome, TurnPiece, TurnSummary};
use crate::edge::backend::BackendError;
use crate::ids::TicketId;
use crate::protocol::{CloseReason, ProtocolError, QueueInfo};
use crate::worker::messages::WorkerLink;

/// What the client's transport hands its session.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub enum FromClient {
    /// One whole text message (the edge put fragments together and applied the rate).
    Text(ByteString),
    /// The caller's voice, from an edge that carries audio itself (its session's dialect
    /// agreed to take it so: [`crate::edge::dialect::Dialect::carry_audio`]).
    Audio(CallerAudio),
    /// The caller pressed a key of a telephone keypad (`0`-`9`, `*`, `#`, `A`-`D`): a phone
    /// line's DTMF, from an edge that carries audio. Never logged (callers type PINs).
    Key(Keypress),
    /// The edge refused something of the client's without ending the connection (messages
    /// over the rate): the client is told with this error.
    Refused(ProtocolError),
    /// The connection ended, or the edge ended it (the client closed it, broke the protocol,
    /// does not read): the session ends for this reason. The client is not told any more.
    Ended(CloseReason),
    /// The connection was lost without a close (it broke, or the client stopped answering
    /// pings): the session is held for a resume when resumption is on
    /// ([`super::resume`]), else it ends for this reason.
    Lost(CloseReason),
}

/// What an edge hands its session, tagged with the edge's line: a session that was resumed
/// on a new connection hears its current line only.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct FromLine {
    /// The line's number (0: the connection the session started on).
    pub line: u64,
    /// What the client sent.
    pub msg: FromClient,
}

/// Where an edge reaches its session: the session's mailbox, and the number of the edge's
/// line to it.
#[derive(Clone)]
pub struct SessionPort {
    to: Recipient<FromLine>,
    line: u64,
}

impl SessionPort {
    /// The port of line `line` into a session's mailbox.
    pub fn new(to: Recipient<FromLine>, line: u64) -> SessionPort {
        SessionPort { to, line }
    }

    /// Hands the session a message, not waiting.
    pub fn do_send(&self, msg: FromClient) {
        self.to.do_send(FromLine { line: self.line, msg });
    }

    /// Hands the session a message; the answer comes once it was handled.
    pub fn send(&self, msg: FromClient) -> actix::dev::RecipientRequest<FromLine> {
        self.to.send(FromLine { line: self.line, msg })
    }

    /// Whether the session is still there.
    pub fn connected(&self) -> bool {
        self.to.connected()
    }
}

/// What a session tells its client's transport.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum ToClient {
    /// One text message for the client.
    Text(ByteString),
    /// The model's voice, for an edge that carries audio itself (the dialect sends it as
    /// samples rather than in its events).
    Audio(ModelAudio),
    /// The session is over: close the connection for this reason (its close code and
    /// description), after what was sent before.
    Close(CloseReason),
}

/// A key of a telephone keypad the caller pressed (RFC 4733 events 0-15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keypress(char);

impl Keypress {
    /// The keys a keypad has, in RFC 4733's order of event codes.
    pub const KEYS: &'static str = "0123456789*#ABCD";

    /// The key `c` (a digit, `*`, `#`, or `A`-`D` in either case); `None` for anything else.
    pub fn new(c: char) -> Option<Keypress> {
        let c = c.to_ascii_uppercase();
        Keypress::KEYS.contains(c).then_some(Keypress(c))
    }

    /// The key of RFC 4733's event code `code` (0-15).
    pub fn of_event(code: u8) -> Option<Keypress> {
        Keypress::KEYS.chars().nth(usize::from(code)).map(Keypress)
    }

    /// The key, as printed on it (`A`-`D` upper case).
    pub fn key(self) -> char {
        self.0
    }
}

/// A piece of the caller's voice: mono samples in -1..1 at `rate` Hz.
#[derive(Debug, Clone, PartialEq)]
pub struct CallerAudio {
    /// The voice, mono, in -1..1.
    pub samples: Vec<f32>,
    /// The sample rate, in Hz; the dialect resamples it to 16 kHz.
    pub rate: u32,
}

impl CallerAudio {
    /// What the piece weighs in memory, as the edge's incoming bound counts it.
    pub fn bytes(&self) -> usize {
        self.samples.len() * std::mem::size_of::<f32>()
    }
}

/// The model's voice, response by response, for an edge that plays it.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelAudio {
    /// A piece of response `response`'s voice: mono samples in -1..1 at `rate` Hz.
    Delta {
        /// The response's id, as the dialect named it.
        response: String,
        /// The voice, mono, in -1..1.
        samples: Vec<f32>,
        /// The sample rate, in Hz.
        rate: u32,
    },
    /// Response `response` has no more voice (complete, cut short, or had none).
    Done {
        /// The response's id, as the dialect named it.
        response: String,
    },
    /// Stop playing at once and drop what is queued: the user spoke over the answer, or the
    /// client cancelled it.
    Clear,
}

/// Where a session speaks to its client: its edge's mailbox (an edge actor's recipient), or a
/// line the edge's transport drains without a hop through the edge (a WebSocket's: the
/// session's frames go straight into the connection's outgoing stream).
pub trait ClientLine: Send {
    /// Hands the client's side a message, in order with the ones before it.
    fn tell(&self, msg: ToClient);
}

impl ClientLine for Recipient<ToClient> {
    fn tell(&self, msg: ToClient) {
        self.do_send(msg);
    }
}

/// What the queue tells a session.
#[derive(Message)]
#[rtype(result = "()")]
pub enum QueueNotice {
    /// It must wait (the first notice).
    Queued(QueueInfo),
    /// Its position or ETA changed.
    Update(QueueInfo),
    /// A worker is reserved for it; it must claim it.
    Assigned {
        /// The session's ticket.
        ticket: TicketId,
        /// The worker reserved for it.
        worker: WorkerLink,
    },
    /// It cannot be served: queue full, or no worker for its mode.
    Rejected(ProtocolError),
    /// An operator cancelled its ticket.
    Cancelled,
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
    /// client (its server's session slot was taken by someone else): the worker is let go and
    /// retried with backoff, and the session waits at the head of the queue for the next one.
    SlotTaken {
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

/// Asks a session to end because the server is stopping: at once when it has no step in
/// flight, else when the step has finished, at the latest after `grace`.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown {
    /// The longest the session waits for its step in flight before it ends anyway.
    pub grace: Duration,
}
