//! The transcription actor: Whisper (or any [`Transcriber`]) on threads of its own, for user
//! speech a backend does not transcribe. A session sends the audio of each user item as its
//! speech ends; the answer comes back to the session as [`crate::messages::transcribe::Transcribed`]. It never
//! delays the model's answer (the model's worker runs elsewhere), and its backlog is bounded
//! (`backlog::Backlog`): past it a job is refused at once with the reason.
//!
//! `threads` recognisers run side by side (a `SyncArbiter`), each with its own model state.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::edge::transcriber::{OpenTranscriber, Transcriber, TranscriptionError};

use crate::messages::transcribe::{Backlog, Transcribe, Transcribed, TranscriptionPort};

pub use crate::messages::transcribe::MAX_SECONDS;

impl TranscriptionPort {
    /// Starts `threads` recognisers; at most `max_waiting` jobs wait or run.
    pub fn start(threads: usize, max_waiting: usize, open: OpenTranscriber) -> TranscriptionPort {
        let backlog = Arc::new(Backlog::new(max_waiting.max(1)));
        let shared = backlog.clone();
        let addr = SyncArbiter::start(threads.max(1), move || TranscriptionActor {
            transcriber: open(),
            backlog: shared.clone(),
        });
        TranscriptionPort::new(addr.recipient(), backlog)
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
