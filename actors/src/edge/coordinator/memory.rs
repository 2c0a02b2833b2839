//! A cluster's store kept in one process: the same steps the Redis store's scripts take, on
//! plain maps under a lock. It is the reference the cluster's rules are tested against without
//! a runtime or a server ([`crate::queue::cluster::suite`]); every call's future is ready at once
//! (but `grants` with a wait, which needs a tokio runtime when nothing is there yet).
//!
//! [`MemoryStore`] is the shared state; [`MemoryStore::replica`] and [`MemoryStore::node`] are
//! the handles its replicas and nodes hold. Its clock is the system's, or one the tests turn.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::{
    Beat, ClusterError, ClusterFuture, ClusterView, Coordinator, Enqueued, Grant, NodeBeat, NodeStore, Offer, Offered,
    Reported, SlotReport, SlotState, SlotView, TicketView,
};
use crate::domain::Mode;
use crate::ids::TicketId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TicketState {
    Waiting,
    Assigned,
}

#[derive(Debug, Clone)]
struct Ticket {
    gw: String,
    mode: Mode,
    state: TicketState,
    /// The grant it holds: slot, nonce, address.
    grant: Option<(String, String, String)>,
}

#[derive(Debug, Clone)]
struct Slot {
    node: String,
    addr: String,
    modes: Vec<Mode>,
    state: SlotState,
    nonce: String,
    sig: String,
    ticket: Option<TicketId>,
    mode: Option<Mode>,
    since: u64,
}

#[derive(Debug, Default)]
struct Inner {
    seq: u64,
    version: u64,
    /// Every ticket not yet claimed (positions).
    queue: BTreeSet<TicketId>,
    /// Tickets waiting for a worker, by mode.
    waiting: [BTreeSet<TicketId>; 3],
    tickets: HashMap<TicketId, Ticket>,
    /// Replica -> lease deadline (ms).
    replicas: HashMap<String, u64>,
    replica_tickets: HashMap<String, HashSet<TicketId>>,
    grants: HashMap<String, VecDeque<Grant>>,
    cancelled: HashMap<String, Vec<TicketId>>,
    /// Node -> lease deadline (ms).
    nodes: HashMap<String, u64>,
    node_slots: HashMap<String, BTreeSet<String>>,
    slots: HashMap<String, Slot>,
    /// Free slots serving a mode, by free-since then name.
    free: [BTreeSet<(u64, String)>; 3],
    /// Slots able to serve a mode.
    capable: [HashSet<String>; 3],
    average_s: [Option<f64>; 3],
}

/// A clock in milliseconds since the epoch.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The shared store. See the module doc.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    clock: Clock,
    /// Wakes a replica waiting for grants.
    granted: tokio::sync::Notify,
}

/// A clock the tests turn by hand.
#[derive(Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock starting at `start_ms` (ms since the epoch).
    pub fn new(start_ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicU64::new(start_ms)))
    }
    /// Turns the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
    /// The time now, in ms since the epoch.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn system_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl MemoryStore {
    /// An empty store on the system's clock.
    pub fn new() -> Arc<MemoryStore> {
        MemoryStore::with_clock(Arc::new(system_ms))
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: Clock) -> Arc<MemoryStore> {
        Arc::new(MemoryStore { inner: Mutex::new(Inner::default()), clock, granted: tokio::sync::Notify::new() })
    }

    /// The handle of replica `name`, alive `lease` after each beat.
    pub fn replica(self: &Arc<Self>, name: &str, lease: Duration) -> Arc<MemoryReplica> {
        Arc::new(MemoryReplica { store: self.clone(), name: name.to_string(), lease })
    }

    /// The handle of node `name`, alive `lease` after each beat.
    pub fn node(self: &Arc<Self>, name: &str, lease: Duration) -> Arc<MemoryNode> {
        Arc::new(MemoryNode { store: self.clone(), name: name.to_string(), lease })
    }

    /// Forgets everything, as a store that restarted empty.
    pub fn wipe(&self) {
        *self.inner.lock() = Inner::default();
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }
}

fn ready<T: Send + 'static>(value: Result<T, ClusterError>) -> ClusterFuture<T> {
    Box::pin(std::future::ready(value))
}

impl Inner {
    fn alive(deadlines: &HashMap<String, u64>, id: &str, now: u64) -> bool {
        deadlines.get(id).is_some_and(|d| *d >= now)
    }

    fn unfree(&mut self, slot: &str) {
        for set in &mut self.free {
            set.retain(|(_, s)| s != slot);
        }
    }

    fn drop_ticket(&mut self, seq: TicketId) {
        if let Some(t) = self.tickets.remove(&seq) {
            self.waiting[t.mode.index()].remove(&seq);
            if let Some(set) = self.replica_tickets.get_mut(&t.gw) {
                set.remove(&seq);
            }
        }
        self.queue.remove(&seq);
    }

    /// Gives `slot` to ticket `seq`; the grant goes to its replica's list when `push`.
    fn assign(&mut self, slot_name: &str, seq: TicketId, mode: Mode, push: bool, now: u64) -> Grant {
        let slot = self.slots.get_mut(slot_name).expect("a slot being assigned exists");
        let (nonce, addr, sig) = (slot.nonce.clone(), slot.addr.clone(), slot.sig.clone());
        slot.state = SlotState::Assigned;
        slot.ticket = Some(seq);
        slot.since = now;
        self.waiting[mode.index()].remove(&seq);
        let t = self.tickets.get_mut(&seq).expect("a ticket being assigned exists");
        t.state = TicketState::Assigned;
        t.grant = Some((slot_name.to_string(), nonce.clone(), addr.clone()));
        let gw = t.gw.clone();
        self.unfree(slot_name);
        let grant = Grant { ticket: seq, slot: slot_name.to_string(), addr, nonce, mode, sig };
        if push {
            self.grants.entry(gw).or_default().push_back(grant.clone());
        }
        self.version += 1;
        grant
    }

    /// The oldest free slot of a live node serving `mode` (free slots of dead nodes go).
    fn free_slot(&mut self, mode: Mode, now: u64) -> Option<String> {
        loop {
            let (_, head) = self.free[mode.index()].first()?.clone();
            let live = self.slots.get(&head).is_some_and(|s| Self::alive(&self.nodes, &s.node, now));
            if live {
                return Some(head);
            }
            self.unfree(&head);
        }
    }

    fn place(&mut self, seq: TicketId, mode: Mode, push: bool, now: u64) -> Option<Grant> {
        if let Some(slot) = self.free_slot(mode, now) {
            return Some(self.assign(&slot, seq, mode, push, now));
        }
        self.waiting[mode.index()].insert(seq);
        self.version += 1;
        None
    }

    /// A ticket's grant (of `slot`, if given) was not taken: it waits again in its place.
    fn unassign(&mut self, seq: TicketId, slot: Option<&str>, now: u64) {
        let Some(t) = self.tickets.get_mut(&seq) else { return };
        let granted = t.grant.as_ref().map(|g| g.0.as_str());
        if t.state == TicketState::Assigned && (slot.is_none() || granted == slot) {
            t.state = TicketState::Waiting;
            t.grant = None;
            let mode = t.mode;
            self.place(seq, mode, true, now);
        }
    }

    /// The first waiting ticket (of a live replica) of a mode in `modes`.
    fn head_for(&mut self, modes: &[Mode], now: u64) -> Option<(TicketId, Mode)> {
        let mut best: Option<(TicketId, Mode)> = None;
        for &m in modes {
            while let Some(&head) = self.waiting[m.index()].first() {
                let gw = self.tickets.get(&head).map(|t| t.gw.clone());
                if gw.is_some_and(|gw| Self::alive(&self.replicas, &gw, now)) {
                    if best.is_none_or(|(b, _)| head < b) {
                        best = Some((head, m));
                    }
                    break;
                }
                self.drop_ticket(head);
                self.waiting[m.index()].remove(&head);
            }
        }
        best
    }

    fn retire(&mut self, slot_name: &str, delete: bool, now: u64) {
        self.unfree(slot_name);
        let Some(slot) = self.slots.get(slot_name).cloned() else { return };
        for m in &slot.modes {
            self.capable[m.index()].remove(slot_name);
        }
        if delete {
            self.slots.remove(slot_name);
        } else if let Some(s) = self.slots.get_mut(slot_name) {
            s.state = SlotState::Down;
        }
        if slot.state == SlotState::Assigned
            && let Some(ticket) = slot.ticket
        {
            self.unassign(ticket, Some(slot_name), now);
        }
        self.version += 1;
    }

    fn position(&self, seq: TicketId) -> usize {
        self.queue.range(..seq).count() + 1
    }
}

/// A replica's handle on a [`MemoryStore`].
pub struct MemoryReplica {
    store: Arc<MemoryStore>,
    name: String,
    lease: Duration,
}

impl Coordinator for MemoryReplica {
    fn replica(&self) -> &str {
        &self.name
    }

    fn beat(&self) -> ClusterFuture<Beat> {
        let now = self.store.now();
        let mut s = self.store.inner.lock();
        let known = Inner::alive(&s.replicas, &self.name, now);
        let dead: Vec<String> =
            s.replicas.iter().filter(|(gw, d)| **d < now && **gw != self.name).map(|(gw, _)| gw.clone()).collect();
        for gw in dead {
            for seq in s.replica_tickets.remove(&gw).unwrap_or_default() {
                s.drop_ticket(seq);
            }
            s.grants.remove(&gw);
            s.replicas.remove(&gw);
            s.version += 1;
        }
        let dead: Vec<String> = s.nodes.iter().filter(|(_, d)| **d < now).map(|(n, _)| n.clone()).collect();
        for node in dead {
            for slot in s.node_slots.remove(&node).unwrap_or_default() {
                s.retire(&slot, true, now);
            }
            s.nodes.remove(&node);
        }
        if !known {
            for seq in s.replica_tickets.remove(&self.name).unwrap_or_default() {
                s.drop_ticket(seq);
            }
            s.grants.remove(&self.name);
        }
        s.replicas.insert(self.name.clone(), now + self.lease.as_millis() as u64);
        let cancelled = s.cancelled.remove(&self.name).unwrap_or_default();
        ready(Ok(Beat { known, cancelled }))
    }

    fn enqueue(&self, mode: Mode, given: Option<TicketId>, max_waiting: usize) -> ClusterFuture<Enqueued> {
        let now = self.store.now();
        let mut s = self.store.inner.lock();
        if !Inner::alive(&s.replicas, &self.name, now) {
            return ready(Ok(Enqueued::UnknownReplica));
        }
        if s.capable[mode.index()].is_empty() {
            return ready(Ok(Enqueued::Unavailable));
        }
        let seq = match given {
            None => {
                let length = s.queue.len();
                if length >= max_waiting && s.free_slot(mode, now).is_none() {
                    return ready(Ok(Enqueued::Full { length }));
                }
                // Numbered by the store's clock (microseconds), as the Redis store's are.
                let seq = (s.seq + 1).max(now * 1000);
                s.seq = seq;
                seq
            }
            Some(seq) => {
                if let Some(t) = s.tickets.get(&seq) {
                    if t.state == TicketState::Waiting {
                        let (position, length) = (s.position(seq), s.queue.len());
                        return ready(Ok(Enqueued::Waiting { ticket: seq, position, length }));
                    }
                    s.drop_ticket(seq);
                }
                seq
            }
        };
        s.tickets.insert(seq, Ticket { gw: self.name.clone(), mode, state: TicketState::Waiting, grant: None });
        s.replica_tickets.entry(self.name.clone()).or_default().insert(seq);
        s.queue.insert(seq);
        if let Some(grant) = s.place(seq, mode, false, now) {
            return ready(Ok(Enqueued::Granted(grant)));
        }
        let (position, length) = (s.position(seq), s.queue.len());
        ready(Ok(Enqueued::Waiting { ticket: seq, position, length }))
    }

    fn claim(&self, seq: TicketId) -> ClusterFuture<()> {
        let now = self.store.now();
        let mut s = self.store.inner.lock();
        let t = s.tickets.get(&seq).cloned();
        s.drop_ticket(seq);
        s.version += 1;
        if let Some(Ticket { state: TicketState::Assigned, grant: Some((slot, ..)), mode, .. }) = t
            && let Some(slot) = s.slots.get_mut(&slot)
            && slot.ticket == Some(seq)
        {
            slot.state = SlotState::Busy;
            slot.mode = Some(mode);
            slot.since = now;
            slot.ticket = None;
        }
        ready(Ok(()))
    }

    fn leave(&self, seq: TicketId) -> ClusterFuture<bool> {
        let mut s = self.store.inner.lock();
        let waiting = s.tickets.get(&seq).is_some_and(|t| t.state == TicketState::Waiting);
        s.drop_ticket(seq);
        s.version += 1;
        ready(Ok(waiting))
    }

    fn requeue(&self, grant: &Grant) -> ClusterFuture<bool> {
        let now = self.store.now();
        let mut s = self.store.inner.lock();
        let held = s.tickets.get(&grant.ticket).and_then(|t| t.grant.as_ref()).map(|g| g.1.clone());
        if held.as_deref() != Some(grant.nonce.as_str()) {
            return ready(Ok(false));
        }
        s.unassign(grant.ticket, None, now);
        ready(Ok(true))
    }

    fn cancel(&self, seq: TicketId) -> ClusterFuture<bool> {
        let mut s = self.store.inner.lock();
        let Some(t) = s.tickets.get(&seq).cloned() else { return ready(Ok(false)) };
        if t.state != TicketState::Waiting {
            return ready(Ok(false));
        }
        s.drop_ticket(seq);
        s.cancelled.entry(t.gw).or_default().push(seq);
        s.version += 1;
        ready(Ok(true))
    }

    fn version(&self) -> ClusterFuture<u64> {
        ready(Ok(self.store.inner.lock().version))
    }

    fn snapshot(&self) -> ClusterFuture<ClusterView> {
        let now = self.store.now();
        let s = self.store.inner.lock();
        let tickets = s
            .queue
            .iter()
            .filter_map(|seq| {
                let t = s.tickets.get(seq)?;
                let granted = t.state == TicketState::Assigned;
                Some(TicketView { ticket: *seq, mode: t.mode, replica: t.gw.clone(), granted })
            })
            .collect();
        let mut slots = Vec::new();
        let mut live: Vec<&String> = s.nodes.iter().filter(|(_, d)| **d >= now).map(|(n, _)| n).collect();
        live.sort();
        for node in live {
            for name in s.node_slots.get(node).into_iter().flatten() {
                let Some(slot) = s.slots.get(name) else { continue };
                let busy = match (slot.state, slot.mode) {
                    (SlotState::Busy, Some(mode)) => Some((mode, slot.since)),
                    _ => None,
                };
                let (modes, state) = (slot.modes.clone(), slot.state);
                slots.push(SlotView { slot: name.clone(), node: node.clone(), modes, state, busy });
            }
        }
        ready(Ok(ClusterView { version: s.version, now_ms: now, tickets, slots, average_s: s.average_s }))
    }

    fn grants(&self, wait: Duration) -> ClusterFuture<Vec<Grant>> {
        let take = |store: &MemoryStore, name: &str| -> Vec<Grant> {
            store.inner.lock().grants.get_mut(name).map(|g| g.drain(..).collect()).unwrap_or_default()
        };
        let now = take(&self.store, &self.name);
        if !now.is_empty() || wait.is_zero() {
            return ready(Ok(now));
        }
        let (store, name) = (self.store.clone(), self.name.clone());
        Box::pin(async move {
            let _ = tokio::time::timeout(wait, store.granted.notified()).await;
            Ok(take(&store, &name))
        })
    }
}

/// A node's handle on a [`MemoryStore`].
pub struct MemoryNode {
    store: Arc<MemoryStore>,
    name: String,
    lease: Duration,
}

impl NodeStore for MemoryNode {
    fn node(&self) -> &str {
        &self.name
    }

    fn offer(&self, offer: Offer) -> ClusterFuture<Offered> {
        let now = self.store.now();
        let mut s = self.store.inner.lock();
        if !Inner::alive(&s.nodes, &self.name, now) {
            return ready(Ok(Offered::UnknownNode));
        }
        if let Some((mode, length)) = offer.ended {
            let avg = &mut s.average_s[mode.index()];
            let before = avg.unwrap_or(length.as_secs_f64());
            *avg = Some(0.8 * before + 0.2 * length.as_secs_f64());
        }
        let previous = s.slots.get(&offer.slot).map(|slot| (slot.state, slot.ticket));
        s.slots.insert(
            offer.slot.clone(),
            Slot {
                node: self.name.clone(),
                addr: offer.addr.clone(),
                modes: offer.modes.clone(),
                state: SlotState::Free,
                nonce: offer.nonce.clone(),
                sig: offer.sig.clone(),
                ticket: None,
                mode: None,
                since: now,
            },
        );
        s.node_slots.entry(self.name.clone()).or_default().insert(offer.slot.clone());
        for m in &offer.modes {
            s.capable[m.index()].insert(offer.slot.clone());
        }
        if let Some((SlotState::Assigned, Some(old))) = previous {
            s.unassign(old, Some(&offer.slot), now);
        }
        if let Some((seq, mode)) = s.head_for(&offer.modes, now) {
            let gw = s.tickets[&seq].gw.clone();
            let linked = offer.linked.contains(&gw);
            s.assign(&offer.slot, seq, mode, !linked, now);
            drop(s);
            if linked {
                return ready(Ok(Offered::Assigned { ticket: seq, push: Some((gw, mode)) }));
            }
            self.store.granted.notify_waiters();
            return ready(Ok(Offered::Assigned { ticket: seq, push: None }));
        }
        s.unfree(&offer.slot);
        for m in &offer.modes {
            s.free[m.index()].insert((now, offer.slot.clone()));
        }
        s.version += 1;
        ready(Ok(Offered::Free))
    }

    fn node_beat(&self, addr: &str, attach_timeout: Duration, reports: &[SlotReport]) -> ClusterFuture<NodeBeat> {
        let now = self.store.now();
        let mut s = self.store.inner.lock();
        let known = Inner::alive(&s.nodes, &self.name, now);
        s.nodes.insert(self.name.clone(), now + self.lease.as_millis() as u64);
        let mut again = Vec::new();
        for r in reports {
            s.node_slots.entry(self.name.clone()).or_default().insert(r.slot.clone());
            let have = s.slots.get(&r.slot).cloned();
            match &r.state {
                Reported::Busy(tag) => {
                    if have.as_ref().is_some_and(|h| h.state == SlotState::Busy) {
                        continue;
                    }
                    let slot = s.slots.entry(r.slot.clone()).or_insert_with(|| Slot {
                        node: self.name.clone(),
                        addr: addr.to_string(),
                        modes: r.modes.clone(),
                        state: SlotState::Busy,
                        nonce: String::new(),
                        sig: String::new(),
                        ticket: None,
                        mode: None,
                        since: now,
                    });
                    slot.node = self.name.clone();
                    slot.addr = addr.to_string();
                    slot.modes = r.modes.clone();
                    slot.state = SlotState::Busy;
                    slot.since = now;
                    s.unfree(&r.slot);
                    for m in &r.modes {
                        s.capable[m.index()].insert(r.slot.clone());
                    }
                    if let Some(h) = &have
                        && h.state == SlotState::Assigned
                        && let Some(ticket) = h.ticket
                    {
                        if ticket != *tag {
                            s.unassign(ticket, Some(&r.slot), now);
                        } else {
                            s.drop_ticket(ticket);
                        }
                    }
                    s.version += 1;
                }
                Reported::Down => {
                    if have.as_ref().is_some_and(|h| h.state == SlotState::Down) {
                        continue;
                    }
                    match s.slots.get_mut(&r.slot) {
                        Some(slot) => {
                            slot.node = self.name.clone();
                            slot.addr = addr.to_string();
                            slot.modes = r.modes.clone();
                        }
                        None => {
                            s.slots.insert(
                                r.slot.clone(),
                                Slot {
                                    node: self.name.clone(),
                                    addr: addr.to_string(),
                                    modes: r.modes.clone(),
                                    state: SlotState::Down,
                                    nonce: String::new(),
                                    sig: String::new(),
                                    ticket: None,
                                    mode: None,
                                    since: now,
                                },
                            );
                        }
                    }
                    s.retire(&r.slot, false, now);
                }
                Reported::Offered(nonce) => match &have {
                    None => again.push(r.slot.clone()),
                    Some(h) if &h.nonce != nonce || matches!(h.state, SlotState::Busy | SlotState::Down) => {
                        again.push(r.slot.clone())
                    }
                    Some(h) if h.state == SlotState::Assigned => {
                        let gone = h.ticket.is_none_or(|t| !s.tickets.contains_key(&t));
                        if gone || now.saturating_sub(h.since) > attach_timeout.as_millis() as u64 {
                            again.push(r.slot.clone());
                        }
                    }
                    Some(_) => {}
                },
                Reported::Pending => {}
            }
        }
        ready(Ok(NodeBeat { known, again }))
    }

    fn deliver(&self, replica: &str, grant: &Grant) -> ClusterFuture<()> {
        self.store.inner.lock().grants.entry(replica.to_string()).or_default().push_back(grant.clone());
        self.store.granted.notify_waiters();
        ready(Ok(()))
    }
}
