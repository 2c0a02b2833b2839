//! HTTP routes: the realtime WebSocket endpoint, health and status.

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use omni_actors::domain::Mode;
use omni_actors::pool::WorkerState;
use omni_actors::pool_actor::PoolSnapshot;
use omni_actors::queue_actor::QueueSnapshot;
use omni_actors::session::{SessionActor, SessionSettings};
use serde_json::json;

use crate::dialect::select::MiniCpmEndpoint;
use crate::server::Gateway;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/realtime", web::get().to(realtime))
        .route("/healthz", web::get().to(healthz))
        .route("/status", web::get().to(status));
}

/// An HTTP error with the same JSON shape as the WebSocket `error` event.
fn http_error(status: StatusCode, code: &str, message: impl Into<String>) -> HttpResponse {
    let kind = if status.is_client_error() {
        "client_error"
    } else {
        "server_error"
    };
    HttpResponse::build(status)
        .json(json!({"error": {"code": code, "message": message.into(), "type": kind}}))
}

async fn realtime(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
    let query = match web::Query::<HashMap<String, String>>::from_query(req.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => {
            return Ok(http_error(
                StatusCode::BAD_REQUEST,
                "invalid_payload",
                format!("bad query string: {e}"),
            ));
        }
    };
    let mode = match query.get("mode").map(|m| m.parse::<Mode>()) {
        None => Mode::Video,
        Some(Ok(mode)) => mode,
        Some(Err(e)) => {
            return Ok(http_error(
                StatusCode::BAD_REQUEST,
                "invalid_payload",
                format!("mode: {e}"),
            ));
        }
    };
    let config = &gw.config;
    let settings = SessionSettings {
        mode,
        time_limit: config.limits.session_limit(mode),
        context_tokens: config.limits.context_tokens,
        max_frame_bytes: config.server.max_frame_bytes,
        heartbeat_interval: config.server.heartbeat_interval(),
        heartbeat_timeout: config.server.heartbeat_timeout(),
    };
    let peer = req
        .peer_addr()
        .map_or_else(|| "unknown".to_string(), |a| a.to_string());
    let dialect = Box::new(MiniCpmEndpoint::new(mode, config.limits.min_audio_samples));
    let actor = SessionActor::new(settings, dialect, gw.queue.clone(), peer);
    let mut response = ws::handshake(&req)?;
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    Ok(response.streaming(ws::WebsocketContext::with_codec(actor, payload, codec)))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

async fn status(gw: web::Data<Gateway>) -> actix_web::Result<HttpResponse> {
    let unavailable = |_| actix_web::error::ErrorServiceUnavailable("the actor system is stopping");
    let workers = gw.pool.send(PoolSnapshot).await.map_err(unavailable)?;
    let tickets = gw.queue.send(QueueSnapshot).await.map_err(unavailable)?;
    let workers: Vec<_> = workers
        .iter()
        .map(|w| {
            let (session, mode, dialect) = match &w.state {
                WorkerState::Busy {
                    session,
                    mode,
                    dialect,
                    ..
                } => (Some(session.as_str()), Some(mode.as_str()), *dialect),
                _ => (None, None, None),
            };
            json!({
                "name": w.name,
                "backend": w.backend,
                "modes": w.modes.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "state": w.state.name(),
                "session": session,
                "mode": mode,
                "dialect": dialect,
                "sessions_served": w.sessions_served,
                "restarts": w.restarts,
                "last_error": w.last_error,
            })
        })
        .collect();
    let tickets: Vec<_> = tickets
        .iter()
        .map(|t| {
            json!({
                "ticket_id": format!("ticket_{}", t.ticket),
                "mode": t.mode.as_str(),
                "position": t.position,
                "waited_s": t.waited.as_secs_f64(),
                "estimated_wait_s": t.estimated_wait_s,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "workers": workers,
        "queue": {"length": tickets.len(), "tickets": tickets},
    })))
}
