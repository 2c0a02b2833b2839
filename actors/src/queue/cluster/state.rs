//! The rules of a replica's queue, as a plain struct: what the ClusterQueueActor decides about
//! its clients, their tickets in the cluster's store, the grants nodes make them, and what each
//! client is told. Each method takes what happened (a client joined, the store answered, a view
//! of the whole queue arrived, a worker was lent) and returns [`Effect`]s: calls to make on the
//! store, on the pool, timers, and what to tell whom. The actor only carries them out
//! ([`super::ClusterQueueActor`]); everything here is tested without a runtime, against the
//! in-memory store (`crate::edge::coordinator::memory`) and, by the same suite, against Redis.
//!
//! - Every decision on the queue is one call to the store (enqueue, claim, leave, cancel), so
//!   positions are global and a worker freed on a node goes to the first waiting ticket of any
//!   replica.
//! - A grant is lent by the pool (a BackendActor attaches the node's worker with the grant's
//!   nonce) before its client hears of it; a refused attach puts the ticket back in its place.
//!   A grant that arrives before the store's answer to its ticket's enqueue is kept a moment
//!   ([`EARLY_GRANT`]); one for a ticket no client holds while none is joining is an orphan's,
//!   whose ticket leaves the queue at once.
//! - Positions and ETAs come from views of the whole queue. A position told never rises; a move
//!   is told at most every [`MIN_TELL_INTERVAL`] (but at once after a quiet spell); a view's
//!   updates are spread by the [`Pacer`].
//! - A ticket of this replica no client holds ([`ORPHAN_AFTER`]) leaves the queue; a client whose
//!   ticket two fresh views in a row do not list is enqueued again with it, in its place; a store
//!   that forgot this replica gets every waiting client again, in order.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::view::view_queue;
use crate::domain::Mode;
use crate::edge::coordinator::{Beat, ClusterError, ClusterView, Enqueued, Grant};
use crate::protocol::{ProtocolError, QueueInfo};
use crate::queue::pacer::{Batch, Pacer};
use crate::queue::state::{TicketId, TicketStatus, WorkerId};

/// Views are read at most this often: with thousands waiting, every view costs each replica
/// the parse and the ETAs (docs/performance.md).
pub(super) const MIN_VIEW_INTERVAL: Duration = Duration::from_millis(250);
/// A client told its position this long ago or less hears its next move at the first view
/// after that. With workers handing over steadily every view moves every client: told at
/// each one, a client would hear four updates a second, and the replicas' fan-outs take CPU
/// from the hand-overs (p99 1 to 3 ms longer with 2,000 waiting); this way about one a
/// second, as from a single gateway. A move after a quiet spell is told at the first view.
pub(super) const MIN_TELL_INTERVAL: Duration = Duration::from_millis(500);
/// The position updates of a view go out in batches [`UPDATE_PAUSE`] apart, spread over
/// about [`UPDATE_SPREAD`], at least [`UPDATE_MIN_BATCH`] at a time. Written all at once (64 a
/// millisecond, as the single-process queue does), three replicas' fan-outs and their clients
/// took both CPUs of a host for tens of milliseconds after each view, and the hand-overs that
/// crossed them waited (p99 15 to 22 ms with 2,000 waiting, docs/performance.md). Spread over
/// 200 ms, the ticks cost more than they saved. A view comes at most every
/// [`MIN_VIEW_INTERVAL`], so a replica's fan-outs never overlap.
pub(super) const UPDATE_SPREAD: Duration = Duration::from_millis(100);
pub(super) const UPDATE_PAUSE: Duration = Duration::from_millis(2);
pub(super) const UPDATE_MIN_BATCH: usize = 4;
/// How long a grant for a ticket no client holds yet is kept (its enqueue's answer may follow).
pub(super) const EARLY_GRANT: Duration = Duration::from_secs(2);
/// A ticket of this replica that no client holds this long after it was numbered is an
/// orphan (the answer to its enqueue was lost: the call failed after the store had run it):
/// it leaves the queue, or, at its head, it would take every worker offered to it.
pub(super) const ORPHAN_AFTER: Duration = Duration::from_secs(5);

/// What the rules need from the configuration.
#[derive(Debug, Clone)]
pub(super) struct ClusterRules {
    /// This replica's name in the store.
    pub replica: String,
    /// Session length per mode (chat, video, audio) assumed before the store has learnt one.
    pub typical: [Duration; 3],
    pub update_interval: Duration,
}

/// What a client is told (the session's [`crate::messages::queue::QueueNotice`], but for the
/// worker it is handed, which the actor adds).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tell {
    Queued(QueueInfo),
    Update(QueueInfo),
    Rejected(ProtocolError),
    Cancelled,
}

/// A timer the actor arms: it calls the method of the same name when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// [`ClusterState::send_updates`].
    SendUpdates,
    /// [`ClusterState::tell_later`].
    TellLater,
}

/// What the actor does for the rules. `N` is how a client is reached (its session's notice
/// recipient in the actor; anything comparable in tests).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Effect<N> {
    /// Ask the store for a worker for client `conn` (keeping its ticket, if it has one); the
    /// answer goes to [`ClusterState::enqueued`].
    Enqueue {
        conn: u64,
        mode: Mode,
        ticket: Option<TicketId>,
    },
    /// Beat now; the answer goes to [`ClusterState::beaten`].
    Beat,
    /// Ask the pool to lend the grant's worker ([`crate::messages::pool::Lend`]); the answer
    /// goes to [`ClusterState::lent`] or [`ClusterState::lend_failed`].
    Lend(Grant),
    /// A lent worker's client is gone: it goes back to its node.
    GiveBack(WorkerId),
    /// The ticket leaves the store's queue.
    Leave(TicketId),
    /// The grant was refused: its ticket waits again in its place.
    Requeue(Grant),
    /// The session took its worker.
    Claim(TicketId),
    Tell(N, Tell),
    After(Timer, Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The store has not answered the enqueue yet.
    Enqueueing,
    Waiting,
    /// Its grant is being lent.
    Opening,
    /// Handed its worker; the session claims it.
    Assigned(WorkerId),
}

#[derive(Debug, Clone)]
struct Client<N> {
    mode: Mode,
    notify: N,
    ticket: Option<TicketId>,
    stage: Stage,
    /// The position last told (never told higher), and when.
    told: Option<usize>,
    told_at: Option<Instant>,
    /// Views in a row that did not list its ticket.
    missing: u8,
}

/// The rules' state. See the module doc.
#[derive(Debug)]
pub(super) struct ClusterState<N> {
    rules: ClusterRules,
    clients: HashMap<u64, Client<N>>,
    /// Tickets of sessions that claimed their worker, until they leave: a session whose
    /// worker could not be taken joins again with it, in its place.
    claimed: HashMap<u64, TicketId>,
    /// Grants being lent, by ticket: (connection, grant).
    opening: HashMap<TicketId, (u64, Grant)>,
    /// Grants that arrived before the answer to their ticket's enqueue, and when.
    early: HashMap<TicketId, (Grant, Instant)>,
    /// Connections waiting for this replica to be known before they enqueue.
    unregistered: Vec<u64>,
    known: bool,
    /// Why the last beat failed: new clients are refused at once (service_unavailable).
    store_down: Option<String>,
    view: ClusterView,
    viewed_at: Option<Instant>,
    /// A view is being read (one at a time).
    reading: bool,
    last_update: Instant,
    /// Clients with a notice not sent yet, in the order they are told, and the notice (a newer
    /// view updates it in place: every position told is sent, the latest one).
    updates: VecDeque<u64>,
    notices: HashMap<u64, Tell>,
    pacer: Pacer,
    /// A later telling from the last view is scheduled ([`MIN_TELL_INTERVAL`]).
    tell_scheduled: bool,
}

impl<N: Clone> ClusterState<N> {
    pub(super) fn new(rules: ClusterRules, now: Instant) -> ClusterState<N> {
        ClusterState {
            rules,
            clients: HashMap::new(),
            claimed: HashMap::new(),
            opening: HashMap::new(),
            early: HashMap::new(),
            unregistered: Vec::new(),
            known: false,
            store_down: None,
            view: ClusterView::default(),
            viewed_at: None,
            reading: false,
            last_update: now,
            updates: VecDeque::new(),
            notices: HashMap::new(),
            pacer: Pacer::new(
                Duration::ZERO,
                UPDATE_PAUSE,
                Batch::Spread { over: UPDATE_SPREAD, min: UPDATE_MIN_BATCH },
            ),
            tell_scheduled: false,
        }
    }

    pub(super) fn replica(&self) -> &str {
        &self.rules.replica
    }

    /// Whether the last beat reached the store.
    pub(super) fn store_up(&self) -> bool {
        self.store_down.is_none()
    }

    /// Why the last beat did not reach the store.
    pub(super) fn store_error(&self) -> Option<&str> {
        self.store_down.as_deref()
    }

    /// The last view of the whole queue.
    pub(super) fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Clients waiting for a worker here.
    pub(super) fn waiting(&self) -> usize {
        self.clients.values().filter(|c| c.stage == Stage::Waiting).count()
    }

    fn conn_of(&self, ticket: TicketId) -> Option<u64> {
        self.clients.iter().find(|(_, c)| c.ticket == Some(ticket)).map(|(conn, _)| *conn)
    }

    fn enqueue(&mut self, conn: u64, out: &mut Vec<Effect<N>>) {
        let Some(client) = self.clients.get_mut(&conn) else { return };
        client.stage = Stage::Enqueueing;
        out.push(Effect::Enqueue { conn, mode: client.mode, ticket: client.ticket });
    }

    /// A session asks for a worker (`front`: again, its worker gone before it took it).
    pub(super) fn join(&mut self, conn: u64, mode: Mode, notify: N, front: bool) -> Vec<Effect<N>> {
        let mut out = Vec::new();
        let ticket = if front { self.claimed.remove(&conn) } else { None };
        if self.store_down.is_some() {
            let why = "the queue cannot be reached (the cluster's store is down); try again shortly";
            out.push(Effect::Tell(notify, Tell::Rejected(ProtocolError::ServiceUnavailable(why.into()))));
            return out;
        }
        let client = Client { mode, notify, ticket, stage: Stage::Enqueueing, told: None, told_at: None, missing: 0 };
        self.clients.insert(conn, client);
        if self.known {
            self.enqueue(conn, &mut out);
        } else {
            self.unregistered.push(conn);
        }
        out
    }

    /// The store answered the enqueue of client `conn`.
    pub(super) fn enqueued(
        &mut self,
        conn: u64,
        result: Result<Enqueued, ClusterError>,
        now: Instant,
    ) -> Vec<Effect<N>> {
        let mut out = Vec::new();
        let Some(client) = self.clients.get_mut(&conn) else {
            // It left meanwhile: take back what the store gave it.
            match result {
                Ok(Enqueued::Granted(g)) => out.push(Effect::Leave(g.ticket)),
                Ok(Enqueued::Waiting { ticket, .. }) => out.push(Effect::Leave(ticket)),
                _ => {}
            }
            return out;
        };
        let rejected = match result {
            Ok(Enqueued::Granted(grant)) => {
                client.ticket = Some(grant.ticket);
                self.open(conn, grant, &mut out);
                return out;
            }
            Ok(Enqueued::Waiting { ticket, .. }) if self.early.contains_key(&ticket) => {
                client.ticket = Some(ticket);
                if let Some((grant, _)) = self.early.remove(&ticket) {
                    self.open(conn, grant, &mut out);
                }
                return out;
            }
            Ok(Enqueued::Waiting { ticket, position, length }) => {
                let first = client.told.is_none();
                client.ticket = Some(ticket);
                if client.stage != Stage::Enqueueing {
                    // A client enqueued again whose grant overtook the answer: it is opening.
                    return out;
                }
                client.stage = Stage::Waiting;
                let position = client.told.map_or(position, |told| told.min(position));
                client.told = Some(position);
                client.told_at = Some(now);
                if first {
                    let (estimated_wait_s, measured) = self.eta_at(position, now);
                    let info = QueueInfo { ticket, position, estimated_wait_s, queue_length: length, measured };
                    let notify = self.clients[&conn].notify.clone();
                    out.push(Effect::Tell(notify, Tell::Queued(info)));
                }
                return out;
            }
            Ok(Enqueued::UnknownReplica) => {
                client.stage = Stage::Waiting;
                self.unregistered.push(conn);
                out.push(Effect::Beat);
                return out;
            }
            // A client enqueued again (the store lost its ticket) keeps waiting whatever the
            // store says now (its nodes may not have registered again yet): the views retry.
            Ok(Enqueued::Unavailable) | Ok(Enqueued::Full { .. }) | Err(_) if client.ticket.is_some() => {
                client.stage = Stage::Waiting;
                return out;
            }
            Ok(Enqueued::Full { length }) => ProtocolError::QueueFull(format!(
                "the queue is full ({length} clients waiting across the cluster); try again later"
            )),
            Ok(Enqueued::Unavailable) => ProtocolError::ServiceUnavailable(format!(
                "no worker in the cluster can serve mode {} now",
                client.mode
            )),
            Err(e) => {
                log::error!("cluster: c{conn}: cannot enqueue: {e}");
                ProtocolError::ServiceUnavailable(format!("the queue cannot be reached: {e}"))
            }
        };
        if let Some(c) = self.clients.remove(&conn) {
            out.push(Effect::Tell(c.notify, Tell::Rejected(rejected)));
        }
        out
    }

    /// The store answered a beat.
    pub(super) fn beaten(&mut self, result: Result<Beat, ClusterError>) -> Vec<Effect<N>> {
        let mut out = Vec::new();
        let beat = match result {
            Ok(beat) => beat,
            Err(e) => {
                // Said at once, and again whenever the reason changes (not every beat).
                let why = e.to_string();
                if self.known || self.store_down.as_deref() != Some(why.as_str()) {
                    log::error!("cluster: replica {}: cannot reach the store: {why}", self.rules.replica);
                }
                self.known = false;
                self.store_down = Some(why);
                return out;
            }
        };
        if self.store_down.take().is_some() {
            log::info!("cluster: replica {}: the store answers again", self.rules.replica);
        }
        for ticket in beat.cancelled {
            if let Some(conn) = self.conn_of(ticket) {
                log::info!("cluster: ticket {ticket} (c{conn}) cancelled by an operator");
                if let Some(c) = self.clients.remove(&conn) {
                    out.push(Effect::Tell(c.notify, Tell::Cancelled));
                }
            }
        }
        let was_known = self.known;
        self.known = true;
        if !beat.known {
            // The store forgot this replica: enqueue every waiting client again, in order.
            let mut waiting: Vec<(TicketId, u64)> = self
                .clients
                .iter()
                .filter(|(_, c)| c.stage == Stage::Waiting)
                .filter_map(|(conn, c)| c.ticket.map(|t| (t, *conn)))
                .collect();
            waiting.sort_unstable();
            if was_known || !waiting.is_empty() {
                log::warn!(
                    "cluster: replica {}: the store did not know it; {} waiting client(s) enqueued again in order",
                    self.rules.replica,
                    waiting.len()
                );
            }
            for (_, conn) in waiting {
                self.enqueue(conn, &mut out);
            }
        }
        for conn in std::mem::take(&mut self.unregistered) {
            self.enqueue(conn, &mut out);
        }
        out
    }

    /// The ETA of a ticket at `position` by the last view, and whether it is measured (before
    /// any view: a second, unmeasured: the client is told a worker is busy).
    fn eta_at(&self, position: usize, now: Instant) -> (f64, bool) {
        let infos = self.view_infos(now);
        infos
            .get(position.saturating_sub(1))
            .or(infos.last())
            .map_or((1.0, false), |i| (i.estimated_wait_s, i.measured))
    }

    /// Every waiting ticket of the last view with its ETA, by the queue's own rules.
    fn view_infos(&self, now: Instant) -> Vec<QueueInfo> {
        view_queue(&self.view, self.rules.typical.map(|d| d.as_secs_f64()), now).infos_from(0, now)
    }

    fn open(&mut self, conn: u64, grant: Grant, out: &mut Vec<Effect<N>>) {
        log::debug!("cluster: ticket {} (c{conn}) granted {} at {}", grant.ticket, grant.slot, grant.addr);
        if let Some(c) = self.clients.get_mut(&conn) {
            c.stage = Stage::Opening;
        }
        self.opening.insert(grant.ticket, (conn, grant.clone()));
        out.push(Effect::Lend(grant));
    }

    /// A node freed a worker for one of this replica's tickets (the grant came through the
    /// store, or on a link kept open to the node).
    pub(super) fn granted(&mut self, grant: Grant, now: Instant) -> Vec<Effect<N>> {
        let mut out = Vec::new();
        let Some(conn) = self.conn_of(grant.ticket) else {
            // No client holds it, none is joining (so no enqueue's answer is on its way), and
            // it is not in use: an orphan (its enqueue's answer was lost, its client refused).
            // It leaves the queue at once, before another worker is offered to it.
            let joining = self.clients.values().any(|c| c.stage == Stage::Enqueueing);
            let in_use = self.claimed.values().any(|t| *t == grant.ticket);
            if !joining && !in_use && !self.early.contains_key(&grant.ticket) {
                log::info!("cluster: ticket {} has no client and none is joining: it leaves the queue", grant.ticket);
                out.push(Effect::Leave(grant.ticket));
                return out;
            }
            // The store's answer to its enqueue may still be on its way (the grant overtook
            // it): kept a moment. A ticket nobody claims by then is gone (its client left): it
            // leaves the queue, and the node, finding it gone at its next beat, offers the worker
            // again under a new nonce.
            log::debug!("cluster: grant of {} for ticket {} that no client holds (yet)", grant.slot, grant.ticket);
            self.expire_early(now, &mut out);
            // A grant offered again to the same ticket keeps the first one's time: an orphan
            // ticket's grants go back however often they come.
            let since = self.early.get(&grant.ticket).map_or(now, |(_, at)| *at);
            self.early.insert(grant.ticket, (grant, since));
            return out;
        };
        match self.clients.get(&conn).map(|c| c.stage) {
            Some(Stage::Waiting) | Some(Stage::Enqueueing) => self.open(conn, grant, &mut out),
            // It is taking another grant already: this one is stale, or a duplicate.
            _ => log::debug!("cluster: ticket {} already holds a grant; {} not taken", grant.ticket, grant.slot),
        }
        out
    }

    /// The pool lent the worker of `ticket`'s grant: who to hand it to (the actor tells them
    /// with the worker), or, its client gone, the worker goes back and the ticket leaves.
    pub(super) fn lent(&mut self, ticket: TicketId, worker: WorkerId) -> Result<(TicketId, N), Vec<Effect<N>>> {
        let Some((conn, grant)) = self.opening.remove(&ticket) else {
            return Err(vec![Effect::GiveBack(worker)]);
        };
        match self.clients.get_mut(&conn) {
            Some(c) => {
                c.stage = Stage::Assigned(worker);
                Ok((grant.ticket, c.notify.clone()))
            }
            // Its client left while the node attached: give the worker back.
            None => Err(vec![Effect::GiveBack(worker), Effect::Leave(grant.ticket)]),
        }
    }

    /// The grant of `ticket` could not be taken: the ticket waits again in its place.
    pub(super) fn lend_failed(&mut self, ticket: TicketId, reason: &str) -> Vec<Effect<N>> {
        let Some((conn, grant)) = self.opening.remove(&ticket) else { return Vec::new() };
        log::info!("cluster: ticket {} (c{conn}): {} not taken: {reason}", grant.ticket, grant.slot);
        match self.clients.get_mut(&conn) {
            Some(c) => {
                c.stage = Stage::Waiting;
                vec![Effect::Requeue(grant)]
            }
            None => vec![Effect::Leave(grant.ticket)],
        }
    }

    /// The session is gone (or no longer needs a worker).
    pub(super) fn leave(&mut self, conn: u64) -> Vec<Effect<N>> {
        self.claimed.remove(&conn);
        let Some(c) = self.clients.remove(&conn) else { return Vec::new() };
        match (c.stage, c.ticket) {
            // The enqueue's answer, or the lend, finds it gone and undoes itself.
            (Stage::Enqueueing, _) | (Stage::Opening, _) => Vec::new(),
            // Handed its worker and gone before it took it: the worker goes back to its node.
            (Stage::Assigned(worker), ticket) => {
                let mut out = vec![Effect::GiveBack(worker)];
                out.extend(ticket.map(Effect::Leave));
                out
            }
            (_, Some(ticket)) => vec![Effect::Leave(ticket)],
            (_, None) => Vec::new(),
        }
    }

    /// The session took the worker it was handed.
    pub(super) fn claim(&mut self, conn: u64) -> Vec<Effect<N>> {
        let Some(c) = self.clients.remove(&conn) else { return Vec::new() };
        let Some(ticket) = c.ticket else { return Vec::new() };
        self.claimed.insert(conn, ticket);
        vec![Effect::Claim(ticket)]
    }

    /// An operator cancelled `ticket` in the store (`cancelled`: it was waiting): its client
    /// here, if any, is told.
    pub(super) fn cancelled(&mut self, ticket: TicketId, cancelled: bool) -> Vec<Effect<N>> {
        if cancelled
            && let Some(conn) = self.conn_of(ticket)
            && let Some(c) = self.clients.remove(&conn)
        {
            return vec![Effect::Tell(c.notify, Tell::Cancelled)];
        }
        Vec::new()
    }

    /// Time to read the store's version? `Some((version seen, refresh due))`: the actor reads
    /// the version, and a view when it changed or the refresh is due, then calls
    /// [`ClusterState::viewed`].
    pub(super) fn poll(&mut self, now: Instant) -> Option<(u64, bool)> {
        if self.reading || self.viewed_at.is_some_and(|at| now.duration_since(at) < MIN_VIEW_INTERVAL) {
            return None;
        }
        self.reading = true;
        Some((self.view.version, now.duration_since(self.last_update) >= self.rules.update_interval))
    }

    /// A poll ended: a new view (`None`: nothing changed, or the store could not be read).
    pub(super) fn viewed(&mut self, view: Option<ClusterView>, now: Instant) -> Vec<Effect<N>> {
        self.reading = false;
        let mut out = Vec::new();
        let Some(view) = view else { return out };
        let changed = view.version != self.view.version;
        let periodic = now.duration_since(self.last_update) >= self.rules.update_interval;
        self.view = view;
        self.viewed_at = Some(now);
        if !changed && !periodic {
            return out;
        }
        if periodic {
            self.last_update = now;
        }
        let Told { lost, held_back } = self.tell(periodic, true, now);
        self.send_updates_now(&mut out);
        self.reap(now, &mut out);
        for conn in lost {
            // The store lost its ticket (it restarted, or retired this replica): again, in place.
            log::warn!("cluster: c{conn}: its ticket is no longer in the queue; enqueued again with it");
            if let Some(c) = self.clients.get_mut(&conn) {
                c.missing = 0;
            }
            self.enqueue(conn, &mut out);
        }
        self.schedule_tell_later(held_back, &mut out);
        out
    }

    /// Queues a notice for each waiting client whose position in the last view is lower than
    /// told (and was told at least [`MIN_TELL_INTERVAL`] ago), or every waiting client when
    /// `periodic`. A `fresh` view also counts the clients it does not list.
    fn tell(&mut self, periodic: bool, fresh: bool, now: Instant) -> Told {
        let etas: HashMap<TicketId, (f64, bool)> =
            self.view_infos(now).into_iter().map(|i| (i.ticket, (i.estimated_wait_s, i.measured))).collect();
        let positions: HashMap<TicketId, usize> =
            self.view.tickets.iter().enumerate().map(|(i, t)| (t.ticket, i + 1)).collect();
        let length = self.view.tickets.len();
        let mut lost = Vec::new();
        let mut held_back = false;
        for (conn, c) in self.clients.iter_mut() {
            let (Stage::Waiting, Some(ticket)) = (c.stage, c.ticket) else { continue };
            let Some(&position) = positions.get(&ticket) else {
                if fresh {
                    c.missing += 1;
                    if c.missing >= 2 {
                        lost.push(*conn);
                    }
                }
                continue;
            };
            if fresh {
                c.missing = 0;
            }
            let (position, moved) = match telling(c.told, c.told_at, position, periodic, now, MIN_TELL_INTERVAL) {
                Telling::Nothing => continue,
                Telling::Later => {
                    held_back = true;
                    continue;
                }
                Telling::Now { position, moved } => (position, moved),
            };
            let (estimated_wait_s, measured) = etas.get(&ticket).copied().unwrap_or((1.0, false));
            let info = QueueInfo { ticket, position, estimated_wait_s, queue_length: length, measured };
            // A client granted at once whose grant was refused has not heard it waits.
            let first = c.told.is_none();
            c.told = Some(position);
            if moved {
                // (The periodic ETA refresh does not hold back the next move.)
                c.told_at = Some(now);
            }
            match self.notices.entry(*conn) {
                // Not sent yet: the newer position replaces it, a first notice stays first.
                Entry::Occupied(mut e) => {
                    let first = matches!(e.get(), Tell::Queued(_));
                    e.insert(if first { Tell::Queued(info) } else { Tell::Update(info) });
                }
                Entry::Vacant(e) => {
                    e.insert(if first { Tell::Queued(info) } else { Tell::Update(info) });
                    self.updates.push_back(*conn);
                }
            }
        }
        Told { lost, held_back }
    }

    fn schedule_tell_later(&mut self, held_back: bool, out: &mut Vec<Effect<N>>) {
        if held_back && !self.tell_scheduled {
            self.tell_scheduled = true;
            out.push(Effect::After(Timer::TellLater, MIN_TELL_INTERVAL));
        }
    }

    /// [`Timer::TellLater`]: clients whose move was held back ([`MIN_TELL_INTERVAL`]) hear it
    /// from the last view once they are due, if no newer view told them first.
    pub(super) fn tell_later(&mut self, now: Instant) -> Vec<Effect<N>> {
        self.tell_scheduled = false;
        let mut out = Vec::new();
        let told = self.tell(false, false, now);
        self.send_updates_now(&mut out);
        self.schedule_tell_later(told.held_back, &mut out);
        out
    }

    fn send_updates_now(&mut self, out: &mut Vec<Effect<N>>) {
        if let Some(after) = self.pacer.changed(self.updates.len(), true) {
            out.push(Effect::After(Timer::SendUpdates, after));
        }
    }

    /// [`Timer::SendUpdates`]: the next batch of position updates; the rest after a pause.
    pub(super) fn send_updates(&mut self) -> Vec<Effect<N>> {
        let mut out = Vec::new();
        let tick = self.pacer.tick(self.updates.len());
        for _ in 0..tick.send {
            let Some(conn) = self.updates.pop_front() else { break };
            let (Some(tell), Some(c)) = (self.notices.remove(&conn), self.clients.get(&conn)) else { continue };
            // A client that left, or took a worker meanwhile, has nothing more to hear.
            if c.stage == Stage::Waiting {
                out.push(Effect::Tell(c.notify.clone(), tell));
            }
        }
        if let Some(after) = tick.next {
            out.push(Effect::After(Timer::SendUpdates, after));
        }
        out
    }

    /// Tickets of this replica in the last view that no client holds (orphans, see
    /// [`ORPHAN_AFTER`]) leave the queue, and grants kept for a ticket no client ever came to
    /// claim go back.
    fn reap(&mut self, now: Instant, out: &mut Vec<Effect<N>>) {
        self.expire_early(now, out);
        let numbered_before = (self.view.now_ms.saturating_sub(ORPHAN_AFTER.as_millis() as u64)).saturating_mul(1000);
        let held: HashSet<TicketId> = self
            .clients
            .values()
            .filter_map(|c| c.ticket)
            .chain(self.claimed.values().copied())
            .chain(self.early.keys().copied())
            .collect();
        for t in &self.view.tickets {
            if t.replica == self.rules.replica && t.ticket < numbered_before && !held.contains(&t.ticket) {
                log::warn!(
                    "cluster: ticket {} of this replica has no client (its enqueue's answer was lost): it leaves the queue",
                    t.ticket
                );
                out.push(Effect::Leave(t.ticket));
            }
        }
    }

    /// Grants kept longer than [`EARLY_GRANT`] for a ticket no client holds go back: their
    /// tickets leave the queue.
    fn expire_early(&mut self, now: Instant, out: &mut Vec<Effect<N>>) {
        let stale: Vec<TicketId> =
            self.early.iter().filter(|(_, (_, at))| now.duration_since(*at) > EARLY_GRANT).map(|(t, _)| *t).collect();
        for ticket in stale {
            self.early.remove(&ticket);
            out.push(Effect::Leave(ticket));
        }
    }

    /// Every waiting ticket of the last view, for `/status`.
    pub(super) fn tickets(&self, now: Instant) -> Vec<TicketStatus> {
        let etas: HashMap<TicketId, f64> =
            self.view_infos(now).into_iter().map(|i| (i.ticket, i.estimated_wait_s)).collect();
        self.view
            .tickets
            .iter()
            .enumerate()
            .map(|(i, t)| TicketStatus {
                ticket: t.ticket,
                mode: t.mode,
                position: i + 1,
                waited: waited(t.ticket, self.view.now_ms, self.viewed_at, now),
                estimated_wait_s: etas.get(&t.ticket).copied().unwrap_or(1.0),
                replica: Some(t.replica.clone()),
            })
            .collect()
    }
}

/// How long ticket `ticket` has waited: the store numbers tickets by its clock in microseconds
/// (`now_ms` is that clock when the view was read, at `viewed_at`); a number that is no such
/// time (a store that counts) says nothing (0).
fn waited(ticket: TicketId, now_ms: u64, viewed_at: Option<Instant>, now: Instant) -> Duration {
    const YEAR_2001_US: u64 = 978_307_200_000_000;
    if ticket < YEAR_2001_US {
        return Duration::ZERO;
    }
    let at_view = Duration::from_millis(now_ms.saturating_sub(ticket / 1000));
    at_view + viewed_at.map_or(Duration::ZERO, |v| now.saturating_duration_since(v))
}

/// What telling from a view found: clients missing from two fresh views in a row (`lost`),
/// and whether a move was held back ([`MIN_TELL_INTERVAL`]).
struct Told {
    lost: Vec<u64>,
    held_back: bool,
}

/// What a replica tells a waiting client from a view of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Telling {
    Nothing,
    /// It moved, but was told less than the interval ago: at the first view after that.
    Later,
    /// Tell it `position` (`moved`: lower than told before; else the periodic ETA refresh).
    Now {
        position: usize,
        moved: bool,
    },
}

/// The rule for telling a client its place: `position` in the view, `told` (and `told_at`)
/// the last it heard. A position is never told higher than before; a move is told at most
/// once per `min_interval` (a client told of a move `at` hears the next one no sooner than
/// `at + min_interval`), but at once after a quiet spell; `periodic` (the ETA refresh) tells
/// every client and does not hold back the next move.
pub(super) fn telling(
    told: Option<usize>,
    told_at: Option<Instant>,
    position: usize,
    periodic: bool,
    now: Instant,
    min_interval: Duration,
) -> Telling {
    let position = told.map_or(position, |t| t.min(position));
    let moved = told != Some(position);
    let due = told_at.is_none_or(|at| now.duration_since(at) >= min_interval);
    match (moved, due, periodic) {
        (true, false, false) => Telling::Later,
        (true, _, _) | (false, _, true) => Telling::Now { position, moved },
        (false, _, false) => Telling::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::coordinator::SlotState;

    #[test]
    fn a_move_is_told_at_once_after_a_quiet_spell_then_at_most_once_per_interval() {
        let (t0, every) = (Instant::now(), Duration::from_millis(500));
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(telling(None, None, 9, false, t0, every), Telling::Now { position: 9, moved: true }, "first");
        assert_eq!(telling(Some(9), Some(t0), 9, false, at(100), every), Telling::Nothing);
        assert_eq!(telling(Some(9), Some(t0), 8, false, at(100), every), Telling::Later, "too soon");
        assert_eq!(telling(Some(9), Some(t0), 7, false, at(500), every), Telling::Now { position: 7, moved: true });
        assert_eq!(
            telling(Some(7), Some(at(500)), 3, false, at(10_000), every),
            Telling::Now { position: 3, moved: true }
        );
    }

    #[test]
    fn a_position_is_never_told_higher_and_the_refresh_tells_everyone() {
        let (t0, every) = (Instant::now(), Duration::from_millis(500));
        let soon = t0 + Duration::from_millis(10);
        // A grant refused: the ticket went back to its place behind others' moves.
        assert_eq!(telling(Some(4), Some(t0), 6, false, soon, every), Telling::Nothing);
        assert_eq!(telling(Some(4), Some(t0), 6, true, soon, every), Telling::Now { position: 4, moved: false });
        assert_eq!(
            telling(Some(4), Some(t0), 2, true, soon, every),
            Telling::Now { position: 2, moved: true },
            "with a move"
        );
    }

    #[test]
    fn etas_come_from_the_busy_slots_and_the_averages_of_the_store() {
        use crate::edge::coordinator::{SlotView, TicketView};
        let slot = |state: &str, busy| SlotView {
            slot: "n/w".into(),
            node: "n".into(),
            modes: vec![Mode::Audio],
            state: SlotState::parse(state),
            busy,
        };
        let ticket = |ticket, granted| TicketView { ticket, mode: Mode::Audio, replica: "g".into(), granted };
        // One audio worker busy for 20 s of an average 60 s session; one down.
        let view = ClusterView {
            version: 1,
            now_ms: 100_000,
            tickets: vec![ticket(7, true), ticket(8, false), ticket(9, false)],
            slots: vec![slot("busy", Some((Mode::Audio, 80_000))), slot("down", None)],
            average_s: [None, None, Some(60.0)],
        };
        let now = Instant::now();
        let infos = view_queue(&view, [10.0, 10.0, 999.0], now).infos_from(0, now);
        // The granted ticket is not waiting for a worker: 8 waits 40 s, 9 a whole session more.
        let etas: Vec<(TicketId, f64)> = infos.iter().map(|i| (i.ticket, i.estimated_wait_s.round())).collect();
        assert_eq!(etas, [(8, 40.0), (9, 100.0)]);
    }
}
