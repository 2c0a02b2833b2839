//! The Lender: which of the node's workers is lent to which gateway link. It is the node's
//! pool's queue: the WorkerPoolActor tells it ([`WorkerReport`]) which workers are open
//! (and so free) or not, exactly as it tells a gateway's queue. A link borrows a worker by name
//! ([`Borrow`]) and gives it back when it ends ([`GiveBack`]); the worker's BackendActor resets
//! it meanwhile, and the next link's calls wait behind the reset. In a cluster the lender also
//! offers each free worker to the store and pushes the grants it makes on links replicas keep
//! open ([`super::cluster`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use omni_actors::domain::Mode;
use omni_actors::queue::messages::WorkerReport;
use omni_actors::worker::messages::WorkerLink;

use super::cluster::{Cluster, Offers};
use super::messages::{Borrow, Describe, GiveBack, Lent, Push, Refusal, Standby, StandbyEnded};
use crate::link::wire::NodeWorker;
use omni_actors::status::WorkerStatus;

/// One of the node's workers, as the lender sees it.
pub(super) struct Lendable {
    pub name: String,
    pub modes: Vec<Mode>,
    /// Where its backend comes from, for discovery.
    pub backend: String,
    /// Open: its BackendActor and what it can do. `None` while it (re)opens.
    pub worker: Option<WorkerLink>,
    /// Why it is not open, when it failed.
    pub failure: Option<String>,
    /// The link it is lent to.
    pub attached: Option<u64>,
    /// In a cluster: its offers to the store.
    pub offer: Offers,
    /// In a cluster: the ticket, mode and start of the session attached.
    pub session: Option<(u64, Mode, Instant)>,
    /// The mode and length of the last session, until the next offer reports it.
    pub ended: Option<(Mode, Duration)>,
}

impl Lendable {
    pub(super) fn new(name: String, modes: Vec<Mode>, backend: String) -> Lendable {
        Lendable {
            name,
            modes,
            backend,
            worker: None,
            failure: None,
            attached: None,
            offer: Offers::default(),
            session: None,
            ended: None,
        }
    }

    /// Open and lent to nobody.
    pub(super) fn free(&self) -> bool {
        self.worker.is_some() && self.attached.is_none()
    }
}

pub(super) struct Lender {
    pub(super) workers: Vec<Lendable>,
    /// In a cluster: the store and what the offers need.
    pub(super) cluster: Option<Cluster>,
    /// Links replicas keep open for grants, oldest first, by replica.
    pub(super) standby: HashMap<String, Vec<(u64, Recipient<Push>)>>,
}

impl Lender {
    pub(super) fn new(workers: Vec<Lendable>) -> Lender {
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
            WorkerReport::Modes { .. } | WorkerReport::Joined { .. } | WorkerReport::Finished { .. } => {}
        }
    }
}

impl Lender {
    fn idle(&mut self, link: WorkerLink, ctx: &mut Context<Self>) {
        let i = link.id;
        let Some(w) = self.workers.get_mut(i) else { return };
        let opened = w.worker.is_none();
        w.worker = Some(link);
        w.failure = None;
        if opened {
            log::info!("worker {}: ready", w.name);
        }
        // Offered already when its last link ended (its reset ran meanwhile).
        if w.attached.is_none() && w.offer.current.is_none() {
            self.freed(i, ctx);
        }
    }

    fn closed(&mut self, i: usize, failure: Option<String>) {
        if let Some(w) = self.workers.get_mut(i) {
            w.worker = None;
            w.failure = failure;
            // An offer still awaiting the store's answer keeps the next one waiting for it.
            w.offer.current = None;
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
        if w.attached.is_some() {
            return Err(Refusal::Attached(w.name.clone()));
        }
        if in_cluster {
            match &msg.grant {
                None => return Err(Refusal::NeedsGrant(w.name.clone())),
                Some(g) if w.offer.current.as_deref() != Some(g.nonce.as_str()) => {
                    return Err(Refusal::StaleGrant { ticket: g.ticket, worker: w.name.clone() });
                }
                Some(_) => {}
            }
        }
        let Some(worker) = w.worker.clone() else {
            return Err(match &w.failure {
                Some(reason) => Refusal::Failed { worker: w.name.clone(), reason: reason.clone() },
                None => Refusal::Starting(w.name.clone()),
            });
        };
        w.attached = Some(msg.link);
        w.offer.current = None;
        w.session = msg.grant.as_ref().map(|g| (g.ticket, g.mode, Instant::now()));
        match &msg.grant {
            Some(g) => log::info!(
                "worker {}: attached to gateway {} (link {}) for ticket {}",
                w.name,
                msg.gateway,
                msg.link,
                g.ticket
            ),
            None => log::info!("worker {}: attached to gateway {} (link {})", w.name, msg.gateway, msg.link),
        }
        let mode = msg.grant.map_or(w.modes[0], |g| g.mode);
        Ok(Lent { worker, mode })
    }
}

impl Handler<GiveBack> for Lender {
    type Result = ();
    fn handle(&mut self, msg: GiveBack, ctx: &mut Context<Self>) {
        let Some(i) = self.workers.iter().position(|w| w.name == msg.worker) else { return };
        let w = &mut self.workers[i];
        if w.attached != Some(msg.link) {
            return;
        }
        log::info!("worker {}: link {} ended ({}); the worker is free", w.name, msg.link, msg.why);
        w.attached = None;
        if let Some((ticket, mode, since)) = w.session.take() {
            let length = since.elapsed();
            log::info!("worker {}: session of ticket {ticket} ended after {:.1} s", w.name, length.as_secs_f64());
            w.ended = Some((mode, length));
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
        MessageResult(
            self.workers
                .iter()
                .map(|w| {
                    let state = match (&w.worker, w.attached, &w.failure) {
                        (Some(_), Some(_), _) => WorkerStatus::Busy,
                        (Some(_), None, _) => WorkerStatus::Idle,
                        (None, _, Some(_)) => WorkerStatus::Failed,
                        (None, _, None) => WorkerStatus::Starting,
                    };
                    NodeWorker {
                        name: w.name.clone(),
                        modes: w.modes.clone(),
                        backend: w.backend.clone(),
                        state,
                        reason: w.failure.clone().filter(|_| state == WorkerStatus::Failed),
                    }
                })
                .collect(),
        )
    }
}

impl Handler<Standby> for Lender {
    type Result = ();
    fn handle(&mut self, msg: Standby, _: &mut Context<Self>) {
        self.standby.entry(msg.replica).or_default().push((msg.link, msg.to));
    }
}

impl Handler<StandbyEnded> for Lender {
    type Result = ();
    fn handle(&mut self, msg: StandbyEnded, _: &mut Context<Self>) {
        if let Some(links) = self.standby.get_mut(&msg.replica) {
            links.retain(|(id, _)| *id != msg.link);
            if links.is_empty() {
                self.standby.remove(&msg.replica);
            }
        }
    }
}
