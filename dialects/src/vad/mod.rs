//! Voice activity detectors for the OpenAI-shaped dialects' server VAD, one per session, made
//! by the engine `[vad]` names: [`energy`](mod@energy) (loudness) or [`silero`] (Silero VAD). The rules
//! that turn their probabilities into speech events are the actors' (`edge::vad`).

use std::sync::Arc;

use omni_actors::edge::vad::{SharedDetectors, VoiceDetector, VoiceDetectors};

pub mod config;
pub mod energy;
pub mod silero;

pub use config::{VadConfig, VadEngine, VadSpec};

struct Energy;

impl VoiceDetectors for Energy {
    fn detector(&self) -> Box<dyn VoiceDetector> {
        Box::new(energy::EnergyDetector)
    }
}

/// The detectors of the configured engine.
pub fn detectors(spec: &VadSpec) -> SharedDetectors {
    match spec {
        VadSpec::Energy => Arc::new(Energy),
        VadSpec::Silero(model) => Arc::new(silero::SileroDetectors::new(model.clone())),
    }
}

/// The energy detector: what tests and dialects use when nothing is configured.
pub fn energy() -> SharedDetectors {
    Arc::new(Energy)
}

/// Why the configured detector cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VadError {
    /// Silero VAD's model (or ONNX Runtime) does not load or run: its error.
    #[error("vad: {0}")]
    Silero(String),
}

/// Loads the engine's model and runs it once (`serve` and `check-config` refuse a model that
/// does not load, rather than every session finding out).
pub fn check(spec: &VadSpec) -> Result<(), VadError> {
    match spec {
        VadSpec::Energy => Ok(()),
        VadSpec::Silero(model) => model.check().map_err(|e| VadError::Silero(e.to_string())),
    }
}
