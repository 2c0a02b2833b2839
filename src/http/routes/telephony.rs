//! Telephone calls: `/v1/telephony/twilio`, the WebSocket a Twilio number's TwiML points its
//! `<Connect><Stream>` at. The caller (Twilio, with the API key as `?key=` (or `?api_key=`, as
//! on `/v1/realtime`) or a `Bearer` header, and the model as `?model=`) passes the same checks as any client
//! (`crate::transport::admission`) before its stream's edge starts its session.

use actix_web::{HttpRequest, HttpResponse, web};
use actix_web_actors::ws;

use super::realtime::websocket::Bounds;
use super::realtime::{caller, query_of, refused, secret_used};
use crate::dialect::openai::Flavor;
use crate::http::{Gateway, auth, client_secrets};
use crate::transport::admission::{Endpoint, Transport, admit, authenticate};
use crate::transport::outgoing::Metered;
use crate::transport::twilio::{TwilioEdge, TwilioSettings};

pub(super) async fn twilio(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> actix_web::Result<HttpResponse> {
    let query = match query_of(&req) {
        Ok(q) => q,
        Err(refusal) => return Ok(refusal),
    };
    let caller = caller(&req, &gw);
    let presented = [auth::bearer(&req), query.get("key").or(query.get("api_key")).map(String::as_str), None];
    let key = match authenticate(&caller, &gw, presented, false).await {
        Ok(key) => key,
        Err(refusal) => return Ok(refused(refusal)),
    };
    let model =
        query.get("model").cloned().or_else(|| gw.config.models.first().map(|m| m.name.clone())).unwrap_or_default();
    let secret = key.untaken_secret.clone();
    let transport = Transport { name: "twilio", carries_audio: true };
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
    let settings = TwilioSettings {
        heartbeat_interval: config.server.heartbeat_interval(),
        heartbeat_timeout: config.server.heartbeat_timeout(),
        rate: config.message_rate(),
    };
    let Bounds { meter, outgoing, incoming } = Bounds::of(&req, &gw);
    let conn = admitted.conn;
    // A client secret's settings reach the session first (the call's parameters after them).
    let first = admitted.session.as_ref().map(client_secrets::session_update);
    let edge = TwilioEdge::new(settings, conn, incoming.clone(), outgoing, admitted.starter(&gw)).with_first(first);
    let codec = actix_http::ws::Codec::new().max_size(config.server.max_frame_bytes);
    let payload = Bounds::body(payload, incoming);
    let mut response = response;
    Ok(response.streaming(Metered::new(ws::WebsocketContext::with_codec(edge, payload, codec), meter)))
}
