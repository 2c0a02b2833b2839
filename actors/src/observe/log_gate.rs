//! Log lines a stranger can cause (a refused handshake, a minted secret, a refused call) are
//! written at most once per reason per [`INTERVAL`]: the lines between are counted, and the next
//! one says how many it stands for. Metrics count every one; the log says what happened, not
//! each time it happened, so a flood of strangers cannot fill the disk through it.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One line per reason at most this often.
pub(super) const INTERVAL: Duration = Duration::from_secs(10);

/// When each reason was last written, and the lines held back since, as a plain struct.
#[derive(Debug, Default)]
pub(super) struct LogGate {
    reasons: HashMap<&'static str, (Instant, u64)>,
}

impl LogGate {
    /// Whether a line of `reason` is written now: `Some(n)` with the `n` lines held back since
    /// the last one, or `None` (held back, and counted).
    pub(super) fn admit(&mut self, reason: &'static str, now: Instant) -> Option<u64> {
        match self.reasons.get_mut(reason) {
            Some((last, held)) if now.saturating_duration_since(*last) < INTERVAL => {
                *held += 1;
                None
            }
            Some((last, held)) => {
                *last = now;
                Some(std::mem::take(held))
            }
            None => {
                self.reasons.insert(reason, (now, 0));
                Some(0)
            }
        }
    }
}

/// Whether a line of `reason` is written now (the process's gate): the suffix to end it with
/// (" (and N more like it)" when lines were held back), or `None`.
pub fn gated(reason: &'static str) -> Option<String> {
    static GATE: OnceLock<Mutex<LogGate>> = OnceLock::new();
    let held = GATE.get_or_init(Default::default).lock().admit(reason, Instant::now())?;
    Some(if held == 0 {
        String::new()
    } else {
        format!(" (and {held} more like it in the last {} s)", INTERVAL.as_secs())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_reason_per_interval_and_the_next_counts_the_rest() {
        let mut gate = LogGate::default();
        let t0 = Instant::now();
        assert_eq!(gate.admit("refused", t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(gate.admit("refused", t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(gate.admit("minted", t0), Some(0), "each reason has its own");
        assert_eq!(gate.admit("refused", t0 + INTERVAL), Some(1000));
        assert_eq!(gate.admit("refused", t0 + INTERVAL + Duration::from_millis(1)), None);
    }
}
