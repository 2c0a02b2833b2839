//! omni-dialects: the wire formats clients speak, JSON in and out, on the actors' domain types,
//! and what the gateway itself does with a session's input for them (its voice activity
//! detection and its transcription). It depends on the actors crate only: a dialect is a
//! [`omni_actors::edge::dialect::Dialect`], chosen by the server for each session.
//!
//! - `minicpm`: the MiniCPM-o Realtime API (`session.init`, `input.append`, ...).
//! - `legacy`: the earlier MiniCPM-o duplex dialect (`session.update`, `input_audio_buffer.append`).
//! - `openai`: the OpenAI Realtime API shape (GA, beta) and Qwen-Omni-Realtime: a codec over
//! - `conversation`: the conversation driver those flavors share (items, turns, responses,
//!   pacing, input held before the session is created), on typed commands and events.
//! - `select`: which dialect a connection speaks.
//! - `settings`: generation settings by name, checked and passed to the backend.
//! - `speech`: the user's speech in the input, as the gateway's voice activity detector finds it.
//! - `wire`: helpers every JSON dialect shares.
//! - `vad`: the voice activity detectors the dialects run on a session's input (the OpenAI
//!   shapes' server VAD; a MiniCPM-o session the gateway transcribes): loudness, or Silero VAD.
//! - `transcription`: the gateway's own speech recogniser (Whisper), for backends that do not
//!   transcribe the user.

use omni_actors::audio::AudioLimits;

pub mod conversation;
pub mod legacy;
pub mod minicpm;
pub mod openai;
pub mod record;
pub mod select;
pub mod settings;
pub mod speech;
pub mod transcription;
pub mod vad;
pub mod wire;

/// What a client may send, and make a dialect hold on its behalf, from `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Fewest 16 kHz samples in one duplex chunk.
    pub min_audio_samples: usize,
    /// Reference voices (WAV files or raw PCM).
    pub reference: AudioLimits,
    /// Bytes a dialect may hold for one client: audio not yet committed, conversation
    /// items and images not yet answered, replies held until the session is created.
    pub max_buffered_bytes: usize,
    /// The same, for a session whose worker it has not got yet (a queued client holds less).
    pub max_waiting_bytes: usize,
    /// What every session's dialect may hold together (one budget for the process).
    pub max_total_bytes: usize,
    /// Turn-mode answers a session may have outstanding: one in progress and the rest waiting.
    pub max_turns: usize,
}

impl Default for Limits {
    /// The defaults of `config.toml`.
    fn default() -> Self {
        Limits {
            min_audio_samples: 4000,
            reference: AudioLimits { max_seconds: 30.0 },
            max_buffered_bytes: 16 << 20,
            max_waiting_bytes: 4 << 20,
            max_total_bytes: 1 << 30,
            max_turns: 5,
        }
    }
}
