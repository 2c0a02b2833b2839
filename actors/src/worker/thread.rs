//! The dedicated OS threads of one backend instance.
//!
//! [`WorkerThread`] owns the backend: it is opened on this thread, every owner-thread call
//! runs here as a job, and the backend is closed here when the last job sender goes away.
//! Model work never runs on the async executor.
//!
//! [`ControlThread`] makes the any-thread calls (interrupt, force-listen, terminate): the
//! actors only post them. A backend whose interrupt blocks then stalls that thread alone,
//! never the arbiter that hosts the queue, the pool and every worker's actor. A backend whose
//! calls never block (they queue a frame, or set a flag) has them made at once, with no thread.
//!
//! Both run on threads from [`crate::worker::spare_threads`]: a thread whose backend closed waits
//! for the next one instead of exiting, so a BackendActor starts without spawning any. A backend
//! whose calls are all quick ([`BackendFactory::quick`]) has neither: its BackendActor opens it
//! and makes its calls itself ([`WorkerThread::here`]).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;

use crate::domain::BackendInfo;
use crate::edge::backend::{Backend, BackendControl, BackendError, BackendFactory, OpenBackend};
use crate::worker::spare_threads;

/// Work for the owner thread.
pub(super) type Job = Box<dyn FnOnce(&mut dyn Backend) + Send>;

struct ExitSignal(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for ExitSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// What the thread reports once the backend is open (or failed to open).
pub(super) type Opened = Result<(BackendInfo, Arc<dyn BackendControl>), BackendError>;

/// A handle to a worker thread. Dropping it lets the thread finish its queued jobs,
/// close the backend and exit; nothing ever waits for (joins) the thread.
pub struct WorkerThread {
    jobs: Jobs,
    exited: tokio::sync::oneshot::Receiver<()>,
}

/// Where a worker's jobs go: a thread of its own, or the backend itself, on the caller's thread.
enum Jobs {
    Own(mpsc::Sender<Job>),
    Here(Here),
}

/// A quick backend, owned by the thread that opened it (the BackendActor's arbiter). Fields drop
/// in order: the backend is closed before the exit signal fires.
struct Here {
    backend: Option<Box<dyn Backend>>,
    name: String,
    _exit: ExitSignal,
}

type OpenOnce = Box<dyn FnOnce() -> Result<Box<dyn Backend>, BackendError> + Send>;

impl WorkerThread {
    /// Starts the thread; `on_open` is called on it once the backend is open or failed.
    pub fn spawn(
        name: &str,
        factory: BackendFactory,
        on_open: impl FnOnce(Opened) + Send + 'static,
    ) -> std::io::Result<WorkerThread> {
        WorkerThread::start(name, Box::new(move || factory.open()), on_open)
    }

    /// Opens a quick backend ([`BackendFactory::quick`]) on the calling thread, which owns it
    /// from then on: its jobs run there, inline, when submitted.
    pub fn here(
        name: &str,
        factory: &BackendFactory,
    ) -> Result<(WorkerThread, BackendInfo, Arc<dyn BackendControl>), BackendError> {
        let backend = catch_unwind(AssertUnwindSafe(|| factory.open()))
            .unwrap_or_else(|_| Err(BackendError::Internal("the backend panicked while opening".into())))?;
        let (info, control) = (backend.info().clone(), backend.control());
        let (exit_tx, exited) = tokio::sync::oneshot::channel();
        let here = Here { backend: Some(backend), name: name.to_string(), _exit: ExitSignal(Some(exit_tx)) };
        Ok((WorkerThread { jobs: Jobs::Here(here), exited }, info, control))
    }

    /// Its jobs run inline on the thread that owns it: its backend's any-thread calls are quick
    /// too, and made at once.
    pub fn is_here(&self) -> bool {
        matches!(self.jobs, Jobs::Here(_))
    }

    /// Starts the thread with a backend open already: its info and control are known at once,
    /// without waiting for the thread.
    pub fn adopt(
        name: &str,
        backend: OpenBackend,
    ) -> std::io::Result<(WorkerThread, BackendInfo, Arc<dyn BackendControl>)> {
        let (info, control) = (backend.info().clone(), backend.control());
        let thread = WorkerThread::start(name, Box::new(move || Ok(backend as Box<dyn Backend>)), |_| {})?;
        Ok((thread, info, control))
    }

    fn start(
        name: &str,
        open: OpenOnce,
        on_open: impl FnOnce(Opened) + Send + 'static,
    ) -> std::io::Result<WorkerThread> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (exit_tx, exited) = tokio::sync::oneshot::channel();
        let log_name = name.to_string();
        spare_threads::run("backend", move || {
            // Told when the thread is done, whichever way it ends.
            let _exit = ExitSignal(Some(exit_tx));
            let opened = catch_unwind(AssertUnwindSafe(open))
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
        Ok(WorkerThread { jobs: Jobs::Own(jobs), exited })
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
    /// A quick backend's job runs now, on this thread; a job that panics closes it.
    pub fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        match &mut self.jobs {
            Jobs::Own(jobs) => jobs.send(job).map_err(|_| BackendError::Internal("the worker thread has ended".into())),
            Jobs::Here(here) => {
                let backend = here
                    .backend
                    .as_mut()
                    .ok_or_else(|| BackendError::Internal("the backend is closed: an earlier job panicked".into()))?;
                if catch_unwind(AssertUnwindSafe(|| job(backend.as_mut()))).is_err() {
                    log::error!("worker {}: a job panicked; closing the backend", here.name);
                    here.backend = None;
                    return Err(BackendError::Internal("a job panicked; the backend is closed".into()));
                }
                Ok(())
            }
        }
    }

    /// Runs `f` on the owner thread and waits for its result. For tools and tests.
    pub fn call<T: Send + 'static>(
        &mut self,
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

fn make(control: &dyn BackendControl, call: ControlCall) {
    match call {
        ControlCall::Interrupt => control.interrupt(),
        ControlCall::ForceListen(on) => control.set_force_listen(on),
        ControlCall::Terminate => control.terminate(),
    }
}

/// Calls posted and not yet made beyond this are dropped (a control thread stuck in a
/// backend call must not make its queue grow without bound).
const CONTROL_BACKLOG: usize = 64;

/// Makes a backend's any-thread calls without ever blocking the caller: posted to a thread of
/// their own, or made at once when the backend says they never block
/// ([`BackendControl::never_blocks`]: no thread, and no thread to wake on the way).
pub(super) struct ControlThread(Calls);

enum Calls {
    Posted { calls: mpsc::SyncSender<ControlCall>, name: Arc<str> },
    Inline(Arc<dyn BackendControl>),
}

impl ControlThread {
    /// Calls made at once on the caller's thread: for a backend whose any-thread calls are
    /// quick (one run [`WorkerThread::here`]).
    pub(super) fn inline(control: Arc<dyn BackendControl>) -> ControlThread {
        ControlThread(Calls::Inline(control))
    }

    pub(super) fn spawn(name: &str, control: Arc<dyn BackendControl>) -> std::io::Result<ControlThread> {
        if control.never_blocks() {
            return Ok(ControlThread(Calls::Inline(control)));
        }
        let (calls, rx) = mpsc::sync_channel::<ControlCall>(CONTROL_BACKLOG);
        let log_name = name.to_string();
        spare_threads::run("backend", move || {
            for call in rx {
                if catch_unwind(AssertUnwindSafe(|| make(&*control, call))).is_err() {
                    log::error!("worker {log_name}: the backend panicked in {call:?}");
                }
            }
        })?;
        Ok(ControlThread(Calls::Posted { calls, name: name.into() }))
    }

    fn post(&self, call: ControlCall) {
        match &self.0 {
            Calls::Posted { calls, name } => {
                if let Err(mpsc::TrySendError::Full(_)) = calls.try_send(call) {
                    log::warn!("worker {name}: its backend is not taking any-thread calls; {call:?} dropped");
                }
            }
            Calls::Inline(control) => {
                // Made on the caller's thread (an actor's arbiter): a panic stays here.
                if catch_unwind(AssertUnwindSafe(|| make(&**control, call))).is_err() {
                    log::error!("the backend panicked in {call:?}");
                }
            }
        }
    }

    /// Cuts the call in flight short.
    pub(super) fn interrupt(&self) {
        self.post(ControlCall::Interrupt);
    }

    /// Ends the current speech; the next duplex step listens.
    pub(super) fn set_force_listen(&self, on: bool) {
        self.post(ControlCall::ForceListen(on));
    }

    /// Ends the backend at once (a child process is killed).
    pub(super) fn terminate(&self) {
        self.post(ControlCall::Terminate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::thread::{self, ThreadId};
    use std::time::Duration;

    /// Records which thread made each call.
    struct Recorder {
        never_blocks: bool,
        calls: Mutex<Vec<(&'static str, ThreadId)>>,
        made: mpsc::SyncSender<()>,
    }

    impl BackendControl for Recorder {
        fn interrupt(&self) {
            self.calls.lock().unwrap().push(("interrupt", thread::current().id()));
            let _ = self.made.try_send(());
        }
        fn set_force_listen(&self, _: bool) {
            self.calls.lock().unwrap().push(("force_listen", thread::current().id()));
            let _ = self.made.try_send(());
        }
        fn kv_length(&self) -> u64 {
            0
        }
        fn never_blocks(&self) -> bool {
            self.never_blocks
        }
    }

    fn recorder(never_blocks: bool) -> (Arc<Recorder>, mpsc::Receiver<()>) {
        let (made, rx) = mpsc::sync_channel(8);
        (Arc::new(Recorder { never_blocks, calls: Mutex::default(), made }), rx)
    }

    #[test]
    fn calls_of_a_backend_that_never_blocks_are_made_at_once_on_the_callers_thread() {
        let (control, _made) = recorder(true);
        let thread = ControlThread::spawn("w", control.clone()).unwrap();
        thread.interrupt();
        thread.set_force_listen(true);
        let me = thread::current().id();
        assert_eq!(*control.calls.lock().unwrap(), vec![("interrupt", me), ("force_listen", me)]);
    }

    #[test]
    fn calls_of_any_other_backend_are_made_on_a_thread_of_their_own_in_order() {
        let (control, made) = recorder(false);
        let thread = ControlThread::spawn("w", control.clone()).unwrap();
        thread.interrupt();
        thread.set_force_listen(true);
        for _ in 0..2 {
            made.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        let calls = control.calls.lock().unwrap().clone();
        assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), ["interrupt", "force_listen"]);
        assert!(calls.iter().all(|c| c.1 != thread::current().id()));
    }

    /// A backend that does nothing: the test looks at who owns it, and where its calls run.
    struct Here {
        info: BackendInfo,
        control: Arc<Recorder>,
    }

    impl Backend for Here {
        fn info(&self) -> &BackendInfo {
            &self.info
        }
        fn prepare(&mut self, _: &crate::domain::SessionSetup) -> Result<(), BackendError> {
            Ok(())
        }
        fn reset(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
        fn duplex_prefill(&mut self, _: &crate::domain::DuplexChunk) -> Result<(), BackendError> {
            Err(BackendError::Internal("not in this test".into()))
        }
        fn duplex_generate(&mut self) -> Result<crate::domain::StepPiece, BackendError> {
            Err(BackendError::Internal("not in this test".into()))
        }
        fn duplex_drain(&mut self) -> Result<Option<crate::domain::StepPiece>, BackendError> {
            Ok(None)
        }
        fn duplex_finalize(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
        fn turn_prefill(&mut self, _: &crate::domain::TurnInput) -> Result<(), BackendError> {
            Err(BackendError::Internal("not in this test".into()))
        }
        fn turn_generate(&mut self) -> Result<crate::domain::TurnPiece, BackendError> {
            Err(BackendError::Internal("not in this test".into()))
        }
        fn control(&self) -> Arc<dyn BackendControl> {
            self.control.clone()
        }
    }

    fn quick_factory(name: &'static str) -> BackendFactory {
        BackendFactory::new(move || {
            let (control, _made) = recorder(true);
            let info = BackendInfo { name: name.into(), duplex: true, ..BackendInfo::default() };
            Ok(Box::new(Here { info, control }) as Box<dyn Backend>)
        })
        .quick()
    }

    fn wait(exited: tokio::sync::oneshot::Receiver<()>) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), exited).await })
            .expect("the backend was closed")
            .expect("told");
    }

    #[test]
    fn a_quick_backend_is_opened_and_driven_on_the_callers_thread() {
        let (mut worker, info, _) = WorkerThread::here("quick", &quick_factory("quick")).expect("opened");
        assert!(worker.is_here());
        assert_eq!(info.name, "quick");
        let me = thread::current().id();
        assert_eq!(worker.call(|_| thread::current().id()).unwrap(), me, "no thread of its own");
        // Jobs run as they are submitted, in order.
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            worker.submit(Box::new(move |_| tx.send(i).unwrap())).unwrap();
        }
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), (0..100).collect::<Vec<_>>());
        wait(worker.stop());
    }

    #[test]
    fn a_quick_backend_whose_job_panics_is_closed_and_says_so() {
        let (mut worker, _, _) = WorkerThread::here("quick", &quick_factory("quick")).expect("opened");
        let err = worker.submit(Box::new(|_| panic!("a bug in the job"))).unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        let err = worker.call(|_| ()).unwrap_err();
        assert!(err.to_string().contains("closed"), "{err}");
        wait(worker.stop());
    }

    #[test]
    fn a_quick_backend_that_fails_to_open_says_why() {
        let factory = BackendFactory::new(|| Err(BackendError::Open("no such model".into()))).quick();
        let err = WorkerThread::here("broken", &factory).err().expect("failed");
        assert!(err.to_string().contains("no such model"), "{err}");
        let panics = BackendFactory::new(|| panic!("a bug while opening")).quick();
        let err = WorkerThread::here("broken", &panics).err().expect("failed");
        assert!(err.to_string().contains("panicked while opening"), "{err}");
    }

    #[test]
    fn a_backend_open_already_is_known_at_once_and_then_owned_by_its_thread() {
        let (control, _made) = recorder(true);
        let info = BackendInfo { name: "open-already".into(), duplex: true, ..BackendInfo::default() };
        let backend = Here { info: info.clone(), control: control.clone() };
        let (mut thread, got, got_control) = WorkerThread::adopt("w", Box::new(backend)).unwrap();
        assert_eq!(got, info);
        got_control.interrupt();
        assert_eq!(control.calls.lock().unwrap().len(), 1, "its control is the backend's own");
        let (name, ran_on) = thread.call(|b| (b.info().name.clone(), thread::current().id())).unwrap();
        assert_eq!(name, "open-already");
        assert_ne!(ran_on, thread::current().id(), "owner-thread calls run on the worker's thread");
        // Dropped: the thread closes the backend and says so.
        let exited = thread.stop();
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), exited).await })
            .expect("the thread ended")
            .expect("told");
    }
}
