//! How waiting clients are told their new positions, as plain structs both queues drive with
//! timers (tested here without a runtime).
//!
//! [`Pacer`] is the one rule for when updates go out and how many at a time: a change is told
//! after a coalescing delay (so a burst of changes costs one update per client, not one per
//! change), then in batches a pause apart (the sessions' threads deliver a batch in about a
//! millisecond, and a hand-over sent meanwhile waits for one batch, not for ten thousand
//! updates). A batch is a fixed size, or spread: sized so that everything pending goes out
//! within a window, never fewer than a floor a tick.
//!
//! [`Fanout`] is the one-process queue's use of it: the tickets from the lowest index that
//! moved are told in order; moves ahead of a fan-out in progress ride along with it, moves
//! behind it start another after it ends. A cluster's queue keeps its own list of notices and
//! takes batches of it (`queue::cluster::state`).

use std::ops::Range;
use std::time::Duration;

/// How many updates go out a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Batch {
    Fixed(usize),
    /// All that is pending within `over` (ticking every pause), at least `min` a tick.
    Spread {
        over: Duration,
        min: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    /// A change waits for the coalescing delay.
    Coalescing,
    Sending,
}

/// What to do on a tick: send `send` of what is pending, then tick again after `next`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Tick {
    pub send: usize,
    pub next: Option<Duration>,
}

#[derive(Debug)]
pub(super) struct Pacer {
    phase: Phase,
    /// A change the wave in progress does not cover: another wave follows it.
    again: bool,
    coalesce: Duration,
    pause: Duration,
    batch: Batch,
    /// The size of a batch in the wave in progress.
    size: usize,
}

impl Pacer {
    pub(super) fn new(coalesce: Duration, pause: Duration, batch: Batch) -> Pacer {
        let size = match batch {
            Batch::Fixed(n) => n.max(1),
            Batch::Spread { min, .. } => min.max(1),
        };
        Pacer { phase: Phase::Idle, again: false, coalesce, pause, batch, size }
    }

    /// Something changed and `pending` updates wait; `covered`: the wave in progress (if any)
    /// will tell it. Answers when to tick, if no tick is due.
    pub(super) fn changed(&mut self, pending: usize, covered: bool) -> Option<Duration> {
        if let Batch::Spread { over, min } = self.batch {
            self.size = paced_batch(pending, over, self.pause, min);
        }
        match self.phase {
            Phase::Idle => {
                self.phase = Phase::Coalescing;
                Some(self.coalesce)
            }
            Phase::Coalescing => None,
            Phase::Sending => {
                self.again |= !covered;
                None
            }
        }
    }

    /// The tick is due and `pending` updates wait: how many to send now, and when to tick
    /// again.
    pub(super) fn tick(&mut self, pending: usize) -> Tick {
        if self.phase == Phase::Idle {
            return Tick { send: 0, next: None };
        }
        let send = self.size.min(pending);
        if send < pending {
            self.phase = Phase::Sending;
            return Tick { send, next: Some(self.pause) };
        }
        if std::mem::take(&mut self.again) {
            self.phase = Phase::Coalescing;
            return Tick { send, next: Some(self.coalesce) };
        }
        self.phase = Phase::Idle;
        Tick { send, next: None }
    }

    /// Whether a wave is being sent.
    pub(super) fn sending(&self) -> bool {
        self.phase == Phase::Sending
    }
}

/// How many of `pending` updates go out per tick, ticking every `pause`, so that they are
/// all out within about `spread`, but never fewer than `min` a tick. A replica of a cluster
/// tells its share of the queue after each view: spread out, its fan-out takes a fraction of
/// a core while it lasts, so the CPUs that a hand-over crosses (several processes on a
/// host) are never all busy writing updates at once (docs/performance.md).
pub(super) fn paced_batch(pending: usize, spread: Duration, pause: Duration, min: usize) -> usize {
    let ticks = (spread.as_micros() / pause.as_micros().max(1)).max(1) as usize;
    pending.div_ceil(ticks).max(min.max(1))
}

/// The tickets of a one-process queue to tell, by index: from the lowest that moved.
#[derive(Debug)]
pub(super) struct Fanout {
    pacer: Pacer,
    /// The next index told in the wave in progress.
    cursor: Option<usize>,
    /// The lowest index that moved and that no wave covers yet.
    lowest: Option<usize>,
}

/// What a tick of the fan-out tells: the tickets in `send`, then tick again after `next`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct FanoutTick {
    pub send: Option<Range<usize>>,
    pub next: Option<Duration>,
}

impl Fanout {
    pub(super) fn new(coalesce: Duration, batch: usize, pause: Duration) -> Fanout {
        Fanout { pacer: Pacer::new(coalesce, pause, Batch::Fixed(batch)), cursor: None, lowest: None }
    }

    /// Every ticket from `index` on moved. Answers when to tick, if no tick is due.
    pub(super) fn moved(&mut self, index: usize) -> Option<Duration> {
        let covered = self.cursor.is_some_and(|c| index >= c);
        if !covered {
            self.lowest = Some(self.lowest.map_or(index, |l| l.min(index)));
        }
        self.pacer.changed(0, covered)
    }

    /// The tick is due; `len` tickets wait now.
    pub(super) fn tick(&mut self, len: usize) -> FanoutTick {
        let cursor = match self.cursor.take() {
            Some(c) if self.pacer.sending() => c,
            _ => self.lowest.take().unwrap_or(len),
        };
        let tick = self.pacer.tick(len.saturating_sub(cursor));
        let end = cursor + tick.send;
        let send = (tick.send > 0).then_some(cursor..end);
        if self.pacer.sending() {
            self.cursor = Some(end);
        }
        FanoutTick { send, next: tick.next }
    }
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

    #[test]
    fn a_spread_pacer_sizes_its_batches_when_something_changes() {
        let (spread, pause) = (Duration::from_millis(100), Duration::from_millis(2));
        let mut p = Pacer::new(Duration::ZERO, pause, Batch::Spread { over: spread, min: 4 });
        assert_eq!(p.changed(667, false), Some(Duration::ZERO));
        assert_eq!(p.tick(667), Tick { send: 14, next: Some(pause) });
        // A newer change while sending rides along (the list is the same), resizing batches.
        assert_eq!(p.changed(10_000, true), None);
        assert_eq!(p.tick(10_000), Tick { send: 200, next: Some(pause) });
        assert_eq!(p.tick(150), Tick { send: 150, next: None });
        assert_eq!(p.tick(150), Tick { send: 0, next: None }, "idle");
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
