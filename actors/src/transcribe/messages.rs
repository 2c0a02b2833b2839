//! What sessions ask of the transcription actor, and what it answers.

use actix::prelude::*;

use crate::edge::transcriber::TranscriptionError;

/// Transcribe a user item's audio; the answer goes to `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Transcribe {
    /// The session, for logs.
    pub session: String,
    /// The dialect's id of the user item; the answer names it.
    pub item_id: String,
    /// 16 kHz mono.
    pub audio: Vec<f32>,
    /// Where the answer goes.
    pub reply: Recipient<Transcribed>,
}

/// The words of an item's audio, or why there are none.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub struct Transcribed {
    /// The user item the audio was of, as the session named it.
    pub item_id: String,
    /// The words, or why there are none.
    pub result: Result<String, TranscriptionError>,
}
