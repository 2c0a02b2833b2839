//! A node in a cluster (`[cluster]` in its config): it offers each free worker to the
//! cluster's store under a nonce it draws, and admits a gateway's attach only with the grant
//! of the worker's current nonce ([`super::worker::NodeWorker::attach`]). A worker is offered
//! when it becomes free (ready, or reset after a session); a beat every third of the lease
//! keeps the node known and tells the store each worker's true state; the store answers
//! which offers must be made again (a grant not taken within `attach_timeout_s`, or an offer
//! the store lost), each under a new nonce, so a late attach with the old one is refused.

use std::sync::Arc;
use std::time::Duration;

use omni_actors::edge::coordinator::{NodeStore, Offer, Offered, Reported, SlotReport};

use super::Node;
use super::worker::Report;
use crate::config::ClusterSpec;
use crate::link::wire::{AttachGrant, PushedGrant};
use crate::store::redis::RedisStore;

/// Joins the node's workers to the cluster and serves their offers until the node stops.
pub fn start(node: Arc<Node>, spec: &ClusterSpec, advertise: String) -> Result<(), String> {
    let store: Arc<dyn NodeStore> = RedisStore::from_spec(spec)?;
    let offers = Arc::new(Offers { node: node.clone(), store, advertise: advertise.clone() });
    // Each offer runs on its own, started where the worker became free: it waits neither for
    // another worker's offer nor for a beat (a hand-over's time is mostly this offer's).
    let runtime = tokio::runtime::Handle::current();
    for (i, w) in node.workers.iter().enumerate() {
        // Weak: the workers belong to the node, which the offers hold.
        let (offers, runtime) = (Arc::downgrade(&offers), runtime.clone());
        w.join_cluster(Box::new(move || {
            if let Some(offers) = offers.upgrade() {
                runtime.spawn(async move { offers.offer(i).await });
            }
        }));
    }
    log::info!(
        "node {} joins the cluster at {} (lease {:.1} s), reached at {advertise}",
        spec.name,
        spec.redacted_url(),
        spec.lease.as_secs_f64()
    );
    tokio::spawn(beats(offers, spec.lease / 3, spec.attach_timeout));
    Ok(())
}

struct Offers {
    node: Arc<Node>,
    store: Arc<dyn NodeStore>,
    advertise: String,
}

impl Offers {
    fn slot(&self, i: usize) -> String {
        format!("{}/{}", self.store.node(), self.node.workers[i].name)
    }

    /// Offers worker `i` under a new nonce, if it is free. A grant for a ticket of a replica
    /// that keeps a link open to this node is pushed on that link; any other goes to the
    /// replica through the store.
    async fn offer(&self, i: usize) {
        let w = &self.node.workers[i];
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let Some(ended) = w.offer_under(&nonce) else { return };
        let slot = self.slot(i);
        let linked = self.node.pushes.replicas();
        let offer = Offer {
            slot: slot.clone(),
            nonce: nonce.clone(),
            modes: w.modes.clone(),
            addr: self.advertise.clone(),
            ended,
            linked,
        };
        let answer = self.store.offer(offer).await;
        w.offer_answered(&nonce);
        match answer {
            Ok(Offered::Assigned { ticket, push: None }) => log::info!("worker {}: granted to ticket {ticket}", w.name),
            Ok(Offered::Assigned { ticket, push: Some((replica, mode)) }) => {
                log::info!("worker {}: granted to ticket {ticket} of {replica}, pushed on its link", w.name);
                let grant = AttachGrant { ticket, nonce: nonce.clone(), mode };
                let pushed = PushedGrant { ticket, slot, addr: self.advertise.clone(), nonce, mode };
                if !self.node.pushes.push(&replica, w, grant, pushed.clone()).await {
                    // Its links ended meanwhile: the replica gets the grant through the store.
                    log::info!("worker {}: no link of {replica} took the grant; through the store", w.name);
                    if let Err(e) = self.store.deliver(&replica, &pushed.into()).await {
                        log::warn!("worker {}: cannot hand the grant of ticket {ticket} to the store: {e}", w.name);
                    }
                }
            }
            Ok(Offered::Free) => log::debug!("worker {}: free, nobody waiting for it", w.name),
            // The next beat makes the node known and hands this offer back to be made again.
            Ok(Offered::UnknownNode) => log::info!("worker {}: the store does not know this node yet", w.name),
            Err(e) => log::warn!("worker {}: cannot offer it: {e}", w.name),
        }
    }

    async fn beat(&self, attach_timeout: Duration, known: &mut bool) {
        let reports: Vec<SlotReport> = self
            .node
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let state = match w.report() {
                    Report::Busy(ticket) => Reported::Busy(ticket),
                    Report::Down => Reported::Down,
                    Report::Offered(nonce) => Reported::Offered(nonce),
                    Report::Pending => Reported::Pending,
                };
                SlotReport { slot: self.slot(i), modes: w.modes.clone(), state }
            })
            .collect();
        match self.store.node_beat(&self.advertise, attach_timeout, &reports).await {
            Ok(beat) => {
                let (was_known, again) = (beat.known, beat.again);
                if !was_known {
                    log::info!("node {}: registered with the cluster's store", self.store.node());
                }
                *known = true;
                for slot in again {
                    if let Some(i) = (0..self.node.workers.len()).find(|&i| self.slot(i) == slot) {
                        log::info!("worker {}: offered again under a new nonce", self.node.workers[i].name);
                        self.offer(i).await;
                    }
                }
            }
            Err(e) => {
                if *known {
                    log::error!("node {}: cannot reach the cluster's store: {e}", self.store.node());
                }
                *known = false;
            }
        }
    }
}

/// Beats every `every` until the node stops (the first at once).
async fn beats(offers: Arc<Offers>, every: Duration, attach_timeout: Duration) {
    let mut known = false;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        offers.beat(attach_timeout, &mut known).await;
    }
}
