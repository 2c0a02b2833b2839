//! WebRTC signalling, as the OpenAI Realtime API has it: `POST /v1/realtime/calls` takes an SDP
//! offer (the body, `application/sdp`, or a multipart form with `sdp` and an optional `session`
//! object) and answers `201 Created` with the SDP answer and `Location:
//! /v1/realtime/calls/{call_id}`; `POST /v1/realtime/calls/{call_id}/hangup` (or `DELETE
//! /v1/realtime/calls/{call_id}`) ends the call.
//!
//! The client is checked like a WebSocket client ([`crate::admission::admit`]) before its offer is read;
//! the session behind the call is an ordinary one of the OpenAI dialect.

use actix::Actor;
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use omni_actors::edge::client::FromClient;
use serde_json::Value;

use super::{api_key, caller, query_of, refused, resume};
use crate::admission::{Endpoint, Transport, address_admission, admit, authenticate};
use crate::auth::{self, client_secrets};
use crate::http::Gateway;
use crate::http::body::{BodyError, Bounded, Bounds};
use crate::http::routes::http_error;
use omni_dialects::openai::Flavor;
use omni_transports::StartSession;
use omni_transports::webrtc::call::{CallBounds, CallEdge, RtcCallParts};
use omni_transports::webrtc::{AnswerError, HangUp, Hanger};

/// The largest offer, and the largest `session` part, read.
const MAX_PART_BYTES: usize = 64 * 1024;
/// The parts of a form read at most (`sdp`, `session`, and a few a client may add).
const MAX_PARTS: usize = 8;
/// The whole request body at most, whatever it is made of (a form's part headers included:
/// the form's parser buffers them until their end, so it is never handed more than this), and
/// the time a client has to send it.
const OFFER_BOUNDS: Bounds =
    Bounds { max_bytes: 2 * MAX_PART_BYTES + 16 * 1024, deadline: std::time::Duration::from_secs(10) };

fn bad_request(message: impl Into<String>) -> HttpResponse {
    http_error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// The offer and the session settings of a request's body.
struct Offer {
    sdp: String,
    session: Option<Value>,
}

/// Why a request's offer cannot be read.
#[derive(Debug, thiserror::Error)]
enum OfferError {
    /// The body (or a part of the form) could not be read: which, and why.
    #[error("{0}: {1}")]
    Read(String, String),
    #[error("{0} is over {MAX_PART_BYTES} bytes")]
    TooLarge(String),
    #[error("{0} is not UTF-8")]
    NotText(&'static str),
    #[error("the form has more than {MAX_PARTS} parts")]
    TooManyParts,
    #[error("session is not a JSON object{0}")]
    NotAnObject(String),
    #[error("the form has no 'sdp' part")]
    NoSdp,
    #[error("an offer is sent as application/sdp, or as a multipart/form-data form")]
    NotAnOffer,
    #[error("{0}")]
    Body(#[from] BodyError),
}

impl OfferError {
    fn status(&self) -> StatusCode {
        match self {
            OfferError::Body(e) => e.status(),
            OfferError::TooLarge(_) | OfferError::TooManyParts => StatusCode::PAYLOAD_TOO_LARGE,
            OfferError::NotAnOffer => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Reads the body, at most `limit` bytes.
async fn read_limited<E: std::fmt::Display>(
    mut body: impl futures_util::Stream<Item = Result<web::Bytes, E>> + Unpin,
    what: &str,
) -> Result<Vec<u8>, OfferError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| OfferError::Read(what.to_string(), e.to_string()))?;
        if bytes.len() + chunk.len() > MAX_PART_BYTES {
            return Err(OfferError::TooLarge(what.to_string()));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn text(bytes: Vec<u8>, what: &'static str) -> Result<String, OfferError> {
    String::from_utf8(bytes).map_err(|_| OfferError::NotText(what))
}

/// The offer of a request: its body read within `OFFER_BOUNDS`.
async fn offer_of(req: &HttpRequest, payload: web::Payload) -> Result<Offer, OfferError> {
    OFFER_BOUNDS.read(req, payload, |body| read_offer(req, body)).await
}

async fn read_offer(req: &HttpRequest, body: Bounded) -> Result<Offer, OfferError> {
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let content_type = content_type.to_ascii_lowercase();
    if content_type.starts_with("application/sdp") {
        let body = read_limited(body, "the offer").await?;
        return Ok(Offer { sdp: text(body, "the offer")?, session: None });
    }
    if !content_type.starts_with("multipart/form-data") {
        // (text/plain would let any web page send an offer without asking first)
        return Err(OfferError::NotAnOffer);
    }
    let mut form = actix_multipart::Multipart::new(req.headers(), body);
    let (mut sdp, mut session) = (None, None);
    let mut parts = 0;
    while let Some(field) = form.next().await {
        parts += 1;
        if parts > MAX_PARTS {
            return Err(OfferError::TooManyParts);
        }
        let field = field.map_err(|e| OfferError::Read("the form".into(), e.to_string()))?;
        let name = field.name().unwrap_or("").to_string();
        let bytes = read_limited(field, &format!("the form's '{name}'")).await?;
        match name.as_str() {
            "sdp" => sdp = Some(text(bytes, "sdp")?),
            "session" => {
                let value: Value =
                    serde_json::from_slice(&bytes).map_err(|e| OfferError::NotAnObject(format!(": {e}")))?;
                if !value.is_object() {
                    return Err(OfferError::NotAnObject(String::new()));
                }
                session = Some(value);
            }
            _ => {}
        }
    }
    Ok(Offer { sdp: sdp.ok_or(OfferError::NoSdp)?, session })
}

/// The model a call asks for: `?model=`, else the form's session's, else the client secret's,
/// else the first one served.
fn model_of(gw: &Gateway, query: Option<&String>, sessions: [Option<&Value>; 2]) -> String {
    query
        .cloned()
        .or_else(|| sessions.iter().flatten().find_map(|s| s.get("model").and_then(Value::as_str).map(String::from)))
        .or_else(|| gw.config.models.first().map(|m| m.name.clone()))
        .unwrap_or_default()
}

pub(crate) async fn create(req: HttpRequest, payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    match place(&req, payload, &gw).await {
        Ok(answer) | Err(answer) => answer,
    }
}

/// A call placed: its caller and offer checked, its session admitted (or resumed), its port
/// taken and its edge started; the answer, or the refusal.
async fn place(req: &HttpRequest, payload: web::Payload, gw: &Gateway) -> Result<HttpResponse, HttpResponse> {
    let Some(calls) = gw.calls.clone() else {
        return Err(http_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "WebRTC calls are off here ([webrtc] enabled = false)",
        ));
    };
    let query = query_of(req)?;
    super::same_site(req, gw)?;
    // The key is checked before a byte of the offer is read; a client secret is taken only
    // once the call is answered (a refused call leaves it good).
    let caller = caller(req, gw);
    let key = authenticate(&caller, gw, [auth::bearer(req), None, None], false).await.map_err(refused)?;
    let offer = read_counted(req, payload, &caller, gw).await?;
    // `?resume=TOKEN`: the call takes back a session whose connection dropped (its token is
    // used only once the call is answered); else a new session is admitted.
    let ask = resume::asked(&query)?;
    let admitted = match ask {
        Some(_) => None,
        None => {
            let model = model_of(gw, query.get("model"), [offer.session.as_ref(), key.session.as_ref()]);
            // The call carries the voice on its tracks: its session's dialect takes and gives samples.
            let transport = Transport { name: "webrtc", carries_audio: true };
            Some(admit(&caller, gw, Endpoint::Realtime(Flavor::Ga, model), key.clone(), transport).map_err(refused)?)
        }
    };
    let key_id = admitted.as_ref().map_or_else(|| key.key_id.clone(), |a| a.key_id.clone());
    // Counted as not yet connected before it takes a port: one address or one key cannot hold
    // them all.
    let id = format!("rtc_{}", uuid::Uuid::new_v4().simple());
    if let Err(why) = calls.admit_unconnected(&id, caller.ip, key_id.as_deref()) {
        omni_actors::observe::metrics().connections_refused.with_label_values(&["too_many_unconnected_calls"]).inc();
        return Err(http_error(StatusCode::TOO_MANY_REQUESTS, "too_many_unconnected_calls", why.to_string()));
    }
    // Refused from here on, it no longer counts; answered, its edge settles it.
    let mut unsettled = Unsettled { calls: &calls, id: &id, armed: true };
    let answered = calls.answer(&offer.sdp).map_err(unanswered)?;
    let secret = key.untaken_secret.clone();
    let (start, conn) = match admitted {
        Some(admitted) => {
            if let Some(secret) = &secret
                && !gw.keys.take_secret(secret)
            {
                // Used by another request meanwhile (or just expired).
                return Err(super::secret_used());
            }
            // The settings the call was made with come first (its session's dialect leaves their
            // audio formats to the call).
            let first: Vec<FromClient> = [admitted.session.as_ref(), offer.session.as_ref()]
                .into_iter()
                .flatten()
                .map(|s| FromClient::Text(client_secrets::session_update(s).into()))
                .collect();
            let conn = admitted.conn;
            (admitted.opening(first).starter(gw), conn)
        }
        None => {
            let ask = ask.as_ref().ok_or_else(|| {
                http_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the call has no session")
            })?;
            // (the client secret, if any, is used up there)
            let taken = resume::take(gw, ask, &key, "webrtc")?;
            let (conn, line_no, received) = (taken.conn, omni_actors::ids::connection(), ask.received);
            log::info!("session c{conn}: resumed by call {id} (line {line_no})");
            let start: StartSession = Box::new(move |line| taken.hand(line, line_no, received));
            (start, conn)
        }
    };
    let parts = RtcCallParts {
        id: id.clone(),
        rtc: answered.rtc,
        socket: answered.socket,
        settings: bounds(gw, &calls),
        start,
        calls: calls.clone(),
        incoming: gw.incoming.clone(),
        resumed: ask.is_some(),
    };
    match CallEdge::new(parts) {
        // Known by its id before the answer leaves: a hangup right after it finds the call.
        Ok(edge) => {
            unsettled.armed = false;
            calls.insert(id.clone(), edge.start(), key_id, secret.as_deref())
        }
        Err(e) => {
            log::error!("a call was refused: {e}");
            return Err(http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "cannot start the call"));
        }
    }
    log::info!("call {id}: answered (connection c{conn})");
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, format!("/v1/realtime/calls/{id}")))
        // The answer carries the call's ICE credentials: not for a cache on the way.
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/sdp")
        .body(answered.sdp))
}

/// The offer, read while the request counts as a connection of its address (a client cannot
/// hold more offers open than it may hold sessions).
async fn read_counted(
    req: &HttpRequest,
    payload: web::Payload,
    caller: &crate::admission::Caller,
    gw: &Gateway,
) -> Result<Offer, HttpResponse> {
    let reading = address_admission(caller, gw).map_err(refused)?;
    let offer = offer_of(req, payload).await;
    drop(reading);
    offer.map_err(|why| {
        // (debug: a stranger's junk is not worth a line each at the default level)
        log::debug!("a call's offer from {:?} was refused: {why}", caller.ip);
        http_error(why.status(), "invalid_request_error", why.to_string())
    })
}

/// Why an offer got no answer, as the client is told.
fn unanswered(e: AnswerError) -> HttpResponse {
    match e {
        AnswerError::Offer(why) => bad_request(format!("the offer cannot be answered: {why}")),
        e @ AnswerError::NoPort { .. } => {
            omni_actors::observe::metrics().connections_refused.with_label_values(&["no_port"]).inc();
            if let Some(more) = omni_actors::observe::gated("call_no_port") {
                log::warn!("a call was refused: {e}{more}");
            }
            http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", e.to_string())
        }
        AnswerError::Io(e) => {
            log::error!("a call was refused: cannot bind its UDP socket: {e}");
            http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "cannot open a UDP port")
        }
    }
}

fn bounds(gw: &Gateway, calls: &omni_transports::webrtc::Calls) -> CallBounds {
    let config = &gw.config;
    CallBounds {
        connect_timeout: calls.spec().connect_timeout,
        rate: config.message_rate(),
        max_outgoing_bytes: config.server.max_outgoing_bytes as usize,
        max_incoming_bytes: config.server.max_incoming_bytes as usize,
    }
}

/// A call counted as not yet connected, until it was handed to its edge: dropped before, it
/// no longer counts (the request was refused).
struct Unsettled<'a> {
    calls: &'a omni_transports::webrtc::Calls,
    id: &'a str,
    armed: bool,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.calls.connected(self.id);
        }
    }
}

/// Hangs a call up, for the API key that opened it (or minted the secret it was opened with),
/// or for the client secret it was opened with (a page holding only that); on a gateway without
/// API keys, for anyone who knows its id. A refused hangup never counts as a wrong key: it is
/// answered as no such call.
pub(crate) async fn hang_up(req: HttpRequest, path: web::Path<String>, gw: web::Data<Gateway>) -> HttpResponse {
    if let Err(refusal) = super::same_site(&req, &gw) {
        return refusal;
    }
    let presented = auth::bearer(&req);
    let key_id;
    let who = match presented.filter(|k| k.starts_with(client_secrets::PREFIX)) {
        Some(secret) => Hanger::Secret(secret),
        None => {
            key_id = match api_key(&req, &gw).await {
                Ok(id) => id,
                Err(refusal) => return refusal,
            };
            Hanger::Key(key_id.as_deref())
        }
    };
    let webrtc = gw.calls.as_ref().map_or(HangUp::NoSuchCall, |calls| calls.hang_up(&path, who));
    match (webrtc, who) {
        (HangUp::Done, _) => HttpResponse::Ok().json(serde_json::json!({})),
        // A SIP call the app accepted, by the key that accepted it.
        (HangUp::NoSuchCall, Hanger::Key(key)) if gw.sip_calls.hang_up(&path, key) => {
            HttpResponse::Ok().json(serde_json::json!({}))
        }
        // Another key's call is answered as no call at all: its existence is not told.
        _ => http_error(StatusCode::NOT_FOUND, "not_found", format!("no call '{}' of this key here", path.as_str())),
    }
}
