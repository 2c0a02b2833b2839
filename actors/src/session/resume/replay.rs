//! What a session said to its client, for a resume: every message numbered (1 for the
//! session's first), the last ones kept within a bound of bytes and of [`REPLAY_FRAMES`]
//! messages, nothing sent while the client is away, and what it missed counted. A resumed
//! client that says how many it received gets every later one still kept, in order, and is
//! told how many were not kept any more.
//!
//! A message that carried the model's voice is kept without it (the voice is most of a
//! session's bytes): a resumed client is not sent voice late as if fresh, whether it was
//! produced while the client was away or before, and is told how much it missed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytestring::ByteString;

/// Messages a session keeps at most for a resume, whatever their size.
pub const REPLAY_FRAMES: usize = 1024;

/// What a resumed client is sent: the messages it did not receive, and what it lost.
#[derive(Debug, Default, PartialEq)]
pub struct Catchup {
    /// The messages it did not receive, in order.
    pub frames: Vec<ByteString>,
    /// Messages it did not receive that were no longer kept (past the bound).
    pub lost: u64,
    /// The model's voice produced while it was away, not sent (in ms at 24 kHz).
    pub voice_skipped_ms: u64,
    /// How long it was away (zero: it came back before its connection was noticed lost).
    pub away: Duration,
}

struct Away {
    since: Instant,
    /// Messages said by then (the client got at most those).
    said_by_then: u64,
    voice_samples: u64,
}

/// What a session said to its client, numbered, and the last of it kept; see the module's
/// documentation.
pub struct Replay {
    /// The last messages said, with their numbers (1 for the session's first) and the voice
    /// left out of them (in samples at 24 kHz).
    kept: VecDeque<(u64, ByteString, u32)>,
    kept_bytes: usize,
    max_bytes: usize,
    said: u64,
    away: Option<Away>,
}

impl Replay {
    /// A replay keeping up to `max_bytes` of its last messages (0: none, when sessions are not
    /// resumed).
    pub fn new(max_bytes: usize) -> Replay {
        Replay { kept: VecDeque::new(), kept_bytes: 0, max_bytes, said: 0, away: None }
    }

    /// One more message for the client: numbered and kept. Answers whether to send it now
    /// (not while the client is away).
    pub fn say(&mut self, frame: &ByteString) -> bool {
        self.said += 1;
        if self.max_bytes > 0 {
            self.keep(frame.clone(), 0);
        }
        self.away.is_none()
    }

    /// One more message for the client, carrying `samples` (at 24 kHz) of the model's voice:
    /// numbered, and kept as `quiet` makes it without the voice (made only when kept). Answers
    /// whether to send it now.
    pub fn say_voiced(&mut self, samples: usize, quiet: impl FnOnce() -> String) -> bool {
        self.said += 1;
        if self.max_bytes > 0 {
            self.keep(ByteString::from(quiet()), u32::try_from(samples).unwrap_or(u32::MAX));
        }
        self.away.is_none()
    }

    fn keep(&mut self, frame: ByteString, voice: u32) {
        self.kept_bytes += frame.len();
        self.kept.push_back((self.said, frame, voice));
        while self.kept.len() > REPLAY_FRAMES || self.kept_bytes > self.max_bytes {
            if let Some((_, old, _)) = self.kept.pop_front() {
                self.kept_bytes -= old.len();
            }
        }
    }

    /// Messages said so far.
    pub fn said(&self) -> u64 {
        self.said
    }

    /// The connection was lost at `now`: nothing more is sent until a resume.
    pub fn lose(&mut self, now: Instant) {
        if self.away.is_none() {
            self.away = Some(Away { since: now, said_by_then: self.said, voice_samples: 0 });
        }
    }

    /// Whether the client is away.
    pub fn away(&self) -> bool {
        self.away.is_some()
    }

    /// How long the client has been away.
    pub fn away_for(&self, now: Instant) -> Option<Duration> {
        self.away.as_ref().map(|a| now.saturating_duration_since(a.since))
    }

    /// The model's voice (`samples` at 24 kHz) was produced while the client is away: not sent.
    pub fn skip_voice(&mut self, samples: usize) {
        if let Some(away) = &mut self.away {
            away.voice_samples += samples as u64;
        }
    }

    /// The client is back, having received `received` messages (when it says; else those
    /// said before its connection was noticed lost, or all when it was not): what it missed.
    pub fn back(&mut self, received: Option<u64>, now: Instant) -> Catchup {
        let away = self.away.take();
        let from = received.or(away.as_ref().map(|a| a.said_by_then)).unwrap_or(self.said).min(self.said);
        let oldest_kept = self.kept.front().map_or(self.said + 1, |(n, _, _)| *n);
        let lost = oldest_kept.saturating_sub(from + 1);
        let missed = self.kept.iter().filter(|(n, _, _)| *n > from);
        let frames = missed.clone().map(|(_, f, _)| f.clone()).collect();
        let voice_left_out: u64 = missed.map(|(_, _, voice)| u64::from(*voice)).sum();
        let (away_voice, away_for) = match away {
            Some(a) => (a.voice_samples, now.saturating_duration_since(a.since)),
            None => (0, Duration::ZERO),
        };
        let voice_skipped_ms = (away_voice + voice_left_out) * 1000 / 24_000;
        Catchup { frames, lost, voice_skipped_ms, away: away_for }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u64) -> ByteString {
        ByteString::from(format!("{{\"n\":{n}}}"))
    }

    #[test]
    fn a_message_with_the_models_voice_is_kept_without_it_and_counted() {
        let mut line = Replay::new(1 << 20);
        let t0 = Instant::now();
        let voiced = format!("{{\"audio\":\"{}\",\"n\":2}}", "A".repeat(64_000));
        line.say(&frame(1));
        assert!(line.say_voiced(48_000, || voiced.replacen(&"A".repeat(64_000), "", 1)));
        line.say(&frame(3));
        assert!(line.kept_bytes < 100, "the voice is not kept: {} bytes", line.kept_bytes);
        line.lose(t0);
        line.skip_voice(12_000);
        let back = line.back(Some(1), t0);
        assert_eq!(back.frames, [ByteString::from("{\"audio\":\"\",\"n\":2}"), frame(3)]);
        assert_eq!(back.voice_skipped_ms, 2_500, "2 s left out of a message it missed, 0.5 s produced while away");
        // A voiced message it received is not counted.
        line.say_voiced(24_000, String::new);
        line.lose(t0);
        assert_eq!(line.back(Some(4), t0).voice_skipped_ms, 0);
    }

    #[test]
    fn a_client_back_gets_what_it_did_not_receive_in_order() {
        let mut line = Replay::new(1 << 20);
        let t0 = Instant::now();
        for n in 1..=5 {
            assert!(line.say(&frame(n)));
        }
        line.lose(t0);
        for n in 6..=8 {
            assert!(!line.say(&frame(n)), "not sent while away");
        }
        line.skip_voice(24_000);
        let back = line.back(Some(3), t0 + Duration::from_secs(2));
        assert_eq!(back.frames, (4..=8).map(frame).collect::<Vec<_>>());
        assert_eq!((back.lost, back.voice_skipped_ms, back.away), (0, 1000, Duration::from_secs(2)));
        assert!(line.say(&frame(9)), "sent again");
    }

    #[test]
    fn without_a_count_what_was_said_while_away_is_sent() {
        let mut line = Replay::new(1 << 20);
        let t0 = Instant::now();
        line.say(&frame(1));
        line.say(&frame(2));
        line.lose(t0);
        line.say(&frame(3));
        assert_eq!(line.back(None, t0).frames, vec![frame(3)]);
        // Back before the loss was noticed, with nothing to say: nothing.
        assert_eq!(line.back(None, t0).frames, Vec::<ByteString>::new());
        // A count past what was said is what was said.
        assert_eq!(line.back(Some(99), t0).frames, Vec::<ByteString>::new());
    }

    #[test]
    fn past_its_bound_the_line_tells_how_many_were_lost() {
        let mut line = Replay::new(3 * frame(10).len());
        for n in 1..=10 {
            line.say(&frame(n));
        }
        let back = line.back(Some(2), Instant::now());
        assert_eq!(back.frames, (8..=10).map(frame).collect::<Vec<_>>());
        assert_eq!(back.lost, 5, "3..=7");
        // A message bigger than the bound is not kept either: the bound holds.
        let mut small = Replay::new(4);
        small.say(&frame(1));
        assert_eq!(small.back(Some(0), Instant::now()).lost, 1);
        let mut off = Replay::new(0);
        off.say(&frame(1));
        assert_eq!(off.back(Some(0), Instant::now()).lost, 1);
    }
}
