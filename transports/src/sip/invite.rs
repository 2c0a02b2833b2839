//! One INVITE, from its arrival to the call's end: screened (its credentials: its network was
//! the gate's), read (a call, a route, an offer), accepted (by its route, or by the app), agreed (an RTP
//! port and the answer), started (the call's edge and its session, on the calls' arbiter), rung
//! while the session waits for a worker, answered, and carried until either side hangs up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use actix::{Actor, Addr};
use bytesstr::BytesStr;
use ezk_sdp_types::SessionDescription;
use ezk_sip_core::{Endpoint, IncomingRequest};
use ezk_sip_types::StatusCode;
use ezk_sip_types::uri::SipUriUserPart;
use ezk_sip_ua::{CallError, CallEvent, InboundCall, MediaBackend, NoMedia};
use tokio::sync::{mpsc, oneshot};

use super::accept::{self, Acceptance, Answered, Unanswered, ask, sip_headers};
use super::call::{CallAnswered, PeerHungUp, Renegotiated, SipCall, SipCallParts};
use super::config::Accept;
use super::{CallStart, Sip, digest, gate, sdp};
use crate::caller::{Caller, Refusal};

/// A refusal of a call: its SIP code, and why (for the log).
type Declined = (StatusCode, String);

/// One INVITE, from its arrival to the call's end.
pub(super) async fn answer(sip: Arc<Sip>, endpoint: Endpoint, invite: IncomingRequest) {
    let n = sip.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let label = format!("sip-{n}");
    let source = invite.tp_info.source;
    if !screen(&sip, &endpoint, &invite, &label, source).await {
        return;
    }
    // From here until the call ends, its in-dialog requests (CANCEL, ACK, BYE, re-INVITE) are
    // taken from this address's network entry only.
    let Some(_entered) = gate::Entered::new(&sip.screen, invite.base_headers.call_id.0.as_str(), source.ip()) else {
        // Another INVITE of this Call-ID got here first (a late retransmission, a forked copy).
        return log::debug!("{label}: an INVITE from {source} for a call here already, dropped");
    };
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
    let read = if inbound_has_tag {
        Err((StatusCode::CALL_OR_TRANSACTION_DOES_NOT_EXIST, "an INVITE within a dialog that is not here".into()))
    } else {
        routed(&sip, &number, offer.filter(|_| inbound.has_sdp_offer()))
    };
    let (route, offer) = match read {
        Ok(read) => read,
        Err((code, why)) => return decline(inbound, &label, source, code, why).await,
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
    let agreed = match agree(&sip, &offer) {
        Ok(agreed) => agreed,
        Err((refusal, code)) => {
            let why = refusal.message.clone();
            acceptance.tell(Err(refusal));
            return decline(inbound, &label, source, code, why).await;
        }
    };
    log::info!("{label}: a call from {source} to '{number}': {} on RTP {}", agreed.media.codec.name(), agreed.local);
    let Agreed { socket, local, session_id, media, answer } = agreed;
    let (started, done) = start(&sip, source, acceptance, (socket, media), &label).await;
    let mut started = match started {
        Ok(started) => started,
        Err(refusal) => {
            tell(done, Err(refusal.clone()));
            return decline(inbound, &label, source, code_of(&refusal), refusal.message).await;
        }
    };
    let edge = started.edge.clone();
    let media =
        CallMedia { first: Some(answer.clone()), last: answer, local, session_id, version: 1, edge: edge.clone() };
    // An accepted call can be hung up by the app from its accept's answer on, until it ends.
    let door = (edge.clone().recipient(), edge.clone().recipient());
    let _answered = started.answered.take().map(|(id, key_id, hang_up)| Answered::new(&sip, id, key_id, hang_up, door));
    // The app's accept is taken: the call is its now (it may hang it up from here on).
    tell(done, Ok(()));
    match ring(&mut inbound, &mut started, &label).await {
        Ok(()) => {}
        Err(Some((code, why))) => return decline(inbound, &label, source, code, why).await,
        Err(None) => return,
    }
    match inbound.with_media(media).accept().await {
        Ok(call) => {
            edge.do_send(CallAnswered);
            carry(call, started, &label).await
        }
        Err(e) => {
            log::info!("{label}: the call was not set up: {e}");
            edge.do_send(PeerHungUp)
        }
    }
}

/// Whether an INVITE (from `allowed_networks`: the gate saw to it) may go on: with the
/// credentials of a trunk when `[[sip.users]]` are set. Else it is refused (403, or 401 with the
/// challenges) here.
async fn screen(sip: &Sip, endpoint: &Endpoint, invite: &IncomingRequest, label: &str, source: SocketAddr) -> bool {
    let Some(guard) = &sip.guard else { return true };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    match guard.check("INVITE", &invite.line.uri, &invite.headers, source.ip(), now) {
        digest::DigestVerdict::Proven(user) => {
            log::debug!("{label}: an INVITE from {source} proved user '{user}'");
            true
        }
        digest::DigestVerdict::Challenge { stale } => {
            // Every call of a trunk with credentials is challenged once: counted (a trunk that
            // never answers shows as these alone), logged at debug.
            let _ = Refusal::new("sip_challenged", 401, "unauthorized", "");
            log::debug!("{label}: an INVITE from {source} asked for its credentials (401)");
            let challenge = guard.challenge(source.ip(), now, stale);
            // Stateless, as an edge proxy challenges: nothing is kept of an INVITE until it
            // proves a trunk's credentials (a lost 401 is asked again by the INVITE's own
            // retransmission).
            gate::stateless_with(endpoint, invite, StatusCode::UNAUTHORIZED, |headers| {
                headers.insert_type(ezk_sip_types::Name::WWW_AUTHENTICATE, &challenge)
            })
            .await;
            false
        }
        digest::DigestVerdict::Refused(why) => {
            let _ = Refusal::new("sip_credentials", 403, "forbidden", "");
            log::info!("{label}: an INVITE from {source} refused (403): {why}");
            gate::stateless_with(endpoint, invite, StatusCode::FORBIDDEN, |_| {}).await;
            false
        }
    }
}

/// The route of the number called, and the INVITE's offer.
fn routed(
    sip: &Sip,
    number: &str,
    offer: Option<SessionDescription>,
) -> Result<(super::SipRouteEntry, SessionDescription), Declined> {
    let Some(route) = sip.spec.route(number).cloned() else {
        return Err((StatusCode::NOT_FOUND, format!("no [[sip.routes]] for the number called, '{number}'")));
    };
    let offer = offer.ok_or((StatusCode::NOT_ACCEPTABLE_HERE, "the INVITE has no SDP offer".to_string()))?;
    Ok((route, offer))
}

/// The call's media, agreed: its RTP socket and the SDP answer.
struct Agreed {
    socket: std::net::UdpSocket,
    local: SocketAddr,
    session_id: u64,
    media: sdp::Media,
    answer: SessionDescription,
}

/// Binds the call's RTP port and answers its offer; else the refusal for the app's accept and
/// the SIP code for the trunk.
fn agree(sip: &Sip, offer: &SessionDescription) -> Result<Agreed, (Refusal, StatusCode)> {
    let socket = sip
        .bind_rtp()
        .map_err(|e| (Refusal::new("no_port", 503, "server_error", e.to_string()), StatusCode::SERVICE_UNAVAILABLE))?;
    let local = SocketAddr::new(sip.spec.public_ip, socket.local_addr().map_or(0, |a| a.port()));
    let session_id = u64::from(call_id_number());
    let (media, answer) = sdp::answer(offer, local, session_id, 1).map_err(|e| {
        (Refusal::new("internal", 400, "invalid_request_error", e.to_string()), StatusCode::NOT_ACCEPTABLE_HERE)
    })?;
    Ok(Agreed { socket, local, session_id, media, answer })
}

/// The app's accept, told how its call went.
type Done = Option<oneshot::Sender<Result<(), Refusal>>>;

fn tell(done: Done, told: Result<(), Refusal>) {
    if let Some(done) = done {
        let _ = done.send(told);
    }
}

/// A call whose edge started: how its end is heard.
struct Started {
    edge: Addr<SipCall>,
    /// Set once the session is created (a worker took it).
    ready: oneshot::Receiver<()>,
    /// The edge's hang-up (its session ended).
    hung_up: mpsc::UnboundedReceiver<()>,
    /// The app's hang-up of a call it accepted (the sender kept here too: never closed).
    app_hung_up: mpsc::UnboundedReceiver<()>,
    _app_hang_up: mpsc::UnboundedSender<()>,
    /// A call the app accepted: its id, key and hang-up, booked while it is answered.
    answered: Option<(String, Option<String>, mpsc::UnboundedSender<()>)>,
}

/// Starts the call's edge on the calls' arbiter (a session's start is not Send), which starts
/// its session: the edge, or the admission's refusal; and the app's accept to tell.
async fn start(
    sip: &Arc<Sip>,
    source: SocketAddr,
    acceptance: Acceptance,
    (socket, media): (std::net::UdpSocket, sdp::Media),
    label: &str,
) -> (Result<Started, Refusal>, Done) {
    let (hang_up, hung_up) = mpsc::unbounded_channel();
    let (ready_tx, ready) = oneshot::channel();
    let (started_tx, started_rx) = oneshot::channel::<Result<Addr<SipCall>, Refusal>>();
    let caller = Caller { ip: Some(source.ip()), port: source.port(), user_agent: None, origin: Default::default() };
    let Acceptance { model, settings, app, key_id, done, call_id } = acceptance;
    let (app_hang_up, app_hung_up) = mpsc::unbounded_channel();
    let answered = call_id.map(|id| (id, key_id.clone(), app_hang_up.clone()));
    let (sip, label) = (sip.clone(), label.to_string());
    sip.arbiter.clone().spawn(async move {
        // A trunk is let in by its network, not a key; a call the app accepted counts as its
        // key's.
        let started = sip.host.admit(&caller, CallStart { model, key_id, settings, app }).and_then(|start| {
            let parts = SipCallParts {
                label,
                socket,
                media,
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
    let started = match started_rx.await {
        Ok(Ok(edge)) => Ok(Started { edge, ready, hung_up, app_hung_up, _app_hang_up: app_hang_up, answered }),
        Ok(Err(refusal)) => Err(refusal),
        Err(_) => Err(Refusal::new("internal", 503, "server_error", "the call's edge did not start")),
    };
    (started, done)
}

/// Rings while the call's session waits for a worker (the caller hears ringback, not
/// silence), until the session is created; else how the call is declined (`None`: it needs
/// no answer, the caller gave up).
async fn ring(inbound: &mut InboundCall<NoMedia>, call: &mut Started, label: &str) -> Result<(), Option<Declined>> {
    let unavailable = |why: &str| Err(Some((StatusCode::TEMPORARILY_UNAVAILABLE, why.to_string())));
    let mut ring = tokio::time::interval(accept::RING_AGAIN);
    loop {
        tokio::select! {
            created = &mut call.ready => return match created {
                Ok(()) => Ok(()),
                // The edge ended: so did the session (as the arm below).
                Err(_) => unavailable("its session ended before a worker took it"),
            },
            _ = inbound.cancelled() => {
                log::info!("{label}: the caller gave up while it waited for a worker");
                call.edge.do_send(PeerHungUp);
                return Err(None);
            }
            _ = call.hung_up.recv() => return unavailable("its session ended before a worker took it"),
            _ = call.app_hung_up.recv() => {
                call.edge.do_send(PeerHungUp);
                return unavailable("the app hung it up while it waited for a worker");
            }
            _ = ring.tick() => {
                if let Err(e) = inbound.respond_provisional(StatusCode::RINGING).await {
                    log::debug!("{label}: a 180 was not sent: {e}");
                }
            }
        }
    }
}

/// Carries an answered call's dialog (re-INVITEs, the trunk's BYE) until the trunk, the app
/// or the session hangs up.
async fn carry(mut call: ezk_sip_ua::Call<CallMedia>, mut started: Started, label: &str) {
    let edge = started.edge.clone();
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
            _ = started.app_hung_up.recv() => {
                log::info!("{label}: the app hung up");
                edge.do_send(PeerHungUp);
                if let Err(e) = call.terminate().await {
                    log::info!("{label}: the BYE was not answered: {e}");
                }
                return;
            }
            _ = started.hung_up.recv() => {
                if let Err(e) = call.terminate().await {
                    log::info!("{label}: the BYE was not answered: {e}");
                }
                return;
            }
        }
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
    type Error = sdp::OfferRefused;
    type Event = ();

    fn has_media(&self) -> bool {
        true
    }

    async fn create_sdp_offer(&mut self) -> Result<SessionDescription, sdp::OfferRefused> {
        self.version += 1;
        Ok(sdp::reoffer(&self.last, self.version))
    }

    async fn receive_sdp_answer(&mut self, answer: SessionDescription) -> Result<(), sdp::OfferRefused> {
        let (_, media) = sdp::agreed(&answer)?;
        self.edge.do_send(Renegotiated(media));
        Ok(())
    }

    async fn receive_sdp_offer(&mut self, offer: SessionDescription) -> Result<SessionDescription, sdp::OfferRefused> {
        if let Some(first) = self.first.take() {
            return Ok(first);
        }
        self.version += 1;
        let (media, answer) = sdp::answer(&offer, self.local, self.session_id, self.version)?;
        self.edge.do_send(Renegotiated(media));
        self.last = answer.clone();
        Ok(answer)
    }

    async fn run(&mut self) -> Result<(), sdp::OfferRefused> {
        std::future::pending().await
    }
}
