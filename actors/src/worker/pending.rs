//! Silent-drop backpressure, as a plain struct: at most `capacity` unprocessed items;
//! pushing onto a full queue drops the oldest, so the newest is always kept.

use std::collections::VecDeque;

#[derive(Debug)]
pub struct Pending<T> {
    capacity: usize,
    items: VecDeque<T>,
}

impl<T> Pending<T> {
    /// `capacity` is at least 1.
    pub fn new(capacity: usize) -> Pending<T> {
        let capacity = capacity.max(1);
        Pending { capacity, items: VecDeque::with_capacity(capacity) }
    }

    /// Queues `item`; returns the oldest item when the queue was full.
    #[must_use = "a dropped item must be accounted for"]
    pub fn push(&mut self, item: T) -> Option<T> {
        let dropped = if self.items.len() >= self.capacity { self.items.pop_front() } else { None };
        self.items.push_back(item);
        dropped
    }

    pub fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    /// Empties the queue, returning what was in it.
    pub fn clear(&mut self) -> Vec<T> {
        self.items.drain(..).collect()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_capacity_dropping_the_oldest() {
        let mut p = Pending::new(2);
        assert_eq!(p.push(1), None);
        assert_eq!(p.push(2), None);
        assert_eq!(p.push(3), Some(1));
        assert_eq!(p.push(4), Some(2));
        assert_eq!(p.len(), 2);
        assert_eq!(p.pop(), Some(3));
        assert_eq!(p.pop(), Some(4));
        assert_eq!(p.pop(), None);
    }

    #[test]
    fn a_burst_keeps_the_newest() {
        let mut p = Pending::new(2);
        let dropped: Vec<_> = (1..=30).filter_map(|i| p.push(i)).collect();
        assert_eq!(dropped, (1..=28).collect::<Vec<_>>());
        assert_eq!(p.clear(), vec![29, 30]);
        assert!(p.is_empty());
    }

    #[test]
    fn capacity_zero_means_one() {
        let mut p = Pending::new(0);
        assert_eq!(p.push('a'), None);
        assert_eq!(p.push('b'), Some('a'));
    }
}
