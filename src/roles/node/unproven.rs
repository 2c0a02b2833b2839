//! The connections of a node whose peer has not proved it holds the token yet, and what
//! keeps strangers from using them up: at most [`MAX_UNPROVEN`] in all and
//! [`MAX_UNPROVEN_PER_ADDRESS`] from one address (an IPv6 /64 counts as one). A connection over
//! the per-address cap is closed at once; one over the total takes the place of the oldest
//! unproven connection *of the address holding the most places*, when one holds more than
//! [`SMALL_SHARE`], else of the oldest connection. Strangers on a few dozen addresses, reconnecting
//! as they are cut off, evict each other: a gateway, which opens one or two links at a time and
//! proves the token within milliseconds, does not hold the most, so its connection keeps its
//! place however fast they churn. Strangers spread one or two to an address over more than a
//! hundred addresses are evicted oldest first (a gateway's new connection is the newest); a
//! stranger's place lasts until [`super::accept::HANDSHAKE_TIMEOUT`] at most.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Connections whose peer has not proved the token yet, at most.
pub(super) const MAX_UNPROVEN: usize = 256;
/// Of those, from one address (one /64 for IPv6), at most: a gateway opening more links than
/// this at once (a replica's standby links and its attaches) waits for its retries.
pub(super) const MAX_UNPROVEN_PER_ADDRESS: usize = 32;
/// Places an address may hold and still not be the one evicted from: a gateway's links at once.
pub(super) const SMALL_SHARE: usize = 2;

/// The rules, as a plain struct: who holds a place, from which address, in order of arrival.
#[derive(Debug, Default)]
pub(super) struct Places {
    /// Each address's places, the oldest first.
    per_address: HashMap<IpAddr, BTreeSet<u64>>,
    /// Each place's address.
    open: HashMap<u64, IpAddr>,
    next: u64,
}

/// A place given: its number, and the place it took from another connection, if any.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Entered {
    pub place: u64,
    pub evicted: Option<u64>,
}

impl Places {
    /// A place for a connection from `ip`, or `None` when its address holds its share.
    pub(super) fn enter(&mut self, ip: IpAddr) -> Option<Entered> {
        let address = omni_actors::net::counted_as(ip);
        if self.per_address.get(&address).map_or(0, BTreeSet::len) >= MAX_UNPROVEN_PER_ADDRESS {
            return None;
        }
        let evicted = if self.open.len() >= MAX_UNPROVEN { self.evict() } else { None };
        self.next += 1;
        self.per_address.entry(address).or_default().insert(self.next);
        self.open.insert(self.next, address);
        Some(Entered { place: self.next, evicted })
    }

    /// Frees the oldest place of the address holding the most (of those, the one whose oldest
    /// place is oldest) when it holds more than [`SMALL_SHARE`], else the oldest place of all,
    /// and says which it was. At most 256 addresses to look through.
    fn evict(&mut self) -> Option<u64> {
        let (held, std::cmp::Reverse(oldest)) = self
            .per_address
            .values()
            .filter_map(|places| Some((places.len(), std::cmp::Reverse(*places.first()?))))
            .max()?;
        let victim = if held > SMALL_SHARE { oldest } else { *self.open.keys().min()? };
        self.leave(victim);
        Some(victim)
    }

    /// Place `place` is given back (proved, closed, or evicted); a second time does nothing.
    pub(super) fn leave(&mut self, place: u64) {
        let Some(address) = self.open.remove(&place) else { return };
        if let Some(places) = self.per_address.get_mut(&address) {
            places.remove(&place);
            if places.is_empty() {
                self.per_address.remove(&address);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// The places of a node's connections, shared by its accept loops.
#[derive(Default)]
pub(super) struct Unproven {
    places: Mutex<Places>,
    /// What tells each connection it was evicted, by place.
    evict: Mutex<HashMap<u64, Arc<Notify>>>,
}

/// A connection's place, given back when dropped. [`Place::evicted`] ends when a newer
/// connection took it.
pub(super) struct Place {
    of: Arc<Unproven>,
    number: u64,
    evicted: Arc<Notify>,
}

impl Unproven {
    /// A place for a connection from `ip`, unless its address holds its share.
    pub(super) fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let entered = self.places.lock().enter(ip)?;
        let evicted = Arc::new(Notify::new());
        let mut evict = self.evict.lock();
        if let Some(oldest) = entered.evicted.and_then(|n| evict.remove(&n)) {
            oldest.notify_one();
        }
        evict.insert(entered.place, evicted.clone());
        Some(Place { of: self.clone(), number: entered.place, evicted })
    }
}

impl Place {
    /// Ends when a newer connection took this place (the total cap was reached).
    pub(super) async fn evicted(&self) {
        self.evicted.notified().await
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.of.places.lock().leave(self.number);
        self.of.evict.lock().remove(&self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_holds_its_share_and_no_more() {
        let mut p = Places::default();
        for _ in 0..MAX_UNPROVEN_PER_ADDRESS {
            assert!(p.enter(ip("192.0.2.1")).is_some());
        }
        assert_eq!(p.enter(ip("192.0.2.1")), None);
        assert_eq!(p.enter(ip("2001:db8:0:1::5")).map(|e| e.evicted), Some(None), "another address");
        // A /64 is one address.
        for i in 1..MAX_UNPROVEN_PER_ADDRESS {
            assert!(p.enter(ip(&format!("2001:db8:0:1::{:x}", i + 5))).is_some());
        }
        assert_eq!(p.enter(ip("2001:db8:0:1:ffff::1")), None);
    }

    #[test]
    fn past_the_total_the_newcomer_takes_the_oldest_place_of_the_busiest_address() {
        let mut p = Places::default();
        // 200 places from 10.0.0.x (one per address), then 56 from 198.51.100.7 and .8 (28 each).
        for i in 0..200 {
            assert_eq!(p.enter(ip(&format!("10.0.{}.{}", i / 200, i % 200 + 1))).unwrap().evicted, None);
        }
        let busiest: Vec<u64> = (0..28).map(|_| p.enter(ip("198.51.100.7")).unwrap().place).collect();
        let second: Vec<u64> = (0..28).map(|_| p.enter(ip("198.51.100.8")).unwrap().place).collect();
        assert_eq!(p.len(), MAX_UNPROVEN);
        // A gateway's connection takes .7's oldest (28 places, its oldest older than .8's).
        let gateway = p.enter(ip("192.0.2.99")).unwrap();
        assert_eq!(gateway.evicted, Some(busiest[0]));
        // Then .8 holds the most.
        assert_eq!(p.enter(ip("198.51.100.7")).unwrap().evicted, Some(second[0]));
        // However fast strangers churn, the gateway's one place is never the one taken.
        for round in 0..10_000 {
            let e = p.enter(ip(&format!("203.0.113.{}", round % 20 + 1))).unwrap();
            assert_ne!(e.evicted, Some(gateway.place), "round {round}");
            assert_eq!(p.len(), MAX_UNPROVEN);
        }
        p.leave(busiest[0]); // its connection ends later: nothing more happens
        assert_eq!(p.len(), MAX_UNPROVEN);
        p.leave(gateway.place);
        assert_eq!(p.len(), MAX_UNPROVEN - 1);
    }

    #[test]
    fn strangers_one_to_an_address_are_evicted_oldest_first() {
        let mut p = Places::default();
        let gateway = p.enter(ip("192.0.2.99")).unwrap().place;
        let second_link = p.enter(ip("192.0.2.99")).unwrap().place;
        for i in 0..MAX_UNPROVEN - 2 {
            p.enter(ip(&format!("10.{}.{}.1", i / 250, i % 250))).unwrap();
        }
        // The gateway's address holds the most (2), but no more than a gateway's share: the
        // oldest place goes, and the gateway's links were the first.
        assert_eq!(p.enter(ip("203.0.113.1")).unwrap().evicted, Some(gateway));
        assert_eq!(p.enter(ip("203.0.113.2")).unwrap().evicted, Some(second_link));
    }

    #[test]
    fn places_given_back_free_their_address() {
        let mut p = Places::default();
        let places: Vec<u64> = (0..MAX_UNPROVEN_PER_ADDRESS).map(|_| p.enter(ip("192.0.2.1")).unwrap().place).collect();
        for place in places {
            p.leave(place);
        }
        assert!(p.is_empty() && p.per_address.is_empty());
        assert!(p.enter(ip("192.0.2.1")).is_some());
    }
}
