//! Resumable sessions. A client whose connection drops without a close takes its session back
//! on a new connection with the token it was given: the same session, its place in the queue
//! or its worker, its conversation, and the messages it missed.
//!
//! - [`tokens`]: which token resumes which session, shared by the sessions and the routes. A
//!   session holds one token at a time; a resume uses it up (the session gives the client the
//!   next), and only a caller with the API key and the transport that opened the session may.
//! - [`replay`]: the rules of a session's messages to its client, plain and tested without a
//!   runtime: every message said is numbered and the last ones kept (bounded), so that a
//!   resumed client gets those it did not receive, in order; while the client is away nothing
//!   is sent, and what it missed is counted.
//! - [`Resume`]: what a resumed connection's edge hands the session (its new line).
//!
//! The hold itself is the session's (`super::hold`): a lost connection
//! ([`crate::edge::client::FromClient::Lost`]) puts its client away, and the grace is one more timer
//! of its own context, which ends it unless the token was taken in the meantime.

use std::time::Duration;

use actix::prelude::*;

use crate::edge::client::ClientLine;

pub mod replay;
pub mod tokens;

pub use replay::{Catchup, REPLAY_FRAMES, Replay};
pub use tokens::{Resumable, ResumeRefusal, Taken, Tokens, with_token};

/// How a session may be resumed, from `[server]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeTerms {
    /// How long a session whose connection dropped is held for its client; zero: not at all.
    pub grace: Duration,
    /// The bytes of the last messages a session keeps for a resumed client.
    pub replay_bytes: usize,
}

impl ResumeTerms {
    /// No resumption: a dropped connection ends its session.
    pub const OFF: ResumeTerms = ResumeTerms { grace: Duration::ZERO, replay_bytes: 0 };

    /// Whether sessions are held at all.
    pub fn on(&self) -> bool {
        !self.grace.is_zero()
    }
}

/// A resumed connection's line, for the session it takes back.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resume {
    /// Where the session now speaks to its client.
    pub line: Box<dyn ClientLine>,
    /// The line's number: what its edge hands the session comes tagged with it
    /// ([`crate::edge::client::FromLine`]); anything from an earlier line is not heard.
    pub line_no: u64,
    /// How many of the session's messages the client received (`?received=`), when it says.
    pub received: Option<u64>,
}
