//! `omni-gateway worker-host`: the child process that hosts one worker's backend when the
//! worker runs with `isolation = "process"`.
//!
//! It reads what to open from its first message (the library and the worker's options
//! never appear on its command line), opens the backend through the same C ABI as a worker
//! thread would, says
//! [`FromHost::Opened`], then serves the calls its parent's BackendActor sends over stdin,
//! answering on stdout (framing in [`super::ipc`]). Calls run one at a time on the main
//! thread, which owns the backend; a reader thread applies interrupt and force-listen at
//! once, even mid-call. When stdin ends (the parent closed it, or died) the backend is
//! closed and the process exits. Whatever the backend prints goes to stderr.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::os::fd::FromRawFd;
use std::sync::mpsc;
use std::thread;

use omni_actors::edge::backend::{Backend, BackendControl, BackendError};

use super::BackendApi;
use super::ipc::{FromHost, ToHost, Value, read_frame, write_frame};

/// How the parent names the child (what to open comes over stdin, see [`super::ipc::HostOpen`]).
#[derive(Debug, Clone, clap::Args)]
pub struct HostArgs {
    /// The worker's name, for logs.
    #[arg(long)]
    pub name: String,
}

/// Runs the host until its parent closes stdin. Errors are for the process's exit status;
/// the parent reads the reason of a failed open from the `Opened` message.
/// Why a backend host stopped on its own (its exit status says it failed).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot {0}: {1}")]
    Stdio(&'static str, std::io::Error),
    #[error("the gateway's first message was not Open but {0}")]
    NotOpen(&'static str),
    #[error("unreadable first message from the gateway: {0}")]
    Unreadable(std::io::Error),
    #[error("cannot answer the gateway: {0}")]
    Answer(std::io::Error),
    #[error("cannot start its reader thread: {0}")]
    Thread(std::io::Error),
}

pub fn run(args: HostArgs) -> Result<(), HostError> {
    let (input, output) = take_stdio()?;
    let mut output = BufWriter::new(output);
    let mut input = BufReader::new(input);
    let open = match read_frame::<ToHost>(&mut input, &mut Vec::new()) {
        Ok(Some(ToHost::Open(open))) => open,
        Ok(Some(other)) => return Err(HostError::NotOpen(other.kind())),
        Ok(None) => return Ok(()),
        Err(e) => return Err(HostError::Unreadable(e)),
    };
    let opened = match &open.library {
        None => Ok(BackendApi::builtin()),
        Some(path) => BackendApi::load(path).map_err(|e| BackendError::Open(e.to_string())),
    }
    .and_then(|api| api.open(&open.options));
    let mut backend = match opened {
        Ok(b) => b,
        Err(e) => {
            log::debug!("worker {}: backend did not open: {e}", args.name);
            return write_frame(&mut output, &FromHost::Opened(Err(e))).map_err(HostError::Answer);
        }
    };
    write_frame(&mut output, &FromHost::Opened(Ok(backend.info().clone()))).map_err(HostError::Answer)?;
    let control = backend.control();
    let (calls, rx) = mpsc::channel();
    let name = args.name.clone();
    thread::Builder::new()
        .name("host-reader".into())
        .spawn(move || read_requests(input, control, calls, &name))
        .map_err(HostError::Thread)?;
    let control = backend.control();
    for call in rx {
        let value = serve(&mut backend, call);
        let reply = FromHost::Reply { kv_length: control.kv_length(), value };
        if let Err(e) = write_frame(&mut output, &reply) {
            log::warn!("worker {}: cannot answer the gateway ({e}); closing the backend", args.name);
            break;
        }
    }
    drop(backend);
    log::debug!("worker {}: backend host exits", args.name);
    Ok(())
}

/// Applies the any-thread calls at once; queues the rest for the owner thread. Ends (and
/// so ends the host) when the parent closes the pipe.
fn read_requests(
    mut input: BufReader<File>,
    control: std::sync::Arc<dyn BackendControl>,
    calls: mpsc::Sender<ToHost>,
    name: &str,
) {
    let mut buf = Vec::new();
    loop {
        match read_frame::<ToHost>(&mut input, &mut buf) {
            Ok(Some(ToHost::Interrupt)) => control.interrupt(),
            Ok(Some(ToHost::ForceListen(on))) => control.set_force_listen(on),
            Ok(Some(call)) => {
                if calls.send(call).is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                log::error!("worker {name}: unreadable message from the gateway: {e}");
                return;
            }
        }
    }
}

pub fn serve(backend: &mut dyn Backend, call: ToHost) -> Result<Value, BackendError> {
    Ok(match call {
        ToHost::Prepare(setup) => backend.prepare(&setup).map(|_| Value::Done)?,
        ToHost::Reset => backend.reset().map(|_| Value::Done)?,
        ToHost::DuplexPrefill(chunk) => backend.duplex_prefill(&chunk).map(|_| Value::Done)?,
        ToHost::DuplexGenerate => Value::Piece(backend.duplex_generate()?),
        ToHost::DuplexDrain => Value::MaybePiece(backend.duplex_drain()?),
        ToHost::DuplexFinalize => backend.duplex_finalize().map(|_| Value::Done)?,
        ToHost::DuplexStep(chunk) => Value::Outcome(backend.duplex_step(&chunk)?),
        ToHost::TurnPrefill(input) => backend.turn_prefill(&input).map(|_| Value::Done)?,
        ToHost::TurnGenerate => Value::Turn(backend.turn_generate()?),
        ToHost::Interrupt | ToHost::ForceListen(_) => Value::Done,
        ToHost::Open(_) => return Err(BackendError::BadState("the backend is already open".into())),
    })
}

/// Takes stdin and stdout for the protocol and points fd 0 at /dev/null and fd 1 at
/// stderr, so that a backend printing to stdout cannot corrupt the frames. On Linux the
/// host also dies with the gateway's thread that spawned it.
fn take_stdio() -> Result<(File, File), HostError> {
    // SAFETY: plain descriptor calls on this process's own standard descriptors, before
    // any other thread exists; each new descriptor is owned by exactly one `File`.
    unsafe {
        let input = libc::dup(0);
        let output = libc::dup(1);
        if input < 0 || output < 0 {
            return Err(HostError::Stdio("duplicate stdio", std::io::Error::last_os_error()));
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if null < 0 || libc::dup2(null, 0) < 0 || libc::dup2(2, 1) < 0 {
            return Err(HostError::Stdio("redirect stdio", std::io::Error::last_os_error()));
        }
        libc::close(null);
        libc::fcntl(input, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(output, libc::F_SETFD, libc::FD_CLOEXEC);
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        Ok((File::from_raw_fd(input), File::from_raw_fd(output)))
    }
}
