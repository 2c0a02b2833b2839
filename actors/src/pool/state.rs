//! The worker pool's rules, as a plain struct: each worker's state, its backend generation (an
//! incarnation of its BackendActor), counters, and the restart backoff. Every decision is an
//! [`Effect`] the pool's actor carries out: offer a worker to the queue, hand a lent one to
//! its ticket, tell the queue a worker is starting or down, restart it after a delay, stop or
//! forget its actor. The actor delivers; it decides nothing.
//!
//! A worker is configured (it restarts with backoff when it fails), joined (a node's, reached
//! after start: the same), or lent: a cluster's node worker that its store granted to one of
//! this replica's tickets, run here for that one session. A lent worker keeps its entry (by
//! name) across its grants, so its counters and its failures read as a configured worker's do;
//! it is never restarted here (its node does that).

use std::time::{Duration, Instant};

use crate::domain::Mode;
use crate::ids::{TicketId, WorkerId};
use crate::status::{WorkerRow, WorkerStatus};

const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Delay before restarting a worker that failed `consecutive` times in a row (from 1).
pub fn backoff(consecutive: u32) -> Duration {
    let factor = 1u32 << consecutive.saturating_sub(1).min(16);
    (BACKOFF_FIRST * factor).min(BACKOFF_MAX)
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WorkerState {
    /// Opening its backend.
    Starting,
    Idle,
    /// Its session's connection (its labels are the session's), the session's mode, and since
    /// when.
    Busy {
        conn: u64,
        mode: Mode,
        since: Instant,
    },
    /// Its session ended; the backend is being reset before it is offered again.
    Resetting,
    /// Its backend failed or did not open.
    Failed {
        reason: String,
    },
}

impl WorkerState {
    pub(crate) fn status(&self) -> WorkerStatus {
        match self {
            WorkerState::Starting => WorkerStatus::Starting,
            WorkerState::Idle => WorkerStatus::Idle,
            WorkerState::Busy { .. } => WorkerStatus::Busy,
            WorkerState::Resetting => WorkerStatus::Resetting,
            WorkerState::Failed { .. } => WorkerStatus::Failed,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct PoolWorker {
    pub(crate) name: String,
    /// Where its backend comes from ("builtin" or a library path).
    backend: String,
    pub(crate) modes: Vec<Mode>,
    pub(crate) state: WorkerState,
    /// Incarnation of its BackendActor; messages from older ones are ignored.
    pub(crate) generation: u64,
    pub(crate) sessions_served: u64,
    pub(crate) restarts: u64,
    pub(crate) consecutive_failures: u32,
    pub(crate) last_error: Option<String>,
    /// Its last failure was an open that failed.
    open_failed: bool,
    /// The process hosting its backend, when it runs in one of its own.
    process_id: Option<u32>,
    /// The node it runs on, when it is not the gateway's own.
    pub(crate) node: Option<String>,
    /// Lent to this ticket for one session (a cluster's node worker); `None` otherwise.
    pub(crate) lent: Option<TicketId>,
    /// It is a cluster's node worker, lent for one session at a time.
    pub(crate) lendable: bool,
}

impl PoolWorker {
    fn new(name: String, backend: String, modes: Vec<Mode>) -> PoolWorker {
        PoolWorker {
            name,
            backend,
            modes,
            state: WorkerState::Starting,
            generation: 1,
            sessions_served: 0,
            restarts: 0,
            consecutive_failures: 0,
            last_error: None,
            open_failed: false,
            process_id: None,
            node: None,
            lent: None,
            lendable: false,
        }
    }

    /// The worker as every role shows it.
    pub(crate) fn row(&self) -> WorkerRow {
        let mut row = WorkerRow::new(self.name.clone(), self.modes.clone(), self.state.status());
        row.backend = Some(self.backend.clone());
        row.node = self.node.clone();
        row.sessions_served = Some(self.sessions_served);
        row.restarts = Some(self.restarts);
        row.process_id = self.process_id;
        row.last_error = self.last_error.clone();
        match &self.state {
            WorkerState::Busy { conn, mode, .. } => {
                row.conn = Some(*conn);
                row.mode = Some(*mode);
            }
            WorkerState::Failed { reason } => row.failure = Some(reason.clone()),
            _ => {}
        }
        row
    }
}

/// What the pool's actor must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Offer the worker to the queue: it is open and free.
    Offer(WorkerId),
    /// A lent worker is open: hand it to its ticket.
    LentOpened { worker: WorkerId, ticket: TicketId },
    /// A lent worker could not be taken.
    LendFailed { ticket: TicketId, reason: String },
    /// Tell the queue it is starting again: it will serve (a failure at work, a node out of
    /// reach for now).
    Starting { worker: WorkerId, reason: String },
    /// Tell the queue it cannot serve until it recovers (its backend does not open).
    Down { worker: WorkerId, reason: String },
    /// Tell the queue the modes it serves now.
    Modes { worker: WorkerId, modes: Vec<Mode> },
    /// Tell the queue a session of `mode` lasted `length`.
    Finished { mode: Mode, length: Duration },
    /// Start its backend again after `after`.
    Restart { worker: WorkerId, after: Duration },
    /// Stop its actor: a lent worker's link goes back to its node.
    Stop(WorkerId),
    /// Forget its actor: it is gone (a lent worker's node restarts it).
    Forget(WorkerId),
}

#[derive(Debug, Clone)]
pub(crate) struct PoolState {
    workers: Vec<PoolWorker>,
}

impl PoolState {
    /// Every worker starts in `Starting`, generation 1.
    pub(crate) fn new(workers: impl IntoIterator<Item = (String, String, Vec<Mode>, Option<String>)>) -> PoolState {
        let workers = workers
            .into_iter()
            .map(|(name, backend, modes, node)| PoolWorker { node, ..PoolWorker::new(name, backend, modes) })
            .collect();
        PoolState { workers }
    }

    /// A worker joins after start (one of a node's): `Starting`, generation 1. Returns its id.
    pub(crate) fn add(&mut self, name: String, backend: String, modes: Vec<Mode>, node: Option<String>) -> WorkerId {
        self.workers.push(PoolWorker { node, ..PoolWorker::new(name, backend, modes) });
        self.workers.len() - 1
    }

    pub(crate) fn workers(&self) -> &[PoolWorker] {
        &self.workers
    }

    pub(crate) fn worker(&self, id: WorkerId) -> &PoolWorker {
        &self.workers[id]
    }

    fn current(&self, id: WorkerId, generation: u64) -> bool {
        self.workers.get(id).is_some_and(|w| w.generation == generation)
    }

    /// Its backend opened (in its own process `process_id`, if one; `vision`: it sees images).
    /// `None` for a stale generation: its actor is not this worker's any more.
    pub(crate) fn opened(
        &mut self,
        id: WorkerId,
        generation: u64,
        process_id: Option<u32>,
        vision: bool,
    ) -> Option<Vec<Effect>> {
        if !self.current(id, generation) {
            return None;
        }
        let w = &mut self.workers[id];
        w.state = WorkerState::Idle;
        w.consecutive_failures = 0;
        w.open_failed = false;
        w.process_id = process_id;
        if let Some(ticket) = w.lent {
            return Some(vec![Effect::LentOpened { worker: id, ticket }]);
        }
        let mut effects = Vec::new();
        if !vision && w.modes.contains(&Mode::Video) {
            w.modes.retain(|m| *m != Mode::Video);
            effects.push(Effect::Modes { worker: id, modes: w.modes.clone() });
        }
        effects.push(Effect::Offer(id));
        Some(effects)
    }

    /// Its backend did not open (`transient`: out of reach for now, not broken).
    pub(crate) fn open_failed(
        &mut self,
        id: WorkerId,
        generation: u64,
        reason: String,
        transient: bool,
    ) -> Vec<Effect> {
        if let Some(ticket) = self.workers[id].lent {
            if !self.current(id, generation) {
                return Vec::new();
            }
            let w = &mut self.workers[id];
            w.lent = None;
            if w.state == WorkerState::Starting {
                w.state = WorkerState::Idle;
            }
            return vec![Effect::Forget(id), Effect::LendFailed { ticket, reason }];
        }
        let Some(after) = self.fail(id, generation, reason.clone()) else { return Vec::new() };
        self.workers[id].open_failed = true;
        let told =
            if transient { Effect::Starting { worker: id, reason } } else { Effect::Down { worker: id, reason } };
        vec![told, Effect::Restart { worker: id, after }]
    }

    /// A session took it.
    pub(crate) fn busy(&mut self, id: WorkerId, generation: u64, conn: u64, mode: Mode, now: Instant) {
        if self.current(id, generation) {
            self.workers[id].state = WorkerState::Busy { conn, mode, since: now };
        }
    }

    /// The session's length, if one held the worker.
    fn finished(&self, id: WorkerId, now: Instant) -> Option<Effect> {
        match self.workers[id].state {
            WorkerState::Busy { mode, since, .. } => Some(Effect::Finished { mode, length: now.duration_since(since) }),
            _ => None,
        }
    }

    /// Its session ended (one more served); the backend is resetting.
    pub(crate) fn resetting(&mut self, id: WorkerId, generation: u64, now: Instant) -> Vec<Effect> {
        if !self.current(id, generation) {
            return Vec::new();
        }
        let effects: Vec<Effect> = self.finished(id, now).into_iter().collect();
        let w = &mut self.workers[id];
        if matches!(w.state, WorkerState::Busy { .. }) {
            w.sessions_served += 1;
        }
        w.state = WorkerState::Resetting;
        effects
    }

    /// Its backend was reset after a session: a configured worker is offered again, a lent one
    /// goes back to its node.
    pub(crate) fn released(&mut self, id: WorkerId, generation: u64) -> Vec<Effect> {
        if !self.current(id, generation) {
            return Vec::new();
        }
        let w = &mut self.workers[id];
        w.state = WorkerState::Idle;
        w.lent = None;
        if w.lendable { vec![Effect::Stop(id)] } else { vec![Effect::Offer(id)] }
    }

    /// Marks the worker failed; answers the backoff before its restart (`None` when stale).
    fn fail(&mut self, id: WorkerId, generation: u64, reason: String) -> Option<Duration> {
        if !self.current(id, generation) {
            return None;
        }
        let w = &mut self.workers[id];
        if matches!(w.state, WorkerState::Busy { .. }) {
            w.sessions_served += 1;
        }
        w.consecutive_failures += 1;
        w.last_error = Some(reason.clone());
        w.process_id = None;
        w.lent = None;
        w.state = WorkerState::Failed { reason };
        Some(backoff(w.consecutive_failures))
    }

    /// Its backend failed at work (hung, crashed). A configured worker will be back: the queue
    /// keeps counting it as able to serve, and it restarts with backoff. A lent one's node
    /// restarts it, and offers it again when it is back.
    pub(crate) fn failed(&mut self, id: WorkerId, generation: u64, reason: String, now: Instant) -> Vec<Effect> {
        if !self.current(id, generation) {
            return Vec::new();
        }
        let mut effects: Vec<Effect> = self.finished(id, now).into_iter().collect();
        let lendable = self.workers[id].lendable;
        let Some(after) = self.fail(id, generation, reason.clone()) else { return effects };
        if lendable {
            effects.push(Effect::Forget(id));
        } else {
            effects.push(Effect::Starting { worker: id, reason });
            effects.push(Effect::Restart { worker: id, after });
        }
        effects
    }

    /// Its backend had no room for the session that took it: a failure (backoff, restart), but
    /// not a session served, nor one whose length the wait estimates learn from.
    pub(crate) fn no_room(&mut self, id: WorkerId, generation: u64, reason: String, now: Instant) -> Vec<Effect> {
        if self.current(id, generation) && matches!(self.workers[id].state, WorkerState::Busy { .. }) {
            self.workers[id].state = WorkerState::Starting;
        }
        self.failed(id, generation, reason, now)
    }

    /// Starts a new incarnation; returns its generation. A worker whose backend did not
    /// open stays failed while it tries again; one that failed at work is starting.
    pub(crate) fn restart(&mut self, id: WorkerId) -> u64 {
        let w = &mut self.workers[id];
        w.generation += 1;
        w.restarts += 1;
        if !w.open_failed {
            w.state = WorkerState::Starting;
        }
        w.generation
    }

    /// A cluster lends worker `name` (of `node`) to `ticket` for one session: its entry (made
    /// the first time) gets a new generation. A worker failed before is starting again; an
    /// idle one stays idle until its session takes it. Answers its id and generation; an actor
    /// of its last grant still stopping is left to stop.
    pub(crate) fn lend(
        &mut self,
        name: &str,
        backend: String,
        node: String,
        mode: Mode,
        ticket: TicketId,
    ) -> (WorkerId, u64, Vec<Effect>) {
        let (id, effects) = match self.workers.iter().position(|w| w.lendable && w.name == name) {
            Some(id) => (id, vec![Effect::Stop(id)]),
            None => {
                let id = self.add(name.to_string(), backend, vec![mode], Some(node));
                self.workers[id].lendable = true;
                self.workers[id].generation = 0;
                (id, Vec::new())
            }
        };
        let w = &mut self.workers[id];
        w.generation += 1;
        w.lent = Some(ticket);
        if !w.modes.contains(&mode) {
            w.modes.push(mode);
        }
        if matches!(w.state, WorkerState::Failed { .. }) {
            w.state = WorkerState::Starting;
        }
        (id, w.generation, effects)
    }

    /// A lent worker's client left before it took it: the worker goes back to its node.
    pub(crate) fn given_back(&mut self, id: WorkerId) -> Vec<Effect> {
        let Some(w) = self.workers.get_mut(id).filter(|w| w.lendable) else { return Vec::new() };
        w.lent = None;
        w.state = WorkerState::Idle;
        vec![Effect::Stop(id)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> PoolState {
        PoolState::new([("a-0".to_string(), "builtin".to_string(), vec![Mode::Video, Mode::Audio], None)])
    }

    fn status(p: &PoolState, id: WorkerId) -> &'static str {
        p.worker(id).state.status().as_str()
    }

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(7), Duration::from_secs(30));
        assert_eq!(backoff(1000), Duration::from_secs(30));
    }

    #[test]
    fn a_worker_is_offered_served_reset_and_offered_again() {
        let t = Instant::now();
        let mut p = pool();
        assert_eq!(status(&p, 0), "starting");
        assert_eq!(p.opened(0, 1, Some(42), true), Some(vec![Effect::Offer(0)]));
        p.busy(0, 1, 7, Mode::Video, t);
        let row = p.worker(0).row();
        assert_eq!(
            (row.state, row.conn, row.mode, row.process_id),
            (WorkerStatus::Busy, Some(7), Some(Mode::Video), Some(42))
        );
        let later = t + Duration::from_secs(3);
        assert_eq!(p.resetting(0, 1, later), [Effect::Finished { mode: Mode::Video, length: Duration::from_secs(3) }]);
        assert_eq!(status(&p, 0), "resetting");
        assert_eq!(p.released(0, 1), [Effect::Offer(0)]);
        assert_eq!((status(&p, 0), p.worker(0).sessions_served), ("idle", 1));
    }

    #[test]
    fn a_backend_without_vision_serves_no_video() {
        let mut p = pool();
        let effects = p.opened(0, 1, None, false).unwrap();
        assert_eq!(effects, [Effect::Modes { worker: 0, modes: vec![Mode::Audio] }, Effect::Offer(0)]);
        assert_eq!(p.worker(0).row().modes, [Mode::Audio]);
    }

    #[test]
    fn a_failure_at_work_keeps_the_worker_counted_and_restarts_it_with_backoff() {
        let t = Instant::now();
        let mut p = pool();
        p.opened(0, 1, None, true);
        p.busy(0, 1, 7, Mode::Audio, t);
        let effects = p.failed(0, 1, "step timeout".into(), t);
        assert_eq!(
            effects,
            [
                Effect::Finished { mode: Mode::Audio, length: Duration::ZERO },
                Effect::Starting { worker: 0, reason: "step timeout".into() },
                Effect::Restart { worker: 0, after: Duration::from_millis(500) },
            ]
        );
        let row = p.worker(0).row();
        assert_eq!(
            (row.state, row.failure.as_deref(), row.sessions_served),
            (WorkerStatus::Failed, Some("step timeout"), Some(1))
        );
        assert_eq!(p.restart(0), 2);
        assert_eq!((p.worker(0).restarts, status(&p, 0)), (1, "starting"));
        // The new incarnation does not open: it is down, longer backoff, failed while it retries.
        assert_eq!(
            p.open_failed(0, 2, "open failed".into(), false),
            [
                Effect::Down { worker: 0, reason: "open failed".into() },
                Effect::Restart { worker: 0, after: Duration::from_secs(1) }
            ]
        );
        p.restart(0);
        assert_eq!(status(&p, 0), "failed");
        assert_eq!(p.opened(0, 3, None, true), Some(vec![Effect::Offer(0)]));
        assert_eq!(p.worker(0).consecutive_failures, 0);
    }

    #[test]
    fn no_room_for_a_session_restarts_the_worker_with_backoff_and_serves_no_session() {
        let t = Instant::now();
        let mut p = pool();
        p.opened(0, 1, None, true);
        p.busy(0, 1, 7, Mode::Audio, t);
        let effects = p.no_room(0, 1, "no free session slot".into(), t);
        assert_eq!(
            effects,
            [
                Effect::Starting { worker: 0, reason: "no free session slot".into() },
                Effect::Restart { worker: 0, after: Duration::from_millis(500) },
            ],
            "no session length to learn from"
        );
        let row = p.worker(0).row();
        assert_eq!((row.state, row.sessions_served), (WorkerStatus::Failed, Some(0)));
        p.restart(0);
        assert_eq!(p.no_room(0, 2, "again".into(), t)[1], Effect::Restart { worker: 0, after: Duration::from_secs(1) });
    }

    #[test]
    fn a_node_out_of_reach_for_now_is_starting_not_down() {
        let mut p = pool();
        let effects = p.open_failed(0, 1, "node unreachable".into(), true);
        assert!(matches!(effects[0], Effect::Starting { .. }), "{effects:?}");
    }

    #[test]
    fn stale_generations_are_ignored() {
        let t = Instant::now();
        let mut p = pool();
        p.opened(0, 1, None, true);
        p.failed(0, 1, "hang".into(), t);
        p.restart(0);
        assert!(p.released(0, 1).is_empty(), "the old incarnation's release is stale");
        assert!(p.failed(0, 1, "late".into(), t).is_empty());
        assert_eq!(p.opened(0, 1, None, true), None);
        assert!(p.opened(0, 2, None, true).is_some());
    }

    #[test]
    fn a_lent_worker_keeps_its_entry_across_grants_and_goes_back_to_its_node() {
        let t = Instant::now();
        let mut p = PoolState::new([]);
        let (id, g1, effects) = p.lend("n1/w", "node n1".into(), "n1".into(), Mode::Audio, 7);
        assert!(effects.is_empty(), "a first grant: no actor to stop");
        assert_eq!((status(&p, id), g1, p.worker(id).lent), ("starting", 1, Some(7)));
        assert_eq!(p.opened(id, g1, None, true), Some(vec![Effect::LentOpened { worker: id, ticket: 7 }]));
        p.busy(id, g1, 3, Mode::Audio, t);
        p.resetting(id, g1, t);
        assert_eq!(p.released(id, g1), [Effect::Stop(id)], "its link goes back to its node");
        assert_eq!((status(&p, id), p.worker(id).sessions_served, p.worker(id).lent), ("idle", 1, None));
        // The next grant of the same worker: the same entry, a new generation, still idle.
        let (again, g2, effects) = p.lend("n1/w", "node n1".into(), "n1".into(), Mode::Chat, 8);
        assert_eq!((again, g2, status(&p, id), effects), (id, 2, "idle", vec![Effect::Stop(id)]));
        assert_eq!(p.worker(id).modes, [Mode::Audio, Mode::Chat]);
        // It dies mid-session: failed, as a configured worker would be, and not restarted here.
        p.opened(id, g2, None, true);
        p.busy(id, g2, 4, Mode::Chat, t);
        let effects = p.failed(id, g2, "killed by signal 9".into(), t);
        assert_eq!(effects.last(), Some(&Effect::Forget(id)));
        assert!(!effects.iter().any(|e| matches!(e, Effect::Restart { .. })));
        assert_eq!(status(&p, id), "failed");
        let (_, g3, _) = p.lend("n1/w", "node n1".into(), "n1".into(), Mode::Chat, 9);
        assert_eq!(status(&p, id), "starting");
        // Refused by its node (the grant was stale): its node's again.
        assert_eq!(
            p.open_failed(id, g3, "stale grant".into(), false),
            [Effect::Forget(id), Effect::LendFailed { ticket: 9, reason: "stale grant".into() }]
        );
        assert_eq!((status(&p, id), p.worker(id).lent), ("idle", None));
        assert!(p.open_failed(id, g2, "late".into(), false).is_empty(), "stale");
        assert_eq!(p.given_back(id), [Effect::Stop(id)]);
        assert_eq!(p.workers().len(), 1);
    }
}
