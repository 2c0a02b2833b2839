//! Phone calls from a SIP trunk (`[sip]`): a carrier or a PBX sends an INVITE over UDP, the
//! gateway answers it with SDP, and the call's voice travels as G.711 over RTP on a port of its
//! own. The session behind it is an ordinary session of the OpenAI dialect (server VAD turning),
//! which the call opens as any client does, through the server that runs the edge ([`CallHost`]).
//!
//! SIP itself (parsing, transactions and their retransmissions, the INVITE dialog, CANCEL,
//! BYE, re-INVITE) is ezk's (`ezk-sip-core`, `ezk-sip-ua`), running on an arbiter of its own:
//! one signalling task per call ([`answer`]) takes the INVITE, checks where it comes from (not
//! from `allowed_networks`: 403) and which number it called (no route: 404), agrees on the
//! media ([`sdp`]; nothing it can take: 488), binds the call's RTP port, starts the call's
//! edge ([`call::SipCall`], which starts the session; a refusal of the admission is answered
//! with its SIP code), answers 200, and then carries the dialog: a re-INVITE is answered and
//! its media handed to the edge, a BYE ends the session, and the session's end sends a BYE.
//! A route whose calls the app accepts (`accept = "webhook"`) rings instead (`accept`): the call
//! is offered to the app (`realtime.call.incoming`) and waits for its decision ([`offers`]).
//! - [`sdp`]: the offer and the answer;
//! - [`offers`]: the calls offered to the app, ringing or answered;
//! - [`digest`]: the trunks' credentials (`[[sip.users]]`), when set;
//! - [`sideband`]: the app's WebSocket on a call it accepted;
//! - [`rtp`]: the jitter buffer, RFC 4733 keys, the packets out;
//! - [`voice`]: the voice in the agreed codec (G.711 or Opus), both ways;
//! - [`call`]: the edge actor.

mod accept;
pub mod call;
pub mod config;
pub mod digest;
pub mod offers;
pub mod rtp;
pub mod sdp;
pub mod sideband;
pub mod voice;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use actix::{Actor, Addr, ArbiterHandle};
use bytesstr::BytesStr;
use ezk_sdp_types::SessionDescription;
use ezk_sip_core::{Endpoint, IncomingRequest, Layer, MayTake};
use ezk_sip_types::header::typed::Contact;
use ezk_sip_types::uri::{NameAddr, SipUri, SipUriUserPart};
use ezk_sip_types::{Method, StatusCode};
use ezk_sip_ua::dialog::DialogLayer;
use ezk_sip_ua::invite::InviteLayer;
use ezk_sip_ua::{CallError, CallEvent, InboundCall, MediaBackend, NoMedia};

use crate::StartSession;
use crate::caller::{Caller, Refusal};
use crate::incoming::IncomingBudget;
use accept::{Acceptance, Answered, Unanswered, ask, sip_headers};
use call::{CallAnswered, CallParts, PeerHungUp, Renegotiated, SipCall};
use config::{Accept, SipRouteEntry};
pub use config::{SipConfig, SipSpec};
use omni_actors::edge::client::CallSettings;

/// What the SIP edge asks of the server it runs in: a call's session admitted (the server's
/// checks, its dialect, its caps), the app told of a call that rings, and whether the server is
/// stopping.
pub trait CallHost: Send + Sync + 'static {
    /// Admits the session of a call from `caller`: how its edge starts it (with the call's
    /// settings, then the app's), or why it is refused. Called on the calls' arbiter, where the
    /// edge and its session run.
    fn admit(&self, caller: &Caller, call: CallStart) -> Result<StartSession, Refusal>;

    /// Tells the app of a call that rings (`realtime.call.incoming` with `data`), to be told by
    /// `deadline` and while `settled` is not set: how many of its webhooks took it.
    fn offer(&self, data: &serde_json::Value, deadline: std::time::Instant, settled: &Arc<AtomicBool>) -> usize;

    /// Whether the server is stopping (OPTIONS says so, for a trunk that fails over).
    fn shutting_down(&self) -> bool;
}

/// What a call's session starts with.
pub struct CallStart {
    /// The model it speaks as.
    pub model: String,
    /// A call the app accepted counts as this key's.
    pub key_id: Option<String>,
    /// Its route's settings, handed to the session first.
    pub settings: CallSettings,
    /// The app's settings from its accept, in the session's dialect (written by the server's
    /// accept route): handed after the route's, as the app's own.
    pub app: Option<String>,
}

/// What the SIP edge is given by the server that starts it.
pub struct SipParts {
    pub spec: SipSpec,
    pub host: Arc<dyn CallHost>,
    /// The model a route that names none speaks as.
    pub default_model: String,
    /// Calls offered to the app, ringing or answered (the accept routes' book too).
    pub offers: Arc<offers::Offers>,
    /// `server.max_connections_per_ip`: calls ringing per trunk address (0: no cap).
    pub max_connections_per_ip: usize,
    /// `server.max_incoming_bytes`: what a call's session may have been handed and not handled.
    pub max_incoming_bytes: usize,
    pub incoming: Arc<IncomingBudget>,
}

/// The SIP edge: what every call's signalling task shares.
pub struct Sip {
    spec: SipSpec,
    host: Arc<dyn CallHost>,
    default_model: String,
    offers: Arc<offers::Offers>,
    max_connections_per_ip: usize,
    max_incoming_bytes: usize,
    incoming: Arc<IncomingBudget>,
    /// Where the calls' edges (and their sessions) run.
    arbiter: ArbiterHandle,
    /// The trunks' credentials, when INVITEs must prove one.
    guard: Option<digest::Guard>,
    /// Where the next RTP port search starts.
    cursor: AtomicU32,
    calls: AtomicU64,
}

/// Starts the SIP edge: binds `[sip] bind`, and answers INVITEs from then on. Answers the bound
/// address, or why it could not bind.
pub async fn start(parts: SipParts) -> std::io::Result<SocketAddr> {
    let arbiter = actix::Arbiter::new();
    let SipParts { spec, host, default_model, offers, max_connections_per_ip, max_incoming_bytes, incoming } = parts;
    let guard = digest::Guard::new(&spec.realm, spec.digest_algorithm, &spec.users);
    let sip = Arc::new(Sip {
        spec,
        host,
        default_model,
        offers,
        max_connections_per_ip,
        max_incoming_bytes,
        incoming,
        guard,
        arbiter: arbiter.handle(),
        cursor: AtomicU32::new(0),
        calls: AtomicU64::new(0),
    });
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let bind = sip.spec.bind;
    arbiter.spawn(async move {
        let mut builder = Endpoint::builder();
        builder.user_agent("omni-gateway");
        builder.add_layer(DialogLayer::default());
        builder.add_layer(InviteLayer::default());
        builder.add_layer(Answering(sip));
        match builder.bind_udp(bind).await {
            Ok(_) => {
                let _endpoint = builder.build();
                let _ = bound_tx.send(Ok(bind));
                // The endpoint lives as long as the arbiter.
                std::future::pending::<()>().await;
            }
            Err(e) => drop(bound_tx.send(Err(e))),
        }
    });
    // The arbiter lives until the process ends.
    std::mem::forget(arbiter);
    bound_rx.await.map_err(|_| std::io::Error::other("the SIP edge's arbiter stopped"))?
}

/// The layer of ezk's endpoint that takes INVITEs outside a dialog.
struct Answering(Arc<Sip>);

#[async_trait::async_trait]
impl Layer for Answering {
    fn name(&self) -> &'static str {
        "omni-gateway"
    }

    async fn receive(&self, endpoint: &Endpoint, request: MayTake<'_, IncomingRequest>) {
        if request.line.method == Method::OPTIONS {
            // A trunk's keepalive (or a question of what the gateway takes): 200, to a
            // network allowed only.
            let mut options = request.take();
            // A stopping gateway says so, for a trunk that fails over by its keepalives.
            let code = if !self.0.spec.allows(options.tp_info.source.ip()) {
                StatusCode::FORBIDDEN
            } else if self.0.host.shutting_down() {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            let tsx = endpoint.create_server_tsx(&mut options);
            let response = endpoint.create_response(&options, code, None);
            if let Err(e) = tsx.respond(response).await {
                log::debug!("an OPTIONS' answer was not delivered: {e}");
            }
            return;
        }
        if request.line.method != Method::INVITE {
            return;
        }
        let invite = request.take();
        answer(self.0.clone(), endpoint.clone(), invite).await;
    }
}

/// The SIP code a refused admission is answered with.
fn code_of(refusal: &Refusal) -> StatusCode {
    match refusal.status {
        429 => StatusCode::BUSY_HERE,
        503 => StatusCode::SERVICE_UNAVAILABLE,
        400 | 404 => StatusCode::NOT_FOUND,
        _ => StatusCode::FORBIDDEN,
    }
}

/// The number an INVITE called: its Request-URI's user part, without the parameters a carrier
/// may add to it (`+15551230000;npdi=yes;rn=...`).
fn called(invite: &IncomingRequest) -> String {
    let user = match &invite.line.uri.user_part {
        SipUriUserPart::User(u) => u.to_string(),
        SipUriUserPart::UserPw(u) => u.user.to_string(),
        SipUriUserPart::Empty => String::new(),
    };
    match user.split_once(';') {
        Some((number, _)) => number.to_string(),
        None => user,
    }
}

impl Sip {
    /// A UDP socket for a call's RTP, on the first free even port of `rtp_ports` from the
    /// cursor (the odd one above is RTCP's, by RFC 3550's rule: a trunk may send it there, and
    /// another call must not be there to hear it).
    fn bind_rtp(&self) -> std::io::Result<UdpSocket> {
        let (first, last) = (*self.spec.rtp_ports.start(), *self.spec.rtp_ports.end());
        let first_even = first + first % 2;
        let size = (u32::from(last.saturating_sub(first_even)) / 2 + 1).max(1);
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % size;
        for i in 0..size {
            let port = first_even + 2 * ((start + i) % size) as u16;
            if port > last {
                continue;
            }
            match UdpSocket::bind(SocketAddr::new(self.spec.rtp_bind, port)) {
                Ok(socket) => return Ok(socket),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no free UDP port in sip.rtp_ports ({first}-{last})"),
        ))
    }

    /// The model a call to `route` speaks as: the one its accept asked for, else the route's,
    /// else the first served.
    fn model_of(&self, route: &SipRouteEntry, asked: Option<&str>) -> String {
        match asked.filter(|m| !m.is_empty()) {
            Some(m) => m.to_string(),
            None if !route.model.is_empty() => route.model.clone(),
            None => self.default_model.clone(),
        }
    }

    /// Where in-dialog requests (ACK, BYE, re-INVITE) reach this gateway: the address trunks
    /// reach it at (`public_ip`, behind NAT too), and the SIP port.
    fn contact(&self) -> Contact {
        let ip = self.spec.public_ip;
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let uri: SipUri =
            format!("sip:omni-gateway@{host}:{}", self.spec.bind.port()).parse().expect("a SIP URI of an address");
        Contact::new(NameAddr::uri(uri))
    }
}

/// One INVITE, from its arrival to the call's end.
async fn answer(sip: Arc<Sip>, endpoint: Endpoint, mut invite: IncomingRequest) {
    let n = sip.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let label = format!("sip-{n}");
    let source = invite.tp_info.source;
    if !sip.spec.allows(source.ip()) {
        // Refused before anything of it is kept (no dialog); counted with the other refusals,
        // and said in the log at debug level only (a scanner's INVITEs would flood it).
        let _ = Refusal::new("forbidden_network", 403, "forbidden", "");
        log::debug!("{label}: an INVITE from {source} refused (403): not from sip.allowed_networks");
        return refuse(&endpoint, &mut invite, StatusCode::FORBIDDEN).await;
    }
    if let Some(guard) = &sip.guard {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        match guard.check("INVITE", &invite.line.uri, &invite.headers, source.ip(), now) {
            digest::Verdict::Proven(user) => log::debug!("{label}: an INVITE from {source} proved user '{user}'"),
            digest::Verdict::Challenge { stale } => {
                // Every call of a trunk with credentials is challenged once: counted (a trunk that
                // never answers shows as these alone), logged at debug.
                let _ = Refusal::new("sip_challenged", 401, "unauthorized", "");
                log::debug!("{label}: an INVITE from {source} asked for its credentials (401)");
                let challenge = guard.challenge(source.ip(), now, stale);
                return refuse_with(&endpoint, &mut invite, StatusCode::UNAUTHORIZED, |headers| {
                    headers.insert_type(ezk_sip_types::Name::WWW_AUTHENTICATE, &challenge)
                })
                .await;
            }
            digest::Verdict::Refused(why) => {
                let _ = Refusal::new("sip_credentials", 403, "forbidden", "");
                log::info!("{label}: an INVITE from {source} refused (403): {why}");
                return refuse(&endpoint, &mut invite, StatusCode::FORBIDDEN).await;
            }
        }
    }
    let number = called(&invite);
    let inbound_has_tag = invite.base_headers.to.tag.is_some();
    let body = BytesStr::from_utf8_bytes(invite.body.clone()).ok();
    let offer = body.as_ref().and_then(|b| SessionDescription::parse(b).ok());
    let headers = sip_headers(&invite);
    let mut inbound = match InboundCall::from_invite(endpoint.clone(), invite, sip.contact()) {
        Ok(call) => call,
        Err(e) => {
            let (mut invite, why) = *e;
            log::info!("{label}: an INVITE from {source} is not a call (400): {why}");
            return refuse(&endpoint, &mut invite, StatusCode::BAD_REQUEST).await;
        }
    };
    if inbound_has_tag {
        return decline(
            inbound,
            &label,
            source,
            StatusCode::CALL_OR_TRANSACTION_DOES_NOT_EXIST,
            "an INVITE within a dialog that is not here".into(),
        )
        .await;
    }
    let Some(route) = sip.spec.route(&number).cloned() else {
        return decline(
            inbound,
            &label,
            source,
            StatusCode::NOT_FOUND,
            format!("no [[sip.routes]] for the number called, '{number}'"),
        )
        .await;
    };
    let Some(offer) = offer.filter(|_| inbound.has_sdp_offer()) else {
        return decline(inbound, &label, source, StatusCode::NOT_ACCEPTABLE_HERE, "the INVITE has no SDP offer".into())
            .await;
    };
    let acceptance = match route.accept {
        Accept::Route => Acceptance::of_route(&sip, &route),
        Accept::Webhook => {
            if let Err(e) = sdp::agreed(&offer) {
                return decline(inbound, &label, source, StatusCode::NOT_ACCEPTABLE_HERE, e.to_string()).await;
            }
            match ask(&sip, &mut inbound, source.ip().to_canonical(), &label, headers, (&number, &route)).await {
                Ok(acceptance) => acceptance,
                Err(Unanswered::Cancelled) => return log::info!("{label}: the caller gave up while it rang"),
                Err(Unanswered::Refused(code, why)) => return decline(inbound, &label, source, code, why).await,
            }
        }
    };
    let socket = match sip.bind_rtp() {
        Ok(s) => s,
        Err(e) => {
            let why = e.to_string();
            acceptance.tell(Err(Refusal::new("no_port", 503, "server_error", why.clone())));
            return decline(inbound, &label, source, StatusCode::SERVICE_UNAVAILABLE, why).await;
        }
    };
    let local = SocketAddr::new(sip.spec.public_ip, socket.local_addr().map_or(0, |a| a.port()));
    let session_id = u64::from(call_id_number());
    let (media, sdp_answer) = match sdp::answer(&offer, local, session_id, 1) {
        Ok(agreed) => agreed,
        Err(e) => {
            acceptance.tell(Err(Refusal::new("internal", 400, "invalid_request_error", e.to_string())));
            return decline(inbound, &label, source, StatusCode::NOT_ACCEPTABLE_HERE, e.to_string()).await;
        }
    };
    log::info!("{label}: a call from {source} to '{number}': {} on RTP {local}", media.codec.name());

    // The call's edge starts its session on the calls' arbiter (a session's start is not
    // Send); its admission's refusal comes back here.
    let (hang_up, mut hung_up) = tokio::sync::mpsc::unbounded_channel();
    let (ready_tx, mut ready) = tokio::sync::oneshot::channel();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<Result<Addr<SipCall>, Refusal>>();
    let edge_sip = sip.clone();
    let caller = Caller { ip: Some(source.ip()), port: source.port(), user_agent: None, origin: Default::default() };
    let Acceptance { model, settings, app, key_id, done, call_id } = acceptance;
    // The app's hang-up of a call it accepted (the sender kept here too: never closed).
    let (app_hang_up, mut app_hung_up) = tokio::sync::mpsc::unbounded_channel();
    let answered = call_id.map(|id| (id, key_id.clone(), app_hang_up.clone()));
    let call_label = label.clone();
    let call_media = media.clone();
    sip.arbiter.spawn(async move {
        // A trunk is let in by its network, not a key; a call the app accepted counts as its
        // key's.
        let sip = edge_sip;
        let started = sip.host.admit(&caller, CallStart { model, key_id, settings, app }).and_then(|start| {
            let parts = CallParts {
                label: call_label,
                socket,
                media: call_media,
                start,
                max_incoming_bytes: sip.max_incoming_bytes,
                incoming: sip.incoming.clone(),
                hang_up,
                trunk: caller.ip.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
                ready: ready_tx,
            };
            SipCall::new(parts)
                .map(Actor::start)
                .map_err(|e| Refusal::new("internal", 503, "server_error", format!("the call's RTP socket: {e}")))
        });
        let _ = started_tx.send(started);
    });
    let started = started_rx.await;
    // The app's accept hears how its call went: refused here, or once the trunk has it.
    let tell = |done: Option<tokio::sync::oneshot::Sender<Result<(), Refusal>>>, told: Result<(), Refusal>| {
        if let Some(done) = done {
            let _ = done.send(told);
        }
    };
    let edge = match started {
        Ok(Ok(edge)) => edge,
        Ok(Err(refusal)) => {
            tell(done, Err(refusal.clone()));
            return decline(inbound, &label, source, code_of(&refusal), refusal.message).await;
        }
        Err(_) => {
            tell(done, Err(Refusal::new("internal", 503, "server_error", "the call's edge did not start")));
            return decline(
                inbound,
                &label,
                source,
                StatusCode::SERVICE_UNAVAILABLE,
                "the call's edge did not start".into(),
            )
            .await;
        }
    };
    let media = CallMedia {
        first: Some(sdp_answer.clone()),
        last: sdp_answer,
        local,
        session_id,
        version: 1,
        edge: edge.clone(),
    };
    // An accepted call can be hung up by the app from its accept's answer on, until it ends.
    let door = (edge.clone().recipient(), edge.clone().recipient());
    let _answered = answered.map(|(id, key_id, hang_up)| Answered::new(&sip, id, key_id, hang_up, door));
    // The app's accept is taken: the call is its now (it may hang it up from here on).
    tell(done, Ok(()));
    // The call rings while its session waits for a worker (the caller hears ringback, not
    // silence), and is answered once the session is created.
    let mut ring = tokio::time::interval(accept::RING_AGAIN);
    loop {
        tokio::select! {
            created = &mut ready => match created {
                Ok(()) => break,
                // The edge ended: so did the session (as the arm below).
                Err(_) => {
                    let why = "its session ended before a worker took it".to_string();
                    return decline(inbound, &label, source, StatusCode::TEMPORARILY_UNAVAILABLE, why).await;
                }
            },
            _ = inbound.cancelled() => {
                log::info!("{label}: the caller gave up while it waited for a worker");
                return edge.do_send(PeerHungUp);
            }
            _ = hung_up.recv() => {
                let why = "its session ended before a worker took it".to_string();
                return decline(inbound, &label, source, StatusCode::TEMPORARILY_UNAVAILABLE, why).await;
            }
            _ = app_hung_up.recv() => {
                edge.do_send(PeerHungUp);
                let why = "the app hung it up while it waited for a worker".to_string();
                return decline(inbound, &label, source, StatusCode::TEMPORARILY_UNAVAILABLE, why).await;
            }
            _ = ring.tick() => {
                if let Err(e) = inbound.respond_provisional(StatusCode::RINGING).await {
                    log::debug!("{label}: a 180 was not sent: {e}");
                }
            }
        }
    }
    let mut call = match inbound.with_media(media).accept().await {
        Ok(call) => call,
        Err(e) => {
            log::info!("{label}: the call was not set up: {e}");
            return edge.do_send(PeerHungUp);
        }
    };
    edge.do_send(CallAnswered);
    loop {
        tokio::select! {
            event = call.run() => match event {
                Ok(CallEvent::Internal(event)) => match call.handle_internal_event(event).await {
                    Ok(()) => {}
                    // A re-INVITE whose media cannot be taken was refused; the call goes on as it was.
                    Err(CallError::Media(e)) => log::info!("{label}: a re-INVITE refused: {e}"),
                    Err(e) => {
                        log::info!("{label}: the dialog failed: {e}");
                        return edge.do_send(PeerHungUp);
                    }
                },
                Ok(CallEvent::Media(())) => {}
                Ok(CallEvent::Terminated) => {
                    log::info!("{label}: the trunk hung up");
                    return edge.do_send(PeerHungUp);
                }
                Err(e) => {
                    log::info!("{label}: the dialog failed: {e}");
                    return edge.do_send(PeerHungUp);
                }
            },
            _ = app_hung_up.recv() => {
                log::info!("{label}: the app hung up");
                edge.do_send(PeerHungUp);
                if let Err(e) = call.terminate().await {
                    log::info!("{label}: the BYE was not answered: {e}");
                }
                drop(app_hang_up);
                return;
            }
            _ = hung_up.recv() => {
                if let Err(e) = call.terminate().await {
                    log::info!("{label}: the BYE was not answered: {e}");
                }
                return;
            }
        }
    }
}

/// Answers an INVITE that opens no dialog with `code`, in its own transaction (retransmitted
/// until the trunk's ACK, as RFC 3261 has it).
async fn refuse(endpoint: &Endpoint, invite: &mut IncomingRequest, code: StatusCode) {
    refuse_with(endpoint, invite, code, |_| {}).await
}

/// [`refuse`], with headers of its own (a 401's challenges).
async fn refuse_with(
    endpoint: &Endpoint,
    invite: &mut IncomingRequest,
    code: StatusCode,
    headers: impl FnOnce(&mut ezk_sip_types::Headers),
) {
    let tsx = endpoint.create_server_inv_tsx(invite);
    let mut response = endpoint.create_response(invite, code, None);
    headers(&mut response.msg.headers);
    if let Err(e) = tsx.respond_failure(response).await {
        log::debug!("an INVITE's refusal ({}) was not delivered: {e}", code.into_u16());
    }
}

/// Refuses a call with `code`, saying why in the log.
async fn decline(inbound: InboundCall<NoMedia>, label: &str, source: SocketAddr, code: StatusCode, why: String) {
    log::info!("{label}: a call from {source} refused ({}): {why}", code.into_u16());
    if let Err(e) = inbound.decline(code, None).await {
        log::debug!("{label}: the refusal was not delivered: {e}");
    }
}

/// A number for an SDP session id.
fn call_id_number() -> u32 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 1
}

/// The call's media as ezk's dialog sees it: the first offer was agreed before the call was
/// answered; a re-INVITE's offer is agreed here and its media handed to the call's edge.
struct CallMedia {
    first: Option<SessionDescription>,
    /// The answer last given (offered again when a re-INVITE asks for an offer).
    last: SessionDescription,
    local: SocketAddr,
    session_id: u64,
    version: u64,
    edge: Addr<SipCall>,
}

impl MediaBackend for CallMedia {
    type Error = sdp::Refused;
    type Event = ();

    fn has_media(&self) -> bool {
        true
    }

    async fn create_sdp_offer(&mut self) -> Result<SessionDescription, sdp::Refused> {
        self.version += 1;
        Ok(sdp::reoffer(&self.last, self.version))
    }

    async fn receive_sdp_answer(&mut self, answer: SessionDescription) -> Result<(), sdp::Refused> {
        let (_, media) = sdp::agreed(&answer)?;
        self.edge.do_send(Renegotiated(media));
        Ok(())
    }

    async fn receive_sdp_offer(&mut self, offer: SessionDescription) -> Result<SessionDescription, sdp::Refused> {
        if let Some(first) = self.first.take() {
            return Ok(first);
        }
        self.version += 1;
        let (media, answer) = sdp::answer(&offer, self.local, self.session_id, self.version)?;
        self.edge.do_send(Renegotiated(media));
        self.last = answer.clone();
        Ok(answer)
    }

    async fn run(&mut self) -> Result<(), sdp::Refused> {
        std::future::pending().await
    }
}
