//! The queue's rules, as a plain struct: who waits, in which order, which worker takes
//! whom, and how long each waiting client should expect to wait. [`crate::queue::local::QueueActor`]
//! only delivers messages to it; everything here is tested without a runtime.
//!
//! - FIFO across modes: a worker that becomes idle takes the first waiting ticket whose
//!   mode it serves; a new ticket takes an idle worker at once when one serves its mode
//!   (the one serving the fewest modes, to keep versatile workers free).
//! - Unavailable: a mode nothing is configured to serve (no worker of it, and no source of
//!   workers not reached yet) is refused at once; a ticket whose mode has no worker in sight
//!   (every one failed, or not reached yet) waits, and is let go after `unavailable_after`.
//! - ETA: each busy worker's expected remaining time from a moving average of past
//!   session lengths per mode, then the waiting tickets assigned in order to the
//!   earliest-free worker that serves them.

// Public for the queue's benchmark (the `testing` feature re-exports them); the crate's own.
#![cfg_attr(not(feature = "testing"), allow(unreachable_pub))]

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::domain::Mode;
use crate::protocol::QueueInfo;

pub(super) use crate::ids::{TicketId, WorkerId};
pub(crate) use crate::messages::queue::TicketStatus;

/// The modes one worker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ModeSet(u8);

impl ModeSet {
    /// The set of `modes`.
    pub fn of(modes: &[Mode]) -> ModeSet {
        ModeSet(modes.iter().fold(0, |acc, m| acc | 1 << m.index()))
    }
    /// Whether the set holds `mode`.
    pub fn contains(self, mode: Mode) -> bool {
        self.0 & (1 << mode.index()) != 0
    }
    /// How many modes the set holds.
    pub fn count(self) -> u32 {
        self.0.count_ones()
    }
}

/// A worker as the queue sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Availability {
    /// Opening its backend (at start, or after a restart): will serve, not yet.
    Starting,
    Idle,
    Busy {
        mode: Mode,
        since: Instant,
    },
    /// Its backend cannot be opened: it serves nobody until it recovers.
    Failed,
}

/// The answer to a client joining.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinOutcome {
    /// A worker was idle: it is reserved for this ticket.
    Assigned {
        /// The new ticket's number.
        ticket: TicketId,
        /// The worker reserved for it, until its session claims it.
        worker: WorkerId,
    },
    /// No worker is free: the ticket waits, at this position and estimated wait.
    Waiting(QueueInfo),
    /// `max_waiting` clients already wait.
    Full,
    /// Nothing is configured to serve this mode: no worker of it, and no source of workers
    /// (a node) not reached yet.
    Unavailable,
}

/// A ticket given a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    pub ticket: TicketId,
    pub worker: WorkerId,
    pub mode: Mode,
    /// Where it waited: every ticket from this index on moved up.
    pub index: usize,
}

/// The answer to a ticket leaving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveOutcome {
    /// It was waiting at this index: every ticket from there on moved up.
    Waited { index: usize },
    /// It had been given this worker but never claimed it; the worker is idle again.
    Unclaimed { worker: WorkerId },
    /// Unknown or already claimed: nothing to do.
    Nothing,
}

#[derive(Debug, Clone)]
struct Waiting {
    ticket: TicketId,
    mode: Mode,
    since: Instant,
}

#[derive(Debug, Clone)]
struct Slot {
    modes: ModeSet,
    state: Availability,
}

const EMA_WEIGHT: f64 = 0.2;

/// No estimate is under a second: a ticket that waits at all waits for something (a worker
/// opening, a hand-over).
const MIN_ETA_S: f64 = 1.0;

/// How long a session of average length `avg` that has run `elapsed` is expected to go on: what
/// is left of the average, but no less than a third of what it has run already (session lengths
/// are heavy-tailed: one that has lasted long is likely to last longer, not to end within a
/// second), and no less than a second. A third was the best of a half, a third and a quarter in
/// the estimate benchmark (docs/performance.md, "Wait estimates").
fn residual_s(avg: f64, elapsed: f64) -> f64 {
    (avg - elapsed).max(elapsed / 3.0).max(MIN_ETA_S)
}

/// How long a ticket waits with no worker of its mode in sight, by default.
const DEFAULT_UNAVAILABLE_AFTER: Duration = Duration::from_secs(30);

/// The queue's rules; see the module's documentation.
#[derive(Debug, Clone)]
pub struct QueueState {
    waiting: VecDeque<Waiting>,
    workers: Vec<Slot>,
    /// Idle workers, fewest modes first.
    idle: BTreeSet<(u32, WorkerId)>,
    /// Workers per mode that are not failed.
    capable: [usize; 3],
    /// Workers per mode, whatever their state (a failed one restarts).
    configured: [usize; 3],
    /// Sources of workers not reached yet (a gateway's `[[nodes]]`): their modes are unknown,
    /// so every mode may be served.
    expecting: usize,
    /// A ticket that has waited this long with no worker of its mode in sight (none that is
    /// not failed) is let go.
    unavailable_after: Duration,
    /// Since when each mode has had no worker in sight, when it lost its last one (None: it
    /// has one, or never had one: a ticket then counts from its own joining).
    unserved_since: [Option<Instant>; 3],
    reserved: HashMap<TicketId, WorkerId>,
    max_waiting: usize,
    /// Moving average of session length per mode, seconds.
    average_s: [f64; 3],
    /// A session of the mode has ended: its average is measured, not the typical guess.
    measured: [bool; 3],
    next_ticket: TicketId,
    /// The ETA simulation after the waiting tickets, kept while only joins happen.
    sim: Option<Sim>,
}

/// Workers' expected free times (ms after `at`), grouped by the modes they serve, after
/// `assigned` waiting tickets were given out in order.
#[derive(Debug, Clone)]
struct Sim {
    at: Instant,
    groups: Vec<(ModeSet, BinaryHeap<Reverse<u64>>)>,
    assigned: usize,
}

impl QueueState {
    /// `workers[i]` are the modes of worker `i`; all start as `Starting`. `initial_average`
    /// is the session length assumed per mode before any session ended.
    pub fn new(workers: &[ModeSet], max_waiting: usize, initial_average: [Duration; 3]) -> QueueState {
        let mut capable = [0; 3];
        for set in workers {
            for m in Mode::ALL {
                capable[m.index()] += set.contains(m) as usize;
            }
        }
        QueueState {
            waiting: VecDeque::new(),
            workers: workers.iter().map(|&modes| Slot { modes, state: Availability::Starting }).collect(),
            idle: BTreeSet::new(),
            capable,
            configured: capable,
            expecting: 0,
            unavailable_after: DEFAULT_UNAVAILABLE_AFTER,
            unserved_since: [None; 3],
            reserved: HashMap::new(),
            max_waiting,
            average_s: initial_average.map(|d| d.as_secs_f64()),
            measured: [false; 3],
            next_ticket: 1,
            sim: None,
        }
    }

    /// A queue kept elsewhere (a cluster's store), rebuilt for its positions and ETAs: the
    /// workers as they are, the waiting tickets in order.
    pub fn observed(
        workers: &[(ModeSet, Availability)],
        waiting: &[(TicketId, Mode)],
        average_s: [f64; 3],
        measured: [bool; 3],
        now: Instant,
    ) -> QueueState {
        let sets: Vec<ModeSet> = workers.iter().map(|w| w.0).collect();
        let mut queue = QueueState::new(&sets, usize::MAX, [Duration::ZERO; 3]);
        queue.average_s = average_s;
        queue.measured = measured;
        for (id, (_, state)) in workers.iter().enumerate() {
            queue.set_state(id, *state);
        }
        queue.waiting = waiting.iter().map(|&(ticket, mode)| Waiting { ticket, mode, since: now }).collect();
        queue
    }

    /// `sources` sources of workers are not reached yet (a gateway's `[[nodes]]`): until each is
    /// ([`QueueState::reached`]), a client of any mode waits rather than being refused.
    pub fn expecting(mut self, sources: usize) -> QueueState {
        self.expecting = sources;
        self
    }

    /// A ticket that waits this long with no worker of its mode in sight is let go
    /// ([`QueueState::stranded`]).
    pub fn unavailable_after(mut self, after: Duration) -> QueueState {
        self.unavailable_after = after;
        self
    }

    /// A source of workers was reached (its workers joined first). Returns the waiting tickets
    /// of modes nothing is configured to serve now; they are removed from the queue.
    pub fn reached(&mut self) -> Vec<TicketId> {
        self.expecting = self.expecting.saturating_sub(1);
        self.drop_unservable()
    }

    /// Removes and returns the tickets that have had no worker of their mode in sight (every
    /// one able to serve it failed, or not reached yet) for `unavailable_after` or longer: since
    /// they joined, or since their mode lost its last worker, whichever is later.
    pub fn stranded(&mut self, now: Instant) -> Vec<TicketId> {
        let (after, capable, unserved) = (self.unavailable_after, self.capable, self.unserved_since);
        let in_sight = |w: &Waiting| {
            let m = w.mode.index();
            let since = unserved[m].map_or(w.since, |lost| lost.max(w.since));
            capable[m] > 0 || now.saturating_duration_since(since) < after
        };
        let (keep, stranded): (VecDeque<Waiting>, VecDeque<Waiting>) = self.waiting.drain(..).partition(in_sight);
        self.waiting = keep;
        if !stranded.is_empty() {
            self.sim = None;
        }
        stranded.into_iter().map(|w| w.ticket).collect()
    }

    /// How long a ticket waits with no worker of its mode in sight.
    pub fn unavailable_after_s(&self) -> f64 {
        self.unavailable_after.as_secs_f64()
    }

    /// A worker joins (one of a node's, discovered after start): it is `Starting`, and
    /// counts as able to serve its modes. Returns its id, the next in order.
    pub fn add_worker(&mut self, modes: ModeSet) -> WorkerId {
        self.sim = None;
        for m in Mode::ALL {
            self.capable[m.index()] += modes.contains(m) as usize;
            self.configured[m.index()] += modes.contains(m) as usize;
        }
        self.workers.push(Slot { modes, state: Availability::Starting });
        self.workers.len() - 1
    }

    /// How many tickets are waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether no ticket is waiting.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The worker's availability; `None` for an unknown id.
    #[cfg(test)]
    pub fn availability(&self, worker: WorkerId) -> Option<Availability> {
        self.workers.get(worker).map(|s| s.state)
    }

    /// Whether any worker that is not failed serves `mode`.
    #[cfg(test)]
    pub fn serves(&self, mode: Mode) -> bool {
        self.capable[mode.index()] > 0
    }

    /// Whether something is configured to serve `mode`: a worker of it (failed ones restart),
    /// or a source of workers not reached yet.
    pub fn may_serve(&self, mode: Mode) -> bool {
        self.configured[mode.index()] > 0 || self.expecting > 0
    }

    /// A client asks for a worker.
    pub fn join(&mut self, mode: Mode, now: Instant) -> JoinOutcome {
        self.join_at(mode, now, false)
    }

    /// A client whose assigned worker was gone before it could take it asks again: it
    /// goes to the head of the queue (it had already waited its turn), even when full.
    pub fn rejoin(&mut self, mode: Mode, now: Instant) -> JoinOutcome {
        self.join_at(mode, now, true)
    }

    fn join_at(&mut self, mode: Mode, now: Instant, front: bool) -> JoinOutcome {
        if !self.may_serve(mode) {
            return JoinOutcome::Unavailable;
        }
        let ticket = self.next_ticket;
        if let Some(worker) = self.take_idle(mode) {
            self.next_ticket += 1;
            self.reserve(ticket, worker, mode, now);
            return JoinOutcome::Assigned { ticket, worker };
        }
        if front {
            self.next_ticket += 1;
            self.waiting.push_front(Waiting { ticket, mode, since: now });
            self.sim = None;
            let info = self.infos(0, 1, now).remove(0);
            return JoinOutcome::Waiting(info);
        }
        if self.waiting.len() >= self.max_waiting {
            return JoinOutcome::Full;
        }
        self.next_ticket += 1;
        self.waiting.push_back(Waiting { ticket, mode, since: now });
        let position = self.waiting.len();
        let estimated_wait_s = self.eta_of_last(mode, now);
        let measured = self.measured[mode.index()];
        JoinOutcome::Waiting(QueueInfo { ticket, position, estimated_wait_s, queue_length: position, measured })
    }

    /// A ticket leaves: it disconnected, was cancelled, or its session ended.
    pub fn leave(&mut self, ticket: TicketId) -> LeaveOutcome {
        if let Some(index) = self.waiting.iter().position(|w| w.ticket == ticket) {
            self.waiting.remove(index);
            self.sim = None;
            return LeaveOutcome::Waited { index };
        }
        match self.reserved.remove(&ticket) {
            Some(worker) => {
                self.set_state(worker, Availability::Idle);
                LeaveOutcome::Unclaimed { worker }
            }
            None => LeaveOutcome::Nothing,
        }
    }

    /// The session of `ticket` took the worker it was given.
    pub fn claim(&mut self, ticket: TicketId) {
        self.reserved.remove(&ticket);
    }

    /// A worker is (re)starting: it will serve once idle.
    pub fn worker_starting(&mut self, worker: WorkerId) {
        self.set_state(worker, Availability::Starting);
    }

    /// A worker is ready for a session. Returns the ticket it takes, if one waits.
    pub fn worker_idle(&mut self, worker: WorkerId, now: Instant) -> Option<Assignment> {
        let modes = self.workers[worker].modes;
        match self.waiting.iter().position(|w| modes.contains(w.mode)) {
            Some(index) => {
                let w = self.waiting.remove(index).expect("index found above");
                self.reserve(w.ticket, worker, w.mode, now);
                Some(Assignment { ticket: w.ticket, worker, mode: w.mode, index })
            }
            None => {
                self.set_state(worker, Availability::Idle);
                None
            }
        }
    }

    /// A worker cannot serve (its backend does not open; it is reopened with backoff). Its
    /// clients keep waiting: those of a mode no other worker serves are let go once they have
    /// waited `unavailable_after` ([`QueueState::stranded`]).
    pub fn worker_failed(&mut self, worker: WorkerId, now: Instant) {
        let had = self.capable;
        self.set_state(worker, Availability::Failed);
        for m in Mode::ALL {
            let i = m.index();
            if had[i] > 0 && self.capable[i] == 0 {
                self.unserved_since[i] = Some(now);
            }
        }
    }

    /// Removes and returns the waiting tickets of modes nothing is configured to serve any more.
    fn drop_unservable(&mut self) -> Vec<TicketId> {
        let (configured, expecting) = (self.configured, self.expecting);
        let (keep, orphaned): (VecDeque<Waiting>, VecDeque<Waiting>) =
            self.waiting.drain(..).partition(|w| configured[w.mode.index()] > 0 || expecting > 0);
        self.waiting = keep;
        orphaned.into_iter().map(|w| w.ticket).collect()
    }

    /// The worker's backend serves fewer modes than it was configured for (a backend
    /// without vision serves no video): it keeps only `modes`. Returns the waiting tickets
    /// that no worker can serve any more; they are removed from the queue.
    pub fn narrow(&mut self, worker: WorkerId, modes: ModeSet) -> Vec<TicketId> {
        self.sim = None;
        let slot = &mut self.workers[worker];
        let kept = ModeSet(slot.modes.0 & modes.0);
        for m in Mode::ALL {
            if slot.modes.contains(m) && !kept.contains(m) {
                self.configured[m.index()] -= 1;
                if slot.state != Availability::Failed {
                    self.capable[m.index()] -= 1;
                }
            }
        }
        if self.idle.remove(&(slot.modes.count(), worker)) {
            self.idle.insert((kept.count(), worker));
        }
        slot.modes = kept;
        self.drop_unservable()
    }

    /// A session of `mode` lasted `length`: it feeds the ETA's moving average.
    pub fn session_finished(&mut self, mode: Mode, length: Duration) {
        let (avg, measured) = (&mut self.average_s[mode.index()], &mut self.measured[mode.index()]);
        // The typical length was a guess: the first session measured replaces it.
        *avg = if *measured {
            (1.0 - EMA_WEIGHT) * *avg + EMA_WEIGHT * length.as_secs_f64()
        } else {
            length.as_secs_f64()
        };
        *measured = true;
        self.sim = None;
    }

    /// The average session length of `mode`, as the ETAs use it.
    #[cfg(test)]
    pub fn average_session(&self, mode: Mode) -> Duration {
        Duration::from_secs_f64(self.average_s[mode.index()])
    }

    /// Position and ETA of every waiting ticket from `index` on (1-based positions).
    pub fn infos_from(&self, index: usize, now: Instant) -> Vec<QueueInfo> {
        self.infos(index, usize::MAX, now)
    }

    /// Position and ETA of at most `count` waiting tickets from `index` on.
    pub fn infos(&self, index: usize, count: usize, now: Instant) -> Vec<QueueInfo> {
        let length = self.waiting.len();
        let end = index.saturating_add(count).min(length);
        let etas = self.etas(now, end);
        self.waiting
            .iter()
            .zip(etas)
            .enumerate()
            .skip(index)
            .map(|(i, (w, eta))| QueueInfo {
                ticket: w.ticket,
                position: i + 1,
                estimated_wait_s: eta,
                queue_length: length,
                measured: self.measured[w.mode.index()],
            })
            .collect()
    }

    /// Every waiting ticket, for `/status`.
    pub fn tickets(&self, now: Instant) -> Vec<TicketStatus> {
        let etas = self.etas(now, self.waiting.len());
        self.waiting
            .iter()
            .zip(etas)
            .enumerate()
            .map(|(i, (w, eta))| TicketStatus {
                ticket: w.ticket,
                mode: w.mode,
                position: i + 1,
                waited: now.saturating_duration_since(w.since),
                estimated_wait_s: eta,
                replica: None,
            })
            .collect()
    }

    /// ETAs of the first `n` waiting tickets, in seconds.
    fn etas(&self, now: Instant, n: usize) -> Vec<f64> {
        let mut sim = self.simulate(now);
        self.waiting.iter().take(n).map(|w| self.assign_in(&mut sim, w.mode).max(MIN_ETA_S)).collect()
    }

    /// The simulation's start: each worker's expected free time.
    fn simulate(&self, now: Instant) -> Sim {
        // Workers grouped by the modes they serve; in each group a min-heap of the
        // moment (ms from now) each worker is expected to be free.
        let mut groups: HashMap<ModeSet, BinaryHeap<Reverse<u64>>> = HashMap::new();
        for slot in &self.workers {
            let free_ms = match slot.state {
                Availability::Failed => continue,
                Availability::Starting | Availability::Idle => 0,
                Availability::Busy { mode, since } => {
                    let elapsed = now.saturating_duration_since(since).as_secs_f64();
                    (residual_s(self.average_s[mode.index()], elapsed) * 1000.0) as u64
                }
            };
            groups.entry(slot.modes).or_default().push(Reverse(free_ms));
        }
        let mut groups: Vec<(ModeSet, BinaryHeap<Reverse<u64>>)> = groups.into_iter().collect();
        groups.sort_by_key(|(set, _)| *set);
        Sim { at: now, groups, assigned: 0 }
    }

    /// Gives the next waiting ticket (of `mode`) to the earliest-free worker serving it;
    /// returns its ETA in seconds from the simulation's start.
    fn assign_in(&self, sim: &mut Sim, mode: Mode) -> f64 {
        sim.assigned += 1;
        let best = sim
            .groups
            .iter_mut()
            .filter(|(set, heap)| set.contains(mode) && !heap.is_empty())
            .min_by_key(|(_, heap)| heap.peek().map(|r| r.0));
        match best {
            Some((_, heap)) => {
                let Reverse(free) = heap.pop().expect("non-empty heap");
                heap.push(Reverse(free + (self.average_s[mode.index()] * 1000.0) as u64));
                free as f64 / 1000.0
            }
            None => 0.0,
        }
    }

    /// The ETA of a ticket that just joined at the end of the queue: the kept simulation
    /// is extended by one ticket (O(log workers)) instead of redone for every ticket.
    fn eta_of_last(&mut self, mode: Mode, now: Instant) -> f64 {
        let fresh = !matches!(&self.sim, Some(s) if s.assigned + 1 == self.waiting.len());
        if fresh {
            let mut sim = self.simulate(now);
            for w in self.waiting.iter().take(self.waiting.len() - 1) {
                self.assign_in(&mut sim, w.mode);
            }
            self.sim = Some(sim);
        }
        let mut sim = self.sim.take().expect("set above");
        let eta = self.assign_in(&mut sim, mode) - now.saturating_duration_since(sim.at).as_secs_f64();
        self.sim = Some(sim);
        eta.max(MIN_ETA_S)
    }

    fn take_idle(&mut self, mode: Mode) -> Option<WorkerId> {
        let found = self.idle.iter().find(|(_, w)| self.workers[*w].modes.contains(mode)).copied()?;
        self.idle.remove(&found);
        Some(found.1)
    }

    fn reserve(&mut self, ticket: TicketId, worker: WorkerId, mode: Mode, now: Instant) {
        self.set_state(worker, Availability::Busy { mode, since: now });
        self.reserved.insert(ticket, worker);
    }

    fn set_state(&mut self, worker: WorkerId, state: Availability) {
        self.sim = None;
        let slot = &mut self.workers[worker];
        let key = (slot.modes.count(), worker);
        let was_failed = slot.state == Availability::Failed;
        let now_failed = state == Availability::Failed;
        if was_failed != now_failed {
            for m in Mode::ALL {
                if slot.modes.contains(m) {
                    let c = &mut self.capable[m.index()];
                    *c = if now_failed { *c - 1 } else { *c + 1 };
                }
            }
        }
        slot.state = state;
        if state == Availability::Idle {
            self.idle.insert(key);
        } else {
            self.idle.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: ModeSet = ModeSet(0b111);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn queue(workers: &[ModeSet], max: usize) -> QueueState {
        QueueState::new(workers, max, [secs(60), secs(100), secs(200)])
    }

    fn waiting(j: JoinOutcome) -> QueueInfo {
        match j {
            JoinOutcome::Waiting(info) => info,
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    #[test]
    fn an_idle_worker_is_assigned_at_once() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10);
        assert_eq!(q.worker_idle(0, t), None);
        assert_eq!(q.join(Mode::Video, t), JoinOutcome::Assigned { ticket: 1, worker: 0 });
        assert_eq!(q.availability(0), Some(Availability::Busy { mode: Mode::Video, since: t }));
        assert!(q.is_empty());
    }

    #[test]
    fn a_rejoining_client_goes_to_the_head_even_when_full() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 2);
        q.worker_idle(0, t);
        q.join(Mode::Audio, t);
        waiting(q.join(Mode::Audio, t));
        waiting(q.join(Mode::Audio, t));
        assert_eq!(q.join(Mode::Audio, t), JoinOutcome::Full);
        let back = waiting(q.rejoin(Mode::Video, t));
        assert_eq!((back.position, back.queue_length), (1, 3));
        assert_eq!(q.worker_idle(0, t).map(|a| a.ticket), Some(back.ticket), "it is served first");
    }

    #[test]
    fn clients_wait_in_order_with_one_based_positions() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10);
        q.worker_idle(0, t);
        q.join(Mode::Audio, t);
        let a = waiting(q.join(Mode::Audio, t));
        let b = waiting(q.join(Mode::Video, t));
        assert_eq!((a.position, a.queue_length), (1, 1));
        assert_eq!((b.position, b.queue_length), (2, 2));
        // the worker comes back: the first waiting ticket takes it, the other moves up
        let next = q.worker_idle(0, t).unwrap();
        assert_eq!((next.ticket, next.index), (a.ticket, 0));
        let infos = q.infos_from(next.index, t);
        assert_eq!(infos.len(), 1);
        assert_eq!((infos[0].ticket, infos[0].position, infos[0].queue_length), (b.ticket, 1, 1));
    }

    #[test]
    fn a_waiting_client_that_leaves_moves_those_behind_it() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10);
        let tickets: Vec<_> = (0..4).map(|_| waiting(q.join(Mode::Chat, t)).ticket).collect();
        assert_eq!(q.leave(tickets[1]), LeaveOutcome::Waited { index: 1 });
        let moved: Vec<_> = q.infos_from(1, t).iter().map(|i| (i.ticket, i.position)).collect();
        assert_eq!(moved, vec![(tickets[2], 2), (tickets[3], 3)]);
        assert_eq!(q.leave(tickets[1]), LeaveOutcome::Nothing, "leaving twice does nothing");
    }

    #[test]
    fn capacity_is_max_waiting() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 2);
        waiting(q.join(Mode::Video, t));
        waiting(q.join(Mode::Video, t));
        assert_eq!(q.join(Mode::Video, t), JoinOutcome::Full);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn a_mode_no_worker_serves_is_unavailable() {
        let t = Instant::now();
        let mut q = queue(&[ModeSet::of(&[Mode::Chat])], 10);
        assert_eq!(q.join(Mode::Video, t), JoinOutcome::Unavailable);
        assert!(matches!(q.join(Mode::Chat, t), JoinOutcome::Waiting(_)), "a starting worker will serve");
    }

    #[test]
    fn a_worker_narrowed_to_fewer_modes_no_longer_serves_the_others() {
        let t = Instant::now();
        let mut q = queue(&[ALL, ALL], 10);
        let video = waiting(q.join(Mode::Video, t)).ticket;
        let audio = waiting(q.join(Mode::Audio, t)).ticket;
        // One worker has no vision: the video client still has the other worker.
        assert!(q.narrow(0, ModeSet::of(&[Mode::Audio, Mode::Chat])).is_empty());
        assert!(q.serves(Mode::Video));
        assert_eq!(q.worker_idle(0, t).map(|a| a.ticket), Some(audio), "it skips the video ticket");
        // The other one has none either: nobody serves video, and its client is let go.
        assert_eq!(q.narrow(1, ModeSet::of(&[Mode::Audio, Mode::Chat])), vec![video]);
        assert!(!q.serves(Mode::Video) && q.serves(Mode::Audio) && q.serves(Mode::Chat));
        assert!(matches!(q.join(Mode::Video, t), JoinOutcome::Unavailable));
        assert!(matches!(q.join(Mode::Chat, t), JoinOutcome::Waiting(_)), "chat still waits for them");
    }

    #[test]
    fn first_come_first_served_across_modes_and_only_to_capable_workers() {
        let t = Instant::now();
        let chat_only = ModeSet::of(&[Mode::Chat]);
        let mut q = queue(&[chat_only, ALL], 10);
        let video = waiting(q.join(Mode::Video, t)).ticket;
        let chat = waiting(q.join(Mode::Chat, t)).ticket;
        // the chat-only worker skips the video ticket and takes the chat one
        assert_eq!(q.worker_idle(0, t).map(|a| a.ticket), Some(chat));
        assert_eq!(q.worker_idle(1, t).map(|a| a.ticket), Some(video));
    }

    #[test]
    fn a_new_client_takes_the_idle_worker_serving_fewest_modes() {
        let t = Instant::now();
        let mut q = queue(&[ALL, ModeSet::of(&[Mode::Audio])], 10);
        q.worker_idle(0, t);
        q.worker_idle(1, t);
        assert_eq!(q.join(Mode::Audio, t), JoinOutcome::Assigned { ticket: 1, worker: 1 });
        assert_eq!(q.join(Mode::Audio, t), JoinOutcome::Assigned { ticket: 2, worker: 0 });
    }

    #[test]
    fn an_unclaimed_reservation_frees_the_worker() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10);
        q.worker_idle(0, t);
        let JoinOutcome::Assigned { ticket, worker } = q.join(Mode::Video, t) else { panic!() };
        assert_eq!(q.leave(ticket), LeaveOutcome::Unclaimed { worker });
        assert_eq!(q.availability(0), Some(Availability::Idle));
        // once claimed, leaving is the session's business (the worker is released by it)
        let JoinOutcome::Assigned { ticket, .. } = q.join(Mode::Video, t) else { panic!() };
        q.claim(ticket);
        assert_eq!(q.leave(ticket), LeaveOutcome::Nothing);
    }

    #[test]
    fn the_clients_of_failed_workers_wait_for_them_until_unavailable_after() {
        let t = Instant::now();
        let mut q = queue(&[ModeSet::of(&[Mode::Video]), ModeSet::of(&[Mode::Chat])], 10).unavailable_after(secs(30));
        let video = waiting(q.join(Mode::Video, t)).ticket;
        let chat = waiting(q.join(Mode::Chat, t)).ticket;
        q.worker_failed(0, t);
        assert_eq!(q.len(), 2, "a failed worker is reopened: its client waits");
        assert!(!q.serves(Mode::Video) && q.may_serve(Mode::Video));
        let late = waiting(q.join(Mode::Video, t + secs(10))).ticket;
        // The first has waited 30 s with no video worker in sight: let go; the later one not yet.
        assert!(q.stranded(t + secs(29)).is_empty());
        assert_eq!(q.stranded(t + secs(30)), vec![video]);
        assert_eq!(q.stranded(t + secs(40)), vec![late]);
        // A chat client is not stranded: a chat worker is in sight (starting).
        assert_eq!(q.worker_idle(1, t + secs(41)).map(|a| a.ticket), Some(chat));
        // The worker comes back: video is served again, and its next client is not let go.
        q.worker_starting(0);
        assert!(q.serves(Mode::Video), "a restarting worker serves again");
        let again = waiting(q.join(Mode::Video, t + secs(50))).ticket;
        assert!(q.stranded(t + secs(200)).is_empty(), "a starting worker is in sight");
        assert_eq!(q.worker_idle(0, t + secs(200)).map(|a| a.ticket), Some(again));
    }

    /// A client that waited long behind busy workers is not let go at once when its mode then
    /// loses its last worker: `unavailable_after` counts from that loss.
    #[test]
    fn unavailable_after_counts_from_when_the_mode_lost_its_last_worker() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10).unavailable_after(secs(30));
        q.worker_idle(0, t);
        q.join(Mode::Audio, t); // the worker is busy
        let behind = waiting(q.join(Mode::Audio, t)).ticket;
        // Five minutes later the worker fails (its session ended with it).
        q.worker_failed(0, t + secs(300));
        assert!(q.stranded(t + secs(301)).is_empty(), "not let go for the wait it had behind a busy worker");
        assert!(q.stranded(t + secs(329)).is_empty());
        assert_eq!(q.stranded(t + secs(330)), vec![behind]);
    }

    #[test]
    fn until_every_node_is_reached_any_mode_waits() {
        let t = Instant::now();
        // A gateway with no workers of its own and two nodes not reached yet.
        let mut q = queue(&[], 10).expecting(2).unavailable_after(secs(30));
        let video = waiting(q.join(Mode::Video, t)).ticket;
        let audio = waiting(q.join(Mode::Audio, t)).ticket;
        assert!(q.stranded(t + secs(5)).is_empty(), "within unavailable_after");
        // The first node has one audio worker: video may still come from the second.
        let w = q.add_worker(ModeSet::of(&[Mode::Audio]));
        assert!(q.reached().is_empty());
        assert_eq!(q.worker_idle(w, t + secs(6)).map(|a| a.ticket), Some(audio));
        // The second has none for video: nothing is configured to serve it; its client is let go.
        assert_eq!(q.reached(), vec![video]);
        assert_eq!(q.join(Mode::Video, t + secs(7)), JoinOutcome::Unavailable);
    }

    #[test]
    fn a_node_never_reached_lets_its_clients_go_after_unavailable_after() {
        let t = Instant::now();
        let mut q = queue(&[], 10).expecting(1).unavailable_after(secs(30));
        let first = waiting(q.join(Mode::Audio, t)).ticket;
        assert!(q.stranded(t + secs(29)).is_empty());
        assert_eq!(q.stranded(t + secs(30)), vec![first]);
        assert!(matches!(q.join(Mode::Audio, t + secs(31)), JoinOutcome::Waiting(_)), "the node may come yet");
    }

    #[test]
    fn eta_from_remaining_time_then_assignment_in_order() {
        let t0 = Instant::now();
        // one worker, busy with a video session for 40 s of an average 100 s
        let mut q = queue(&[ALL], 10);
        q.worker_idle(0, t0);
        q.join(Mode::Video, t0);
        let t = t0 + secs(40);
        let a = waiting(q.join(Mode::Chat, t));
        let b = waiting(q.join(Mode::Audio, t));
        let c = waiting(q.join(Mode::Video, t));
        assert_eq!(a.estimated_wait_s, 60.0, "the busy session's remaining time");
        let infos = q.infos_from(0, t);
        assert_eq!(infos[1].estimated_wait_s, 120.0, "then the chat session ahead (60 s)");
        assert_eq!(infos[2].estimated_wait_s, 320.0, "then the audio session ahead (200 s)");
        assert_eq!((b.position, c.position), (2, 3));
    }

    #[test]
    fn eta_uses_the_earliest_free_of_several_workers() {
        let t0 = Instant::now();
        let mut q = queue(&[ALL, ALL], 10);
        q.worker_idle(0, t0);
        q.worker_idle(1, t0);
        q.join(Mode::Video, t0);
        q.join(Mode::Video, t0 + secs(50));
        let t = t0 + secs(60);
        waiting(q.join(Mode::Chat, t));
        waiting(q.join(Mode::Chat, t));
        waiting(q.join(Mode::Chat, t));
        let etas: Vec<f64> = q.infos_from(0, t).iter().map(|i| i.estimated_wait_s).collect();
        // worker 0 frees at 40 s, worker 1 at 90 s; each chat session takes 60 s
        assert_eq!(etas, vec![40.0, 90.0, 100.0]);
    }

    #[test]
    fn a_joining_ticket_gets_the_same_eta_as_a_full_recomputation() {
        let t0 = Instant::now();
        let mut q = queue(&[ALL, ModeSet::of(&[Mode::Chat])], 100);
        q.worker_idle(0, t0);
        q.worker_idle(1, t0);
        q.join(Mode::Video, t0);
        q.join(Mode::Chat, t0);
        let t = t0 + secs(7);
        for i in 0..30 {
            let info = waiting(q.join(Mode::ALL[i % 3], t));
            let full = q.infos_from(info.position - 1, t)[0].estimated_wait_s;
            assert!((info.estimated_wait_s - full).abs() < 1e-9, "ticket {i}: {} vs {full}", info.estimated_wait_s);
        }
        // after a structural change the kept simulation is redone
        let first = q.infos_from(0, t)[0].ticket;
        q.leave(first);
        let info = waiting(q.join(Mode::Audio, t));
        assert!((info.estimated_wait_s - q.infos_from(info.position - 1, t)[0].estimated_wait_s).abs() < 1e-9);
    }

    #[test]
    fn the_first_session_replaces_the_typical_guess_then_the_average_follows() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10);
        q.worker_idle(0, t);
        q.join(Mode::Video, t);
        assert!(!waiting(q.join(Mode::Video, t)).measured, "the typical length is a guess");
        q.session_finished(Mode::Video, secs(20));
        assert_eq!(q.average_session(Mode::Video), secs(20), "not a fifth of the way from 100 s");
        assert!(q.infos_from(0, t)[0].measured);
        q.session_finished(Mode::Video, secs(70));
        assert_eq!(q.average_session(Mode::Video), secs(30));
        assert!(!q.measured[Mode::Chat.index()], "per mode");
    }

    /// A session past its average is not expected to end within a second (the old rule told a
    /// waiting client "about 1 s" for as long as it ran on): a third of what it has run, at least.
    #[test]
    fn a_session_past_its_average_is_expected_to_go_on_and_no_estimate_is_zero() {
        let t0 = Instant::now();
        let mut q = queue(&[ALL], 10);
        q.worker_idle(0, t0);
        q.join(Mode::Video, t0); // average 100 s
        let at = |s: u64| waiting(q.clone().join(Mode::Chat, t0 + secs(s))).estimated_wait_s;
        assert_eq!(at(40), 60.0, "what is left of the average");
        assert_eq!(at(120), 40.0, "past the average: a third of what it has run");
        assert_eq!(at(300), 100.0, "and more the longer it runs");
        // A worker opening: the next client waits for it, a second at least, never 0.
        let mut q = queue(&[ALL], 10);
        assert_eq!(waiting(q.join(Mode::Chat, t0)).estimated_wait_s, 1.0);
        assert!(q.infos_from(0, t0 + secs(1)).iter().all(|i| i.estimated_wait_s >= 1.0));
    }

    #[test]
    fn status_lists_every_ticket() {
        let t = Instant::now();
        let mut q = queue(&[ALL], 10);
        let a = waiting(q.join(Mode::Chat, t)).ticket;
        let later = t + secs(5);
        let s = q.tickets(later);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].ticket, s[0].mode, s[0].position, s[0].waited), (a, Mode::Chat, 1, secs(5)));
    }
}
