//! The energy detector: a window's probability of speech is its loudness, RMS / 0.04 capped at
//! 1, so the default threshold 0.5 is an RMS of 0.02 (about -34 dBFS). It cannot tell speech
//! from any other sound; it needs no model.

use omni_actors::edge::vad::VoiceDetector;

/// 20 ms at 16 kHz.
pub const WINDOW: usize = 320;
/// The RMS that counts as probability 1.
const FULL_SCALE_RMS: f32 = 0.04;

#[derive(Debug, Default)]
pub struct EnergyDetector;

impl VoiceDetector for EnergyDetector {
    fn window(&self) -> usize {
        WINDOW
    }

    fn probability(&mut self, window: &[f32]) -> f32 {
        if window.is_empty() {
            return 0.0;
        }
        let rms = (window.iter().map(|s| s * s).sum::<f32>() / window.len() as f32).sqrt();
        (rms / FULL_SCALE_RMS).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loudness_is_the_probability() {
        let mut d = EnergyDetector;
        assert_eq!(d.probability(&[0.0; WINDOW]), 0.0);
        assert!((d.probability(&[0.02; WINDOW]) - 0.5).abs() < 1e-6);
        assert_eq!(d.probability(&[0.5; WINDOW]), 1.0);
        assert_eq!(d.probability(&[]), 0.0);
    }
}
