//! The behaviour every cluster store must have, and the replica's rules ([`ClusterState`])
//! driven against it: one suite, run against the in-memory store by this crate's tests (no
//! runtime: its calls are ready at once) and against Redis by the server's. A new store passes
//! it before it is used.
//!
//! Each scenario gets a store of its own ([`Stores::open`]). Time passes through the store
//! ([`Cluster::pass`]): a manual clock turns, a real store's clock runs while the test waits.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::{ClusterRules, ClusterState, EARLY_GRANT, Effect, ORPHAN_AFTER, Tell, Timer};
use crate::domain::Mode;
use crate::edge::coordinator::{
    ClusterView, Coordinator, Enqueued, Grant, NodeStore, Offer, Offered, Reported, SlotReport, SlotState,
};
use crate::queue::state::TicketId;

/// A step of a scenario that lets the store's time pass or changes the store.
pub type Wait<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One scenario's store.
pub trait Cluster: Send + Sync {
    /// A replica named `name`, with a lease of `lease`, on the scenario's store.
    fn replica(&self, name: &str, lease: Duration) -> Arc<dyn Coordinator>;
    /// A node named `name`, with a lease of `lease`, on the scenario's store.
    fn node(&self, name: &str, lease: Duration) -> Arc<dyn NodeStore>;
    /// Time passes for the store.
    fn pass(&self, by: Duration) -> Wait<'_>;
    /// The store loses everything (it restarted with no persistence).
    fn wipe(&self) -> Wait<'_>;
}

/// Makes a store for each scenario.
pub trait Stores {
    /// A new, empty store for the scenario named `scenario`.
    fn open(&self, scenario: &str) -> Box<dyn Cluster>;
}

/// Writes one test per scenario, each on a store of its own: `$run` is the test's body, with
/// the scenario's name and its function (`async fn(&dyn Cluster)`) bound to the names given. A
/// store's own tests name their test attribute and whether the test is `async`.
///
/// ```text
/// omni_actors::cluster_scenarios!(async #[tokio::test] |name, scenario| scenario(&*store(name)).await);
/// ```
#[macro_export]
macro_rules! cluster_scenarios {
    ($kind:ident #[$attr:meta] |$name:ident, $scenario:ident| $run:expr) => {
        $crate::cluster_scenarios!(@each $kind #[$attr] |$name, $scenario| $run;
            the_store_keeps_one_fifo_across_modes_with_places_kept_and_leases,
            a_freed_worker_goes_to_the_first_waiting_client_of_any_replica,
            a_refused_grant_puts_the_ticket_back_in_its_place,
            a_client_gone_before_its_worker_opened_gives_it_back,
            a_grant_ahead_of_its_enqueue_answer_is_kept_for_it,
            a_ticket_whose_enqueue_answer_was_lost_leaves_the_queue,
            a_store_that_forgot_the_replica_gets_its_clients_again_in_order,
            an_operators_cancel_reaches_the_client_at_the_next_beat
        );
    };
    (@each sync #[$attr:meta] |$name:ident, $scenario:ident| $run:expr; $($test:ident),*) => {$(
        #[$attr]
        fn $test() {
            let ($name, $scenario): (&str, _) = (stringify!($test), $crate::queue::suite::$test);
            $run
        }
    )*};
    (@each async #[$attr:meta] |$name:ident, $scenario:ident| $run:expr; $($test:ident),*) => {$(
        #[$attr]
        async fn $test() {
            let ($name, $scenario): (&str, _) = (stringify!($test), $crate::queue::suite::$test);
            $run
        }
    )*};
}

const LEASE: Duration = Duration::from_secs(30);
const ADDR: &str = "127.0.0.1:7100";

fn offer(slot: &str, nonce: &str, modes: &[Mode]) -> Offer {
    Offer {
        slot: slot.into(),
        nonce: nonce.into(),
        modes: modes.to_vec(),
        addr: ADDR.into(),
        sig: format!("sig-{nonce}"),
        ended: None,
        linked: Vec::new(),
    }
}

fn report(slot: &str, modes: &[Mode], state: Reported) -> SlotReport {
    SlotReport { slot: slot.into(), modes: modes.to_vec(), state }
}

fn waiting(e: Enqueued) -> (TicketId, usize) {
    match e {
        Enqueued::Waiting { ticket, position, .. } => (ticket, position),
        other => panic!("expected to wait: {other:?}"),
    }
}

fn order(view: &ClusterView) -> Vec<(TicketId, bool)> {
    view.tickets.iter().map(|t| (t.ticket, t.granted)).collect()
}

/// The store alone: its FIFO, grants, requeues, claims, averages, cancels and leases.
pub async fn the_store_keeps_one_fifo_across_modes_with_places_kept_and_leases(c: &dyn Cluster) {
    let gw = c.replica("g1", LEASE);
    let node = c.node("n1", LEASE);
    assert!(!gw.beat().await.unwrap().known, "a new replica is not known yet");
    assert!(gw.beat().await.unwrap().known);
    let busy = |slot: &str, modes: &[Mode]| report(slot, modes, Reported::Busy(0));
    node.node_beat(ADDR, Duration::from_secs(1), &[busy("n1/a", &[Mode::Audio])]).await.unwrap();
    assert_eq!(gw.enqueue(Mode::Video, None, 10).await.unwrap(), Enqueued::Unavailable, "no worker serves video");
    let both = [Mode::Video, Mode::Audio];
    node.node_beat(ADDR, Duration::from_secs(1), &[busy("n1/a", &[Mode::Audio]), busy("n1/v", &both)]).await.unwrap();

    let (t1, p1) = waiting(gw.enqueue(Mode::Audio, None, 10).await.unwrap());
    let (t2, p2) = waiting(gw.enqueue(Mode::Video, None, 10).await.unwrap());
    let (t3, p3) = waiting(gw.enqueue(Mode::Audio, None, 3).await.unwrap());
    assert_eq!((p1, p2, p3), (1, 2, 3));
    assert!(t1 < t2 && t2 < t3, "tickets are numbered in order");
    assert_eq!(gw.enqueue(Mode::Audio, None, 3).await.unwrap(), Enqueued::Full { length: 3 });

    // An audio-only worker takes the first audio ticket; the other takes the older video one.
    let queued = |ticket| Offered::Assigned { ticket, push: None };
    // (Replicas with links open to the node get their grants pushed; g1 has none.)
    let linked = Offer { linked: vec!["g0".into(), "g10".into()], ..offer("n1/a", "x1", &[Mode::Audio]) };
    assert_eq!(node.offer(linked).await.unwrap(), queued(t1));
    assert_eq!(node.offer(offer("n1/v", "y1", &both)).await.unwrap(), queued(t2));
    let g1 = gw.grants(Duration::from_millis(100)).await.unwrap();
    assert_eq!((g1[0].ticket, g1[0].slot.as_str(), g1[0].nonce.as_str()), (t1, "n1/a", "x1"));
    assert_eq!(g1[0].sig, "sig-x1", "the grant carries the node's signature of its offer");
    let g2 = if g1.len() > 1 { vec![g1[1].clone()] } else { gw.grants(Duration::from_millis(100)).await.unwrap() };
    assert_eq!((g2[0].ticket, g2[0].worker(), g2[0].mode), (t2, "v", Mode::Video));
    // Granted tickets keep their places until claimed.
    assert_eq!(order(&gw.snapshot().await.unwrap()), [(t1, true), (t2, true), (t3, false)]);

    // The node refused t1's grant (a stale nonce): t1 waits again, first; a requeue with a nonce
    // that is not the grant's does nothing.
    assert!(!gw.requeue(&Grant { nonce: "other".into(), ..g1[0].clone() }).await.unwrap());
    assert!(gw.requeue(&g1[0]).await.unwrap());
    gw.claim(t2).await.unwrap();
    let view = gw.snapshot().await.unwrap();
    assert_eq!(order(&view), [(t1, false), (t3, false)]);
    assert!(
        view.slots
            .iter()
            .any(|s| s.slot == "n1/v" && s.state == SlotState::Busy && s.busy.map(|b| b.0) == Some(Mode::Video))
    );

    // A session of 30 s ended on n1/v: its next offer feeds the average, and takes t1 (the head);
    // g1 keeps a link open to the node now: the grant is for the node to push, not on g1's list.
    let ended = Some((Mode::Video, Duration::from_secs(30)));
    let pushed = Offer { ended, linked: vec!["g0".into(), "g1".into()], ..offer("n1/v", "y2", &both) };
    assert_eq!(
        node.offer(pushed).await.unwrap(),
        Offered::Assigned { ticket: t1, push: Some(("g1".into(), Mode::Audio)) }
    );
    assert!(gw.grants(Duration::ZERO).await.unwrap().is_empty(), "a pushed grant is not listed");
    assert_eq!(gw.snapshot().await.unwrap().average_s[Mode::Video.index()], Some(30.0));
    // A grant the node could not push after all goes on the list.
    let grant = Grant {
        ticket: t1,
        slot: "n1/v".into(),
        addr: ADDR.into(),
        nonce: "y2".into(),
        mode: Mode::Audio,
        sig: "sig-y2".into(),
    };
    node.deliver("g1", &grant).await.unwrap();
    assert_eq!(gw.grants(Duration::from_millis(100)).await.unwrap(), [grant]);

    // Cancelled on any replica: its gateway hears it at its next beat.
    assert!(gw.cancel(t3).await.unwrap());
    assert_eq!(gw.beat().await.unwrap().cancelled, [t3]);

    // A replica whose lease runs out is retired by whoever beats next; its tickets leave.
    let short = c.replica("g2", Duration::from_millis(200));
    short.beat().await.unwrap();
    let (t4, _) = waiting(short.enqueue(Mode::Audio, None, 10).await.unwrap());
    c.pass(Duration::from_millis(400)).await;
    gw.beat().await.unwrap();
    assert!(gw.snapshot().await.unwrap().tickets.iter().all(|t| t.ticket != t4), "the dead replica's ticket left");
    // It beats again: it was forgotten, and enqueues its client again with the same ticket.
    assert!(!short.beat().await.unwrap().known);
    assert_eq!(waiting(short.enqueue(Mode::Audio, Some(t4), 10).await.unwrap()).0, t4);
    // A ticket enqueued again with its number after newer ones is shown in its place.
    let (t5, _) = waiting(gw.enqueue(Mode::Audio, None, 10).await.unwrap());
    assert!(gw.leave(t4).await.unwrap());
    assert_eq!(waiting(short.enqueue(Mode::Audio, Some(t4), 10).await.unwrap()).0, t4);
    let tickets: Vec<TicketId> = gw.snapshot().await.unwrap().tickets.iter().map(|t| t.ticket).collect();
    assert_eq!(tickets, [t1, t4, t5], "t1 keeps its place while granted");
}

/// A replica's rules over a store, with what a ClusterQueueActor would do carried out here: the
/// store's calls made at once, lends and tellings kept for the scenario to look at.
struct Replica {
    store: Arc<dyn Coordinator>,
    state: ClusterState<u64>,
    /// What clients were told, in order.
    told: VecDeque<(u64, Tell)>,
    /// Grants the pool was asked to lend, in order.
    lending: VecDeque<Grant>,
    given_back: Vec<usize>,
    /// Tickets it took out of the store's queue.
    left: Vec<TicketId>,
    /// Enqueues held back (their answers lost or late), when `hold` is set.
    held: Vec<(u64, Mode, Option<TicketId>)>,
    hold: bool,
    now: Instant,
}

impl Replica {
    async fn new(c: &dyn Cluster, name: &str) -> Replica {
        let store = c.replica(name, LEASE);
        let rules = ClusterRules {
            replica: name.into(),
            typical: [Duration::from_secs(60); 3],
            update_interval: Duration::from_secs(3),
        };
        let now = Instant::now();
        let mut r = Replica {
            store,
            state: ClusterState::new(rules, now),
            told: VecDeque::new(),
            lending: VecDeque::new(),
            given_back: Vec::new(),
            left: Vec::new(),
            held: Vec::new(),
            hold: false,
            now,
        };
        r.beat().await;
        r
    }

    /// Carries out effects until none are left.
    async fn apply(&mut self, effects: Vec<Effect<u64>>) {
        let mut todo: VecDeque<Effect<u64>> = effects.into();
        while let Some(effect) = todo.pop_front() {
            let more = match effect {
                Effect::Enqueue { conn, mode, ticket } => {
                    if self.hold {
                        self.held.push((conn, mode, ticket));
                        continue;
                    }
                    let answer = self.store.enqueue(mode, ticket, 100).await;
                    self.state.enqueued(conn, answer, self.now)
                }
                Effect::Beat => {
                    let beat = self.store.beat().await;
                    self.state.beaten(beat)
                }
                Effect::Lend(grant) => {
                    self.lending.push_back(grant);
                    continue;
                }
                Effect::GiveBack(worker) => {
                    self.given_back.push(worker);
                    continue;
                }
                Effect::Leave(ticket) => {
                    self.left.push(ticket);
                    self.store.leave(ticket).await.unwrap();
                    continue;
                }
                Effect::Requeue(grant) => {
                    self.store.requeue(&grant).await.unwrap();
                    continue;
                }
                Effect::Claim(ticket) => {
                    self.store.claim(ticket).await.unwrap();
                    continue;
                }
                Effect::Tell(conn, tell) => {
                    self.told.push_back((conn, tell));
                    continue;
                }
                // Updates go out at once here; a later telling waits for the scenario.
                Effect::After(Timer::SendUpdates, _) => self.state.send_updates(),
                Effect::After(Timer::TellLater, _) => continue,
            };
            todo.extend(more);
        }
    }

    async fn beat(&mut self) {
        self.apply(vec![Effect::Beat]).await;
    }

    async fn join(&mut self, conn: u64, mode: Mode) {
        let effects = self.state.join(conn, mode, conn, false);
        self.apply(effects).await;
    }

    async fn leave(&mut self, conn: u64) {
        let effects = self.state.leave(conn);
        self.apply(effects).await;
    }

    /// Reads the grants the store has for this replica and hands them to the rules.
    async fn read_grants(&mut self) {
        for grant in self.store.grants(Duration::from_millis(100)).await.unwrap() {
            let effects = self.state.granted(grant, self.now);
            self.apply(effects).await;
        }
    }

    /// A view of the store `later` from now (the store's clock as it is, the replica's moved on).
    async fn view(&mut self, later: Duration) {
        self.now += later;
        assert!(self.state.poll(self.now).is_some(), "a view is due");
        let view = self.store.snapshot().await.unwrap();
        let effects = self.state.viewed(Some(view), self.now);
        self.apply(effects).await;
    }

    fn next_told(&mut self) -> (u64, Tell) {
        self.told.pop_front().expect("a client was told something")
    }

    /// The position `conn` was told last (skipping what it heard before).
    fn position_of(&mut self, conn: u64) -> Option<usize> {
        self.told.iter().rev().find_map(|(c, t)| match t {
            Tell::Queued(i) | Tell::Update(i) if *c == conn => Some(i.position),
            _ => None,
        })
    }
}

/// A node whose workers are all busy (known to the store, serving their modes).
async fn node_with(c: &dyn Cluster, slots: &[(&str, &[Mode])]) -> Arc<dyn NodeStore> {
    let node = c.node("n1", LEASE);
    let reports: Vec<SlotReport> = slots.iter().map(|(s, m)| report(s, m, Reported::Busy(0))).collect();
    node.node_beat(ADDR, Duration::from_secs(5), &reports).await.unwrap();
    node.node_beat(ADDR, Duration::from_secs(5), &reports).await.unwrap();
    node
}

/// Positions are global; a worker freed on a node goes to the first waiting ticket of any replica.
pub async fn a_freed_worker_goes_to_the_first_waiting_client_of_any_replica(c: &dyn Cluster) {
    let node = node_with(c, &[("n1/w", &[Mode::Audio])]).await;
    let (mut a, mut b) = (Replica::new(c, "ga").await, Replica::new(c, "gb").await);
    a.join(1, Mode::Audio).await;
    b.join(2, Mode::Audio).await;
    a.join(3, Mode::Audio).await;
    assert!(matches!(a.next_told(), (1, Tell::Queued(i)) if i.position == 1));
    assert!(matches!(b.next_told(), (2, Tell::Queued(i)) if i.position == 2));
    assert!(matches!(a.next_told(), (3, Tell::Queued(i)) if i.position == 3));
    // The worker is freed: the first client of all, on replica a, gets it.
    assert!(matches!(node.offer(offer("n1/w", "n1", &[Mode::Audio])).await.unwrap(), Offered::Assigned { .. }));
    a.read_grants().await;
    let grant = a.lending.pop_front().expect("a lends the grant");
    assert_eq!(grant.nonce, "n1");
    let (ticket, to) = a.state.lent(grant.ticket, 0).unwrap_or_else(|_| panic!("its client is there"));
    assert_eq!((ticket, to), (grant.ticket, 1));
    let effects = a.state.claim(1);
    a.apply(effects).await;
    // The others move up: b's client is first now, and hears it.
    b.view(Duration::from_secs(1)).await;
    assert_eq!(b.position_of(2), Some(1));
    a.view(Duration::from_secs(1)).await;
    assert_eq!(a.position_of(3), Some(2));
}

/// The node refused a grant (its nonce was stale): the ticket waits again, first, and the
/// worker's next offer is its.
pub async fn a_refused_grant_puts_the_ticket_back_in_its_place(c: &dyn Cluster) {
    let node = node_with(c, &[("n1/w", &[Mode::Audio])]).await;
    let mut a = Replica::new(c, "ga").await;
    node.offer(offer("n1/w", "first", &[Mode::Audio])).await.unwrap();
    a.join(1, Mode::Audio).await;
    a.join(2, Mode::Audio).await;
    // Client 1 was granted the free worker at once.
    let grant = a.lending.pop_front().expect("granted at once");
    assert_eq!(grant.nonce, "first");
    let effects = a.state.lend_failed(grant.ticket, "stale grant");
    a.apply(effects).await;
    let view = a.store.snapshot().await.unwrap();
    assert_eq!(view.tickets[0].ticket, grant.ticket, "back in its place");
    assert!(!view.tickets[0].granted);
    node.offer(offer("n1/w", "second", &[Mode::Audio])).await.unwrap();
    a.read_grants().await;
    let again = a.lending.pop_front().expect("granted again");
    assert_eq!((again.ticket, again.nonce.as_str()), (grant.ticket, "second"));
}

/// A client that leaves while its worker is being opened: the worker goes back, the ticket leaves.
pub async fn a_client_gone_before_its_worker_opened_gives_it_back(c: &dyn Cluster) {
    let node = node_with(c, &[("n1/w", &[Mode::Audio])]).await;
    let mut a = Replica::new(c, "ga").await;
    node.offer(offer("n1/w", "x", &[Mode::Audio])).await.unwrap();
    a.join(1, Mode::Audio).await;
    a.join(2, Mode::Audio).await;
    let grant = a.lending.pop_front().expect("granted at once");
    a.leave(1).await;
    match a.state.lent(grant.ticket, 7) {
        Ok(_) => panic!("its client left"),
        Err(effects) => a.apply(effects).await,
    }
    assert_eq!(a.given_back, [7]);
    let tickets: Vec<TicketId> = a.store.snapshot().await.unwrap().tickets.iter().map(|t| t.ticket).collect();
    assert!(!tickets.contains(&grant.ticket), "the ticket left the queue");
    // The node offers the worker again (its next beat found the grant gone): client 2 gets it.
    node.offer(offer("n1/w", "y", &[Mode::Audio])).await.unwrap();
    a.read_grants().await;
    let next = a.lending.pop_front().expect("the next client is granted");
    assert_eq!(a.state.lent(next.ticket, 8).map(|(_, to)| to).ok(), Some(2));
}

/// The store's answer to an enqueue can come after a grant for its ticket: the grant is kept and
/// lent once the answer names the ticket; one nobody claims within [`EARLY_GRANT`] goes back.
pub async fn a_grant_ahead_of_its_enqueue_answer_is_kept_for_it(c: &dyn Cluster) {
    let node = node_with(c, &[("n1/w", &[Mode::Audio])]).await;
    let mut a = Replica::new(c, "ga").await;
    a.hold = true;
    a.join(1, Mode::Audio).await;
    let (conn, mode, ticket) = a.held.pop().expect("the enqueue is held");
    // The store runs it (the answer is on its way) and the node frees a worker meanwhile.
    let answer = a.store.enqueue(mode, ticket, 100).await;
    node.offer(offer("n1/w", "x", &[Mode::Audio])).await.unwrap();
    a.read_grants().await;
    assert!(a.lending.is_empty(), "kept until its ticket is known");
    let effects = a.state.enqueued(conn, answer, a.now);
    a.apply(effects).await;
    let grant = a.lending.pop_front().expect("lent once the answer came");
    assert_eq!(a.state.lent(grant.ticket, 0).map(|(_, to)| to).ok(), Some(1));
    // A grant for a ticket no client holds while none is joining (so no enqueue's answer is on
    // its way) is an orphan's: its ticket leaves the queue at once, before it is offered another
    // worker (kept, it drew a second one in a nemesis run).
    let stray = Grant {
        ticket: 42,
        slot: "n1/x".into(),
        addr: ADDR.into(),
        nonce: "s".into(),
        mode: Mode::Audio,
        sig: "sig-s".into(),
    };
    let effects = a.state.granted(stray.clone(), a.now);
    a.apply(effects).await;
    assert!(a.lending.is_empty());
    assert_eq!(a.left, [42], "its ticket leaves the queue");
    // While a client is joining, a grant for a ticket nobody holds may be its own, ahead of
    // the answer: kept a moment, then it goes back after EARLY_GRANT (at the next view that
    // reaps: the periodic one).
    a.left.clear();
    a.hold = true;
    a.join(2, Mode::Audio).await;
    let effects = a.state.granted(Grant { ticket: 43, ..stray }, a.now);
    a.apply(effects).await;
    assert!(a.lending.is_empty() && a.left.is_empty(), "kept a moment");
    a.view(EARLY_GRANT.max(Duration::from_secs(3)) + Duration::from_millis(1)).await;
    assert!(a.lending.is_empty());
    assert!(a.left.contains(&43), "its ticket leaves the queue: {:?}", a.left);
}

/// A ticket whose enqueue answer was lost (the call failed after the store ran it) leaves the
/// queue once it is [`ORPHAN_AFTER`] old: at the head, it would take every worker offered.
pub async fn a_ticket_whose_enqueue_answer_was_lost_leaves_the_queue(c: &dyn Cluster) {
    let _node = node_with(c, &[("n1/w", &[Mode::Audio])]).await;
    let mut a = Replica::new(c, "ga").await;
    a.hold = true;
    a.join(1, Mode::Audio).await;
    let (_, mode, ticket) = a.held.pop().expect("the enqueue is held");
    let (lost, _) = waiting(a.store.enqueue(mode, ticket, 100).await.unwrap());
    // The client gives up (its answer never came).
    a.leave(1).await;
    let view = a.store.snapshot().await.unwrap();
    assert_eq!(view.tickets.len(), 1, "the store still has it");
    // A view read ORPHAN_AFTER later.
    let later = ClusterView { now_ms: view.now_ms + ORPHAN_AFTER.as_millis() as u64 + 1000, ..view };
    a.now += Duration::from_secs(1);
    assert!(a.state.poll(a.now).is_some());
    let effects = a.state.viewed(Some(later), a.now);
    a.apply(effects).await;
    let tickets: Vec<TicketId> = a.store.snapshot().await.unwrap().tickets.iter().map(|t| t.ticket).collect();
    assert!(!tickets.contains(&lost), "the orphan left the queue");
    assert_eq!(a.left, [lost]);
}

/// The store lost everything (it restarted): the replica's next beat finds it unknown, and its
/// waiting clients are enqueued again, in order, with their tickets. No position told rises.
pub async fn a_store_that_forgot_the_replica_gets_its_clients_again_in_order(c: &dyn Cluster) {
    let slots: [(&str, &[Mode]); 1] = [("n1/w", &[Mode::Audio])];
    let node = node_with(c, &slots).await;
    let busy = [report("n1/w", &[Mode::Audio], Reported::Busy(0))];
    let mut a = Replica::new(c, "ga").await;
    let mut b = Replica::new(c, "gb").await;
    a.join(1, Mode::Audio).await;
    b.join(2, Mode::Audio).await;
    a.join(3, Mode::Audio).await;
    let before: Vec<TicketId> = a.store.snapshot().await.unwrap().tickets.iter().map(|t| t.ticket).collect();
    a.view(Duration::from_secs(1)).await;
    assert_eq!(a.position_of(3), Some(3));
    c.wipe().await;
    // The node beats first (its workers come back), then the replicas find they were forgotten.
    node.node_beat(ADDR, Duration::from_secs(5), &busy).await.unwrap();
    node.node_beat(ADDR, Duration::from_secs(5), &busy).await.unwrap();
    b.beat().await;
    a.beat().await;
    let after: Vec<TicketId> = a.store.snapshot().await.unwrap().tickets.iter().map(|t| t.ticket).collect();
    assert_eq!(after, before, "every ticket back, in its place");
    a.view(Duration::from_secs(1)).await;
    assert_eq!(a.position_of(3), Some(3), "never told higher");
}

/// An operator cancels a waiting ticket on any replica: its client hears it at its replica's
/// next beat.
pub async fn an_operators_cancel_reaches_the_client_at_the_next_beat(c: &dyn Cluster) {
    let _node = node_with(c, &[("n1/w", &[Mode::Audio])]).await;
    let mut a = Replica::new(c, "ga").await;
    let mut b = Replica::new(c, "gb").await;
    a.join(1, Mode::Audio).await;
    let (_, Tell::Queued(info)) = a.next_told() else { panic!("queued") };
    assert!(b.store.cancel(info.ticket).await.unwrap(), "cancelled from the other replica");
    let effects = b.state.cancelled(info.ticket, true);
    assert!(effects.is_empty(), "b has no client of that ticket");
    a.beat().await;
    assert_eq!(a.next_told(), (1, Tell::Cancelled));
}

/// The in-memory store's cluster, on a clock the scenarios turn.
pub struct Memory;

struct MemoryCluster {
    store: Arc<crate::edge::coordinator::memory::MemoryStore>,
    clock: Arc<crate::edge::coordinator::memory::ManualClock>,
}

impl Stores for Memory {
    fn open(&self, _: &str) -> Box<dyn Cluster> {
        use crate::edge::coordinator::memory::{ManualClock, MemoryStore};
        let clock = ManualClock::new(1_800_000_000_000);
        let read = clock.clone();
        Box::new(MemoryCluster { store: MemoryStore::with_clock(Arc::new(move || read.now())), clock })
    }
}

impl Cluster for MemoryCluster {
    fn replica(&self, name: &str, lease: Duration) -> Arc<dyn Coordinator> {
        self.store.replica(name, lease)
    }
    fn node(&self, name: &str, lease: Duration) -> Arc<dyn NodeStore> {
        self.store.node(name, lease)
    }
    fn pass(&self, by: Duration) -> Wait<'_> {
        self.clock.advance(by);
        Box::pin(std::future::ready(()))
    }
    fn wipe(&self) -> Wait<'_> {
        self.store.wipe();
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll, Waker};

    /// Polls a future whose every step is ready at once (the in-memory store's): no runtime.
    fn ready<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("the in-memory store's calls are ready at once"),
        }
    }

    crate::cluster_scenarios!(sync #[test] |name, scenario| ready(scenario(&*Memory.open(name))));
}
