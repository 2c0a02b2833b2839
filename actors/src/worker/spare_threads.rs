//! OS threads kept for the next backend, so that a worker's threads start without a spawn.
//!
//! A backend instance whose calls take time has two threads of its own for as long as it is open
//! ([`crate::worker::thread`]; quick ones have none). A cluster's replica opens a BackendActor per
//! grant, so each hand-over
//! started two threads: 0.2 ms at the median and up to 2 to 4 ms on a busy 2-CPU host
//! (docs/performance.md, "Replicas on Redis"). A thread whose work ended waits here
//! [`KEEP_IDLE`] for the next, and is handed it through a channel instead.
//!
//! Not a general-purpose blocking pool (tokio's `spawn_blocking`, the `blocking` crate): those
//! cap their threads (512, 500) and queue work beyond, while a backend's thread lives as long
//! as its worker does, minutes to days. Here nothing is capped or queued: a job without a
//! spare thread gets a new one; the number of threads is bounded by the workers.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

/// How long a thread whose work ended waits for the next before it exits.
pub(super) const KEEP_IDLE: Duration = Duration::from_secs(30);
/// At most this many threads wait (the rest exit at once).
pub(super) const MAX_SPARE: usize = 64;
/// Every thread's stack: a backend's calls (the C ABI, a child's pipe) run on it.
const STACK_BYTES: usize = 1 << 20;

type Task = Box<dyn FnOnce() + Send>;

struct Spare {
    id: u64,
    tasks: mpsc::Sender<Task>,
}

#[derive(Default)]
struct Waiting {
    spares: Vec<Spare>,
    next_id: u64,
    /// The most that ever waited at once.
    most: usize,
}

/// Threads waiting for work. The process has one ([`run`]); tests have their own.
pub(super) struct SpareThreads {
    waiting: Mutex<Waiting>,
    /// Told whenever the spares change (what a test of them waits on).
    changed: Condvar,
    keep_idle: Duration,
    max_spare: usize,
}

impl Default for SpareThreads {
    fn default() -> Self {
        SpareThreads::new(KEEP_IDLE, MAX_SPARE)
    }
}

static SPARES: LazyLock<Arc<SpareThreads>> = LazyLock::new(Arc::default);

/// Runs `task` on a thread of its own, from the process's spares ([`SpareThreads::run`]).
pub(super) fn run(name: &str, task: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    SpareThreads::run(&SPARES, name, task)
}

impl SpareThreads {
    /// Threads wait `keep_idle` for work, at most `max_spare` of them.
    pub(super) fn new(keep_idle: Duration, max_spare: usize) -> SpareThreads {
        SpareThreads { waiting: Mutex::default(), changed: Condvar::new(), keep_idle, max_spare }
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `task` on a thread of its own: one that waits for work if there is one, else a
    /// new one (named `name`). The task may run for as long as it likes; a panic in it ends
    /// the task, not the thread.
    pub(super) fn run(this: &Arc<Self>, name: &str, task: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let mut task: Task = Box::new(task);
        {
            let mut waiting = this.lock();
            // The newest first: its stack is warm. A spare is taken and told under the lock, so
            // one that gave up waiting meanwhile (and takes the lock to leave) still finds it.
            while let Some(spare) = waiting.spares.pop() {
                this.changed.notify_all();
                match spare.tasks.send(task) {
                    Ok(()) => return Ok(()),
                    Err(mpsc::SendError(t)) => task = t,
                }
            }
        }
        let (tx, rx) = mpsc::channel();
        let _ = tx.send(task);
        let this = this.clone();
        thread::Builder::new().name(name.to_string()).stack_size(STACK_BYTES).spawn(move || this.serve(tx, rx))?;
        Ok(())
    }

    #[cfg(test)]
    /// How many threads wait for work now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().spares.len()
    }

    #[cfg(test)]
    /// The most threads that ever waited at once.
    pub(crate) fn most_waiting(&self) -> usize {
        self.lock().most
    }

    #[cfg(test)]
    /// Waits up to `within` until `n` threads wait for work; answers how many do then.
    pub(crate) fn wait_for(&self, n: usize, within: Duration) -> usize {
        let waiting = self.lock();
        let (waiting, _) = self
            .changed
            .wait_timeout_while(waiting, within, |w| w.spares.len() != n)
            .unwrap_or_else(|p| p.into_inner());
        waiting.spares.len()
    }

    /// A thread's life: its tasks one after another, waiting `keep_idle` for each after the
    /// first.
    fn serve(&self, tx: mpsc::Sender<Task>, rx: mpsc::Receiver<Task>) {
        let Ok(mut task) = rx.recv() else { return };
        loop {
            if catch_unwind(AssertUnwindSafe(task)).is_err() {
                log::error!("a backend thread's task panicked; the thread goes on");
            }
            let id = {
                let mut waiting = self.lock();
                if waiting.spares.len() >= self.max_spare {
                    return;
                }
                waiting.next_id += 1;
                let id = waiting.next_id;
                waiting.spares.push(Spare { id, tasks: tx.clone() });
                waiting.most = waiting.most.max(waiting.spares.len());
                self.changed.notify_all();
                id
            };
            task = match rx.recv_timeout(self.keep_idle) {
                Ok(next) => next,
                Err(_) => match self.leave(id, &rx) {
                    Some(next) => next,
                    None => return,
                },
            };
        }
    }

    /// A thread gave up waiting: it leaves the spares, unless it was handed a task meanwhile
    /// (taken off the list by `run`, which sent the task under the lock: it is in `rx`).
    fn leave(&self, id: u64, rx: &mpsc::Receiver<Task>) -> Option<Task> {
        let mut waiting = self.lock();
        if let Some(at) = waiting.spares.iter().position(|s| s.id == id) {
            waiting.spares.remove(at);
            self.changed.notify_all();
            return None;
        }
        rx.try_recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::thread::ThreadId;

    const WAIT: Duration = Duration::from_secs(5);

    fn id_of_task(pool: &Arc<SpareThreads>) -> ThreadId {
        let (tx, rx) = channel();
        SpareThreads::run(pool, "spare-test", move || tx.send(thread::current().id()).unwrap()).unwrap();
        rx.recv_timeout(WAIT).unwrap()
    }

    fn until_waiting(pool: &SpareThreads, n: usize) {
        assert_eq!(pool.wait_for(n, WAIT), n);
    }

    #[test]
    fn a_thread_whose_task_ended_takes_the_next() {
        let pool = Arc::new(SpareThreads::default());
        assert_eq!(pool.waiting(), 0);
        let first = id_of_task(&pool);
        until_waiting(&pool, 1);
        assert_eq!(id_of_task(&pool), first);
        until_waiting(&pool, 1);
    }

    #[test]
    fn tasks_at_once_get_threads_of_their_own_and_a_panic_spares_the_thread() {
        let pool = Arc::new(SpareThreads::default());
        let (release_tx, release_rx) = channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let (ids_tx, ids_rx) = channel();
        for _ in 0..3 {
            let (ids_tx, release_rx) = (ids_tx.clone(), release_rx.clone());
            SpareThreads::run(&pool, "spare-test", move || {
                ids_tx.send(thread::current().id()).unwrap();
                // Held until released: the three run at once.
                let _ = release_rx.lock().unwrap().recv();
            })
            .unwrap();
        }
        let ids: std::collections::HashSet<_> = (0..3).map(|_| ids_rx.recv_timeout(WAIT).unwrap()).collect();
        assert_eq!(ids.len(), 3, "no task waited for another's thread");
        assert_eq!(pool.waiting(), 0);
        for _ in 0..3 {
            release_tx.send(()).unwrap();
        }
        until_waiting(&pool, 3);
        let (tx, rx) = channel();
        SpareThreads::run(&pool, "spare-test", move || {
            tx.send(thread::current().id()).unwrap();
            panic!("a backend's bug");
        })
        .unwrap();
        assert!(ids.contains(&rx.recv_timeout(WAIT).unwrap()), "a spare ran it");
        // The thread that ran the panicking task came back for more.
        until_waiting(&pool, 3);
        assert!(ids.contains(&id_of_task(&pool)));
    }

    #[test]
    fn an_idle_thread_leaves_after_keep_idle_and_no_more_than_max_spare_wait() {
        let pool = Arc::new(SpareThreads::new(Duration::from_millis(30), 1));
        let (release_tx, release_rx) = channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let (started_tx, started_rx) = channel();
        for _ in 0..2 {
            let (started_tx, release_rx) = (started_tx.clone(), release_rx.clone());
            SpareThreads::run(&pool, "spare-test", move || {
                started_tx.send(()).unwrap();
                let _ = release_rx.lock().unwrap().recv();
            })
            .unwrap();
        }
        for _ in 0..2 {
            started_rx.recv_timeout(WAIT).unwrap();
        }
        release_tx.send(()).unwrap();
        release_tx.send(()).unwrap();
        // One of the two waits (max_spare is 1: the other exits), then leaves after keep_idle.
        until_waiting(&pool, 1);
        until_waiting(&pool, 0);
        assert_eq!(pool.most_waiting(), 1, "never two: max_spare is 1");
        // And the pool still runs work, on a new thread.
        let _ = id_of_task(&pool);
    }
}
