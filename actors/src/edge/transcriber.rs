//! A speech recogniser the gateway runs itself, for backends that report no transcript of
//! what the user said (the server's: Whisper through `libomni_asr_whisper.so`).

use std::sync::Arc;

/// Why a user item has no transcript.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscriptionError {
    /// The recogniser did not open (the library or the model: its error).
    #[error("the recogniser did not open: {0}")]
    NotOpen(String),
    /// The recogniser failed on the audio (its error).
    #[error("{0}")]
    Failed(String),
    /// More items wait than the recogniser takes (`[transcription] max_waiting`).
    #[error("the gateway's transcription is behind ({waiting} items waiting); this one is skipped")]
    Behind {
        /// Items waiting or being transcribed.
        waiting: usize,
    },
}

/// A speech recogniser.
pub trait Transcriber: Send {
    /// The words in 16 kHz mono audio; an error says why there are none.
    fn transcribe(&mut self, audio: &[f32]) -> Result<String, TranscriptionError>;
}

/// Opens a recogniser (one per transcription thread: each holds its own model state).
pub type OpenTranscriber = Arc<dyn Fn() -> Result<Box<dyn Transcriber>, TranscriptionError> + Send + Sync>;
