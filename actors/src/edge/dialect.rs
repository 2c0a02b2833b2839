//! The edge between a session and its wire format. A dialect decodes a client's text frames
//! (and, from an edge that carries audio itself, its voice as samples) into [`Inbound`]
//! commands, and encodes [`Outbound`] events into what the session hands its edge: text
//! frames and, to an edge that carries audio, the model's voice as samples ([`Outbox`]).
//!
//! A dialect is a part of its session's one state machine (`crate::session::core`), called
//! synchronously: what it says and the commands it issues on its own (a session its clients
//! never initialise, input held until the session was created, pacing steps) go into the same
//! [`Outbox`], in order, and the session carries out the commands in one queue with its own.
//! Time is data: the dialect says when it next needs the time ([`Dialect::tick_interval`]),
//! the session calls [`Dialect::tick`] then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;

use crate::edge::client::{CallSettings, CallerAudio, Keypress, ModelAudio, Playback};
use crate::edge::redact::RecordedMedia;
use crate::edge::redact::Redact;
use crate::ids;
use crate::protocol::{Inbound, Outbound, ProtocolError};

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or JSON that is not an object: the connection closes with 1003.
    #[error("{0}")]
    Unparseable(String),
    /// A well-formed event that is wrong: the client gets this error, the session goes on.
    #[error("{0}")]
    Protocol(ProtocolError),
}

impl From<ProtocolError> for DecodeError {
    fn from(e: ProtocolError) -> Self {
        DecodeError::Protocol(e)
    }
}

/// One thing a dialect hands its session for the client, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Emit {
    /// A text frame of the dialect.
    Text(String),
    /// A text frame that carries the model's voice (base64 in it).
    Voiced(Voiced),
    /// The model's voice as samples, for an edge that carries audio itself.
    Audio(ModelAudio),
    /// A command the dialect issues on its own, carried out by the session after what came
    /// before it was sent.
    Command(Inbound),
}

/// A text frame carrying the model's voice: where the voice is in it, so that a session kept
/// for a resume keeps the frame without it (a resumed client is not sent stale voice).
#[derive(Debug, Clone, PartialEq)]
pub struct Voiced {
    /// The frame, whole: what is sent now.
    pub text: String,
    /// The bytes of `text` that are the voice (the contents of a JSON string: removing them
    /// leaves the same event with an empty string there).
    pub voice: std::ops::Range<usize>,
    /// The voice's length, in samples at 24 kHz.
    pub samples: usize,
}

impl Voiced {
    /// The frame without its voice.
    pub fn quiet(&self) -> String {
        let (head, tail) = (&self.text[..self.voice.start], &self.text[self.voice.end..]);
        let mut quiet = String::with_capacity(head.len() + tail.len());
        quiet.push_str(head);
        quiet.push_str(tail);
        quiet
    }
}

/// What a dialect hands its session for the client: text frames, and the model's voice as
/// samples when its edge carries audio, in the order they are to reach the client.
#[derive(Debug, Default)]
pub struct Outbox {
    items: Vec<Emit>,
    /// Nobody reads the dialect's text frames now (a phone line with no app on its call, and
    /// no recording): they are not written, and those pushed are dropped.
    no_text: bool,
}

impl Outbox {
    /// An outbox with room for `n` items.
    pub fn with_capacity(n: usize) -> Outbox {
        Outbox { items: Vec::with_capacity(n), no_text: false }
    }

    /// Whether text frames are read: a dialect writes none while they are not (its events
    /// are not serialised only to be dropped).
    pub fn wants_text(&self) -> bool {
        !self.no_text
    }

    /// Whether text frames are read from now on (the session says so before each call).
    pub fn set_wants_text(&mut self, wanted: bool) {
        self.no_text = !wanted;
    }

    /// A text frame (dropped while text is not read).
    pub fn push(&mut self, text: String) {
        if !self.no_text {
            self.items.push(Emit::Text(text));
        }
    }

    /// A text frame carrying `samples` (at 24 kHz) of the model's voice in its bytes `voice`
    /// (dropped while text is not read).
    pub fn push_voiced(&mut self, text: String, voice: std::ops::Range<usize>, samples: usize) {
        if !self.no_text {
            debug_assert!(
                voice.end <= text.len() && text.is_char_boundary(voice.start) && text.is_char_boundary(voice.end)
            );
            self.items.push(Emit::Voiced(Voiced { text, voice, samples }));
        }
    }

    /// Text frames, in order (dropped while text is not read).
    pub fn extend(&mut self, texts: impl IntoIterator<Item = String>) {
        if !self.no_text {
            self.items.extend(texts.into_iter().map(Emit::Text));
        }
    }

    /// The model's voice, for an edge that carries audio.
    pub fn audio(&mut self, audio: ModelAudio) {
        self.items.push(Emit::Audio(audio));
    }

    /// Commands the dialect issues on its own, in order.
    pub fn commands(&mut self, commands: impl IntoIterator<Item = Inbound>) {
        self.items.extend(commands.into_iter().map(Emit::Command));
    }

    /// Whether nothing is waiting to be sent.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many items are waiting (text frames and audio alike).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Drops everything waiting (a decode that failed takes back its replies).
    pub fn clear(&mut self) {
        self.items.clear();
    }

    /// Everything, in order; the outbox is empty afterwards (and keeps its capacity).
    pub fn drain(&mut self) -> std::vec::Drain<'_, Emit> {
        self.items.drain(..)
    }

    /// Everything, in order.
    pub fn items(&self) -> &[Emit] {
        &self.items
    }

    /// The text frames, in order (what a test of a dialect reads).
    pub fn texts(&self) -> Vec<&str> {
        self.items
            .iter()
            .filter_map(|e| match e {
                Emit::Text(t) => Some(t.as_str()),
                Emit::Voiced(v) => Some(v.text.as_str()),
                Emit::Audio(_) | Emit::Command(_) => None,
            })
            .collect()
    }

    /// The commands, in order (what a test of a dialect reads).
    pub fn issued(&self) -> Vec<&Inbound> {
        self.items
            .iter()
            .filter_map(|e| match e {
                Emit::Command(c) => Some(c),
                Emit::Text(_) | Emit::Voiced(_) | Emit::Audio(_) => None,
            })
            .collect()
    }
}

/// A wire format, one instance per session: what the session decodes the client's frames with and
/// encodes its events with.
pub trait Dialect {
    /// The dialect's name in logs, metrics and recordings.
    fn name(&self) -> &'static str;

    /// Decodes one text frame into zero or more commands. Frames the dialect answers by
    /// itself (acknowledgements that need no actor) are pushed onto `replies`. The frame is
    /// shared: a command may keep a slice of it without a copy (a chunk's audio as the client
    /// wrote it, for a backend that takes the same format).
    fn decode(&mut self, text: &ByteString, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError>;

    /// The session's edge carries audio itself (a WebRTC call's tracks, a raw PCM socket):
    /// from now on the caller's voice comes as samples ([`Dialect::hear`]) and the model's is
    /// sent as [`Emit::Audio`], not in the dialect's events. Answers whether the dialect can
    /// (the MiniCPM-o dialects cannot: their audio is in their events).
    fn carry_audio(&mut self) -> bool {
        false
    }

    /// The caller's voice from an edge that carries audio ([`Dialect::carry_audio`]), as
    /// [`Dialect::decode`] takes a frame.
    fn hear(&mut self, _audio: CallerAudio, _replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        Err(DecodeError::Protocol(ProtocolError::InvalidPayload(format!(
            "the {} dialect takes audio only in its events",
            self.name()
        ))))
    }

    /// A key the caller pressed on a phone line ([`FromClient::Key`]). A dialect without a word
    /// for keys lets it pass (nothing is sent, nothing changes).
    ///
    /// [`FromClient::Key`]: crate::edge::client::FromClient::Key
    fn press(&mut self, _key: Keypress, _replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        Ok(Vec::new())
    }

    /// A call's settings from an edge whose caller speaks no dialect ([`FromClient::Configure`]),
    /// applied as the client's own (an error is told as a client's would be). A dialect that
    /// takes its settings only in its own events refuses them.
    ///
    /// [`FromClient::Configure`]: crate::edge::client::FromClient::Configure
    fn configure(&mut self, _settings: CallSettings, _replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        Err(DecodeError::Protocol(ProtocolError::InvalidPayload(format!(
            "the {} dialect takes its settings in its own events only",
            self.name()
        ))))
    }

    /// What the caller heard of the model's voice ([`FromClient::Playback`]), from an edge that
    /// plays it: a dialect whose events tell it says so on `out`; by default nothing is sent.
    ///
    /// [`FromClient::Playback`]: crate::edge::client::FromClient::Playback
    fn played(&mut self, _playback: Playback, _out: &mut Outbox) {}

    /// Encodes one event into zero or more text frames (and, for an edge that carries
    /// audio, the model's voice).
    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox);

    /// What the recording keeps of this dialect's frames (run on the recorder's thread).
    fn redactor(&self) -> Arc<dyn Redact>;

    /// A new session id in this dialect's format; unique across restarts.
    fn new_session_id(&mut self) -> String {
        ids::session_id()
    }

    /// The audio (16 kHz) and images the last decoded frame carried, for the recording,
    /// when they are not simply those of its commands (a dialect that gathers audio).
    fn take_recorded_media(&mut self) -> Option<RecordedMedia> {
        None
    }

    /// How often the session calls [`Dialect::tick`] (a deadline of the session's, armed
    /// again after each); `None` for never.
    fn tick_interval(&self) -> Option<Duration> {
        None
    }

    /// Time passes: the dialect may push frames and commands onto `out`.
    fn tick(&mut self, _now: Instant, _out: &mut Outbox) {}

    /// The backend's context is full. A dialect that keeps the conversation itself may make
    /// room (drop its oldest items, prepare the backend again and replay the rest, with its
    /// commands) and answer `true`: the session goes on. By default it ends (`context_full`).
    fn context_full(&mut self, _out: &mut Outbox) -> bool {
        false
    }
}
