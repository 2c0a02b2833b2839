//! What crosses between a codec and the driver, typed: a client's [`Command`]s in, the
//! [`Event`]s the client is to hear out. A codec turns its wire events into the first and
//! the second into its wire events; nothing here is any dialect's JSON.

use omni_actors::domain::ChatMessage;
use omni_actors::protocol::{CloseReason, ProtocolError, QueueInfo};

use super::config::Conf;
use super::items::{Item, Part};

/// What a client asks of its conversation.
#[derive(Debug)]
pub enum Command {
    /// The configuration from now on: the one in force with the client's update applied.
    Update(Box<Conf>),
    /// The caller's audio at `rate` Hz (from an append's base64, or an edge's samples).
    Audio { samples: Vec<f32>, rate: u32 },
    /// Make the audio so far a user item (manual turns), or flush it to the model (server VAD).
    Commit,
    /// Forget the audio not yet committed.
    Clear,
    /// An image (a JPEG) for the next step or the next committed item.
    Image(Vec<u8>),
    /// A message item the client wrote.
    CreateItem(NewItem),
    /// Answer now (manual turns); flush the gathered audio (server VAD).
    CreateResponse(ResponseRequest),
    /// Cut the response in progress short.
    Cancel,
}

/// A message item as a client created it: what the backend gets, and how it is shown.
#[derive(Debug)]
pub struct NewItem {
    /// The client's own id, if it gave one.
    pub id: Option<String>,
    pub message: ChatMessage,
    /// Its content as shown back (text as written; audio and images by kind, without data).
    pub parts: Vec<Part>,
}

/// What a client asked of one response.
#[derive(Debug, Default)]
pub struct ResponseRequest {
    /// Spoken (`Some(true)`) or text only; `None`: as the session says.
    pub audio: Option<bool>,
    /// Instructions for this response only.
    pub instructions: Option<String>,
}

/// The session as shown in `session.created` / `session.updated`.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub id: String,
    pub conf: Conf,
}

/// A response as shown in `response.created` / `response.done`.
#[derive(Debug, Clone)]
pub struct ResponseView {
    pub id: String,
    pub status: ResponseStatus,
    /// Why it ended as it did (`turn_detected`, `client_cancelled`, `error`).
    pub reason: Option<&'static str>,
    pub output: Vec<Item>,
    /// `None` while in progress.
    pub usage: Option<Usage>,
    pub audio: bool,
    pub voice: String,
    pub conversation_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseStatus {
    InProgress,
    Completed,
    /// Cut short (the user spoke over it, the client cancelled it).
    Cancelled,
    Failed,
}

/// The tokens of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    /// Of `input`, those from audio.
    pub input_audio: u64,
    /// Text and speech together.
    pub output: u64,
    pub output_text: u64,
    pub output_audio: u64,
}

/// How a user item's transcription ended without words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranscriptionFailure {
    /// Neither the model nor the gateway transcribes.
    Unavailable,
    /// It was asked and gave none (or the recogniser was behind).
    Failed,
}

/// What the client is to hear, in order.
#[derive(Debug, Clone)]
pub enum Event {
    Queued(QueueInfo),
    QueueUpdate(QueueInfo),
    SessionCreated(Box<SessionView>),
    SessionUpdated(Box<SessionView>),
    /// A setting the model does not apply (reported once).
    Unsupported {
        setting: String,
        model: String,
    },
    Error(ProtocolError),
    SpeechStarted {
        audio_start_ms: u64,
        item_id: String,
    },
    SpeechStopped {
        audio_end_ms: u64,
        item_id: String,
    },
    Committed {
        item_id: String,
        previous_item_id: Option<String>,
    },
    Cleared,
    ItemAdded {
        previous_item_id: Option<String>,
        item: Item,
    },
    ItemDone {
        item: Item,
    },
    TranscriptionDelta {
        item_id: String,
        delta: String,
    },
    TranscriptionCompleted {
        item_id: String,
        transcript: String,
    },
    TranscriptionFailed {
        item_id: String,
        failure: TranscriptionFailure,
        message: String,
    },
    ResponseCreated(Box<ResponseView>),
    OutputItemAdded {
        response_id: String,
        item: Item,
    },
    ContentPartAdded {
        response_id: String,
        item_id: String,
        audio: bool,
    },
    /// A piece of the answer's text, or of its voice's transcript (`audio`).
    TextDelta {
        response_id: String,
        item_id: String,
        audio: bool,
        delta: String,
    },
    /// A piece of the answer's voice, 24 kHz.
    AudioDelta {
        response_id: String,
        item_id: String,
        samples: Vec<f32>,
    },
    AudioDone {
        response_id: String,
        item_id: String,
    },
    TextDone {
        response_id: String,
        item_id: String,
        audio: bool,
        text: String,
    },
    ContentPartDone {
        response_id: String,
        item_id: String,
        part: Part,
    },
    OutputItemDone {
        response_id: String,
        item: Item,
    },
    ResponseDone(Box<ResponseView>),
    /// The response's voice is over (for an edge that plays it; no wire event).
    VoiceDone {
        response_id: String,
    },
    /// Stop the voice playing now (for an edge that plays it; no wire event).
    VoiceCleared,
    /// The client finished the session (`session.finish`).
    Finished,
    /// The server ended the session.
    Ended(CloseReason),
}

impl Event {
    /// Bytes the event holds while it waits for the session to be created, roughly.
    pub fn weight(&self) -> usize {
        const OVERHEAD: usize = 64;
        OVERHEAD
            + match self {
                Event::ItemAdded { item, .. } | Event::ItemDone { item } => item.weight(),
                Event::TranscriptionDelta { delta: text, .. }
                | Event::TranscriptionCompleted { transcript: text, .. }
                | Event::TranscriptionFailed { message: text, .. }
                | Event::TextDelta { delta: text, .. }
                | Event::TextDone { text, .. } => text.len(),
                Event::AudioDelta { samples, .. } => samples.len() * 2,
                Event::Error(e) => e.to_string().len(),
                Event::SessionUpdated(s) | Event::SessionCreated(s) => s.conf.instructions.len(),
                _ => 0,
            }
    }
}
