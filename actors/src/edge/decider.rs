//! A text model beside the voice (delegation): for a session whose backend calls no tools, the
//! gateway asks a decider, once per user turn, whether to call one of the session's tools and
//! with which arguments, on the conversation's transcript. The server implements it (an
//! OpenAI-compatible chat-completions server); the session only sees [`Decision`]s.

use std::sync::Arc;

use crate::domain::{ChatMessage, Tools};

/// What a decider is asked: one session's instructions, tools and conversation, nothing of any
/// other session's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecideRequest {
    /// The session's instructions.
    pub instructions: String,
    /// The session's tools, and which of them may be called.
    pub tools: Tools,
    /// The conversation so far as text, oldest first; the newest user turn is the last.
    pub messages: Vec<ChatMessage>,
}

impl DecideRequest {
    /// Roughly how many bytes it holds (for the session's budget).
    pub fn weight(&self) -> usize {
        self.instructions.len()
            + self.tools.functions.iter().map(|t| t.name.len() + t.description.len() + t.parameters.len()).sum::<usize>()
            + self.messages.iter().map(|m| m.text.len() + 16).sum::<usize>()
    }
}

/// What the decider decided for a user turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Call the tool `name` with `arguments` (JSON text, as the decider wrote it: the session
    /// checks it against the tool's schema).
    Call {
        /// The tool.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
    },
    /// No call: the voice answers by itself (what the decider wrote instead, if anything).
    NoCall(String),
}

/// Why a decider gave no decision; each is told to the client once, by its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeciderError {
    /// It could not be reached, or refused the request (`decider_unavailable`).
    #[error("{0}")]
    Unavailable(String),
    /// It did not answer in time (`decider_timeout`).
    #[error("{0}")]
    Timeout(String),
    /// It answered with what is not a decision: malformed, too long (`decider_invalid_output`).
    #[error("{0}")]
    InvalidOutput(String),
}

impl DeciderError {
    /// The code of the `error` event the client gets.
    pub fn code(&self) -> &'static str {
        match self {
            DeciderError::Unavailable(_) => "decider_unavailable",
            DeciderError::Timeout(_) => "decider_timeout",
            DeciderError::InvalidOutput(_) => "decider_invalid_output",
        }
    }
}

/// A decider: blocking, on a thread of the delegation pool.
pub trait Decider: Send {
    /// The decision for the newest user turn of `request`.
    fn decide(&mut self, request: &DecideRequest) -> Result<Decision, DeciderError>;
}

/// Opens a decider (one per delegation thread).
pub type OpenDecider = Arc<dyn Fn() -> Box<dyn Decider> + Send + Sync>;
