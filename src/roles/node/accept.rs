//! A node's side of a new connection from a gateway: TLS (with `[node.tls]`), then the
//! handshake ([`omni_backend_host::link::handshake`]: the node proves it holds its token, the gateway proves
//! it too with its request), then what the request asks: discovery is answered here; a worker
//! link or a link kept open for grants becomes a [`GatewayLink`] (protocol in
//! [`omni_backend_host::link::wire`]).
//!
//! Until a peer has proved it holds the token it gets little: [`HANDSHAKE_TIMEOUT`] to do so,
//! frames of [`MAX_UNPROVEN_FRAME`], and a place among the unproven connections
//! ([`super::unproven`]): idle connections from strangers cannot use up the descriptors a
//! gateway's connection needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use actix::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::FramedRead;

use super::link::{GatewayLink, Limited, LinkParts, LinkSettings, write_loop};
use super::messages::{Borrow, Describe, LenderPort};
use super::unproven::Unproven;
use omni_backend_host::link::handshake::{self, HandshakeRefused, Proved};
use omni_backend_host::link::wire::{FromNode, MAX_UNPROVEN_FRAME, Request, write_frame};

/// How long a new connection has for TLS and the handshake.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// What every connection of a node shares.
#[derive(Clone)]
pub(super) struct Door {
    pub token: Arc<str>,
    /// The replicas this node refuses (`[cluster] revoked_replicas`, read again on SIGHUP).
    pub revoked: Arc<parking_lot::RwLock<Vec<String>>>,
    pub lender: LenderPort,
    pub links: LinkSettings,
    pub tls: Option<TlsAcceptor>,
    pub unproven: Arc<Unproven>,
}

impl Door {
    /// A link's parts: its writer task started on `wr`.
    fn parts<W: AsyncWrite + Unpin + 'static>(&self, id: u64, wr: W, max_frame: Arc<AtomicUsize>) -> LinkParts {
        let (writer, rx) = tokio::sync::mpsc::unbounded_channel();
        actix::spawn(write_loop(wr, rx, self.links.heartbeat_interval));
        LinkParts {
            id,
            lender: self.lender.clone(),
            writer,
            max_frame,
            heartbeat_timeout: self.links.heartbeat_timeout,
        }
    }
}

/// Accepts connections until the node stops.
pub(super) async fn accept_loop(listener: TcpListener, door: Door) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("node: accept failed: {e}");
                actix::clock::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(place) = door.unproven.enter(peer.ip()) else {
            omni_actors::observe::metrics::metrics().node_connections_refused.inc();
            log::debug!("node: {peer}: closed before it proved the token (too many from its address)");
            continue; // dropped: closed at once
        };
        let _ = stream.set_nodelay(true);
        let door = door.clone();
        actix::spawn(async move {
            let peer = peer.to_string();
            let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
            let proved = async {
                match door.tls.clone() {
                    None => {
                        proved(stream, &peer, &door, deadline).await.map(|(s, r)| (Box::new(s) as Box<dyn Stream>, r))
                    }
                    Some(acceptor) => match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            proved(tls, &peer, &door, deadline).await.map(|(s, r)| (Box::new(s) as Box<dyn Stream>, r))
                        }
                        Ok(Err(e)) => {
                            if let Some(more) = omni_actors::observe::gated("node_tls_failed") {
                                log::warn!("node: {peer}: TLS handshake failed: {e}{more}");
                            }
                            None
                        }
                        Err(_) => {
                            if let Some(more) = omni_actors::observe::gated("node_tls_timeout") {
                                log::warn!("node: {peer}: TLS handshake timed out{more}");
                            }
                            None
                        }
                    },
                }
            };
            let outcome = tokio::select! {
                outcome = proved => outcome,
                () = place.evicted() => {
                    omni_actors::observe::metrics::metrics().node_connections_refused.inc();
                    return log::debug!("node: {peer}: closed before it proved the token (its place went to a newer one)");
                }
            };
            drop(place); // proved: it no longer counts against strangers' caps
            if let Some((stream, request)) = outcome {
                serve(stream, request, peer, door).await;
            }
        });
    }
}

/// Either side of a node's connection, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Stream for T {}

/// The connection's handshake: its request, once the peer proved the token.
async fn proved<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: &str,
    door: &Door,
    deadline: tokio::time::Instant,
) -> Option<(S, Proved)> {
    match tokio::time::timeout_at(deadline, handshake::accept(&mut stream, &door.token)).await {
        Ok(Ok(Proved { replica: Some(name), .. })) if door.revoked.read().contains(&name) => {
            omni_actors::observe::metrics().node_handshakes_refused.inc();
            if let Some(more) = omni_actors::observe::gated("node_revoked_replica") {
                log::warn!("node: {peer}: replica {name} refused: it is revoked ([cluster] revoked_replicas){more}");
            }
            let why = format!("replica {name} is revoked on this node");
            let _ = write_frame(&mut stream, &FromNode::Refused(why)).await;
            None
        }
        Ok(Ok(proved)) => Some((stream, proved)),
        Ok(Err(HandshakeRefused::Closed)) => None,
        Ok(Err(why)) => {
            omni_actors::observe::metrics().node_handshakes_refused.inc();
            let reason = match why {
                HandshakeRefused::WrongToken => "node_wrong_token",
                HandshakeRefused::WrongCredential(_) => "node_wrong_credential",
                HandshakeRefused::Protocol { .. } => "node_other_protocol",
                HandshakeRefused::ClosedUnproven => "node_closed_unproven",
                _ => "node_bad_handshake",
            };
            if let Some(more) = omni_actors::observe::gated(reason) {
                log::warn!("node: {peer}: refused: {why}{more}");
            }
            if matches!(
                why,
                HandshakeRefused::Protocol { .. } | HandshakeRefused::WrongToken | HandshakeRefused::WrongCredential(_)
            ) {
                let _ = write_frame(&mut stream, &FromNode::Refused(why.to_string())).await;
            }
            None
        }
        Err(_) => {
            omni_actors::observe::metrics().node_handshakes_refused.inc();
            if let Some(more) = omni_actors::observe::gated("node_handshake_timeout") {
                log::warn!("node: {peer}: no handshake within {HANDSHAKE_TIMEOUT:?}{more}");
            }
            None
        }
    }
}

/// Serves what a proved connection's request asks.
async fn serve(stream: Box<dyn Stream>, proved: Proved, peer: String, door: Door) {
    let Proved { replica, request } = proved;
    let (rd, mut wr) = tokio::io::split(stream);
    // Small frames only until a worker is attached to the link.
    let max_frame = Arc::new(AtomicUsize::new(MAX_UNPROVEN_FRAME));
    let frames = FramedRead::new(rd, Limited::new(max_frame.clone()));
    let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    match request {
        Request::Discover => {
            let workers = door.lender.describe.send(Describe).await.unwrap_or_default();
            let _ = write_frame(&mut wr, &FromNode::Workers(workers)).await;
            let _ = wr.shutdown().await;
        }
        Request::Standby { gateway } => {
            // Grants are pushed by replica name: a link kept open for them is the proved
            // replica's own, or none.
            if replica.as_deref() != Some(gateway.as_str()) {
                omni_actors::observe::metrics().node_handshakes_refused.inc();
                let clipped: String = gateway.chars().take(64).collect();
                let proved_as = replica.as_deref().unwrap_or("a holder of the node's token");
                log::warn!(
                    "node: {peer}: a link kept open for grants of replica {} refused: it proved {proved_as}",
                    clipped.escape_debug()
                );
                let why = "a link kept open for grants must be proved with that replica's own credential";
                let _ = write_frame(&mut wr, &FromNode::Refused(why.into())).await;
                return;
            }
            if write_frame(&mut wr, &FromNode::Ready).await.is_err() {
                return;
            }
            let parts = door.parts(link, wr, max_frame);
            GatewayLink::create(move |ctx| {
                ctx.add_stream(frames);
                GatewayLink::standby(parts, gateway, &peer)
            });
        }
        Request::Attach { worker, gateway, grant } => {
            // A replica is named by what it proved, not by what it says.
            let gateway = format!("{} at {peer}", replica.unwrap_or(gateway));
            let borrow = Borrow { worker: worker.clone(), link, gateway: gateway.clone(), grant };
            let lent = match door.lender.borrow.send(borrow).await {
                Ok(Ok(lent)) => lent,
                Ok(Err(why)) => {
                    log::info!("node: {peer}: attach to {worker} refused: {why}");
                    let _ = write_frame(&mut wr, &FromNode::Refused(why.to_string())).await;
                    return;
                }
                Err(_) => return,
            };
            let parts = door.parts(link, wr, max_frame);
            GatewayLink::create(move |ctx| {
                ctx.add_stream(frames);
                GatewayLink::attach(parts, gateway, lent.worker, lent.mode)
            });
        }
    }
}
