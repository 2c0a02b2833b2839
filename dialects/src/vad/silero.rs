//! Silero VAD (`backends/vad-silero`) behind the actors' detector trait. A session's detector
//! keeps the model's state for its stream; the network runs on the session's own thread. Should
//! the model fail on a thread after the start-up check passed, that session falls back to the
//! energy detector and says so once in the log.

use omni_actors::edge::vad::{VoiceDetector, VoiceDetectors};
use omni_vad_silero::{Model, Silero, WINDOW};

use super::energy::EnergyDetector;

pub struct SileroDetectors {
    model: Model,
}

impl SileroDetectors {
    pub fn new(model: Model) -> SileroDetectors {
        SileroDetectors { model }
    }
}

impl VoiceDetectors for SileroDetectors {
    fn detector(&self) -> Box<dyn VoiceDetector> {
        Box::new(SileroDetector { silero: Silero::new(self.model.clone()), failed: None })
    }
}

struct SileroDetector {
    silero: Silero,
    /// Set once the model failed: the energy detector stands in.
    failed: Option<EnergyDetector>,
}

impl VoiceDetector for SileroDetector {
    fn window(&self) -> usize {
        WINDOW
    }

    fn probability(&mut self, window: &[f32]) -> f32 {
        if let Some(energy) = &mut self.failed {
            return energy.probability(window);
        }
        match self.silero.probability(window) {
            Ok(p) => p,
            Err(e) => {
                log::error!("vad: Silero failed ({e}); this session uses the energy detector");
                let mut energy = EnergyDetector;
                let p = energy.probability(window);
                self.failed = Some(energy);
                p
            }
        }
    }
}
