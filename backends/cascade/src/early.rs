//! Early transcription: once the user has been silent for `early_asr_ms`, Whisper starts on the
//! utterance so far, on a thread of its own, while the rest of the endpoint's hang-over
//! (`silence_ms`) runs. At the endpoint its words are used if the user said nothing more since
//! it started (the rest of the utterance is the silence that ended it); otherwise the utterance
//! is transcribed again, after the early job has ended (the recogniser runs one job at a time).

use std::sync::Arc;
use std::thread::JoinHandle;

use omni_asr_client::{Asr, Heard};

/// Which utterance, and how much of its speech: the engine's count of utterances begun, and
/// the voiced milliseconds in it.
pub(crate) type Point = (u64, u32);

struct Job {
    /// The utterance and its voiced milliseconds when the job started.
    at: Point,
    handle: JoinHandle<Result<Heard, omni_asr_client::AsrError>>,
    asr: Arc<Asr>,
}

#[derive(Default)]
pub(crate) struct EarlyAsr {
    job: Option<Job>,
}

impl EarlyAsr {
    /// Starts a job on `audio` (the utterance as of `at`), unless one is running; a finished
    /// job of an utterance that went on since is replaced.
    pub(crate) fn start(&mut self, asr: &Arc<Asr>, audio: &[f32], at: Point) {
        if let Some(job) = &self.job
            && (job.at == at || !job.handle.is_finished())
        {
            return;
        }
        self.discard();
        let (job_asr, audio) = (asr.clone(), audio.to_vec());
        match std::thread::Builder::new().name("early-asr".into()).spawn(move || job_asr.transcribe(&audio)) {
            Ok(handle) => self.job = Some(Job { at, handle, asr: asr.clone() }),
            Err(e) => eprintln!("omni-cascade: no thread for the early transcription ({e}); it waits for the endpoint"),
        }
    }

    /// The early job's words, when it heard the whole utterance (the same one, with as much
    /// speech as when it started: `at`) and was not cut short; waits for it to end either way.
    pub(crate) fn take(&mut self, at: Point) -> Option<String> {
        let job = self.job.take()?;
        if job.at != at {
            job.asr.abort(); // its words are of no use: the sooner it ends, the better
        }
        let result = job.handle.join().ok()?;
        match result {
            Ok(Heard::Text(text)) if job.at == at => Some(text),
            _ => None,
        }
    }

    /// Whether a job on the utterance as of `at` has ended (its words can be taken at once).
    pub(crate) fn finished(&self, at: Point) -> bool {
        self.job.as_ref().is_some_and(|job| job.at == at && job.handle.is_finished())
    }

    /// Ends any job in flight (cuts it short and waits for it: the recogniser is then free).
    pub(crate) fn discard(&mut self) {
        if let Some(job) = self.job.take() {
            job.asr.abort();
            let _ = job.handle.join();
        }
    }
}

impl Drop for EarlyAsr {
    /// A job never outlives its engine (nor the library it runs in, once the worker closes).
    fn drop(&mut self) {
        self.discard();
    }
}
