//! A speech recogniser the gateway runs itself, for backends that report no transcript of
//! what the user said (the server's: Whisper through `libomni_asr_whisper.so`).

use std::sync::Arc;

pub trait Transcriber: Send {
    /// The words in 16 kHz mono audio; an error says why there are none.
    fn transcribe(&mut self, audio: &[f32]) -> Result<String, String>;
}

/// Opens a recogniser (one per transcription thread: each holds its own model state).
pub type OpenTranscriber = Arc<dyn Fn() -> Result<Box<dyn Transcriber>, String> + Send + Sync>;
