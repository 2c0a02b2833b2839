//! The HTTP server: routes and the actor system wired together.

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::config::Config;

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// Runs the server until it is stopped.
pub fn run(config: Config) -> std::io::Result<()> {
    actix_web::rt::System::new().block_on(async move {
        log::info!("omni-gateway listening on {}", config.bind);
        HttpServer::new(|| App::new().route("/healthz", web::get().to(healthz)))
            .bind(config.bind)?
            .run()
            .await
    })
}
