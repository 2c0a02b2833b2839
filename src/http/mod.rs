//! The HTTP server of a gateway or a replica: the routes ([`routes`]) over the actors its role
//! started ([`crate::roles::Serving`]), TLS, API and admin keys ([`crate::auth`]), the recording sweep,
//! and graceful shutdown.
//!
//! Shutdown (SIGINT or SIGTERM): stop accepting connections; every session is told
//! (waiting clients at once, active ones once the step in flight has finished, at most
//! `server.shutdown_grace_s`), recordings are finalized, backends closed, and the process
//! exits 0. A second signal exits at once.

pub(crate) mod body;
pub(crate) mod routes;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix_web::{App, HttpServer, web};
use omni_actors::messages::pool::ShutdownPool;

use crate::config::BackendSource;
use crate::config::Config;
use crate::listen::{ServeError, listen_error, tls_config};
use crate::observe::recordings;
use crate::roles::Serving;

/// What the routes share: the serving role's actors.
pub type Gateway = Serving;

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

/// SIGHUP reloads the API keys (`auth.api_keys` and the keys file, read again); a file
/// that cannot be read or holds a bad key leaves the keys as they were.
async fn reload_on_hangup(mut hup: tokio::signal::unix::Signal, gw: Gateway) {
    while hup.recv().await.is_some() {
        let config = gw.config.clone();
        match web::block(move || config.reload_api_keys()).await {
            Ok(Ok(keys)) => {
                let (n, revoked) = gw.keys.replace_api(keys);
                log::info!("SIGHUP: API keys reloaded: {n} key(s); {revoked} client secret(s) of removed keys revoked");
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

async fn shutdown_on_signal(mut stop: crate::signals::Stop, server: actix_web::dev::ServerHandle, gw: Gateway) {
    let signal = stop.next().await;
    let grace = Duration::from_secs_f64(gw.config.server.shutdown_grace_s);
    log::info!("{signal}: shutting down (grace {grace:?}); a second signal exits at once");
    actix_web::rt::spawn(async move {
        let again = stop.next().await;
        log::warn!("{again}: exiting now");
        std::process::exit(130);
    });
    server.pause().await;
    let started = Instant::now();
    gw.registry.shutdown(grace);
    let registry = gw.registry.clone();
    if !wait_until(started + grace + Duration::from_secs(2), || registry.is_empty()).await {
        log::warn!("shutdown: {} sessions still open after the grace period", gw.registry.len());
    }
    if let Some(recorder) = &gw.recorder
        && actix_web::rt::time::timeout(Duration::from_secs(10), recorder.finalized()).await.is_err()
    {
        log::error!("shutdown: {} recordings not finalized", recorder.unfinished());
    }
    match gw.pool.shutdown.send(ShutdownPool { within: Duration::from_secs(5) }).await {
        Ok(closed) => log::info!("shutdown: {closed} of {} backends closed", gw.config.workers.len()),
        Err(_) => log::warn!("shutdown: the pool had already stopped"),
    }
    log::info!("shutdown complete in {} ms", started.elapsed().as_millis());
    server.stop(true).await;
}

/// Binds every address of `server.bind` before anything else starts.
fn listeners(config: &Config) -> Result<Vec<std::net::TcpListener>, ServeError> {
    let bind = |addr: &std::net::SocketAddr| {
        std::net::TcpListener::bind(addr).map_err(|e| ServeError::Listen(listen_error(*addr, &e)))
    };
    config.bind.iter().map(bind).collect()
}

/// Runs the server until it is stopped. Prints `omni-gateway listening on ADDR` once bound.
pub fn run(config: Config) -> Result<(), ServeError> {
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls_config("server.tls", cert, key)?),
        None => None,
    };
    let listeners = listeners(&config)?;
    match &config.recording {
        r if r.enabled => log::info!("recording is on: every session is recorded under {}", r.dir.display()),
        _ => log::info!("recording is off ([recording] enabled = false)"),
    }
    if config.admin_key.is_none() && !config.trusted_proxies.is_empty() {
        log::warn!(
            "no [auth] admin_key, and requests through [server] trusted_proxies are not local: the operator \
             routes (/status, /metrics, /sessions, /queue) answer only requests made on this host, not through a proxy"
        );
    }
    let system = actix_web::rt::System::new();
    system.block_on(async move {
        let gateway = crate::roles::serve(Arc::new(config))?;
        schedule_sweep(&gateway);
        let app_state = gateway.clone();
        let origins = gateway.config.server.allowed_origins.clone();
        let mut server = HttpServer::new(move || {
            App::new()
                .wrap(actix_web::middleware::DefaultHeaders::new().add(("X-Content-Type-Options", "nosniff")))
                .app_data(web::Data::new(app_state.clone()))
                .configure(|cfg| routes::configure(cfg, &origins))
        })
        .disable_signals()
        // Realtime frames are small and must not wait for the peer's delayed ACK.
        .tcp_nodelay(true)
        // Keeps a handle to drop the connection of a client that does not read.
        .on_connect(omni_transports::socket::on_connect)
        .shutdown_timeout(2);
        for listener in listeners {
            let addr = listener.local_addr()?;
            server = match &tls {
                Some(tls) => server.listen_rustls_0_23(listener, tls.clone()),
                None => server.listen(listener),
            }
            .map_err(|e| ServeError::Listen(listen_error(addr, &e)))?;
        }
        let signals = crate::signals::register()?;
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
                // The reference backend answers a tone (the probe's default); a real model
                // answers words: a spoken question (espeak-ng, on the probe's side).
                let model = gateway.config.workers.iter().any(|w| !matches!(w.source, BackendSource::Builtin))
                    || !gateway.config.nodes.is_empty();
                let say = if model { " --say \"What is the capital of France?\"" } else { "" };
                let key = if gateway.keys.api_required() { " --api-key KEY" } else { "" };
                let which = if key.is_empty() { "" } else { " (KEY: one of [auth] api_keys)" };
                println!(
                    "try it (Ctrl-C stops the server gracefully): {me} probe --mode audio --url ws://{addr}{key}{say}{which}"
                );
            }
        }
        if let Some(calls) = &gateway.calls {
            let spec = calls.spec();
            let advertised: Vec<String> = spec.public_ips.iter().map(ToString::to_string).collect();
            let line = format!(
                "WebRTC calls are on: UDP {}, ports {}-{}, advertised to callers as {}",
                spec.bind,
                spec.ports.start(),
                spec.ports.end(),
                advertised.join(", ")
            );
            log::info!("{line}");
            println!("{line}");
        } else {
            println!("WebRTC calls are off ([webrtc] enabled = false): clients connect over WebSocket");
        }
        if let Some(spec) = gateway.config.sip.clone() {
            let rtp = format!("RTP on {} ports {}-{}", spec.public_ip, spec.rtp_ports.start(), spec.rtp_ports.end());
            let bind = spec.bind;
            let parts = omni_transports::sip::SipParts {
                spec,
                host: Arc::new(crate::admission::SipCalls(gateway.clone())),
                default_model: gateway.config.models.first().map(|m| m.name.clone()).unwrap_or_default(),
                offers: gateway.sip_calls.clone(),
                max_connections_per_ip: gateway.config.server.max_connections_per_ip,
                max_incoming_bytes: gateway.config.server.max_incoming_bytes as usize,
                incoming: gateway.incoming.clone(),
                liveness: gateway.sip.clone(),
            };
            let bound = omni_transports::sip::start(parts)
                .await
                .map_err(|e| ServeError::Listen(format!("[sip] {}", listen_error(bind, &e))))?;
            let line = format!("SIP calls are on: UDP {bound}, {rtp}");
            log::info!("{line}");
            println!("{line}");
        }
        let server = server.run();
        actix_web::rt::spawn(shutdown_on_signal(signals.stop, server.handle(), gateway.clone()));
        actix_web::rt::spawn(reload_on_hangup(signals.hangup, gateway));
        Ok(server.await?)
    })
}
