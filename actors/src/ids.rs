//! Identifiers. Session ids are unique across the server's lifetime and restarts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A worker's number in its pool (and in a one-process queue: they number workers alike).
pub type WorkerId = usize;
/// A waiting client's ticket: numbered in order by its queue (a cluster's store numbers them
/// by its clock).
pub type TicketId = u64;

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);
static LAST_MS: AtomicU64 = AtomicU64::new(0);

/// A new session id: `sess_` and a random UUID.
pub fn session_id() -> String {
    format!("sess_{}", uuid::Uuid::new_v4().simple())
}

/// A connection number for logs, unique in this process.
pub fn connection() -> u64 {
    CONNECTIONS.fetch_add(1, Ordering::Relaxed)
}

/// Milliseconds since the epoch, strictly increasing across calls in this process, so
/// ids built from it (the legacy `rt_<ms>`) never repeat even within one millisecond.
pub fn unique_millis() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let mut last = LAST_MS.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST_MS.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_millis_never_repeats() {
        let mut seen: Vec<u64> = (0..10_000).map(|_| unique_millis()).collect();
        let n = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), n);
    }

    #[test]
    fn session_ids_differ() {
        assert_ne!(session_id(), session_id());
        assert!(session_id().starts_with("sess_"));
    }
}
