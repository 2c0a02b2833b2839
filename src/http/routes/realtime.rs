//! The realtime WebSocket endpoint: which dialect a connection speaks (from its URL and
//! headers), the checks before the upgrade (origin, key, per-address caps), and the
//! WebSocket edge it becomes, which starts the connection's SessionActor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use omni_actors::domain::Mode;
use omni_actors::edge::dialect::Dialect;
use omni_actors::observe::events::SessionInfo;
use omni_actors::protocol::ProtocolError;
use omni_actors::session::registry::{AddressCaps, Refusal};
use omni_actors::session::{ClientInfo, SessionActor, SessionLinks, SessionSettings};

use super::{http_error, refuse};
use crate::dialect::openai::{Flavor, Realtime};
use crate::dialect::select::MiniCpmEndpoint;
use crate::http::Gateway;
use crate::http::auth::{self, Denied};
use crate::transport::outgoing::{Metered, OutgoingLimit, OutgoingMeter};
use crate::transport::socket::ConnSocket;
use crate::transport::websocket::{EdgeSettings, WebSocketEdge};

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

pub async fn realtime(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
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

pub async fn qwen_realtime(
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

fn key_refusal(denied: Denied) -> HttpResponse {
    match denied {
        Denied::Throttled => {
            refuse("too_many_attempts", StatusCode::TOO_MANY_REQUESTS, "too_many_attempts", denied.message())
        }
        _ => refuse("unauthorized", StatusCode::UNAUTHORIZED, "unauthorized", denied.message()),
    }
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
    let client_ip = auth::client_ip(&req, &config.trusted_proxies);
    let protocols = subprotocols(&req);
    let browser_key = protocols.iter().find_map(|p| p.strip_prefix("openai-insecure-api-key."));
    let presented = [auth::bearer(&req), query.get("api_key").map(String::as_str), browser_key];
    let turn = gw.keys.pace(client_ip).await;
    let checked = gw.keys.check_api(client_ip, presented);
    drop(turn);
    let key_id = match checked {
        Ok(id) => id,
        Err(denied) => return Ok(key_refusal(denied)),
    };
    let caps =
        AddressCaps { connections: config.server.max_connections_per_ip, waiting: config.server.max_waiting_per_ip };
    let admission = match gw.registry.admit(client_ip, caps) {
        Ok(a) => a,
        Err(Refusal::TooManyConnections) => {
            return Ok(refuse(
                "too_many_connections",
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_connections",
                format!("at most {} connections per address (server.max_connections_per_ip)", caps.connections),
            ));
        }
        Err(Refusal::TooManyWaiting) => {
            return Ok(refuse(
                "too_many_waiting",
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_waiting",
                format!(
                    "at most {} connections per address may wait for a worker (server.max_waiting_per_ip)",
                    caps.waiting
                ),
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
        Endpoint::MiniCpm(mode) => (*mode, Box::new(MiniCpmEndpoint::new(*mode, config.dialect_limits())), None),
        Endpoint::Realtime(flavor, model) => match config.model_mode(model) {
            Some(mode) => (
                mode,
                Box::new(
                    Realtime::new(*flavor, model, config.dialect_limits(), &gw.voice)
                        .with_gateway_transcription(gw.transcription.is_some()),
                ),
                None,
            ),
            None => {
                let known: Vec<&str> = config.models.iter().map(|m| m.name.as_str()).collect();
                let e = ProtocolError::ModelNotFound(format!(
                    "model '{model}' is not served here (known: {})",
                    known.join(", ")
                ));
                (
                    Mode::Audio,
                    Box::new(
                        Realtime::new(*flavor, model, config.dialect_limits(), &gw.voice)
                            .with_gateway_transcription(gw.transcription.is_some()),
                    ),
                    Some(e),
                )
            }
        },
    };
    let settings = SessionSettings {
        mode,
        time_limit: config.limits.session_limit(mode),
        context_tokens: config.limits.context_tokens,
        max_turns: config.limits.max_pending_turns + 1,
        reject,
    };
    let edge_settings = EdgeSettings {
        max_frame_bytes: config.server.max_frame_bytes,
        heartbeat_interval: config.server.heartbeat_interval(),
        heartbeat_timeout: config.server.heartbeat_timeout(),
        message_timeout: Duration::from_secs_f64(config.server.message_timeout_s),
        rate: config.message_rate(),
    };
    let peer_port = req.peer_addr().map_or(0, |a| a.port());
    let client = ClientInfo {
        addr: client_ip
            .map_or_else(|| "unknown".to_string(), |ip| std::net::SocketAddr::new(ip, peer_port).to_string()),
        user_agent: req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from),
    };
    let conn = omni_actors::ids::connection();
    let info = SessionInfo {
        conn,
        mode,
        client_addr: client.addr.clone(),
        user_agent: client.user_agent.clone(),
        key_id,
        upgraded: Instant::now(),
        upgraded_at: std::time::SystemTime::now(),
    };
    let sinks = gw.subscribers.session(&info);
    let meter = Arc::new(OutgoingMeter::default());
    let socket = req.conn_data::<ConnSocket>();
    if socket.is_none() {
        log::warn!("no handle on this connection's socket: its outgoing buffer is unbounded");
    }
    let outgoing = socket.map(|socket| OutgoingLimit {
        meter: meter.clone(),
        max_bytes: config.server.max_outgoing_bytes,
        disconnect: Box::new(socket.cutter()),
    });
    let (queue, registry, transcription) = (gw.queue.clone(), gw.registry.clone(), gw.transcription.clone());
    let start = Box::new(move |edge| {
        let links =
            SessionLinks { edge, conn, queue, registry, admission: Some(admission), sinks, client, transcription };
        SessionActor::new(settings, dialect, links).start()
    });
    let edge = WebSocketEdge::new(edge_settings, conn, gw.fragments.clone(), outgoing, start);
    // Browsers offer `realtime` (with their key as a subprotocol): the server selects it.
    let mut response = if protocols.is_empty() {
        ws::handshake(&req)?
    } else {
        ws::handshake_with_protocols(&req, &["realtime", "openai-beta.realtime-v1"])?
    };
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    Ok(response.streaming(Metered::new(ws::WebsocketContext::with_codec(edge, payload, codec), meter)))
}
