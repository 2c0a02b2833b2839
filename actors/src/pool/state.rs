//! The worker pool's rules, as a plain struct: each worker's state, its backend
//! generation (an incarnation of its BackendActor), counters, and the restart backoff.
//! [`crate::pool`]'s actor delivers messages to it and starts or stops actors.
//!
//! A worker is configured (it restarts with backoff when it fails), joined (a node's, reached
//! after start: the same), or lent: a cluster's node worker that its store granted to one of
//! this replica's tickets, run here for that one session. A lent worker keeps its entry (by
//! name) across its grants, so its counters and its failures read as a configured worker's do;
//! it is never restarted here (its node does that).

use std::time::{Duration, Instant};

use crate::domain::Mode;
use crate::ids::WorkerId;

const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Delay before restarting a worker that failed `consecutive` times in a row (from 1).
pub fn backoff(consecutive: u32) -> Duration {
    let factor = 1u32 << consecutive.saturating_sub(1).min(16);
    (BACKOFF_FIRST * factor).min(BACKOFF_MAX)
}

#[derive(Debug, Clone, PartialEq)]
pub enum WorkerState {
    /// Opening its backend.
    Starting,
    Idle,
    /// `session` is a connection label until the session has an id; `dialect` is known
    /// once the client initialised.
    Busy {
        session: String,
        mode: Mode,
        dialect: Option<&'static str>,
        /// How its client reaches the gateway, known with the dialect.
        transport: Option<&'static str>,
        since: Instant,
    },
    /// Its session ended; the backend is being reset before it is offered again.
    Resetting,
    /// Its backend failed or did not open; restarts at `retry_at`.
    Failed {
        reason: String,
        retry_at: Instant,
    },
}

impl WorkerState {
    pub fn name(&self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Idle => "idle",
            WorkerState::Busy { .. } => "busy",
            WorkerState::Resetting => "resetting",
            WorkerState::Failed { .. } => "failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct PoolWorker {
    pub name: String,
    /// Where its backend comes from ("builtin" or a library path).
    pub backend: String,
    pub modes: Vec<Mode>,
    pub state: WorkerState,
    /// Incarnation of its BackendActor; messages from older ones are ignored.
    pub generation: u64,
    pub sessions_served: u64,
    pub restarts: u64,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    /// Its last failure was an open that failed.
    pub open_failed: bool,
    /// The process hosting its backend, when it runs in one of its own.
    pub process_id: Option<u32>,
    /// The node it runs on, when it is not the gateway's own.
    pub node: Option<String>,
    /// Lent to this ticket for one session (a cluster's node worker); `None` otherwise.
    pub lent: Option<u64>,
    /// It is a cluster's node worker, lent for one session at a time.
    pub lendable: bool,
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
}

#[derive(Debug, Clone)]
pub(super) struct PoolState {
    workers: Vec<PoolWorker>,
}

/// What the actor must do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Restart {
    pub worker: WorkerId,
    pub after: Duration,
}

impl PoolState {
    /// Every worker starts in `Starting`, generation 1.
    pub(super) fn new(workers: impl IntoIterator<Item = (String, String, Vec<Mode>)>) -> PoolState {
        PoolState {
            workers: workers.into_iter().map(|(name, backend, modes)| PoolWorker::new(name, backend, modes)).collect(),
        }
    }

    /// A worker joins after start (one of a node's): `Starting`, generation 1. Returns its id.
    pub(super) fn add(&mut self, name: String, backend: String, modes: Vec<Mode>) -> WorkerId {
        self.workers.push(PoolWorker::new(name, backend, modes));
        self.workers.len() - 1
    }

    pub(super) fn workers(&self) -> &[PoolWorker] {
        &self.workers
    }

    pub(super) fn worker(&self, id: WorkerId) -> &PoolWorker {
        &self.workers[id]
    }

    fn current(&self, id: WorkerId, generation: u64) -> bool {
        self.workers.get(id).is_some_and(|w| w.generation == generation)
    }

    /// Its backend opened. Returns false for a stale generation.
    pub(super) fn opened(&mut self, id: WorkerId, generation: u64) -> bool {
        if !self.current(id, generation) {
            return false;
        }
        let w = &mut self.workers[id];
        w.state = WorkerState::Idle;
        w.consecutive_failures = 0;
        w.open_failed = false;
        true
    }

    /// The node it runs on.
    pub(super) fn set_node(&mut self, id: WorkerId, node: Option<String>) {
        self.workers[id].node = node;
    }

    /// The process hosting its backend (none: a thread of the gateway).
    /// The modes it serves, narrowed to what its backend can do.
    pub(super) fn set_modes(&mut self, id: WorkerId, modes: Vec<Mode>) {
        self.workers[id].modes = modes;
    }

    pub(super) fn set_process(&mut self, id: WorkerId, pid: Option<u32>) {
        self.workers[id].process_id = pid;
    }

    /// The queue gave it to a session.
    pub(super) fn assigned(&mut self, id: WorkerId, session: String, mode: Mode, now: Instant) {
        self.workers[id].state = WorkerState::Busy { session, mode, dialect: None, transport: None, since: now };
    }

    /// Its session initialised: it has an id and a dialect.
    pub(super) fn identified(&mut self, id: WorkerId, session_id: String, wire: &'static str, how: &'static str) {
        if let WorkerState::Busy { session, dialect, transport, .. } = &mut self.workers[id].state {
            *transport = Some(how);
            *session = session_id;
            *dialect = Some(wire);
        }
    }

    /// Its session ended (one more served); the backend is resetting.
    pub(super) fn resetting(&mut self, id: WorkerId, generation: u64) {
        if self.current(id, generation) {
            let w = &mut self.workers[id];
            if matches!(w.state, WorkerState::Busy { .. }) {
                w.sessions_served += 1;
            }
            w.state = WorkerState::Resetting;
        }
    }

    /// Its backend was reset after a session: idle again. Returns false when stale.
    pub(super) fn released(&mut self, id: WorkerId, generation: u64) -> bool {
        if !self.current(id, generation) {
            return false;
        }
        let w = &mut self.workers[id];
        w.state = WorkerState::Idle;
        w.lent = None;
        true
    }

    /// Its backend failed (did not open, hung, crashed). Returns when to restart it,
    /// or `None` for a stale generation.
    pub(super) fn failed(&mut self, id: WorkerId, generation: u64, reason: String, now: Instant) -> Option<Restart> {
        if !self.current(id, generation) {
            return None;
        }
        let w = &mut self.workers[id];
        if matches!(w.state, WorkerState::Busy { .. }) {
            w.sessions_served += 1;
        }
        w.consecutive_failures += 1;
        let after = backoff(w.consecutive_failures);
        w.last_error = Some(reason.clone());
        w.process_id = None;
        w.lent = None;
        w.state = WorkerState::Failed { reason, retry_at: now + after };
        Some(Restart { worker: id, after })
    }

    /// Its backend did not open: failed until a later attempt opens it.
    pub(super) fn open_failed(
        &mut self,
        id: WorkerId,
        generation: u64,
        reason: String,
        now: Instant,
    ) -> Option<Restart> {
        let restart = self.failed(id, generation, reason, now)?;
        self.workers[id].open_failed = true;
        Some(restart)
    }

    /// Starts a new incarnation; returns its generation. A worker whose backend did not
    /// open stays failed while it tries again; one that failed at work is starting.
    pub(super) fn restart(&mut self, id: WorkerId) -> u64 {
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
    /// idle one stays idle until its session takes it. Returns its id and generation.
    pub(super) fn lend(
        &mut self,
        name: &str,
        backend: String,
        node: String,
        mode: Mode,
        ticket: u64,
    ) -> (WorkerId, u64) {
        let id = match self.workers.iter().position(|w| w.lendable && w.name == name) {
            Some(id) => id,
            None => {
                let id = self.add(name.to_string(), backend, vec![mode]);
                self.workers[id].lendable = true;
                self.workers[id].node = Some(node);
                self.workers[id].generation = 0;
                id
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
        (id, w.generation)
    }

    /// A lent worker could not be taken (its node refused the grant, or is out of reach): it is
    /// its node's again, as far as this pool knows. False when stale.
    pub(super) fn lend_failed(&mut self, id: WorkerId, generation: u64) -> bool {
        if !self.current(id, generation) {
            return false;
        }
        let w = &mut self.workers[id];
        w.lent = None;
        if w.state == WorkerState::Starting {
            w.state = WorkerState::Idle;
        }
        true
    }

    /// A lent worker went back to its node before a session took it.
    pub(super) fn given_back(&mut self, id: WorkerId) {
        let w = &mut self.workers[id];
        w.lent = None;
        w.state = WorkerState::Idle;
    }

    #[cfg(test)]
    /// Workers that are not failed.
    pub(crate) fn ready_count(&self) -> usize {
        self.workers.iter().filter(|w| !matches!(w.state, WorkerState::Failed { .. })).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> PoolState {
        PoolState::new([("a-0".to_string(), "builtin".to_string(), vec![Mode::Video])])
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
    fn a_worker_goes_through_its_states() {
        let t = Instant::now();
        let mut p = pool();
        assert_eq!(p.worker(0).state, WorkerState::Starting);
        assert!(p.opened(0, 1));
        p.assigned(0, "c1".into(), Mode::Video, t);
        assert_eq!(p.worker(0).state.name(), "busy");
        p.identified(0, "sess_1".into(), "minicpm", "websocket");
        assert_eq!(
            p.worker(0).state,
            WorkerState::Busy {
                session: "sess_1".into(),
                mode: Mode::Video,
                dialect: Some("minicpm"),
                transport: Some("websocket"),
                since: t
            }
        );
        p.resetting(0, 1);
        assert_eq!(p.worker(0).state, WorkerState::Resetting);
        assert!(p.released(0, 1));
        assert_eq!((p.worker(0).state.name(), p.worker(0).sessions_served), ("idle", 1));
    }

    #[test]
    fn failures_back_off_and_restarts_count() {
        let t = Instant::now();
        let mut p = pool();
        p.opened(0, 1);
        let r = p.failed(0, 1, "step timeout".into(), t).unwrap();
        assert_eq!(r.after, Duration::from_millis(500));
        assert_eq!(p.ready_count(), 0);
        assert_eq!(p.worker(0).last_error.as_deref(), Some("step timeout"));
        assert_eq!(p.restart(0), 2);
        assert_eq!((p.worker(0).restarts, p.worker(0).state.name()), (1, "starting"));
        // the new incarnation fails to open: longer backoff, and failed while it retries
        assert_eq!(p.open_failed(0, 2, "open failed".into(), t).unwrap().after, Duration::from_secs(1));
        p.restart(0);
        assert_eq!(p.worker(0).state.name(), "failed");
        assert!(p.opened(0, 3));
        assert_eq!(p.worker(0).state.name(), "idle");
        assert_eq!(p.worker(0).consecutive_failures, 0);
    }

    #[test]
    fn stale_generations_are_ignored() {
        let t = Instant::now();
        let mut p = pool();
        p.opened(0, 1);
        p.failed(0, 1, "hang".into(), t);
        p.restart(0);
        assert!(!p.released(0, 1), "the old incarnation's release is stale");
        assert!(p.failed(0, 1, "late".into(), t).is_none());
        assert!(!p.opened(0, 1));
        assert!(p.opened(0, 2));
    }

    #[test]
    fn a_lent_worker_keeps_its_entry_across_grants_and_reads_as_a_configured_one() {
        let t = Instant::now();
        let mut p = PoolState::new([]);
        let (id, g1) = p.lend("n1/w", "node n1".into(), "n1".into(), Mode::Audio, 7);
        assert_eq!((p.worker(id).state.name(), g1, p.worker(id).lent), ("starting", 1, Some(7)));
        assert!(p.opened(id, g1));
        p.assigned(id, "c1".into(), Mode::Audio, t);
        p.resetting(id, g1);
        assert!(p.released(id, g1));
        assert_eq!((p.worker(id).state.name(), p.worker(id).sessions_served, p.worker(id).lent), ("idle", 1, None));
        // The next grant of the same worker: the same entry, a new generation, still idle.
        let (again, g2) = p.lend("n1/w", "node n1".into(), "n1".into(), Mode::Chat, 8);
        assert_eq!((again, g2, p.worker(id).state.name()), (id, 2, "idle"));
        assert_eq!(p.worker(id).modes, [Mode::Audio, Mode::Chat]);
        // It dies mid-session: failed, as a configured worker would be; its next grant starts it.
        p.opened(id, g2);
        p.assigned(id, "c2".into(), Mode::Chat, t);
        assert!(p.failed(id, g2, "killed by signal 9".into(), t).is_some());
        assert_eq!(p.worker(id).state.name(), "failed");
        let (_, g3) = p.lend("n1/w", "node n1".into(), "n1".into(), Mode::Chat, 9);
        assert_eq!(p.worker(id).state.name(), "starting");
        // Refused by its node (the grant was stale): its node's again.
        assert!(p.lend_failed(id, g3));
        assert_eq!((p.worker(id).state.name(), p.worker(id).lent), ("idle", None));
        assert!(!p.lend_failed(id, g2), "stale");
        assert_eq!(p.workers().len(), 1);
    }
}
