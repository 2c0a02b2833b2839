//! What one connection may send, as plain structs tested without a runtime.
//!
//! - [`MessageRate`]: a token bucket of messages per second. A message over the rate is
//!   dropped unprocessed; the client hears one `rate_limited` error a second at most (with
//!   the count), and a client over the rate for `abuse_after` on end is disconnected.
//! - [`FragmentBudget`]: the bytes every connection's unfinished fragmented messages may
//!   hold together, and [`Fragments`], one connection's unfinished message: it must be
//!   finished within a deadline from its first frame, whatever pings come meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix_web::web::Bytes;

/// The rate a connection may send messages at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Messages per second, sustained.
    pub per_second: f64,
    /// Messages sent at once beyond the rate.
    pub burst: f64,
    /// Over the rate for this long without a break: the connection is closed.
    pub abuse_after: Duration,
}

/// What to do with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    Take,
    /// Drop it; tell the client that `dropped` messages were dropped since the last word.
    DropAndTell {
        dropped: u64,
    },
    /// Drop it silently (the client was told less than a second ago).
    Drop,
    /// The client has been over the rate too long: close the connection.
    Close,
}

#[derive(Debug)]
pub struct MessageRate {
    limit: RateLimit,
    tokens: f64,
    last: Instant,
    /// Since when the client is over the rate, without a second under it.
    over_since: Option<Instant>,
    /// Last over-the-rate message, to tell a break.
    last_over: Option<Instant>,
    told_at: Option<Instant>,
    untold: u64,
}

impl MessageRate {
    pub fn new(limit: RateLimit, now: Instant) -> MessageRate {
        MessageRate {
            limit,
            tokens: limit.burst.max(1.0),
            last: now,
            over_since: None,
            last_over: None,
            told_at: None,
            untold: 0,
        }
    }

    /// A message arrives.
    pub fn message(&mut self, now: Instant) -> Intake {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.limit.per_second).min(self.limit.burst.max(1.0));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            // A second without going over ends an episode of abuse.
            if self.last_over.is_some_and(|t| now.saturating_duration_since(t) >= Duration::from_secs(1)) {
                self.over_since = None;
            }
            return Intake::Take;
        }
        let since = *self.over_since.get_or_insert(now);
        self.last_over = Some(now);
        if now.saturating_duration_since(since) >= self.limit.abuse_after {
            return Intake::Close;
        }
        self.untold += 1;
        if self.told_at.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1)) {
            self.told_at = Some(now);
            Intake::DropAndTell { dropped: std::mem::take(&mut self.untold) }
        } else {
            Intake::Drop
        }
    }
}

/// What an edge does with a message under the rate ([`MessageRate::admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    Process,
    /// Drop it unprocessed.
    Drop,
    /// Drop it, and hand the session this error for the client.
    Tell(omni_actors::protocol::ProtocolError),
    /// End the connection: over the rate too long.
    End,
}

impl MessageRate {
    /// [`MessageRate::message`] as an edge acts on it: what is refused counted
    /// (`omni_rate_limited_total`), with the words the client hears.
    pub fn admit(&mut self, now: Instant) -> Admit {
        let verdict = self.message(now);
        if verdict != Intake::Take {
            omni_actors::observe::metrics::metrics().rate_limited.inc();
        }
        match verdict {
            Intake::Take => Admit::Process,
            Intake::Drop => Admit::Drop,
            Intake::DropAndTell { dropped } => Admit::Tell(omni_actors::protocol::ProtocolError::RateLimited(format!(
                "{dropped} message(s) dropped unprocessed: more than {} a second (server.max_messages_per_s)",
                self.limit.per_second
            ))),
            Intake::Close => Admit::End,
        }
    }

    /// For an edge whose peer is told nothing of a dropped message (a phone line's, an app's
    /// socket on a call): `Some(true)` to process it, `Some(false)` to drop it, `None` to end
    /// the connection. No rate: always processed.
    pub fn passes(rate: &mut Option<MessageRate>, now: Instant) -> Option<bool> {
        match rate.as_mut().map(|r| r.admit(now)) {
            None | Some(Admit::Process) => Some(true),
            Some(Admit::Drop) | Some(Admit::Tell(_)) => Some(false),
            Some(Admit::End) => None,
        }
    }
}

/// Bytes held by every connection's unfinished fragmented messages, and the bound.
#[derive(Debug)]
pub struct FragmentBudget {
    held: AtomicUsize,
    max: usize,
}

impl FragmentBudget {
    pub fn new(max: usize) -> Arc<FragmentBudget> {
        Arc::new(FragmentBudget { held: AtomicUsize::new(0), max })
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn take(&self, bytes: usize) -> bool {
        let held = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if held > self.max {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn give(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Why a fragment was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragmentRefusal {
    /// The message would exceed the largest message allowed.
    TooBig,
    /// Every connection's unfinished messages together are at their bound.
    BudgetFull,
    /// A continuation with no message started.
    NotStarted,
}

/// What a frame of a fragmented message came to ([`Fragments::take`]).
#[derive(Debug, PartialEq)]
pub enum Fragment {
    /// More is to come.
    Pending,
    /// The message, whole.
    Whole(bytestring::ByteString),
    /// The connection ends with it.
    Violation(omni_actors::protocol::Violation),
}

/// One connection's unfinished fragmented message. Its bytes count against the budget
/// until it is finished or dropped.
pub struct Fragments {
    budget: Arc<FragmentBudget>,
    max_message: usize,
    timeout: Duration,
    /// The frames received, as received (no copy until the message is whole), and their length.
    parts: Option<(Vec<Bytes>, usize)>,
    started: Option<Instant>,
}

impl Fragments {
    pub fn new(budget: Arc<FragmentBudget>, max_message: usize, timeout: Duration) -> Fragments {
        Fragments { budget, max_message, timeout, parts: None, started: None }
    }

    /// The first frame of a fragmented message.
    pub fn first(&mut self, data: Bytes, now: Instant) -> Result<(), FragmentRefusal> {
        self.clear();
        self.parts = Some((Vec::new(), 0));
        self.started = Some(now);
        self.append(data)
    }

    /// A continuation frame.
    pub fn append(&mut self, data: Bytes) -> Result<(), FragmentRefusal> {
        let Some((parts, len)) = self.parts.as_mut() else { return Err(FragmentRefusal::NotStarted) };
        if *len + data.len() > self.max_message {
            return Err(FragmentRefusal::TooBig);
        }
        if !self.budget.take(data.len()) {
            return Err(FragmentRefusal::BudgetFull);
        }
        *len += data.len();
        parts.push(data);
        Ok(())
    }

    /// The last frame: the whole message (its bytes leave the budget).
    pub fn finish(&mut self, data: Bytes) -> Result<Vec<u8>, FragmentRefusal> {
        self.append(data)?;
        let (parts, len) = self.parts.take().unwrap_or_default();
        let mut message = Vec::with_capacity(len);
        for part in parts {
            message.extend_from_slice(&part);
        }
        self.budget.give(len);
        self.started = None;
        Ok(message)
    }

    /// Whether a message has been unfinished for longer than the timeout.
    pub fn overdue(&self, now: Instant) -> bool {
        self.started.is_some_and(|t| now.saturating_duration_since(t) > self.timeout)
    }

    /// A frame of a fragmented message as a WebSocket edge reads it (the rate of a message's
    /// first frame is the edge's to judge first): nothing yet, the whole message as text, or
    /// the violation that ends the connection.
    pub fn take(&mut self, item: actix_http::ws::Item, now: Instant) -> Fragment {
        use actix_http::ws::Item;
        use omni_actors::protocol::Violation;
        let refused = |e: FragmentRefusal| match e {
            FragmentRefusal::TooBig => Violation::MessageTooBig,
            FragmentRefusal::BudgetFull => Violation::FragmentsFull,
            FragmentRefusal::NotStarted => Violation::InvalidFrame,
        };
        let done = match item {
            Item::FirstText(data) => self.first(data, now),
            Item::FirstBinary(_) => return Fragment::Violation(Violation::BinaryFrame),
            Item::Continue(data) => self.append(data),
            Item::Last(data) => {
                return match self.finish(data) {
                    Ok(bytes) => {
                        omni_actors::observe::metrics::metrics().bytes_received.inc_by(bytes.len() as u64);
                        match bytestring::ByteString::try_from(Bytes::from(bytes)) {
                            Ok(text) => Fragment::Whole(text),
                            Err(_) => Fragment::Violation(Violation::InvalidUtf8),
                        }
                    }
                    Err(e) => Fragment::Violation(refused(e)),
                };
            }
        };
        match done {
            Ok(()) => Fragment::Pending,
            Err(e) => Fragment::Violation(refused(e)),
        }
    }

    /// Drops the unfinished message, if any.
    pub fn clear(&mut self) {
        if let Some((_, len)) = self.parts.take() {
            self.budget.give(len);
        }
        self.started = None;
    }
}

impl Drop for Fragments {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: RateLimit = RateLimit { per_second: 10.0, burst: 20.0, abuse_after: Duration::from_secs(5) };

    #[test]
    fn a_burst_is_taken_then_the_rate_holds() {
        let t = Instant::now();
        let mut r = MessageRate::new(LIMIT, t);
        assert!((0..20).all(|_| r.message(t) == Intake::Take), "the burst");
        assert_eq!(r.message(t), Intake::DropAndTell { dropped: 1 });
        assert_eq!(r.message(t), Intake::Drop, "told at most once a second");
        // 10 a second are taken, sustained.
        let taken = (1..=100).filter(|i| r.message(t + Duration::from_millis(i * 100)) == Intake::Take).count();
        assert!(taken >= 95, "{taken}");
    }

    #[test]
    fn the_count_of_drops_comes_with_the_next_word() {
        let t = Instant::now();
        let mut r = MessageRate::new(RateLimit { burst: 1.0, ..LIMIT }, t);
        assert_eq!(r.message(t), Intake::Take);
        assert_eq!(r.message(t), Intake::DropAndTell { dropped: 1 });
        for _ in 0..4 {
            assert_eq!(r.message(t), Intake::Drop);
        }
        let later = t + Duration::from_millis(1001);
        assert_eq!(r.message(later), Intake::Take, "a token came back");
        assert_eq!(r.message(later), Intake::DropAndTell { dropped: 5 });
    }

    #[test]
    fn persistent_abuse_closes_and_a_break_forgives() {
        let t = Instant::now();
        let mut r = MessageRate::new(LIMIT, t);
        let mut at = t;
        let mut verdict = Intake::Take;
        // 1,000 a second: over the rate all the time.
        while at < t + Duration::from_secs(6) {
            verdict = r.message(at);
            if verdict == Intake::Close {
                break;
            }
            at += Duration::from_millis(1);
        }
        assert_eq!(verdict, Intake::Close);
        assert!(at >= t + Duration::from_secs(5), "not before abuse_after");
        // A client over the rate now and then, with quiet seconds between, is never closed.
        let mut r = MessageRate::new(LIMIT, t);
        for burst in 0..20u64 {
            let start = t + Duration::from_secs(3 * burst);
            for i in 0..40 {
                assert_ne!(r.message(start + Duration::from_millis(i)), Intake::Close, "burst {burst}");
            }
        }
    }

    #[test]
    fn fragments_are_bounded_per_message_and_together_and_time_out() {
        let budget = FragmentBudget::new(100);
        let t = Instant::now();
        let mut a = Fragments::new(budget.clone(), 80, Duration::from_secs(10));
        let mut b = Fragments::new(budget.clone(), 80, Duration::from_secs(10));
        a.first(Bytes::from(vec![1; 60]), t).unwrap();
        assert_eq!(b.first(Bytes::from(vec![2; 50]), t), Err(FragmentRefusal::BudgetFull), "together at most 100");
        assert_eq!(a.append(Bytes::from(vec![1; 30])), Err(FragmentRefusal::TooBig), "one message at most 80");
        assert_eq!(a.finish(Bytes::from(vec![1; 10])).unwrap().len(), 70);
        assert_eq!(budget.held(), 0, "a finished message leaves the budget");
        b.first(Bytes::from(vec![2; 50]), t).unwrap();
        assert!(!b.overdue(t + Duration::from_secs(10)));
        assert!(b.overdue(t + Duration::from_secs(11)), "unfinished past the timeout");
        drop(b);
        assert_eq!(budget.held(), 0, "a dropped connection gives its bytes back");
        assert_eq!(
            Fragments::new(budget, 80, Duration::from_secs(1)).append(Bytes::from_static(&[0])),
            Err(FragmentRefusal::NotStarted)
        );
    }
}
