//! `omni-gateway node`: the gateway's worker host on another machine (a GPU host), on the same
//! actors as a gateway. Its [`WorkerPoolActor`] opens the `[[workers]]` of its config exactly as
//! a gateway's would (one BackendActor each: built-in or a library, on a thread or in a child
//! process, restarted with backoff, every call under the step watchdog); its [`lender::Lender`]
//! is the pool's queue: it lends each worker to one gateway link at a time, to gateways that
//! present its `[node] token` over TCP (TLS with `[node.tls]`); each link is a
//! [`link::GatewayLink`] actor, the session of the worker it borrowed. Gateways list the node
//! under `[[nodes]]`; its workers join their pools as `NODE/WORKER`. Protocol:
//! [`omni_backend_host::link::wire`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use omni_actors::messages::pool::ShutdownPool;
use omni_actors::messages::queue::QueueFeed;
use omni_actors::observe::events::Subscribers;
use omni_actors::pool::WorkerPoolActor;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::config::Config;

mod accept;
mod cluster;
mod lender;
mod lending;
mod link;
mod messages;
mod offers;
mod unproven;

use accept::Door;
use lender::Lender;
use lending::Lendable;
use link::LinkSettings;

/// Why a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}: a node needs a [node] section (bind, token)")]
    NoNodeSection(String),
    #[error("{0}: a node needs at least one [[workers]] entry")]
    NoWorkers(String),
    #[error("{0}: node.bind: {1}")]
    Listen(String, String),
    #[error(transparent)]
    Serve(#[from] crate::listen::ServeError),
    #[error("the cluster's store: {0}")]
    Store(#[from] crate::store::redis::StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs the node until SIGINT or SIGTERM.
pub fn run(config: Config) -> Result<(), NodeError> {
    let file = config.path.display().to_string();
    let serve = config.node.clone().ok_or_else(|| NodeError::NoNodeSection(file.clone()))?;
    if config.workers.is_empty() {
        return Err(NodeError::NoWorkers(file));
    }
    let tls = match &serve.tls {
        Some((cert, key)) => {
            let config = crate::listen::tls_config("node.tls", cert, key)?;
            Some(TlsAcceptor::from(Arc::new(config)))
        }
        None => None,
    };
    let mut std_listeners = Vec::new();
    for addr in &serve.bind {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| NodeError::Listen(file.clone(), crate::listen::listen_error(*addr, &e)))?;
        listener.set_nonblocking(true)?;
        std_listeners.push(listener);
    }
    let store = match &config.cluster {
        Some(spec) => Some(crate::store::redis::RedisStore::from_spec(spec)?),
        None => None,
    };
    System::new().block_on(async move {
        // A node's workers keep threads of their own, quick ones too: run inline, their hand-overs
        // come faster than the cluster's tests of grant pushes tolerate today (the nemesis saw a
        // ticket attached on two nodes' workers); see docs/performance.md, "Scale".
        let mut setups = super::worker_setups(&config);
        for s in &mut setups {
            s.factory = s.factory.clone().threaded();
        }
        let lendable =
            setups.iter().map(|s| Lendable::new(s.name.clone(), s.modes.clone(), s.backend.clone())).collect();
        let lender_context = Context::<Lender>::new();
        let lender = lender_context.address();
        let start = omni_actors::worker::starter(super::backend_limits(&config));
        // A node publishes no session events: its gateways do.
        let feed = QueueFeed::Owned(lender.clone().recipient());
        let pool = WorkerPoolActor::new(setups, feed, start, Subscribers::default()).start();
        lender_context.run(Lender::new(lendable));
        let mut addrs = Vec::new();
        let revoked_at_start = config.cluster.as_ref().map(|c| c.revoked_replicas.clone()).unwrap_or_default();
        lender.do_send(messages::Revoke { replicas: revoked_at_start.clone() });
        let revoked = Arc::new(parking_lot::RwLock::new(revoked_at_start));
        let door = Door {
            token: serve.token.as_str().into(),
            revoked: revoked.clone(),
            lender: messages::LenderPort::of(&lender),
            links: LinkSettings {
                heartbeat_interval: serve.heartbeat_interval,
                heartbeat_timeout: serve.heartbeat_timeout,
            },
            tls: tls.clone(),
            unproven: Default::default(),
        };
        for std in std_listeners {
            let listener = TcpListener::from_std(std)?;
            addrs.push(listener.local_addr()?);
            actix::spawn(accept::accept_loop(listener, door.clone()));
        }
        let signals = crate::signals::register()?;
        let names: Vec<&str> = config.workers.iter().map(|w| w.name.as_str()).collect();
        let shown: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
        for addr in &shown {
            // On stdout, as the gateway prints its own: scripts and tests read the port there.
            println!("omni-gateway node listening on {addr}");
        }
        log::info!(
            "node serving {} worker(s) ({}) on {}{}",
            names.len(),
            names.join(", "),
            shown.join(", "),
            if tls.is_some() { " over TLS" } else { "" }
        );
        if let (Some(spec), Some(store)) = (&config.cluster, store) {
            // The environment wins (a pod learns its address at start: the downward API).
            let configured = std::env::var("OMNI_NODE_ADVERTISE").ok().filter(|a| !a.is_empty());
            let advertise = match (configured.as_deref().unwrap_or(&serve.advertise), shown.first()) {
                ("", Some(first)) => first.clone(),
                (given, _) => given.to_string(),
            };
            log::info!(
                "node {} joins the cluster at {} (lease {:.1} s), reached at {advertise}",
                spec.name,
                spec.redacted_url(),
                spec.lease.as_secs_f64()
            );
            let cluster = offers::Cluster {
                store,
                advertise,
                attach_timeout: spec.attach_timeout,
                known: false,
                signer: omni_backend_host::link::replica::grant_signer(&serve.token),
            };
            lender.do_send(messages::JoinCluster { cluster, every: spec.lease / 3 });
        }
        shutdown_signal(signals, &config.path, &revoked, &lender).await;
        log::info!("node stopping");
        let _ = pool.send(ShutdownPool { within: Duration::from_secs(1) }).await;
        System::current().stop();
        Ok::<(), NodeError>(())
    })
}

/// Waits for SIGTERM or SIGINT. On SIGHUP the node reads its `[cluster] revoked_replicas`
/// again (nothing else: the rest takes a restart): a replica added there is refused from now on
/// and its links kept open for grants end; the other replicas are not touched.
async fn shutdown_signal(
    mut signals: crate::signals::Signals,
    path: &std::path::Path,
    revoked: &parking_lot::RwLock<Vec<String>>,
    lender: &Addr<Lender>,
) {
    loop {
        tokio::select! {
            _ = signals.stop.next() => return,
            _ = signals.hangup.recv() => match Config::load(path) {
                Ok(config) => {
                    let now = config.cluster.map(|c| c.revoked_replicas).unwrap_or_default();
                    let added: Vec<String> = now.iter().filter(|r| !revoked.read().contains(r)).cloned().collect();
                    log::info!(
                        "SIGHUP: revoked replicas now [{}] ({} newly revoked); nothing else is reloaded",
                        now.join(", "),
                        added.len()
                    );
                    *revoked.write() = now.clone();
                    lender.do_send(messages::Revoke { replicas: now });
                }
                Err(e) => log::error!("SIGHUP: {} not reloaded, the revoked replicas are unchanged: {e}", path.display()),
            },
        }
    }
}
