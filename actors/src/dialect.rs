//! The edge between a session and its wire format. A dialect is a codec: it decodes a
//! client's text frames into [`Inbound`] commands and encodes [`Outbound`] events into
//! text frames. The session's state machine, limits and routing stay in the actors.

use crate::ids;
use crate::protocol::{Inbound, Outbound, ProtocolError};

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not JSON, or JSON that is not an object: the connection closes with 1003.
    Unparseable(String),
    /// A well-formed event that is wrong: the client gets this error, the session goes on.
    Protocol(ProtocolError),
}

impl From<ProtocolError> for DecodeError {
    fn from(e: ProtocolError) -> Self {
        DecodeError::Protocol(e)
    }
}

/// How a dialect encodes audio in its base64 fields (recordings decode what was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioFormat {
    /// Little-endian float32.
    F32,
    /// Little-endian signed 16-bit.
    Pcm16,
}

pub trait Dialect {
    /// The dialect's name in logs, metrics and recordings.
    fn name(&self) -> &'static str;

    /// Decodes one text frame into zero or more commands. Frames the dialect answers by
    /// itself (acknowledgements that need no actor) are pushed onto `replies`.
    fn decode(&mut self, text: &str, replies: &mut Vec<String>) -> Result<Vec<Inbound>, DecodeError>;

    /// Encodes one event into zero or more text frames.
    fn encode(&mut self, event: Outbound<'_>, out: &mut Vec<String>);

    /// How this dialect encodes the model's audio.
    fn output_audio(&self) -> AudioFormat {
        AudioFormat::F32
    }

    /// A new session id in this dialect's format; unique across restarts.
    fn new_session_id(&mut self) -> String {
        ids::session_id()
    }
}
