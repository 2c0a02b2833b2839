//! The realtime WebSocket endpoints: which dialect a connection speaks (from its URL and
//! headers), and the WebSocket edge it becomes once admitted ([`super::admit`]), which starts
//! the connection's SessionActor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use futures_util::StreamExt;
use omni_actors::domain::Mode;

use super::{caller, query_of, refused};
use crate::dialect::openai::Flavor;
use crate::http::Gateway;
use crate::http::routes::http_error;
use crate::http::{auth, client_secrets};
use crate::transport::admission::{Endpoint, Transport, admit, authenticate};
use crate::transport::incoming::{Backlog, Gated};
use crate::transport::outgoing::{Metered, OutgoingLimit, OutgoingMeter};
use crate::transport::socket::ConnSocket;
use crate::transport::websocket::line::{self, Merged};
use crate::transport::StartSession;
use crate::transport::websocket::{EdgeSettings, WebSocketEdge};
use omni_actors::observe::metrics::metrics;
use omni_actors::session::resume::ResumeRefusal;

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

pub(crate) async fn realtime(
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

pub(crate) async fn qwen_realtime(
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
    let protocols = subprotocols(&req);
    let browser_key = protocols.iter().find_map(|p| p.strip_prefix("openai-insecure-api-key."));
    let presented = [auth::bearer(&req), query.get("api_key").map(String::as_str), browser_key];
    let openai = matches!(endpoint, Endpoint::Realtime(..));
    let caller = caller(&req, &gw);
    let key = match authenticate(&caller, &gw, presented, false).await {
        Ok(key) => key,
        Err(refusal) => return Ok(refused(refusal)),
    };
    if let Some(token) = query.get("resume") {
        return resume(req, payload, gw, key, token, query.get("received")).await;
    }
    let secret = key.untaken_secret.clone();
    let transport = Transport { name: "websocket", carries_audio: false };
    let admitted = match admit(&caller, &gw, endpoint, key, transport) {
        Ok(a) => a,
        Err(refusal) => return Ok(refused(refusal)),
    };
    // A client secret is used up once the connection is admitted (a refusal leaves it good).
    if let Some(secret) = &secret
        && !gw.keys.take_secret(secret)
    {
        return Ok(secret_used());
    }
    let conn = admitted.conn;
    // A client secret's settings, for the OpenAI-shaped dialects (the MiniCPM-o ones have none).
    let first = admitted.session.as_ref().filter(|_| openai).map(client_secrets::session_update);
    let start = admitted.starter(&gw);
    let response = handshake(&req)?;
    Ok(serve(&req, payload, &gw, response, conn, start, first))
}

fn secret_used() -> HttpResponse {
    http_error(StatusCode::UNAUTHORIZED, "unauthorized", auth::Denied::Wrong(auth::KeyKind::ClientSecret).message())
}

/// `?resume=TOKEN`: the connection takes back the session the token names, when the caller
/// holds the API key that opened it (`received`: how many of the session's messages the
/// client got, for those it did not to be sent again). The URL's mode or model are the
/// session's own, whatever this one says.
async fn resume(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
    key: auth::Credential,
    token: &str,
    received: Option<&String>,
) -> actix_web::Result<HttpResponse> {
    let received = match received.map(|r| r.parse::<u64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => {
            let why = "received: the number of the session's messages the client received (a whole number)";
            return Ok(http_error(StatusCode::BAD_REQUEST, "invalid_payload", why));
        }
    };
    // The handshake is checked before the token is used up: a request that cannot be a
    // WebSocket leaves the session's token good.
    let response = handshake(&req)?;
    let taken = match gw.registry.tokens().take(token, key.key_id.as_deref()) {
        Ok(taken) if taken.connected() => taken,
        Ok(_) | Err(ResumeRefusal::Unknown) => return Ok(resume_refused(ResumeRefusal::Unknown)),
        Err(refusal) => return Ok(resume_refused(refusal)),
    };
    if let Some(secret) = &key.untaken_secret
        && !gw.keys.take_secret(secret)
    {
        return Ok(secret_used());
    }
    let conn = taken.conn;
    let line_no = omni_actors::ids::connection();
    log::info!("session c{conn}: resumed by a new connection (line {line_no})");
    let start: StartSession = Box::new(move |line| taken.hand(line, line_no, received));
    Ok(serve(&req, payload, &gw, response, conn, start, None))
}

/// A resume refused: counted, and told without naming the token.
pub(super) fn resume_refused(refusal: ResumeRefusal) -> HttpResponse {
    metrics().resumes.with_label_values(&[refusal.label()]).inc();
    log::info!("a resume refused: {}", refusal.label());
    let (status, code) = match refusal {
        ResumeRefusal::Unknown => (StatusCode::NOT_FOUND, "session_not_found"),
        ResumeRefusal::OtherKey => (StatusCode::FORBIDDEN, "forbidden"),
    };
    http_error(status, code, refusal.message())
}

/// The WebSocket handshake's answer; browsers offer `realtime` (with their key as a
/// subprotocol), which the server selects.
fn handshake(req: &HttpRequest) -> actix_web::Result<actix_web::HttpResponseBuilder> {
    if subprotocols(req).is_empty() {
        Ok(ws::handshake(req)?)
    } else {
        Ok(ws::handshake_with_protocols(req, &["realtime", "openai-beta.realtime-v1"])?)
    }
}

/// The connection as a WebSocket edge in front of the session `start` starts (or resumes).
fn serve(
    req: &HttpRequest,
    payload: web::Payload,
    gw: &Gateway,
    mut response: actix_web::HttpResponseBuilder,
    conn: u64,
    start: StartSession,
    first: Option<String>,
) -> HttpResponse {
    let config = &gw.config;
    let edge_settings = EdgeSettings {
        max_frame_bytes: config.server.max_frame_bytes,
        heartbeat_interval: config.server.heartbeat_interval(),
        heartbeat_timeout: config.server.heartbeat_timeout(),
        message_timeout: Duration::from_secs_f64(config.server.message_timeout_s),
        rate: config.message_rate(),
    };
    let meter = Arc::new(OutgoingMeter::default());
    let socket = req.conn_data::<ConnSocket>();
    if socket.is_none() {
        log::warn!("no handle on this connection's socket: its outgoing buffer is unbounded");
    }
    let outgoing = socket.map(|socket| {
        Arc::new(OutgoingLimit {
            meter: meter.clone(),
            max_bytes: config.server.max_outgoing_bytes,
            disconnect: Box::new(socket.cutter()),
        })
    });
    let incoming = Backlog::new(config.server.max_incoming_bytes as usize, gw.incoming.clone());
    // The session's frames go straight into the connection's outgoing stream.
    let (said, heard) = line::line();
    let edge = WebSocketEdge::new(edge_settings, conn, gw.fragments.clone(), outgoing, incoming.clone(), said, start)
        .with_first(first);
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    // The request body is read only while the session keeps up with it. A body that breaks
    // ends there (a client that sent its close frame and shut the connection at once is read
    // to its close frame, not told apart from a lost one by which came first).
    let payload = Gated::new(payload.take_while(|chunk| std::future::ready(chunk.is_ok())), incoming);
    let outgoing =
        Merged::new(ws::WebsocketContext::with_codec(edge, payload, codec), heard, config.server.max_frame_bytes);
    response.streaming(Metered::new(outgoing, meter))
}
