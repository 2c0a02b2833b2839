//! A worker on a node (`[[nodes]]`), driven from the gateway: the gateway's side of the
//! node protocol ([`crate::link::wire`]).
//!
//! [`RemoteBackend`] is a [`Backend`] like any other behind a BackendActor. Its socket is
//! served by two tasks on a small runtime of its own (`node-io`): a writer that sends calls,
//! any-thread calls and a ping when it has said nothing for a heartbeat interval, and a
//! reader that hands replies to the worker thread and declares the node gone when nothing
//! (not even a ping) arrived for the heartbeat timeout. A duplex step is one round trip;
//! interrupt and force-listen go out at once, mid-step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use omni_actors::domain::{BackendInfo, DuplexChunk, SessionSetup, StepOutcome, StepPiece, TurnInput, TurnPiece};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};
use omni_actors::observe::metrics::metrics;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc as tmpsc, oneshot};
use tokio::time::{Instant, timeout};

use super::ipc::{ToHost, Value};
use crate::ipc::MAX_FRAME_BYTES;
use crate::link::LinkError;
use crate::link::config::NodeLink;
use crate::link::dial::{CONNECT_TIMEOUT, Stream, connect, io};
use crate::link::standby::Standby;
use crate::link::wire::{
    AttachGrant, Frames, FromNode, NodeWorker, Request, ToNode, frames, next_frame, read_frame, write_frame,
};

/// The node's workers, or why they cannot be known now. Blocking; not for an async thread.
pub fn discover(link: &NodeLink) -> Result<Vec<NodeWorker>, LinkError> {
    io().block_on(async {
        timeout(CONNECT_TIMEOUT, async {
            let mut stream = connect(link, Request::Discover).await?;
            match read_frame::<FromNode>(&mut stream, MAX_FRAME_BYTES).await {
                Ok(Some(FromNode::Workers(workers))) => Ok(workers),
                Ok(Some(FromNode::Refused(why))) => Err(LinkError::Refused(why)),
                Ok(Some(other)) => Err(LinkError::Unexpected(other.kind())),
                Ok(None) => Err(LinkError::Closed),
                Err(e) => Err(LinkError::Unreadable(e)),
            }
        })
        .await
        .unwrap_or_else(|_| Err(LinkError::Timeout(CONNECT_TIMEOUT.as_secs())))
    })
}

/// The node's answer to an attach: the worker's backend info, or why not.
async fn answer(stream: &mut Box<dyn Stream>) -> Result<BackendInfo, (&'static str, LinkError)> {
    match read_frame::<FromNode>(stream, MAX_FRAME_BYTES).await {
        Ok(Some(FromNode::Attached(info))) => Ok(info),
        Ok(Some(FromNode::Refused(why))) => Err(("refused", LinkError::Refused(why))),
        Ok(Some(other)) => Err(("refused", LinkError::Unexpected(other.kind()))),
        Ok(None) => Err(("closed", LinkError::Closed)),
        Err(e) => Err(("closed", LinkError::Unreadable(e))),
    }
}

/// What the reader hands the worker thread.
enum Incoming {
    Reply {
        kv_length: u64,
        value: Result<Value, BackendError>,
    },
    /// The link is gone, and why.
    Gone(String),
}

/// What the writer sends.
enum Outgoing {
    Frame(Box<ToNode>),
    /// The backend was dropped: close the link.
    Close,
}

/// The any-thread half, shared with the BackendActor.
struct Shared {
    out: tmpsc::UnboundedSender<Outgoing>,
    kv_length: AtomicU64,
    death: Mutex<Option<oneshot::Receiver<String>>>,
    /// Granted by a cluster's store for one session: released by closing the link.
    one_session: bool,
    /// The link is being closed on purpose (released, or the backend dropped): its end is
    /// neither a failure nor a death.
    closing: Arc<AtomicBool>,
}

impl Shared {
    fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        let _ = self.out.send(Outgoing::Close);
    }
}

impl BackendControl for Shared {
    fn interrupt(&self) {
        let _ = self.out.send(Outgoing::Frame(Box::new(ToNode::Call(ToHost::Interrupt))));
    }
    fn set_force_listen(&self, on: bool) {
        let _ = self.out.send(Outgoing::Frame(Box::new(ToNode::Call(ToHost::ForceListen(on)))));
    }
    fn kv_length(&self) -> u64 {
        self.kv_length.load(Ordering::Relaxed)
    }
    fn never_blocks(&self) -> bool {
        true // each call queues a frame for the link's writer
    }
    fn terminate(&self) {
        let _ = self.out.send(Outgoing::Frame(Box::new(ToNode::Terminate)));
    }
    fn release_now(&self) {
        if self.one_session {
            self.close();
        }
    }
    fn take_death_notice(&self) -> Option<oneshot::Receiver<String>> {
        self.death.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// One of a node's workers, attached to this gateway.
pub struct RemoteBackend {
    /// `NODE/WORKER`, for errors.
    name: String,
    node: String,
    info: BackendInfo,
    replies: mpsc::Receiver<Incoming>,
    shared: Arc<Shared>,
}

impl RemoteBackend {
    /// Attaches worker `worker` of the node. A node that is down, or a worker it cannot
    /// lend now, is [`BackendError::Unavailable`]: the gateway keeps trying.
    /// In a cluster, `grant` is the store's grant of the worker (the node checks its nonce);
    /// a grant the node pushed on a link kept open to it is [`RemoteBackend::pushed`].
    pub fn attach(
        link: &NodeLink,
        worker: &str,
        gateway: &str,
        grant: Option<AttachGrant>,
    ) -> Result<RemoteBackend, BackendError> {
        let name = format!("{}/{worker}", link.name);
        let failure = |reason: &str, why: LinkError| {
            metrics().node_link_failures.with_label_values(&[link.name.as_str(), reason]).inc();
            BackendError::Unavailable(format!("node {} ({}): {why}", link.name, link.address))
        };
        let one_session = grant.is_some();
        let request = Request::Attach { worker: worker.to_string(), gateway: gateway.to_string(), grant };
        let attached = io().block_on(async {
            timeout(CONNECT_TIMEOUT, async {
                let mut stream = connect(link, request).await.map_err(|e| (e.reason(), e))?;
                let info = answer(&mut stream).await?;
                if one_session {
                    metrics().node_attaches.with_label_values(&[link.name.as_str(), "opened"]).inc();
                }
                Ok((stream, info))
            })
            .await
            .unwrap_or_else(|_| Err(("unreachable", LinkError::Timeout(CONNECT_TIMEOUT.as_secs()))))
        });
        let (stream, info) = attached.map_err(|(reason, why)| failure(reason, why))?;
        let (rd, wr) = tokio::io::split(stream);
        Ok(RemoteBackend::serve(link, name, frames(rd), wr, info, one_session))
    }

    /// The worker granted under `nonce`, if its node pushed the grant on a link `standby` keeps
    /// open to it: attached already, served on that link (for one session). Links are kept
    /// open to the node from now on either way.
    pub fn pushed(link: &NodeLink, worker: &str, nonce: &str, standby: &Arc<Standby>) -> Option<RemoteBackend> {
        standby.watch(link);
        let p = standby.take_pushed(nonce)?;
        metrics().node_attaches.with_label_values(&[link.name.as_str(), "pushed"]).inc();
        Some(RemoteBackend::serve(link, format!("{}/{worker}", link.name), p.frames, p.wr, p.info, true))
    }

    /// Serves an attached link: its writer and reader tasks.
    fn serve<R, W>(
        link: &NodeLink,
        name: String,
        frames: Frames<R>,
        wr: W,
        info: BackendInfo,
        one_session: bool,
    ) -> RemoteBackend
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, out_rx) = tmpsc::unbounded_channel();
        let (replies_tx, replies) = mpsc::channel();
        let (death_tx, death) = oneshot::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            out,
            kv_length: AtomicU64::new(0),
            death: Mutex::new(Some(death)),
            one_session,
            closing: closing.clone(),
        });
        io().spawn(write_loop(wr, out_rx, link.heartbeat_interval));
        io().spawn(read_loop(frames, replies_tx, death_tx, closing, link.clone(), name.clone()));
        metrics().node_links.with_label_values(&[link.name.as_str()]).inc();
        log::info!("worker {name}: attached ({})", info.name);
        RemoteBackend { name, node: link.name.clone(), info, replies, shared }
    }

    fn call(&mut self, call: ToHost) -> Result<Value, BackendError> {
        if self.shared.out.send(Outgoing::Frame(Box::new(ToNode::Call(call)))).is_err() {
            return Err(BackendError::Crashed(format!("worker {}: the link to its node is closed", self.name)));
        }
        match self.replies.recv() {
            Ok(Incoming::Reply { kv_length, value }) => {
                self.shared.kv_length.store(kv_length, Ordering::Relaxed);
                value
            }
            Ok(Incoming::Gone(why)) => Err(BackendError::Crashed(format!("worker {}: {why}", self.name))),
            Err(_) => Err(BackendError::Crashed(format!("worker {}: the link to its node is closed", self.name))),
        }
    }

    fn unexpected(&self, call: &str, got: Value) -> BackendError {
        BackendError::Internal(format!("worker {}: {call} answered {got:?}", self.name))
    }
}

impl Drop for RemoteBackend {
    fn drop(&mut self) {
        self.shared.close();
        metrics().node_links.with_label_values(&[self.node.as_str()]).dec();
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: tmpsc::UnboundedReceiver<Outgoing>, interval: Duration) {
    let mut next_ping = Instant::now() + interval;
    loop {
        let frame = tokio::select! {
            m = rx.recv() => match m {
                Some(Outgoing::Frame(frame)) => *frame,
                Some(Outgoing::Close) | None => break,
            },
            _ = tokio::time::sleep_until(next_ping) => ToNode::Ping,
        };
        if write_frame(&mut wr, &frame).await.is_err() {
            break;
        }
        next_ping = Instant::now() + interval;
    }
    let _ = wr.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut frames: Frames<R>,
    replies: mpsc::Sender<Incoming>,
    death: oneshot::Sender<String>,
    closing: Arc<AtomicBool>,
    link: NodeLink,
    name: String,
) {
    let (reason, why) = loop {
        match timeout(link.heartbeat_timeout, next_frame::<FromNode, _>(&mut frames)).await {
            Ok(Ok(Some(FromNode::Reply { kv_length, value }))) => {
                if replies.send(Incoming::Reply { kv_length, value }).is_err() {
                    return; // the backend was dropped
                }
            }
            Ok(Ok(Some(FromNode::Ping))) => {}
            Ok(Ok(Some(other))) => break ("closed", format!("unexpected message {}", other.kind())),
            Ok(Ok(None)) => break ("closed", "the node closed the link".to_string()),
            Ok(Err(e)) => break ("closed", format!("the link failed: {e}")),
            Err(_) => {
                break (
                    "heartbeat",
                    format!(
                        "nothing from node {} ({}) for {:.1} s (heartbeat_timeout_s): it is down or cut off",
                        link.name,
                        link.address,
                        link.heartbeat_timeout.as_secs_f64()
                    ),
                );
            }
        }
    };
    if closing.load(Ordering::Relaxed) || replies.send(Incoming::Gone(why.clone())).is_err() {
        return; // released or dropped: the link was closed on purpose
    }
    log::error!("worker {name}: {why}");
    metrics().node_link_failures.with_label_values(&[link.name.as_str(), reason]).inc();
    let _ = death.send(why);
}

impl Backend for RemoteBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }
    fn prepare(&mut self, setup: &SessionSetup) -> Result<(), BackendError> {
        self.call(ToHost::Prepare(setup.clone())).map(|_| ())
    }
    fn reset(&mut self) -> Result<(), BackendError> {
        self.call(ToHost::Reset).map(|_| ())
    }
    /// A worker granted for one session goes back to its node at once: the link closes, and
    /// the node resets the backend and offers the worker again (no reset round trip first).
    fn release(&mut self) -> Result<(), BackendError> {
        if self.shared.one_session {
            self.shared.close();
            return Ok(());
        }
        self.reset()
    }
    fn duplex_prefill(&mut self, chunk: &DuplexChunk) -> Result<(), BackendError> {
        self.call(ToHost::DuplexPrefill(chunk.clone())).map(|_| ())
    }
    fn duplex_generate(&mut self) -> Result<StepPiece, BackendError> {
        match self.call(ToHost::DuplexGenerate)? {
            Value::Piece(p) => Ok(p),
            other => Err(self.unexpected("duplex_generate", other)),
        }
    }
    fn duplex_drain(&mut self) -> Result<Option<StepPiece>, BackendError> {
        match self.call(ToHost::DuplexDrain)? {
            Value::MaybePiece(p) => Ok(p),
            other => Err(self.unexpected("duplex_drain", other)),
        }
    }
    fn duplex_finalize(&mut self) -> Result<(), BackendError> {
        self.call(ToHost::DuplexFinalize).map(|_| ())
    }
    fn duplex_step(&mut self, chunk: &DuplexChunk) -> Result<StepOutcome, BackendError> {
        match self.call(ToHost::DuplexStep(chunk.clone()))? {
            Value::Outcome(o) => Ok(o),
            other => Err(self.unexpected("duplex_step", other)),
        }
    }
    fn turn_prefill(&mut self, input: &TurnInput) -> Result<(), BackendError> {
        self.call(ToHost::TurnPrefill(input.clone())).map(|_| ())
    }
    fn turn_generate(&mut self) -> Result<TurnPiece, BackendError> {
        match self.call(ToHost::TurnGenerate)? {
            Value::Turn(t) => Ok(t),
            other => Err(self.unexpected("turn_generate", other)),
        }
    }
    fn control(&self) -> Arc<dyn BackendControl> {
        self.shared.clone()
    }
}
