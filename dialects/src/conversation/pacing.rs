//! Stepping the backend with silence while the client says nothing (server VAD). Clients stop
//! sending when their user stops talking; a duplex model needs steps to go on: to hear the
//! pause that ends a turn, and to keep speaking an answer.
//!
//! - While a duplex answer is in progress and the client is idle, a silent step follows each
//!   answered one (at the backend's pace: [`Driver::step`]), and a stalled answer (no step for
//!   a step's length, at least [`STALLED`]) gets one on the tick.
//! - After the user spoke and went quiet before a whole step, the pause is padded a step at a
//!   time, one step apart, up to [`MAX_PADDING`] of silence.

use std::time::{Duration, Instant};

use super::Driver;

/// A stalled turn is prompted with silent steps, one step's length apart, up to this much
/// silence in all.
pub const MAX_PADDING: Duration = Duration::from_secs(5);
/// A speaking model whose steps stopped coming this long ago is stepped with silence.
pub const STALLED: Duration = Duration::from_millis(1000);

/// How the tick finds the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// A duplex answer is in progress; its last step came at this instant.
    Answering { last_step: Instant },
    /// A turn-mode answer is in progress: the backend needs no steps.
    AnsweringTurn,
    /// No answer; the user spoke (or is speaking) and has not been answered.
    AfterSpeech,
    /// Nothing to wait for.
    Quiet,
}

#[derive(Debug, Default)]
pub struct Pacer {
    last_pad: Option<Instant>,
    /// Pause steps sent since the user last began to speak.
    pads: u32,
    /// Samples sent since the backend's last step: the input a speaking step answered.
    sent_since_step: u64,
}

impl Pacer {
    /// A padded step leaves at `now`: one step's length after the last on average, whatever
    /// the tick's phase.
    pub fn padded(&mut self, now: Instant, every: Duration) {
        self.last_pad = Some(match self.last_pad {
            Some(t) if now.duration_since(t) < every * 2 => t + every,
            _ => now,
        });
    }

    pub fn sent(&mut self, samples: usize) {
        self.sent_since_step += samples as u64;
    }

    /// What was sent since the last step (and starts counting again).
    pub fn take_sent(&mut self) -> u64 {
        std::mem::take(&mut self.sent_since_step)
    }

    /// The user began to speak: the pause after it may be padded again.
    pub fn speech_began(&mut self) {
        self.pads = 0;
    }

    /// Whether the tick at `now` sends a silent step, for a client idle since its last audio,
    /// with steps `every` long. A pause step is counted.
    pub fn tick(&mut self, now: Instant, every: Duration, moment: Moment) -> bool {
        let due = self.last_pad.is_none_or(|t| now.duration_since(t) >= every);
        let max_pads = (MAX_PADDING.as_millis() / every.as_millis().max(1)) as u32;
        match moment {
            Moment::Answering { last_step } => due && now.duration_since(last_step) >= every.max(STALLED),
            Moment::AfterSpeech if due && self.pads < max_pads => {
                self.pads += 1;
                true
            }
            Moment::AfterSpeech | Moment::AnsweringTurn | Moment::Quiet => false,
        }
    }
}

impl Driver {
    /// Time passes: a silent step when the conversation waits on one and the client says nothing.
    pub fn tick(&mut self, now: Instant) {
        if self.active() {
            self.idle_timeout(now);
        }
        if !self.active() || self.setup.conf.vad.is_none() || !self.intake.client_idle(now) {
            return;
        }
        let moment = match &self.responses.current {
            Some(r) if r.duplex => Moment::Answering { last_step: r.last_step },
            Some(_) => Moment::AnsweringTurn,
            None if self.turns.user.is_some() || self.turns.unanswered => Moment::AfterSpeech,
            None => Moment::Quiet,
        };
        if self.pacer.tick(now, self.step_duration(), moment) {
            self.pad_step(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: Duration = Duration::from_millis(200);

    #[test]
    fn a_pause_is_padded_a_step_apart_up_to_five_seconds() {
        let mut p = Pacer::default();
        let t0 = Instant::now();
        let mut sent = 0;
        for i in 0..100 {
            let now = t0 + Duration::from_millis(100 * i);
            if p.tick(now, STEP, Moment::AfterSpeech) {
                p.padded(now, STEP);
                sent += 1;
            }
        }
        assert_eq!(sent, 25, "5 s of 200 ms steps, then no more");
        p.speech_began();
        assert!(p.tick(t0 + Duration::from_secs(60), STEP, Moment::AfterSpeech), "a new turn may be padded again");
    }

    #[test]
    fn a_stalled_answer_is_stepped_and_a_flowing_one_is_not() {
        let mut p = Pacer::default();
        let t0 = Instant::now();
        let flowing = Moment::Answering { last_step: t0 };
        assert!(!p.tick(t0 + Duration::from_millis(500), STEP, flowing), "a step came 500 ms ago");
        assert!(p.tick(t0 + STALLED, STEP, flowing), "none for a second: stalled");
        assert!(!p.tick(t0 + STALLED, STEP, Moment::AnsweringTurn), "a turn-mode answer needs no steps");
        assert!(!p.tick(t0 + STALLED, STEP, Moment::Quiet));
    }

    #[test]
    fn padded_steps_keep_their_rhythm_whatever_the_ticks_phase() {
        let mut p = Pacer::default();
        let t0 = Instant::now();
        p.padded(t0, STEP);
        // The next tick comes 250 ms later: the step is counted at 200 ms, so the one after is
        // due at 400 ms, not 450.
        p.padded(t0 + Duration::from_millis(250), STEP);
        assert!(!p.tick(t0 + Duration::from_millis(390), STEP, Moment::AfterSpeech));
        assert!(p.tick(t0 + Duration::from_millis(400), STEP, Moment::AfterSpeech));
    }
}
