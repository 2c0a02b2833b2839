//! A node's side of a new connection from a gateway: TLS (with `[node.tls]`), then the
//! handshake ([`crate::link::handshake`]: the node proves it holds its token, the gateway proves
//! it too with its request), then what the request asks: discovery is answered here; a worker
//! link or a link kept open for grants becomes a [`GatewayLink`] (protocol in
//! [`crate::link::wire`]).
//!
//! Until a peer has proved it holds the token it gets little: [`HELLO_TIMEOUT`] to do so,
//! frames of [`MAX_HELLO_BYTES`], and a place among at most [`MAX_UNPROVEN`] such connections,
//! [`MAX_UNPROVEN_PER_ADDRESS`] from one address (one /64 for IPv6). Connections over either
//! cap are closed at once: idle connections from strangers cannot use up the descriptors a
//! gateway's connection needs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use actix::prelude::*;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::FramedRead;

use super::link::{GatewayLink, Limited, LinkParts, LinkSettings, write_loop};
use super::messages::{Borrow, Describe, LenderPort};
use crate::link::handshake::{self, HelloRefused};
use crate::link::wire::{FromNode, MAX_HELLO_BYTES, Request, write_frame};

/// How long a new connection has for TLS and the handshake.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections whose peer has not proved it holds the token yet, at most.
pub const MAX_UNPROVEN: usize = 256;
/// Of those, from one address (one /64 for IPv6), at most.
pub const MAX_UNPROVEN_PER_ADDRESS: usize = 16;

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// What every connection of a node shares.
#[derive(Clone)]
pub struct Door {
    pub token: Arc<str>,
    pub lender: LenderPort,
    pub links: LinkSettings,
    pub tls: Option<TlsAcceptor>,
    pub unproven: Arc<Unproven>,
}

/// The connections whose peer has not proved it holds the token yet, in all and per address.
#[derive(Default)]
pub struct Unproven {
    per_address: Mutex<HashMap<IpAddr, usize>>,
}

/// A place among the unproven connections, given back when dropped.
pub struct Place {
    of: Arc<Unproven>,
    address: IpAddr,
}

impl Unproven {
    /// A place for a connection from `ip` (an IPv6 /64 counts as one address), unless either
    /// cap is reached.
    pub fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let address = crate::net::counted_as(ip);
        let mut per = self.per_address.lock();
        let total: usize = per.values().sum();
        let here = per.get(&address).copied().unwrap_or(0);
        if total >= MAX_UNPROVEN || here >= MAX_UNPROVEN_PER_ADDRESS {
            return None;
        }
        per.insert(address, here + 1);
        Some(Place { of: self.clone(), address })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut per = self.of.per_address.lock();
        if let Some(n) = per.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.address);
            }
        }
    }
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
pub async fn accept_loop(listener: TcpListener, door: Door) {
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
            log::debug!("node: {peer}: too many connections still to prove their token; closed");
            continue; // dropped: closed at once
        };
        let _ = stream.set_nodelay(true);
        let door = door.clone();
        actix::spawn(async move {
            let peer = peer.to_string();
            let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
            match door.tls.clone() {
                None => connection(stream, peer, door, place, deadline).await,
                Some(acceptor) => match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => connection(tls, peer, door, place, deadline).await,
                    Ok(Err(e)) => log::warn!("node: {peer}: TLS handshake failed: {e}"),
                    Err(_) => log::warn!("node: {peer}: TLS handshake timed out"),
                },
            }
        });
    }
}

/// Serves one connection's handshake, then what its request asks.
async fn connection<S>(mut stream: S, peer: String, door: Door, place: Place, deadline: tokio::time::Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let request = match tokio::time::timeout_at(deadline, handshake::accept(&mut stream, &door.token)).await {
        Ok(Ok(request)) => request,
        Ok(Err(HelloRefused::Closed)) => return,
        Ok(Err(why)) => {
            log::warn!("node: {peer}: refused: {why}");
            if matches!(why, HelloRefused::Protocol { .. } | HelloRefused::WrongToken) {
                let _ = write_frame(&mut stream, &FromNode::Refused(why.to_string())).await;
            }
            return;
        }
        Err(_) => return log::warn!("node: {peer}: no handshake within {HELLO_TIMEOUT:?}"),
    };
    drop(place); // proved: it no longer counts against strangers' caps
    let (rd, mut wr) = tokio::io::split(stream);
    // Small frames only until a worker is attached to the link.
    let max_frame = Arc::new(AtomicUsize::new(MAX_HELLO_BYTES));
    let frames = FramedRead::new(rd, Limited::new(max_frame.clone()));
    let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    match request {
        Request::Discover => {
            let workers = door.lender.describe.send(Describe).await.unwrap_or_default();
            let _ = write_frame(&mut wr, &FromNode::Workers(workers)).await;
            let _ = wr.shutdown().await;
        }
        Request::Standby { gateway } => {
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
            let gateway = format!("{gateway} at {peer}");
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
