//! What a session says and hears, independent of any wire dialect: the commands a
//! dialect decodes from the client, the events it encodes for the client, the protocol
//! errors and the reasons a session ends.

use thiserror::Error;

use crate::domain::{BackendInfo, CallPiece, DuplexChunk, SessionKind, SessionSetup, StepOutcome, TurnInput};

/// Whether an error is the client's fault or the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The client's request was wrong; the connection stays open.
    Client,
    /// The server failed or cannot serve.
    Server,
}

impl ErrorKind {
    /// The error's `type` on the wire: `client_error` or `server_error`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Client => "client_error",
            ErrorKind::Server => "server_error",
        }
    }
}

/// Every error a client can be told about. `code()` is both the wire error code and the
/// metric label. Client errors never close the connection; most server errors do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// An event the session's state does not allow yet.
    #[error("{0}")]
    NotReady(String),
    /// An event type the dialect does not know.
    #[error("{0}")]
    UnknownEvent(String),
    /// A required field is absent, or a container is not an object.
    #[error("{0}")]
    MissingField(String),
    /// A field of the wrong type or value.
    #[error("{0}")]
    InvalidPayload(String),
    /// More clients wait than the queue holds (`queue.max_waiting`).
    #[error("{0}")]
    QueueFull(String),
    /// No worker can serve the mode, or the server is not ready.
    #[error("{0}")]
    ServiceUnavailable(String),
    /// The worker the queue assigned already serves another session.
    #[error("{0}")]
    WorkerBusy(String),
    /// The worker the queue assigned could not be taken (gone, not ready, or without a backend).
    #[error("{0}")]
    WorkerConnectFailed(String),
    /// A step or answer failed; the session goes on.
    #[error("{0}")]
    Inference(String),
    /// An unknown model name (OpenAI-style dialects).
    #[error("{0}")]
    ModelNotFound(String),
    /// The event would make the server hold more for this client than its bound allows
    /// (audio not yet committed, items, images, answers waiting); the event is refused.
    #[error("{0}")]
    BufferFull(String),
    /// Messages over the connection's rate were dropped unprocessed (`server.max_messages_per_s`).
    #[error("{0}")]
    RateLimited(String),
    /// The decider beside a voice that calls no tools gave no decision for a user turn
    /// (`decider_unavailable`, `decider_timeout`, `decider_invalid_output`); the session goes on.
    #[error("{0}")]
    Decider(crate::domain::DeciderError),
    /// A request the conversation's rules refuse, under the code the dialect's clients know
    /// it by (`conversation_already_has_active_response`, `response_cancel_not_active`,
    /// `item_truncate_invalid_item_id`...).
    #[error("{message}")]
    Refused {
        /// The wire code, also the metric label.
        code: &'static str,
        /// What went wrong, for the client.
        message: String,
    },
}

impl ProtocolError {
    /// The wire error code, also the metric label: `not_ready`, `queue_full`, ...
    pub fn code(&self) -> &'static str {
        match self {
            ProtocolError::NotReady(_) => "not_ready",
            ProtocolError::UnknownEvent(_) => "unknown_event",
            ProtocolError::MissingField(_) => "missing_field",
            ProtocolError::InvalidPayload(_) => "invalid_payload",
            ProtocolError::QueueFull(_) => "queue_full",
            ProtocolError::ServiceUnavailable(_) => "service_unavailable",
            ProtocolError::WorkerBusy(_) => "worker_busy",
            ProtocolError::WorkerConnectFailed(_) => "worker_connect_failed",
            ProtocolError::Inference(_) => "inference_error",
            ProtocolError::ModelNotFound(_) => "model_not_found",
            ProtocolError::BufferFull(_) => "buffer_full",
            ProtocolError::RateLimited(_) => "rate_limited",
            ProtocolError::Decider(e) => e.code(),
            ProtocolError::Refused { code, .. } => code,
        }
    }

    /// Whether the client or the server is at fault.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProtocolError::NotReady(_)
            | ProtocolError::UnknownEvent(_)
            | ProtocolError::MissingField(_)
            | ProtocolError::InvalidPayload(_)
            | ProtocolError::ModelNotFound(_)
            | ProtocolError::BufferFull(_)
            | ProtocolError::RateLimited(_)
            | ProtocolError::Refused { .. } => ErrorKind::Client,
            _ => ErrorKind::Server,
        }
    }

    /// The WebSocket close code that follows this error, if it ends the connection.
    pub fn close_code(&self) -> Option<u16> {
        match self {
            ProtocolError::QueueFull(_)
            | ProtocolError::ServiceUnavailable(_)
            | ProtocolError::WorkerBusy(_)
            | ProtocolError::WorkerConnectFailed(_) => Some(1013),
            ProtocolError::ModelNotFound(_) => Some(1008),
            _ => None,
        }
    }
}

/// Why a session ended. `as_str()` is the reason on the wire, in logs and in metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent a close event; its reason, `user_stop` when it gave none.
    Client(String),
    /// The client dropped the connection without a close event.
    ClientGone,
    /// The client stopped answering pings.
    HeartbeatTimeout,
    /// The session's time limit ran out.
    Timeout,
    /// The KV cache reached the context limit.
    ContextFull,
    /// The backend failed for good (crash, hang past the step timeout).
    BackendError(String),
    /// The server is stopping; the step in flight was answered first.
    ServerShutdown,
    /// An operator cancelled the waiting ticket.
    Cancelled,
    /// The session was refused or ended by an error the client was told (queue full, no
    /// worker, unknown model...): its code, and the close code that follows it.
    Rejected {
        /// The error's code, as [`ProtocolError::code`] gives it.
        code: &'static str,
        /// The WebSocket close code that followed the error.
        close_code: u16,
    },
    /// The client broke the protocol; the violation names the close code.
    ProtocolViolation(Violation),
    /// The client does not read its output; the outgoing buffer overflowed.
    SlowConsumer,
    /// The session was resumed on another connection: this one is closed (the session goes
    /// on there).
    Resumed,
}

impl CloseReason {
    /// The reason on the wire and in logs: the client's own reason for [`CloseReason::Client`].
    pub fn as_str(&self) -> &str {
        match self {
            CloseReason::Client(r) => r,
            CloseReason::ClientGone => "client_closed",
            CloseReason::HeartbeatTimeout => "heartbeat_timeout",
            CloseReason::Timeout => "timeout",
            CloseReason::ContextFull => "context_full",
            CloseReason::BackendError(_) => "backend_error",
            CloseReason::ServerShutdown => "server_shutdown",
            CloseReason::Cancelled => "cancelled",
            CloseReason::Rejected { code, .. } => code,
            CloseReason::ProtocolViolation(v) => v.as_str(),
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::Resumed => "resumed_elsewhere",
        }
    }

    /// The label in metrics: a fixed set (a client's own reason is not a label value).
    pub fn metric_label(&self) -> &'static str {
        match self {
            CloseReason::Client(r) if r == "user_stop" => "user_stop",
            CloseReason::Client(_) => "client_close",
            CloseReason::ClientGone => "client_closed",
            CloseReason::HeartbeatTimeout => "heartbeat_timeout",
            CloseReason::Timeout => "timeout",
            CloseReason::ContextFull => "context_full",
            CloseReason::BackendError(_) => "backend_error",
            CloseReason::ServerShutdown => "server_shutdown",
            CloseReason::Cancelled => "cancelled",
            CloseReason::Rejected { code, .. } => code,
            CloseReason::ProtocolViolation(v) => v.as_str(),
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::Resumed => "resumed_elsewhere",
        }
    }

    /// A session refused with `e`, which the client was told (`None`: `e` does not end it).
    pub fn rejected(e: &ProtocolError) -> Option<CloseReason> {
        e.close_code().map(|close_code| CloseReason::Rejected { code: e.code(), close_code })
    }

    /// The WebSocket close code for this ending.
    pub fn close_code(&self) -> u16 {
        match self {
            CloseReason::Client(_) | CloseReason::Timeout | CloseReason::ContextFull | CloseReason::Cancelled => 1000,
            CloseReason::ServerShutdown => 1001,
            CloseReason::BackendError(_) => 1011,
            CloseReason::Rejected { close_code, .. } => *close_code,
            CloseReason::ProtocolViolation(v) => v.close_code(),
            CloseReason::SlowConsumer => 1008,
            CloseReason::ClientGone | CloseReason::HeartbeatTimeout | CloseReason::Resumed => 1000,
        }
    }

    /// Whether the client is told with a `session.closed` event (it is gone otherwise, or
    /// was already told with an `error`).
    pub fn announced(&self) -> bool {
        !matches!(
            self,
            CloseReason::ClientGone
                | CloseReason::HeartbeatTimeout
                | CloseReason::SlowConsumer
                | CloseReason::Rejected { .. }
                | CloseReason::ProtocolViolation(_)
                | CloseReason::Resumed
        )
    }
}

/// How a client broke the protocol. Each names its close code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A frame that is not JSON, or not an object (1003).
    InvalidJson,
    /// A text message that is not UTF-8 (1003).
    InvalidUtf8,
    /// A binary frame: every dialect speaks text (1003).
    BinaryFrame,
    /// A continuation frame with no message started (1003).
    InvalidFrame,
    /// A WebSocket protocol error (1003).
    ProtocolError,
    /// A message over `server.max_frame_bytes` (1009).
    MessageTooBig,
    /// Messages over the rate for too long (1008).
    RateLimited,
    /// A fragmented message not finished within `server.message_timeout_s` (1008).
    MessageTimeout,
    /// A fragmented message while every connection's unfinished ones fill their budget (1013).
    FragmentsFull,
    /// The dialect failed on the client's frame (a bug: 1011).
    InternalError,
}

impl Violation {
    /// The violation's name, in logs and metrics (`invalid_json`, `message_too_big`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Violation::InvalidJson => "invalid_json",
            Violation::InvalidUtf8 => "invalid_utf8",
            Violation::BinaryFrame => "binary_frame",
            Violation::InvalidFrame => "invalid_frame",
            Violation::ProtocolError => "protocol_error",
            Violation::MessageTooBig => "message_too_big",
            Violation::RateLimited => "rate_limited",
            Violation::MessageTimeout => "message_timeout",
            Violation::FragmentsFull => "fragments_full",
            Violation::InternalError => "internal_error",
        }
    }

    /// The WebSocket close code the connection is closed with.
    pub fn close_code(self) -> u16 {
        match self {
            Violation::InvalidJson
            | Violation::InvalidUtf8
            | Violation::BinaryFrame
            | Violation::InvalidFrame
            | Violation::ProtocolError => 1003,
            Violation::MessageTooBig => 1009,
            Violation::RateLimited | Violation::MessageTimeout => 1008,
            Violation::FragmentsFull => 1013,
            Violation::InternalError => 1011,
        }
    }
}

/// Cuts `text` to at most `max` bytes, at a character boundary (a client's close reason, a
/// close frame's description).
pub fn bounded(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A command decoded from one client event.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// Start the session (`session.init`, legacy `session.update`).
    Init(SessionSetup),
    /// One duplex input chunk.
    Chunk(DuplexChunk),
    /// One turn-mode request.
    Turn {
        /// The conversation to answer, and how.
        input: TurnInput,
        /// Send the answer piece by piece as it comes ([`Outbound::TurnDelta`]); otherwise whole
        /// in [`Outbound::TurnDone`].
        streaming: bool,
    },
    /// The client ends the session; `None` means it gave no reason.
    Close {
        /// The reason the client gave.
        reason: Option<String>,
    },
    /// Start the session over on the same worker with new settings (instructions, voice,
    /// duplex or turn mode); output of earlier input is void.
    Reconfigure(SessionSetup),
    /// Cut the current output short: in duplex mode the backend is force-listened (speech
    /// of earlier input is void), in turn mode the answer in flight is cancelled.
    Interrupt,
    /// Transcribe a user item's audio (16 kHz) with the gateway's recogniser: for a backend that
    /// reports no transcript. The answer comes as [`Outbound::UserTranscript`].
    Transcribe {
        /// The dialect's id of the user item; the answer names it.
        item_id: String,
        /// The item's audio, 16 kHz mono.
        audio: Vec<f32>,
    },
    /// Ask the decider beside the voice (delegation) about the newest user turn: for a backend
    /// that calls no tools. The answer comes as [`Outbound::Decided`].
    Decide {
        /// The dialect's number of this decision; the answer names it.
        id: u64,
        /// The session's instructions, tools and conversation as text.
        request: Box<crate::domain::DecideRequest>,
    },
}

/// Queue position as told to a waiting client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueInfo {
    /// The client's ticket number in the queue (`ticket_N` on the wire).
    pub ticket: u64,
    /// 1-based.
    pub position: usize,
    /// The estimated wait until a worker is free, in seconds; at least 1.
    pub estimated_wait_s: f64,
    /// How many clients are waiting, this one included.
    pub queue_length: usize,
    /// Whether the estimate rests on sessions served (of this ticket's mode); until one has
    /// ended, it is the configured typical length's guess, and clients are told a worker is
    /// busy rather than a number.
    pub measured: bool,
}

/// An event for the client, borrowed from the session's state (audio is not copied).
#[derive(Debug, Clone, Copy)]
pub enum Outbound<'a> {
    /// The client must wait: its first place in the queue.
    Queued(QueueInfo),
    /// The client's place or estimated wait, again: when it changed, and every
    /// `queue.update_interval_s`.
    QueueUpdate(QueueInfo),
    /// A worker was assigned and attached; the client may start its session.
    QueueDone,
    /// The client took its session back on a new connection: sent first on it, before the
    /// messages it missed.
    Resumed {
        /// The session's id, once it has one.
        session_id: Option<&'a str>,
        /// The token for the next resume (the one used is no longer good).
        token: &'a str,
        /// Messages that follow: those the client did not receive, in order.
        replayed: u64,
        /// Messages it did not receive that were no longer kept (`[server] resume_replay_kb`).
        lost: u64,
        /// The model's voice produced while it was away, not sent, in milliseconds.
        voice_skipped_ms: u64,
        /// How long it was away, in milliseconds (0: back before the drop was noticed).
        away_ms: u64,
    },
    /// The backend prepared the session: it is active.
    Created {
        /// The session's id, as the dialect made it.
        session_id: &'a str,
        /// Whether the backend runs the session step by step or turn by turn.
        kind: SessionKind,
        /// The backend's KV cache length after the system prompt, in tokens.
        prompt_length: u64,
        /// Time from the connection's upgrade until the session was created, in milliseconds.
        queue_wait_ms: u64,
        /// What the backend can do (transcripts, the settings it applies).
        backend: &'a BackendInfo,
    },
    /// What the user said, as the backend heard it: reported with the step (`input_id`)
    /// where the backend finished transcribing it, or with a turn's answer (`response_id`).
    Transcript {
        /// The session's id.
        session_id: &'a str,
        /// The input (`input_N`) whose step or turn reported the transcript.
        input_id: &'a str,
        /// The answer the transcript belongs to, in turn mode; `None` for a duplex step.
        response_id: Option<&'a str>,
        /// The words.
        text: &'a str,
    },
    /// The output of one duplex step: listen, or speech (text and/or audio).
    Step {
        /// The session's id.
        session_id: &'a str,
        /// The model turn this speech belongs to; `None` for a listen.
        response_id: Option<&'a str>,
        /// The input (`input_N`) the step answered.
        input_id: &'a str,
        /// The step's merged output.
        outcome: &'a StepOutcome,
    },
    /// A piece of a streaming turn-mode answer.
    TurnDelta {
        /// The session's id.
        session_id: &'a str,
        /// The answer this piece belongs to.
        response_id: &'a str,
        /// The turn's `input.append` (`input_N`).
        input_id: &'a str,
        /// Text of this piece.
        text: &'a str,
        /// Speech of this piece, 24 kHz mono; empty without speech output.
        audio: &'a [f32],
        /// The backend's KV cache length after this piece, in tokens.
        kv_length: u64,
        /// Time the backend spent producing this piece, in microseconds.
        generate_us: u32,
        /// A piece of a function call the model makes (then `text` and `audio` are empty).
        call: Option<&'a CallPiece>,
    },
    /// The end of a turn-mode answer, with the whole text (and audio, when not streamed).
    TurnDone {
        /// The session's id.
        session_id: &'a str,
        /// The answer that ended.
        response_id: &'a str,
        /// The whole text of the answer.
        text: &'a str,
        /// The whole speech, 24 kHz mono, for an answer not streamed that has speech; `None`
        /// otherwise.
        audio: Option<&'a [f32]>,
        /// Tokens of the prefilled conversation; 0 for a cancelled answer.
        input_tokens: u32,
        /// Text tokens of the answer.
        output_tokens: u32,
        /// Of the input tokens, those from audio; of the output, the speech tokens
        /// (`output_tokens` counts text).
        input_audio_tokens: u32,
        /// Speech tokens of the answer.
        output_audio_tokens: u32,
        /// The backend's KV cache length after the answer, in tokens.
        kv_length: u64,
        /// Time the answer took, in milliseconds.
        duration_ms: u64,
        /// The answer was interrupted (`Inbound::Interrupt`) before its end.
        cancelled: bool,
    },
    /// A `Reconfigure` took effect.
    Reconfigured {
        /// The backend's KV cache length after the new system prompt, in tokens.
        prompt_length: u64,
        /// What the backend can do under the new settings.
        backend: &'a BackendInfo,
    },
    /// The gateway's transcript of a user item (asked with [`Inbound::Transcribe`]): the words,
    /// or why there are none.
    UserTranscript {
        /// The dialect's id of the user item, as given in [`Inbound::Transcribe`].
        item_id: &'a str,
        /// The words, or why there are none (the reason may be empty).
        result: Result<&'a str, &'a str>,
    },
    /// The decider's answer to [`Inbound::Decide`]: a call, none, or why there is none.
    Decided {
        /// The decision, as the dialect numbered it.
        id: u64,
        /// What was decided.
        result: &'a Result<crate::domain::Decision, crate::domain::DeciderError>,
    },
    /// A `Reconfigure` the backend refused: the session goes on with the settings it had.
    ReconfigureFailed(&'a ProtocolError),
    /// A turn-mode answer failed: the error the client hears, for the oldest answer in flight
    /// (answers come back in order); the session goes on.
    TurnFailed {
        /// The answer that failed.
        response_id: &'a str,
        /// Why.
        error: &'a ProtocolError,
    },
    /// An error for the client; whether the connection closes follows from the error.
    Error(&'a ProtocolError),
    /// The session ended; the last event before the connection closes.
    Closed {
        /// The session's id; `None` when it never got one (it ended while queued or before its
        /// init).
        session_id: Option<&'a str>,
        /// Why the session ended.
        reason: &'a CloseReason,
    },
}

impl<'a> Outbound<'a> {
    /// The event without the model's voice a turn-mode piece or answer carries, and how many
    /// samples (24 kHz) were left out: what a client that was away is sent instead. (A duplex
    /// step's voice is in its outcome, which the caller copies without it.)
    pub fn without_voice(mut self) -> (Outbound<'a>, usize) {
        let samples = match &mut self {
            Outbound::TurnDelta { audio, .. } => std::mem::take(audio).len(),
            Outbound::TurnDone { audio, .. } => audio.take().map_or(0, <[f32]>::len),
            _ => 0,
        };
        (self, samples)
    }
}
