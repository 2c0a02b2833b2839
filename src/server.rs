//! The server: the actor system started from the configuration, and the HTTP server
//! around it.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::{App, HttpServer, web};
use omni_actors::backend_actor::BackendLimits;
use omni_actors::domain::Mode;
use omni_actors::pool_actor::{WorkerPoolActor, WorkerSetup};
use omni_actors::queue_actor::QueueActor;

use crate::backend;
use crate::config::{BackendSource, Config};
use crate::routes;

/// The running actor system, shared by every HTTP worker.
#[derive(Clone)]
pub struct Gateway {
    pub config: Arc<Config>,
    pub queue: Addr<QueueActor>,
    pub pool: Addr<WorkerPoolActor>,
}

impl Gateway {
    /// Starts the queue and the pool (which starts one BackendActor per worker).
    /// Must run inside an actix system.
    pub fn start(config: Arc<Config>) -> Gateway {
        let modes: Vec<Vec<Mode>> = config.workers.iter().map(|w| w.modes.clone()).collect();
        // Until sessions have ended, a waiting client's ETA assumes sessions run to their limit.
        let average =
            [Mode::Chat, Mode::Video, Mode::Audio].map(|m| config.limits.session_limit(m));
        let queue = QueueActor::new(
            &modes,
            config.queue.max_waiting,
            average,
            Duration::from_secs_f64(config.queue.update_interval_s),
        )
        .start();
        let setups = config
            .workers
            .iter()
            .map(|w| WorkerSetup {
                name: w.name.clone(),
                backend: match &w.source {
                    BackendSource::Builtin => "builtin".to_string(),
                    BackendSource::Library(p) => p.display().to_string(),
                },
                modes: w.modes.clone(),
                factory: backend::factory(w),
            })
            .collect();
        let limits = BackendLimits {
            max_pending_chunks: config.limits.max_pending_chunks,
            step_timeout: config.step_timeout(),
        };
        let pool = WorkerPoolActor::new(setups, queue.clone(), limits).start();
        Gateway {
            config,
            queue,
            pool,
        }
    }
}

/// Runs the server until it is stopped. Prints `omni-gateway listening on ADDR` once bound.
pub fn run(config: Config) -> std::io::Result<()> {
    let system = actix_web::rt::System::new();
    system.block_on(async move {
        let bind = config.bind;
        let gateway = Gateway::start(Arc::new(config));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new(gateway.clone()))
                .configure(routes::configure)
        })
        .bind(bind)?;
        for addr in server.addrs() {
            log::info!("omni-gateway listening on {addr}");
            println!("omni-gateway listening on {addr}");
        }
        server.run().await
    })
}
