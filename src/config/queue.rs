//! `[queue]`: how many may wait, and how they are told.

use std::time::Duration;

use omni_actors::domain::Mode;
use serde::Deserialize;

use omni_actors::settings::{Invalid, positive};

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
    /// A client waits this long for a worker of its mode to be in sight (one opening, a node
    /// not reached yet, a failed one reopened) before it is refused `service_unavailable`. A
    /// mode nothing is configured to serve is refused at once.
    pub unavailable_after_s: f64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_waiting: 1000,
            update_interval_s: 3.0,
            typical_chat_s: 60.0,
            typical_video_s: 120.0,
            typical_audio_s: 120.0,
            unavailable_after_s: 30.0,
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
        positive("typical_audio_s", self.typical_audio_s)?;
        positive("unavailable_after_s", self.unavailable_after_s)
    }

    /// How long a client waits for a worker of its mode to be in sight.
    pub fn unavailable_after(&self) -> Duration {
        Duration::from_secs_f64(self.unavailable_after_s)
    }
}
