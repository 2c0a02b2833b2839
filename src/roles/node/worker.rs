//! One worker on a node: its backend, opened on a thread of its own (which owns it, as on a
//! gateway), opened again with backoff when it fails, and lent to one gateway at a time.
//!
//! The owner thread runs the calls of the attached gateway's link one at a time, in order;
//! the link applies the any-thread calls (interrupt, force-listen) directly through the
//! backend's control, even mid-call. When the link ends, the call in flight is interrupted
//! and the backend reset, ready for the next gateway.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use omni_actors::domain::{BackendInfo, Mode};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};
use omni_actors::pool::state::backoff;
use omni_actors::worker::thread::BackendFactory;
use tokio::sync::mpsc::UnboundedSender;

use crate::backend::ipc::ToHost;
use crate::link::wire::{AttachGrant, FromNode, NodeWorker as Described};

/// What a worker of a cluster's node calls when it becomes free: its offer, started.
pub type OnFree = Box<dyn Fn() + Send + Sync>;

/// Work for the owner thread.
pub enum Job {
    /// An owner-thread call of link `link`, answered on `reply`.
    Call { call: ToHost, link: u64, reply: UnboundedSender<FromNode> },
    /// The link ended: reset the backend for the next gateway.
    Detach,
    /// End the backend (it was terminated) and open it again.
    Restart,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Starting,
    Ready,
    Failed(String),
}

struct Status {
    state: State,
    /// The link it is lent to.
    attached: Option<u64>,
    info: Option<BackendInfo>,
    control: Option<Arc<dyn BackendControl>>,
    /// When the call in flight began.
    busy_since: Option<Instant>,
    /// In a cluster: the nonce the worker is offered under now (none: not offered).
    offer: Option<String>,
    /// Its offer's script has not answered yet: beats report it pending, not offered (a beat
    /// the store ran before the offer would otherwise have it offered again, under a new
    /// nonce, and a grant under the first refused).
    offering: bool,
    /// In a cluster: the ticket, mode and start of the session attached.
    session: Option<(u64, Mode, Instant)>,
    /// The mode and length of the last session, until the next offer reports it.
    ended: Option<(Mode, Duration)>,
}

pub struct NodeWorker {
    pub name: String,
    pub modes: Vec<Mode>,
    /// Where its backend comes from, for discovery.
    pub backend: String,
    jobs: mpsc::Sender<Job>,
    status: Mutex<Status>,
    /// In a cluster: called whenever this worker becomes free (ready, or its link ended), so
    /// that it is offered at once. Outside one: never set.
    free: OnceLock<OnFree>,
}

/// A worker as a node's beat reports it to the cluster's store.
pub enum Report {
    /// A session holds it (its ticket).
    Busy(u64),
    /// Its backend is not open.
    Down,
    /// Free, offered under this nonce.
    Offered(String),
    /// Free, its offer under way.
    Pending,
}

/// Why an attach was refused.
pub type Refusal = String;

impl NodeWorker {
    /// Starts the owner thread, which opens the backend.
    pub fn start(name: String, modes: Vec<Mode>, backend: String, factory: BackendFactory) -> Arc<NodeWorker> {
        let (jobs, rx) = mpsc::channel();
        let status = Status {
            state: State::Starting,
            attached: None,
            info: None,
            control: None,
            busy_since: None,
            offer: None,
            offering: false,
            session: None,
            ended: None,
        };
        let worker =
            Arc::new(NodeWorker { name, modes, backend, jobs, status: Mutex::new(status), free: OnceLock::new() });
        let owner = worker.clone();
        let spawned = thread::Builder::new()
            .name(format!("node-{}", worker.name))
            .stack_size(1 << 20)
            .spawn(move || owner.run(rx, factory));
        if let Err(e) = spawned {
            worker.status().state = State::Failed(format!("cannot start its thread: {e}"));
        }
        worker
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        // A poisoned lock only means a panic elsewhere; the status itself is plain data.
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What discovery reports.
    pub fn describe(&self) -> Described {
        let s = self.status();
        let (state, reason) = match (&s.state, s.attached) {
            (State::Starting, _) => ("starting", None),
            (State::Failed(r), _) => ("failed", Some(r.clone())),
            (State::Ready, Some(_)) => ("attached", None),
            (State::Ready, None) => ("ready", None),
        };
        Described {
            name: self.name.clone(),
            modes: self.modes.clone(),
            backend: self.backend.clone(),
            state: state.into(),
            reason,
        }
    }

    /// In a cluster: `on_free` is called whenever this worker becomes free (from any thread;
    /// it must not block), and attaches need a grant.
    pub fn join_cluster(&self, on_free: OnFree) {
        let ready = {
            let s = self.status();
            s.state == State::Ready && s.attached.is_none()
        };
        if self.free.set(on_free).is_ok() && ready {
            self.freed();
        }
    }

    fn freed(&self) {
        if let Some(on_free) = self.free.get() {
            on_free();
        }
    }

    /// Lends the worker to link `link`: its backend's info and control, or why not. In a
    /// cluster only with the grant it is offered under (its nonce is then spent).
    pub fn attach(
        &self,
        link: u64,
        gateway: &str,
        grant: Option<&AttachGrant>,
    ) -> Result<(BackendInfo, Arc<dyn BackendControl>), Refusal> {
        let mut s = self.status();
        if s.attached.is_some() {
            return Err(format!("worker {} is attached to another gateway", self.name));
        }
        if self.free.get().is_some() {
            match grant {
                None => {
                    return Err(format!("worker {} serves a cluster: attach with a grant from its store", self.name));
                }
                Some(g) if s.offer.as_deref() != Some(g.nonce.as_str()) => {
                    return Err(format!(
                        "stale grant for ticket {}: worker {} is no longer offered under it",
                        g.ticket, self.name
                    ));
                }
                Some(_) => {}
            }
        }
        match (&s.state, &s.info, &s.control) {
            (State::Ready, Some(info), Some(control)) => {
                let answer = (info.clone(), control.clone());
                s.attached = Some(link);
                s.offer = None;
                s.session = grant.map(|g| (g.ticket, g.mode, Instant::now()));
                match grant {
                    Some(g) => log::info!(
                        "worker {}: attached to gateway {gateway} (link {link}) for ticket {}",
                        self.name,
                        g.ticket
                    ),
                    None => log::info!("worker {}: attached to gateway {gateway} (link {link})", self.name),
                }
                Ok(answer)
            }
            (State::Failed(reason), ..) => Err(format!("worker {} failed: {reason}", self.name)),
            _ => Err(format!("worker {} is starting (its backend is opening)", self.name)),
        }
    }

    /// Link `link` ended: the call in flight is cut short, the backend reset, the worker free
    /// (offered again in a cluster).
    pub fn detach(&self, link: u64, why: &str) {
        let mut s = self.status();
        if s.attached != Some(link) {
            return;
        }
        log::info!("worker {}: link {link} ended ({why}); the worker is free", self.name);
        if let Some(control) = &s.control {
            control.interrupt();
            control.set_force_listen(false);
        }
        // Queued before the worker is free: the reset runs before any later link's call.
        let _ = self.jobs.send(Job::Detach);
        s.attached = None;
        if let Some((ticket, mode, since)) = s.session.take() {
            let length = since.elapsed();
            log::info!("worker {}: session of ticket {ticket} ended after {:.1} s", self.name, length.as_secs_f64());
            s.ended = Some((mode, length));
        }
        drop(s);
        // In a cluster the worker is offered at once, its reset running meanwhile: the next
        // client's grant and attach overlap it instead of waiting for it.
        self.freed();
    }

    /// Offers the worker under `nonce` if it is free (ready, not attached); the mode and
    /// length of the session before, once. `None`: not free.
    pub fn offer_under(&self, nonce: &str) -> Option<Option<(Mode, Duration)>> {
        let mut s = self.status();
        if s.state != State::Ready || s.attached.is_some() || s.control.is_none() {
            return None;
        }
        s.offer = Some(nonce.to_string());
        s.offering = true;
        Some(s.ended.take())
    }

    /// What the node's beat tells the store about this worker.
    /// The store answered the offer under `nonce` (whatever it said).
    pub fn offer_answered(&self, nonce: &str) {
        let mut s = self.status();
        if s.offer.as_deref() == Some(nonce) {
            s.offering = false;
        }
    }

    pub fn report(&self) -> Report {
        let s = self.status();
        match (&s.state, s.attached, &s.offer) {
            (State::Ready, None, Some(_)) if s.offering => Report::Pending,
            (State::Ready, Some(_), _) => Report::Busy(s.session.map_or(0, |(ticket, ..)| ticket)),
            (State::Ready, None, Some(nonce)) => Report::Offered(nonce.clone()),
            (State::Ready, None, None) => Report::Pending,
            _ => Report::Down,
        }
    }

    /// Hands a call of link `link` to the owner thread.
    pub fn submit(&self, job: Job) {
        let _ = self.jobs.send(job);
    }

    /// The call in flight began more than `limit` ago: its backend's control, once per call.
    pub fn overdue(&self, limit: Duration) -> Option<Arc<dyn BackendControl>> {
        let mut s = self.status();
        if s.busy_since?.elapsed() <= limit {
            return None;
        }
        s.busy_since = None;
        s.control.clone()
    }

    fn run(self: Arc<Self>, rx: mpsc::Receiver<Job>, factory: BackendFactory) {
        let mut failures = 0;
        loop {
            self.status().state = State::Starting;
            let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory()))
                .unwrap_or_else(|_| Err(BackendError::Internal("the backend panicked while opening".into())));
            let mut backend = match opened {
                Ok(backend) => backend,
                Err(e) => {
                    failures += 1;
                    let wait = backoff(failures);
                    log::error!("worker {}: {e}; opening again in {} ms", self.name, wait.as_millis());
                    self.status().state = State::Failed(e.to_string());
                    if !self.idle_for(&rx, wait) {
                        return;
                    }
                    continue;
                }
            };
            failures = 0;
            {
                let mut s = self.status();
                s.info = Some(backend.info().clone());
                s.control = Some(backend.control());
                s.state = State::Ready;
            }
            log::info!("worker {}: ready", self.name);
            self.freed();
            let again = self.serve(&rx, backend.as_mut());
            {
                let mut s = self.status();
                s.control = None;
                s.info = None;
                s.busy_since = None;
                s.offer = None;
            }
            drop(backend);
            if !again {
                return;
            }
        }
    }

    /// Serves jobs until the backend must be opened again (true) or the node stops (false).
    fn serve(&self, rx: &mpsc::Receiver<Job>, backend: &mut dyn Backend) -> bool {
        let control = backend.control();
        while let Ok(job) = rx.recv() {
            match job {
                Job::Call { call, link, reply } => {
                    if self.status().attached != Some(link) {
                        continue; // a call of a link that has ended
                    }
                    self.status().busy_since = Some(Instant::now());
                    let value = crate::backend::host::serve(backend, call);
                    let kv_length = control.kv_length();
                    self.status().busy_since = None;
                    let crashed = matches!(&value, Err(BackendError::Crashed(_)));
                    let _ = reply.send(FromNode::Reply { kv_length, value });
                    if crashed {
                        log::error!("worker {}: its backend died; opening it again", self.name);
                        return true;
                    }
                }
                Job::Detach => {
                    // Offered already (see `detach`): a link attached meanwhile has its calls
                    // queued behind this reset.
                    if let Err(e) = backend.reset() {
                        log::warn!("worker {}: reset after the link ended: {e}; opening it again", self.name);
                        return true;
                    }
                }
                Job::Restart => {
                    log::warn!("worker {}: terminated by the gateway; opening it again", self.name);
                    return true;
                }
            }
        }
        false
    }

    /// Waits `wait` (a backoff), answering calls meanwhile that the backend is not there.
    /// False when the node stops.
    fn idle_for(&self, rx: &mpsc::Receiver<Job>, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            match rx.recv_timeout(left) {
                Ok(Job::Call { reply, .. }) => {
                    let value = Err(BackendError::Crashed(format!("worker {}: its backend is not open", self.name)));
                    let _ = reply.send(FromNode::Reply { kv_length: 0, value });
                }
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }
}
