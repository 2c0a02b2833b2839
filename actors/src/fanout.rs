//! The rule for telling waiting tickets that their position changed, as a plain struct
//! the QueueActor drives with timers (tested here without a runtime).
//!
//! A change is told within `coalesce`, so that a burst of changes (fifty workers freed in
//! the same second) costs one update per ticket, not one per change. The updates go out in
//! batches of `batch` tickets, `pause` apart: the sessions' threads deliver a batch in about
//! a millisecond, and an assignment sent meanwhile waits for one batch, not for ten thousand
//! updates. Changes during a fan-out that the fan-out has not reached yet ride along with
//! it; changes behind it start another fan-out `coalesce` after this one ends.

use std::ops::Range;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    /// A change waits for the coalescing delay.
    Coalescing,
    /// Tickets from this index on are told next.
    Sending(usize),
}

/// What to do on a tick: tell the tickets in `send`, then tick again after `next`.
#[derive(Debug, PartialEq, Eq)]
pub struct Tick {
    pub send: Option<Range<usize>>,
    pub next: Option<Duration>,
}

#[derive(Debug)]
pub struct Fanout {
    phase: Phase,
    /// The lowest index that changed and is not covered by the fan-out in progress.
    pending: Option<usize>,
    coalesce: Duration,
    batch: usize,
    pause: Duration,
}

impl Fanout {
    pub fn new(coalesce: Duration, batch: usize, pause: Duration) -> Fanout {
        Fanout { phase: Phase::Idle, pending: None, coalesce, batch: batch.max(1), pause }
    }

    /// Every ticket from `index` on changed. Answers when to tick, if no tick is due.
    pub fn moved(&mut self, index: usize) -> Option<Duration> {
        self.pending = Some(self.pending.map_or(index, |p| p.min(index)));
        if self.phase == Phase::Idle {
            self.phase = Phase::Coalescing;
            return Some(self.coalesce);
        }
        None
    }

    /// The tick is due; `len` tickets wait now.
    pub fn tick(&mut self, len: usize) -> Tick {
        let cursor = match self.phase {
            Phase::Idle => return Tick { send: None, next: None },
            Phase::Coalescing => self.pending.take().unwrap_or(len),
            Phase::Sending(cursor) => cursor,
        };
        if self.pending.is_some_and(|p| p >= cursor) {
            self.pending = None;
        }
        let end = cursor.saturating_add(self.batch).min(len);
        let send = (cursor < end).then_some(cursor..end);
        if end < len {
            self.phase = Phase::Sending(end);
            return Tick { send, next: Some(self.pause) };
        }
        if self.pending.is_some() {
            self.phase = Phase::Coalescing;
            return Tick { send, next: Some(self.coalesce) };
        }
        self.phase = Phase::Idle;
        Tick { send, next: None }
    }
}

/// How many of `pending` updates go out per tick, ticking every `pause`, so that they are
/// all out within about `spread`, but never fewer than `min` a tick. A replica of a cluster
/// tells its share of the queue after each view: spread out, its fan-out takes a fraction of
/// a core while it lasts, so the CPUs that a hand-over crosses (several processes on a
/// host) are never all busy writing updates at once (docs/performance.md).
pub fn paced_batch(pending: usize, spread: Duration, pause: Duration, min: usize) -> usize {
    let ticks = (spread.as_micros() / pause.as_micros().max(1)).max(1) as usize;
    pending.div_ceil(ticks).max(min.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_batches_spread_a_fanout_over_the_window_with_a_floor() {
        let (spread, pause) = (Duration::from_millis(100), Duration::from_millis(2));
        assert_eq!(paced_batch(667, spread, pause, 4), 14, "50 ticks of 14");
        assert_eq!(paced_batch(10_000, spread, pause, 4), 200);
        assert_eq!(paced_batch(30, spread, pause, 4), 4, "a few updates: the floor");
        assert_eq!(paced_batch(0, spread, pause, 0), 1, "never a batch of nothing");
        assert_eq!(paced_batch(5, Duration::ZERO, pause, 1), 5, "no window: all at once");
    }

    const C: Duration = Duration::from_millis(100);
    const P: Duration = Duration::from_millis(2);

    fn fanout() -> Fanout {
        Fanout::new(C, 10, P)
    }

    fn tick(f: &mut Fanout, len: usize) -> (Option<Range<usize>>, Option<Duration>) {
        let t = f.tick(len);
        (t.send, t.next)
    }

    #[test]
    fn a_change_waits_for_the_coalescing_delay_then_goes_out_in_batches() {
        let mut f = fanout();
        assert_eq!(f.moved(3), Some(C));
        assert_eq!(f.moved(5), None, "a tick is already due");
        assert_eq!(tick(&mut f, 25), (Some(3..13), Some(P)));
        assert_eq!(tick(&mut f, 25), (Some(13..23), Some(P)));
        assert_eq!(tick(&mut f, 25), (Some(23..25), None));
        assert_eq!(tick(&mut f, 25), (None, None), "idle again");
    }

    #[test]
    fn a_burst_of_changes_costs_one_fanout_from_the_lowest_index() {
        let mut f = fanout();
        f.moved(7);
        f.moved(2);
        f.moved(9);
        assert_eq!(tick(&mut f, 8), (Some(2..8), None));
    }

    #[test]
    fn changes_ahead_of_the_fanout_ride_along() {
        let mut f = fanout();
        f.moved(0);
        assert_eq!(tick(&mut f, 30), (Some(0..10), Some(P)));
        assert_eq!(f.moved(15), None);
        assert_eq!(tick(&mut f, 30), (Some(10..20), Some(P)));
        assert_eq!(tick(&mut f, 30), (Some(20..30), None), "nothing left to tell");
    }

    #[test]
    fn changes_behind_the_fanout_start_another_after_the_delay() {
        let mut f = fanout();
        f.moved(0);
        assert_eq!(tick(&mut f, 30), (Some(0..10), Some(P)));
        f.moved(4);
        assert_eq!(tick(&mut f, 30), (Some(10..20), Some(P)));
        assert_eq!(tick(&mut f, 30), (Some(20..30), Some(C)));
        assert_eq!(tick(&mut f, 30), (Some(4..14), Some(P)));
    }

    #[test]
    fn a_queue_that_shrank_meanwhile_ends_the_fanout() {
        let mut f = fanout();
        f.moved(0);
        assert_eq!(tick(&mut f, 30), (Some(0..10), Some(P)));
        assert_eq!(tick(&mut f, 5), (None, None));
        f.moved(40);
        assert_eq!(tick(&mut f, 5), (None, None), "the changed tickets left");
    }
}
