//! The transcription actor: Whisper (or any [`Transcriber`]) on threads of its own, for user
//! speech a backend does not transcribe. A session sends the audio of each user item as its
//! speech ends; the answer comes back to the session as [`messages::Transcribed`]. It never
//! delays the model's answer (the model's worker runs elsewhere), and its backlog is bounded
//! (`backlog::Backlog`): past it a job is refused at once with the reason.
//!
//! `threads` recognisers run side by side (a `SyncArbiter`), each with its own model state.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::edge::transcriber::{OpenTranscriber, Transcriber, TranscriptionError};

mod backlog;
pub mod messages;

use backlog::Backlog;
use messages::{Transcribe, Transcribed};

/// Longest audio transcribed: Whisper hears at most 30 s at once.
pub const MAX_SECONDS: usize = 30;

/// What sessions hold to reach the recognisers: where jobs go, and the bound they pass first.
#[derive(Clone)]
pub struct TranscriptionPort {
    transcribe: Recipient<Transcribe>,
    backlog: Arc<Backlog>,
}

impl TranscriptionPort {
    /// Starts `threads` recognisers; at most `max_waiting` jobs wait or run.
    pub fn start(threads: usize, max_waiting: usize, open: OpenTranscriber) -> TranscriptionPort {
        let backlog = Arc::new(Backlog::new(max_waiting.max(1)));
        let shared = backlog.clone();
        let addr = SyncArbiter::start(threads.max(1), move || TranscriptionActor {
            transcriber: open(),
            backlog: shared.clone(),
        });
        TranscriptionPort { transcribe: addr.recipient(), backlog }
    }

    /// Hands a job to a recogniser, or answers it at once when the backlog is full.
    pub fn submit(&self, mut job: Transcribe) {
        if let Err(taken) = self.backlog.admit() {
            log::warn!("session {}: transcription of {} refused: {taken} waiting", job.session, job.item_id);
            let result = Err(TranscriptionError::Behind { waiting: taken });
            job.reply.do_send(Transcribed { item_id: job.item_id, result });
            return;
        }
        job.audio.truncate(MAX_SECONDS * 16000);
        self.transcribe.do_send(job);
    }
}

/// One recogniser, on a thread of the transcription pool; see the module's documentation.
pub struct TranscriptionActor {
    /// This thread's recogniser, or why it could not open.
    transcriber: Result<Box<dyn Transcriber>, TranscriptionError>,
    backlog: Arc<Backlog>,
}

impl Actor for TranscriptionActor {
    type Context = SyncContext<Self>;
}

impl Handler<Transcribe> for TranscriptionActor {
    type Result = ();

    fn handle(&mut self, job: Transcribe, _: &mut SyncContext<Self>) {
        let started = Instant::now();
        let result = match &mut self.transcriber {
            Ok(t) => t.transcribe(&job.audio),
            Err(why) => Err(why.clone()),
        };
        self.backlog.done();
        match &result {
            Ok(text) => log::debug!(
                "session {}: {} transcribed ({:.1} s of audio, {} ms, {} bytes)",
                job.session,
                job.item_id,
                job.audio.len() as f64 / 16000.0,
                started.elapsed().as_millis(),
                text.len()
            ),
            Err(why) => log::warn!("session {}: transcription of {} failed: {why}", job.session, job.item_id),
        }
        job.reply.do_send(Transcribed { item_id: job.item_id, result });
    }
}
