//! HTTP routes: the realtime endpoints (`realtime/`: WebSocket, WebRTC calls, client secrets), health, the operator
//! routes (`admin.rs`: status, metrics, recordings, queue cancellation), and the pages
//! (`pages.rs`: the client and the console).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use omni_actors::pool::messages::PoolSnapshot;
use omni_actors::pool::messages::WorkerState;
use serde_json::json;

use crate::http::Gateway;

mod admin;
mod pages;
mod realtime;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/realtime", web::get().to(realtime::websocket::realtime))
        .route("/api-ws/v1/realtime", web::get().to(realtime::websocket::qwen_realtime))
        .route("/v1/realtime/calls", web::post().to(realtime::calls::create))
        .route("/v1/realtime/calls/{id}/hangup", web::post().to(realtime::calls::hang_up))
        .route("/v1/realtime/calls/{id}", web::delete().to(realtime::calls::hang_up))
        .route("/v1/realtime/client_secrets", web::post().to(realtime::client_secrets::mint))
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/v1/modes", web::get().to(modes))
        .route("/status", web::get().to(admin::status))
        .route("/metrics", web::get().to(admin::metrics))
        .route("/sessions", web::get().to(admin::sessions))
        .route("/sessions/{id}", web::get().to(admin::session_meta))
        .route("/sessions/{id}/{file:.*}", web::get().to(admin::session_file))
        .route("/queue/{ticket}", web::delete().to(admin::cancel_ticket))
        .route("/", web::get().to(pages::client))
        .route("/console", web::get().to(pages::console))
        .route("/app/{name}", web::get().to(pages::app));
}

/// An HTTP error with the same JSON shape as the WebSocket `error` event.
pub fn http_error(status: StatusCode, code: &str, message: impl Into<String>) -> HttpResponse {
    let kind = if status.is_client_error() { "client_error" } else { "server_error" };
    HttpResponse::build(status).json(json!({"error": {"code": code, "message": message.into(), "type": kind}}))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// The modes served, and whether a worker of each is up now: the client page offers only
/// those, and says plainly when none is up. Public, as `/healthz` (it names no worker).
async fn modes(gw: web::Data<Gateway>) -> HttpResponse {
    use omni_actors::domain::Mode;
    // Each worker's modes, and whether it is up (opened and not failed).
    let workers: Vec<(Vec<Mode>, bool)> = match &gw.cluster {
        Some(cluster) => match cluster.send(omni_actors::queue::messages::ClusterStatusQuery).await {
            Ok(c) => c
                .view
                .slots
                .iter()
                .map(|s| (s.modes.clone(), s.state != omni_actors::edge::coordinator::SlotState::Down))
                .collect(),
            Err(_) => Vec::new(),
        },
        None => match gw.pool.snapshot.send(PoolSnapshot).await {
            Ok(ws) => ws
                .iter()
                .map(|w| (w.modes.clone(), !matches!(w.state, WorkerState::Failed { .. } | WorkerState::Starting)))
                .collect(),
            Err(_) => Vec::new(),
        },
    };
    let mut out = serde_json::Map::new();
    for mode in Mode::ALL {
        let of_mode: Vec<bool> = workers.iter().filter(|(m, _)| m.contains(&mode)).map(|(_, up)| *up).collect();
        out.insert(mode.as_str().to_string(), json!({"served": !of_mode.is_empty(), "up": of_mode.iter().any(|u| *u)}));
    }
    // Whether the page may call over WebRTC (`[webrtc] enabled`).
    HttpResponse::Ok().json(json!({"modes": out, "webrtc": gw.calls.is_some()}))
}

async fn readyz(gw: web::Data<Gateway>) -> HttpResponse {
    let ready = match &gw.cluster {
        // A replica: it reaches the store, and some node's worker can serve.
        Some(cluster) => match cluster.send(omni_actors::queue::messages::ClusterStatusQuery).await {
            Ok(c) => {
                c.store_up && c.view.slots.iter().any(|s| s.state != omni_actors::edge::coordinator::SlotState::Down)
            }
            Err(_) => false,
        },
        None => match gw.pool.snapshot.send(PoolSnapshot).await {
            Ok(workers) => workers.iter().any(|w| !matches!(w.state, WorkerState::Failed { .. })),
            Err(_) => false,
        },
    };
    if ready && !gw.registry.shutting_down() {
        HttpResponse::Ok().json(json!({"status": "ready"}))
    } else {
        http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "no worker can serve")
    }
}
