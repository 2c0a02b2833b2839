//! Voice activity: when the user speaks, and when they have stopped.
//!
//! An energy detector over 20 ms windows of the 16 kHz input: a window is voiced when its RMS
//! reaches `threshold`. An utterance starts with the first voiced window and ends (the
//! endpoint) when at least `min_speech_ms` of it was voiced and the last `silence_ms` were
//! not. Plain data, tested without a model.

pub const RATE: usize = 16000;
const WINDOW: usize = RATE / 50; // 20 ms

#[derive(Debug, Clone, Copy)]
pub struct VadConfig {
    pub threshold: f32,
    pub min_speech_ms: u32,
    pub silence_ms: u32,
}

#[derive(Debug, Default)]
pub struct Vad {
    /// Voiced milliseconds in the current utterance (0: no utterance).
    pub speech_ms: u32,
    /// Unvoiced milliseconds since the last voiced window of the utterance.
    pub silence_ms: u32,
    /// Voiced milliseconds in the last chunk (for barge-in).
    pub chunk_voiced_ms: u32,
}

impl Vad {
    /// Feeds one chunk; returns true when the utterance has just ended (the endpoint).
    pub fn push(&mut self, config: &VadConfig, audio: &[f32]) -> bool {
        let thr2 = config.threshold * config.threshold;
        self.chunk_voiced_ms = 0;
        let mut ended = false;
        for window in audio.chunks(WINDOW) {
            let ms = (window.len() * 1000 / RATE) as u32;
            let energy = window.iter().map(|s| s * s).sum::<f32>() / window.len() as f32;
            if energy >= thr2 {
                self.speech_ms += ms;
                self.silence_ms = 0;
                self.chunk_voiced_ms += ms;
            } else if self.speech_ms > 0 {
                self.silence_ms += ms;
                if self.speech_ms >= config.min_speech_ms && self.silence_ms >= config.silence_ms {
                    ended = true;
                }
            }
        }
        ended
    }

    /// Someone is speaking (an utterance has started and not ended).
    pub fn in_speech(&self) -> bool {
        self.speech_ms > 0
    }

    pub fn clear(&mut self) {
        *self = Vad::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: VadConfig = VadConfig { threshold: 0.02, min_speech_ms: 300, silence_ms: 500 };

    fn tone(ms: usize) -> Vec<f32> {
        (0..ms * 16).map(|i| 0.3 * (i as f32 * 0.08).sin()).collect()
    }

    #[test]
    fn an_utterance_ends_after_enough_silence() {
        let mut v = Vad::default();
        assert!(!v.push(&CONFIG, &vec![0.0; 16000]), "silence alone is no utterance");
        assert!(!v.in_speech());
        let mut chunk = tone(600);
        chunk.extend(vec![0.0; 400 * 16]);
        assert!(!v.push(&CONFIG, &chunk), "400 ms of silence is a pause, not the end");
        assert!(v.in_speech());
        assert!(v.push(&CONFIG, &vec![0.0; 16000]));
    }

    #[test]
    fn a_click_is_not_speech() {
        let mut v = Vad::default();
        let mut chunk = tone(100);
        chunk.extend(vec![0.0; 15000]);
        assert!(!v.push(&CONFIG, &chunk), "100 ms of sound is below min_speech_ms");
        assert_eq!(v.chunk_voiced_ms, 100);
    }
}
