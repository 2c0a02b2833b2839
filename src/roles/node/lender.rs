//! The Lender: which of the node's workers is lent to which gateway link. It is the node's
//! pool's queue: the WorkerPoolActor tells it ([`WorkerReport`]) which workers are open
//! (and so free) or not, exactly as it tells a gateway's queue. A link borrows a worker by name
//! ([`Borrow`]) and gives it back when it ends ([`GiveBack`]); the worker's BackendActor resets
//! it meanwhile, and the next link's calls wait behind the reset. In a cluster the lender also
//! offers each free worker to the store and pushes the grants it makes on links replicas keep
//! open ([`super::cluster`]).

use std::collections::HashMap;
use std::time::Instant;

use actix::prelude::*;
use omni_actors::messages::queue::WorkerReport;
use omni_actors::messages::worker::WorkerLink;

use super::lending::{Ended, Granted, Lendable};
use super::messages::{Borrow, Describe, GiveBack, Lent, Push, Refusal, Revoke, Revoked, Standby, StandbyEnded};
use super::offers::Cluster;

pub(super) struct Lender {
    /// Its workers and their rules.
    pub(super) workers: Vec<Lendable<WorkerLink>>,
    /// In a cluster: the store and what the offers need.
    pub(super) cluster: Option<Cluster>,
    /// Links replicas keep open for grants, oldest first, by replica.
    pub(super) standby: HashMap<String, Vec<KeptLink>>,
}

/// A link a replica keeps open for grants: its number, where a grant is pushed, and where it is
/// told its replica was revoked.
pub(super) struct KeptLink {
    pub id: u64,
    pub push: Recipient<Push>,
    pub revoked: Recipient<Revoked>,
}

impl Lender {
    pub(super) fn new(workers: Vec<Lendable<WorkerLink>>) -> Lender {
        Lender { workers, cluster: None, standby: HashMap::new() }
    }

    /// A worker became free: in a cluster it is offered at once.
    fn freed(&mut self, i: usize, ctx: &mut Context<Self>) {
        if self.cluster.is_some() {
            self.offer(i, ctx);
        }
    }
}

impl Actor for Lender {
    type Context = Context<Self>;
}

impl Handler<WorkerReport> for Lender {
    type Result = ();
    /// Its workers opening and failing; the rest of the pool's news means nothing to a node:
    /// its workers are all configured, lent by name, and session lengths are measured here.
    fn handle(&mut self, report: WorkerReport, ctx: &mut Context<Self>) {
        match report {
            WorkerReport::Idle(link) => self.idle(link, ctx),
            WorkerReport::Starting { worker, reason } | WorkerReport::Down { worker, reason } => {
                self.closed(worker, Some(reason))
            }
            WorkerReport::Modes { .. }
            | WorkerReport::Joined { .. }
            | WorkerReport::Reached
            | WorkerReport::Finished { .. } => {}
        }
    }
}

impl Lender {
    fn idle(&mut self, link: WorkerLink, ctx: &mut Context<Self>) {
        let i = link.id;
        let Some(w) = self.workers.get_mut(i) else { return };
        let (opened, offer) = w.idle(link);
        if opened {
            log::info!("worker {}: ready", w.name);
        }
        if offer {
            self.freed(i, ctx);
        }
    }

    fn closed(&mut self, i: usize, failure: Option<String>) {
        if let Some(w) = self.workers.get_mut(i) {
            w.closed(failure);
        }
    }
}

impl Handler<Borrow> for Lender {
    type Result = Result<Lent, Refusal>;
    fn handle(&mut self, msg: Borrow, _: &mut Context<Self>) -> Self::Result {
        let in_cluster = self.cluster.is_some();
        let Some(w) = self.workers.iter_mut().find(|w| w.name == msg.worker) else {
            return Err(Refusal::NoSuchWorker(msg.worker));
        };
        let grant = msg.grant.as_ref().map(|g| Granted { ticket: g.ticket, mode: g.mode, nonce: &g.nonce });
        let (worker, mode) = w.borrow(msg.link, in_cluster, grant, Instant::now())?;
        match grant {
            Some(g) => log::info!(
                "worker {}: attached to gateway {} (link {}) for ticket {}",
                w.name,
                msg.gateway,
                msg.link,
                g.ticket
            ),
            None => log::info!("worker {}: attached to gateway {} (link {})", w.name, msg.gateway, msg.link),
        }
        Ok(Lent { worker, mode })
    }
}

impl Handler<GiveBack> for Lender {
    type Result = ();
    fn handle(&mut self, msg: GiveBack, ctx: &mut Context<Self>) {
        let Some(i) = self.workers.iter().position(|w| w.name == msg.worker) else { return };
        let w = &mut self.workers[i];
        let Ended::Freed { session } = w.give_back(msg.link, Instant::now()) else { return };
        log::info!("worker {}: link {} ended ({}); the worker is free", w.name, msg.link, msg.why);
        if let Some((ticket, length)) = session {
            log::info!("worker {}: session of ticket {ticket} ended after {:.1} s", w.name, length.as_secs_f64());
        }
        // In a cluster it is offered at once, its reset running meanwhile: the next client's
        // grant and attach overlap it instead of waiting for it.
        if w.worker.is_some() {
            self.freed(i, ctx);
        }
    }
}

impl Handler<Describe> for Lender {
    type Result = MessageResult<Describe>;
    fn handle(&mut self, _: Describe, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.workers.iter().map(Lendable::describe).collect())
    }
}

impl Handler<Standby> for Lender {
    type Result = ();
    fn handle(&mut self, msg: Standby, _: &mut Context<Self>) {
        self.standby.entry(msg.replica).or_default().push(KeptLink {
            id: msg.link,
            push: msg.to,
            revoked: msg.revoked,
        });
    }
}

impl Handler<Revoke> for Lender {
    type Result = ();
    fn handle(&mut self, msg: Revoke, _: &mut Context<Self>) {
        for replica in &msg.replicas {
            let Some(links) = self.standby.remove(replica) else { continue };
            log::info!("replica {replica} is revoked: its {} link(s) kept open for grants end", links.len());
            for link in links {
                link.revoked.do_send(Revoked);
            }
        }
    }
}

impl Handler<StandbyEnded> for Lender {
    type Result = ();
    fn handle(&mut self, msg: StandbyEnded, _: &mut Context<Self>) {
        if let Some(links) = self.standby.get_mut(&msg.replica) {
            links.retain(|l| l.id != msg.link);
            if links.is_empty() {
                self.standby.remove(&msg.replica);
            }
        }
    }
}
