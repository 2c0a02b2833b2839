//! A single gateway: its queue in memory ([`QueueActor`]), its workers here and on the nodes
//! it lists (`[[nodes]]`, joined once reached), all in one [`WorkerPoolActor`].

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use omni_actors::domain::Mode;
use omni_actors::messages::pool::{JoinWorkers, PoolPort, WorkerSetup};
use omni_actors::messages::queue::{QueueFeed, QueuePort};
use omni_actors::pool::WorkerPoolActor;
use omni_actors::queue::QueueActor;

use super::{Common, Serving, backend_limits};
use crate::config::{Config, NodeLink};
use omni_backend_host as backend;

/// Starts the queue and the pool (which starts one BackendActor per worker). Must run inside
/// an actix system.
pub(crate) fn start(config: Arc<Config>) -> Serving {
    let common = Common::start(&config);
    let modes: Vec<Vec<Mode>> = config.workers.iter().map(|w| w.modes.clone()).collect();
    // Until sessions have ended, a waiting client's ETA assumes the typical length of a
    // session of each mode; the lengths measured as sessions end are blended in.
    let average = Mode::ALL.map(|m| config.queue.typical(m));
    let update = Duration::from_secs_f64(config.queue.update_interval_s);
    // Until each [[nodes]] entry is reached its modes are unknown: clients of any mode wait
    // for it (up to unavailable_after_s) rather than being refused.
    let queue = QueueActor::new(&modes, config.queue.max_waiting, average, update)
        .expecting(config.nodes.len())
        .unavailable_after(config.queue.unavailable_after())
        .start();
    let setups = super::worker_setups(&config);
    let start = omni_actors::worker::starter(backend_limits(&config));
    let feed = QueueFeed::Owned(queue.clone().recipient());
    let pool = WorkerPoolActor::new(setups, feed, start, common.subscribers.clone()).start();
    for link in &config.nodes {
        join_node(link.clone(), pool.clone().recipient());
    }
    let pool = PoolPort::of(&pool);
    // The status of a gateway's workers is its pool's.
    let status = pool.status.clone();
    common.serving(config, QueuePort::of(&queue), pool, status)
}

/// Reaches a node (`[[nodes]]`), trying again with backoff while it is down, and adds its
/// workers to the pool as `NODE/WORKER`. From then on each worker keeps its own link (and
/// reconnects by itself when the node comes back).
fn join_node(link: NodeLink, pool: Recipient<JoinWorkers>) {
    let gateway = format!("omni-gateway {} (pid {})", env!("CARGO_PKG_VERSION"), std::process::id());
    actix::spawn(async move {
        let mut failures = 0;
        loop {
            let attempt = {
                let link = link.clone();
                actix_web::rt::task::spawn_blocking(move || backend::remote::discover(&link)).await
            };
            match attempt {
                Ok(Ok(workers)) => {
                    let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
                    log::info!(
                        "node {} ({}): {} worker(s): {}",
                        link.name,
                        link.address,
                        workers.len(),
                        names.join(", ")
                    );
                    let setups = workers
                        .into_iter()
                        .map(|w| WorkerSetup {
                            name: format!("{}/{}", link.name, w.name),
                            backend: format!("node {} ({}): {}", link.name, link.address, w.backend),
                            modes: w.modes,
                            factory: backend::node_factory(link.clone(), w.name, gateway.clone()),
                            node: Some(link.name.clone()),
                        })
                        .collect();
                    pool.do_send(JoinWorkers(setups));
                    return;
                }
                Ok(Err(e)) => {
                    failures += 1;
                    let wait = omni_actors::pool::backoff(failures);
                    log::warn!("node {} ({}): {e}; trying again in {} ms", link.name, link.address, wait.as_millis());
                    actix::clock::sleep(wait).await;
                }
                Err(e) => {
                    log::error!("node {}: cannot reach it: {e}; its workers will not join", link.name);
                    // Given up: the queue stops counting on it (no workers joined).
                    pool.do_send(JoinWorkers(Vec::new()));
                    return;
                }
            }
        }
    });
}
