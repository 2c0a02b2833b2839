//! `[queue]`: how many may wait, and how they are told.

use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

use super::check::{Invalid, positive};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    pub max_waiting: usize,
    pub update_interval_s: f64,
    /// How long a session of each mode is assumed to last before any has ended; the ETA
    /// then blends in the lengths measured as sessions end.
    pub typical_chat_s: f64,
    pub typical_video_s: f64,
    pub typical_audio_s: f64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_waiting: 1000,
            update_interval_s: 3.0,
            typical_chat_s: 60.0,
            typical_video_s: 120.0,
            typical_audio_s: 120.0,
        }
    }
}

impl QueueConfig {
    /// The length assumed for a session of `mode` before any has ended.
    pub fn typical(&self, mode: Mode) -> Duration {
        Duration::from_secs_f64(match mode {
            Mode::Chat => self.typical_chat_s,
            Mode::Video => self.typical_video_s,
            Mode::Audio => self.typical_audio_s,
        })
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        positive("update_interval_s", self.update_interval_s)?;
        positive("typical_chat_s", self.typical_chat_s)?;
        positive("typical_video_s", self.typical_video_s)?;
        positive("typical_audio_s", self.typical_audio_s)
    }
}
