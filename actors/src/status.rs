//! What every role shows of its workers, in one vocabulary: a worker's state as one word
//! ([`WorkerStatus`], with a conversion from each place a state is kept: a pool's worker, a
//! cluster store's slot, a node's report), a row per worker with the same fields whatever the
//! role ([`WorkerRow`]), and the question a role's status port answers ([`StatusQuery`]).
//! The HTTP routes ask it and have no role of their own to tell apart.

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::domain::Mode;
use crate::edge::coordinator::SlotState;

/// A worker's state, as `/status`, the console and the logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    /// Its backend is opening (or opening again after a failure at work).
    Starting,
    /// Free for the next session.
    Idle,
    /// Granted to a session that has not taken it yet.
    Reserved,
    /// A session holds it.
    Busy,
    /// Its session ended; its backend is being reset before it is offered again.
    Resetting,
    /// Its backend failed or does not open; it is tried again with backoff.
    Failed,
}

impl WorkerStatus {
    /// Every state, for a gauge per state.
    pub const ALL: [WorkerStatus; 6] = [
        WorkerStatus::Starting,
        WorkerStatus::Idle,
        WorkerStatus::Reserved,
        WorkerStatus::Busy,
        WorkerStatus::Resetting,
        WorkerStatus::Failed,
    ];

    /// The word.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerStatus::Starting => "starting",
            WorkerStatus::Idle => "idle",
            WorkerStatus::Reserved => "reserved",
            WorkerStatus::Busy => "busy",
            WorkerStatus::Resetting => "resetting",
            WorkerStatus::Failed => "failed",
        }
    }

    /// Whether a worker in this state can serve (now, or once open).
    pub fn up(self) -> bool {
        !matches!(self, WorkerStatus::Failed | WorkerStatus::Starting)
    }
}

impl From<SlotState> for WorkerStatus {
    /// A cluster store's slot: free is idle, assigned is reserved, down is failed.
    fn from(state: SlotState) -> WorkerStatus {
        match state {
            SlotState::Free => WorkerStatus::Idle,
            SlotState::Assigned => WorkerStatus::Reserved,
            SlotState::Busy => WorkerStatus::Busy,
            SlotState::Down => WorkerStatus::Failed,
        }
    }
}

/// One worker as every role shows it: the same fields on a gateway, a replica and a node
/// (`None` where the role does not know: a replica knows a slot's counters only once it has
/// been lent the worker).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerRow {
    /// Its name (`NODE/WORKER` for a node's).
    pub name: String,
    /// Where its backend comes from (`builtin`, a library path, a node's address).
    pub backend: Option<String>,
    /// The node it runs on; none for the host's own.
    pub node: Option<String>,
    /// The modes it serves.
    pub modes: Vec<Mode>,
    /// Its state.
    pub state: WorkerStatus,
    /// Why it failed, while it is failed.
    pub failure: Option<String>,
    /// The session it serves: its id once it has one (filled from the sessions' registry).
    pub session: Option<String>,
    /// The connection of the session it serves, for the session's own labels.
    #[serde(skip)]
    pub conn: Option<u64>,
    /// The mode of the session it serves.
    pub mode: Option<Mode>,
    /// The session's wire dialect and transport (filled from the sessions' registry).
    pub dialect: Option<&'static str>,
    /// How the session's client reaches the server.
    pub transport: Option<&'static str>,
    /// Seconds the session's client has been away: its connection dropped and the worker is
    /// held for its resume (filled from the sessions' registry).
    pub client_away_s: Option<f64>,
    /// Sessions it has served.
    pub sessions_served: Option<u64>,
    /// Times its backend was started again.
    pub restarts: Option<u64>,
    /// The process its backend runs in, when one of its own.
    pub process_id: Option<u32>,
    /// Its last failure.
    pub last_error: Option<String>,
}

impl WorkerRow {
    /// A row with nothing known but the name, modes and state.
    pub fn new(name: String, modes: Vec<Mode>, state: WorkerStatus) -> WorkerRow {
        WorkerRow {
            name,
            backend: None,
            node: None,
            modes,
            state,
            failure: None,
            session: None,
            conn: None,
            mode: None,
            dialect: None,
            transport: None,
            client_away_s: None,
            sessions_served: None,
            restarts: None,
            process_id: None,
            last_error: None,
        }
    }
}

/// What a replica of a cluster adds to its status: its name and whether it reaches its store.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterStatus {
    /// This replica's name in the store.
    pub replica: String,
    /// It reached the store on its last call.
    pub store_up: bool,
    /// Why it did not, when it did not.
    pub store_error: Option<String>,
}

/// A role's workers as it shows them, and whether it can serve.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerStatus {
    /// Every worker the role serves with: its own, its nodes', a cluster's.
    pub workers: Vec<WorkerRow>,
    /// A replica's part of the cluster.
    pub cluster: Option<ClusterStatus>,
}

impl ServerStatus {
    /// Some worker can serve (or will, once open), and a replica reaches its store.
    pub fn ready(&self) -> bool {
        self.cluster.as_ref().is_none_or(|c| c.store_up) && self.workers.iter().any(|w| w.state != WorkerStatus::Failed)
    }

    /// Whether some worker serves `mode`, and whether one of them is up now.
    pub fn mode(&self, mode: Mode) -> (bool, bool) {
        let of_mode = self.workers.iter().filter(|w| w.modes.contains(&mode));
        let (mut served, mut up) = (false, false);
        for w in of_mode {
            served = true;
            up |= w.state.up();
        }
        (served, up)
    }
}

/// A role's status port: its workers as it shows them.
#[derive(Message)]
#[rtype(result = "ServerStatus")]
pub struct StatusQuery;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_ready_with_a_worker_not_failed_and_its_store_reached() {
        let row = |state| WorkerRow::new("w".into(), vec![Mode::Audio], state);
        let mut s = ServerStatus { workers: vec![row(WorkerStatus::Failed)], cluster: None };
        assert!(!s.ready());
        assert_eq!(s.mode(Mode::Audio), (true, false));
        s.workers.push(row(WorkerStatus::Starting));
        assert!(s.ready(), "a starting worker will serve");
        assert_eq!(s.mode(Mode::Audio), (true, false), "but is not up yet");
        s.workers.push(row(WorkerStatus::Busy));
        assert_eq!((s.mode(Mode::Audio), s.mode(Mode::Chat)), ((true, true), (false, false)));
        s.cluster = Some(ClusterStatus { replica: "g1".into(), store_up: false, store_error: Some("refused".into()) });
        assert!(!s.ready(), "a replica that does not reach its store");
    }

    #[test]
    fn the_words_are_the_serialised_states() {
        for state in WorkerStatus::ALL {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }
}
