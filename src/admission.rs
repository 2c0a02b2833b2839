//! Who may start a session, whatever carries it: every transport's caller passes the same
//! checks before its session starts, described by a [`Caller`] rather than an HTTP request,
//! so that an edge that is not HTTP-hosted (a raw socket, a phone line) checks its callers as
//! the WebSocket and WebRTC routes do.
//!
//! 1. [`authenticate`]: the Origin (when the transport has one), then an API key or a client
//!    secret, paced per address;
//! 2. [`admit`]: a client secret's model, the per-address caps, the dialect the caller speaks
//!    ([`Endpoint`]); the [`Admitted`] caller's edge then starts its session
//!    ([`Admitted::starter`]).
//!
//! A refusal is a [`Refusal`]: counted in `omni_connections_refused_total` by its reason, and
//! told to the caller in whatever way its transport has (an HTTP route answers its status).

use std::time::Instant;

use omni_actors::domain::Mode;
use omni_actors::edge::client::FromClient;
use omni_actors::edge::client::SessionPort;
use omni_actors::edge::dialect::Dialect;
use omni_actors::observe::events::SessionInfo;
use omni_actors::protocol::ProtocolError;
use omni_actors::session::{AddressCaps, Admission, Refusal as CapRefusal};
use omni_actors::session::{ClientInfo, SessionActor, SessionLinks, SessionSettings};

use crate::auth::{self, Denied};
use crate::roles::Serving;
use omni_dialects::openai::{Flavor, Realtime};
use omni_dialects::select::MiniCpmEndpoint;
use omni_transports::StartSession;
pub use omni_transports::caller::{Caller, Origin, Refusal, Transport};

/// A key or client secret refused, as admission tells it.
fn key_refusal(denied: Denied) -> Refusal {
    match denied {
        Denied::Throttled => Refusal::new("too_many_attempts", 429, "too_many_attempts", denied.message()),
        _ => Refusal::new("unauthorized", 401, "unauthorized", denied.message()),
    }
}

/// Which dialect a caller speaks.
pub enum Endpoint {
    /// `/v1/realtime?mode=`: MiniCPM-o, current or earlier dialect.
    MiniCpm(Mode),
    /// The OpenAI shape, in one of its flavors, for a model name (`/v1/realtime?model=`,
    /// `/api-ws/v1/realtime`, a call, an edge of its own).
    Realtime(Flavor, String),
}

/// The first checks of every caller: the Origin, then a key or client secret (the first of
/// `presented`; `take` uses a secret up now, else the caller takes it with
/// [`auth::Keys::take_secret`] once its session is sure to start).
pub async fn authenticate(
    caller: &Caller,
    gw: &Serving,
    presented: [Option<&str>; 3],
    take: bool,
) -> Result<auth::Credential, Refusal> {
    if !caller.origin.allowed(&gw.config.server.allowed_origins) {
        return Err(Refusal::new("forbidden_origin", 403, "forbidden_origin", "this Origin is not allowed"));
    }
    let ip = caller.ip;
    gw.keys.paced(ip, |k| k.check_realtime(ip, presented, take)).await.map_err(key_refusal)
}

/// A caller that passed the checks: what its session starts with.
pub struct Admitted {
    pub conn: u64,
    settings: SessionSettings,
    dialect: Box<dyn Dialect>,
    client: ClientInfo,
    info: SessionInfo,
    admission: Admission,
    /// The session settings of the client secret it presented, if any.
    pub session: Option<serde_json::Value>,
    /// Its API key's id (a client secret's: the minting key's).
    pub key_id: Option<String>,
    /// What its session is handed before anything of its client's ([`Admitted::opening`]).
    first: Vec<FromClient>,
}

impl Admitted {
    /// The session is handed these first, in order, before anything of its client's: a call's
    /// settings ([`FromClient::Configure`]), and what a client secret or an app's accept asked
    /// of it, in its dialect (the server writes those, never the edge).
    pub fn opening(mut self, first: impl IntoIterator<Item = FromClient>) -> Admitted {
        self.first.extend(first);
        self
    }

    /// How the transport's edge starts the session, once it has an address.
    pub fn starter(self, gw: &Serving) -> StartSession {
        let sinks = gw.subscribers.session(&self.info);
        let (queue, registry, transcription) = (gw.queue.clone(), gw.registry.clone(), gw.transcription.clone());
        let delegation = gw.delegation.clone();
        let Admitted { conn, settings, dialect, client, admission, first, .. } = self;
        Box::new(move |edge: Box<dyn omni_actors::edge::client::ClientLine>| {
            let admission = Some(admission);
            let links =
                SessionLinks { edge, conn, queue, registry, admission, sinks, client, transcription, delegation };
            let port = SessionPort::new(SessionActor::new(settings, dialect, links).start_for_edge().recipient(), 0);
            for msg in first {
                port.do_send(msg);
            }
            port
        })
    }
}

/// The rest of the checks: a client secret's model, the per-address caps, then the dialect
/// the caller speaks.
pub fn admit(
    caller: &Caller,
    gw: &Serving,
    endpoint: Endpoint,
    key: auth::Credential,
    transport: Transport,
) -> Result<Admitted, Refusal> {
    let config = &gw.config;
    if let (Some(minted_for), Endpoint::Realtime(_, model)) = (key.model(), &endpoint)
        && minted_for != model
    {
        return Err(Refusal::new(
            "wrong_model",
            400,
            "invalid_request_error",
            format!("this client secret is for model '{minted_for}', not '{model}'"),
        ));
    }
    // A secret minted with session settings (a model, instructions...) opens the OpenAI
    // endpoint they are for, where they are applied; not a MiniCPM-o session, which would take
    // none of them.
    let settings = key.session.as_ref().and_then(|s| s.as_object()).is_some_and(|s| !s.is_empty());
    if settings && matches!(endpoint, Endpoint::MiniCpm(_)) {
        let model = key.model().map_or(String::new(), |m| format!("?model={m}"));
        return Err(Refusal::new(
            "wrong_model",
            400,
            "invalid_request_error",
            format!(
                "this client secret was minted with session settings: it opens /v1/realtime{model} (OpenAI), not a MiniCPM-o session"
            ),
        ));
    }
    let admission = address_admission(caller, gw)?;
    let (mode, dialect, reject): (Mode, Box<dyn Dialect>, Option<ProtocolError>) = match &endpoint {
        Endpoint::MiniCpm(mode) => {
            let dialect = MiniCpmEndpoint::new(*mode, config.dialect_limits(), &gw.voice)
                .with_gateway_transcription(gw.transcription.is_some());
            (*mode, Box::new(dialect), None)
        }
        Endpoint::Realtime(flavor, model) => {
            let dialect = Box::new(
                Realtime::new(*flavor, model, config.dialect_limits(), &gw.voice)
                    .with_gateway_transcription(gw.transcription.is_some())
                    .with_delegation(gw.delegation.is_some()),
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
        resume: config.server.resume_terms(),
    };
    let client = ClientInfo {
        addr: caller
            .ip
            .map_or_else(|| "unknown".to_string(), |ip| std::net::SocketAddr::new(ip, caller.port).to_string()),
        user_agent: caller.user_agent.clone(),
        transport: transport.name,
        carries_audio: transport.carries_audio,
        key_id: key.key_id.clone(),
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
    Ok(Admitted { conn, settings, dialect, client, info, admission, session: key.session, key_id, first: Vec::new() })
}

/// The caller's address counted against its caps (connections, waiting) while the returned
/// admission lives: a session, or a request read before one (a call's offer).
pub fn address_admission(caller: &Caller, gw: &Serving) -> Result<Admission, Refusal> {
    let config = &gw.config;
    let caps =
        AddressCaps { connections: config.server.max_connections_per_ip, waiting: config.server.max_waiting_per_ip };
    gw.registry.admit(caller.ip, caps).map_err(|refusal| match refusal {
        CapRefusal::TooManyConnections => Refusal::new(
            "too_many_connections",
            429,
            "too_many_connections",
            format!("at most {} connections per address (server.max_connections_per_ip)", caps.connections),
        ),
        CapRefusal::TooManyWaiting => Refusal::new(
            "too_many_waiting",
            429,
            "too_many_waiting",
            format!(
                "at most {} connections per address may wait for a worker (server.max_waiting_per_ip)",
                caps.waiting
            ),
        ),
        CapRefusal::ShuttingDown => Refusal::new("shutting_down", 503, "service_unavailable", "the server is stopping"),
    })
}

/// The SIP edge's host: its calls admitted as every caller is (a trunk is let in by its
/// network, not a key; a call the app accepted counts as its key's), in the OpenAI GA dialect,
/// and offered to the webhooks while they ring.
pub struct SipCalls(pub Serving);

impl omni_transports::sip::CallHost for SipCalls {
    fn admit(&self, caller: &Caller, call: omni_transports::sip::CallStart) -> Result<StartSession, Refusal> {
        let credential = auth::Credential { key_id: call.key_id, session: None, untaken_secret: None };
        let transport = Transport { name: "sip", carries_audio: true };
        let settings = Some(call.settings).filter(|s| !s.is_empty()).map(FromClient::Configure);
        let app = call.app.map(|text| FromClient::Text(text.into()));
        admit(caller, &self.0, Endpoint::Realtime(Flavor::Ga, call.model), credential, transport)
            .map(|admitted| admitted.opening(settings.into_iter().chain(app)).starter(&self.0))
    }

    fn offer(
        &self,
        data: &serde_json::Value,
        deadline: Instant,
        settled: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> usize {
        self.0.webhooks.offer(data, deadline, settled)
    }

    fn shutting_down(&self) -> bool {
        self.0.registry.shutting_down()
    }
}
