//! The edge between the actors and a cluster's shared queue: the store that several gateway
//! replicas share (`[cluster] engine = "redis"`), behind [`Coordinator`]. One process needs
//! none of it: its [`crate::queue_actor::QueueActor`] keeps the queue in memory.
//!
//! The store holds who waits (tickets, in one global order), which node workers ("slots")
//! are free, and grants: a slot reserved for a ticket under a nonce its node issued. A grant
//! is only a reservation: the node admits a session only with the nonce it currently offers
//! the slot under, so a store that loses writes can cost a retry, never two sessions on one
//! worker. [`crate::cluster_queue_actor::ClusterQueueActor`] drives a coordinator.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::domain::Mode;
use crate::queue::{Availability, ModeSet, QueueState, TicketId};

/// The store cannot be reached or answered nonsense.
#[derive(Debug, Clone, Error, PartialEq)]
#[error("the cluster's store: {0}")]
pub struct ClusterError(pub String);

pub type ClusterFuture<T> = Pin<Box<dyn Future<Output = Result<T, ClusterError>> + Send>>;

/// A slot reserved for a ticket: connect to `addr` and attach worker `slot` with `nonce`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub ticket: TicketId,
    /// `NODE/WORKER`.
    pub slot: String,
    pub addr: String,
    pub nonce: String,
    pub mode: Mode,
}

impl Grant {
    /// The worker's name on its node (the part of `slot` after the node's name).
    pub fn worker(&self) -> &str {
        self.slot.split_once('/').map_or(self.slot.as_str(), |(_, w)| w)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    Granted(Grant),
    Waiting {
        ticket: TicketId,
        position: usize,
        length: usize,
    },
    /// `max_waiting` tickets wait already (across the cluster).
    Full {
        length: usize,
    },
    /// No live node has a worker for the mode.
    Unavailable,
    /// The store does not know this replica (yet, or any more): it must beat first.
    UnknownReplica,
}

/// What a beat answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Beat {
    /// False when the store did not know this replica (it was retired after missing its
    /// lease, or the store restarted): every waiting client must be enqueued again.
    pub known: bool,
    /// Tickets of this replica an operator cancelled (on any replica) since the last beat.
    pub cancelled: Vec<TicketId>,
}

/// A ticket as the store has it.
#[derive(Debug, Clone, PartialEq)]
pub struct TicketView {
    pub ticket: TicketId,
    pub mode: Mode,
    pub replica: String,
    /// Granted a slot, not yet claimed (it keeps its place meanwhile).
    pub granted: bool,
}

/// A node's worker as the store has it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotView {
    pub slot: String,
    pub node: String,
    pub modes: Vec<Mode>,
    /// "free", "assigned", "busy" or "down".
    pub state: String,
    /// The busy session's mode and since when (ms, the store's clock).
    pub busy: Option<(Mode, u64)>,
}

/// The whole queue at one instant of the store's clock.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterView {
    /// Bumped on every change.
    pub version: u64,
    pub now_ms: u64,
    /// In queue order.
    pub tickets: Vec<TicketView>,
    pub slots: Vec<SlotView>,
    /// Moving average of session length per mode (chat, video, audio), seconds.
    pub average_s: [Option<f64>; 3],
}

impl ClusterView {
    /// The queue's rules over this view, for ETAs: the waiting tickets (not the granted
    /// ones) and every live slot; `typical` fills averages the store has not learnt yet.
    pub fn queue(&self, typical: [f64; 3], now: Instant) -> QueueState {
        let average = std::array::from_fn(|i| self.average_s[i].unwrap_or(typical[i]));
        let workers: Vec<(ModeSet, Availability)> = self
            .slots
            .iter()
            .map(|s| {
                let state = match (s.state.as_str(), s.busy) {
                    ("free", _) => Availability::Idle,
                    ("busy", Some((mode, since_ms))) => {
                        let ago = std::time::Duration::from_millis(self.now_ms.saturating_sub(since_ms));
                        Availability::Busy { mode, since: now.checked_sub(ago).unwrap_or(now) }
                    }
                    // A grant being taken: a session starts now.
                    ("assigned", _) | ("busy", None) => Availability::Busy { mode: Mode::Audio, since: now },
                    _ => Availability::Failed,
                };
                (ModeSet::of(&s.modes), state)
            })
            .collect();
        let waiting: Vec<(TicketId, Mode)> =
            self.tickets.iter().filter(|t| !t.granted).map(|t| (t.ticket, t.mode)).collect();
        QueueState::observed(&workers, &waiting, average, now)
    }
}

/// A cluster's shared queue, as one replica sees it. Every call is one atomic step in the
/// store (no read-modify-write from the replica).
pub trait Coordinator: Send + Sync + 'static {
    /// This replica's name in the store (and in the nodes' logs).
    fn replica(&self) -> &str;
    /// This replica is alive for one more lease; whoever beats retires replicas and nodes
    /// whose lease ran out.
    fn beat(&self) -> ClusterFuture<Beat>;
    /// A client asks for a worker; `ticket` keeps the place of a client enqueued before.
    fn enqueue(&self, mode: Mode, ticket: Option<TicketId>, max_waiting: usize) -> ClusterFuture<Enqueued>;
    /// The session took its grant (the node admitted it).
    fn claim(&self, ticket: TicketId) -> ClusterFuture<()>;
    /// The client left; answers whether it was waiting.
    fn leave(&self, ticket: TicketId) -> ClusterFuture<bool>;
    /// The node refused the grant (stale nonce): the ticket waits again in its place.
    fn requeue(&self, grant: &Grant) -> ClusterFuture<bool>;
    /// An operator cancels a waiting ticket of any replica.
    fn cancel(&self, ticket: TicketId) -> ClusterFuture<bool>;
    /// The store's version: it changes whenever the queue or a worker does (cheap to read).
    fn version(&self) -> ClusterFuture<u64>;
    fn snapshot(&self) -> ClusterFuture<ClusterView>;
    /// Grants made to this replica's tickets by others (a node freeing a slot): waits up to
    /// `wait` for the first.
    fn grants(&self, wait: std::time::Duration) -> ClusterFuture<Vec<Grant>>;
}

/// What a replica tells a waiting client from a view of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Telling {
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
pub fn telling(
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

    fn slot(state: &str, modes: &[Mode], busy: Option<(Mode, u64)>) -> SlotView {
        SlotView { slot: "n/w".into(), node: "n".into(), modes: modes.to_vec(), state: state.into(), busy }
    }

    fn ticket(ticket: TicketId, mode: Mode, granted: bool) -> TicketView {
        TicketView { ticket, mode, replica: "g".into(), granted }
    }

    #[test]
    fn etas_come_from_the_busy_slots_and_the_averages_of_the_store() {
        // One audio worker busy for 20 s of an average 60 s session; one down.
        let view = ClusterView {
            version: 1,
            now_ms: 100_000,
            tickets: vec![ticket(7, Mode::Audio, true), ticket(8, Mode::Audio, false), ticket(9, Mode::Audio, false)],
            slots: vec![slot("busy", &[Mode::Audio], Some((Mode::Audio, 80_000))), slot("down", &[Mode::Audio], None)],
            average_s: [None, None, Some(60.0)],
        };
        let now = Instant::now();
        let infos = view.queue([10.0, 10.0, 999.0], now).infos_from(0, now);
        // The granted ticket is not waiting for a worker: 8 waits 40 s, 9 a whole session more.
        let etas: Vec<(TicketId, f64)> = infos.iter().map(|i| (i.ticket, i.estimated_wait_s.round())).collect();
        assert_eq!(etas, [(8, 40.0), (9, 100.0)]);
    }

    #[test]
    fn a_grant_names_its_node_and_worker() {
        let g = Grant {
            ticket: 1,
            slot: "gpu1/sim-0".into(),
            addr: "10.0.0.5:7100".into(),
            nonce: "n".into(),
            mode: Mode::Chat,
        };
        assert_eq!(g.worker(), "sim-0");
    }
}
