//! The SIP calls the app accepts (a route's `accept = "webhook"`), as OpenAI's SIP has it: a call
//! rings while `realtime.call.incoming` tells the app its `call_id`; the app accepts it with the
//! session's settings (`POST /v1/realtime/calls/{call_id}/accept`) or rejects it with a SIP code
//! (`/reject`), and may later hang it up (`/hangup`). This is the book of those calls: the
//! ringing ones, each waiting for its [`Decision`], and the answered ones, each with a way to hang
//! it up. The signalling task of a call ([`super::invite::answer`]) and the HTTP routes meet here; the
//! rules are plain and tested without a runtime.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::caller::Refusal;

/// Calls ringing at once, at most: past it a call is refused (486) rather than offered.
pub const MAX_RINGING: usize = 1000;

/// Why a call does not ring.
#[derive(Debug, PartialEq, Eq)]
pub enum Busy {
    /// [`MAX_RINGING`] calls ring.
    Everywhere,
    /// Its trunk's address has this many ringing already.
    Trunk(usize),
}

/// What the app decided of a ringing call.
pub enum Decision {
    Accept(Accepted),
    /// Refused with this SIP code (4xx to 6xx).
    Reject {
        code: u16,
    },
}

/// An accept: the model it asked for, the app's settings for the session (as the server wrote
/// them in the session's dialect: handed to the session as the app's own first message), the
/// key that accepted it, and where the call's start (its admission) is told.
pub struct Accepted {
    pub model: Option<String>,
    pub first: Option<String>,
    pub key_id: Option<String>,
    pub done: oneshot::Sender<Result<(), Refusal>>,
}

/// The book of calls offered to the app.
#[derive(Default)]
pub struct Offers {
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    ringing: HashMap<String, (oneshot::Sender<Decision>, IpAddr)>,
    answered: HashMap<String, Answered>,
}

struct Answered {
    /// The key that accepted it (`None` on a gateway without keys).
    key_id: Option<String>,
    hang_up: mpsc::UnboundedSender<()>,
    /// Where the app's socket on the call attaches.
    door: Option<Door>,
}

/// Where the app's socket on an answered call attaches to its edge, and says it left.
pub type Door = (actix::Recipient<super::call::Attach>, actix::Recipient<super::call::Detach>);

impl Offers {
    /// A call from `trunk` starts ringing under `call_id`: where its decision will come, and
    /// the guard that withdraws it when dropped; refused when [`MAX_RINGING`] calls ring, or
    /// `per_trunk` from its address.
    pub fn ring<'a>(
        &'a self,
        call_id: &str,
        trunk: IpAddr,
        per_trunk: usize,
    ) -> Result<(Ringing<'a>, oneshot::Receiver<Decision>), Busy> {
        let mut book = self.book.lock();
        if book.ringing.len() >= MAX_RINGING {
            return Err(Busy::Everywhere);
        }
        let of_trunk = book.ringing.values().filter(|(_, ip)| *ip == trunk).count();
        if of_trunk >= per_trunk {
            return Err(Busy::Trunk(of_trunk));
        }
        let (tx, rx) = oneshot::channel();
        book.ringing.insert(call_id.to_string(), (tx, trunk));
        let settled = Arc::new(AtomicBool::new(false));
        Ok((Ringing { offers: self, call_id: call_id.to_string(), settled }, rx))
    }

    /// A ringing call stops ringing undecided (the caller gave up, or no one answered).
    fn withdraw(&self, call_id: &str) {
        self.book.lock().ringing.remove(call_id);
    }

    /// The app's decision for a ringing call; given back when no such call rings (never
    /// offered, already decided, or gone meanwhile).
    pub fn decide(&self, call_id: &str, decision: Decision) -> Result<(), Decision> {
        let Some((tx, _)) = self.book.lock().ringing.remove(call_id) else {
            return Err(decision);
        };
        tx.send(decision)
    }

    /// An accepted call is answered: `hang_up` ends it (as its session's end does), and the
    /// app's socket attaches at `door`.
    pub fn answered(
        &self,
        call_id: &str,
        key_id: Option<String>,
        hang_up: mpsc::UnboundedSender<()>,
        door: Option<Door>,
    ) {
        self.book.lock().answered.insert(call_id.to_string(), Answered { key_id, hang_up, door });
    }

    /// An answered call ended.
    pub fn ended(&self, call_id: &str) {
        self.book.lock().answered.remove(call_id);
    }

    /// Hangs up an answered call for `key_id`: whether such a call, accepted by that key (or
    /// by none, on a gateway without keys), was here.
    pub fn hang_up(&self, call_id: &str, key_id: Option<&str>) -> bool {
        let book = self.book.lock();
        match book.answered.get(call_id) {
            Some(call) if call.key_id.is_none() || call.key_id.as_deref() == key_id => call.hang_up.send(()).is_ok(),
            _ => false,
        }
    }

    /// Where the app's socket attaches to an answered call, for `key_id` (as [`Offers::hang_up`]).
    pub fn door(&self, call_id: &str, key_id: Option<&str>) -> Option<Door> {
        let book = self.book.lock();
        match book.answered.get(call_id) {
            Some(call) if call.key_id.is_none() || call.key_id.as_deref() == key_id => call.door.clone(),
            _ => None,
        }
    }

    /// How many calls ring now.
    pub fn ringing(&self) -> usize {
        self.book.lock().ringing.len()
    }
}

/// A ringing call, in the book until dropped.
pub struct Ringing<'a> {
    offers: &'a Offers,
    call_id: String,
    /// Set when it stops ringing: its offer is not sent (or sent again) after that.
    settled: Arc<AtomicBool>,
}

impl Ringing<'_> {
    /// Stops it ringing: no decision is taken after this.
    pub fn withdraw(&self) {
        self.settled.store(true, Ordering::Relaxed);
        self.offers.withdraw(&self.call_id);
    }

    /// What says it stopped ringing, for its offer's deliveries.
    pub fn settled(&self) -> Arc<AtomicBool> {
        self.settled.clone()
    }
}

impl Drop for Ringing<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn accept(session: Value) -> (Decision, oneshot::Receiver<Result<(), Refusal>>) {
        let (done, told) = oneshot::channel();
        let first = Some(session.to_string());
        (Decision::Accept(Accepted { model: None, first, key_id: Some("k1".into()), done }), told)
    }

    fn trunk() -> IpAddr {
        "198.51.100.7".parse().unwrap()
    }

    #[test]
    fn a_ringing_call_takes_one_decision_and_a_stranger_call_none() {
        let offers = Offers::default();
        let (_ringing, mut rx) = offers.ring("rtc_1", trunk(), 8).unwrap();
        assert!(offers.decide("rtc_2", Decision::Reject { code: 486 }).is_err());
        assert!(offers.decide("rtc_1", Decision::Reject { code: 486 }).is_ok());
        assert!(matches!(rx.try_recv(), Ok(Decision::Reject { code: 486 })));
        // Decided once: a second decision finds no call.
        let (second, _) = accept(json!({"type": "realtime"}));
        assert!(offers.decide("rtc_1", second).is_err());
        assert_eq!(offers.ringing(), 0);
    }

    #[test]
    fn a_withdrawn_or_abandoned_call_takes_no_decision() {
        let offers = Offers::default();
        let (ringing, _rx) = offers.ring("rtc_1", trunk(), 8).unwrap();
        let settled = ringing.settled();
        assert!(!settled.load(Ordering::Relaxed));
        ringing.withdraw();
        assert!(settled.load(Ordering::Relaxed), "its offer is not sent after");
        assert!(offers.decide("rtc_1", Decision::Reject { code: 603 }).is_err());
        // The call's task went away (its guard dropped): no decision is taken, no place held.
        drop(offers.ring("rtc_2", trunk(), 8).unwrap());
        assert!(offers.decide("rtc_2", Decision::Reject { code: 603 }).is_err());
        assert_eq!(offers.ringing(), 0);
        // Its receiver dropped while it is still in the book: the decision comes back.
        let (_ringing, rx) = offers.ring("rtc_3", trunk(), 8).unwrap();
        drop(rx);
        assert!(offers.decide("rtc_3", Decision::Reject { code: 603 }).is_err());
    }

    #[test]
    fn no_more_than_max_ringing_ring_at_once_nor_per_trunk_from_one_address() {
        let offers = Offers::default();
        let held: Vec<_> = (0..MAX_RINGING)
            .map(|i| offers.ring(&format!("rtc_{i}"), IpAddr::from([10, 0, (i / 256) as u8, i as u8]), 8).unwrap())
            .collect();
        assert_eq!(offers.ring("rtc_over", trunk(), 8).err(), Some(Busy::Everywhere));
        drop(held);
        let two: Vec<_> = (0..2).map(|i| offers.ring(&format!("rtc_{i}"), trunk(), 2).unwrap()).collect();
        assert_eq!(offers.ring("rtc_2", trunk(), 2).err(), Some(Busy::Trunk(2)));
        assert!(offers.ring("rtc_3", "198.51.100.8".parse().unwrap(), 2).is_ok());
        drop(two);
        assert!(offers.ring("rtc_2", trunk(), 2).is_ok());
    }

    #[test]
    fn an_answered_call_is_hung_up_by_the_key_that_accepted_it_only() {
        let offers = Offers::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        offers.answered("rtc_1", Some("k1".into()), tx, None);
        assert!(!offers.hang_up("rtc_1", Some("k2")));
        assert!(!offers.hang_up("rtc_1", None));
        assert!(rx.try_recv().is_err());
        assert!(offers.hang_up("rtc_1", Some("k1")));
        assert!(rx.try_recv().is_ok());
        offers.ended("rtc_1");
        assert!(!offers.hang_up("rtc_1", Some("k1")));
        // Accepted on a gateway without keys: whoever may reach the route.
        let (tx, _rx) = mpsc::unbounded_channel();
        offers.answered("rtc_2", None, tx, None);
        assert!(offers.hang_up("rtc_2", None));
    }
}
