//! Step threads: one OS thread per core, shared by every backend whose owner-thread calls take
//! microseconds and never wait ([`BackendFactory::quick`]: the built-in reference backend when
//! nothing paces it).
//!
//! A backend with a thread of its own costs that thread a wake-up per chunk, two memory
//! mappings (its stack and the stack's guard) and a futex waiter in the kernel's hash table,
//! which every other wake-up walks: at 2,000 workers the arbiter's `futex_wake` took twice the
//! CPU it took with half the sleeping threads (docs/performance.md, "Scale"). Backends here
//! cost none of that: each is opened on one of these threads, which owns it from then on (the
//! ABI's rule: a handle is owned by the thread that opened it), and a thread that is busy with
//! one backend's step finds the next backend's job queued without being woken.
//!
//! The price is that one backend's call delays the others on its thread, which is why only
//! backends whose every call is quick are placed here; a job that panics closes its backend
//! alone.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, LazyLock};
use std::thread;

use super::thread::{ExitSignal, Job, OpenOnce, Opened};
use crate::edge::backend::{Backend, BackendError};

enum Task {
    Open {
        id: u64,
        name: Arc<str>,
        open: OpenOnce,
        on_open: Box<dyn FnOnce(Opened) + Send>,
        exit: ExitSignal,
        alive: Arc<AtomicBool>,
    },
    Job {
        id: u64,
        job: Job,
    },
    Close {
        id: u64,
    },
}

/// A backend open on a step thread. Fields drop in order: the backend is closed before the
/// exit signal fires.
struct Owned {
    backend: Box<dyn Backend>,
    name: Arc<str>,
    alive: Arc<AtomicBool>,
    _exit: ExitSignal,
}

struct StepThreads {
    threads: Vec<mpsc::Sender<Task>>,
    next_thread: AtomicUsize,
    next_id: AtomicU64,
}

static STEP_THREADS: LazyLock<StepThreads> = LazyLock::new(|| {
    let n = thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (0..n)
        .filter_map(|i| {
            let (tx, rx) = mpsc::channel();
            match thread::Builder::new().name(format!("step-{i}")).spawn(move || serve(rx)) {
                Ok(_) => Some(tx),
                Err(e) => {
                    log::error!("cannot start step thread {i}: {e}");
                    None
                }
            }
        })
        .collect();
    StepThreads { threads, next_thread: AtomicUsize::new(0), next_id: AtomicU64::new(1) }
});

/// How many step threads the process runs (one per core).
pub fn count() -> usize {
    STEP_THREADS.threads.len()
}

/// One backend's place on a step thread: its jobs go there in order; dropped, the backend is
/// closed there after the jobs already queued.
pub struct Slot {
    tx: mpsc::Sender<Task>,
    id: u64,
    alive: Arc<AtomicBool>,
}

impl Slot {
    pub fn submit(&self, job: Job) -> Result<(), BackendError> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(BackendError::Internal("the backend is closed (it failed to open, or a job panicked)".into()));
        }
        self.tx
            .send(Task::Job { id: self.id, job })
            .map_err(|_| BackendError::Internal("the step thread has ended".into()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.tx.send(Task::Close { id: self.id });
    }
}

/// Opens a backend on the next step thread (in turn); `on_open` is called there once it is open
/// or failed, and `exit` fires once it is closed.
pub(super) fn open(
    name: &str,
    open: OpenOnce,
    on_open: Box<dyn FnOnce(Opened) + Send>,
    exit: ExitSignal,
) -> std::io::Result<Slot> {
    let threads = &STEP_THREADS.threads;
    if threads.is_empty() {
        return Err(std::io::Error::other("no step thread could be started"));
    }
    let tx = threads[STEP_THREADS.next_thread.fetch_add(1, Ordering::Relaxed) % threads.len()].clone();
    let id = STEP_THREADS.next_id.fetch_add(1, Ordering::Relaxed);
    let alive = Arc::new(AtomicBool::new(true));
    let task = Task::Open { id, name: name.into(), open, on_open, exit, alive: alive.clone() };
    tx.send(task).map_err(|_| std::io::Error::other("the step thread has ended"))?;
    Ok(Slot { tx, id, alive })
}

fn serve(tasks: mpsc::Receiver<Task>) {
    let mut open: HashMap<u64, Owned> = HashMap::new();
    for task in tasks {
        match task {
            Task::Open { id, name, open: opener, on_open, exit, alive } => {
                let opened = catch_unwind(AssertUnwindSafe(opener))
                    .unwrap_or_else(|_| Err(BackendError::Internal("the backend panicked while opening".into())));
                match opened {
                    Ok(backend) => {
                        on_open(Ok((backend.info().clone(), backend.control())));
                        open.insert(id, Owned { backend, name, alive, _exit: exit });
                    }
                    Err(e) => {
                        alive.store(false, Ordering::Release);
                        on_open(Err(e));
                    }
                }
            }
            Task::Job { id, job } => {
                let Some(owned) = open.get_mut(&id) else { continue };
                if catch_unwind(AssertUnwindSafe(|| job(owned.backend.as_mut()))).is_err() {
                    log::error!("worker {}: a job panicked; closing the backend", owned.name);
                    owned.alive.store(false, Ordering::Release);
                    open.remove(&id);
                }
            }
            Task::Close { id } => {
                if let Some(owned) = open.remove(&id) {
                    owned.alive.store(false, Ordering::Release);
                    log::debug!("worker {}: backend closed on its step thread", owned.name);
                }
            }
        }
    }
}
