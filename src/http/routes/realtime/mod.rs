//! The realtime endpoints: a client becomes a session over a WebSocket ([`websocket`]) or a
//! WebRTC call ([`calls`]), and a server mints client secrets for browsers
//! ([`client_secrets`]); an app accepts or rejects the SIP calls offered to it
//! ([`sip_calls`]). Both transports pass the same checks before their session starts
//! ([`crate::admission`]), their callers described from the request ([`caller`]); a
//! client whose connection dropped takes its session back on either ([`resume`]).

pub(super) mod calls;
pub(super) mod client_secrets;
mod resume;
pub(super) mod sip_calls;
pub(super) mod socket;
pub(super) mod websocket;

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};

use super::http_error;
use crate::admission::{Caller, Origin, Refusal};
use crate::auth::{self, Denied};
use crate::http::Gateway;

/// A request's query parameters.
type Query = HashMap<String, String>;

/// A client secret presented a second time (used, or just expired).
pub(super) fn secret_used() -> HttpResponse {
    http_error(StatusCode::UNAUTHORIZED, "unauthorized", Denied::Wrong(auth::KeyKind::ClientSecret).message())
}

// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub(super) fn query_of(req: &HttpRequest) -> Result<Query, HttpResponse> {
    web::Query::<Query>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .map_err(|e| http_error(StatusCode::BAD_REQUEST, "invalid_payload", format!("bad query string: {e}")))
}

/// The caller behind an HTTP request: its address (behind a trusted proxy, the one the proxy
/// names), user agent and Origin.
pub(super) fn caller(req: &HttpRequest, gw: &Gateway) -> Caller {
    Caller {
        ip: auth::client_ip(req, &gw.config.trusted_proxies),
        port: req.peer_addr().map_or(0, |a| a.port()),
        user_agent: req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from),
        origin: auth::origin_of(req),
    }
}

/// A browser page of another site on a POST that starts something (a call, a secret): refused
/// unless `server.allowed_origins` lets it in, and, when that list is empty, unless the page is
/// this server's own (its Origin names the host the request was sent to). A browser sends these
/// as simple cross-site requests, without asking first; a client that is not a browser sends no
/// Origin and is not concerned.
#[allow(clippy::result_large_err)]
fn same_site(req: &HttpRequest, gw: &Gateway) -> Result<(), HttpResponse> {
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if auth::origin_of(req).same_site(&gw.config.server.allowed_origins, host) {
        return Ok(());
    }
    Err(http_error(
        StatusCode::FORBIDDEN,
        "forbidden_origin",
        "a page of another site may not do this here (server.allowed_origins lists the sites that may)",
    ))
}

/// CORS for the routes a page of another site may use (calls, client secrets): a preflight from
/// an origin the route itself would take ([`same_site`]: one `server.allowed_origins` lists, or,
/// with none listed, this server's own) is answered (`POST` and `DELETE`, with `Authorization`
/// and `Content-Type`), and the answers carry `Access-Control-Allow-Origin` and expose
/// `Location`; any other origin's preflight is refused, and its request gets the route's own
/// `403 forbidden_origin`.
pub(crate) fn cors(origins: &[String]) -> actix_cors::Cors {
    let origins = origins.to_vec();
    actix_cors::Cors::default()
        .allowed_origin_fn(move |origin, head| {
            let origin = origin.to_str().map_or(Origin::Unreadable, |o| Origin::Given(o.to_string()));
            let host = head.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            origin.same_site(&origins, host)
        })
        .allowed_methods(["POST", "DELETE"])
        .allowed_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .expose_headers([header::LOCATION])
        .max_age(600)
}

/// A refused caller's HTTP answer.
pub(super) fn refused(refusal: Refusal) -> HttpResponse {
    let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_REQUEST);
    http_error(status, refusal.code, refusal.message)
}

/// An API key (not a client secret) in `Authorization`, for the routes around the sessions
/// (minting a secret, hanging up): its id, or the answer to a refused key.
// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub(super) async fn api_key(req: &HttpRequest, gw: &Gateway) -> Result<Option<String>, HttpResponse> {
    let client_ip = auth::client_ip(req, &gw.config.trusted_proxies);
    let checked = gw.keys.paced(client_ip, |k| k.check_api(client_ip, [auth::bearer(req)])).await;
    checked.map_err(|denied| match denied {
        Denied::Throttled => http_error(StatusCode::TOO_MANY_REQUESTS, "too_many_attempts", denied.message()),
        _ => http_error(StatusCode::UNAUTHORIZED, "unauthorized", denied.message()),
    })
}
