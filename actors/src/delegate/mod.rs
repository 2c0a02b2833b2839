//! The delegation actor: deciders (a text model beside the voice, [`Decider`]) on threads of
//! their own. A session whose backend calls no tools sends the conversation once per user turn;
//! the decision comes back as [`crate::messages::delegate::Decided`]. It never delays the
//! voice (the model's worker runs elsewhere), and its backlog is bounded: past it a request is
//! answered at once with `decider_unavailable`.
//!
//! `threads` deciders run side by side (a `SyncArbiter`); each blocks on its request, which
//! its own timeout bounds. A decider on the pool's own chat workers is [`pool`]: no thread, a
//! short session of its own per decision.

pub mod pool;

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::domain::Decision;
use crate::edge::decider::{Decider, OpenDecider};
use crate::messages::delegate::{Decide, Decided, DelegationPort};
use crate::messages::transcribe::Backlog;
use crate::observe::metrics::metrics;

impl DelegationPort {
    /// Starts `threads` deciders; at most `max_waiting` requests wait or run.
    pub fn start(threads: usize, max_waiting: usize, open: OpenDecider) -> DelegationPort {
        let backlog = Arc::new(Backlog::new(max_waiting.max(1)));
        let shared = backlog.clone();
        let addr =
            SyncArbiter::start(threads.max(1), move || DelegationActor { decider: open(), backlog: shared.clone() });
        DelegationPort::new(addr.recipient(), backlog)
    }
}

/// A decision counted: `omni_decisions_total{outcome}`, `omni_decision_seconds`.
fn count(result: &Result<Decision, crate::domain::DeciderError>, elapsed: std::time::Duration) {
    metrics().decision_seconds.observe(elapsed.as_secs_f64());
    let outcome = match result {
        Ok(Decision::Call { .. }) => "call",
        Ok(Decision::NoCall(_)) => "no_call",
        Err(e) => e.code(),
    };
    metrics().decisions.with_label_values(&[outcome]).inc();
}

/// One decider, on a thread of the delegation pool; see the module's documentation.
pub struct DelegationActor {
    decider: Box<dyn Decider>,
    backlog: Arc<Backlog>,
}

impl Actor for DelegationActor {
    type Context = SyncContext<Self>;
}

impl Handler<Decide> for DelegationActor {
    type Result = ();

    fn handle(&mut self, job: Decide, _: &mut SyncContext<Self>) {
        let started = Instant::now();
        let result = self.decider.decide(&job.request);
        self.backlog.done();
        let elapsed = started.elapsed();
        count(&result, elapsed);
        match &result {
            Ok(Decision::Call { name, .. }) => {
                log::info!("session {}: decision {}: call {name} ({} ms)", job.session, job.id, elapsed.as_millis())
            }
            Ok(Decision::NoCall(_)) => {
                log::debug!("session {}: decision {}: no call ({} ms)", job.session, job.id, elapsed.as_millis())
            }
            Err(e) => log::warn!("session {}: decision {} failed: {} ({e})", job.session, job.id, e.code()),
        }
        job.reply.do_send(Decided { id: job.id, result });
    }
}
