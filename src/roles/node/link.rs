//! GatewayLink: one actor per gateway link, once its handshake proved the token. It is the session of
//! the worker it borrowed: it attaches to the worker's BackendActor, runs the gateway's calls on
//! it as jobs ([`Run`]: in order, one at a time, under the step watchdog), makes the any-thread
//! calls through it at once ([`Control`]), and detaches when the link ends. A link a replica
//! keeps open for grants waits here, answering pings, until the lender pushes one on it.
//!
//! Its frames are read as a stream of the actor; its replies and pings go out through a writer
//! task ([`write_loop`]) that the worker's thread writes to directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use omni_actors::domain::Mode;
use omni_actors::edge::backend::BackendError;
use omni_actors::messages::worker::BackendEvent;
use omni_actors::messages::worker::{Attach, Control, Delivery, Detach, Lost, Run, WorkerLink};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use super::messages::{GiveBack, LenderPort, Push, Revoked, Standby, StandbyEnded};
use omni_backend_host::ipc::{MAX_FRAME_BYTES, ToHost};
use omni_backend_host::link::wire::{FromNode, MAX_UNPROVEN_FRAME, ToNode, write_frame};

/// The link's frames, each at most the current limit: the handshake's ([`MAX_UNPROVEN_FRAME`]) until the
/// link serves a worker, a worker link's after.
pub(super) struct Limited {
    codec: LengthDelimitedCodec,
    max: Arc<AtomicUsize>,
}

impl Limited {
    pub(super) fn new(max: Arc<AtomicUsize>) -> Limited {
        let codec = LengthDelimitedCodec::builder()
            .little_endian()
            .length_field_length(4)
            .max_frame_length(MAX_UNPROVEN_FRAME)
            .new_codec();
        Limited { codec, max }
    }
}

impl Decoder for Limited {
    type Item = BytesMut;
    type Error = std::io::Error;
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, std::io::Error> {
        self.codec.set_max_frame_length(self.max.load(Ordering::Relaxed));
        self.codec.decode(src)
    }
}

/// What a link is doing.
enum Phase {
    /// Kept open for grants by replica `replica`.
    Standby {
        replica: String,
    },
    /// Attaching `worker` for its gateway; `told` answers a push once the worker is attached.
    Attaching {
        worker: WorkerLink,
        pushed: Option<(omni_backend_host::link::wire::PushedGrant, oneshot::Sender<bool>)>,
    },
    Serving {
        worker: WorkerLink,
    },
}

pub(super) struct GatewayLink {
    id: u64,
    /// Names the gateway in logs (`NAME at ADDR`).
    gateway: String,
    lender: LenderPort,
    phase: Phase,
    writer: mpsc::UnboundedSender<FromNode>,
    /// The largest frame read now.
    max_frame: Arc<AtomicUsize>,
    heartbeat_timeout: Duration,
    last_heard: Instant,
    /// Why the link ends, once it does.
    ended: Option<String>,
    mode: Mode,
}

/// What every link of a node shares.
#[derive(Clone)]
pub(super) struct LinkSettings {
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
}

/// What every link is made of: its number, the lender, its writer, its frame limit, and how long
/// the gateway may stay silent.
pub(super) struct LinkParts {
    pub id: u64,
    pub lender: LenderPort,
    pub writer: mpsc::UnboundedSender<FromNode>,
    pub max_frame: Arc<AtomicUsize>,
    pub heartbeat_timeout: Duration,
}

impl GatewayLink {
    fn new(parts: LinkParts, gateway: String, phase: Phase, mode: Mode) -> GatewayLink {
        GatewayLink {
            id: parts.id,
            gateway,
            lender: parts.lender,
            phase,
            writer: parts.writer,
            max_frame: parts.max_frame,
            heartbeat_timeout: parts.heartbeat_timeout,
            last_heard: Instant::now(),
            ended: None,
            mode,
        }
    }

    /// A link that borrowed `worker` for gateway `gateway`: it attaches, answers the gateway,
    /// and serves its calls.
    pub(super) fn attach(parts: LinkParts, gateway: String, worker: WorkerLink, mode: Mode) -> GatewayLink {
        GatewayLink::new(parts, gateway, Phase::Attaching { worker, pushed: None }, mode)
    }

    /// A link replica `replica` keeps open for grants (it was told `Ready`).
    pub(super) fn standby(parts: LinkParts, replica: String, peer: &str) -> GatewayLink {
        GatewayLink::new(parts, format!("{replica} at {peer}"), Phase::Standby { replica }, Mode::Audio)
    }

    fn end(&mut self, ctx: &mut Context<Self>, why: String) {
        if self.ended.is_none() {
            self.ended = Some(why);
        }
        ctx.stop();
    }

    fn send_attach(&mut self, ctx: &mut Context<Self>) {
        let Phase::Attaching { worker, .. } = &self.phase else { return };
        let reply = Delivery::new(ctx.address().recipient(), Lost::Attach);
        worker.port.link.attach.do_send(Attach { key: self.id, label: self.gateway.clone(), mode: self.mode, reply });
    }

    /// The worker is this link's: the gateway is told, and its calls are served.
    fn attached(&mut self, ctx: &mut Context<Self>) {
        if !matches!(self.phase, Phase::Attaching { .. }) {
            return;
        }
        let Phase::Attaching { worker, pushed } =
            std::mem::replace(&mut self.phase, Phase::Standby { replica: String::new() })
        else {
            unreachable!("matched above")
        };
        self.max_frame.store(MAX_FRAME_BYTES, Ordering::Relaxed);
        let info = (*worker.info).clone();
        let answer = match pushed {
            Some((grant, told)) => {
                let _ = told.send(true);
                FromNode::Granted { grant, info }
            }
            None => FromNode::Attached(info),
        };
        self.phase = Phase::Serving { worker };
        if self.writer.send(answer).is_err() {
            self.end(ctx, "the gateway left before the attach was answered".into());
        }
    }

    fn call(&mut self, call: ToHost, ctx: &mut Context<Self>) {
        let Phase::Serving { worker } = &self.phase else {
            return self.end(ctx, "a call before the worker was attached".into());
        };
        let port = &worker.port;
        match call {
            ToHost::Interrupt => port.link.control.do_send(Control::Interrupt { key: self.id }),
            ToHost::ForceListen(on) => port.link.control.do_send(Control::ForceListen { key: self.id, on }),
            call => {
                let writer = self.writer.clone();
                port.link.run.do_send(Run {
                    key: self.id,
                    call: Box::new(move |backend| {
                        let value = omni_backend_host::host::serve(backend, call);
                        let crashed = match &value {
                            Err(e @ BackendError::Crashed(_)) => Some(e.clone()),
                            _ => None,
                        };
                        let kv_length = backend.control().kv_length();
                        let _ = writer.send(FromNode::Reply { kv_length, value });
                        crashed.map_or(Ok(()), Err)
                    }),
                });
            }
        }
    }
}

impl Actor for GatewayLink {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match &self.phase {
            Phase::Standby { replica } => {
                let replica = replica.clone();
                let (to, revoked) = (ctx.address().recipient(), ctx.address().recipient());
                self.lender.standby.do_send(Standby { replica, link: self.id, to, revoked });
            }
            Phase::Attaching { .. } => self.send_attach(ctx),
            Phase::Serving { .. } => {}
        }
        let every = (self.heartbeat_timeout / 4).max(Duration::from_millis(100));
        ctx.run_interval(every, |act, ctx| {
            if act.last_heard.elapsed() > act.heartbeat_timeout {
                let why = format!(
                    "nothing from the gateway for {:.1} s (node.heartbeat_timeout_s)",
                    act.heartbeat_timeout.as_secs_f64()
                );
                act.end(ctx, why);
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let why = self.ended.take().unwrap_or_else(|| "the gateway closed the link".into());
        let worker = match std::mem::replace(&mut self.phase, Phase::Standby { replica: String::new() }) {
            Phase::Standby { replica } => {
                log::debug!("node: link {} kept open by {} ended: {why}", self.id, self.gateway);
                return self.lender.standby_ended.do_send(StandbyEnded { replica, link: self.id });
            }
            Phase::Attaching { worker, pushed } => {
                if let Some((_, told)) = pushed {
                    let _ = told.send(false);
                }
                worker
            }
            Phase::Serving { worker } => worker,
        };
        worker.port.link.detach.do_send(Detach { key: self.id, ended: Instant::now() });
        self.lender.give_back.do_send(GiveBack { worker: worker.name.clone(), link: self.id, why });
    }
}

impl StreamHandler<Result<BytesMut, std::io::Error>> for GatewayLink {
    fn handle(&mut self, frame: Result<BytesMut, std::io::Error>, ctx: &mut Context<Self>) {
        let message = match frame.and_then(|body| {
            postcard::from_bytes::<ToNode>(&body).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        }) {
            Ok(m) => m,
            Err(e) => return self.end(ctx, format!("the link failed: {e}")),
        };
        self.last_heard = Instant::now();
        match (&self.phase, message) {
            (_, ToNode::Ping) => {
                if matches!(self.phase, Phase::Standby { .. }) {
                    let _ = self.writer.send(FromNode::Ping);
                }
            }
            (Phase::Serving { .. }, ToNode::Call(call)) => self.call(call, ctx),
            (Phase::Serving { worker }, ToNode::Terminate) => {
                log::warn!("node: worker {}: the gateway ended its backend (its step watchdog)", worker.name);
                worker.port.link.control.do_send(Control::Terminate { key: self.id });
            }
            (Phase::Standby { .. }, other) => {
                let why = format!("unexpected message {} on a link kept open for grants", other.kind());
                let _ = self.writer.send(FromNode::Refused(why.clone()));
                self.end(ctx, why);
            }
            (_, other) => self.end(ctx, format!("unexpected message {}", other.kind())),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.end(ctx, "the gateway closed the link".into());
    }
}

impl Handler<BackendEvent> for GatewayLink {
    type Result = ();
    fn handle(&mut self, event: BackendEvent, ctx: &mut Context<Self>) {
        match event {
            BackendEvent::Attached(Ok(())) => self.attached(ctx),
            BackendEvent::Attached(Err(e)) => {
                if let Phase::Attaching { pushed: None, .. } = &self.phase {
                    let _ = self.writer.send(FromNode::Refused(e.to_string()));
                }
                self.end(ctx, format!("its worker could not be taken: {e}"));
            }
            BackendEvent::Failed { reason } => self.end(ctx, format!("its worker failed: {reason}")),
            // A link drives its backend through calls: the session events never come.
            _ => {}
        }
    }
}

impl Handler<Revoked> for GatewayLink {
    type Result = ();
    fn handle(&mut self, _: Revoked, ctx: &mut Context<Self>) {
        self.end(ctx, "its replica is revoked ([cluster] revoked_replicas)".into());
    }
}

impl Handler<Push> for GatewayLink {
    type Result = ResponseFuture<bool>;
    fn handle(&mut self, msg: Push, ctx: &mut Context<Self>) -> Self::Result {
        if !matches!(self.phase, Phase::Standby { .. }) || self.ended.is_some() {
            return Box::pin(async { false });
        }
        let (told, answer) = oneshot::channel();
        self.gateway = format!("{} for ticket {}", self.gateway, msg.pushed.ticket);
        self.mode = msg.mode;
        self.phase = Phase::Attaching { worker: msg.worker, pushed: Some((msg.pushed, told)) };
        self.send_attach(ctx);
        Box::pin(async move { answer.await.unwrap_or(false) })
    }
}

/// Writes what `rx` carries, and a ping whenever nothing was written for `interval`; shuts the
/// connection down when the link's actor is gone.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<FromNode>,
    interval: Duration,
) {
    let mut next_ping = tokio::time::Instant::now() + interval;
    loop {
        let message = tokio::select! {
            m = rx.recv() => match m { Some(m) => m, None => break },
            _ = tokio::time::sleep_until(next_ping) => FromNode::Ping,
        };
        if write_frame(&mut wr, &message).await.is_err() {
            break;
        }
        next_ping = tokio::time::Instant::now() + interval;
    }
    let _ = wr.shutdown().await;
}
