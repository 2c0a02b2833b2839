//! `POST /v1/realtime/client_secrets`: a server holding an API key mints a short-lived secret
//! for a browser (see `crate::auth::client_secrets`). The body is optional JSON:
//! `{"expires_after": {"anchor": "created_at", "seconds": 600}, "session": {...}}`; the answer
//! is `{"value", "expires_at", "session"}`.

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use omni_transports::webrtc::config::CLIENT_SECRET_TTL;

/// The largest `session` a secret holds: every outstanding secret keeps its own in memory.
const MAX_SESSION_BYTES: usize = 16 * 1024;
use crate::admission::address_admission;
use crate::auth::client_secrets::{Grant, MintRefusal};
use crate::http::Gateway;
use crate::http::body::Bounds;
use crate::http::routes::http_error;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MintRequest {
    #[serde(default)]
    expires_after: Option<ExpiresAfter>,
    #[serde(default)]
    session: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpiresAfter {
    #[serde(default)]
    anchor: Option<String>,
    seconds: u64,
}

/// A mint request's body at most (a secret's `session` and its expiry), and the time it has.
const BODY_BOUNDS: Bounds = Bounds { max_bytes: 2 * MAX_SESSION_BYTES, deadline: Duration::from_secs(10) };

pub(crate) async fn mint(req: HttpRequest, payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    // An API key, not a client secret: a secret cannot mint another. Checked from the headers
    // before a byte of the body is read; the body is then read within bounds, counted as a
    // connection of its address meanwhile.
    if let Err(refusal) = super::same_site(&req, &gw) {
        return refusal;
    }
    let key_id = match super::api_key(&req, &gw).await {
        Ok(id) => id,
        Err(refusal) => return refusal,
    };
    let caller = super::caller(&req, &gw);
    let reading = match address_admission(&caller, &gw) {
        Ok(a) => a,
        Err(refusal) => return super::refused(refusal),
    };
    let body = BODY_BOUNDS.bytes(&req, payload).await;
    drop(reading);
    let body = match body {
        Ok(b) => b,
        Err(e) => return http_error(e.status(), "invalid_request_error", e.to_string()),
    };
    let request: MintRequest = if body.iter().all(u8::is_ascii_whitespace) {
        MintRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return http_error(StatusCode::BAD_REQUEST, "invalid_request_error", format!("the body: {e}")),
        }
    };
    let ttl = match &request.expires_after {
        None => gw.config.webrtc.client_secret_ttl,
        Some(ExpiresAfter { anchor, seconds }) => {
            if anchor.as_deref().is_some_and(|a| a != "created_at") {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "expires_after.anchor: only \"created_at\" is supported",
                );
            }
            if !CLIENT_SECRET_TTL.contains(seconds) {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "expires_after.seconds: must be from 10 to 7200",
                );
            }
            Duration::from_secs(*seconds)
        }
    };
    let session = request.session.map(Value::Object);
    if session.as_ref().is_some_and(|s| s.to_string().len() > MAX_SESSION_BYTES) {
        return http_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("session: over {MAX_SESSION_BYTES} bytes"),
        );
    }
    let model = session.as_ref().and_then(|s| s.get("model"));
    if model.is_some_and(|m| !m.is_string()) {
        // (else the secret would be bound to no model at all)
        return http_error(StatusCode::BAD_REQUEST, "invalid_request_error", "session.model: must be a string");
    }
    if let Some(model) = model.and_then(Value::as_str)
        && gw.config.model_mode(model).is_none()
    {
        return http_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("session.model: '{model}' is not served here"),
        );
    }
    let grant = Grant { key_id: key_id.clone(), session: session.clone() };
    let minted = gw.keys.secrets.lock().mint(grant, ttl, Instant::now());
    match minted {
        Ok(m) => {
            omni_actors::observe::metrics().client_secrets_minted.inc();
            if let Some(more) = omni_actors::observe::gated("client_secret_minted") {
                let by = key_id.as_deref().unwrap_or("an open gateway");
                log::info!("a client secret was minted for {by} ({} s){more}", ttl.as_secs());
            }
            let mut session = session.unwrap_or_else(|| json!({}));
            session["type"] = json!("realtime");
            // A secret is not kept by a cache on the way.
            HttpResponse::Ok()
                .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
                .json(json!({"value": m.value, "expires_at": m.expires_at, "session": session}))
        }
        Err(MintRefusal::Full { max }) => http_error(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_client_secrets",
            format!("{max} client secrets are outstanding (webrtc.max_client_secrets)"),
        ),
        Err(MintRefusal::FullForKey { max }) => http_error(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_client_secrets",
            format!("this key has {max} client secrets outstanding (webrtc.max_client_secrets_per_key)"),
        ),
    }
}
