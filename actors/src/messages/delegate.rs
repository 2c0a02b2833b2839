//! What sessions ask of the delegation actor (the decider beside the voice), and what it answers.

use std::sync::Arc;

use actix::prelude::*;

use crate::domain::{DecideRequest, DeciderError, Decision};
use crate::messages::transcribe::Backlog;

/// Decide on the newest user turn of a session's conversation; the answer goes to `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Decide {
    /// The session, for logs.
    pub session: String,
    /// The session's number of this decision; the answer names it.
    pub id: u64,
    /// The session's instructions, tools and conversation.
    pub request: Box<DecideRequest>,
    /// Where the answer goes.
    pub reply: Recipient<Decided>,
}

/// A decision, or why there is none.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub struct Decided {
    /// The decision asked for, as the session numbered it.
    pub id: u64,
    /// The decision, or why there is none.
    pub result: Result<Decision, DeciderError>,
}

/// What sessions hold to reach the deciders: where requests go, and the bound they pass first.
#[derive(Clone)]
pub struct DelegationPort {
    decide: Recipient<Decide>,
    backlog: Arc<Backlog>,
}

impl DelegationPort {
    /// The port of the deciders at `decide`, whose requests pass `backlog` first.
    pub fn new(decide: Recipient<Decide>, backlog: Arc<Backlog>) -> DelegationPort {
        DelegationPort { decide, backlog }
    }

    /// Hands a request to a decider, or answers it at once when the backlog is full.
    pub fn submit(&self, job: Decide) {
        if let Err(taken) = self.backlog.admit() {
            log::warn!("session {}: decision {} refused: {taken} waiting", job.session, job.id);
            let why = format!("the decider is behind ({taken} decisions waiting); this turn is not decided");
            job.reply.do_send(Decided { id: job.id, result: Err(DeciderError::Unavailable(why)) });
            return;
        }
        self.decide.do_send(job);
    }
}
