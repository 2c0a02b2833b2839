//! A node's side of one connection from a gateway: the hello (token and protocol checked),
//! then discovery or a worker link with its heartbeat (protocol in [`super::wire`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use super::Node;
use super::wire::{FromNode, PROTOCOL, ToNode, read_frame, write_frame};
use super::worker::Job;
use crate::backend::ipc::ToHost;

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// Serves one connection until it ends. `peer` names it in logs.
pub async fn connection<S>(stream: S, peer: String, node: Arc<Node>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = Vec::new();
    let first = match timeout(node.heartbeat_timeout, read_frame::<ToNode>(&mut rd, &mut buf)).await {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return log::warn!("node: {peer}: unreadable hello: {e}"),
        Err(_) => return log::warn!("node: {peer}: no hello within {:?}", node.heartbeat_timeout),
    };
    let refuse = |why: String| FromNode::Refused(why);
    let (token, protocol) = match &first {
        ToNode::Discover { token, protocol } | ToNode::Attach { token, protocol, .. } => (token, *protocol),
        _ => {
            let _ = write_frame(&mut wr, &refuse("the first message must be Discover or Attach".into())).await;
            return;
        }
    };
    if !bool::from(token.as_bytes().ct_eq(node.token.as_bytes())) {
        log::warn!("node: {peer}: refused: wrong token");
        let _ = write_frame(
            &mut wr,
            &refuse("wrong token (the gateway's [[nodes]] token must be the node's [node] token)".into()),
        )
        .await;
        return;
    }
    if protocol != PROTOCOL {
        let why =
            format!("the gateway speaks node protocol {protocol}, this node {PROTOCOL}: run the same release on both");
        let _ = write_frame(&mut wr, &refuse(why)).await;
        return;
    }
    match first {
        ToNode::Discover { .. } => {
            let workers = node.workers.iter().map(|w| w.describe()).collect();
            let _ = write_frame(&mut wr, &FromNode::Workers(workers)).await;
            let _ = wr.shutdown().await;
        }
        ToNode::Attach { worker, gateway, grant, .. } => {
            let Some(w) = node.workers.iter().find(|w| w.name == worker).cloned() else {
                let _ = write_frame(&mut wr, &refuse(format!("this node has no worker {worker}"))).await;
                return;
            };
            let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
            let gateway = format!("{gateway} at {peer}");
            let (info, control) = match w.attach(link, &gateway, grant.as_ref()) {
                Ok(attached) => attached,
                Err(why) => {
                    log::info!("node: {peer}: attach to {worker} refused: {why}");
                    let _ = write_frame(&mut wr, &refuse(why)).await;
                    return;
                }
            };
            if write_frame(&mut wr, &FromNode::Attached(info)).await.is_err() {
                return w.detach(link, "the gateway left before the attach was answered");
            }
            // Replies (from the owner thread) and pings go out through one writer.
            let (tx, rx) = mpsc::unbounded_channel();
            let writer = tokio::spawn(write_loop(wr, rx, node.heartbeat_interval));
            let why = loop {
                match timeout(node.heartbeat_timeout, read_frame::<ToNode>(&mut rd, &mut buf)).await {
                    Ok(Ok(Some(ToNode::Call(ToHost::Interrupt)))) => control.interrupt(),
                    Ok(Ok(Some(ToNode::Call(ToHost::ForceListen(on))))) => control.set_force_listen(on),
                    Ok(Ok(Some(ToNode::Call(call)))) => w.submit(Job::Call { call, link, reply: tx.clone() }),
                    Ok(Ok(Some(ToNode::Terminate))) => {
                        log::warn!("node: worker {worker}: the gateway ended its backend (its step watchdog)");
                        control.terminate();
                        w.submit(Job::Restart);
                    }
                    Ok(Ok(Some(ToNode::Ping))) => {}
                    Ok(Ok(Some(other))) => break format!("unexpected message {other:?}"),
                    Ok(Ok(None)) => break "the gateway closed the link".to_string(),
                    Ok(Err(e)) => break format!("the link failed: {e}"),
                    Err(_) => {
                        break format!(
                            "nothing from the gateway for {:.1} s (node.heartbeat_timeout_s)",
                            node.heartbeat_timeout.as_secs_f64()
                        );
                    }
                }
            };
            w.detach(link, &why);
            writer.abort();
        }
        _ => {}
    }
}

/// Writes what `rx` carries, and a ping whenever nothing was written for `interval`.
async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::UnboundedReceiver<FromNode>, interval: Duration) {
    let mut next_ping = Instant::now() + interval;
    loop {
        let message = tokio::select! {
            m = rx.recv() => match m { Some(m) => m, None => break },
            _ = tokio::time::sleep_until(next_ping) => FromNode::Ping,
        };
        if write_frame(&mut wr, &message).await.is_err() {
            break;
        }
        next_ping = Instant::now() + interval;
    }
    let _ = wr.shutdown().await;
}
