//! The dedicated OS threads of one backend instance.
//!
//! [`WorkerThread`] owns the backend: it is opened on this thread, every owner-thread call
//! runs here as a job, and the backend is closed here when the last job sender goes away.
//! Model work never runs on the async executor.
//!
//! [`ControlThread`] makes the any-thread calls (interrupt, force-listen, terminate): the
//! actors only post them. A backend whose interrupt blocks then stalls that thread alone,
//! never the arbiter that hosts the queue, the pool and every worker's actor.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use crate::backend::{Backend, BackendControl, BackendError};
use crate::domain::BackendInfo;

/// Opens a backend instance. Called on the worker thread, which becomes its owner.
pub type BackendFactory = Arc<dyn Fn() -> Result<Box<dyn Backend>, BackendError> + Send + Sync>;

/// Work for the owner thread.
pub type Job = Box<dyn FnOnce(&mut dyn Backend) + Send>;

struct ExitSignal(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for ExitSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// What the thread reports once the backend is open (or failed to open).
pub type Opened = Result<(BackendInfo, Arc<dyn BackendControl>), BackendError>;

const STACK_BYTES: usize = 1 << 20;

/// A handle to a worker thread. Dropping it lets the thread finish its queued jobs,
/// close the backend and exit; nothing ever waits for (joins) the thread.
pub struct WorkerThread {
    jobs: mpsc::Sender<Job>,
    exited: tokio::sync::oneshot::Receiver<()>,
}

impl WorkerThread {
    /// Starts the thread; `on_open` is called on it once the backend is open or failed.
    pub fn spawn(
        name: &str,
        factory: BackendFactory,
        on_open: impl FnOnce(Opened) + Send + 'static,
    ) -> std::io::Result<WorkerThread> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (exit_tx, exited) = tokio::sync::oneshot::channel();
        let thread_name = format!("backend-{name}");
        let log_name = name.to_string();
        thread::Builder::new().name(thread_name).stack_size(STACK_BYTES).spawn(move || {
            // Told when the thread is done, whichever way it ends.
            let _exit = ExitSignal(Some(exit_tx));
            let opened = catch_unwind(AssertUnwindSafe(|| factory()))
                .unwrap_or_else(|_| Err(BackendError::Internal("the backend panicked while opening".into())));
            let mut backend = match opened {
                Ok(backend) => {
                    on_open(Ok((backend.info().clone(), backend.control())));
                    backend
                }
                Err(e) => {
                    on_open(Err(e));
                    return;
                }
            };
            while let Ok(job) = rx.recv() {
                if catch_unwind(AssertUnwindSafe(|| job(backend.as_mut()))).is_err() {
                    log::error!("worker {log_name}: a job panicked; closing the backend");
                    return;
                }
            }
            drop(backend);
            log::debug!("worker {log_name}: thread exits, backend closed");
        })?;
        Ok(WorkerThread { jobs, exited })
    }

    /// Lets the thread finish its queued jobs, close the backend and exit; the receiver
    /// resolves once it has (or never, for a thread stuck in a backend call).
    pub fn stop(self) -> tokio::sync::oneshot::Receiver<()> {
        self.exited
    }

    /// Starts the thread and waits until the backend is open. For tools and tests;
    /// actors use [`WorkerThread::spawn`] and get told.
    pub fn spawn_and_wait(
        name: &str,
        factory: BackendFactory,
    ) -> Result<(WorkerThread, BackendInfo, Arc<dyn BackendControl>), BackendError> {
        let (tx, rx) = mpsc::channel();
        let worker = WorkerThread::spawn(name, factory, move |opened| {
            let _ = tx.send(opened);
        })
        .map_err(|e| BackendError::Open(format!("cannot start the worker thread: {e}")))?;
        let (info, control) =
            rx.recv().map_err(|_| BackendError::Internal("the worker thread ended while opening".into()))??;
        Ok((worker, info, control))
    }

    /// Queues a job. Fails when the thread has ended (open failed, or a job panicked).
    pub fn submit(&self, job: Job) -> Result<(), BackendError> {
        self.jobs.send(job).map_err(|_| BackendError::Internal("the worker thread has ended".into()))
    }

    /// Runs `f` on the owner thread and waits for its result. For tools and tests.
    pub fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Backend) -> T + Send + 'static,
    ) -> Result<T, BackendError> {
        let (tx, rx) = mpsc::channel();
        self.submit(Box::new(move |b| {
            let _ = tx.send(f(b));
        }))?;
        rx.recv().map_err(|_| BackendError::Internal("the worker thread dropped the job".into()))
    }
}

/// An any-thread call, posted to the control thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ControlCall {
    Interrupt,
    ForceListen(bool),
    Terminate,
}

/// Calls posted and not yet made beyond this are dropped (a control thread stuck in a
/// backend call must not make its queue grow without bound).
const CONTROL_BACKLOG: usize = 64;

/// Posts a backend's any-thread calls to a thread of their own; never blocks the caller.
pub struct ControlThread {
    calls: mpsc::SyncSender<ControlCall>,
    name: Arc<str>,
}

impl ControlThread {
    pub fn spawn(name: &str, control: Arc<dyn BackendControl>) -> std::io::Result<ControlThread> {
        let (calls, rx) = mpsc::sync_channel::<ControlCall>(CONTROL_BACKLOG);
        let log_name = name.to_string();
        thread::Builder::new().name(format!("control-{name}")).stack_size(256 << 10).spawn(move || {
            for call in rx {
                let made = catch_unwind(AssertUnwindSafe(|| match call {
                    ControlCall::Interrupt => control.interrupt(),
                    ControlCall::ForceListen(on) => control.set_force_listen(on),
                    ControlCall::Terminate => control.terminate(),
                }));
                if made.is_err() {
                    log::error!("worker {log_name}: the backend panicked in {call:?}");
                }
            }
        })?;
        Ok(ControlThread { calls, name: name.into() })
    }

    fn post(&self, call: ControlCall) {
        if let Err(mpsc::TrySendError::Full(_)) = self.calls.try_send(call) {
            log::warn!("worker {}: its backend is not taking any-thread calls; {call:?} dropped", self.name);
        }
    }

    /// Cuts the call in flight short.
    pub fn interrupt(&self) {
        self.post(ControlCall::Interrupt);
    }

    /// Ends the current speech; the next duplex step listens.
    pub fn set_force_listen(&self, on: bool) {
        self.post(ControlCall::ForceListen(on));
    }

    /// Ends the backend at once (a child process is killed).
    pub fn terminate(&self) {
        self.post(ControlCall::Terminate);
    }
}
