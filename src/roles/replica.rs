//! A replica of a cluster: its queue is the store's ([`ClusterQueueActor`]), its workers the
//! nodes', each lent to it for one session by its [`WorkerPoolActor`] (a BackendActor on a
//! link attached with the store's grant). It keeps a few links open to each node
//! ([`omni_backend_host::link::standby`]), on which the nodes push grants already attached.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use omni_actors::domain::Mode;
use omni_actors::messages::pool::PoolPort;
use omni_actors::messages::queue::{GrantPushed, QueueFeed, QueuePort};
use omni_actors::pool::WorkerPoolActor;
use omni_actors::queue::{ClusterQueueActor, ClusterSetup, GrantOpener};

use super::{Common, Serving, backend_limits};
use crate::config::{Config, NodeLink};
use crate::store::redis::RedisStore;
use omni_backend_host as backend;
use omni_backend_host::link::standby::Standby;

/// Starts the cluster's queue and the pool that lends it the nodes' workers. Must run inside
/// an actix system.
pub(crate) fn start(config: Arc<Config>) -> Result<Serving, crate::store::redis::StoreError> {
    let spec = config.cluster.as_ref().expect("a replica's config has a [cluster] section");
    // The section was checked when the config was loaded; what is left is the store's own (a
    // CA file that does not load, a Sentinel the crate refuses): the server does not start.
    let store = RedisStore::from_spec(spec)?;
    let common = Common::start(&config);
    let template = NodeLink {
        name: String::new(),
        address: String::new(),
        token: String::new(),
        ca: spec.ca.clone(),
        server_name: spec.server_name.clone(),
        heartbeat_interval: Duration::from_secs(1),
        heartbeat_timeout: Duration::from_secs(5),
        networks: spec.node_networks.clone(),
        replica: spec.credential.clone(),
    };
    let replica = spec.name.clone();
    let standby = Standby::new(spec.standby_links, replica.clone());
    let kept = standby.clone();
    let opener: GrantOpener =
        Arc::new(move |grant| backend::grant_opener(template.clone(), grant, replica.clone(), kept.clone()));
    log::info!(
        "replica {} of the cluster at {} (lease {:.1} s)",
        spec.name,
        spec.redacted_url(),
        spec.lease.as_secs_f64()
    );
    let pool_context = Context::<WorkerPoolActor>::new();
    let pool = PoolPort::of(&pool_context.address());
    let setup = ClusterSetup {
        coordinator: store,
        opener,
        pool: pool.clone(),
        max_waiting: config.queue.max_waiting,
        typical: Mode::ALL.map(|m| config.queue.typical(m)),
        update_interval: Duration::from_secs_f64(config.queue.update_interval_s),
        lease: spec.lease,
    };
    let queue = ClusterQueueActor::new(setup).start();
    let start = omni_actors::worker::starter(backend_limits(&config));
    let feed = QueueFeed::Lent(queue.clone().recipient());
    pool_context.run(WorkerPoolActor::new(Vec::new(), feed, start, common.subscribers.clone()));
    // Grants nodes push on the links kept open to them reach the queue as the store's do.
    let to = queue.clone();
    standby.deliver_to(Box::new(move |grant| to.do_send(GrantPushed(grant))));
    // The status of the cluster's workers is the queue's: the store's view, with what this
    // replica was lent.
    let status = queue.clone().recipient();
    Ok(common.serving(config, QueuePort::of(&queue), pool, status))
}
