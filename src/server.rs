//! The server: the actor system started from the configuration, the HTTP server around
//! it, the recording sweep, and graceful shutdown.
//!
//! Shutdown (SIGINT or SIGTERM): stop accepting connections; every session is told
//! (waiting clients at once, active ones once the step in flight has finished, at most
//! `server.shutdown_grace_s`), recordings are finalized, backends closed, and the process
//! exits 0. A second signal exits at once.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_web::{App, HttpServer, web};
use omni_actors::backend_actor::BackendLimits;
use omni_actors::domain::Mode;
use omni_actors::inbound_limits::FragmentBudget;
use omni_actors::pool_actor::{ShutdownPool, WorkerPoolActor, WorkerSetup};
use omni_actors::queue_actor::{QueueActor, QueuePort};
use omni_actors::recording::{RecorderSpawner, RecordingLimits};
use omni_actors::registry::Registry;

use crate::auth::Keys;
use crate::backend;
use crate::config::Config;
use crate::recordings;
use crate::routes;

/// The running actor system, shared by every HTTP worker.
#[derive(Clone)]
pub struct Gateway {
    pub config: Arc<Config>,
    /// The queue sessions and routes reach: this process's, or the cluster's.
    pub queue: QueuePort,
    /// A replica of a cluster: its view of the whole cluster, for `/status`.
    pub cluster: Option<Recipient<omni_actors::cluster_queue_actor::ClusterStatusQuery>>,
    pub pool: Addr<WorkerPoolActor>,
    pub registry: Arc<Registry>,
    pub recorder: Option<RecorderSpawner>,
    /// Every subscriber of session and worker events (the recorder among them).
    pub subscribers: omni_actors::events::Subscribers,
    pub keys: Keys,
    /// What every connection's unfinished fragmented messages may hold together.
    pub fragments: Arc<FragmentBudget>,
}

impl Gateway {
    /// Starts the queue, the pool (which starts one BackendActor per worker) and the
    /// recording thread. Must run inside an actix system.
    pub fn start(config: Arc<Config>) -> Gateway {
        let modes: Vec<Vec<Mode>> = config.workers.iter().map(|w| w.modes.clone()).collect();
        // Until sessions have ended, a waiting client's ETA assumes the typical length of a
        // session of each mode; the lengths measured as sessions end are blended in.
        let average = [Mode::Chat, Mode::Video, Mode::Audio].map(|m| config.queue.typical(m));
        let queue = QueueActor::new(
            &modes,
            config.queue.max_waiting,
            average,
            Duration::from_secs_f64(config.queue.update_interval_s),
        )
        .start();
        let open_timeout = Duration::from_secs_f64(config.limits.open_timeout_s);
        let setups = config
            .workers
            .iter()
            .map(|w| WorkerSetup {
                name: w.name.clone(),
                backend: w.source.label(),
                modes: w.modes.clone(),
                factory: backend::factory(w, open_timeout),
                node: None,
            })
            .collect();
        let limits = BackendLimits {
            max_pending_chunks: config.limits.max_pending_chunks,
            step_timeout: config.step_timeout(),
            open_timeout,
        };
        let recorder = config.recording.enabled.then(|| {
            let r = &config.recording;
            let limits = RecordingLimits {
                max_lag: (r.max_lag_mb * 1048576.0) as usize,
                max_total_lag: (r.max_total_lag_mb * 1048576.0) as usize,
                max_session: (r.max_session_mb * 1048576.0) as u64,
            };
            RecorderSpawner::new(r.dir.clone(), limits)
        });
        let subscribers = crate::subscribers::register(&config, recorder.as_ref());
        let pool = WorkerPoolActor::new(setups, queue.clone(), limits, subscribers.clone()).start();
        for link in &config.nodes {
            join_node(link.clone(), pool.clone());
        }
        let (queue, cluster) = match &config.cluster {
            Some(spec) => {
                let actor = cluster_queue(spec, &config, limits);
                (QueuePort::of(&actor), Some(actor.recipient()))
            }
            None => (QueuePort::of(&queue), None),
        };
        let keys = Keys::new(config.api_keys.clone(), config.admin_key.clone());
        let fragments = FragmentBudget::new((config.server.max_fragment_buffer_mb * 1048576.0) as usize);
        Gateway { config, queue, cluster, pool, registry: Registry::new(), recorder, subscribers, keys, fragments }
    }
}

/// A replica of a cluster: its queue is the store's, its workers the nodes' (each lent for
/// one session, attached with the store's grant).
fn cluster_queue(
    spec: &crate::config::ClusterSpec,
    config: &Config,
    limits: BackendLimits,
) -> Addr<omni_actors::cluster_queue_actor::ClusterQueueActor> {
    use omni_actors::cluster_queue_actor::{ClusterQueueActor, ClusterSetup};
    // The URL was opened once by the config's validation.
    let store = crate::cluster::redis::RedisStore::from_spec(spec)
        .expect("the cluster section was opened when the config was loaded");
    let template = crate::config::NodeLink {
        name: String::new(),
        address: String::new(),
        token: spec.token.clone(),
        ca: spec.ca.clone(),
        server_name: spec.server_name.clone(),
        heartbeat_interval: Duration::from_secs(1),
        heartbeat_timeout: Duration::from_secs(5),
    };
    let replica = spec.name.clone();
    let standby = backend::standby::Standby::new(spec.standby_links, replica.clone());
    let kept = standby.clone();
    let opener: omni_actors::cluster_queue_actor::GrantOpener =
        Arc::new(move |grant| backend::grant_opener(template.clone(), grant, replica.clone(), kept.clone()));
    log::info!(
        "replica {} of the cluster at {} (lease {:.1} s)",
        spec.name,
        spec.redacted_url(),
        spec.lease.as_secs_f64()
    );
    let setup = ClusterSetup {
        coordinator: store,
        opener,
        limits,
        max_waiting: config.queue.max_waiting,
        typical: [Mode::Chat, Mode::Video, Mode::Audio].map(|m| config.queue.typical(m)),
        update_interval: Duration::from_secs_f64(config.queue.update_interval_s),
        lease: spec.lease,
    };
    let queue = ClusterQueueActor::new(setup).start();
    // Grants nodes push on the links kept open to them reach the queue as the store's do.
    let to = queue.clone();
    standby.deliver_to(Box::new(move |grant| to.do_send(omni_actors::cluster_queue_actor::GrantPushed(grant))));
    queue
}

/// Reaches a node (`[[nodes]]`), trying again with backoff while it is down, and adds its
/// workers to the pool as `NODE/WORKER`. From then on each worker keeps its own link (and
/// reconnects by itself when the node comes back).
fn join_node(link: crate::config::NodeLink, pool: Addr<WorkerPoolActor>) {
    let gateway = format!("omni-gateway {} (pid {})", env!("CARGO_PKG_VERSION"), std::process::id());
    let spawned = std::thread::Builder::new().name(format!("join-{}", link.name)).spawn(move || {
        let mut failures = 0;
        loop {
            match backend::remote::discover(&link) {
                Ok(workers) => {
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
                    pool.do_send(omni_actors::pool_actor::JoinWorkers(setups));
                    return;
                }
                Err(e) => {
                    failures += 1;
                    let wait = omni_actors::pool::backoff(failures);
                    log::warn!("node {} ({}): {e}; trying again in {} ms", link.name, link.address, wait.as_millis());
                    std::thread::sleep(wait);
                }
            }
        }
    });
    if let Err(e) = spawned {
        log::error!("cannot start the thread that joins the node's workers: {e}");
    }
}

/// The TLS settings from a PEM certificate chain and private key (also what
/// `check-config` loads, so that it refuses what the server would). `section` names the
/// keys in errors (`server.tls`, `node.tls`).
pub fn tls_config(section: &str, cert: &Path, key: &Path) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{section}.cert: {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{section}.cert: {}: no certificate in the file", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{section}.key: {}: {e}", key.display()))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{section}: the certificate and key do not make a TLS identity: {e}"))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// Runs the sweep now and every `recording.sweep_interval_s`.
fn schedule_sweep(gw: &Gateway) {
    let Some(spawner) = &gw.recorder else { return };
    let root = spawner.root().to_path_buf();
    let r = &gw.config.recording;
    let retention = (r.retention_days > 0.0).then(|| Duration::from_secs_f64(r.retention_days * 86400.0));
    let cap = (r.max_total_gb > 0.0).then_some((r.max_total_gb * 1e9) as u64);
    if retention.is_none() && cap.is_none() {
        return;
    }
    let every = Duration::from_secs_f64(r.sweep_interval_s);
    actix_web::rt::spawn(async move {
        let mut ticks = actix_web::rt::time::interval(every);
        loop {
            ticks.tick().await;
            let (root, root_shown) = (root.clone(), root.clone());
            match web::block(move || recordings::sweep(&root, retention, cap, SystemTime::now())).await {
                Ok(Ok(s)) => {
                    for (dir, why) in &s.failed {
                        log::error!("recordings sweep: cannot delete {}: {why}", dir.display());
                    }
                    if s.deleted > 0 {
                        log::info!(
                            "recordings sweep: deleted {} sessions ({} bytes), kept {}",
                            s.deleted,
                            s.bytes,
                            s.kept
                        )
                    }
                }
                Ok(Err(e)) => log::error!("recordings sweep failed on {}: {e}", root_shown.display()),
                Err(e) => log::error!("recordings sweep failed: {e}"),
            }
        }
    });
}

async fn first_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// SIGHUP reloads the API keys (`auth.api_keys` and the keys file, read again); a file
/// that cannot be read or holds a bad key leaves the keys as they were.
async fn reload_on_hangup(gw: Gateway) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => return log::error!("cannot listen for SIGHUP: {e}"),
    };
    while hup.recv().await.is_some() {
        let config = gw.config.clone();
        match web::block(move || config.reload_api_keys()).await {
            Ok(Ok(keys)) => {
                let n = gw.keys.replace_api(keys);
                log::info!("SIGHUP: API keys reloaded: {n} key(s)");
            }
            Ok(Err(e)) => log::error!("SIGHUP: API keys not reloaded, the previous ones stay: {e}"),
            Err(e) => log::error!("SIGHUP: API keys not reloaded: {e}"),
        }
    }
}

/// Waits until `done()` or the deadline; returns whether it is done.
async fn wait_until(deadline: Instant, done: impl Fn() -> bool) -> bool {
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

async fn shutdown_on_signal(server: actix_web::dev::ServerHandle, gw: Gateway) {
    let signal = match first_signal().await {
        Ok(s) => s,
        Err(e) => {
            log::error!("cannot listen for signals: {e}");
            return;
        }
    };
    let grace = Duration::from_secs_f64(gw.config.server.shutdown_grace_s);
    log::info!("{signal}: shutting down (grace {grace:?}); a second signal exits at once");
    actix_web::rt::spawn(async {
        if let Ok(again) = first_signal().await {
            log::warn!("{again}: exiting now");
            std::process::exit(130);
        }
    });
    server.pause().await;
    let started = Instant::now();
    gw.registry.shutdown(grace);
    let registry = gw.registry.clone();
    if !wait_until(started + grace + Duration::from_secs(2), || registry.is_empty()).await {
        log::warn!("shutdown: {} sessions still open after the grace period", gw.registry.len());
    }
    if let Some(recorder) = &gw.recorder {
        let r = recorder.clone();
        if !wait_until(Instant::now() + Duration::from_secs(10), || r.unfinished() == 0).await {
            log::error!("shutdown: {} recordings not finalized", recorder.unfinished());
        }
    }
    match gw.pool.send(ShutdownPool { within: Duration::from_secs(5) }).await {
        Ok(closed) => log::info!("shutdown: {closed} of {} backends closed", gw.config.workers.len()),
        Err(_) => log::warn!("shutdown: the pool had already stopped"),
    }
    log::info!("shutdown complete in {} ms", started.elapsed().as_millis());
    server.stop(true).await;
}

/// Why an address cannot be listened on, in words.
pub fn listen_error(addr: std::net::SocketAddr, e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    let cause = match e.kind() {
        ErrorKind::AddrInUse => "address already in use (another server is listening there)".to_string(),
        ErrorKind::AddrNotAvailable => "address not available (it is not an address of this machine)".to_string(),
        ErrorKind::PermissionDenied => "permission denied (ports below 1024 need privileges)".to_string(),
        _ => e.to_string(),
    };
    format!("cannot listen on {addr}: {cause}")
}

/// Binds every address of `server.bind` before anything else starts.
fn listeners(config: &Config) -> Result<Vec<std::net::TcpListener>, String> {
    config.bind.iter().map(|addr| std::net::TcpListener::bind(addr).map_err(|e| listen_error(*addr, &e))).collect()
}

/// Runs the server until it is stopped. Prints `omni-gateway listening on ADDR` once bound.
pub fn run(config: Config) -> Result<(), String> {
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls_config("server.tls", cert, key)?),
        None => None,
    };
    let listeners = listeners(&config)?;
    match &config.recording {
        r if r.enabled => log::info!("recording is on: every session is recorded under {}", r.dir.display()),
        _ => log::info!("recording is off ([recording] enabled = false)"),
    }
    let system = actix_web::rt::System::new();
    system.block_on(async move {
        let gateway = Gateway::start(Arc::new(config));
        schedule_sweep(&gateway);
        let app_state = gateway.clone();
        let mut server = HttpServer::new(move || {
            App::new()
                .wrap(actix_web::middleware::DefaultHeaders::new().add(("X-Content-Type-Options", "nosniff")))
                .app_data(web::Data::new(app_state.clone()))
                .configure(routes::configure)
        })
        .disable_signals()
        // Realtime frames are small and must not wait for the peer's delayed ACK.
        .tcp_nodelay(true)
        // Keeps a handle to drop the connection of a client that does not read.
        .on_connect(crate::socket::on_connect)
        .shutdown_timeout(2);
        for listener in listeners {
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            server = match &tls {
                Some(tls) => server.listen_rustls_0_23(listener, tls.clone()),
                None => server.listen(listener),
            }
            .map_err(|e| listen_error(addr, &e))?;
        }
        let scheme = if gateway.config.tls.is_some() { "https/wss" } else { "http/ws" };
        let addrs = server.addrs();
        for addr in &addrs {
            log::info!("omni-gateway listening on {addr} ({scheme})");
            println!("omni-gateway listening on {addr}");
        }
        if let Some(addr) = addrs.first() {
            let web = if gateway.config.tls.is_some() { "https" } else { "http" };
            println!("talk to it: open {web}://{addr}/ in a browser (the console: {web}://{addr}/console)");
            if gateway.config.tls.is_none() {
                let me = std::env::args().next().unwrap_or_else(|| "omni-gateway".into());
                println!("try it (Ctrl-C stops the server gracefully): {me} probe --mode audio --url ws://{addr}");
            }
        }
        let server = server.run();
        actix_web::rt::spawn(shutdown_on_signal(server.handle(), gateway.clone()));
        actix_web::rt::spawn(reload_on_hangup(gateway));
        server.await.map_err(|e| e.to_string())
    })
}
