//! A node's side of a new connection from a gateway: TLS (with `[node.tls]`), then the hello
//! (its token and protocol checked, read with a small frame limit), then what the hello asks:
//! discovery is answered here; a worker link or a link kept open for grants becomes a
//! [`GatewayLink`] (protocol in [`crate::link::wire`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use actix::prelude::*;
use futures_util::StreamExt;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::FramedRead;

use super::link::{GatewayLink, Limited, LinkParts, LinkSettings, write_loop};
use super::messages::{Borrow, Describe, LenderPort, Refusal};
use crate::link::wire::{FromNode, MAX_HELLO_BYTES, PROTOCOL, ToNode, write_frame};

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// What every connection of a node shares.
#[derive(Clone)]
pub struct Door {
    pub token: Arc<str>,
    pub lender: LenderPort,
    pub links: LinkSettings,
    pub tls: Option<TlsAcceptor>,
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
        let _ = stream.set_nodelay(true);
        let door = door.clone();
        actix::spawn(async move {
            let peer = peer.to_string();
            match door.tls.clone() {
                None => connection(stream, peer, door).await,
                Some(acceptor) => match timeout(door.links.heartbeat_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => connection(tls, peer, door).await,
                    Ok(Err(e)) => log::warn!("node: {peer}: TLS handshake failed: {e}"),
                    Err(_) => log::warn!("node: {peer}: TLS handshake timed out"),
                },
            }
        });
    }
}

/// Whether a hello may go on: its kind, token and protocol.
fn admit(hello: &ToNode, token: &str) -> Result<(), Refusal> {
    let (given, protocol) = match hello {
        ToNode::Discover { token, protocol }
        | ToNode::Attach { token, protocol, .. }
        | ToNode::Standby { token, protocol, .. } => (token, *protocol),
        _ => return Err(Refusal::NotAHello),
    };
    if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
        return Err(Refusal::WrongToken);
    }
    if protocol != PROTOCOL {
        return Err(Refusal::Protocol { theirs: protocol, ours: PROTOCOL });
    }
    Ok(())
}

/// Serves one connection's hello, then hands it over.
async fn connection<S>(stream: S, peer: String, door: Door)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
    // Small frames only until the worker is attached (the token checked, the link granted).
    let max_frame = Arc::new(AtomicUsize::new(MAX_HELLO_BYTES));
    let mut frames = FramedRead::new(rd, Limited::new(max_frame.clone()));
    let first = match timeout(door.links.heartbeat_timeout, frames.next()).await {
        Ok(Some(Ok(body))) => match postcard::from_bytes::<ToNode>(&body) {
            Ok(first) => first,
            Err(e) => return log::warn!("node: {peer}: unreadable hello: {e}"),
        },
        Ok(None) => return,
        Ok(Some(Err(e))) => return log::warn!("node: {peer}: unreadable hello: {e}"),
        Err(_) => return log::warn!("node: {peer}: no hello within {:?}", door.links.heartbeat_timeout),
    };
    if let Err(why) = admit(&first, &door.token) {
        log::warn!("node: {peer}: refused: {why}");
        let _ = write_frame(&mut wr, &FromNode::Refused(why.to_string())).await;
        return;
    }
    let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    match first {
        ToNode::Discover { .. } => {
            let workers = door.lender.describe.send(Describe).await.unwrap_or_default();
            let _ = write_frame(&mut wr, &FromNode::Workers(workers)).await;
            let _ = wr.shutdown().await;
        }
        ToNode::Standby { gateway, .. } => {
            if write_frame(&mut wr, &FromNode::Ready).await.is_err() {
                return;
            }
            let parts = door.parts(link, wr, max_frame);
            GatewayLink::create(move |ctx| {
                ctx.add_stream(frames);
                GatewayLink::standby(parts, gateway, &peer)
            });
        }
        ToNode::Attach { worker, gateway, grant, .. } => {
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
        _ => {}
    }
}
