//! Voice activity: a detector that says how likely a window of audio is speech
//! ([`VoiceDetector`], implemented by the server: an energy detector, Silero VAD), and the
//! rules that turn those probabilities into the edges of speech ([`SpeechEdges`]: plain data,
//! tested without a model).
//!
//! The rules follow the Realtime API's `server_vad` settings: a window is voiced when its
//! probability reaches `threshold` and silent below `threshold - 0.15` (between the two it
//! changes nothing, as Silero's own segmentation does); speech starts after [`ONSET_MS`] of
//! voiced windows in a row, reported `prefix_padding_ms` earlier than its first voiced window
//! (the padding is audio the model hears before the speech); it stops once
//! `silence_duration_ms` of silence follow it, reported at the end of its last voiced window.

use std::sync::Arc;

/// A voice activity detector over 16 kHz mono audio: one per audio stream (it may keep state
/// from window to window).
pub trait VoiceDetector: Send {
    /// Samples per window.
    fn window(&self) -> usize;
    /// The probability, 0 to 1, that the next window (`window()` samples, or fewer at the end
    /// of a stream) is speech.
    fn probability(&mut self, window: &[f32]) -> f32;
}

/// Makes a detector for each new audio stream.
pub trait VoiceDetectors: Send + Sync {
    /// A new detector, for one stream.
    fn detector(&self) -> Box<dyn VoiceDetector>;
}

/// The server's detectors, shared by every session that needs one.
pub type SharedDetectors = Arc<dyn VoiceDetectors>;

/// Voiced windows in a row for this long make the start of speech (a click or a cough is
/// shorter).
pub const ONSET_MS: u64 = 90;
/// A window is silent below `threshold - HYSTERESIS` (or half the threshold, if higher).
pub const HYSTERESIS: f32 = 0.15;

/// `server_vad`'s settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EdgeRules {
    /// The probability, 0 to 1, from which a window is voiced.
    pub threshold: f32,
    /// How much audio before its first voiced window the speech is reported to start, in ms.
    pub prefix_padding_ms: u32,
    /// How long a silence ends the speech, in ms.
    pub silence_duration_ms: u32,
}

/// An edge of speech, in milliseconds of the stream's audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// Speech started.
    Started {
        /// Where it starts (`prefix_padding_ms` before its first voiced window), in ms from the
        /// start of the stream.
        audio_start_ms: u64,
    },
    /// Speech stopped, after `silence_duration_ms` of silence.
    Stopped {
        /// Where it ends (the end of its last voiced window), in ms from the start of the stream.
        audio_end_ms: u64,
    },
}

/// Where speech starts and stops in one stream, from each window's probability.
#[derive(Debug, Clone, Default)]
pub struct SpeechEdges {
    /// Samples heard.
    at: u64,
    /// Not in speech: where the current run of voiced windows began.
    run_start: Option<u64>,
    in_speech: bool,
    /// In speech: the end of its last voiced window.
    speech_end: u64,
    /// In speech: where the current silence began.
    quiet_since: Option<u64>,
}

fn ms(samples: u64) -> u64 {
    samples * 1000 / 16000
}

impl SpeechEdges {
    /// Takes the next window's probability (`len` samples); says when speech starts or stops.
    pub fn push(&mut self, rules: &EdgeRules, probability: f32, len: usize) -> Option<Edge> {
        let start = self.at;
        self.at += len as u64;
        let end = self.at;
        let voiced = probability >= rules.threshold;
        let silent = probability < (rules.threshold - HYSTERESIS).max(rules.threshold / 2.0);
        if !self.in_speech {
            if !voiced {
                self.run_start = None;
                return None;
            }
            let first = *self.run_start.get_or_insert(start);
            if ms(end - first) < ONSET_MS {
                return None;
            }
            self.in_speech = true;
            self.run_start = None;
            self.speech_end = end;
            self.quiet_since = None;
            return Some(Edge::Started { audio_start_ms: ms(first).saturating_sub(rules.prefix_padding_ms as u64) });
        }
        if voiced {
            self.speech_end = end;
            self.quiet_since = None;
        } else if silent {
            let quiet = *self.quiet_since.get_or_insert(start);
            if ms(end - quiet) >= rules.silence_duration_ms as u64 {
                self.in_speech = false;
                self.quiet_since = None;
                return Some(Edge::Stopped { audio_end_ms: ms(self.speech_end) });
            }
        }
        None
    }

    /// Speech has started and not stopped.
    pub fn in_speech(&self) -> bool {
        self.in_speech
    }

    /// The end of the last voiced window of the speech in progress (or of the last speech).
    pub fn speech_end_ms(&self) -> u64 {
        ms(self.speech_end)
    }

    /// The speech in progress ends here without a `Stopped` edge (the model took the floor:
    /// what the user says from now on is new speech).
    pub fn end(&mut self) {
        self.in_speech = false;
        self.run_start = None;
        self.quiet_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: EdgeRules = EdgeRules { threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 };
    /// 32 ms windows, as Silero's.
    const W: usize = 512;

    fn run(edges: &mut SpeechEdges, probabilities: &[(f32, usize)]) -> Vec<Edge> {
        let mut out = Vec::new();
        for &(p, windows) in probabilities {
            for _ in 0..windows {
                out.extend(edges.push(&RULES, p, W));
            }
        }
        out
    }

    #[test]
    fn one_second_of_speech_then_silence_stops_at_the_speechs_end() {
        let mut e = SpeechEdges::default();
        // 1.024 s of silence, 0.992 s of speech (31 windows), 2 s of silence.
        let edges = run(&mut e, &[(0.02, 32), (0.9, 31), (0.05, 63)]);
        // Speech began at 1024 ms; the padding puts its start 300 ms earlier.
        assert_eq!(edges, [Edge::Started { audio_start_ms: 724 }, Edge::Stopped { audio_end_ms: 2016 }]);
        assert!(!e.in_speech());
    }

    #[test]
    fn stops_only_after_the_whole_silence_duration() {
        let mut e = SpeechEdges::default();
        // 15 silent windows are 480 ms: not yet.
        assert_eq!(run(&mut e, &[(0.9, 10), (0.1, 15)]).len(), 1);
        assert!(e.in_speech());
        assert_eq!(run(&mut e, &[(0.1, 1)]), [Edge::Stopped { audio_end_ms: 320 }]);
    }

    #[test]
    fn a_short_utterance_gets_both_edges() {
        let mut e = SpeechEdges::default();
        // 0.3 s of speech, then 3 s of silence.
        let edges = run(&mut e, &[(0.8, 10), (0.0, 94)]);
        assert_eq!(edges, [Edge::Started { audio_start_ms: 0 }, Edge::Stopped { audio_end_ms: 320 }]);
    }

    #[test]
    fn clicks_shorter_than_the_onset_are_not_speech() {
        let mut e = SpeechEdges::default();
        assert!(run(&mut e, &[(0.9, 2), (0.1, 5), (0.9, 2), (0.1, 40)]).is_empty());
    }

    #[test]
    fn probabilities_between_the_thresholds_neither_start_nor_end_speech() {
        let mut e = SpeechEdges::default();
        assert!(run(&mut e, &[(0.45, 50)]).is_empty(), "below the threshold is not voiced");
        assert_eq!(run(&mut e, &[(0.9, 5)]).len(), 1);
        // 0.4 is above 0.5 - 0.15: it does not count as silence, however long.
        assert!(run(&mut e, &[(0.4, 100)]).is_empty());
        assert!(e.in_speech());
        // A voiced window inside a silence restarts it.
        assert!(run(&mut e, &[(0.1, 10), (0.9, 1), (0.1, 10)]).is_empty());
        assert_eq!(run(&mut e, &[(0.1, 6)]).len(), 1);
    }

    #[test]
    fn a_low_threshold_keeps_a_silence_threshold_above_zero() {
        let rules = EdgeRules { threshold: 0.1, ..RULES };
        let mut e = SpeechEdges::default();
        let mut edges = Vec::new();
        for p in [0.2; 5].into_iter().chain([0.04; 20]) {
            edges.extend(e.push(&rules, p, W));
        }
        assert_eq!(edges, [Edge::Started { audio_start_ms: 0 }, Edge::Stopped { audio_end_ms: 160 }]);
    }

    #[test]
    fn ending_speech_makes_what_follows_new_speech() {
        let mut e = SpeechEdges::default();
        assert_eq!(run(&mut e, &[(0.9, 5)]).len(), 1);
        e.end();
        assert!(!e.in_speech());
        assert_eq!(e.speech_end_ms(), 160);
        assert_eq!(run(&mut e, &[(0.9, 3)]), [Edge::Started { audio_start_ms: 0 }]);
    }
}
