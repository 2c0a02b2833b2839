//! The realtime endpoints: a client becomes a session over a WebSocket ([`websocket`]) or a
//! WebRTC call ([`calls`]), and a server mints client secrets for browsers
//! ([`client_secrets`]). Both transports pass the same checks before their session starts
//! ([`admit`]): the origin, the key or client secret, the per-address caps, the dialect.

pub mod calls;
pub mod client_secrets;
pub mod websocket;

use std::collections::HashMap;
use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
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
use crate::transport::StartSession;

/// Which wire dialect a client speaks, from its URL and headers.
pub enum Endpoint {
    /// `/v1/realtime?mode=`: MiniCPM-o, current or earlier dialect.
    MiniCpm(Mode),
    /// `/v1/realtime?model=` (no mode), `/api-ws/v1/realtime`, or a call: the OpenAI shape.
    Realtime(Flavor, String),
}

// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
fn query_of(req: &HttpRequest) -> Result<HashMap<String, String>, HttpResponse> {
    web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .map_err(|e| http_error(StatusCode::BAD_REQUEST, "invalid_payload", format!("bad query string: {e}")))
}

fn key_refusal(denied: Denied) -> HttpResponse {
    match denied {
        Denied::Throttled => {
            refuse("too_many_attempts", StatusCode::TOO_MANY_REQUESTS, "too_many_attempts", denied.message())
        }
        _ => refuse("unauthorized", StatusCode::UNAUTHORIZED, "unauthorized", denied.message()),
    }
}

/// A client that passed the checks: what its session starts with.
pub struct Admitted {
    pub conn: u64,
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    client: ClientInfo,
    info: SessionInfo,
    admission: omni_actors::session::registry::Admission,
    /// The session settings of the client secret it presented, if any.
    pub session: Option<serde_json::Value>,
    /// Its API key's id (a client secret's: the minting key's).
    pub key_id: Option<String>,
}

impl Admitted {
    /// How the transport's edge starts the session, once it has an address.
    pub fn starter(self, gw: &Gateway) -> StartSession {
        let sinks = gw.subscribers.session(&self.info);
        let (queue, registry, transcription) = (gw.queue.clone(), gw.registry.clone(), gw.transcription.clone());
        let Admitted { conn, settings, dialect, client, admission, .. } = self;
        Box::new(move |edge| {
            let links =
                SessionLinks { edge, conn, queue, registry, admission: Some(admission), sinks, client, transcription };
            SessionActor::new(settings, dialect, links).start_for_edge()
        })
    }
}

/// The first checks of every realtime client: the Origin, then a key or client secret (the
/// first of `presented`; `take` uses a secret up now, else the caller takes it).
// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub async fn authenticate(
    req: &HttpRequest,
    gw: &Gateway,
    presented: [Option<&str>; 3],
    take: bool,
) -> Result<auth::Credential, HttpResponse> {
    if !auth::origin_allowed(req, &gw.config.server.allowed_origins) {
        return Err(refuse(
            "forbidden_origin",
            StatusCode::FORBIDDEN,
            "forbidden_origin",
            "this Origin is not allowed",
        ));
    }
    let client_ip = auth::client_ip(req, &gw.config.trusted_proxies);
    gw.keys.paced(client_ip, |k| k.check_realtime(client_ip, presented, take)).await.map_err(key_refusal)
}

/// An API key (not a client secret) in `Authorization`, for the routes around the sessions
/// (minting a secret, hanging up): its id, or the answer to a refused key.
// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub async fn api_key(req: &HttpRequest, gw: &Gateway) -> Result<Option<String>, HttpResponse> {
    let client_ip = auth::client_ip(req, &gw.config.trusted_proxies);
    let checked = gw.keys.paced(client_ip, |k| k.check_api(client_ip, [auth::bearer(req)])).await;
    checked.map_err(|denied| match denied {
        Denied::Throttled => http_error(StatusCode::TOO_MANY_REQUESTS, "too_many_attempts", denied.message()),
        _ => http_error(StatusCode::UNAUTHORIZED, "unauthorized", denied.message()),
    })
}

/// The rest: a client secret's model, the per-address caps, then the dialect the client speaks.
// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
pub fn admit(
    req: &HttpRequest,
    gw: &Gateway,
    endpoint: Endpoint,
    key: auth::Credential,
    transport: &'static str,
) -> Result<Admitted, HttpResponse> {
    let config = &gw.config;
    if let (Some(minted_for), Endpoint::Realtime(_, model)) = (key.model(), &endpoint)
        && minted_for != model
    {
        return Err(refuse(
            "wrong_model",
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("this client secret is for model '{minted_for}', not '{model}'"),
        ));
    }
    let client_ip = auth::client_ip(req, &config.trusted_proxies);
    let caps =
        AddressCaps { connections: config.server.max_connections_per_ip, waiting: config.server.max_waiting_per_ip };
    let admission = gw.registry.admit(client_ip, caps).map_err(|refusal| match refusal {
        Refusal::TooManyConnections => refuse(
            "too_many_connections",
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_connections",
            format!("at most {} connections per address (server.max_connections_per_ip)", caps.connections),
        ),
        Refusal::TooManyWaiting => refuse(
            "too_many_waiting",
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_waiting",
            format!(
                "at most {} connections per address may wait for a worker (server.max_waiting_per_ip)",
                caps.waiting
            ),
        ),
        Refusal::ShuttingDown => {
            refuse("shutting_down", StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "the server is stopping")
        }
    })?;
    let (mode, dialect, reject): (Mode, Box<dyn Dialect>, Option<ProtocolError>) = match &endpoint {
        Endpoint::MiniCpm(mode) => {
            let dialect = MiniCpmEndpoint::new(*mode, config.dialect_limits(), &gw.voice)
                .with_gateway_transcription(gw.transcription.is_some());
            (*mode, Box::new(dialect), None)
        }
        Endpoint::Realtime(flavor, model) => {
            let dialect = Box::new(
                Realtime::new(*flavor, model, config.dialect_limits(), &gw.voice)
                    .with_gateway_transcription(gw.transcription.is_some()),
            );
            match config.model_mode(model) {
                Some(mode) => (mode, dialect, None),
                None => {
                    let known: Vec<&str> = config.models.iter().map(|m| m.name.as_str()).collect();
                    let e = ProtocolError::ModelNotFound(format!(
                        "model '{model}' is not served here (known: {})",
                        known.join(", ")
                    ));
                    (Mode::Audio, dialect, Some(e))
                }
            }
        }
    };
    let settings = SessionSettings {
        mode,
        time_limit: config.limits.session_limit(mode),
        context_tokens: config.limits.context_tokens,
        max_turns: config.limits.max_pending_turns + 1,
        reject,
    };
    let peer_port = req.peer_addr().map_or(0, |a| a.port());
    let client = ClientInfo {
        addr: client_ip
            .map_or_else(|| "unknown".to_string(), |ip| std::net::SocketAddr::new(ip, peer_port).to_string()),
        user_agent: req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from),
        transport,
    };
    let conn = omni_actors::ids::connection();
    let info = SessionInfo {
        conn,
        mode,
        client_addr: client.addr.clone(),
        user_agent: client.user_agent.clone(),
        key_id: key.key_id,
        upgraded: Instant::now(),
        upgraded_at: std::time::SystemTime::now(),
    };
    let key_id = info.key_id.clone();
    Ok(Admitted { conn, settings, dialect, client, info, admission, session: key.session, key_id })
}
