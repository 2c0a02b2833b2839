//! The edge between a session and its wire format. A dialect is a codec: it decodes a
//! client's text frames into [`Inbound`] commands and encodes [`Outbound`] events into
//! text frames. The session's state machine, limits and routing stay in the actors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;

use crate::ids;
use crate::observe::recording::Redact;
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

/// The audio segments (16 kHz) and images a client event carried, for the recording.
pub type RecordedMedia = (Vec<Vec<f32>>, Vec<Vec<u8>>);

pub trait Dialect {
    /// The dialect's name in logs, metrics and recordings.
    fn name(&self) -> &'static str;

    /// Decodes one text frame into zero or more commands. Frames the dialect answers by
    /// itself (acknowledgements that need no actor) are pushed onto `replies`. The frame is
    /// shared: a command may keep a slice of it without a copy (a chunk's audio as the client
    /// wrote it, for a backend that takes the same format).
    fn decode(&mut self, text: &ByteString, replies: &mut Vec<String>) -> Result<Vec<Inbound>, DecodeError>;

    /// Encodes one event into zero or more text frames.
    fn encode(&mut self, event: Outbound<'_>, out: &mut Vec<String>);

    /// What the recording keeps of this dialect's frames (run on the recorder's thread).
    fn redactor(&self) -> Arc<dyn Redact>;

    /// A new session id in this dialect's format; unique across restarts.
    fn new_session_id(&mut self) -> String {
        ids::session_id()
    }

    /// Commands the dialect issues on its own: initialising a session its clients never
    /// initialise, input held until the session was created, pacing steps. The session
    /// takes them after every decode, encode and tick.
    fn take_commands(&mut self) -> Vec<Inbound> {
        Vec::new()
    }

    /// The audio (16 kHz) and images the last decoded frame carried, for the recording,
    /// when they are not simply those of its commands (a dialect that gathers audio).
    fn take_recorded_media(&mut self) -> Option<RecordedMedia> {
        None
    }

    /// How often the session calls [`Dialect::tick`]; `None` for never.
    fn tick_interval(&self) -> Option<Duration> {
        None
    }

    /// Time passes: the dialect may push frames onto `out` and queue commands.
    fn tick(&mut self, _now: Instant, _out: &mut Vec<String>) {}
}
