//! A node in a cluster (`[cluster]` in its config): the [`Lender`] offers each free worker to
//! the cluster's store under a nonce it draws, and admits a gateway's attach only with the
//! grant of the worker's current nonce. A worker is offered when it becomes free (open, or its
//! link ended); a beat every third of the lease keeps the node known and tells the store each
//! worker's true state; the store answers which offers must be made again (a grant not taken
//! within `attach_timeout_s`, or an offer the store lost), each under a new nonce, so a late
//! attach with the old one is refused. A grant for a ticket of a replica that keeps a link open
//! to this node is pushed on that link, the worker attached already; any other goes to the
//! replica through the store.

use std::time::Instant;

use actix::prelude::*;
use omni_actors::edge::coordinator::{ClusterError, Grant, NodeBeat, Offer, Offered, SlotReport};

use super::lender::Lender;
use super::messages::{JoinCluster, Push};
use omni_backend_host::link::wire::PushedGrant;

impl Handler<JoinCluster> for Lender {
    type Result = ();
    fn handle(&mut self, msg: JoinCluster, ctx: &mut Context<Self>) {
        self.cluster = Some(msg.cluster);
        self.beat(ctx);
        ctx.run_interval(msg.every, |act, ctx| act.beat(ctx));
        for i in 0..self.workers.len() {
            self.offer(i, ctx);
        }
    }
}

impl Lender {
    fn slot(&self, i: usize) -> String {
        let node = self.cluster.as_ref().map_or("", |c| c.store.node());
        format!("{node}/{}", self.workers[i].name)
    }

    /// The replicas with a link kept open to this node.
    fn linked(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.standby.iter().filter(|(_, l)| !l.is_empty()).map(|(n, _)| n.clone()).collect();
        names.sort_unstable();
        names
    }

    /// Offers worker `i` under a new nonce, if it is free.
    pub(super) fn offer(&mut self, i: usize, ctx: &mut Context<Self>) {
        let Some(cluster) = &self.cluster else { return };
        let (slot, linked, store, addr) =
            (self.slot(i), self.linked(), cluster.store.clone(), cluster.advertise.clone());
        let w = &mut self.workers[i];
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        // One offer at a time (a worker opening as the node joins the cluster is offered twice).
        if !w.try_offer(nonce.clone()) {
            return;
        }
        let sig = omni_backend_host::link::grant::sign(&cluster.signer, &slot, &addr, &nonce);
        let offer =
            Offer { slot, nonce: nonce.clone(), modes: w.modes.clone(), addr, sig, ended: w.ended.take(), linked };
        ctx.spawn(store.offer(offer).into_actor(self).map(move |answer, act, ctx| act.offered(i, nonce, answer, ctx)));
    }

    fn offered(&mut self, i: usize, nonce: String, answer: Result<Offered, ClusterError>, ctx: &mut Context<Self>) {
        let w = &mut self.workers[i];
        let again = w.answered(&nonce);
        let name = w.name.clone();
        match answer {
            Ok(Offered::Assigned { ticket, push: None }) => log::info!("worker {name}: granted to ticket {ticket}"),
            Ok(Offered::Assigned { ticket, push: Some((replica, mode)) }) => {
                log::info!("worker {name}: granted to ticket {ticket} of {replica}, pushed on its link");
                let Some(cluster) = &self.cluster else { return };
                let (slot, addr) = (self.slot(i), cluster.advertise.clone());
                let sig = omni_backend_host::link::grant::sign(&cluster.signer, &slot, &addr, &nonce);
                let pushed = PushedGrant { ticket, slot, addr, nonce, mode, sig };
                self.push(i, replica, pushed, ctx);
            }
            Ok(Offered::Free) => log::debug!("worker {name}: free, nobody waiting for it"),
            // The next beat makes the node known and hands this offer back to be made again.
            Ok(Offered::UnknownNode) => log::info!("worker {name}: the store does not know this node yet"),
            Err(e) => log::warn!("worker {name}: cannot offer it: {e}"),
        }
        if again {
            log::info!(
                "worker {name}: offered again (a grant of its last offer was used before the store answered it)"
            );
            self.offer(i, ctx);
        }
    }

    /// Pushes a grant on the oldest link `replica` keeps open, the worker reserved for it; the
    /// next link when one has just ended or refuses; the store when none is left, or when the
    /// worker is no longer free under the grant's offer (a link that ended was given back and
    /// the worker offered again meanwhile): the replica's attach is then refused as stale, and
    /// it asks again, rather than the worker being reserved twice.
    fn push(&mut self, i: usize, replica: String, pushed: PushedGrant, ctx: &mut Context<Self>) {
        let w = &mut self.workers[i];
        let stands = w.free() && w.offer.stands(&pushed.nonce);
        let links = self.standby.get_mut(&replica).filter(|links| stands && !links.is_empty());
        let next = links.map(|links| links.remove(0));
        let reserved = next.and_then(|super::lender::KeptLink { id: link, push: to, .. }| {
            let (worker, offer) = w.reserve(&pushed.nonce, link, pushed.ticket, pushed.mode, Instant::now())?;
            Some((link, to, worker, offer))
        });
        let Some((link, to, worker, offer)) = reserved else {
            let name = w.name.clone();
            match stands {
                true => log::info!("worker {name}: no link of {replica} took the grant; through the store"),
                false => log::info!(
                    "worker {name}: the grant of ticket {} is no longer its offer; through the store",
                    pushed.ticket
                ),
            }
            let Some(store) = self.cluster.as_ref().map(|c| c.store.clone()) else { return };
            let grant: Grant = pushed.into();
            ctx.spawn(store.deliver(&replica, &grant).into_actor(self).map(move |result, _, _| {
                if let Err(e) = result {
                    log::warn!("worker {name}: cannot hand the grant of ticket {} to the store: {e}", grant.ticket);
                }
            }));
            return;
        };
        // Reserved for the link, as an attach with the grant would.
        log::info!("worker {}: attached to gateway {replica} (link {link}) for ticket {}", w.name, pushed.ticket);
        let push = Push { worker, mode: pushed.mode, pushed: pushed.clone() };
        ctx.spawn(to.send(push).into_actor(self).map(move |told, act, ctx| {
            if told == Ok(true) {
                return;
            }
            // The link ended, or its replica could not be told: as if never reserved.
            let w = &mut act.workers[i];
            if w.unreserve(link, offer) {
                log::info!(
                    "worker {}: link {link} ended (its replica was not told of the grant); the worker is free",
                    w.name
                );
            }
            act.push(i, replica, pushed, ctx);
        }));
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        if self.cluster.is_none() {
            return;
        }
        // Every free worker stands offered or awaits the store's answer; one that does neither
        // is offered now.
        for i in 0..self.workers.len() {
            if self.workers[i].unoffered() {
                log::info!("worker {}: free with no offer standing; offered again", self.workers[i].name);
                self.offer(i, ctx);
            }
        }
        let Some(cluster) = &self.cluster else { return };
        let (store, addr, attach_timeout) = (cluster.store.clone(), cluster.advertise.clone(), cluster.attach_timeout);
        let reports: Vec<SlotReport> = (0..self.workers.len())
            .map(|i| SlotReport {
                slot: self.slot(i),
                modes: self.workers[i].modes.clone(),
                state: self.workers[i].report(),
            })
            .collect();
        let call = async move { store.node_beat(&addr, attach_timeout, &reports).await };
        ctx.spawn(
            call.into_actor(self).map(|result: Result<NodeBeat, ClusterError>, act, ctx| act.beaten(result, ctx)),
        );
    }

    fn beaten(&mut self, result: Result<NodeBeat, ClusterError>, ctx: &mut Context<Self>) {
        let Some(cluster) = &mut self.cluster else { return };
        match result {
            Ok(beat) => {
                if !beat.known {
                    log::info!("node {}: registered with the cluster's store", cluster.store.node());
                }
                cluster.known = true;
                for slot in beat.again {
                    if let Some(i) = (0..self.workers.len()).find(|&i| self.slot(i) == slot) {
                        log::info!("worker {}: offered again under a new nonce", self.workers[i].name);
                        self.offer(i, ctx);
                    }
                }
            }
            Err(e) => {
                if cluster.known {
                    log::error!("node {}: cannot reach the cluster's store: {e}", cluster.store.node());
                }
                cluster.known = false;
            }
        }
    }
}
