//! The realtime WebSocket endpoints: which dialect a connection speaks (from its URL and
//! headers), and the WebSocket edge it becomes once admitted ([`crate::admission::admit`]), which starts
//! the connection's SessionActor.

use omni_actors::edge::client::FromClient;
use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use omni_actors::domain::Mode;

use super::socket::{Bounds, handshake, subprotocols};
use super::{caller, query_of, refused, resume};
use crate::admission::{Endpoint, Transport, admit, authenticate};
use crate::auth::{self, client_secrets};
use crate::http::Gateway;
use crate::http::routes::http_error;
use omni_dialects::openai::Flavor;
use omni_transports::StartSession;
use omni_transports::outgoing::Metered;
use omni_transports::websocket::WebSocketEdge;
use omni_transports::websocket::line::{self, Merged};

pub(crate) async fn realtime(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
    let query = match query_of(&req) {
        Ok(q) => q,
        Err(refusal) => return Ok(refusal),
    };
    if let Some(call_id) = query.get("call_id") {
        // The app's socket on a SIP call it accepted.
        return super::sip_calls::sideband(req, payload, gw, call_id.clone()).await;
    }
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
    let ask = match resume::asked(&query) {
        Ok(ask) => ask,
        Err(refusal) => return Ok(refusal),
    };
    if let Some(ask) = ask {
        return take_back(req, payload, gw, key, ask);
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
        return Ok(super::secret_used());
    }
    let conn = admitted.conn;
    // A client secret's settings, for the OpenAI-shaped dialects (the MiniCPM-o ones have none).
    let first = admitted.session.as_ref().filter(|_| openai).map(client_secrets::session_update);
    let start = admitted.opening(first.map(|text| FromClient::Text(text.into()))).starter(&gw);
    let response = handshake(&req)?;
    Ok(serve(&req, payload, &gw, response, conn, start))
}

/// `?resume=TOKEN`: the connection takes back the session the token names (the URL's mode or
/// model are the session's own, whatever this one says).
fn take_back(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
    key: auth::Credential,
    ask: resume::Ask,
) -> actix_web::Result<HttpResponse> {
    // The handshake is checked before the token is used: a request that cannot be a WebSocket
    // leaves it good (and a taken token that is never handed its session goes back).
    let response = handshake(&req)?;
    let taken = match resume::take(&gw, &ask, &key, "websocket") {
        Ok(taken) => taken,
        Err(refusal) => return Ok(refusal),
    };
    let (conn, line_no, received) = (taken.conn, omni_actors::ids::connection(), ask.received);
    log::info!("session c{conn}: resumed by a new connection (line {line_no})");
    let start: StartSession = Box::new(move |line| taken.hand(line, line_no, received));
    Ok(serve(&req, payload, &gw, response, conn, start))
}

/// The connection as a WebSocket edge in front of the session `start` starts (or resumes).
fn serve(
    req: &HttpRequest,
    payload: web::Payload,
    gw: &Gateway,
    mut response: actix_web::HttpResponseBuilder,
    conn: u64,
    start: StartSession,
) -> HttpResponse {
    let config = &gw.config;
    let edge_settings = config.edge_settings();
    let Bounds { meter, outgoing, incoming } = Bounds::of(req, gw);
    // The session's frames go straight into the connection's outgoing stream.
    let (said, heard) = line::line();
    let edge = WebSocketEdge::new(edge_settings, conn, gw.fragments.clone(), outgoing, incoming.clone(), said, start);
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    let payload = Bounds::body(payload, incoming);
    let outgoing =
        Merged::new(ws::WebsocketContext::with_codec(edge, payload, codec), heard, config.server.max_frame_bytes);
    response.streaming(Metered::new(outgoing, meter))
}
