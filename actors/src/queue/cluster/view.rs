//! A view of the cluster's store read in this replica's vocabulary: the workers' rows for
//! `/status`, and the queue's state for ETAs.

use std::time::{Duration, Instant};

use crate::domain::Mode;
use crate::edge::coordinator::{ClusterView, SlotState};
use crate::queue::state::{Availability, ModeSet, QueueState, TicketId};
use crate::status::{WorkerRow, WorkerStatus};

/// Every node's worker as the store has it, in the one vocabulary, with what this replica's
/// pool knows of those it was lent (`lent`, by name: their sessions here, counters, failures).
pub(crate) fn rows(view: &ClusterView, lent: &[WorkerRow]) -> Vec<WorkerRow> {
    view.slots
        .iter()
        .map(|s| {
            let here = lent.iter().find(|w| w.name == s.slot);
            let state = WorkerStatus::from(s.state);
            let mut row = here.cloned().unwrap_or_else(|| WorkerRow::new(s.slot.clone(), Vec::new(), state));
            // The session is this replica's only while the worker is busy with it here.
            if !(state == WorkerStatus::Busy && row.state == WorkerStatus::Busy) {
                row.conn = None;
            }
            row.failure = (state == WorkerStatus::Failed).then(|| {
                here.and_then(|h| h.failure.clone()).unwrap_or_else(|| "its backend is not open on its node".into())
            });
            row.node = Some(s.node.clone());
            row.modes = s.modes.clone();
            row.state = state;
            row.mode = s.busy.map(|(mode, _)| mode);
            row
        })
        .collect()
}

/// The queue's rules over a view of the store, for ETAs: the waiting tickets (not the granted
/// ones) and every live slot; `typical` fills averages the store has not learnt yet.
pub(crate) fn view_queue(view: &ClusterView, typical: [f64; 3], now: Instant) -> QueueState {
    let average = std::array::from_fn(|i| view.average_s[i].unwrap_or(typical[i]));
    let workers: Vec<(ModeSet, Availability)> = view
        .slots
        .iter()
        .map(|s| {
            let state = match (s.state, s.busy) {
                (SlotState::Free, _) => Availability::Idle,
                (SlotState::Busy, Some((mode, since_ms))) => {
                    let ago = Duration::from_millis(view.now_ms.saturating_sub(since_ms));
                    Availability::Busy { mode, since: now.checked_sub(ago).unwrap_or(now) }
                }
                // A grant being taken: a session starts now.
                (SlotState::Assigned, _) | (SlotState::Busy, None) => {
                    Availability::Busy { mode: Mode::Audio, since: now }
                }
                (SlotState::Down, _) => Availability::Failed,
            };
            (ModeSet::of(&s.modes), state)
        })
        .collect();
    let waiting: Vec<(TicketId, Mode)> =
        view.tickets.iter().filter(|t| !t.granted).map(|t| (t.ticket, t.mode)).collect();
    let measured = std::array::from_fn(|i| view.average_s[i].is_some());
    QueueState::observed(&workers, &waiting, average, measured, now)
}
