//! The gateway's speech recogniser (`[transcription]`): Whisper through
//! `libomni_asr_whisper.so` (`backends/asr-client` loads it), behind the actors'
//! [`Transcriber`] trait, run by their transcription actor on threads of its own.

use std::sync::Arc;

use omni_actors::edge::transcriber::{OpenTranscriber, Transcriber, TranscriptionError};
use omni_actors::messages::transcribe::TranscriptionPort;
use omni_asr_client::{Asr, Heard};

pub mod config;

pub use config::{TranscriptionConfig, TranscriptionSpec};

struct Whisper(Asr);

impl Transcriber for Whisper {
    fn transcribe(&mut self, audio: &[f32]) -> Result<String, TranscriptionError> {
        match self.0.transcribe(audio).map_err(|e| TranscriptionError::Failed(e.to_string()))? {
            Heard::Text(text) => Ok(text.trim().to_string()),
            Heard::Aborted => Err(TranscriptionError::Failed("aborted".into())),
        }
    }
}

fn opener(spec: &TranscriptionSpec) -> OpenTranscriber {
    let spec = spec.clone();
    Arc::new(move || {
        let asr = Asr::open(&spec.library, &spec.model, 1).map_err(|e| TranscriptionError::NotOpen(e.to_string()))?;
        Ok(Box::new(Whisper(asr)) as Box<dyn Transcriber>)
    })
}

/// Opens the recogniser once and transcribes a second of silence (`serve` and `check-config`
/// refuse a library or model that does not load).
pub fn check(spec: &TranscriptionSpec) -> Result<(), TranscriptionError> {
    let mut t = opener(spec)()?;
    t.transcribe(&vec![0.0; 16000]).map(|_| ())
}

/// Starts the transcription actor (inside an actix system).
pub fn start(spec: &TranscriptionSpec) -> TranscriptionPort {
    TranscriptionPort::start(spec.threads, spec.max_waiting, opener(spec))
}
