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
use crate::transport::websocket::{EdgeSettings, WebSocketEdge};

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
    let config = &gw.config;
    let protocols = subprotocols(&req);
    let browser_key = protocols.iter().find_map(|p| p.strip_prefix("openai-insecure-api-key."));
    let presented = [auth::bearer(&req), query.get("api_key").map(String::as_str), browser_key];
    let openai = matches!(endpoint, Endpoint::Realtime(..));
    let caller = caller(&req, &gw);
    let key = match authenticate(&caller, &gw, presented, false).await {
        Ok(key) => key,
        Err(refusal) => return Ok(refused(refusal)),
    };
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
        return Ok(http_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            auth::Denied::Wrong(auth::KeyKind::ClientSecret).message(),
        ));
    }
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
    let conn = admitted.conn;
    // A client secret's settings, for the OpenAI-shaped dialects (the MiniCPM-o ones have none).
    let first = admitted.session.as_ref().filter(|_| openai).map(client_secrets::session_update);
    let start = admitted.starter(&gw);
    let incoming = Backlog::new(config.server.max_incoming_bytes as usize, gw.incoming.clone());
    // The session's frames go straight into the connection's outgoing stream.
    let (said, heard) = line::line();
    let edge = WebSocketEdge::new(edge_settings, conn, gw.fragments.clone(), outgoing, incoming.clone(), said, start)
        .with_first(first);
    // Browsers offer `realtime` (with their key as a subprotocol): the server selects it.
    let mut response = if protocols.is_empty() {
        ws::handshake(&req)?
    } else {
        ws::handshake_with_protocols(&req, &["realtime", "openai-beta.realtime-v1"])?
    };
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    // The request body is read only while the session keeps up with it.
    let payload = Gated::new(payload, incoming);
    let outgoing =
        Merged::new(ws::WebsocketContext::with_codec(edge, payload, codec), heard, config.server.max_frame_bytes);
    Ok(response.streaming(Metered::new(outgoing, meter)))
}
