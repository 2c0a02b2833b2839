//! One health poll for every MiniCPM-o worker of the process: a thread that asks each idle
//! worker's `/health` at its interval and tells its BackendActor (once) when it went offline or
//! into error. A worker link used to have a thread of its own for this, and a kept-alive HTTP
//! connection with its buffers; now it has an entry in a list, and a connection only while it is
//! asked.
//!
//! The workers due at one time are asked together, up to [`AT_ONCE`] at a time, each on a
//! short-lived thread, so that one worker that does not answer (up to its `connect_timeout_s`)
//! does not hold up the others' polls for long.

use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Control, Health, agent, health};

/// The most workers asked at the same time.
const AT_ONCE: usize = 16;

/// One worker's poll.
pub(super) struct Watch {
    /// Gone once the backend closed: the watch ends with it.
    pub control: Weak<Control>,
    pub name: String,
    pub url: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub death: oneshot::Sender<String>,
}

struct Due {
    at: Instant,
    watch: Watch,
}

#[derive(Default)]
struct Poller {
    watches: Mutex<Vec<Due>>,
    added: Condvar,
}

fn poller() -> &'static Poller {
    static POLLER: OnceLock<&'static Poller> = OnceLock::new();
    POLLER.get_or_init(|| {
        let p: &'static Poller = Box::leak(Box::default());
        if let Err(e) = thread::Builder::new().name("minicpmo-health".into()).spawn(move || run(p)) {
            log::warn!(
                "no health poll for MiniCPM-o workers ({e}): one that goes offline while idle is noticed at its next session"
            );
        }
        p
    })
}

/// Polls `watch`'s worker every `interval` from now on, while no session runs on it.
pub(super) fn watch(watch: Watch) {
    let p = poller();
    let at = Instant::now() + watch.interval;
    p.watches.lock().unwrap_or_else(|e| e.into_inner()).push(Due { at, watch });
    p.added.notify_one();
}

fn run(p: &Poller) {
    loop {
        let due = {
            let mut watches = p.watches.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                watches.retain(|d| d.watch.control.strong_count() > 0);
                let now = Instant::now();
                if watches.iter().any(|d| d.at <= now) {
                    break;
                }
                let wait = watches.iter().map(|d| d.at - now).min();
                watches = match wait {
                    Some(wait) => p.added.wait_timeout(watches, wait).unwrap_or_else(|e| e.into_inner()).0,
                    None => p.added.wait(watches).unwrap_or_else(|e| e.into_inner()),
                };
            }
            let now = Instant::now();
            let (due, later): (Vec<Due>, Vec<Due>) = watches.drain(..).partition(|d| d.at <= now);
            *watches = later;
            due
        };
        let mut kept = Vec::with_capacity(due.len());
        for batch in chunks(due, AT_ONCE) {
            thread::scope(|s| {
                let asked: Vec<_> = batch.into_iter().map(|d| s.spawn(move || ask(d.watch))).collect();
                kept.extend(asked.into_iter().filter_map(|h| h.join().ok().flatten()));
            });
        }
        let mut watches = p.watches.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        watches.extend(kept.into_iter().map(|watch| Due { at: now + watch.interval, watch }));
    }
}

fn chunks(mut due: Vec<Due>, n: usize) -> Vec<Vec<Due>> {
    let mut out = Vec::new();
    while !due.is_empty() {
        let rest = due.split_off(due.len().min(n));
        out.push(due);
        due = rest;
    }
    out
}

/// Asks one worker; the watch goes on (`Some`) unless its backend closed or its death was told.
fn ask(watch: Watch) -> Option<Watch> {
    let control = watch.control.upgrade()?;
    if control.active.load(Ordering::Relaxed) {
        return Some(watch); // a session runs: the worker's own answers tell its health
    }
    match health(&agent(watch.timeout), &watch.name, &watch.url) {
        // Busy: someone else's job on it, not ours to take now, but not broken.
        Health::Healthy | Health::Not("busy", _) => Some(watch),
        Health::Not(_, why) => {
            if control.active.load(Ordering::Relaxed) {
                return Some(watch); // a session began meanwhile: it will tell
            }
            let _ = watch.death.send(why);
            None
        }
    }
}
