//! `[limits]`: what one session may take.

use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

use omni_actors::settings::{Invalid, positive};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub chat_session_s: f64,
    pub video_session_s: f64,
    pub audio_session_s: f64,
    pub context_tokens: u64,
    pub min_audio_samples: usize,
    pub max_pending_chunks: usize,
    pub step_timeout_ms: u64,
    /// A backend's open slower than this fails the worker (models take minutes to load).
    pub open_timeout_s: f64,
    /// The longest reference voice a client may send (`session.init` voice fields, legacy
    /// `session.update` WAVs, chat TTS references), in seconds.
    pub max_reference_audio_s: f64,
    /// What the server holds for one client before its events are refused (`buffer_full`):
    /// audio not yet committed, items and images not yet answered, replies held while queued.
    pub max_buffered_mb: f64,
    /// The same for a client still waiting for a worker (queued).
    pub max_buffered_waiting_mb: f64,
    /// What all sessions together may make the server hold so (one budget for the process).
    pub max_buffered_total_mb: f64,
    /// Chat answers a session may have waiting behind the one in progress.
    pub max_pending_turns: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            chat_session_s: 600.0,
            video_session_s: 300.0,
            audio_session_s: 600.0,
            context_tokens: 8192,
            min_audio_samples: 4000,
            max_pending_chunks: 2,
            step_timeout_ms: 15000,
            open_timeout_s: 300.0,
            max_reference_audio_s: 30.0,
            max_buffered_mb: 16.0,
            max_buffered_waiting_mb: 4.0,
            max_buffered_total_mb: 1024.0,
            max_pending_turns: 4,
        }
    }
}

impl LimitsConfig {
    /// The session time limit of a public mode, counted from the upgrade.
    pub fn session_limit(&self, mode: Mode) -> Duration {
        Duration::from_secs_f64(match mode {
            Mode::Chat => self.chat_session_s,
            Mode::Video => self.video_session_s,
            Mode::Audio => self.audio_session_s,
        })
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        positive("chat_session_s", self.chat_session_s)?;
        positive("video_session_s", self.video_session_s)?;
        positive("audio_session_s", self.audio_session_s)?;
        positive("context_tokens", self.context_tokens as f64)?;
        positive("min_audio_samples", self.min_audio_samples as f64)?;
        positive("max_pending_chunks", self.max_pending_chunks as f64)?;
        positive("step_timeout_ms", self.step_timeout_ms as f64)?;
        positive("open_timeout_s", self.open_timeout_s)?;
        positive("max_reference_audio_s", self.max_reference_audio_s)?;
        positive("max_buffered_mb", self.max_buffered_mb)?;
        positive("max_buffered_waiting_mb", self.max_buffered_waiting_mb)?;
        positive("max_buffered_total_mb", self.max_buffered_total_mb)
    }
}
