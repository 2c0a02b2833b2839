//! Taking a session back (`?resume=TOKEN&received=N`), for the WebSocket route and the calls
//! route alike: the query read, the caller's client secret used up first (when it presented
//! one), then the session's token, each refusal counted and told without naming the token.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use omni_actors::observe::metrics::metrics;
use omni_actors::session::resume::{ResumeRefusal, Taken};

use super::{Query, secret_used};
use crate::auth;
use crate::http::Gateway;
use crate::http::routes::http_error;

/// What a caller asks to resume.
pub(super) struct Ask {
    pub token: String,
    /// How many of the session's messages the client received, when it says.
    pub received: Option<u64>,
}

/// The resume the query asks for, if any; a `received` that is not a count is refused.
// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub(super) fn asked(query: &Query) -> Result<Option<Ask>, HttpResponse> {
    let Some(token) = query.get("resume") else { return Ok(None) };
    let received = match query.get("received").map(|r| r.parse::<u64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => {
            let why = "received: how many of the session's messages the client received (a whole number)";
            return Err(http_error(StatusCode::BAD_REQUEST, "invalid_payload", why));
        }
    };
    Ok(Some(Ask { token: token.clone(), received }))
}

/// The session `ask` names, for a caller with `key` on `transport`. A client secret the caller
/// presented is used up first (a resume refused after it costs the page a new secret, never
/// the session its token).
// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub(super) fn take(gw: &Gateway, ask: &Ask, key: &auth::Credential, transport: &str) -> Result<Taken, HttpResponse> {
    if let Some(secret) = &key.untaken_secret
        && !gw.keys.take_secret(secret)
    {
        return Err(secret_used());
    }
    match gw.registry.tokens().take(&ask.token, key.key_id.as_deref(), transport) {
        Ok(taken) if taken.connected() => Ok(taken),
        Ok(_) => Err(refused(ResumeRefusal::Unknown)),
        Err(refusal) => Err(refused(refusal)),
    }
}

fn refused(refusal: ResumeRefusal) -> HttpResponse {
    metrics().resumes.with_label_values(&[refusal.label()]).inc();
    log::info!("a resume refused: {}", refusal.label());
    let (status, code) = match refusal {
        ResumeRefusal::Unknown => (StatusCode::NOT_FOUND, "session_not_found"),
        ResumeRefusal::OtherKey => (StatusCode::FORBIDDEN, "forbidden"),
        ResumeRefusal::OtherTransport(_) => (StatusCode::CONFLICT, "other_transport"),
    };
    http_error(status, code, refusal.message())
}
