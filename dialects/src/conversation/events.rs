//! What crosses between a codec and the driver, typed: a client's [`Command`]s in, the
//! [`Event`]s the client is to hear out. A codec turns its wire events into the first and
//! the second into its wire events; nothing here is any dialect's JSON.

use omni_actors::domain::{ChatMessage, Tools};
use omni_actors::protocol::{CloseReason, ProtocolError, QueueInfo};

use super::config::Conf;
use super::items::{Item, Part, Place};

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
    /// An item the client wrote (a message, a function call, a tool's output).
    CreateItem(Box<NewItem>),
    /// The client asks for an item of the conversation.
    Retrieve { item_id: String },
    /// The client removes an item from the conversation.
    Delete { item_id: String },
    /// The client played an assistant's audio only up to `audio_end_ms`: the item is cut there.
    Truncate { item_id: String, content_index: u32, audio_end_ms: u64 },
    /// Answer now, under any turn detection.
    CreateResponse(Box<ResponseRequest>),
    /// Cut the response in progress short.
    Cancel,
    /// The caller pressed a key of a phone's keypad (a phone line's DTMF).
    Key(char),
}

/// An item as a client created it: what the backend gets, and how it is shown.
#[derive(Debug)]
pub struct NewItem {
    /// The client's own id, if it gave one.
    pub id: Option<String>,
    /// Where it goes in the conversation.
    pub place: Place,
    /// What the backend gets (text, audio and images; a call or a tool's result).
    pub message: ChatMessage,
    /// The item as shown back (text as written; audio and images by kind, without data).
    pub body: super::items::ItemBody,
}

/// What a client asked of one response: each `None` takes the session's.
#[derive(Debug, Default)]
pub struct ResponseRequest {
    /// Spoken (`Some(true)`) or text only.
    pub audio: Option<bool>,
    /// Instructions for this response only.
    pub instructions: Option<String>,
    /// Tools (and the choice among them) for this response only.
    pub tools: Option<Tools>,
    /// The most tokens this response may take.
    pub max_tokens: Option<Option<u32>>,
    /// The client's own key-value pairs, echoed in `response.created` and `response.done`.
    pub metadata: Option<Vec<(String, String)>>,
    /// `conversation: "none"`: the response is not added to the conversation.
    pub out_of_band: bool,
    /// The response's own input instead of the conversation (`input`); `None`: the conversation.
    pub input: Option<Vec<NewItem>>,
}

/// The session as shown in `session.created` / `session.updated`.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub id: String,
    pub conf: Conf,
    /// In `session.created`: the name of the backend that answers (a gateway field).
    pub backend: Option<String>,
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
    /// `None` for a response outside the conversation.
    pub conversation_id: Option<String>,
    /// The client's key-value pairs, as it gave them.
    pub metadata: Option<Vec<(String, String)>>,
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseStatus {
    InProgress,
    Completed,
    /// Cut short (the user spoke over it, the client cancelled it).
    Cancelled,
    /// Ended early by a limit (`max_output_tokens`).
    Incomplete,
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

/// Where an output item is: its response, its place among the response's outputs, its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub response_id: String,
    pub output_index: usize,
    pub item_id: String,
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
    /// The caller pressed `key` on a phone's keypad, at `received_at` (Unix seconds).
    KeyPressed {
        key: char,
        received_at: u64,
    },
    /// No speech for `idle_timeout_ms`: the silence became a user item, and a response follows.
    IdleTimeout {
        item_id: String,
        audio_start_ms: u64,
        audio_end_ms: u64,
    },
    ItemAdded {
        previous_item_id: Option<String>,
        item: Item,
    },
    ItemDone {
        item: Item,
    },
    ItemRetrieved {
        item: Item,
    },
    ItemDeleted {
        item_id: String,
    },
    ItemTruncated {
        item_id: String,
        content_index: u32,
        audio_end_ms: u64,
    },
    TranscriptionDelta {
        item_id: String,
        delta: String,
    },
    TranscriptionCompleted {
        item_id: String,
        transcript: String,
        /// The seconds of audio transcribed.
        seconds: f64,
    },
    TranscriptionFailed {
        item_id: String,
        failure: TranscriptionFailure,
        message: String,
    },
    ResponseCreated(Box<ResponseView>),
    OutputItemAdded {
        at: Output,
        item: Item,
    },
    ContentPartAdded {
        at: Output,
        audio: bool,
    },
    /// A piece of the answer's text, or of its voice's transcript (`audio`).
    TextDelta {
        at: Output,
        audio: bool,
        delta: String,
    },
    /// A piece of the answer's voice, 24 kHz.
    AudioDelta {
        at: Output,
        samples: Vec<f32>,
    },
    AudioDone {
        at: Output,
    },
    TextDone {
        at: Output,
        audio: bool,
        text: String,
    },
    ContentPartDone {
        at: Output,
        part: Part,
    },
    /// A piece of a function call's arguments.
    ArgumentsDelta {
        at: Output,
        call_id: String,
        delta: String,
    },
    /// A function call's arguments are complete.
    ArgumentsDone {
        at: Output,
        call_id: String,
        name: String,
        arguments: String,
    },
    OutputItemDone {
        at: Output,
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
                Event::ItemAdded { item, .. } | Event::ItemDone { item } | Event::ItemRetrieved { item } => {
                    item.weight()
                }
                Event::ArgumentsDelta { delta: text, .. } | Event::ArgumentsDone { arguments: text, .. } => text.len(),
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
