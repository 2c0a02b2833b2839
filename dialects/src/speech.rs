//! The user's speech in one session's 16 kHz input, as the gateway's voice activity detector
//! (`[vad]`) finds it: the edges of speech, window by window under [`SpeechEdges`]' rules, and
//! the speech itself, kept while the gateway's transcription wants it. The OpenAI-shaped
//! dialects decide their server VAD events with it; the MiniCPM-o dialect finds the turns it
//! transcribes for a backend that does not.

use std::collections::VecDeque;

use omni_actors::edge::vad::{Edge, EdgeRules, SharedDetectors, SpeechEdges, VoiceDetector};
use omni_actors::transcribe::MAX_SECONDS;

/// Audio kept for the transcription after speech ends (the detector reports the end of the
/// last voiced window; a word's tail can be quieter).
const TAIL_MS: u64 = 200;
/// Audio kept before speech starts beyond the padding (speech is found after its onset).
const ONSET_KEPT_MS: usize = 500;

pub struct SpeechFinder {
    detector: Box<dyn VoiceDetector>,
    /// Input not yet a whole window of the detector.
    window: Vec<f32>,
    edges: SpeechEdges,
    /// 16 kHz samples heard.
    received: u64,
    /// For the transcription: the input from `spoken_from` (a sample index) on, bounded by
    /// [`SpeechFinder::trim`].
    spoken: VecDeque<f32>,
    spoken_from: u64,
}

impl SpeechFinder {
    pub fn new(voice: &SharedDetectors) -> SpeechFinder {
        SpeechFinder {
            detector: voice.detector(),
            window: Vec::new(),
            edges: SpeechEdges::default(),
            received: 0,
            spoken: VecDeque::new(),
            spoken_from: 0,
        }
    }

    /// Hears `samples`: the edges of speech they complete, in order. With `keep` they are kept
    /// for [`SpeechFinder::speech`] (before the detector sees them, so that a turn ending in
    /// them has all of its audio); without, what was kept is dropped.
    pub fn hear(&mut self, samples: &[f32], rules: &EdgeRules, keep: bool) -> Vec<Edge> {
        self.received += samples.len() as u64;
        if keep {
            self.spoken.extend(samples);
        } else {
            self.spoken.clear();
        }
        self.spoken_from = self.received - self.spoken.len() as u64;
        let size = self.detector.window();
        self.window.extend_from_slice(samples);
        let (mut at, mut found) = (0, Vec::new());
        while self.window.len() - at >= size {
            let p = self.detector.probability(&self.window[at..at + size]);
            at += size;
            found.extend(self.edges.push(rules, p, size));
        }
        self.window.drain(..at);
        found
    }

    /// Bounds what is kept: in a turn, up to [`MAX_SECONDS`] of it; outside, the padding and
    /// the onset.
    pub fn trim(&mut self, in_turn: bool, prefix_padding_ms: u32) {
        let keep = if in_turn { MAX_SECONDS * 16000 } else { (prefix_padding_ms as usize + ONSET_KEPT_MS) * 16 };
        let excess = self.spoken.len().saturating_sub(keep);
        self.spoken.drain(..excess);
        self.spoken_from += excess as u64;
    }

    /// The kept speech from `start_ms` to `end_ms` and a little after, to transcribe.
    pub fn speech(&self, start_ms: u64, end_ms: u64) -> Vec<f32> {
        let from = (start_ms * 16).saturating_sub(self.spoken_from) as usize;
        let to = ((end_ms + TAIL_MS) * 16).saturating_sub(self.spoken_from) as usize;
        self.spoken.iter().skip(from).take(to.saturating_sub(from)).copied().collect()
    }

    /// Milliseconds of input heard.
    pub fn received_ms(&self) -> u64 {
        self.received * 1000 / 16000
    }

    /// Speech has started and not stopped.
    pub fn in_speech(&self) -> bool {
        self.edges.in_speech()
    }

    /// The end of the last voiced window of the speech in progress (or of the last speech).
    pub fn speech_end_ms(&self) -> u64 {
        self.edges.speech_end_ms()
    }

    /// The speech in progress ends without a `Stopped` edge: the model took the floor.
    pub fn end(&mut self) {
        self.edges.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::edge::vad::VoiceDetectors;
    use std::sync::Arc;

    /// Loud samples are speech.
    struct Loud;
    impl VoiceDetector for Loud {
        fn window(&self) -> usize {
            160
        }
        fn probability(&mut self, w: &[f32]) -> f32 {
            if w.iter().any(|s| s.abs() > 0.1) { 1.0 } else { 0.0 }
        }
    }
    impl VoiceDetectors for Loud {
        fn detector(&self) -> Box<dyn VoiceDetector> {
            Box::new(Loud)
        }
    }

    const RULES: EdgeRules = EdgeRules { threshold: 0.5, prefix_padding_ms: 100, silence_duration_ms: 300 };

    #[test]
    fn finds_a_turn_and_keeps_its_audio() {
        let voice: SharedDetectors = Arc::new(Loud);
        let mut f = SpeechFinder::new(&voice);
        let mut edges = Vec::new();
        // 1 s of silence, 0.5 s of speech, 1 s of silence, in 100 ms pieces of odd sizes.
        let mut audio = vec![0.0f32; 16000];
        audio.extend(vec![0.5f32; 8000]);
        audio.extend(vec![0.0f32; 16000]);
        let mut speech = Vec::new();
        for piece in audio.chunks(1601) {
            for edge in f.hear(piece, &RULES, true) {
                if let Edge::Stopped { audio_end_ms } = edge {
                    speech = f.speech(900, audio_end_ms); // as a dialect takes it, at the edge
                }
                edges.push(edge);
            }
            f.trim(f.in_speech(), RULES.prefix_padding_ms);
        }
        assert_eq!(edges, [Edge::Started { audio_start_ms: 900 }, Edge::Stopped { audio_end_ms: 1500 }]);
        assert_eq!(speech.len(), (1500 + TAIL_MS as usize - 900) * 16);
        assert_eq!(speech.iter().filter(|s| **s > 0.1).count(), 8000, "all of the speech");
        assert_eq!(f.received_ms(), 2500);
    }

    #[test]
    fn keeps_nothing_unless_asked_and_little_outside_speech() {
        let voice: SharedDetectors = Arc::new(Loud);
        let mut f = SpeechFinder::new(&voice);
        f.hear(&[0.0; 16000], &RULES, false);
        assert!(f.speech(0, 1000).is_empty());
        f.hear(&[0.0; 32000], &RULES, true);
        f.trim(false, RULES.prefix_padding_ms);
        assert_eq!(f.speech(0, 3000).len(), (100 + ONSET_KEPT_MS) * 16);
    }
}
