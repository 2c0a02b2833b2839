//! A text model beside the voice (delegation): for a session whose backend calls no tools, the
//! gateway asks a decider, once per user turn, whether to call one of the session's tools and
//! with which arguments, on the conversation's transcript. The server implements it (an
//! OpenAI-compatible chat-completions server); the session only sees [`Decision`]s.

use std::sync::Arc;

use crate::domain::{DecideRequest, DeciderError, Decision};

/// A decider: blocking, on a thread of the delegation pool.
pub trait Decider: Send {
    /// The decision for the newest user turn of `request`.
    fn decide(&mut self, request: &DecideRequest) -> Result<Decision, DeciderError>;
}

/// Opens a decider (one per delegation thread).
pub type OpenDecider = Arc<dyn Fn() -> Box<dyn Decider> + Send + Sync>;
