//! A SIP call offered to the app (a `[[sip.routes]]` entry with `accept = "webhook"`), accepted
//! or rejected as OpenAI's SIP calls are: `POST /v1/realtime/calls/{call_id}/accept` with the
//! session's settings (OpenAI's session object: `type`, `model`, `instructions`, `audio`...),
//! `POST /v1/realtime/calls/{call_id}/reject` with an optional `status_code` (SIP, 603 when
//! none). Both take an API key (as minting a secret does), are read within bounds, and answer
//! 404 for a call that does not ring here (never offered, decided already, or gone). An accept
//! whose model is not served or whose settings the OpenAI dialect refuses (read by the dialect
//! itself) is answered 400 and the call rings on; one that is taken is answered once the trunk
//! has the call (200), or with why it was lost. `/v1/realtime?call_id=...` (a WebSocket, with
//! the API key that accepted the call) is the app's socket on the call
//! (`omni_transports::sip::sideband`).
//! The book they decide in is `omni_transports::sip::offers`; the hang-up is the calls' own
//! (`calls::hang_up`).

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::socket::{self, Bounds as SocketBounds};
use crate::admission::address_admission;
use crate::http::Gateway;
use crate::http::body::Bounds;
use crate::http::routes::http_error;
use bytestring::ByteString;
use omni_actors::edge::dialect::{Dialect, Outbox};
use omni_dialects::openai::{Flavor, Realtime};
use omni_transports::outgoing::Metered;
use omni_transports::sip::offers::{Accepted, Decision};
use omni_transports::sip::sideband::{Sideband, SidebandParts};

/// `/v1/realtime?call_id=CALL_ID`: the app's socket on a call it accepted, for the key that
/// accepted it (any other finds no call: 404).
pub(crate) async fn sideband(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
    call_id: String,
) -> actix_web::Result<HttpResponse> {
    let key_id = match super::api_key(&req, &gw).await {
        Ok(id) => id,
        Err(refusal) => return Ok(refusal),
    };
    let Some(door) = gw.sip_calls.door(&call_id, key_id.as_deref()) else {
        return Ok(http_error(StatusCode::NOT_FOUND, "not_found", format!("no call '{call_id}' of this key here")));
    };
    // A socket as any: counted as a connection of its address while open (refused while the
    // server stops), and a page of another site let in only as `server.allowed_origins` says.
    if let Err(refusal) = super::same_site(&req, &gw) {
        return Ok(refusal);
    }
    let admission = match address_admission(&super::caller(&req, &gw), &gw) {
        Ok(a) => a,
        Err(refusal) => return Ok(super::refused(refusal)),
    };
    let response = socket::handshake(&req)?;
    let config = &gw.config;
    let settings = config.edge_settings();
    let SocketBounds { meter, outgoing, incoming } = SocketBounds::of(&req, &gw);
    // The id is one of this gateway's own (found in the book).
    let edge = Sideband::new(SidebandParts {
        label: format!("call {call_id}"),
        settings,
        door,
        incoming: incoming.clone(),
        outgoing,
        fragments: gw.fragments.clone(),
        admission,
    });
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    let payload = SocketBounds::body(payload, incoming);
    let mut response = response;
    Ok(response
        .streaming(Metered::new(actix_web_actors::ws::WebsocketContext::with_codec(edge, payload, codec), meter)))
}

/// An accept's body at most (its session's tools may be long), and the time it has.
const BODY_BOUNDS: Bounds = Bounds { max_bytes: 256 * 1024, deadline: Duration::from_secs(10) };

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RejectRequest {
    #[serde(default)]
    status_code: Option<u16>,
}

pub(crate) async fn accept(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> HttpResponse {
    let (key_id, body) = match checked_body(&req, payload, &gw).await {
        Ok(read) => read,
        Err(refusal) => return refusal,
    };
    let session: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return invalid(format!("the body is not a session object: {e}")),
    };
    if session.get("type").is_some_and(|t| t != "realtime") {
        return invalid("type: a call is accepted as a \"realtime\" session".into());
    }
    if let Some(refused) = refused_settings(&session, &gw) {
        return refused;
    }
    let (done, told) = tokio::sync::oneshot::channel();
    let model = session.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).map(String::from);
    let first = Some(app_update(&session));
    let decision = Decision::Accept(Accepted { model, first, key_id, done });
    if gw.sip_calls.decide(&path, decision).is_err() {
        return not_ringing(&path);
    }
    // Decided: an accept that then failed is not to be tried again (the SDKs retry a 429 or
    // a 5xx, and would get 404 for a call that no longer rings).
    let mut failed = match told.await {
        Ok(Ok(())) => return HttpResponse::Ok().finish(),
        Ok(Err(refusal)) => super::refused(refusal),
        Err(_) => http_error(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the call ended as it was accepted"),
    };
    failed.headers_mut().insert(
        actix_web::http::header::HeaderName::from_static("x-should-retry"),
        actix_web::http::header::HeaderValue::from_static("false"),
    );
    failed
}

pub(crate) async fn reject(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> HttpResponse {
    let (_, body) = match checked_body(&req, payload, &gw).await {
        Ok(read) => read,
        Err(refusal) => return refusal,
    };
    let request: RejectRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RejectRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return invalid(format!("the body: {e}")),
        }
    };
    let code = request.status_code.unwrap_or(603);
    if !(400..=699).contains(&code) {
        return invalid(format!("status_code: {code} is not a SIP refusal (400 to 699)"));
    }
    match gw.sip_calls.decide(&path, Decision::Reject { code }) {
        Ok(()) => HttpResponse::Ok().finish(),
        Err(_) => not_ringing(&path),
    }
}

/// The API key (checked from the headers first) and the body, read within bounds while counted
/// as a connection of its address.
async fn checked_body(
    req: &HttpRequest,
    payload: web::Payload,
    gw: &Gateway,
) -> Result<(Option<String>, Vec<u8>), HttpResponse> {
    super::same_site(req, gw)?;
    let key_id = super::api_key(req, gw).await?;
    let caller = super::caller(req, gw);
    let reading = address_admission(&caller, gw).map_err(super::refused)?;
    let body = BODY_BOUNDS.bytes(req, payload).await;
    drop(reading);
    let body = body.map_err(|e| http_error(e.status(), "invalid_request_error", e.to_string()))?;
    Ok((key_id, body))
}

/// What of an accept's session would not open (a model not served), or not apply (a setting the
/// OpenAI dialect refuses: the whole first `session.update` would be refused, the app's
/// instructions with it): the answer, the call still ringing for another accept.
fn refused_settings(session: &Map<String, Value>, gw: &Gateway) -> Option<HttpResponse> {
    let model = match session.get("model") {
        None => "",
        Some(Value::String(m)) => m.as_str(),
        Some(_) => return Some(invalid("model: must be a string".into())),
    };
    if !model.is_empty() && gw.config.model_mode(model).is_none() {
        let known: Vec<&str> = gw.config.models.iter().map(|m| m.name.as_str()).collect();
        let message = format!("model '{model}' is not served here (known: {})", known.join(", "));
        return Some(http_error(StatusCode::BAD_REQUEST, "model_not_found", message));
    }
    // The dialect itself reads it, as the call's session will.
    let mut dialect = Realtime::new(Flavor::Ga, model, gw.config.dialect_limits(), &gw.voice);
    let update = app_update(session);
    let mut replies = Outbox::with_capacity(2);
    let refused = match dialect.decode(&ByteString::from(update), &mut replies) {
        Err(e) => Some(e.to_string()),
        Ok(_) => replies.texts().iter().find_map(|t| {
            let v: Value = serde_json::from_str(t).ok()?;
            (v["type"] == "error").then(|| v["error"]["message"].as_str().unwrap_or("refused").to_string())
        }),
    };
    refused.map(|why| invalid(format!("the session's settings: {why}")))
}

/// An accept's session as the call's session hears it: the app's own `session.update`, without
/// the `model` (the session is opened for it), after the route's settings.
fn app_update(session: &Map<String, Value>) -> String {
    let mut session = session.clone();
    session.remove("model");
    session.entry("type").or_insert_with(|| Value::from("realtime"));
    serde_json::json!({"type": "session.update", "session": session}).to_string()
}

fn invalid(message: String) -> HttpResponse {
    http_error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

fn not_ringing(call_id: &str) -> HttpResponse {
    http_error(StatusCode::NOT_FOUND, "not_found", format!("no call '{call_id}' rings here"))
}
