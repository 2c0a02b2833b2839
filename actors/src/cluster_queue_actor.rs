//! ClusterQueueActor: the queue of a gateway replica that shares its queue and its workers
//! (node workers) with other replicas through a [`Coordinator`]. Sessions reach it exactly
//! as they reach the [`crate::queue_actor::QueueActor`] (a [`crate::queue_actor::QueuePort`]); what differs:
//!
//! - every decision is one step in the store (enqueue, claim, leave, cancel), so positions
//!   are global, and a worker freed on a node goes to the first waiting ticket of any replica;
//! - a grant is opened here before the session hears of it: a BackendActor attaches the node's
//!   worker with the grant's nonce, and only an attached worker is handed to the session. A
//!   refused attach (the node gave the worker again meanwhile) puts the ticket back in its
//!   place. The BackendActor lives for one session; its stop closes the link and the node
//!   offers the worker again;
//! - positions and ETAs come from a view of the whole queue, read when it changed (polled
//!   every [`POLL`]) and every `update_interval`. A position told never rises.
//! - a beat every third of the lease keeps this replica known; a store that forgot it
//!   (restarted, or this replica was paused past its lease) gets every waiting client again,
//!   with its ticket number, so the order survives.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::backend_actor::{BackendActor, BackendLimits, Stop};
use crate::cluster::{Beat, ClusterError, ClusterView, Coordinator, Enqueued, Grant, Telling, telling};
use crate::domain::Mode;
use crate::fanout::paced_batch;
use crate::metrics::metrics;
use crate::pool_actor::WorkerEvent;
use crate::protocol::{ProtocolError, QueueInfo};
use crate::queue::{TicketId, TicketStatus, WorkerId};
use crate::queue_actor::{Cancel, Claim, Join, Leave, QueueNotice, QueueSnapshot, WorkerLink};
use crate::worker_thread::Opener;

/// How often the store's version is read (a change triggers a new view).
pub const POLL: Duration = Duration::from_millis(100);
/// Views are read at most this often: with thousands waiting, every view costs each replica
/// the parse and the ETAs (docs/performance.md).
pub const MIN_VIEW_INTERVAL: Duration = Duration::from_millis(250);
/// A client told its position this long ago or less hears its next move at the first view
/// after that. With workers handing over steadily every view moves every client: told at
/// each one, a client would hear four updates a second, and the replicas' fan-outs take CPU
/// from the hand-overs (p99 1 to 3 ms longer with 2,000 waiting); this way about one a
/// second, as from a single gateway. A move after a quiet spell is told at the first view.
pub const MIN_TELL_INTERVAL: Duration = Duration::from_millis(500);
/// How long a BackendActor lent to a session has to close its link when the session ends.
const STOP_WITHIN: Duration = Duration::from_secs(2);
/// The position updates of a view go out in batches [`UPDATE_PAUSE`] apart, spread over
/// about [`UPDATE_SPREAD`] ([`crate::fanout::paced_batch`]), at least [`UPDATE_MIN_BATCH`] at
/// a time. Written all at once (64 a millisecond, as the single-process queue does), three
/// replicas' fan-outs and their clients took both CPUs of a host for tens of milliseconds
/// after each view, and the hand-overs that crossed them waited (p99 15 to 22 ms with 2,000
/// waiting, docs/performance.md). Spread over 200 ms, the ticks cost more than they saved.
/// A view comes at most every [`MIN_VIEW_INTERVAL`], so a replica's fan-outs never overlap.
const UPDATE_SPREAD: Duration = Duration::from_millis(100);
const UPDATE_PAUSE: Duration = Duration::from_millis(2);
const UPDATE_MIN_BATCH: usize = 4;
/// How long a grant for a ticket no client holds yet is kept (its enqueue's answer may follow).
const EARLY_GRANT: Duration = Duration::from_secs(2);
/// A ticket of this replica that no client holds this long after it was numbered is an
/// orphan (the answer to its enqueue was lost: the call failed after the store had run it):
/// it leaves the queue, or, at its head, it would take every worker offered to it.
const ORPHAN_AFTER: Duration = Duration::from_secs(5);

/// What telling from a view found: clients missing from two fresh views in a row (`lost`),
/// and whether a move was held back ([`MIN_TELL_INTERVAL`]).
struct Told {
    lost: Vec<u64>,
    held_back: bool,
}

/// Opens the backend of a grant: a link to the node's worker, attached with the nonce (a
/// factory, run on the worker's thread), or the link the node pushed the grant on, attached
/// already (open at once).
pub type GrantOpener = Arc<dyn Fn(&Grant) -> Opener + Send + Sync>;

/// A grant a node pushed to this replica on a link it keeps open to the node (the link
/// attached already: the opener finds it by the grant's nonce).
#[derive(Message)]
#[rtype(result = "()")]
pub struct GrantPushed(pub Grant);

/// What `/status` shows of the cluster: this replica, whether it reaches the store, and the
/// last view of the whole queue and every node's workers.
#[derive(Message)]
#[rtype(result = "ClusterStatus")]
pub struct ClusterStatusQuery;

#[derive(Debug, Clone)]
pub struct ClusterStatus {
    pub replica: String,
    pub store_up: bool,
    pub view: ClusterView,
}

pub struct ClusterSetup {
    pub coordinator: Arc<dyn Coordinator>,
    pub opener: GrantOpener,
    pub limits: BackendLimits,
    pub max_waiting: usize,
    /// Session length per mode (chat, video, audio) assumed before the store has learnt one.
    pub typical: [Duration; 3],
    pub update_interval: Duration,
    pub lease: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    /// The store has not answered the enqueue yet.
    Enqueueing,
    Waiting,
    /// Its grant is being attached at the node (BackendActor `WorkerId`).
    Opening(WorkerId),
    /// Handed its worker (BackendActor `WorkerId`); the session claims it.
    Assigned(WorkerId),
}

struct Client {
    mode: Mode,
    notify: Recipient<QueueNotice>,
    ticket: Option<TicketId>,
    stage: Stage,
    /// The position last told (never told higher), and when.
    told: Option<usize>,
    told_at: Option<Instant>,
    /// Views in a row that did not list its ticket.
    missing: u8,
}

pub struct ClusterQueueActor {
    setup: ClusterSetup,
    clients: HashMap<u64, Client>,
    /// Tickets of sessions that claimed their worker, until they leave: a session whose
    /// worker could not be taken joins again with it, in its place.
    claimed: HashMap<u64, TicketId>,
    /// Grants being attached, by the BackendActor's id: (connection, grant).
    opening: HashMap<WorkerId, (u64, Grant)>,
    /// BackendActors lent to sessions, until their session ends.
    lent: HashMap<WorkerId, Addr<BackendActor>>,
    next_worker: WorkerId,
    /// Grants that arrived before the answer to their ticket's enqueue, and when.
    early: HashMap<TicketId, (Grant, Instant)>,
    /// Connections waiting for this replica to be known before they enqueue.
    unregistered: Vec<u64>,
    known: bool,
    /// The last beat failed: new clients are refused at once (service_unavailable).
    store_down: bool,
    view: ClusterView,
    viewed_at: Instant,
    /// Whether a view is being read (one at a time).
    reading: bool,
    last_update: Instant,
    /// Clients with a queue notice not sent yet, in the order they are told, and the notice
    /// (a newer view updates it in place: every position told is sent, the latest one).
    updates: std::collections::VecDeque<u64>,
    notices: HashMap<u64, QueueNotice>,
    /// How many of them go out a batch (paced for the view that queued them).
    batch: usize,
    /// A later telling from the last view is scheduled ([`MIN_TELL_INTERVAL`]).
    tell_scheduled: bool,
    sending: bool,
}

impl ClusterQueueActor {
    pub fn new(setup: ClusterSetup) -> ClusterQueueActor {
        ClusterQueueActor {
            setup,
            clients: HashMap::new(),
            claimed: HashMap::new(),
            opening: HashMap::new(),
            lent: HashMap::new(),
            next_worker: 0,
            early: HashMap::new(),
            unregistered: Vec::new(),
            known: false,
            store_down: false,
            view: ClusterView::default(),
            viewed_at: Instant::now(),
            reading: false,
            last_update: Instant::now(),
            updates: std::collections::VecDeque::new(),
            notices: HashMap::new(),
            batch: UPDATE_MIN_BATCH,
            tell_scheduled: false,
            sending: false,
        }
    }

    fn replica(&self) -> String {
        self.setup.coordinator.replica().to_string()
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        let call = self.setup.coordinator.beat();
        ctx.spawn(call.into_actor(self).map(|result, act, ctx| act.beaten(result, ctx)));
    }

    fn beaten(&mut self, result: Result<Beat, ClusterError>, ctx: &mut Context<Self>) {
        let beat = match result {
            Ok(beat) => beat,
            Err(e) => {
                if self.known {
                    log::error!("cluster: replica {}: cannot beat: {e}", self.replica());
                }
                self.known = false;
                self.store_down = true;
                metrics().cluster_store_up.set(0);
                return;
            }
        };
        metrics().cluster_store_up.set(1);
        self.store_down = false;
        for ticket in beat.cancelled {
            if let Some(conn) = self.conn_of(ticket) {
                log::info!("cluster: ticket {ticket} (c{conn}) cancelled by an operator");
                if let Some(c) = self.clients.remove(&conn) {
                    c.notify.do_send(QueueNotice::Cancelled);
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
                    self.replica(),
                    waiting.len()
                );
            }
            for (_, conn) in waiting {
                self.enqueue(conn, ctx);
            }
        }
        for conn in std::mem::take(&mut self.unregistered) {
            self.enqueue(conn, ctx);
        }
    }

    fn conn_of(&self, ticket: TicketId) -> Option<u64> {
        self.clients.iter().find(|(_, c)| c.ticket == Some(ticket)).map(|(conn, _)| *conn)
    }

    /// Asks the store for a worker for client `conn` (keeping its ticket, if it has one).
    fn enqueue(&mut self, conn: u64, ctx: &mut Context<Self>) {
        let Some(client) = self.clients.get_mut(&conn) else { return };
        client.stage = Stage::Enqueueing;
        let call = self.setup.coordinator.enqueue(client.mode, client.ticket, self.setup.max_waiting);
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| act.enqueued(conn, result, ctx)));
    }

    fn enqueued(&mut self, conn: u64, result: Result<Enqueued, ClusterError>, ctx: &mut Context<Self>) {
        let Some(client) = self.clients.get_mut(&conn) else {
            // It left meanwhile: take back what the store gave it.
            match result {
                Ok(Enqueued::Granted(g)) => self.forget_ticket(g.ticket, ctx),
                Ok(Enqueued::Waiting { ticket, .. }) => self.forget_ticket(ticket, ctx),
                _ => {}
            }
            return;
        };
        let rejected = match result {
            Ok(Enqueued::Granted(grant)) => {
                client.ticket = Some(grant.ticket);
                self.open(conn, grant, ctx);
                return;
            }
            Ok(Enqueued::Waiting { ticket, .. }) if self.early.contains_key(&ticket) => {
                client.ticket = Some(ticket);
                if let Some((grant, _)) = self.early.remove(&ticket) {
                    self.open(conn, grant, ctx);
                }
                return;
            }
            Ok(Enqueued::Waiting { ticket, position, length }) => {
                let first = client.told.is_none();
                client.ticket = Some(ticket);
                if client.stage != Stage::Enqueueing {
                    // A client enqueued again whose grant overtook the answer: it is opening.
                    return;
                }
                client.stage = Stage::Waiting;
                let position = client.told.map_or(position, |told| told.min(position));
                client.told = Some(position);
                client.told_at = Some(Instant::now());
                if first {
                    let estimated_wait_s = self.eta_at(position);
                    let info = QueueInfo { ticket, position, estimated_wait_s, queue_length: length };
                    if let Some(c) = self.clients.get(&conn) {
                        c.notify.do_send(QueueNotice::Queued(info));
                    }
                }
                return;
            }
            Ok(Enqueued::UnknownReplica) => {
                client.stage = Stage::Waiting;
                self.unregistered.push(conn);
                self.beat(ctx);
                return;
            }
            // A client enqueued again (the store lost its ticket) keeps waiting whatever the
            // store says now (its nodes may not have registered again yet): the views retry.
            Ok(Enqueued::Unavailable) | Ok(Enqueued::Full { .. }) | Err(_) if client.ticket.is_some() => {
                client.stage = Stage::Waiting;
                return;
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
            c.notify.do_send(QueueNotice::Rejected(rejected));
        }
    }

    /// The ETA of a ticket at `position` by the last view (0 when the view is empty).
    fn eta_at(&self, position: usize) -> f64 {
        let infos = self.view_infos();
        infos.get(position.saturating_sub(1)).or(infos.last()).map_or(0.0, |i| i.estimated_wait_s)
    }

    /// Every waiting ticket of the last view with its ETA, by the queue's own rules.
    fn view_infos(&self) -> Vec<QueueInfo> {
        let now = Instant::now();
        self.view.queue(self.setup.typical.map(|d| d.as_secs_f64()), now).infos_from(0, now)
    }

    /// Attaches the grant's worker for client `conn` through a BackendActor of its own.
    fn open(&mut self, conn: u64, grant: Grant, ctx: &mut Context<Self>) {
        let id = self.next_worker;
        self.next_worker += 1;
        log::debug!("cluster: ticket {} (c{conn}) granted {} at {}", grant.ticket, grant.slot, grant.addr);
        let opener = (self.setup.opener)(&grant);
        let actor = BackendActor::new(id, grant.slot.clone(), 0, opener, self.setup.limits, ctx.address().recipient());
        actor.start();
        if let Some(c) = self.clients.get_mut(&conn) {
            c.stage = Stage::Opening(id);
        }
        self.opening.insert(id, (conn, grant));
    }

    fn forget_ticket(&mut self, ticket: TicketId, ctx: &mut Context<Self>) {
        let call = self.setup.coordinator.leave(ticket);
        ctx.spawn(call.into_actor(self).map(move |result, _, _| {
            if let Err(e) = result {
                log::warn!("cluster: ticket {ticket}: cannot leave the queue: {e}");
            }
        }));
    }

    /// Reads the store's version; a change (or `update_interval` passing) reads a new view.
    fn poll(&mut self, ctx: &mut Context<Self>) {
        if self.reading || self.viewed_at.elapsed() < MIN_VIEW_INTERVAL {
            return;
        }
        self.reading = true;
        let coordinator = self.setup.coordinator.clone();
        let (seen, due) = (self.view.version, self.last_update.elapsed() >= self.setup.update_interval);
        let read = async move {
            let version = coordinator.version().await?;
            if version == seen && !due {
                return Ok(None);
            }
            coordinator.snapshot().await.map(Some)
        };
        ctx.spawn(read.into_actor(self).map(|result: Result<Option<ClusterView>, ClusterError>, act, ctx| {
            act.reading = false;
            match result {
                Ok(Some(view)) => act.viewed(view, ctx),
                Ok(None) => {}
                Err(e) => log::debug!("cluster: cannot read the queue: {e}"),
            }
        }));
    }

    fn viewed(&mut self, view: ClusterView, ctx: &mut Context<Self>) {
        let changed = view.version != self.view.version;
        let periodic = self.last_update.elapsed() >= self.setup.update_interval;
        self.view = view;
        self.viewed_at = Instant::now();
        metrics().cluster_waiting.set(self.view.tickets.len() as i64);
        metrics().queue_length.set(self.clients.values().filter(|c| c.stage == Stage::Waiting).count() as i64);
        if !changed && !periodic {
            return;
        }
        if periodic {
            self.last_update = Instant::now();
        }
        let Told { lost, held_back } = self.tell(periodic, true);
        self.send_updates(ctx);
        self.reap(ctx);
        for conn in lost {
            // The store lost its ticket (it restarted, or retired this replica): again, in place.
            log::warn!("cluster: c{conn}: its ticket is no longer in the queue; enqueued again with it");
            if let Some(c) = self.clients.get_mut(&conn) {
                c.missing = 0;
            }
            self.enqueue(conn, ctx);
        }
        self.tell_later(held_back, ctx);
    }

    /// Queues a notice for each waiting client whose position in the last view is lower than
    /// told (and was told at least [`MIN_TELL_INTERVAL`] ago), or every waiting client when
    /// `periodic`. A `fresh` view also counts the clients it does not list.
    fn tell(&mut self, periodic: bool, fresh: bool) -> Told {
        let etas: HashMap<TicketId, f64> =
            self.view_infos().into_iter().map(|i| (i.ticket, i.estimated_wait_s)).collect();
        let positions: HashMap<TicketId, usize> =
            self.view.tickets.iter().enumerate().map(|(i, t)| (t.ticket, i + 1)).collect();
        let length = self.view.tickets.len();
        let now = Instant::now();
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
            let estimated_wait_s = etas.get(&ticket).copied().unwrap_or(0.0);
            let info = QueueInfo { ticket, position, estimated_wait_s, queue_length: length };
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
                    let first = matches!(e.get(), QueueNotice::Queued(_));
                    e.insert(if first { QueueNotice::Queued(info) } else { QueueNotice::Update(info) });
                }
                Entry::Vacant(e) => {
                    e.insert(if first { QueueNotice::Queued(info) } else { QueueNotice::Update(info) });
                    self.updates.push_back(*conn);
                }
            }
        }
        self.batch = paced_batch(self.updates.len(), UPDATE_SPREAD, UPDATE_PAUSE, UPDATE_MIN_BATCH);
        Told { lost, held_back }
    }

    /// Clients whose move was held back ([`MIN_TELL_INTERVAL`]) hear it from the last view
    /// once they are due, if no newer view told them first.
    fn tell_later(&mut self, held_back: bool, ctx: &mut Context<Self>) {
        if !held_back || self.tell_scheduled {
            return;
        }
        self.tell_scheduled = true;
        ctx.run_later(MIN_TELL_INTERVAL, |act, ctx| {
            act.tell_scheduled = false;
            let told = act.tell(false, false);
            act.send_updates(ctx);
            act.tell_later(told.held_back, ctx);
        });
    }

    /// Tickets of this replica in the last view that no client holds (orphans, see
    /// [`ORPHAN_AFTER`]) leave the queue, and grants kept for a ticket no client ever came to
    /// claim go back.
    fn reap(&mut self, ctx: &mut Context<Self>) {
        self.expire_early(ctx);
        let replica = self.setup.coordinator.replica();
        let numbered_before = (self.view.now_ms.saturating_sub(ORPHAN_AFTER.as_millis() as u64)).saturating_mul(1000);
        let held: std::collections::HashSet<TicketId> = self
            .clients
            .values()
            .filter_map(|c| c.ticket)
            .chain(self.claimed.values().copied())
            .chain(self.early.keys().copied())
            .collect();
        let orphans: Vec<TicketId> = self
            .view
            .tickets
            .iter()
            .filter(|t| t.replica == replica && t.ticket < numbered_before && !held.contains(&t.ticket))
            .map(|t| t.ticket)
            .collect();
        for ticket in orphans {
            log::warn!(
                "cluster: ticket {ticket} of this replica has no client (its enqueue's answer was lost): it leaves the queue"
            );
            self.forget_ticket(ticket, ctx);
        }
    }

    /// Grants kept longer than [`EARLY_GRANT`] for a ticket no client holds go back: their
    /// tickets leave the queue.
    fn expire_early(&mut self, ctx: &mut Context<Self>) {
        let stale: Vec<TicketId> =
            self.early.iter().filter(|(_, (_, at))| at.elapsed() > EARLY_GRANT).map(|(t, _)| *t).collect();
        for ticket in stale {
            self.early.remove(&ticket);
            self.forget_ticket(ticket, ctx);
        }
    }

    /// Sends the next batch of position updates; the rest after a pause.
    fn send_updates(&mut self, ctx: &mut Context<Self>) {
        if self.sending {
            return;
        }
        for _ in 0..self.batch {
            let Some(conn) = self.updates.pop_front() else { break };
            let (Some(notice), Some(c)) = (self.notices.remove(&conn), self.clients.get(&conn)) else { continue };
            // A client that left, or took a worker meanwhile, has nothing more to hear.
            if c.stage == Stage::Waiting {
                c.notify.do_send(notice);
            }
        }
        if !self.updates.is_empty() {
            self.sending = true;
            ctx.run_later(UPDATE_PAUSE, |act, ctx| {
                act.sending = false;
                act.send_updates(ctx);
            });
        }
    }

    fn grants_loop(&mut self, ctx: &mut Context<Self>) {
        let call = self.setup.coordinator.grants(Duration::from_secs(1));
        ctx.spawn(call.into_actor(self).map(|result, act, ctx| match result {
            Ok(grants) => {
                for grant in grants {
                    act.granted(grant, ctx);
                }
                act.grants_loop(ctx);
            }
            Err(e) => {
                log::debug!("cluster: cannot read grants: {e}");
                ctx.run_later(POLL, |act, ctx| act.grants_loop(ctx));
            }
        }));
    }

    /// A node freed a worker for one of this replica's tickets (the grant came through the
    /// store, or on a link kept open to the node).
    fn granted(&mut self, grant: Grant, ctx: &mut Context<Self>) {
        let Some(conn) = self.conn_of(grant.ticket) else {
            // The store's answer to its enqueue may still be on its way (the grant overtook
            // it): kept a moment. A ticket nobody claims by then is gone (its client left): it
            // leaves the queue, and the node, finding it gone at its next beat, offers the worker
            // again under a new nonce.
            log::debug!("cluster: grant of {} for ticket {} that no client holds (yet)", grant.slot, grant.ticket);
            self.expire_early(ctx);
            // A grant offered again to the same ticket keeps the first one's time: an orphan
            // ticket's grants go back however often they come.
            let since = self.early.get(&grant.ticket).map_or_else(Instant::now, |(_, at)| *at);
            self.early.insert(grant.ticket, (grant, since));
            return;
        };
        match self.clients.get(&conn).map(|c| c.stage) {
            Some(Stage::Waiting) | Some(Stage::Enqueueing) => self.open(conn, grant, ctx),
            // It is taking another grant already: this one is stale, or a duplicate.
            _ => log::debug!("cluster: ticket {} already holds a grant; {} not taken", grant.ticket, grant.slot),
        }
    }
}

impl Actor for ClusterQueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.beat(ctx);
        let every = self.setup.lease / 3;
        ctx.run_interval(every, |act, ctx| act.beat(ctx));
        ctx.run_interval(POLL, |act, ctx| act.poll(ctx));
        self.grants_loop(ctx);
    }
}

impl Handler<GrantPushed> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: GrantPushed, ctx: &mut Context<Self>) {
        self.granted(msg.0, ctx);
    }
}

impl Handler<Join> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: Join, ctx: &mut Context<Self>) {
        let ticket = if msg.front { self.claimed.remove(&msg.conn) } else { None };
        let client = Client {
            mode: msg.mode,
            notify: msg.notify,
            ticket,
            stage: Stage::Enqueueing,
            told: None,
            told_at: None,
            missing: 0,
        };
        if self.store_down {
            let why = "the queue cannot be reached (the cluster's store is down); try again shortly";
            client.notify.do_send(QueueNotice::Rejected(ProtocolError::ServiceUnavailable(why.into())));
            return;
        }
        self.clients.insert(msg.conn, client);
        if self.known {
            self.enqueue(msg.conn, ctx);
        } else {
            self.unregistered.push(msg.conn);
        }
    }
}

impl Handler<Leave> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: Leave, ctx: &mut Context<Self>) {
        self.claimed.remove(&msg.conn);
        let Some(c) = self.clients.remove(&msg.conn) else { return };
        match (c.stage, c.ticket) {
            // The enqueue's answer, or the attach, finds it gone and undoes itself.
            (Stage::Enqueueing, _) | (Stage::Opening(_), _) => {}
            // Handed its worker and gone before it took it: the worker goes back to its node.
            (Stage::Assigned(worker), ticket) => {
                if let Some(backend) = self.lent.remove(&worker) {
                    backend.do_send(Stop { within: STOP_WITHIN });
                }
                if let Some(ticket) = ticket {
                    self.forget_ticket(ticket, ctx);
                }
            }
            (_, Some(ticket)) => self.forget_ticket(ticket, ctx),
            (_, None) => {}
        }
    }
}

impl Handler<Claim> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, msg: Claim, ctx: &mut Context<Self>) {
        let Some(c) = self.clients.remove(&msg.conn) else { return };
        let Some(ticket) = c.ticket else { return };
        self.claimed.insert(msg.conn, ticket);
        let call = self.setup.coordinator.claim(ticket);
        ctx.spawn(call.into_actor(self).map(move |result, _, _| {
            if let Err(e) = result {
                // The node admitted the session: the store learns it at the node's next beat.
                log::warn!("cluster: ticket {ticket}: claim not recorded: {e}");
            }
        }));
    }
}

impl Handler<Cancel> for ClusterQueueActor {
    type Result = ResponseActFuture<Self, bool>;
    fn handle(&mut self, msg: Cancel, _: &mut Context<Self>) -> Self::Result {
        let call = self.setup.coordinator.cancel(msg.ticket);
        Box::pin(call.into_actor(self).map(move |result, act, _| {
            let cancelled = result.unwrap_or(false);
            if cancelled
                && let Some(conn) = act.conn_of(msg.ticket)
                && let Some(c) = act.clients.remove(&conn)
            {
                c.notify.do_send(QueueNotice::Cancelled);
            }
            cancelled
        }))
    }
}

impl Handler<QueueSnapshot> for ClusterQueueActor {
    type Result = MessageResult<QueueSnapshot>;
    fn handle(&mut self, _: QueueSnapshot, _: &mut Context<Self>) -> Self::Result {
        let etas: HashMap<TicketId, f64> =
            self.view_infos().into_iter().map(|i| (i.ticket, i.estimated_wait_s)).collect();
        let tickets = self
            .view
            .tickets
            .iter()
            .enumerate()
            .map(|(i, t)| TicketStatus {
                ticket: t.ticket,
                mode: t.mode,
                position: i + 1,
                waited: Duration::ZERO,
                estimated_wait_s: etas.get(&t.ticket).copied().unwrap_or(0.0),
            })
            .collect();
        MessageResult(tickets)
    }
}

impl Handler<ClusterStatusQuery> for ClusterQueueActor {
    type Result = MessageResult<ClusterStatusQuery>;
    fn handle(&mut self, _: ClusterStatusQuery, _: &mut Context<Self>) -> Self::Result {
        MessageResult(ClusterStatus { replica: self.replica(), store_up: !self.store_down, view: self.view.clone() })
    }
}

impl Handler<WorkerEvent> for ClusterQueueActor {
    type Result = ();
    fn handle(&mut self, event: WorkerEvent, ctx: &mut Context<Self>) {
        match event {
            WorkerEvent::Opened { worker, backend, .. } => {
                let Some((conn, grant)) = self.opening.remove(&worker) else { return };
                match self.clients.get_mut(&conn) {
                    Some(c) => {
                        c.stage = Stage::Assigned(worker);
                        let link = WorkerLink { id: worker, name: grant.slot.clone(), backend: backend.clone() };
                        c.notify.do_send(QueueNotice::Assigned { ticket: grant.ticket, worker: link });
                        self.lent.insert(worker, backend);
                    }
                    None => {
                        // Its client left while the node attached: give the worker back.
                        backend.do_send(Stop { within: STOP_WITHIN });
                        self.forget_ticket(grant.ticket, ctx);
                    }
                }
            }
            WorkerEvent::OpenFailed { worker, reason, .. } => {
                let Some((conn, grant)) = self.opening.remove(&worker) else { return };
                log::info!("cluster: ticket {} (c{conn}): {} not taken: {reason}", grant.ticket, grant.slot);
                match self.clients.get_mut(&conn) {
                    Some(c) => c.stage = Stage::Waiting,
                    None => return self.forget_ticket(grant.ticket, ctx),
                }
                let call = self.setup.coordinator.requeue(&grant);
                ctx.spawn(call.into_actor(self).map(move |result, _, _| {
                    if let Err(e) = result {
                        log::warn!("cluster: ticket {}: cannot go back to its place: {e}", grant.ticket);
                    }
                }));
            }
            WorkerEvent::Released { worker, .. } | WorkerEvent::Failed { worker, .. } => {
                if let Some(backend) = self.lent.remove(&worker) {
                    backend.do_send(Stop { within: STOP_WITHIN });
                }
            }
            WorkerEvent::Busy { .. } | WorkerEvent::Identified { .. } | WorkerEvent::Resetting { .. } => {}
        }
    }
}
