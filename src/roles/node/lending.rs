//! The lender's rules, as plain values: each of the node's workers with what it is lent to and
//! what it is offered under ([`Lendable`]), and every decision about it: whether a link may
//! borrow it (and why not), what its link's end frees, whether an offer goes to the store or
//! waits, whether a pushed grant may reserve it, what a beat reports of it and what discovery
//! shows. The [`super::lender::Lender`] actor delivers messages to these and makes the store's
//! and the links' calls; it decides nothing. `W` is the worker's handle (its `WorkerLink`; a
//! stand-in in the tests).

use std::time::{Duration, Instant};

use omni_actors::domain::Mode;
use omni_actors::edge::coordinator::Reported;
use omni_actors::status::WorkerStatus;

use super::messages::Refusal;
use super::offers::Offers;
use omni_backend_host::link::wire::NodeWorker;

/// One of the node's workers, as the lender sees it.
pub(super) struct Lendable<W> {
    pub(super) name: String,
    pub(super) modes: Vec<Mode>,
    /// Where its backend comes from, for discovery.
    pub(super) backend: String,
    /// Open: its handle. `None` while it (re)opens.
    pub(super) worker: Option<W>,
    /// Why it is not open, when it failed.
    pub(super) failure: Option<String>,
    /// The link it is lent to.
    pub(super) attached: Option<u64>,
    /// In a cluster: its offers to the store.
    pub(super) offer: Offers,
    /// In a cluster: the ticket, mode and start of the session attached.
    pub(super) session: Option<(u64, Mode, Instant)>,
    /// The mode and length of the last session, until the next offer reports it.
    pub(super) ended: Option<(Mode, Duration)>,
}

/// A grant a gateway attaches with: its ticket, the mode of its session, and the nonce the
/// worker was offered under.
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted<'a> {
    pub(super) ticket: u64,
    pub(super) mode: Mode,
    pub(super) nonce: &'a str,
}

/// What a link's end did.
#[derive(Debug, PartialEq)]
pub(super) enum Ended {
    /// The worker was not this link's (it ended before, or never held it).
    NotHeld,
    /// The worker is free; it had served a session of a ticket for this long, if in a cluster.
    Freed { session: Option<(u64, Duration)> },
}

impl<W: Clone> Lendable<W> {
    pub(super) fn new(name: String, modes: Vec<Mode>, backend: String) -> Lendable<W> {
        Lendable {
            name,
            modes,
            backend,
            worker: None,
            failure: None,
            attached: None,
            offer: Offers::default(),
            session: None,
            ended: None,
        }
    }

    /// Open and lent to nobody.
    pub(super) fn free(&self) -> bool {
        self.worker.is_some() && self.attached.is_none()
    }

    /// Its backend opened (or reset after a link): answers whether it opened just now, and
    /// whether it is to be offered (it is free and no offer stands: one made when its last
    /// link ended stands already).
    pub(super) fn idle(&mut self, worker: W) -> (bool, bool) {
        let opened = self.worker.is_none();
        self.worker = Some(worker);
        self.failure = None;
        (opened, self.attached.is_none() && self.offer.current.is_none())
    }

    /// Its backend closed (failing, or restarting): not lendable until it is open again. An
    /// offer still awaiting the store's answer keeps the next one waiting for it.
    pub(super) fn closed(&mut self, failure: Option<String>) {
        self.worker = None;
        self.failure = failure;
        self.offer.current = None;
    }

    /// Link `link` borrows it: in a cluster only with the grant of the offer it stands under
    /// (whose nonce is then spent). Answers its handle and the session's mode, or why not.
    pub(super) fn borrow(
        &mut self,
        link: u64,
        in_cluster: bool,
        grant: Option<Granted<'_>>,
        now: Instant,
    ) -> Result<(W, Mode), Refusal> {
        if self.attached.is_some() {
            return Err(Refusal::Attached(self.name.clone()));
        }
        if in_cluster {
            match grant {
                None => return Err(Refusal::NeedsGrant(self.name.clone())),
                Some(g) if !self.offer.stands(g.nonce) => {
                    return Err(Refusal::StaleGrant { ticket: g.ticket, worker: self.name.clone() });
                }
                Some(_) => {}
            }
        }
        let Some(worker) = self.worker.clone() else {
            return Err(match &self.failure {
                Some(reason) => Refusal::Failed { worker: self.name.clone(), reason: reason.clone() },
                None => Refusal::Starting(self.name.clone()),
            });
        };
        self.attached = Some(link);
        self.offer.current = None;
        self.session = grant.map(|g| (g.ticket, g.mode, now));
        Ok((worker, grant.map_or(self.modes[0], |g| g.mode)))
    }

    /// Link `link` ended: the worker is free again (its reset runs meanwhile), and the length of
    /// the session it served is kept for the next offer to report.
    pub(super) fn give_back(&mut self, link: u64, now: Instant) -> Ended {
        if self.attached != Some(link) {
            return Ended::NotHeld;
        }
        self.attached = None;
        let session = self.session.take().map(|(ticket, mode, since)| {
            let length = now.saturating_duration_since(since);
            self.ended = Some((mode, length));
            (ticket, length)
        });
        Ended::Freed { session }
    }

    /// An offer under `nonce` is to go to the store: only for a free worker, one at a time.
    pub(super) fn try_offer(&mut self, nonce: String) -> bool {
        self.free() && self.offer.make(nonce)
    }

    /// The store answered the offer under `nonce`: whether the worker is to be offered again (a
    /// grant of the offer was used before the answer came, and the worker is free again).
    pub(super) fn answered(&mut self, nonce: &str) -> bool {
        self.offer.answered(nonce);
        self.offer.lapsed() && self.free()
    }

    /// A grant the store made for the offer under `nonce` reserves the worker for link `link`,
    /// as an attach with it would, if the worker is still free under that offer. Answers its
    /// handle and the offer it stood under (given back if the push fails).
    pub(super) fn reserve(
        &mut self,
        nonce: &str,
        link: u64,
        ticket: u64,
        mode: Mode,
        now: Instant,
    ) -> Option<(W, Option<String>)> {
        if !(self.free() && self.offer.stands(nonce)) {
            return None;
        }
        let worker = self.worker.clone()?;
        let offer = self.offer.current.take();
        self.attached = Some(link);
        self.session = Some((ticket, mode, now));
        Some((worker, offer))
    }

    /// A push reserved for link `link` did not reach its replica: as if never reserved.
    /// Answers whether it was still reserved for that link.
    pub(super) fn unreserve(&mut self, link: u64, offer: Option<String>) -> bool {
        if self.attached != Some(link) {
            return false;
        }
        self.attached = None;
        self.session = None;
        self.offer.current = offer;
        true
    }

    /// What a beat reports of it to the store.
    pub(super) fn report(&self) -> Reported {
        match (&self.worker, self.attached, &self.offer.current) {
            (Some(_), Some(_), _) => Reported::Busy(self.session.map_or(0, |(ticket, ..)| ticket)),
            (None, ..) => Reported::Down,
            (Some(_), None, Some(_)) if self.offer.awaiting() => Reported::Pending,
            (Some(_), None, Some(nonce)) => Reported::Offered(nonce.clone()),
            (Some(_), None, None) => Reported::Pending,
        }
    }

    /// Whether a beat offers it: free with no offer standing or awaiting an answer.
    pub(super) fn unoffered(&self) -> bool {
        self.free() && self.offer.lapsed()
    }

    /// The worker as discovery shows it, in the words every role uses.
    pub(super) fn describe(&self) -> NodeWorker {
        let state = match (&self.worker, self.attached, &self.failure) {
            (Some(_), Some(_), _) => WorkerStatus::Busy,
            (Some(_), None, _) => WorkerStatus::Idle,
            (None, _, Some(_)) => WorkerStatus::Failed,
            (None, _, None) => WorkerStatus::Starting,
        };
        NodeWorker {
            name: self.name.clone(),
            modes: self.modes.clone(),
            backend: self.backend.clone(),
            state,
            reason: self.failure.clone().filter(|_| state == WorkerStatus::Failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Lendable<&'static str> {
        Lendable::new("sim-0".into(), vec![Mode::Audio, Mode::Chat], "builtin".into())
    }

    fn grant(nonce: &str) -> Option<Granted<'_>> {
        Some(Granted { ticket: 7, mode: Mode::Chat, nonce })
    }

    #[test]
    fn a_worker_is_lent_to_one_link_at_a_time_and_freed_by_its_end() {
        let t = Instant::now();
        let mut w = worker();
        assert_eq!(w.borrow(1, false, None, t), Err(Refusal::Starting("sim-0".into())));
        assert_eq!(w.idle("h"), (true, true), "opened now, and to be offered");
        assert_eq!(w.describe().state, WorkerStatus::Idle);
        assert_eq!(w.borrow(1, false, None, t), Ok(("h", Mode::Audio)), "its first mode without a grant");
        assert_eq!(w.borrow(2, false, None, t), Err(Refusal::Attached("sim-0".into())));
        assert_eq!(w.describe().state, WorkerStatus::Busy);
        assert_eq!(w.give_back(2, t), Ended::NotHeld, "not link 2's");
        assert_eq!(w.give_back(1, t), Ended::Freed { session: None });
        assert!(w.free());
        w.closed(Some("killed by signal 11 (SIGSEGV)".into()));
        let e = w.borrow(3, false, None, t).unwrap_err();
        assert!(matches!(e, Refusal::Failed { .. }), "{e}");
        let shown = w.describe();
        assert_eq!(
            (shown.state, shown.reason.as_deref()),
            (WorkerStatus::Failed, Some("killed by signal 11 (SIGSEGV)"))
        );
    }

    #[test]
    fn in_a_cluster_only_the_grant_of_the_standing_offer_attaches_and_spends_it() {
        let t = Instant::now();
        let mut w = worker();
        w.idle("h");
        assert!(w.try_offer("n1".into()));
        assert!(!w.try_offer("n2".into()), "one offer at a time");
        assert_eq!(w.borrow(1, true, None, t), Err(Refusal::NeedsGrant("sim-0".into())));
        let stale = w.borrow(1, true, grant("old"), t).unwrap_err();
        assert_eq!(stale, Refusal::StaleGrant { ticket: 7, worker: "sim-0".into() });
        assert_eq!(w.borrow(1, true, grant("n1"), t), Ok(("h", Mode::Chat)), "the grant's mode");
        assert_eq!(w.report(), Reported::Busy(7));
        // The session lasts 3 s: its end frees the worker and keeps its length for the next offer.
        let ended = w.give_back(1, t + Duration::from_secs(3));
        assert_eq!(ended, Ended::Freed { session: Some((7, Duration::from_secs(3))) });
        assert_eq!(w.ended, Some((Mode::Chat, Duration::from_secs(3))));
        // Its next offer waits for the store's answer to the first; the answer brings it back.
        assert!(!w.try_offer("n2".into()));
        assert!(w.answered("n1"), "offered again: the grant was used before the answer came");
        assert!(w.try_offer("n2".into()));
        assert_eq!(w.report(), Reported::Pending, "awaiting the store's answer");
        assert!(!w.answered("n2"));
        assert_eq!(w.report(), Reported::Offered("n2".into()));
    }

    #[test]
    fn a_pushed_grant_reserves_the_worker_only_while_its_offer_stands() {
        let t = Instant::now();
        let mut w = worker();
        w.idle("h");
        w.try_offer("n1".into());
        w.answered("n1");
        assert_eq!(w.reserve("n0", 5, 7, Mode::Audio, t), None, "not its offer");
        let (handle, offer) = w.reserve("n1", 5, 7, Mode::Audio, t).expect("reserved");
        assert_eq!((handle, offer.as_deref()), ("h", Some("n1")));
        assert_eq!(w.reserve("n1", 6, 8, Mode::Audio, t), None, "reserved once");
        // The replica could not be told: as if never reserved, under the same offer.
        assert!(w.unreserve(5, offer));
        assert!(w.free() && w.offer.stands("n1"));
        assert!(!w.unreserve(5, None), "reserved for nobody now");
    }

    #[test]
    fn a_closed_worker_is_reported_down_and_a_free_one_without_an_offer_is_offered_by_the_beat() {
        let mut w = worker();
        assert_eq!(w.report(), Reported::Down);
        assert_eq!(w.describe().state, WorkerStatus::Starting);
        w.idle("h");
        assert!(w.unoffered(), "free, nothing offered");
        w.try_offer("n1".into());
        assert!(!w.unoffered());
        w.closed(None);
        assert_eq!(w.report(), Reported::Down);
        assert!(!w.unoffered(), "closed: not offered");
        // Open again: to be offered once the first offer's answer has come.
        assert_eq!(w.idle("h"), (true, true));
        assert!(!w.try_offer("n2".into()), "the first offer still awaits its answer");
    }
}
