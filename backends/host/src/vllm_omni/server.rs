//! What the slots of one vLLM-Omni server share: whether it answers (`GET /health`), and
//! whether it just refused a session for want of a slot. A server that is down takes all its
//! slots out (each fails its next idle check, or its next open, on the shared answer), and
//! they come back together on the first answer that says it is healthy.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use omni_actors::edge::backend::BackendError;
use omni_actors::observe::metrics::metrics;
use parking_lot::Mutex;

/// An answer younger than this is shared instead of asking again.
const FRESH: Duration = Duration::from_secs(1);
/// The longest a server that said it is full is left alone.
const MAX_FULL_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    /// The last answer: `Err` says why it is not usable.
    health: Option<(Instant, Result<(), BackendError>)>,
    /// A slot saw its connection fail: the next check asks, whatever the age of the answer.
    suspect: bool,
    /// It refused a session with `resource_exhausted`: until when it is left alone, and how
    /// many times in a row.
    full_until: Option<Instant>,
    full_count: u32,
}

#[derive(Debug)]
pub(super) struct Server {
    url: String,
    state: Mutex<State>,
}

/// The shared state of the server at `url` (one per base URL in this process).
pub(super) fn of(url: &str) -> Arc<Server> {
    static SERVERS: LazyLock<Mutex<HashMap<String, Arc<Server>>>> = LazyLock::new(Default::default);
    SERVERS
        .lock()
        .entry(url.to_string())
        .or_insert_with(|| Arc::new(Server { url: url.to_string(), state: Mutex::new(State::default()) }))
        .clone()
}

impl Server {
    /// Whether it can take a session now: its `/health` (asked at most once a second for all its
    /// slots, unless a slot saw it fail) and no recent capacity refusal. `worker` names the
    /// slot in the health metric.
    pub(super) fn usable(&self, worker: &str, timeout: Duration) -> Result<(), BackendError> {
        self.healthy(worker, timeout)?;
        match self.full_for() {
            Some(left) => Err(BackendError::Unavailable(format!(
                "{} had no free session slot (resource_exhausted); asked again in {:.1} s",
                self.url,
                left.as_secs_f64()
            ))),
            None => Ok(()),
        }
    }

    /// Its `/health`, shared by its slots.
    pub(super) fn healthy(&self, worker: &str, timeout: Duration) -> Result<(), BackendError> {
        {
            let s = self.state.lock();
            if let (false, Some((at, answer))) = (s.suspect, &s.health)
                && at.elapsed() < FRESH
            {
                return answer.clone();
            }
        }
        let (label, answer) = ask(&self.url, timeout);
        metrics().remote_worker_health.with_label_values(&[worker, label]).inc();
        let mut s = self.state.lock();
        s.suspect = false;
        s.health = Some((Instant::now(), answer.clone()));
        answer
    }

    /// A slot's connection failed: the next check of any slot asks the server.
    pub(super) fn suspect(&self) {
        self.state.lock().suspect = true;
    }

    /// It refused a session for want of a slot: left alone for 1, 2, 4 ... 30 s.
    pub(super) fn full(&self) {
        let mut s = self.state.lock();
        s.full_count = s.full_count.saturating_add(1);
        let backoff = Duration::from_secs(1 << s.full_count.saturating_sub(1).min(5)).min(MAX_FULL_BACKOFF);
        s.full_until = Some(Instant::now() + backoff);
    }

    /// It took a session: the capacity backoff starts afresh.
    pub(super) fn had_room(&self) {
        let mut s = self.state.lock();
        s.full_count = 0;
        s.full_until = None;
    }

    fn full_for(&self) -> Option<Duration> {
        let s = self.state.lock();
        s.full_until.and_then(|until| until.checked_duration_since(Instant::now()))
    }
}

/// `GET URL/health`: 200 is healthy (vLLM-Omni says nothing else of use: no free slots, no
/// warm-up), anything else is not.
fn ask(url: &str, timeout: Duration) -> (&'static str, Result<(), BackendError>) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into();
    match agent.get(&format!("{url}/health")).call() {
        Err(e) => ("offline", Err(BackendError::Unavailable(format!("{url} is offline: {e}")))),
        Ok(r) if r.status() == 200 => ("healthy", Ok(())),
        Ok(mut r) => {
            let status = r.status();
            let body = r.body_mut().read_to_string().unwrap_or_default();
            let body: String = body.chars().take(200).collect();
            ("error", Err(BackendError::Unavailable(format!("{url} is unhealthy ({status}: {body})"))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_server_is_left_alone_longer_each_time_until_it_takes_a_session() {
        let s = of("http://full.invalid:1");
        s.full();
        let first = s.full_for().unwrap();
        assert!(first <= Duration::from_secs(1) && first > Duration::from_millis(900), "{first:?}");
        s.full();
        s.full();
        assert!(s.full_for().unwrap() > Duration::from_secs(3), "4 s after the third refusal");
        for _ in 0..10 {
            s.full();
        }
        assert!(s.full_for().unwrap() <= MAX_FULL_BACKOFF);
        s.had_room();
        assert_eq!(s.full_for(), None);
    }
}
