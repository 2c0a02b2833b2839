//! Links to a cluster's nodes opened ahead of their grants (a replica's side of
//! [`ToNode::Standby`]).
//!
//! A worker a store grants to one of this replica's clients is attached over a link of its
//! own. Opening that link when the grant arrives (TCP, TLS, the hello) puts a connect between
//! a worker's release and the next client's `session.queue_done`; under load it was most of
//! the hand-over's tail (docs/performance.md, "Replicas on Redis"). So each node a grant came
//! from gets `cluster.standby_links` links opened and said hello on ahead of time: a grant
//! takes one and attaches with one frame, and a keeper task opens another behind it. Idle
//! links are pinged every heartbeat interval (the node answers each ping), so a link that died
//! with its node is dropped before a grant can take it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use omni_actors::metrics::metrics;
use tokio::sync::Notify;
use tokio::time::timeout;

use super::remote::{CONNECT_TIMEOUT, Stream, connect, io};
use crate::config::NodeLink;
use crate::node::wire::{FromNode, PROTOCOL, ToNode, read_frame, write_frame};

/// A node whose links could not be opened this many times in a row is forgotten (its
/// keeper ends) until a grant from it comes again.
const GIVE_UP_AFTER: u32 = 30;
/// The longest pause between two attempts to open a link to a node that refuses them.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The idle links of one replica, per node address.
pub struct Standby {
    per_node: usize,
    /// Names this gateway in the nodes' logs.
    gateway: String,
    nodes: Mutex<HashMap<String, Arc<Kept>>>,
}

/// The idle links to one node, and what wakes its keeper.
struct Kept {
    link: NodeLink,
    idle: Mutex<Vec<Box<dyn Stream>>>,
    taken: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kept {
    /// Takes an idle link (the first: the one pinged longest ago, or the last one pushed).
    fn pop(&self, oldest: bool) -> Option<Box<dyn Stream>> {
        let mut idle = lock(&self.idle);
        let stream = match (idle.is_empty(), oldest) {
            (true, _) => None,
            (false, true) => Some(idle.remove(0)),
            (false, false) => idle.pop(),
        };
        self.count(idle.len());
        stream
    }

    fn push(&self, stream: Box<dyn Stream>) {
        let mut idle = lock(&self.idle);
        idle.push(stream);
        self.count(idle.len());
    }

    fn count(&self, ready: usize) {
        metrics().node_standby_links.with_label_values(&[self.link.address.as_str()]).set(ready as i64);
    }
}

impl Standby {
    /// Keeps `per_node` idle links to each node a grant came from (0: none, every grant
    /// opens its link).
    pub fn new(per_node: usize, gateway: String) -> Arc<Standby> {
        Arc::new(Standby { per_node, gateway, nodes: Mutex::new(HashMap::new()) })
    }

    /// An idle link to `link.address`, said hello on, if one is ready. From the first call
    /// for an address on, links to it are kept open.
    pub(super) fn take(self: &Arc<Self>, link: &NodeLink) -> Option<Box<dyn Stream>> {
        if self.per_node == 0 {
            return None;
        }
        let kept = {
            let mut nodes = lock(&self.nodes);
            nodes
                .entry(link.address.clone())
                .or_insert_with(|| {
                    let kept =
                        Arc::new(Kept { link: link.clone(), idle: Mutex::new(Vec::new()), taken: Notify::new() });
                    io().spawn(keep(self.clone(), kept.clone()));
                    kept
                })
                .clone()
        };
        let stream = kept.pop(false);
        kept.taken.notify_one();
        stream
    }

    /// Opens one link: the hello, answered `Ready` once the node checked the token.
    async fn open(&self, link: &NodeLink) -> Result<Box<dyn Stream>, String> {
        let hello = ToNode::Standby { protocol: PROTOCOL, token: link.token.clone(), gateway: self.gateway.clone() };
        let opened = timeout(CONNECT_TIMEOUT, async {
            let mut stream = connect(link, &hello).await?;
            match read_frame::<FromNode>(&mut stream, &mut Vec::new()).await {
                Ok(Some(FromNode::Ready)) => Ok(stream),
                Ok(Some(FromNode::Refused(why))) => Err(format!("refused: {why}")),
                Ok(Some(other)) => Err(format!("unexpected answer {other:?}")),
                Ok(None) => Err("closed without an answer (a node of an older release?)".into()),
                Err(e) => Err(format!("unreadable answer: {e}")),
            }
        });
        opened.await.unwrap_or_else(|_| Err(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())))
    }
}

/// One ping and its answer within the link's heartbeat timeout.
async fn alive(stream: &mut Box<dyn Stream>, link: &NodeLink) -> bool {
    let ping = async {
        write_frame(stream, &ToNode::Ping).await.ok()?;
        match read_frame::<FromNode>(stream, &mut Vec::new()).await {
            Ok(Some(FromNode::Ping)) => Some(()),
            _ => None,
        }
    };
    matches!(timeout(link.heartbeat_timeout, ping).await, Ok(Some(())))
}

/// Keeps `standby.per_node` idle links to one node: opens them (again when one is taken or
/// found dead; after a failure, again after a backoff), pings the idle ones every heartbeat
/// interval.
async fn keep(standby: Arc<Standby>, kept: Arc<Kept>) {
    use tokio::time::{Instant, sleep_until};
    let link = &kept.link;
    let mut failures = 0u32;
    let mut retry_at = Instant::now();
    // Pings are due on their own clock: grants taking links often must not put them off (an
    // idle link the node hears nothing on is closed after its heartbeat timeout).
    let mut next_ping = Instant::now() + link.heartbeat_interval;
    loop {
        while failures == 0 || Instant::now() >= retry_at {
            if lock(&kept.idle).len() >= standby.per_node {
                break;
            }
            match standby.open(link).await {
                Ok(stream) => {
                    kept.push(stream);
                    failures = 0;
                }
                Err(why) => {
                    failures += 1;
                    if failures == 1 {
                        log::warn!("node {}: cannot keep a link open ahead of grants: {why}", link.address);
                    }
                    if failures >= GIVE_UP_AFTER {
                        log::warn!(
                            "node {}: no link kept open ({failures} attempts failed); grants open their own",
                            link.address
                        );
                        lock(&standby.nodes).remove(&link.address);
                        kept.count(0);
                        return;
                    }
                    retry_at = Instant::now() + MAX_BACKOFF.min(Duration::from_millis(200) * failures);
                }
            }
        }
        if failures == 0 {
            tokio::select! {
                _ = kept.taken.notified() => continue,
                _ = sleep_until(next_ping) => {}
            }
        } else {
            sleep_until(retry_at.min(next_ping)).await;
        }
        if Instant::now() < next_ping {
            continue;
        }
        next_ping = Instant::now() + link.heartbeat_interval;
        // One link out of the pool at a time while it is pinged: a grant meanwhile finds the rest.
        let count = lock(&kept.idle).len();
        for _ in 0..count {
            let Some(mut stream) = kept.pop(true) else { break };
            if alive(&mut stream, link).await {
                kept.push(stream);
            } else {
                log::info!("node {}: a link kept open ahead of grants died; opening another", link.address);
            }
        }
    }
}
