//! How many transcriptions wait or run, bounded: a job over the bound is refused at once
//! (the session tells its client the transcription failed, and why) rather than queued
//! without limit behind the recognisers. Plain data, tested without a runtime.

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub(super) struct Backlog {
    taken: AtomicUsize,
    max: usize,
}

impl Backlog {
    /// At most `max` jobs waiting or running.
    pub(super) fn new(max: usize) -> Backlog {
        Backlog { taken: AtomicUsize::new(0), max }
    }

    /// A place for one more job, or the number taken when there is none.
    pub(super) fn admit(&self) -> Result<(), usize> {
        self.taken.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1)).map(|_| ())
    }

    /// A job is done: its place is free.
    pub(super) fn done(&self) {
        let _ = self.taken.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_bound_and_frees_a_place_per_job_done() {
        let b = Backlog::new(2);
        assert_eq!(b.admit(), Ok(()));
        assert_eq!(b.admit(), Ok(()));
        assert_eq!(b.admit(), Err(2));
        b.done();
        assert_eq!(b.admit(), Ok(()));
        assert_eq!(b.admit(), Err(2));
        for _ in 0..3 {
            b.done();
        }
        // Never below zero: two places, not three.
        assert_eq!((b.admit(), b.admit(), b.admit()), (Ok(()), Ok(()), Err(2)));
    }
}
