//! What sessions ask of the transcription actor, and what it answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix::prelude::*;

use crate::edge::transcriber::TranscriptionError;

/// Transcribe a user item's audio; the answer goes to `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Transcribe {
    /// The session, for logs.
    pub session: String,
    /// The dialect's id of the user item; the answer names it.
    pub item_id: String,
    /// 16 kHz mono.
    pub audio: Vec<f32>,
    /// Where the answer goes.
    pub reply: Recipient<Transcribed>,
}

/// The words of an item's audio, or why there are none.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub struct Transcribed {
    /// The user item the audio was of, as the session named it.
    pub item_id: String,
    /// The words, or why there are none.
    pub result: Result<String, TranscriptionError>,
}

/// Longest audio transcribed: Whisper hears at most 30 s at once.
pub const MAX_SECONDS: usize = 30;

/// What sessions hold to reach the recognisers: where jobs go, and the bound they pass first.
#[derive(Clone)]
pub struct TranscriptionPort {
    transcribe: Recipient<Transcribe>,
    backlog: Arc<Backlog>,
}

impl TranscriptionPort {
    /// The port of the recognisers at `transcribe`, whose jobs pass `backlog` first.
    pub fn new(transcribe: Recipient<Transcribe>, backlog: Arc<Backlog>) -> TranscriptionPort {
        TranscriptionPort { transcribe, backlog }
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

/// How many transcriptions wait or run, bounded: a job over the bound is refused at once
/// (the session tells its client the transcription failed, and why) rather than queued
/// without limit behind the recognisers.
#[derive(Debug)]
pub struct Backlog {
    taken: AtomicUsize,
    max: usize,
}

impl Backlog {
    /// At most `max` jobs waiting or running.
    pub fn new(max: usize) -> Backlog {
        Backlog { taken: AtomicUsize::new(0), max }
    }

    /// A place for one more job, or the number taken when there is none.
    pub fn admit(&self) -> Result<(), usize> {
        self.taken.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1)).map(|_| ())
    }

    /// A job is done: its place is free.
    pub fn done(&self) {
        let _ = self.taken.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_bound_and_frees_a_place_per_job_done() {
        let b = Backlog::new(2);
        assert_eq!(b.admit(), Ok(()));
        assert_eq!(b.admit(), Ok(()));
        assert_eq!(b.admit(), Err(2));
        b.done();
        assert_eq!(b.admit(), Ok(()));
        assert_eq!(b.admit(), Err(2));
        for _ in 0..3 {
            b.done();
        }
        // Never below zero: two places, not three.
        assert_eq!((b.admit(), b.admit(), b.admit()), (Ok(()), Ok(()), Err(2)));
    }
}
