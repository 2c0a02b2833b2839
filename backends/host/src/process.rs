//! A backend in a child process (`isolation = "process"`): the parent side.
//!
//! [`ProcessBackend`] implements the [`Backend`] trait by sending each owner-thread call to
//! the `worker-host` child and waiting for its answer; its [`BackendControl`] sends
//! interrupt and force-listen without waiting. A backend that aborts or segfaults takes
//! only its child down: the reader thread sees the pipe end, reaps the child and names the
//! cause ("killed by signal 11 (SIGSEGV)"); a call in flight fails with
//! [`BackendError::Crashed`], and an idle worker is told through its death notice. Either
//! way the BackendActor fails the worker and the pool starts a new one.
//!
//! Threads per worker: the owner thread (the worker thread, blocked in a call), a writer
//! (so that neither the owner nor an actor ever blocks on a full pipe) and a reader.

use std::io::{BufReader, BufWriter};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use omni_actors::domain::{BackendInfo, DuplexChunk, SessionSetup, StepOutcome, StepPiece, TurnInput, TurnPiece};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::ipc::{FromHost, HostOpen, ToHost, Value, read_frame, write_frame};

/// How long a child that lost its pipe, or was asked to close, has to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// What to start: the worker's name, its backend library (none: built-in) and options.
#[derive(Debug, Clone)]
pub struct HostSpec {
    pub name: String,
    pub library: Option<PathBuf>,
    pub options: Vec<(String, String)>,
    /// A child whose backend has not opened after this long is killed.
    pub open_timeout: Duration,
}

/// The environment a backend process gets: these variables (and any `OMNI_BACKEND_*`),
/// nothing else of the gateway's. Process isolation is a crash boundary, not a security
/// boundary: the child runs as the gateway's user.
const KEPT_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    // Where the models are (scripts/fetch-models.py, the CPU model's `$OMNI_MODELS/...` paths).
    "OMNI_MODELS",
];

fn kept(name: &str) -> bool {
    KEPT_ENV.contains(&name) || name.starts_with("LC_") || name.starts_with("OMNI_BACKEND_")
}

/// The program that hosts backends: this very binary, even after it was replaced on disk
/// (`/proc/self/exe` names the running image, not the path it was started from).
pub fn host_program() -> Result<PathBuf, BackendError> {
    let proc_exe = PathBuf::from("/proc/self/exe");
    if proc_exe.exists() {
        return Ok(proc_exe);
    }
    std::env::current_exe()
        .map_err(|e| BackendError::Open(format!("cannot find this program to start worker-host: {e}")))
}

struct Shared {
    name: String,
    pid: u32,
    child: Arc<Mutex<Child>>,
    /// Frames for the writer thread; `None` closes the child's stdin.
    outgoing: mpsc::Sender<Option<ToHost>>,
    kv_length: AtomicU64,
    /// Why the child ended, once it has.
    death: Mutex<Option<String>>,
    death_notice: Mutex<Option<oneshot::Receiver<String>>>,
    /// The gateway is ending the child on purpose: its exit is not a crash.
    ending: AtomicBool,
}

impl Shared {
    fn send(&self, message: ToHost) {
        // Fails only once the writer is gone, i.e. the child is gone: the reader reports that.
        let _ = self.outgoing.send(Some(message));
    }

    fn died(&self) -> BackendError {
        let why = self.death.lock().clone().unwrap_or_else(|| "it stopped answering".into());
        BackendError::Crashed(death_reason(&why))
    }
}

pub struct ProcessBackend {
    shared: Arc<Shared>,
    info: BackendInfo,
    replies: mpsc::Receiver<FromHost>,
}

pub struct ProcessControl(Arc<Shared>);

impl ProcessBackend {
    /// Starts `exe worker-host` for the worker and waits until its backend is open.
    pub fn spawn(exe: &std::path::Path, spec: &HostSpec) -> Result<ProcessBackend, BackendError> {
        let mut command = Command::new(exe);
        command.arg0("omni-gateway").arg("worker-host").arg("--name").arg(&spec.name);
        command.env_clear().envs(std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(kept)));
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command
            .spawn()
            .map_err(|e| BackendError::Open(format!("cannot start {} worker-host: {e}", exe.display())))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(BackendError::Open("worker-host started without pipes".into()));
        };
        let pid = child.id();
        let child = Arc::new(Mutex::new(child));
        // The open has a deadline: a child still opening after it is killed.
        let (opened_tx, opened_rx) = mpsc::channel::<()>();
        let timed_out = Arc::new(AtomicBool::new(false));
        {
            let (child, timed_out, timeout) = (child.clone(), timed_out.clone(), spec.open_timeout);
            let _ = thread::Builder::new().name(format!("host-open-{}", spec.name)).spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = opened_rx.recv_timeout(timeout) {
                    timed_out.store(true, Ordering::SeqCst);
                    let _ = child.lock().kill();
                }
            });
        }
        let open = ToHost::Open(HostOpen { library: spec.library.clone(), options: spec.options.clone() });
        let sent = write_frame(&mut stdin, &open);
        let mut stdout = BufReader::new(stdout);
        let opened = match sent {
            Ok(()) => read_frame::<FromHost>(&mut stdout, &mut Vec::new()),
            Err(e) => Err(e),
        };
        let _ = opened_tx.send(());
        let info = match opened {
            Ok(Some(FromHost::Opened(Ok(info)))) => info,
            Ok(Some(FromHost::Opened(Err(e)))) => {
                let _ = child.lock().wait();
                return Err(e);
            }
            other => {
                let why = match other {
                    Err(e) => format!("unreadable answer ({e})"),
                    _ => "no answer".into(),
                };
                let mut child = child.lock();
                let _ = child.kill();
                let status = child.wait().map(describe).unwrap_or_else(|e| e.to_string());
                if timed_out.load(Ordering::SeqCst) {
                    return Err(BackendError::Open(format!(
                        "the backend did not open within limits.open_timeout_s ({} s): its process was {status}",
                        spec.open_timeout.as_secs_f64()
                    )));
                }
                return Err(BackendError::Open(format!("the backend process died while opening: {status} ({why})")));
            }
        };
        let (outgoing, frames) = mpsc::channel();
        let (notify, notice) = oneshot::channel();
        let shared = Arc::new(Shared {
            name: spec.name.clone(),
            pid,
            child,
            outgoing,
            kv_length: AtomicU64::new(0),
            death: Mutex::new(None),
            death_notice: Mutex::new(Some(notice)),
            ending: AtomicBool::new(false),
        });
        let (replies_tx, replies) = mpsc::channel();
        let spawned = thread::Builder::new()
            .name(format!("host-w-{}", spec.name))
            .spawn(move || write_frames(stdin, frames))
            .and_then(|_| {
                let shared = shared.clone();
                thread::Builder::new()
                    .name(format!("host-r-{}", spec.name))
                    .spawn(move || read_replies(stdout, replies_tx, notify, &shared))
            });
        if let Err(e) = spawned {
            let _ = shared.child.lock().kill();
            return Err(BackendError::Open(format!("cannot start the pipe threads: {e}")));
        }
        log::info!("worker {}: backend {} runs in process {pid}", spec.name, info.name);
        Ok(ProcessBackend { shared, info, replies })
    }

    fn call(&mut self, request: ToHost) -> Result<Value, BackendError> {
        self.shared.send(request);
        match self.replies.recv() {
            Ok(FromHost::Reply { kv_length, value }) => {
                self.shared.kv_length.store(kv_length, Ordering::Relaxed);
                value
            }
            Ok(FromHost::Opened(_)) => Err(BackendError::Internal("the backend process opened twice".into())),
            Err(_) => Err(self.shared.died()),
        }
    }
}

fn unexpected(value: Value) -> BackendError {
    BackendError::Internal(format!("the backend process answered out of turn: {value:?}"))
}

impl Backend for ProcessBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }
    fn prepare(&mut self, setup: &SessionSetup) -> Result<(), BackendError> {
        self.call(ToHost::Prepare(setup.clone())).and_then(done)
    }
    fn reset(&mut self) -> Result<(), BackendError> {
        self.call(ToHost::Reset).and_then(done)
    }
    fn duplex_prefill(&mut self, chunk: &DuplexChunk) -> Result<(), BackendError> {
        self.call(ToHost::DuplexPrefill(chunk.clone())).and_then(done)
    }
    fn duplex_generate(&mut self) -> Result<StepPiece, BackendError> {
        match self.call(ToHost::DuplexGenerate)? {
            Value::Piece(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }
    fn duplex_drain(&mut self) -> Result<Option<StepPiece>, BackendError> {
        match self.call(ToHost::DuplexDrain)? {
            Value::MaybePiece(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }
    fn duplex_finalize(&mut self) -> Result<(), BackendError> {
        self.call(ToHost::DuplexFinalize).and_then(done)
    }
    fn duplex_step(&mut self, chunk: &DuplexChunk) -> Result<StepOutcome, BackendError> {
        match self.call(ToHost::DuplexStep(chunk.clone()))? {
            Value::Outcome(o) => Ok(o),
            other => Err(unexpected(other)),
        }
    }
    fn turn_prefill(&mut self, input: &TurnInput) -> Result<(), BackendError> {
        self.call(ToHost::TurnPrefill(input.clone())).and_then(done)
    }
    fn turn_generate(&mut self) -> Result<TurnPiece, BackendError> {
        match self.call(ToHost::TurnGenerate)? {
            Value::Turn(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }
    fn control(&self) -> Arc<dyn BackendControl> {
        Arc::new(ProcessControl(self.shared.clone()))
    }
}

fn done(value: Value) -> Result<(), BackendError> {
    match value {
        Value::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

impl Drop for ProcessBackend {
    /// Closes the child's stdin (it closes its backend and exits), gives it
    /// [`EXIT_GRACE`], then kills it. Runs on the worker thread, never on the executor.
    fn drop(&mut self) {
        self.shared.ending.store(true, Ordering::SeqCst);
        let _ = self.shared.outgoing.send(None);
        let deadline = Instant::now() + EXIT_GRACE;
        loop {
            let mut child = self.shared.child.lock();
            match child.try_wait() {
                Ok(None) if Instant::now() < deadline => {}
                Ok(None) => {
                    log::warn!("worker {}: backend process did not exit when asked; killing it", self.shared.name);
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                _ => return,
            }
            drop(child);
            thread::sleep(Duration::from_millis(2));
        }
    }
}

impl BackendControl for ProcessControl {
    fn interrupt(&self) {
        self.0.send(ToHost::Interrupt);
    }
    fn set_force_listen(&self, on: bool) {
        self.0.send(ToHost::ForceListen(on));
    }
    fn kv_length(&self) -> u64 {
        self.0.kv_length.load(Ordering::Relaxed)
    }
    fn terminate(&self) {
        self.0.ending.store(true, Ordering::SeqCst);
        // std's kill is a no-op for a child already reaped: no stray signal to a reused pid.
        let _ = self.0.child.lock().kill();
    }
    fn take_death_notice(&self) -> Option<oneshot::Receiver<String>> {
        self.0.death_notice.lock().take()
    }
    fn process_id(&self) -> Option<u32> {
        Some(self.0.pid)
    }
}

fn write_frames(stdin: ChildStdin, frames: mpsc::Receiver<Option<ToHost>>) {
    let mut stdin = BufWriter::new(stdin);
    while let Ok(Some(frame)) = frames.recv() {
        if write_frame(&mut stdin, &frame).is_err() {
            return; // the child is gone; the reader names the cause
        }
    }
}

fn read_replies(
    stdout: BufReader<ChildStdout>,
    replies: mpsc::Sender<FromHost>,
    notify: oneshot::Sender<String>,
    shared: &Shared,
) {
    let (mut stdout, mut buf) = (stdout, Vec::new());
    let broken = loop {
        match read_frame::<FromHost>(&mut stdout, &mut buf) {
            Ok(Some(message)) => {
                let _ = replies.send(message);
            }
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    let status = reap(shared);
    let why = match broken {
        Some(e) => format!("{status} (after an unreadable answer: {e})"),
        None => status,
    };
    *shared.death.lock() = Some(why.clone());
    drop(replies); // a call in flight now fails with the cause above
    if shared.ending.load(Ordering::SeqCst) {
        log::debug!("worker {}: backend process ended: {why}", shared.name);
    } else {
        log::error!("worker {}: backend process died: {why}", shared.name);
        let _ = notify.send(death_reason(&why));
    }
}

fn death_reason(why: &str) -> String {
    format!("backend process died: {why}")
}

/// Waits for the child that closed its stdout, killing it after [`EXIT_GRACE`].
fn reap(shared: &Shared) -> String {
    let deadline = Instant::now() + EXIT_GRACE;
    loop {
        let mut child = shared.child.lock();
        match child.try_wait() {
            Ok(Some(status)) => return describe(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
            }
            Ok(None) => {}
            Err(e) => return format!("cannot tell how it ended: {e}"),
        }
        drop(child);
        thread::sleep(Duration::from_millis(2));
    }
}

/// "exited with status 3", "killed by signal 11 (SIGSEGV)".
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(signal) => format!("killed by signal {signal} ({})", signal_name(signal)),
        None => format!("ended: {status}"),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}
