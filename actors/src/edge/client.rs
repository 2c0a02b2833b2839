//! The seam between a transport's edge and its session: what the edge hands the session
//! ([`FromClient`], on the edge's line: [`FromLine`], through its [`SessionPort`]) and what the
//! session tells the edge ([`ToClient`], on its [`ClientLine`]). A transport (a WebSocket, a
//! WebRTC call, a phone line, a test) implements this one seam.
//!
//! The seam is typed: text messages are a dialect's own, and nothing else is. Audio crosses it
//! as samples ([`CallerAudio`] in, [`ModelAudio`] out), a phone's keys as keys ([`Keypress`]),
//! what the caller heard as [`Playback`], a call's settings as [`CallSettings`], and what became
//! of the session as [`Notice`]s (queued, created, an error, and [`ToClient::Close`]): so that an
//! edge that carries a call itself (a WebRTC call's tracks, a phone line, a raw PCM socket)
//! never writes, sniffs or parses a dialect's JSON, and one with no use for the dialect's
//! events (a phone line with no app on it) is sent none ([`ClientLine::wants_text`]).

use actix::prelude::*;
use bytestring::ByteString;

use crate::domain::Tools;
use crate::protocol::{CloseReason, ProtocolError, QueueInfo};

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
    /// A call's settings, from an edge whose caller speaks no dialect (a phone route's, a
    /// telephony stream's parameters): the session's dialect applies them as its client's own.
    Configure(CallSettings),
    /// What the caller heard of the model's voice, from an edge that plays it (a call's
    /// pacer): the dialect tells its client, where its events say so.
    Playback(Playback),
    /// The edge refused something of the client's without ending the connection (messages
    /// over the rate, an event dropped while the session is behind): the client is told with
    /// this error.
    Refused(ProtocolError),
    /// The connection ended, or the edge ended it (the client closed it, broke the protocol,
    /// does not read): the session ends for this reason. The client is not told any more.
    Ended(CloseReason),
    /// The connection was lost without a close (it broke, or the client stopped answering
    /// pings): the session is held for a resume when resumption is on
    /// ([`crate::session`]'s resume), else it ends for this reason.
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
    /// Says the message was handled when it is dropped (see [`Receipt`]), for an edge that
    /// counts what its session has not handled yet.
    pub receipt: Option<Receipt>,
}

/// What counts the messages an edge handed its session and the session has not handled yet.
pub trait Handled: Send + Sync {
    /// A message of `bytes` was handled (or dropped unhandled, its session gone).
    fn handled(&self, bytes: usize);
}

/// Travels with a message to the session and says it was handled when dropped: once the
/// session's handler is done with it, or when a mailbox drops it unhandled. No task waits on
/// the message's answer.
pub struct Receipt {
    to: std::sync::Arc<dyn Handled>,
    bytes: usize,
}

impl Receipt {
    /// A receipt of a message of `bytes`, for `to`.
    pub fn new(to: std::sync::Arc<dyn Handled>, bytes: usize) -> Receipt {
        Receipt { to, bytes }
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        self.to.handled(self.bytes);
    }
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Receipt({} bytes)", self.bytes)
    }
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
        self.to.do_send(FromLine { line: self.line, msg, receipt: None });
    }

    /// Hands the session a message with its receipt: said handled once the session is done
    /// with it (or dropped it).
    pub fn hand(&self, msg: FromClient, receipt: Receipt) {
        self.to.do_send(FromLine { line: self.line, msg, receipt: Some(receipt) });
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
    /// What became of the session, for an edge that acts on it (a phone call is answered once
    /// its session is created) or shows it (a phone line logs what its session refused).
    Notice(Notice),
    /// The session is over: close the connection for this reason (its close code and
    /// description), after what was sent before.
    Close(CloseReason),
}

/// What became of a session, as every edge can read it whatever its dialect.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// It waits for a worker (told once, when it first joins the queue).
    Queued(QueueInfo),
    /// A worker took it and its backend is prepared: it is live.
    Created {
        /// The session's id, as its dialect made it.
        session_id: String,
    },
    /// Its client is told this error (whether the session ends follows from the error, and
    /// then comes [`ToClient::Close`]).
    Error(ProtocolError),
}

/// A call's settings, as an edge that speaks no dialect knows them (a phone route's
/// `instructions` and `voice`, a telephony stream's parameters). `None` leaves a setting as the
/// dialect has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallSettings {
    /// What the model is told to be and do.
    pub instructions: Option<String>,
    /// The model's voice, by name.
    pub voice: Option<String>,
    /// Who decides when the caller's turn ends.
    pub turn_detection: Option<TurnDetection>,
    /// The functions the model may call, and the choice among them.
    pub tools: Option<Tools>,
}

impl CallSettings {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == CallSettings::default()
    }
}

/// Who decides when a caller's turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnDetection {
    /// The gateway, from the caller's voice (the dialect's server VAD, at its defaults).
    Server,
    /// The client commits its turns and asks for answers itself.
    Off,
}

/// What the caller heard of the model's voice, as the edge that plays it tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Playback {
    /// Response `response`'s voice started playing.
    Started {
        /// The response's id, as the dialect named it.
        response: String,
    },
    /// Response `response`'s voice has all been played.
    Stopped {
        /// The response's id, as the dialect named it.
        response: String,
    },
    /// The voice was cleared ([`ModelAudio::Clear`]): what was playing of `response` stopped at
    /// once; `None` when nothing was playing.
    Cleared {
        /// The response whose voice was cut, if one was playing.
        response: Option<String>,
    },
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

    /// Whether the client's side takes the dialect's text messages now: a phone line with no
    /// app on its call has no use for them, and its session's dialect does not write them.
    fn wants_text(&self) -> bool {
        true
    }
}

impl ClientLine for Recipient<ToClient> {
    fn tell(&self, msg: ToClient) {
        self.do_send(msg);
    }
}
