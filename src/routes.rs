//! HTTP routes: the realtime WebSocket endpoint, health, and the operator routes
//! (status, metrics, recordings, queue cancellation).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use omni_actors::domain::Mode;
use omni_actors::metrics::metrics as gateway_metrics;
use omni_actors::outgoing::{Metered, OutgoingLimit, OutgoingMeter};
use omni_actors::pool::WorkerState;
use omni_actors::pool_actor::PoolSnapshot;
use omni_actors::queue_actor::{Cancel, QueueSnapshot};
use omni_actors::recorder::Recording;
use omni_actors::registry::Refusal;
use omni_actors::session::{ClientInfo, SessionActor, SessionLinks, SessionSettings};
use serde_json::json;

use crate::auth::{self, Denied};
use crate::dialect::openai::{Flavor, Realtime};
use crate::dialect::select::MiniCpmEndpoint;
use crate::recordings;
use crate::server::Gateway;
use omni_actors::dialect::Dialect;
use omni_actors::protocol::ProtocolError;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/realtime", web::get().to(realtime))
        .route("/api-ws/v1/realtime", web::get().to(qwen_realtime))
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/status", web::get().to(status))
        .route("/metrics", web::get().to(metrics))
        .route("/sessions", web::get().to(sessions))
        .route("/sessions/{id}", web::get().to(session_meta))
        .route("/sessions/{id}/{file:.*}", web::get().to(session_file))
        .route("/queue/{ticket}", web::delete().to(cancel_ticket));
}

/// An HTTP error with the same JSON shape as the WebSocket `error` event.
pub fn http_error(status: StatusCode, code: &str, message: impl Into<String>) -> HttpResponse {
    let kind = if status.is_client_error() { "client_error" } else { "server_error" };
    HttpResponse::build(status).json(json!({"error": {"code": code, "message": message.into(), "type": kind}}))
}

fn refuse(reason: &str, status: StatusCode, code: &str, message: impl Into<String>) -> HttpResponse {
    gateway_metrics().connections_refused.with_label_values(&[reason]).inc();
    http_error(status, code, message)
}

fn unauthorized(denied: Denied, what: &str) -> HttpResponse {
    refuse("unauthorized", StatusCode::UNAUTHORIZED, "unauthorized", denied.message(what))
}

/// The admin key check of the operator routes; `Some` is the refusal.
fn admin(req: &HttpRequest, gw: &Gateway) -> Option<HttpResponse> {
    gw.keys
        .check_admin(req)
        .err()
        .map(|d| http_error(StatusCode::UNAUTHORIZED, "unauthorized", d.message("the admin key")))
}

/// Which wire dialect a connection speaks, from its URL and headers.
enum Endpoint {
    /// `/v1/realtime?mode=`: MiniCPM-o, current or earlier dialect.
    MiniCpm(Mode),
    /// `/v1/realtime?model=` (no mode), or `/api-ws/v1/realtime`: the OpenAI shape.
    Realtime(Flavor, String),
}

// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
fn query_of(req: &HttpRequest) -> Result<HashMap<String, String>, HttpResponse> {
    web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .map_err(|e| http_error(StatusCode::BAD_REQUEST, "invalid_payload", format!("bad query string: {e}")))
}

/// The subprotocols a browser client offered.
fn subprotocols(req: &HttpRequest) -> Vec<&str> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

async fn realtime(req: HttpRequest, payload: web::Payload, gw: web::Data<Gateway>) -> actix_web::Result<HttpResponse> {
    let query = match query_of(&req) {
        Ok(q) => q,
        Err(refusal) => return Ok(refusal),
    };
    let endpoint = match (query.get("mode"), query.get("model")) {
        (None, Some(model)) => {
            let beta = req
                .headers()
                .get("openai-beta")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("realtime=v1"))
                || subprotocols(&req).contains(&"openai-beta.realtime-v1");
            Endpoint::Realtime(if beta { Flavor::Beta } else { Flavor::Ga }, model.clone())
        }
        (None, None) => Endpoint::MiniCpm(Mode::Video),
        (Some(m), _) => match m.parse::<Mode>() {
            Ok(mode) => Endpoint::MiniCpm(mode),
            Err(e) => return Ok(http_error(StatusCode::BAD_REQUEST, "invalid_payload", format!("mode: {e}"))),
        },
    };
    upgrade(req, payload, gw, endpoint, query).await
}

async fn qwen_realtime(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
    let query = match query_of(&req) {
        Ok(q) => q,
        Err(refusal) => return Ok(refusal),
    };
    let model = query.get("model").cloned().unwrap_or_default();
    upgrade(req, payload, gw, Endpoint::Realtime(Flavor::Qwen, model), query).await
}

async fn upgrade(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
    endpoint: Endpoint,
    query: HashMap<String, String>,
) -> actix_web::Result<HttpResponse> {
    let config = &gw.config;
    if !auth::origin_allowed(&req, &config.server.allowed_origins) {
        return Ok(refuse("forbidden_origin", StatusCode::FORBIDDEN, "forbidden_origin", "this Origin is not allowed"));
    }
    let protocols = subprotocols(&req);
    let browser_key = protocols.iter().find_map(|p| p.strip_prefix("openai-insecure-api-key."));
    if let Err(denied) = gw.keys.check_api([auth::bearer(&req), query.get("api_key").map(String::as_str), browser_key])
    {
        return Ok(unauthorized(denied, "an API key"));
    }
    let admission = match gw.registry.admit(req.peer_addr().map(|a| a.ip()), config.server.max_connections_per_ip) {
        Ok(a) => a,
        Err(Refusal::TooManyConnections) => {
            return Ok(refuse(
                "too_many_connections",
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_connections",
                format!("at most {} connections per address", config.server.max_connections_per_ip),
            ));
        }
        Err(Refusal::ShuttingDown) => {
            return Ok(refuse(
                "shutting_down",
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "the server is stopping",
            ));
        }
    };
    let (mode, dialect, reject): (Mode, Box<dyn Dialect>, Option<ProtocolError>) = match &endpoint {
        Endpoint::MiniCpm(mode) => {
            (*mode, Box::new(MiniCpmEndpoint::new(*mode, config.limits.min_audio_samples)), None)
        }
        Endpoint::Realtime(flavor, model) => match config.model_mode(model) {
            Some(mode) => (mode, Box::new(Realtime::new(*flavor, model)), None),
            None => {
                let known: Vec<&str> = config.models.iter().map(|m| m.name.as_str()).collect();
                let e = ProtocolError::ModelNotFound(format!(
                    "model '{model}' is not served here (known: {})",
                    known.join(", ")
                ));
                (Mode::Audio, Box::new(Realtime::new(*flavor, model)), Some(e))
            }
        },
    };
    let settings = SessionSettings {
        mode,
        time_limit: config.limits.session_limit(mode),
        context_tokens: config.limits.context_tokens,
        max_frame_bytes: config.server.max_frame_bytes,
        heartbeat_interval: config.server.heartbeat_interval(),
        heartbeat_timeout: config.server.heartbeat_timeout(),
        reject,
    };
    let client = ClientInfo {
        addr: req.peer_addr().map_or_else(|| "unknown".to_string(), |a| a.to_string()),
        user_agent: req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from),
    };
    let recording = match &gw.recorder {
        Some(spawner) => Recording::new(spawner.clone(), Instant::now()),
        None => Recording::off(),
    };
    let meter = Arc::new(OutgoingMeter::default());
    if req.conn_data::<crate::socket::ConnSocket>().is_none() {
        log::warn!("no handle on this connection's socket: its outgoing buffer is unbounded");
    }
    let links = SessionLinks {
        queue: gw.queue.clone(),
        registry: gw.registry.clone(),
        admission: Some(admission),
        recording,
        client,
        outgoing: req.conn_data::<crate::socket::ConnSocket>().map(|socket| OutgoingLimit {
            meter: meter.clone(),
            max_bytes: config.server.max_outgoing_bytes,
            disconnect: Box::new(socket.cutter()),
        }),
    };
    let actor = SessionActor::new(settings, dialect, links);
    // Browsers offer `realtime` (with their key as a subprotocol): the server selects it.
    let mut response = if protocols.is_empty() {
        ws::handshake(&req)?
    } else {
        ws::handshake_with_protocols(&req, &["realtime", "openai-beta.realtime-v1"])?
    };
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    Ok(response.streaming(Metered::new(ws::WebsocketContext::with_codec(actor, payload, codec), meter)))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

async fn readyz(gw: web::Data<Gateway>) -> HttpResponse {
    let ready = match gw.pool.send(PoolSnapshot).await {
        Ok(workers) => workers.iter().any(|w| !matches!(w.state, WorkerState::Failed { .. })),
        Err(_) => false,
    };
    if ready && !gw.registry.shutting_down() {
        HttpResponse::Ok().json(json!({"status": "ready"}))
    } else {
        http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "no worker can serve")
    }
}

async fn status(req: HttpRequest, gw: web::Data<Gateway>) -> actix_web::Result<HttpResponse> {
    if let Some(refusal) = admin(&req, &gw) {
        return Ok(refusal);
    }
    let unavailable = |_| actix_web::error::ErrorServiceUnavailable("the actor system is stopping");
    let workers = gw.pool.send(PoolSnapshot).await.map_err(unavailable)?;
    let tickets = gw.queue.send(QueueSnapshot).await.map_err(unavailable)?;
    let workers: Vec<_> = workers
        .iter()
        .map(|w| {
            let (session, mode, dialect) = match &w.state {
                WorkerState::Busy { session, mode, dialect, .. } => {
                    (Some(session.as_str()), Some(mode.as_str()), *dialect)
                }
                _ => (None, None, None),
            };
            let reason = match &w.state {
                WorkerState::Failed { reason, .. } => Some(reason.as_str()),
                _ => None,
            };
            json!({
                "name": w.name,
                "backend": w.backend,
                "modes": w.modes.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "state": w.state.name(),
                "failure": reason,
                "session": session,
                "mode": mode,
                "dialect": dialect,
                "sessions_served": w.sessions_served,
                "restarts": w.restarts,
                "process_id": w.process_id,
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
    let active: serde_json::Map<String, serde_json::Value> =
        Mode::ALL.iter().map(|m| (m.as_str().to_string(), json!(gw.registry.active(*m)))).collect();
    Ok(HttpResponse::Ok().json(json!({
        "workers": workers,
        "queue": {"length": tickets.len(), "tickets": tickets},
        "sessions": {"open": gw.registry.len(), "active": active},
    })))
}

async fn metrics(req: HttpRequest, gw: web::Data<Gateway>) -> HttpResponse {
    if let Some(refusal) = admin(&req, &gw) {
        return refusal;
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(gateway_metrics().render())
}

// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
fn recording_root(gw: &Gateway) -> Result<std::path::PathBuf, HttpResponse> {
    match &gw.recorder {
        Some(r) => Ok(r.root().to_path_buf()),
        None => {
            Err(http_error(StatusCode::NOT_FOUND, "not_found", "recording is disabled ([recording] enabled = false)"))
        }
    }
}

#[derive(serde::Deserialize)]
struct Page {
    page: Option<usize>,
    per_page: Option<usize>,
}

async fn sessions(req: HttpRequest, gw: web::Data<Gateway>, page: web::Query<Page>) -> HttpResponse {
    if let Some(refusal) = admin(&req, &gw) {
        return refusal;
    }
    let root = match recording_root(&gw) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let (number, per_page) = (page.page.unwrap_or(1).max(1), page.per_page.unwrap_or(50).clamp(1, 1000));
    match web::block(move || recordings::list(&root, number, per_page)).await {
        Ok(Ok((total, items))) => {
            HttpResponse::Ok().json(json!({"page": number, "per_page": per_page, "total": total, "sessions": items}))
        }
        _ => http_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "cannot list the recordings"),
    }
}

async fn session_meta(req: HttpRequest, gw: web::Data<Gateway>, id: web::Path<String>) -> HttpResponse {
    serve_file(&req, &gw, &id, "meta.json").await
}

async fn session_file(req: HttpRequest, gw: web::Data<Gateway>, path: web::Path<(String, String)>) -> HttpResponse {
    let (id, file) = path.into_inner();
    serve_file(&req, &gw, &id, &file).await
}

async fn serve_file(req: &HttpRequest, gw: &Gateway, id: &str, file: &str) -> HttpResponse {
    if let Some(refusal) = admin(req, gw) {
        return refusal;
    }
    let root = match recording_root(gw) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if !recordings::valid_session_id(id) || !recordings::valid_file(file) {
        return http_error(StatusCode::BAD_REQUEST, "invalid_payload", "not a session id and file of a recording");
    }
    let (id, name) = (id.to_string(), file.to_string());
    let path = match web::block(move || recordings::find(&root, &id).map(|dir| dir.join(name))).await {
        Ok(Some(path)) if path.is_file() => path,
        _ => return http_error(StatusCode::NOT_FOUND, "not_found", "no such recorded session or file"),
    };
    match actix_files::NamedFile::open_async(&path).await {
        Ok(f) => f.into_response(req),
        Err(_) => http_error(StatusCode::NOT_FOUND, "not_found", "no such file"),
    }
}

async fn cancel_ticket(req: HttpRequest, gw: web::Data<Gateway>, ticket: web::Path<String>) -> HttpResponse {
    if let Some(refusal) = admin(&req, &gw) {
        return refusal;
    }
    let Some(number) = ticket.strip_prefix("ticket_").and_then(|n| n.parse::<u64>().ok()) else {
        return http_error(StatusCode::BAD_REQUEST, "invalid_payload", "a ticket id looks like ticket_12");
    };
    match gw.queue.send(Cancel { ticket: number }).await {
        Ok(true) => HttpResponse::Ok().json(json!({"cancelled": ticket.as_str()})),
        Ok(false) => http_error(StatusCode::NOT_FOUND, "not_found", "no such waiting ticket"),
        Err(_) => http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "the server is stopping"),
    }
}
