//! `omni-gateway node`: the gateway's worker host on another machine (a GPU host).
//!
//! A node opens the `[[workers]]` of its config exactly as a gateway would (built-in or a
//! library, on a thread or in a child process, with their options), opens them again with
//! backoff when they fail, ends a call that outlasts `limits.step_timeout_ms`, and lends each
//! worker to one gateway at a time over TCP (TLS with `[node.tls]`), to gateways that
//! present its `[node] token`. Gateways list it under `[[nodes]]`; its workers join their
//! pools as `NODE/WORKER`. Protocol: [`crate::link::wire`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::config::Config;

mod cluster;
mod push;
mod serve;

mod worker;

use worker::NodeWorker;

/// What every connection of a node shares.
pub struct Node {
    workers: Vec<Arc<NodeWorker>>,
    token: String,
    heartbeat_interval: Duration,
    heartbeat_timeout: Duration,
    /// Links replicas of a cluster keep open for grants.
    pushes: push::Pushes,
}

/// Runs the node until SIGINT or SIGTERM.
pub fn run(config: Config) -> Result<(), String> {
    let file = config.path.display().to_string();
    let serve = config.node.clone().ok_or_else(|| format!("{file}: a node needs a [node] section (bind, token)"))?;
    if config.workers.is_empty() {
        return Err(format!("{file}: a node needs at least one [[workers]] entry"));
    }
    let open_timeout = Duration::from_secs_f64(config.limits.open_timeout_s);
    let workers: Vec<Arc<NodeWorker>> = config
        .workers
        .iter()
        .map(|w| {
            let factory = crate::backend::factory(w, open_timeout);
            NodeWorker::start(w.name.clone(), w.modes.clone(), w.source.label(), factory)
        })
        .collect();
    let node = Arc::new(Node {
        workers,
        token: serve.token.clone(),
        heartbeat_interval: serve.heartbeat_interval,
        heartbeat_timeout: serve.heartbeat_timeout,
        pushes: push::Pushes::default(),
    });
    watch_steps(node.clone(), config.step_timeout());
    let tls = match &serve.tls {
        Some((cert, key)) => Some(TlsAcceptor::from(Arc::new(crate::http::tls_config("node.tls", cert, key)?))),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("node-io")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the node's runtime: {e}"))?;
    runtime.block_on(async move {
        let mut listeners = Vec::new();
        for addr in &serve.bind {
            let std = std::net::TcpListener::bind(addr)
                .map_err(|e| format!("{file}: node.bind: {}", crate::http::listen_error(*addr, &e)))?;
            std.set_nonblocking(true).map_err(|e| e.to_string())?;
            listeners.push(TcpListener::from_std(std).map_err(|e| e.to_string())?);
        }
        let names: Vec<String> = node.workers.iter().map(|w| w.name.clone()).collect();
        let bound: Vec<SocketAddr> = listeners.iter().filter_map(|l| l.local_addr().ok()).collect();
        let addrs: Vec<String> = bound.iter().map(SocketAddr::to_string).collect();
        for addr in &addrs {
            // On stdout, as the gateway prints its own: scripts and tests read the port there.
            println!("omni-gateway node listening on {addr}");
        }
        log::info!(
            "node serving {} worker(s) ({}) on {}{}",
            names.len(),
            names.join(", "),
            addrs.join(", "),
            if tls.is_some() { " over TLS" } else { "" }
        );
        for listener in listeners {
            tokio::spawn(accept_loop(listener, node.clone(), tls.clone()));
        }
        if let Some(spec) = &config.cluster {
            // The environment wins (a pod learns its address at start: the downward API).
            let configured = std::env::var("OMNI_NODE_ADVERTISE").ok().filter(|a| !a.is_empty());
            let advertise = match (configured.as_deref().unwrap_or(&serve.advertise), addrs.first()) {
                ("", Some(first)) => first.clone(),
                (given, _) => given.to_string(),
            };
            cluster::start(node.clone(), spec, advertise)?;
        }
        shutdown_signal().await;
        log::info!("node stopping");
        Ok::<(), String>(())
    })?;
    // The runtime's tasks end with it; the workers' threads and children end with the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

async fn accept_loop(listener: TcpListener, node: Arc<Node>, tls: Option<TlsAcceptor>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("node: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let node = node.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let peer = peer.to_string();
            match tls {
                None => serve::connection(stream, peer, node).await,
                Some(acceptor) => match tokio::time::timeout(node.heartbeat_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => serve::connection(tls, peer, node).await,
                    Ok(Err(e)) => log::warn!("node: {peer}: TLS handshake failed: {e}"),
                    Err(_) => log::warn!("node: {peer}: TLS handshake timed out"),
                },
            }
        });
    }
}

/// Ends the backend of a worker whose call outlasts `limit` (a backend in a child process
/// is killed, then opened again; one on a thread cannot be ended, which the log says).
fn watch_steps(node: Arc<Node>, limit: Duration) {
    let spawned = thread::Builder::new().name("node-watchdog".into()).spawn(move || {
        loop {
            thread::sleep(Duration::from_millis(100));
            for w in &node.workers {
                if let Some(control) = w.overdue(limit) {
                    log::error!(
                        "worker {}: a call outlasted limits.step_timeout_ms ({} ms); ending its backend",
                        w.name,
                        limit.as_millis()
                    );
                    control.terminate();
                    if control.process_id().is_none() {
                        log::error!(
                            "worker {}: a backend on a thread cannot be ended; use isolation = \"process\"",
                            w.name
                        );
                    }
                }
            }
        }
    });
    if let Err(e) = spawned {
        log::error!("node: cannot start the step watchdog: {e}");
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
