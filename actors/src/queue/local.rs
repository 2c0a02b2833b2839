//! QueueActor: the queue of one process. It delivers messages to a [`QueueState`] and tells
//! waiting sessions what changed. Position changes are told within [`COALESCE`] by a
//! [`Fanout`]; every `update_interval` every waiting session gets a fresh ETA the same way.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::pacer::Fanout;
use super::state::{Assignment, JoinOutcome, LeaveOutcome, ModeSet, QueueState, TicketId, WorkerId};
use crate::domain::Mode;
use crate::messages::queue::QueueNotice;
use crate::messages::queue::{Cancel, Claim, Join, Leave, QueueSnapshot, WorkerReport};
use crate::messages::worker::WorkerLink;
use crate::observe::metrics;
use crate::protocol::ProtocolError;

struct Waiter {
    conn: u64,
    notify: Recipient<QueueNotice>,
}

/// The queue of one process; see the module's documentation.
pub struct QueueActor {
    state: QueueState,
    links: Vec<Option<WorkerLink>>,
    /// Every ticket from Join until Leave or Claim.
    by_conn: HashMap<u64, TicketId>,
    /// Tickets not yet given a worker, and tickets given one but not yet claimed.
    waiters: HashMap<TicketId, Waiter>,
    update_interval: Duration,
    /// Which tickets must be told their new position, and when.
    fanout: Fanout,
}

/// How often the queue looks for clients waiting with no worker of their mode in sight.
const STRANDED_EVERY: Duration = Duration::from_millis(500);
/// Position changes are told at most this long after they happen (plus a fan-out).
const COALESCE: Duration = Duration::from_millis(100);
/// Updates go out this many at a time...
const FANOUT_BATCH: usize = 64;
/// ...this long apart (10,000 waiting tickets are told in about 160 ms). Batches this small
/// leave the sessions' threads idle most of each millisecond: a worker's hand-over to the
/// head of the queue waits for one batch at most (docs/performance.md).
const FANOUT_PAUSE: Duration = Duration::from_millis(1);

impl QueueActor {
    /// `workers[i]` are the modes of worker `i`; `average` the assumed session length per
    /// mode (chat, video, audio) before any session ended.
    pub fn new(
        workers: &[Vec<Mode>],
        max_waiting: usize,
        average: [Duration; 3],
        update_interval: Duration,
    ) -> QueueActor {
        let sets: Vec<ModeSet> = workers.iter().map(|m| ModeSet::of(m)).collect();
        QueueActor {
            state: QueueState::new(&sets, max_waiting, average),
            links: workers.iter().map(|_| None).collect(),
            by_conn: HashMap::new(),
            waiters: HashMap::new(),
            update_interval,
            fanout: Fanout::new(COALESCE, FANOUT_BATCH, FANOUT_PAUSE),
        }
    }

    /// `sources` sources of workers are not reached yet (a gateway's `[[nodes]]`): until each
    /// is ([`WorkerReport::Reached`]), clients of any mode wait rather than being refused.
    pub fn expecting(mut self, sources: usize) -> QueueActor {
        self.state = self.state.expecting(sources);
        self
    }

    /// A client that waits this long with no worker of its mode in sight (every one failed, or
    /// not reached yet) is refused (`service_unavailable`).
    pub fn unavailable_after(mut self, after: Duration) -> QueueActor {
        self.state = self.state.unavailable_after(after);
        self
    }

    /// Every ticket from `index` on moved: they are told within `COALESCE`.
    fn moved_from(&mut self, index: usize, ctx: &mut Context<Self>) {
        metrics().queue_length.set(self.state.len() as i64);
        if let Some(after) = self.fanout.moved(index) {
            ctx.run_later(after, Self::fanout_tick);
        }
    }

    /// Tells the next batch of moved tickets their position and ETA.
    fn fanout_tick(&mut self, ctx: &mut Context<Self>) {
        let tick = self.fanout.tick(self.state.len());
        if let Some(range) = tick.send {
            for info in self.state.infos(range.start, range.len(), Instant::now()) {
                if let Some(w) = self.waiters.get(&info.ticket) {
                    w.notify.do_send(QueueNotice::Update(info));
                }
            }
        }
        if let Some(after) = tick.next {
            ctx.run_later(after, Self::fanout_tick);
        }
    }

    fn deliver(&mut self, a: Assignment, ctx: &mut Context<Self>) {
        let Some(link) = self.links[a.worker].clone() else {
            log::error!("queue: worker {} assigned without a link", a.worker);
            return;
        };
        if let Some(w) = self.waiters.get(&a.ticket) {
            log::debug!("queue: ticket {} (c{}) gets worker {}", a.ticket, w.conn, link.name);
            w.notify.do_send(QueueNotice::Assigned { ticket: a.ticket, worker: link });
        }
        self.moved_from(a.index, ctx);
    }

    fn offer(&mut self, worker: WorkerId, ctx: &mut Context<Self>) {
        if let Some(a) = self.state.worker_idle(worker, Instant::now()) {
            self.deliver(a, ctx);
        }
    }

    fn forget(&mut self, ticket: TicketId) -> Option<Waiter> {
        let w = self.waiters.remove(&ticket)?;
        self.by_conn.remove(&w.conn);
        Some(w)
    }
}

impl Actor for QueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.update_interval, |act, ctx| {
            if !act.state.is_empty() {
                act.moved_from(0, ctx);
            }
        });
        ctx.run_interval(STRANDED_EVERY, |act, ctx| {
            let stranded = act.state.stranded(Instant::now());
            let why = format!(
                "no worker has been able to serve this mode for {:.0} s (every one that can is down or not reached yet)",
                act.state.unavailable_after_s()
            );
            act.reject(stranded, &why, ctx);
        });
    }
}

impl Handler<Join> for QueueActor {
    type Result = ();
    fn handle(&mut self, msg: Join, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let outcome = if msg.front { self.state.rejoin(msg.mode, now) } else { self.state.join(msg.mode, now) };
        if msg.front && matches!(outcome, JoinOutcome::Waiting(_)) {
            // Everyone behind it moved down one place.
            self.moved_from(1, ctx);
        }
        let reply = match outcome {
            JoinOutcome::Assigned { ticket, worker } => match self.links[worker].clone() {
                Some(link) => {
                    self.by_conn.insert(msg.conn, ticket);
                    self.waiters.insert(ticket, Waiter { conn: msg.conn, notify: msg.notify.clone() });
                    QueueNotice::Assigned { ticket, worker: link }
                }
                None => {
                    // Cannot happen (a worker is idle only after WorkerIdle gave its link);
                    // undo the reservation rather than leak the worker.
                    self.state.leave(ticket);
                    QueueNotice::Rejected(ProtocolError::WorkerConnectFailed("the worker has no backend".into()))
                }
            },
            JoinOutcome::Waiting(info) => {
                self.by_conn.insert(msg.conn, info.ticket);
                self.waiters.insert(info.ticket, Waiter { conn: msg.conn, notify: msg.notify.clone() });
                QueueNotice::Queued(info)
            }
            JoinOutcome::Full => QueueNotice::Rejected(ProtocolError::QueueFull(format!(
                "the queue is full ({} clients waiting); try again later",
                self.state.len()
            ))),
            JoinOutcome::Unavailable => QueueNotice::Rejected(ProtocolError::ServiceUnavailable(format!(
                "no worker is configured to serve mode {}",
                msg.mode
            ))),
        };
        metrics().queue_length.set(self.state.len() as i64);
        msg.notify.do_send(reply);
    }
}

impl Handler<Leave> for QueueActor {
    type Result = ();
    fn handle(&mut self, msg: Leave, ctx: &mut Context<Self>) {
        let Some(ticket) = self.by_conn.remove(&msg.conn) else {
            return;
        };
        self.waiters.remove(&ticket);
        match self.state.leave(ticket) {
            LeaveOutcome::Waited { index } => self.moved_from(index, ctx),
            LeaveOutcome::Unclaimed { worker } => self.offer(worker, ctx),
            LeaveOutcome::Nothing => {}
        }
    }
}

impl Handler<Claim> for QueueActor {
    type Result = ();
    fn handle(&mut self, msg: Claim, _: &mut Context<Self>) {
        if let Some(ticket) = self.by_conn.remove(&msg.conn) {
            self.waiters.remove(&ticket);
            self.state.claim(ticket);
        }
    }
}

impl Handler<Cancel> for QueueActor {
    type Result = bool;
    fn handle(&mut self, msg: Cancel, ctx: &mut Context<Self>) -> bool {
        let LeaveOutcome::Waited { index } = self.state.leave(msg.ticket) else {
            return false;
        };
        if let Some(w) = self.forget(msg.ticket) {
            w.notify.do_send(QueueNotice::Cancelled);
        }
        self.moved_from(index, ctx);
        true
    }
}

impl Handler<WorkerReport> for QueueActor {
    type Result = ();
    fn handle(&mut self, report: WorkerReport, ctx: &mut Context<Self>) {
        match report {
            WorkerReport::Idle(link) => {
                let id = link.id;
                log::debug!("queue: worker {} is idle; {} waiting", link.name, self.state.len());
                self.links[id] = Some(link);
                self.offer(id, ctx);
            }
            WorkerReport::Joined { worker, modes } => {
                let id = self.state.add_worker(ModeSet::of(&modes));
                // The pool and the queue number workers alike: both only ever append.
                debug_assert_eq!(id, worker, "the queue and the pool disagree on worker ids");
                self.links.push(None);
            }
            WorkerReport::Starting { worker, .. } => self.state.worker_starting(worker),
            // Its clients wait for it (it is reopened) or another, up to unavailable_after.
            WorkerReport::Down { worker, .. } => {
                self.links[worker] = None;
                self.state.worker_failed(worker, Instant::now());
            }
            WorkerReport::Reached => {
                let orphaned = self.state.reached();
                self.reject(orphaned, "no worker is configured to serve this mode (on the nodes reached)", ctx);
            }
            WorkerReport::Modes { worker, modes } => {
                let orphaned = self.state.narrow(worker, ModeSet::of(&modes));
                self.reject(orphaned, "no worker can serve this mode: the backends have no vision", ctx);
            }
            WorkerReport::Finished { mode, length } => self.state.session_finished(mode, length),
        }
    }
}

impl QueueActor {
    /// Tells the waiting clients no worker can serve any more why, and the others their new
    /// positions.
    fn reject(&mut self, orphaned: Vec<TicketId>, why: &str, ctx: &mut Context<Self>) {
        if orphaned.is_empty() {
            return;
        }
        for ticket in orphaned {
            if let Some(w) = self.forget(ticket) {
                w.notify.do_send(QueueNotice::Rejected(ProtocolError::ServiceUnavailable(why.into())));
            }
        }
        self.moved_from(0, ctx);
    }
}

impl Handler<QueueSnapshot> for QueueActor {
    type Result = MessageResult<QueueSnapshot>;
    fn handle(&mut self, _: QueueSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.tickets(Instant::now()))
    }
}
