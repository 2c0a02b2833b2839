//! Silent-drop backpressure, as a plain struct: unprocessed items up to a total weight (a
//! chunk's weight is its audio); pushing past it drops the oldest, so the newest is always kept.

use std::collections::VecDeque;

#[derive(Debug)]
pub(super) struct Pending<T> {
    capacity: usize,
    items: VecDeque<(T, usize)>,
    total: usize,
}

impl<T> Pending<T> {
    /// `capacity` (a total weight) is at least 1.
    pub(super) fn new(capacity: usize) -> Pending<T> {
        Pending { capacity: capacity.max(1), items: VecDeque::new(), total: 0 }
    }

    /// Queues `item` of `weight` (at least 1); returns the oldest items dropped to make room
    /// (the new one stays, even alone over the capacity).
    #[must_use = "a dropped item must be accounted for"]
    pub(super) fn push(&mut self, item: T, weight: usize) -> Vec<T> {
        let weight = weight.max(1);
        let mut dropped = Vec::new();
        while !self.items.is_empty() && self.total + weight > self.capacity {
            if let Some((old, w)) = self.items.pop_front() {
                self.total -= w;
                dropped.push(old);
            }
        }
        self.items.push_back((item, weight));
        self.total += weight;
        dropped
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        let (item, w) = self.items.pop_front()?;
        self.total -= w;
        Some(item)
    }

    /// Empties the queue, returning what was in it.
    pub(super) fn clear(&mut self) -> Vec<T> {
        self.total = 0;
        self.items.drain(..).map(|(item, _)| item).collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_capacity_dropping_the_oldest() {
        let mut p = Pending::new(2);
        assert_eq!(p.push(1, 1), Vec::<i32>::new());
        assert_eq!(p.push(2, 1), Vec::<i32>::new());
        assert_eq!(p.push(3, 1), vec![1]);
        assert_eq!(p.push(4, 1), vec![2]);
        assert_eq!(p.len(), 2);
        assert_eq!(p.pop(), Some(3));
        assert_eq!(p.pop(), Some(4));
        assert_eq!(p.pop(), None);
    }

    #[test]
    fn a_burst_keeps_the_newest() {
        let mut p = Pending::new(2);
        let dropped: Vec<_> = (1..=30).flat_map(|i| p.push(i, 1)).collect();
        assert_eq!(dropped, (1..=28).collect::<Vec<_>>());
        assert_eq!(p.clear(), vec![29, 30]);
        assert!(p.is_empty());
    }

    #[test]
    fn the_weight_bounds_the_queue_not_the_count() {
        // Two seconds of audio: eight quarter-second chunks fit, a ninth drops the oldest; a
        // whole second drops four of them.
        let mut p = Pending::new(32000);
        assert!((1..=8).all(|i| p.push(i, 4000).is_empty()));
        assert_eq!(p.push(9, 4000), vec![1]);
        assert_eq!(p.push(10, 16000), vec![2, 3, 4, 5]);
        assert_eq!(p.len(), 5);
        // One item heavier than the capacity stays, alone.
        assert_eq!(p.push(11, 40000), vec![6, 7, 8, 9, 10]);
        assert_eq!(p.clear(), vec![11]);
    }

    #[test]
    fn capacity_zero_means_one() {
        let mut p = Pending::new(0);
        assert_eq!(p.push('a', 1), vec![]);
        assert_eq!(p.push('b', 1), vec!['a']);
    }
}
