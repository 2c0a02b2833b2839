//! Voice activity: when the user speaks, and when they have stopped.
//!
//! Each window of the 16 kHz input is voiced, silent, or in between, by the detector the
//! options name: Silero VAD (`vad = "silero"`, the default: 32 ms windows, voiced from
//! probability `vad_probability`, silent below it less 0.15, as the gateway's detector) or
//! loudness (`vad = "energy"`: 20 ms windows, voiced from RMS `vad_threshold`, silent below it).
//! An utterance starts with the first voiced window and ends (the endpoint) when at least
//! `min_speech_ms` of it was voiced and the last `silence_ms` were silent; windows in between
//! neither add to the speech nor to the silence. For barge-in, it also counts the voiced
//! milliseconds of the last second since the last endpoint, whatever the chunk size. Plain data
//! over the detector, tested without a model.

use std::collections::VecDeque;

use omni_vad_silero::Silero;

pub(crate) const RATE: usize = 16000;

#[derive(Debug, Clone, Copy)]
pub(crate) struct VadConfig {
    pub min_speech_ms: u32,
    pub silence_ms: u32,
}

/// What says whether a window is speech.
pub(crate) enum Detector {
    Energy { threshold: f32 },
    Silero { silero: Box<Silero>, probability: f32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    Voiced,
    Silent,
    Between,
}

impl Detector {
    fn size(&self) -> usize {
        match self {
            Detector::Energy { .. } => RATE / 50,
            Detector::Silero { .. } => omni_vad_silero::WINDOW,
        }
    }

    fn classify(&mut self, window: &[f32]) -> Result<Window, String> {
        match self {
            Detector::Energy { threshold } => {
                let energy = window.iter().map(|s| s * s).sum::<f32>() / window.len().max(1) as f32;
                Ok(if energy >= *threshold * *threshold { Window::Voiced } else { Window::Silent })
            }
            Detector::Silero { silero, probability } => {
                let p = silero.probability(window).map_err(|e| e.to_string())?;
                Ok(if p >= *probability {
                    Window::Voiced
                } else if p < (*probability - 0.15).max(*probability / 2.0) {
                    Window::Silent
                } else {
                    Window::Between
                })
            }
        }
    }

    fn reset(&mut self) {
        if let Detector::Silero { silero, .. } = self {
            silero.reset();
        }
    }
}

pub(crate) struct Vad {
    detector: Detector,
    /// Input not yet a whole window.
    pending: Vec<f32>,
    /// Voiced milliseconds in the current utterance (0: no utterance).
    pub speech_ms: u32,
    /// Silent milliseconds since the last voiced window of the utterance.
    pub silence_ms: u32,
    /// The last second's windows since the last endpoint: the voiced milliseconds of each (0
    /// for the others), for barge-in.
    recent: VecDeque<u32>,
    /// Their sum.
    recent_voiced_ms: u32,
}

/// How far back barge-in counts voiced windows.
const RECENT_MS: usize = 1000;

impl Vad {
    pub(crate) fn new(detector: Detector) -> Vad {
        Vad { detector, pending: Vec::new(), speech_ms: 0, silence_ms: 0, recent: VecDeque::new(), recent_voiced_ms: 0 }
    }

    /// Voiced milliseconds in the last second, since the last endpoint (for barge-in).
    pub(crate) fn recent_voiced_ms(&self) -> u32 {
        self.recent_voiced_ms
    }

    fn remember(&mut self, voiced_ms: u32, window_ms: u32) {
        self.recent.push_back(voiced_ms);
        self.recent_voiced_ms += voiced_ms;
        // At least a second: the windows that reach a second back (32 of Silero's 32 ms).
        while (self.recent.len() - 1) * window_ms as usize >= RECENT_MS {
            self.recent_voiced_ms -= self.recent.pop_front().unwrap_or(0);
        }
    }

    fn forget_recent(&mut self) {
        self.recent.clear();
        self.recent_voiced_ms = 0;
    }

    /// Feeds one chunk; returns true when the utterance has just ended (the endpoint).
    pub(crate) fn push(&mut self, config: &VadConfig, audio: &[f32]) -> Result<bool, String> {
        let size = self.detector.size();
        self.pending.extend_from_slice(audio);
        let mut ended = false;
        let mut at = 0;
        while self.pending.len() - at >= size {
            let window = &self.pending[at..at + size];
            at += size;
            let ms = (size * 1000 / RATE) as u32;
            let class = self.detector.classify(window)?;
            self.remember(if class == Window::Voiced { ms } else { 0 }, ms);
            match class {
                Window::Voiced => {
                    self.speech_ms += ms;
                    self.silence_ms = 0;
                }
                Window::Silent if self.speech_ms > 0 => {
                    self.silence_ms += ms;
                    if self.speech_ms >= config.min_speech_ms && self.silence_ms >= config.silence_ms {
                        ended = true;
                        // The utterance's own speech is no barge-in over its answer.
                        self.forget_recent();
                    }
                }
                _ => {}
            }
        }
        self.pending.drain(..at);
        Ok(ended)
    }

    /// Someone is speaking (an utterance has started and not ended).
    pub(crate) fn in_speech(&self) -> bool {
        self.speech_ms > 0
    }

    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.speech_ms = 0;
        self.silence_ms = 0;
        self.forget_recent();
        self.detector.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: VadConfig = VadConfig { min_speech_ms: 300, silence_ms: 500 };

    fn energy() -> Vad {
        Vad::new(Detector::Energy { threshold: 0.02 })
    }

    fn tone(ms: usize) -> Vec<f32> {
        (0..ms * 16).map(|i| 0.3 * (i as f32 * 0.08).sin()).collect()
    }

    #[test]
    fn an_utterance_ends_after_enough_silence() {
        let mut v = energy();
        assert!(!v.push(&CONFIG, &vec![0.0; 16000]).unwrap(), "silence alone is no utterance");
        assert!(!v.in_speech());
        let mut chunk = tone(600);
        chunk.extend(vec![0.0; 400 * 16]);
        assert!(!v.push(&CONFIG, &chunk).unwrap(), "400 ms of silence is a pause, not the end");
        assert!(v.in_speech());
        assert!(v.push(&CONFIG, &vec![0.0; 16000]).unwrap());
    }

    #[test]
    fn a_click_is_not_speech() {
        let mut v = energy();
        let mut chunk = tone(100);
        chunk.extend(vec![0.0; 15000]);
        assert!(!v.push(&CONFIG, &chunk).unwrap(), "100 ms of sound is below min_speech_ms");
        // 1,037 ms in all: the last second holds the click's last 80 ms.
        assert_eq!(v.recent_voiced_ms(), 80);
    }

    #[test]
    fn barge_in_counts_the_last_second_whatever_the_chunks() {
        let mut v = energy();
        // An utterance that ends: its speech does not count afterwards.
        v.push(&CONFIG, &tone(600)).unwrap();
        assert_eq!(v.recent_voiced_ms(), 600);
        assert!(v.push(&CONFIG, &vec![0.0; 500 * 16]).unwrap());
        assert_eq!(v.recent_voiced_ms(), 0);
        // Then 400 ms of speech in 200 ms chunks, as in 1 s chunks.
        v.push(&CONFIG, &tone(200)).unwrap();
        v.push(&CONFIG, &tone(200)).unwrap();
        assert_eq!(v.recent_voiced_ms(), 400);
        let mut second = tone(400);
        second.extend(vec![0.0; 400 * 16]);
        let mut w = energy();
        w.push(&CONFIG, &second).unwrap();
        assert_eq!(w.recent_voiced_ms(), 400);
        // A second later, it has gone by.
        v.push(&CONFIG, &vec![0.0; 16000]).unwrap();
        assert_eq!(v.recent_voiced_ms(), 0);
    }

    #[test]
    fn windows_span_chunks() {
        let mut v = energy();
        // 10 ms pieces: two make a window.
        for _ in 0..30 {
            v.push(&CONFIG, &tone(10)).unwrap();
        }
        assert_eq!(v.speech_ms, 300);
    }
}
