//! Links a replica of a cluster keeps open to each node, on which the node pushes the grants
//! it makes to this replica's tickets (the replica's side of [`Request::Standby`]).
//!
//! Without them a worker freed on a node reaches the next client through the store (the
//! grant put on this replica's list, its `BLPOP` woken) and an attach (a new link, or one
//! frame and its answer): four hops between processes. With them the node attaches the worker
//! to a link this replica keeps open and says so on it ([`FromNode::Granted`]): the grant
//! arrives already attached, and the replica hands the link to the client's BackendActor
//! (docs/performance.md, "Replicas on Redis").
//!
//! Each node a grant came from gets `cluster.standby_links` links, each read by a task of its
//! own on the `node-io` runtime: pinged every heartbeat interval (the node answers each ping),
//! given up when the node says nothing for the heartbeat timeout, and handed over when a
//! grant arrives on it; a keeper opens another behind each link that ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use omni_actors::domain::BackendInfo;
use omni_actors::edge::coordinator::Grant;
use omni_actors::observe::metrics::metrics;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use crate::link::LinkError;
use crate::link::config::NodeLink;
use crate::link::dial::{CONNECT_TIMEOUT, Stream, connect, io};
use crate::link::wire::{
    Frames, FromNode, MAX_UNPROVEN_FRAME, Request, ToNode, frames, next_frame, read_frame, write_frame,
};

/// A node whose links could not be opened this many times in a row is forgotten (its
/// keeper ends) until a grant from it comes again.
const GIVE_UP_AFTER: u32 = 30;
/// The longest pause between two attempts to open a link to a node that refuses them.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A link with a grant on it that no BackendActor took within this long is closed (its
/// client left, or took another grant): the node frees the worker and offers it again.
const PUSHED_KEPT: Duration = Duration::from_secs(3);

/// A worker's link with the grant pushed on it, until its BackendActor takes it.
pub(crate) struct Pushed {
    pub frames: Frames<ReadHalf<Box<dyn Stream>>>,
    pub wr: WriteHalf<Box<dyn Stream>>,
    pub info: BackendInfo,
}

/// Where grants pushed by nodes go (the replica's queue).
pub type GrantSink = Box<dyn Fn(Grant) + Send + Sync>;

/// The links of one replica, per node address, and the grants pushed on them.
pub struct Standby {
    per_node: usize,
    /// This replica's name in the store (the node pushes by it).
    gateway: String,
    nodes: Mutex<HashMap<String, Arc<Kept>>>,
    /// Links with a grant, by the grant's nonce.
    pushed: Mutex<HashMap<String, Pushed>>,
    sink: OnceLock<GrantSink>,
}

/// The links to one node, and what wakes its keeper.
struct Kept {
    link: NodeLink,
    open: AtomicUsize,
    ended: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kept {
    fn count(&self, delta: isize) {
        let open = if delta > 0 {
            self.open.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.open.fetch_sub(1, Ordering::Relaxed) - 1
        };
        metrics().node_standby_links.with_label_values(&[self.link.address.as_str()]).set(open as i64);
    }
}

impl Standby {
    /// Keeps `per_node` links open to each node a grant came from (0: none, every grant goes
    /// through the store and opens its link).
    pub fn new(per_node: usize, gateway: String) -> Arc<Standby> {
        Arc::new(Standby {
            per_node,
            gateway,
            nodes: Mutex::new(HashMap::new()),
            pushed: Mutex::new(HashMap::new()),
            sink: OnceLock::new(),
        })
    }

    /// Grants pushed from now on go to `sink`.
    pub fn deliver_to(&self, sink: GrantSink) {
        let _ = self.sink.set(sink);
    }

    /// Links are kept open to `link.address` from now on (a grant came from it).
    pub(crate) fn watch(self: &Arc<Self>, link: &NodeLink) {
        if self.per_node == 0 {
            return;
        }
        lock(&self.nodes).entry(link.address.clone()).or_insert_with(|| {
            let kept = Arc::new(Kept { link: link.clone(), open: AtomicUsize::new(0), ended: Notify::new() });
            io().spawn(keep(self.clone(), kept.clone()));
            kept
        });
    }

    /// The link a node pushed the grant of `nonce` on, if it did.
    pub(crate) fn take_pushed(&self, nonce: &str) -> Option<Pushed> {
        lock(&self.pushed).remove(nonce)
    }

    /// Opens one link: the handshake, answered `Ready`.
    async fn open(&self, link: &NodeLink) -> Result<Box<dyn Stream>, LinkError> {
        let request = Request::Standby { gateway: self.gateway.clone() };
        let opened = timeout(CONNECT_TIMEOUT, async {
            let mut stream = connect(link, request).await?;
            match read_frame::<FromNode>(&mut stream, MAX_UNPROVEN_FRAME).await {
                Ok(Some(FromNode::Ready)) => Ok(stream),
                Ok(Some(FromNode::Refused(why))) => Err(LinkError::Refused(why)),
                Ok(Some(other)) => Err(LinkError::Unexpected(other.kind())),
                Ok(None) => Err(LinkError::Closed),
                Err(e) => Err(LinkError::Unreadable(e)),
            }
        });
        opened.await.unwrap_or_else(|_| Err(LinkError::Timeout(CONNECT_TIMEOUT.as_secs())))
    }

    /// A grant arrived on a link: kept for its BackendActor, and handed to the queue.
    fn granted(self: &Arc<Self>, grant: Grant, pushed: Pushed) {
        let nonce = grant.nonce.clone();
        lock(&self.pushed).insert(nonce.clone(), pushed);
        let this = self.clone();
        io().spawn(async move {
            tokio::time::sleep(PUSHED_KEPT).await;
            if this.take_pushed(&nonce).is_some() {
                log::info!("a grant pushed by a node was not taken within {PUSHED_KEPT:?}: its link is closed");
            }
        });
        match self.sink.get() {
            Some(sink) => sink(grant),
            None => drop(self.take_pushed(&grant.nonce)),
        }
    }
}

/// Keeps `standby.per_node` links open to one node: opens them, again when one ends (after a
/// failure, after a backoff).
async fn keep(standby: Arc<Standby>, kept: Arc<Kept>) {
    let link = &kept.link;
    let mut failures = 0u32;
    loop {
        // Registered before the count is read: an end meanwhile is not missed.
        let ended = kept.ended.notified();
        if kept.open.load(Ordering::Relaxed) >= standby.per_node {
            ended.await;
            continue;
        }
        match standby.open(link).await {
            Ok(stream) => {
                failures = 0;
                kept.count(1);
                io().spawn(hold(standby.clone(), kept.clone(), stream));
            }
            Err(why) => {
                failures += 1;
                if failures == 1 {
                    log::warn!("node {}: cannot keep a link open for grants: {why}", link.address);
                }
                if failures >= GIVE_UP_AFTER {
                    log::warn!(
                        "node {}: no link kept open ({failures} attempts failed); its grants come through the store",
                        link.address
                    );
                    lock(&standby.nodes).remove(&link.address);
                    return;
                }
                tokio::time::sleep(MAX_BACKOFF.min(Duration::from_millis(200) * failures)).await;
            }
        }
    }
}

/// Reads one link until a grant arrives on it (handed over) or it ends; pings it meanwhile.
async fn hold(standby: Arc<Standby>, kept: Arc<Kept>, stream: Box<dyn Stream>) {
    let link = &kept.link;
    let (rd, mut wr) = tokio::io::split(stream);
    let mut frames = frames(rd);
    let mut heard = Instant::now();
    let mut next_ping = Instant::now() + link.heartbeat_interval;
    let why = loop {
        tokio::select! {
            // Cancel safe: a frame half read when a ping is due stays in `frames`.
            frame = timeout_at(heard + link.heartbeat_timeout, next_frame::<FromNode, _>(&mut frames)) => match frame {
                Ok(Ok(Some(FromNode::Ping))) => heard = Instant::now(),
                Ok(Ok(Some(FromNode::Granted { grant, info }))) => {
                    kept.count(-1);
                    kept.ended.notify_one();
                    let grant = Grant::from(grant);
                    log::debug!("cluster: ticket {}: {} granted on a link kept open to it", grant.ticket, grant.slot);
                    return standby.granted(grant, Pushed { frames, wr, info });
                }
                Ok(Ok(Some(other))) => break format!("unexpected message {}", other.kind()),
                Ok(Ok(None)) => break "the node closed it".to_string(),
                Ok(Err(e)) => break format!("it failed: {e}"),
                Err(_) => break format!("nothing from the node for {:.1} s", link.heartbeat_timeout.as_secs_f64()),
            },
            _ = sleep_until(next_ping) => {
                next_ping = Instant::now() + link.heartbeat_interval;
                if let Err(e) = write_frame(&mut wr, &ToNode::Ping).await {
                    break format!("it failed: {e}");
                }
            }
        }
    };
    log::info!("node {}: a link kept open for grants ended ({why}); opening another", link.address);
    kept.count(-1);
    kept.ended.notify_one();
}
