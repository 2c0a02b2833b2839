//! Telephone calls a provider streams over a WebSocket: `/v1/telephony/twilio` (Twilio Media
//! Streams: the WebSocket a Twilio number's TwiML points its `<Connect><Stream>` at) and
//! `/v1/telephony/telnyx` (Telnyx Media Streaming), each also as `/v1/telephony/PROVIDER/MODEL`
//! (Twilio's stream URL takes no query string). The provider (with the API key as `?key=` (or
//! `?api_key=`, as on `/v1/realtime`) or a `Bearer` header, and the model as `?model=`) passes the
//! same checks as any client (`crate::admission`) before its stream's edge starts its session.
//! With `[twilio] auth_token_file`, a Twilio stream must carry Twilio's signature of its URL, and
//! then needs no key; with `[telnyx] auth_token_file`, a Telnyx stream that presents the call's
//! `stream_auth_token` needs none.

use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;
use omni_actors::edge::client::FromClient;
use subtle::ConstantTimeEq;

use super::realtime::socket::Bounds;
use super::realtime::{caller, query_of, refused, secret_used};
use crate::admission::{Endpoint, Refusal, Transport, admit, authenticate};
use crate::auth::Credential;
use crate::auth::{self, client_secrets};
use crate::http::Gateway;
use omni_dialects::openai::Flavor;
use omni_transports::outgoing::Metered;
use omni_transports::telnyx::TelnyxEdge;
use omni_transports::twilio::{TwilioEdge, signature};

/// Who streams the call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Provider {
    Twilio,
    Telnyx,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::Twilio => "twilio",
            Provider::Telnyx => "telnyx",
        }
    }
}

pub(super) async fn twilio(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
    stream(req, payload, gw, Provider::Twilio).await
}

pub(super) async fn telnyx(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
    stream(req, payload, gw, Provider::Telnyx).await
}

/// Whether the provider proved the stream is its own (then it needs no API key), or the refusal
/// of a stream that should have and did not.
fn proven(req: &HttpRequest, gw: &Gateway, provider: Provider) -> Result<bool, Refusal> {
    match provider {
        Provider::Twilio => {
            let Some(token) = &gw.config.twilio.auth_token else { return Ok(false) };
            let url = stream_url(req, gw);
            let given = req.headers().get("x-twilio-signature").and_then(|v| v.to_str().ok());
            if given.is_some_and(|s| signature::valid(token, &url, s)) {
                return Ok(true);
            }
            Err(Refusal::new(
                "bad_signature",
                403,
                "forbidden",
                "X-Twilio-Signature is missing or does not match this URL ([twilio] auth_token_file, public_url)",
            ))
        }
        Provider::Telnyx => {
            let Some(token) = &gw.config.telnyx.auth_token else { return Ok(false) };
            match req.headers().get("x-telnyx-streaming-auth-token") {
                // No token: an API key may still let it in.
                None => Ok(false),
                Some(given) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => Ok(true),
                Some(_) => Err(Refusal::new(
                    "bad_signature",
                    403,
                    "forbidden",
                    "x-telnyx-streaming-auth-token does not match [telnyx] auth_token_file",
                )),
            }
        }
    }
}

async fn stream(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
    provider: Provider,
) -> actix_web::Result<HttpResponse> {
    let query = match query_of(&req) {
        Ok(q) => q,
        Err(refusal) => return Ok(refusal),
    };
    let caller = caller(&req, &gw);
    let signed = match proven(&req, &gw, provider) {
        Ok(signed) => signed,
        Err(refusal) => {
            // The URL is not logged: it may hold a key.
            log::info!("a {} stream from {:?} refused: {}", provider.name(), caller.ip, refusal.message);
            return Ok(refused(refusal));
        }
    };
    let presented = [auth::bearer(&req), query.get("key").or(query.get("api_key")).map(String::as_str), None];
    let key = if signed && presented.iter().all(Option::is_none) {
        Credential { key_id: None, session: None, untaken_secret: None }
    } else {
        match authenticate(&caller, &gw, presented, false).await {
            Ok(key) => key,
            Err(refusal) => return Ok(refused(refusal)),
        }
    };
    // The model: the path's (`/v1/telephony/PROVIDER/MODEL`, for a provider whose stream URL
    // takes no query string), `?model=`, or the first of `[[models]]`.
    let model = req
        .match_info()
        .get("model")
        .map(String::from)
        .or_else(|| query.get("model").cloned())
        .or_else(|| gw.config.models.first().map(|m| m.name.clone()))
        .unwrap_or_default();
    let secret = key.untaken_secret.clone();
    let transport = Transport { name: provider.name(), carries_audio: true };
    let admitted = match admit(&caller, &gw, Endpoint::Realtime(Flavor::Ga, model), key, transport) {
        Ok(a) => a,
        Err(refusal) => return Ok(refused(refusal)),
    };
    let response = ws::handshake(&req)?;
    if let Some(secret) = &secret
        && !gw.keys.take_secret(secret)
    {
        return Ok(secret_used());
    }
    let config = &gw.config;
    let settings = config.edge_settings();
    let Bounds { meter, outgoing, incoming } = Bounds::of(&req, &gw);
    let conn = admitted.conn;
    // A client secret's settings reach the session first (the call's parameters after them).
    let first = admitted.session.as_ref().map(|s| FromClient::Text(client_secrets::session_update(s).into()));
    let start = admitted.opening(first).starter(&gw);
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    let body = Bounds::body(payload, incoming.clone());
    let fragments = gw.fragments.clone();
    let mut response = response;
    Ok(match provider {
        Provider::Twilio => {
            let edge = TwilioEdge::new(settings, conn, fragments, incoming, outgoing, start);
            response.streaming(Metered::new(ws::WebsocketContext::with_codec(edge, body, codec), meter))
        }
        Provider::Telnyx => {
            let edge = TelnyxEdge::new(settings, conn, fragments, incoming, outgoing, start);
            response.streaming(Metered::new(ws::WebsocketContext::with_codec(edge, body, codec), meter))
        }
    })
}

/// The URL Twilio connected to, as it signed it: `[twilio] public_url` (or this request's scheme
/// and Host) and the path and query.
fn stream_url(req: &HttpRequest, gw: &Gateway) -> String {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    match &gw.config.twilio.public_url {
        Some(base) => format!("{base}{path}"),
        None => {
            let scheme = if gw.config.tls.is_some() { "wss" } else { "ws" };
            let host = req.headers().get(actix_web::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            format!("{scheme}://{host}{path}")
        }
    }
}
