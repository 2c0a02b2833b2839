//! What a node in a cluster keeps of the store: the store itself and how replicas reach this
//! node ([`Cluster`]), and each worker's offers to the store ([`Offers`]: the nonce it is
//! offered under, one offer awaiting its answer at a time). Plain data, tested without a
//! runtime; the Lender's cluster behaviour is `super::cluster`.

use std::sync::Arc;
use std::time::Duration;

use omni_actors::edge::coordinator::NodeStore;

/// What the offers and beats need.
pub(super) struct Cluster {
    pub store: Arc<dyn NodeStore>,
    /// Where replicas reach this node.
    pub advertise: String,
    pub attach_timeout: Duration,
    /// The store knows this node (its last beat said so).
    pub known: bool,
    /// The cluster's grant key (derived from the node's token): it signs its offers with it
    /// ([`omni_backend_host::link::grant`]).
    pub signer: ed25519_dalek::SigningKey,
}

/// A worker's offers to the store: the nonce it is offered under, and the offer the store has
/// not answered yet. One offer awaits its answer at a time: two in flight could both come back
/// assigned, and the grant would be pushed twice.
#[derive(Debug, Default)]
pub(super) struct Offers {
    /// The nonce it is offered under now; an attach with its grant takes it.
    pub current: Option<String>,
    /// The nonce of the offer the store has not answered yet.
    awaiting: Option<String>,
}

impl Offers {
    /// An offer under `nonce` goes to the store; false (and nothing changes) while another
    /// awaits its answer.
    pub(super) fn make(&mut self, nonce: String) -> bool {
        if self.awaiting.is_some() {
            return false;
        }
        self.current = Some(nonce.clone());
        self.awaiting = Some(nonce);
        true
    }

    /// The store has not answered the last offer yet.
    pub(super) fn awaiting(&self) -> bool {
        self.awaiting.is_some()
    }

    /// It is offered under `nonce` now: a grant with it may reserve the worker.
    pub(super) fn stands(&self, nonce: &str) -> bool {
        self.current.as_deref() == Some(nonce)
    }

    /// No offer stands and none awaits an answer: nobody offers a free worker in this state.
    /// Seen when an answer comes after a replica attached with that offer's grant (or the
    /// worker closed): the offer the worker tried when it was free again waited for this
    /// answer, so it is offered now; the beat offers any other (a grant pushed for an offer the
    /// worker had outlived).
    pub(super) fn lapsed(&self) -> bool {
        self.current.is_none() && self.awaiting.is_none()
    }

    /// The store answered the offer under `nonce`.
    pub(super) fn answered(&mut self, nonce: &str) {
        if self.awaiting.as_deref() == Some(nonce) {
            self.awaiting = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Offers;

    #[test]
    fn an_offer_taken_before_the_store_answered_is_made_again_when_the_answer_comes() {
        let mut offers = Offers::default();
        assert!(offers.make("a".into()));
        // A replica attaches with a's grant before the store's answer reaches the node...
        assert_eq!(offers.current.take().as_deref(), Some("a"));
        // ...and its link ends: the offer the free worker tries now waits for that answer.
        assert!(!offers.make("b".into()));
        assert!(offers.awaiting());
        // The answer comes and no offer stands: the worker is offered again, under a new nonce.
        offers.answered("a");
        assert!(offers.lapsed());
        assert!(offers.make("b".into()));
        assert_eq!(offers.current.as_deref(), Some("b"));
    }

    #[test]
    fn an_answered_offer_that_stands_is_not_made_again() {
        let mut offers = Offers::default();
        assert!(offers.make("a".into()));
        offers.answered("a");
        assert!(!offers.lapsed(), "the worker is offered under a until a grant of it is used");
        assert!(!offers.awaiting());
        assert_eq!(offers.current.as_deref(), Some("a"));
        assert!(offers.stands("a") && !offers.lapsed());
    }

    #[test]
    fn an_offer_lost_with_its_worker_leaves_it_lapsed_once_answered() {
        let mut offers = Offers::default();
        assert!(offers.make("a".into()));
        // The worker closes while the store has the offer: the offer no longer stands, and
        // none is made until the answer comes.
        offers.current = None;
        assert!(!offers.lapsed(), "an offer still awaits its answer");
        assert!(!offers.stands("a"), "a grant of a is stale");
        offers.answered("a");
        assert!(offers.lapsed(), "the beat offers it, if nothing else did");
    }
}
