//! The session's configuration as the driver keeps it: typed, whatever wire shape it came in
//! (a codec validates a client's update and hands the driver the whole next configuration).

use omni_actors::domain::{Generation, SessionKind, SessionSetup};
use omni_actors::edge::vad::EdgeRules;
use serde_json::Value;

use crate::dialect::settings::Settings;

/// Server VAD as the client set it.
#[derive(Debug, Clone, PartialEq)]
pub struct Vad {
    /// `server_vad` or `semantic_vad`.
    pub kind: String,
    pub threshold: f64,
    pub prefix_padding_ms: u64,
    pub silence_duration_ms: u64,
}

/// The session configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Conf {
    pub instructions: String,
    pub voice: String,
    /// Answers are spoken (else text only).
    pub audio_out: bool,
    /// Server VAD; `None`: the client commits its turns and asks for answers (manual).
    pub vad: Option<Vad>,
    /// As the client gave it (a float32 would echo 0.8 as 0.800000011920929).
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// The rate of the client's audio in its events.
    pub input_rate: u32,
    /// The transcription of the user's speech as the client set it; `None`: no transcripts.
    pub transcription: Option<Value>,
    /// Generation settings by name (top_p, top_k, seed...), for the backend.
    pub settings: Settings,
}

impl Conf {
    /// What the backend is prepared with: duplex steps under server VAD, turns without.
    pub fn setup(&self) -> SessionSetup {
        let mut s = SessionSetup::new(if self.vad.is_some() { SessionKind::Duplex } else { SessionKind::Turn });
        s.system_prompt = self.instructions.clone();
        s.voice = self.voice.clone();
        s.generation = Generation {
            max_new_tokens: self.max_tokens,
            temperature: self.temperature.map(|t| t as f32),
            settings: self.settings.for_backend(),
            ..Generation::default()
        };
        s
    }

    /// Server VAD's settings, as the detector's rules take them.
    pub fn edge_rules(&self) -> Option<EdgeRules> {
        self.vad.as_ref().map(|v| EdgeRules {
            threshold: v.threshold as f32,
            prefix_padding_ms: v.prefix_padding_ms.min(u32::MAX as u64) as u32,
            silence_duration_ms: v.silence_duration_ms.min(u32::MAX as u64) as u32,
        })
    }
}
