//! A node's side of one connection from a gateway: the hello (token and protocol checked),
//! then discovery, a link kept open for a grant the node pushes, or a worker link with its
//! heartbeat (protocol in [`super::wire`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use omni_actors::edge::backend::BackendControl;

use super::Node;
use super::worker::{Job, NodeWorker};
use crate::backend::ipc::{MAX_FRAME_BYTES, ToHost};
use crate::link::wire::{Frames, FromNode, MAX_HELLO_BYTES, PROTOCOL, ToNode, frames_up_to, next_frame, write_frame};

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// Serves one connection until it ends. `peer` names it in logs.
pub async fn connection<S>(stream: S, peer: String, node: Arc<Node>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
    // Small frames only until the worker is attached (the token checked, the link granted).
    let mut frames = frames_up_to(rd, MAX_HELLO_BYTES);
    let first = match timeout(node.heartbeat_timeout, next_frame::<ToNode, _>(&mut frames)).await {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return log::warn!("node: {peer}: unreadable hello: {e}"),
        Err(_) => return log::warn!("node: {peer}: no hello within {:?}", node.heartbeat_timeout),
    };
    if let Err(why) = admit(&first, &node) {
        log::warn!("node: {peer}: refused: {why}");
        let _ = write_frame(&mut wr, &FromNode::Refused(why)).await;
        return;
    }
    let refuse = |why: String| FromNode::Refused(why);
    match first {
        ToNode::Discover { .. } => {
            let workers = node.workers.iter().map(|w| w.describe()).collect();
            let _ = write_frame(&mut wr, &FromNode::Workers(workers)).await;
            let _ = wr.shutdown().await;
        }
        ToNode::Standby { gateway, .. } => match standby(&mut frames, &mut wr, &node, &gateway, &peer).await {
            Ok((w, link, control)) => serve(frames, wr, &node, &w, link, control).await,
            Err(why) => log::debug!("node: {peer}: link kept open by {gateway} ended: {why}"),
        },
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
            serve(frames, wr, &node, &w, link, control).await;
        }
        _ => {}
    }
}

/// Serves worker `w`'s link `link` (attached) until it ends, then frees the worker.
async fn serve<R, W>(
    mut frames: Frames<R>,
    wr: W,
    node: &Node,
    w: &Arc<NodeWorker>,
    link: u64,
    control: Arc<dyn BackendControl>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    frames.decoder_mut().set_max_frame_length(MAX_FRAME_BYTES);
    // Replies (from the owner thread) and pings go out through one writer.
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_loop(wr, rx, node.heartbeat_interval));
    let why = loop {
        match timeout(node.heartbeat_timeout, next_frame::<ToNode, _>(&mut frames)).await {
            Ok(Ok(Some(ToNode::Call(ToHost::Interrupt)))) => control.interrupt(),
            Ok(Ok(Some(ToNode::Call(ToHost::ForceListen(on))))) => control.set_force_listen(on),
            Ok(Ok(Some(ToNode::Call(call)))) => w.submit(Job::Call { call, link, reply: tx.clone() }),
            Ok(Ok(Some(ToNode::Terminate))) => {
                log::warn!("node: worker {}: the gateway ended its backend (its step watchdog)", w.name);
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

/// Whether a hello may go on: its kind, token and protocol.
fn admit(hello: &ToNode, node: &Node) -> Result<(), String> {
    let (token, protocol) = match hello {
        ToNode::Discover { token, protocol }
        | ToNode::Attach { token, protocol, .. }
        | ToNode::Standby { token, protocol, .. } => (token, *protocol),
        _ => return Err("the first message must be Discover, Attach or Standby".into()),
    };
    if !bool::from(token.as_bytes().ct_eq(node.token.as_bytes())) {
        return Err("wrong token (the gateway's [[nodes]] token must be the node's [node] token)".into());
    }
    if protocol != PROTOCOL {
        return Err(format!(
            "the gateway speaks node protocol {protocol}, this node {PROTOCOL}: run the same release on both"
        ));
    }
    Ok(())
}

/// A link kept open by replica `replica`: `Ready`, then each ping answered until the node
/// pushes a grant on it ([`super::push`]): the worker is attached to the link and the replica
/// told ([`FromNode::Granted`]); returned to be served. Anything else ends the link.
async fn standby<R, W>(
    frames: &mut Frames<R>,
    wr: &mut W,
    node: &Node,
    replica: &str,
    peer: &str,
) -> Result<(Arc<NodeWorker>, u64, Arc<dyn BackendControl>), String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    write_frame(wr, &FromNode::Ready).await.map_err(|e| e.to_string())?;
    let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    let (_registered, mut grants) = node.pushes.register(replica, link);
    let mut heard = Instant::now();
    loop {
        tokio::select! {
            push = grants.recv() => {
                let Some(push) = push else { return Err("taken for a grant that never came".into()) };
                let w = push.worker;
                let (info, control) = match w.attach(link, &format!("{replica} at {peer}"), Some(&push.grant)) {
                    Ok(attached) => attached,
                    Err(why) => {
                        let _ = push.done.send(false);
                        return Err(format!("a grant pushed on it was refused: {why}"));
                    }
                };
                if let Err(e) = write_frame(wr, &FromNode::Granted { grant: push.pushed, info }).await {
                    let _ = push.done.send(false);
                    w.detach(link, "the replica left before it was told of its grant");
                    return Err(e.to_string());
                }
                let _ = push.done.send(true);
                return Ok((w, link, control));
            }
            // Cancel safe: a frame half read stays in `frames`.
            frame = tokio::time::timeout_at(heard + node.heartbeat_timeout, next_frame::<ToNode, _>(frames)) => {
                match frame {
                    Ok(Ok(Some(ToNode::Ping))) => {
                        heard = Instant::now();
                        write_frame(wr, &FromNode::Ping).await.map_err(|e| e.to_string())?;
                    }
                    Ok(Ok(Some(other))) => {
                        let why = format!("unexpected message {other:?} on a link kept open for grants");
                        let _ = write_frame(wr, &FromNode::Refused(why.clone())).await;
                        return Err(why);
                    }
                    Ok(Ok(None)) => return Err("closed".into()),
                    Ok(Err(e)) => return Err(format!("the link failed: {e}")),
                    Err(_) => return Err(format!("nothing for {:.1} s", node.heartbeat_timeout.as_secs_f64())),
                }
            }
        }
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
