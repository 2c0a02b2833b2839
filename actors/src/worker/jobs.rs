//! The jobs a worker's backend thread runs: the closures that make the backend's calls for a
//! piece of work and deliver their results (to the session straight from the thread, and the
//! job's end to the actor).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use actix::Addr;

use super::policy::Work;
use super::thread::Job;
use super::{BackendActor, JobDone, JobOutcome, TurnProgress};
use crate::domain::{SessionSetup, StepOutcome, TurnSummary};
use crate::edge::backend::{BackendControl, BackendError};
use crate::messages::worker::BackendEvent;

impl BackendActor {
    /// The closure that runs `work` on the backend thread. Results go from the thread
    /// straight to the session (one thread hop less on the latency path); the actor is
    /// told that the job is done, for its bookkeeping.
    pub(super) fn job(&mut self, job: u64, work: Work, control: Arc<dyn BackendControl>, addr: Addr<Self>) -> Job {
        let to_session = self.session.as_ref().map(|s| s.events.clone());
        let tell = move |event: BackendEvent| {
            if let Some(s) = &to_session {
                s.do_send(event);
            }
        };
        match work {
            Work::Prepare(setup) => prepare_job(job, false, setup, control, tell, addr),
            Work::Restart(setup) => prepare_job(job, true, setup, control, tell, addr),
            Work::Step(seq, chunk) => Box::new(move |b| {
                let started = Instant::now();
                let result = match b.duplex_step(&chunk) {
                    // An interrupted step heard its chunk and says nothing: a listen.
                    Err(BackendError::Interrupted) => Ok(StepOutcome::listen(control.kv_length())),
                    Err(BackendError::Crashed(reason)) => {
                        return addr.do_send(JobDone { job, outcome: JobOutcome::Crashed(reason) });
                    }
                    other => other,
                };
                tell(BackendEvent::Step { seq, result, elapsed: started.elapsed() });
                addr.do_send(JobDone { job, outcome: JobOutcome::Delivered });
            }),
            Work::Turn(seq, input) => {
                let cancel = self.turn_cancel.clone();
                cancel.store(false, Ordering::SeqCst);
                Box::new(move |b| {
                    let started = Instant::now();
                    let result = (|| {
                        b.turn_prefill(&input)?;
                        let mut summary = TurnSummary::default();
                        loop {
                            // A cut between pieces (no call in flight for the backend's interrupt
                            // to stop) ends the answer here; the next turn_prefill abandons the rest.
                            if cancel.load(Ordering::SeqCst) {
                                return Err(BackendError::Interrupted);
                            }
                            let piece = b.turn_generate()?;
                            let done = piece.done;
                            summary.input_tokens += piece.input_tokens;
                            summary.output_tokens += piece.output_tokens;
                            summary.input_audio_tokens += piece.input_audio_tokens;
                            summary.output_audio_tokens += piece.output_audio_tokens;
                            summary.kv_length = piece.kv_length;
                            tell(BackendEvent::TurnPiece { seq, piece });
                            addr.do_send(TurnProgress { job });
                            if done {
                                summary.duration = started.elapsed();
                                return Ok(summary);
                            }
                        }
                    })();
                    if let Err(BackendError::Crashed(reason)) = result {
                        return addr.do_send(JobDone { job, outcome: JobOutcome::Crashed(reason) });
                    }
                    tell(BackendEvent::TurnDone { seq, result });
                    addr.do_send(JobDone { job, outcome: JobOutcome::Delivered });
                })
            }
            Work::Check => Box::new(move |b| {
                let outcome = match b.check_idle() {
                    Ok(()) => JobOutcome::Delivered,
                    Err(e) => JobOutcome::Unhealthy(e.to_string()),
                };
                addr.do_send(JobDone { job, outcome });
            }),
            Work::Reset => Box::new(move |b| {
                let result = b.release();
                addr.do_send(JobDone { job, outcome: JobOutcome::Reset(result) });
            }),
            Work::Run(run) => {
                let call = self.runs.remove(&run);
                Box::new(move |b| {
                    let outcome = match call.map(|call| call(b)) {
                        Some(Err(e)) => JobOutcome::Crashed(e.to_string()),
                        _ => JobOutcome::Delivered,
                    };
                    addr.do_send(JobDone { job, outcome });
                })
            }
        }
    }
}

/// Prepares a session (after a reset, to restart one), telling the session how it went.
fn prepare_job(
    job: u64,
    reset_first: bool,
    setup: SessionSetup,
    control: Arc<dyn BackendControl>,
    tell: impl Fn(BackendEvent) + Send + 'static,
    addr: Addr<BackendActor>,
) -> Job {
    Box::new(move |b| {
        let reset = if reset_first { b.reset() } else { Ok(()) };
        let result = reset.and_then(|_| b.prepare(&setup)).map(|_| control.kv_length());
        match (reset_first, &result) {
            // Not the client's failure: the actor tells the session to wait for another worker.
            (false, Err(BackendError::Unavailable(why))) => {
                return addr.do_send(JobDone { job, outcome: JobOutcome::NoRoom(why.clone()) });
            }
            // Its session could not be started again on this worker (its slot taken meanwhile):
            // the worker fails, and its session with it, instead of asking again and again.
            (true, Err(BackendError::Unavailable(why))) => {
                let reason = format!("its session could not be started again: {why}");
                return addr.do_send(JobDone { job, outcome: JobOutcome::Crashed(reason) });
            }
            _ => {}
        }
        tell(match result {
            Ok(prompt_length) => BackendEvent::Prepared { prompt_length, backend: Box::new(b.info().clone()) },
            Err(e) => BackendEvent::PrepareFailed(e),
        });
        addr.do_send(JobDone { job, outcome: JobOutcome::Delivered });
    })
}
