//! One health poll for every MiniCPM-o worker of the process: a thread that asks each idle
//! worker's `/health` at its interval and tells its BackendActor (once) when it went offline or
//! into error. A worker link used to have a thread of its own for this, and a kept-alive HTTP
//! connection with its buffers; now it has an entry in a list, and a connection only while it is
//! asked.
//!
//! The workers due at one time are asked by up to [`AT_ONCE`] short-lived threads, each taking
//! the next worker as soon as it is done with one: a worker that does not answer (for up to its
//! `connect_timeout_s`) holds up one of them, not the others' polls. Should no thread start, the
//! poll asks them itself, one after another; a poll that panics keeps its worker's watch.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// Told once, when the worker is found offline or in error.
    pub death: Mutex<Option<oneshot::Sender<String>>>,
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
        let alive: Vec<AtomicBool> = due.iter().map(|_| AtomicBool::new(true)).collect();
        let next = AtomicUsize::new(0);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(d) = due.get(i) else { return };
                if let Ok(false) = catch_unwind(AssertUnwindSafe(|| ask(&d.watch))) {
                    alive[i].store(false, Ordering::Relaxed);
                }
            }
        };
        thread::scope(|s| {
            let started = (0..AT_ONCE.min(due.len()))
                .filter(|_| thread::Builder::new().name("minicpmo-health-ask".into()).spawn_scoped(s, work).is_ok())
                .count();
            if started == 0 {
                work();
            }
        });
        let mut watches = p.watches.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        watches.extend(
            due.into_iter()
                .zip(alive)
                .filter(|(_, alive)| alive.load(Ordering::Relaxed))
                .map(|(d, _)| Due { at: now + d.watch.interval, watch: d.watch }),
        );
    }
}

/// Asks one worker: whether its watch goes on (false once its death was told).
fn ask(watch: &Watch) -> bool {
    let Some(control) = watch.control.upgrade() else { return true }; // pruned at the next round
    if control.active.load(Ordering::Relaxed) {
        return true; // a session runs: the worker's own answers tell its health
    }
    match health(&agent(watch.timeout), &watch.name, &watch.url) {
        // Busy: someone else's job on it, not ours to take now, but not broken.
        Health::Healthy | Health::Not("busy", _) => true,
        // A session began meanwhile: it will tell.
        Health::Not(..) if control.active.load(Ordering::Relaxed) => true,
        Health::Not(_, why) => {
            if let Some(death) = watch.death.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = death.send(why);
            }
            false
        }
    }
}
