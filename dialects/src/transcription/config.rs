//! `[transcription]`: the gateway's own speech recogniser (Whisper through
//! `libomni_asr_whisper.so`, built by `cargo build --release -p omni-asr-whisper`), for
//! backends that report no transcript of the user's speech (MiniCPM-o workers, the reference
//! backend at revision 0). Off unless enabled. Backends that transcribe keep their own.

use std::path::PathBuf;

use serde::Deserialize;

use crate::vad::config::expand_models_path;
use omni_actors::settings::{Base, Invalid};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TranscriptionConfig {
    pub enabled: bool,
    /// The recogniser's library; empty: `libomni_asr_whisper.so` beside the gateway's binary.
    pub library: String,
    /// A whisper.cpp model.
    pub model: String,
    /// Recognisers running side by side (each with its own copy of the model's state).
    pub threads: usize,
    /// Items waiting or being transcribed, at most; past it an item's transcription fails at
    /// once ("behind").
    pub max_waiting: usize,
}

impl Default for TranscriptionConfig {
    fn default() -> Self {
        TranscriptionConfig {
            enabled: false,
            library: String::new(),
            model: "$OMNI_MODELS/ggml-tiny.en.bin".into(),
            threads: 1,
            max_waiting: 16,
        }
    }
}

/// `[transcription]` resolved, when it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptionSpec {
    pub library: PathBuf,
    pub model: PathBuf,
    pub threads: usize,
    pub max_waiting: usize,
}

impl TranscriptionConfig {
    pub fn validate(&self, base: Base<'_>) -> Result<Option<TranscriptionSpec>, Invalid> {
        if !(1..=16).contains(&self.threads) {
            return Err(Invalid::new("threads", "must be from 1 to 16"));
        }
        if self.max_waiting == 0 {
            return Err(Invalid::new("max_waiting", "must be at least 1"));
        }
        if !self.enabled {
            return Ok(None);
        }
        let library = if self.library.is_empty() {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|d| d.join("libomni_asr_whisper.so")))
                .unwrap_or_else(|| PathBuf::from("libomni_asr_whisper.so"))
        } else {
            expand_models_path(&self.library, base)
        };
        if !library.is_file() {
            return Err(Invalid::new(
                "library",
                format!("no such file: {} (cargo build --release -p omni-asr-whisper builds it)", library.display()),
            ));
        }
        let model = expand_models_path(&self.model, base);
        if !model.is_file() {
            return Err(Invalid::new(
                "model",
                format!(
                    "no such file: {} (python3 scripts/fetch-models.py fetches Whisper tiny.en into {})",
                    model.display(),
                    crate::vad::config::models_dir().display()
                ),
            ));
        }
        Ok(Some(TranscriptionSpec { library, model, threads: self.threads, max_waiting: self.max_waiting }))
    }
}
