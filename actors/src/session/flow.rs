//! The session's output rules, as a plain struct tested without a runtime: how inputs are
//! numbered (`input_id`), which model turn speech belongs to (`response_id`), what a
//! force-listen voids, and the turn-mode answers a session has outstanding.
//!
//! - Inputs are numbered from 1 in the order they are accepted; a step answers one input.
//! - Speech answering an input sent before a force-listen (or an interrupt, or a
//!   reconfiguration) is void: it is never sent. A listen always is.
//! - A model turn is the run of speaking steps until a listen or `end_of_turn`; its
//!   speech shares one `response_id`, and it counts as one answer (`turns`).
//! - At most `max_turns` turn-mode answers are outstanding (one in progress, the rest
//!   waiting); one more is refused with `buffer_full`.
//!
//! [`crate::session::SessionActor`] delivers events here and sends what the answers say.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::domain::StepKind;
use crate::protocol::ProtocolError;

/// Arrival times kept for the latency metrics; older ones are forgotten (their inputs
/// were dropped or will never be answered).
const MAX_ARRIVALS: usize = 1024;

/// Counts for logs, metrics and the recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SessionCounters {
    pub chunks_received: u64,
    pub chunks_dropped: u64,
    pub chunks_answered: u64,
    /// Model answers: spoken turns in duplex modes, answers in chat.
    pub turns: u64,
}

/// Where a step's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StepRoute {
    /// The model turn a speaking step belongs to; `None` for a listen.
    pub response_id: Option<String>,
    /// This step starts the turn (its first audio counts for the first-audio latency).
    pub starts_turn: bool,
    /// When the input it answers arrived, if known.
    pub arrived: Option<Instant>,
}

/// A turn-mode answer in progress.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TurnAnswer {
    pub response_id: String,
    pub streaming: bool,
    pub submitted: Instant,
    pub heard_audio: bool,
    pub text: String,
    /// Gathered only when not streaming (sent whole with `response.done`).
    pub audio: Vec<f32>,
}

#[derive(Debug)]
pub(super) struct Flow {
    next_seq: u64,
    /// Speech answering inputs numbered below this is void.
    cancel_below: u64,
    /// The model turn being spoken in duplex mode.
    response: Option<String>,
    responses: u64,
    arrivals: VecDeque<(u64, Instant)>,
    turns: HashMap<u64, TurnAnswer>,
    max_turns: usize,
    counters: SessionCounters,
}

impl Flow {
    pub(super) fn new(max_turns: usize) -> Flow {
        Flow {
            next_seq: 0,
            cancel_below: 0,
            response: None,
            responses: 0,
            arrivals: VecDeque::new(),
            turns: HashMap::new(),
            max_turns: max_turns.max(1),
            counters: SessionCounters::default(),
        }
    }

    pub(super) fn counters(&self) -> SessionCounters {
        self.counters
    }

    fn new_response_id(&mut self) -> String {
        self.responses += 1;
        format!("resp_{}", self.responses)
    }

    /// A duplex chunk is accepted: its number. A force-listen voids the speech of every
    /// earlier input and ends the current turn.
    pub(super) fn chunk(&mut self, force_listen: bool, now: Instant) -> u64 {
        self.next_seq += 1;
        let seq = self.next_seq;
        if force_listen {
            self.cancel_below = seq;
            self.response = None;
        }
        self.counters.chunks_received += 1;
        if self.arrivals.len() >= MAX_ARRIVALS {
            self.arrivals.pop_front();
        }
        self.arrivals.push_back((seq, now));
        seq
    }

    /// The output of everything sent so far is void (an interrupt, a reconfiguration).
    pub(super) fn cut(&mut self) {
        self.cancel_below = self.next_seq + 1;
        self.response = None;
    }

    /// Input `seq` was dropped unprocessed.
    pub(super) fn dropped(&mut self, _seq: u64) {
        self.counters.chunks_dropped += 1;
    }

    /// When input `seq` arrived, forgetting earlier ones (they will not be answered now).
    fn arrival_of(&mut self, seq: u64) -> Option<Instant> {
        while let Some(&(s, at)) = self.arrivals.front() {
            if s > seq {
                return None;
            }
            self.arrivals.pop_front();
            if s == seq {
                return Some(at);
            }
        }
        None
    }

    /// The step answering input `seq` came back: where its output goes, or `None` when it
    /// is void speech (never sent).
    pub(super) fn step(&mut self, seq: u64, kind: StepKind, end_of_turn: bool) -> Option<StepRoute> {
        let arrived = self.arrival_of(seq);
        if kind == StepKind::Speak && seq < self.cancel_below {
            return None;
        }
        self.counters.chunks_answered += 1;
        let route = match kind {
            StepKind::Listen => {
                self.response = None;
                StepRoute { response_id: None, starts_turn: false, arrived }
            }
            StepKind::Speak => {
                let starts_turn = self.response.is_none();
                if starts_turn {
                    let id = self.new_response_id();
                    self.response = Some(id);
                    self.counters.turns += 1;
                }
                StepRoute { response_id: self.response.clone(), starts_turn, arrived }
            }
        };
        if end_of_turn {
            self.response = None;
        }
        Some(route)
    }

    /// A turn-mode answer is asked for: its number and response id, or `buffer_full`
    /// when `max_turns` are outstanding.
    pub(super) fn turn(&mut self, streaming: bool, now: Instant) -> Result<(u64, String), ProtocolError> {
        if self.turns.len() >= self.max_turns {
            return Err(ProtocolError::BufferFull(format!(
                "input.append: {} answers are already in progress or waiting (at most {}, \
                 limits.max_pending_turns + 1); wait for response.done",
                self.turns.len(),
                self.max_turns
            )));
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        let response_id = self.new_response_id();
        self.counters.turns += 1;
        let answer = TurnAnswer {
            response_id: response_id.clone(),
            streaming,
            submitted: now,
            heard_audio: false,
            text: String::new(),
            audio: Vec::new(),
        };
        self.turns.insert(seq, answer);
        Ok((seq, response_id))
    }

    /// The answer of `seq`, to add a piece to.
    pub(super) fn turn_answer(&mut self, seq: u64) -> Option<&mut TurnAnswer> {
        self.turns.get_mut(&seq)
    }

    /// The answer of `seq` is done.
    pub(super) fn turn_done(&mut self, seq: u64) -> Option<TurnAnswer> {
        self.turns.remove(&seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn route(f: &mut Flow, seq: u64, kind: StepKind, eot: bool) -> Option<(Option<String>, bool)> {
        f.step(seq, kind, eot).map(|r| (r.response_id, r.starts_turn))
    }

    #[test]
    fn inputs_are_numbered_in_order_and_speech_shares_one_response_per_turn() {
        let mut f = Flow::new(4);
        let t = Instant::now();
        assert_eq!((f.chunk(false, t), f.chunk(false, t), f.chunk(false, t)), (1, 2, 3));
        assert_eq!(route(&mut f, 1, StepKind::Listen, false), Some((None, false)));
        assert_eq!(route(&mut f, 2, StepKind::Speak, false), Some((Some("resp_1".into()), true)));
        assert_eq!(route(&mut f, 3, StepKind::Speak, true), Some((Some("resp_1".into()), false)));
        f.chunk(false, t);
        assert_eq!(route(&mut f, 4, StepKind::Speak, false), Some((Some("resp_2".into()), true)), "after end_of_turn");
        f.chunk(false, t);
        route(&mut f, 5, StepKind::Listen, false);
        f.chunk(false, t);
        assert_eq!(route(&mut f, 6, StepKind::Speak, false).unwrap().0.as_deref(), Some("resp_3"), "after a listen");
        assert_eq!(
            f.counters(),
            SessionCounters { chunks_received: 6, chunks_dropped: 0, chunks_answered: 6, turns: 3 }
        );
    }

    #[test]
    fn a_force_listen_voids_earlier_speech_but_not_listens() {
        let mut f = Flow::new(4);
        let t = Instant::now();
        for _ in 0..3 {
            f.chunk(false, t);
        }
        assert_eq!(f.chunk(true, t), 4);
        assert_eq!(route(&mut f, 2, StepKind::Speak, false), None, "speech of input 2 is void");
        assert_eq!(route(&mut f, 3, StepKind::Listen, false), Some((None, false)), "a listen is always sent");
        assert!(route(&mut f, 4, StepKind::Speak, false).unwrap().1, "speech after it starts a new turn");
        f.cut();
        assert_eq!(route(&mut f, 4, StepKind::Speak, false), None, "a cut voids everything sent so far");
    }

    #[test]
    fn arrivals_give_the_latency_of_the_input_answered_and_are_bounded() {
        let mut f = Flow::new(4);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        f.chunk(false, t0);
        f.chunk(false, t1);
        assert_eq!(f.step(2, StepKind::Listen, false).unwrap().arrived, Some(t1));
        assert_eq!(f.step(1, StepKind::Listen, false).unwrap().arrived, None, "forgotten: answered out of order");
        for _ in 0..5000 {
            f.chunk(false, t0);
        }
        assert!(f.arrivals.len() <= MAX_ARRIVALS, "a backend that never answers cannot grow them");
    }

    #[test]
    fn turn_mode_answers_are_bounded_and_numbered_with_the_inputs() {
        let mut f = Flow::new(2);
        let t = Instant::now();
        let (a, ra) = f.turn(true, t).unwrap();
        let (b, rb) = f.turn(false, t).unwrap();
        assert_eq!((a, b, ra.as_str(), rb.as_str()), (1, 2, "resp_1", "resp_2"));
        let e = f.turn(true, t).unwrap_err();
        assert_eq!(e.code(), "buffer_full");
        f.turn_answer(a).unwrap().text.push_str("hi");
        assert_eq!(f.turn_done(a).unwrap().text, "hi");
        assert!(f.turn_done(a).is_none(), "done once");
        assert!(f.turn(true, t).is_ok(), "room again once one is done");
        assert_eq!(f.counters().turns, 3);
    }
}
