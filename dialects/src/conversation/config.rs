//! The session's configuration as the driver keeps it: typed, whatever wire shape it came in
//! (a codec validates a client's update and hands the driver the whole next configuration).

use omni_actors::domain::{BackendInfo, Generation, SessionKind, SessionSetup, SetupField, Tools};
use omni_actors::edge::vad::EdgeRules;
use serde_json::Value;

use crate::settings::Settings;

/// Server VAD as the client set it.
#[derive(Debug, Clone, PartialEq)]
pub struct Vad {
    /// `server_vad` or `semantic_vad`.
    pub kind: String,
    pub threshold: f64,
    pub prefix_padding_ms: u64,
    pub silence_duration_ms: u64,
    /// Semantic VAD's eagerness (`low`, `medium`, `high`, `auto`): the silence that ends a turn
    /// ([`Vad::silence_ms`]).
    pub eagerness: Option<String>,
    /// The end of the user's speech starts a response (else the client asks for each).
    pub create_response: bool,
    /// The user's speech cuts the response in progress short.
    pub interrupt_response: bool,
    /// After this long without speech once the model is done, the silence becomes a user turn
    /// and is answered (`input_audio_buffer.timeout_triggered`).
    pub idle_timeout_ms: Option<u64>,
}

impl Vad {
    /// The silence that ends the user's turn: semantic VAD's eagerness maps onto it (`high`
    /// 250 ms, `medium` and `auto` 500 ms, `low` 1000 ms), server VAD takes the client's.
    pub fn silence_ms(&self) -> u64 {
        match (self.kind.as_str(), self.eagerness.as_deref()) {
            ("semantic_vad", Some("high")) => 250,
            ("semantic_vad", Some("low")) => 1000,
            ("semantic_vad", _) => 500,
            _ => self.silence_duration_ms,
        }
    }
}

/// What becomes of the oldest items when the model's context is full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Truncation {
    /// The oldest items are dropped until half the conversation is left (`auto`).
    Auto,
    /// The oldest items are dropped until this share of the conversation is left.
    Retain(f64),
    /// A full context ends the session (`disabled`).
    Disabled,
}

impl Truncation {
    /// The share of the conversation kept when the context is full; `None`: none (the session ends).
    pub fn keep(self) -> Option<f64> {
        match self {
            Truncation::Auto => Some(0.5),
            Truncation::Retain(r) => Some(r),
            Truncation::Disabled => None,
        }
    }
}

/// The session configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Conf {
    pub instructions: String,
    pub voice: String,
    /// The client named a voice (`voice` is otherwise the dialect's default).
    pub voice_named: bool,
    /// Answers are spoken (else text only).
    pub audio_out: bool,
    /// Server VAD; `None`: the client commits its turns and asks for answers (manual).
    pub vad: Option<Vad>,
    /// As the client gave it (a float32 would echo 0.8 as 0.800000011920929).
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// The rate of the client's audio in its events.
    pub input_rate: u32,
    /// How the client's audio is coded in its events (16-bit PCM, or G.711 at 8 kHz).
    pub input_coding: Coding,
    /// How the model's voice is coded in the events to the client.
    pub output_coding: Coding,
    /// The transcription of the user's speech as the client set it; `None`: no transcripts.
    pub transcription: Option<Value>,
    /// Generation settings by name (top_p, top_k, seed...), for the backend.
    pub settings: Settings,
    /// The tools the model may call, and the choice among them.
    pub tools: Tools,
    pub truncation: Truncation,
    /// Settings the client gave that no model here applies, by their names on the wire, with
    /// the value to echo (`noise_reduction`, `speed`, `tracing`...).
    pub unapplied: Vec<(String, Value)>,
}

/// How audio is coded in a dialect's events: 16-bit PCM, or G.711 (8 kHz) μ-law or A-law.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Coding {
    #[default]
    Pcm16,
    G711(omni_actors::audio::g711::Law),
}

/// Settings echoed and not reported as unapplied: they ask nothing of the model. `tracing`
/// names where OpenAI files a session's traces (the Agents SDK sends it on every connect); the
/// gateway's own logs and events are its trace.
const QUIETLY_UNAPPLIED: [&str; 1] = ["tracing"];

impl Conf {
    /// What the backend is prepared with: duplex steps under server VAD, turns without (a
    /// backend that calls no tools is given none by its host).
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
        s.tools = self.tools.clone();
        s
    }

    /// Server VAD's settings, as the detector's rules take them.
    pub fn edge_rules(&self) -> Option<EdgeRules> {
        self.vad.as_ref().map(|v| EdgeRules {
            threshold: v.threshold as f32,
            prefix_padding_ms: v.prefix_padding_ms.min(u32::MAX as u64) as u32,
            silence_duration_ms: v.silence_ms().min(u32::MAX as u64) as u32,
        })
    }

    /// The settings the client gave that `backend` does not apply, by name.
    pub fn unsupported(&self, backend: &BackendInfo) -> Vec<String> {
        let mut names = self.settings.unsupported(backend);
        if !self.tools.functions.is_empty() && !backend.tools {
            names.push("tools".into());
        }
        if self.voice_named && backend.ignored.contains(&SetupField::Voice) {
            names.push("voice".into());
        }
        names.extend(
            self.unapplied.iter().map(|(name, _)| name.clone()).filter(|n| !QUIETLY_UNAPPLIED.contains(&n.as_str())),
        );
        names
    }

    /// The echo of a setting no model applies, if the client gave it.
    pub fn unapplied(&self, name: &str) -> Option<&Value> {
        self.unapplied.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}
