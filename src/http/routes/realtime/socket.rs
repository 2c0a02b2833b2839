//! What every WebSocket route shares, whatever edge its connection becomes (a realtime
//! session, a Twilio stream, the app's socket on a SIP call): the handshake (with the
//! subprotocols a browser offers) and the connection's bounds.

use std::sync::Arc;

use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web::{self, Bytes};
use actix_web_actors::ws;
use futures_util::StreamExt;

use crate::http::Gateway;
use omni_transports::incoming::{Backlog, Gated};
use omni_transports::outgoing::{OutgoingLimit, OutgoingMeter};
use omni_transports::socket::ConnSocket;

/// The subprotocols a browser client offered.
pub(super) fn subprotocols(req: &HttpRequest) -> Vec<&str> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// The WebSocket handshake's answer; browsers offer `realtime` (with their key as a
/// subprotocol), which the server selects.
pub(in crate::http::routes) fn handshake(req: &HttpRequest) -> actix_web::Result<actix_web::HttpResponseBuilder> {
    if subprotocols(req).is_empty() {
        Ok(ws::handshake(req)?)
    } else {
        Ok(ws::handshake_with_protocols(req, &["realtime", "openai-beta.realtime-v1"])?)
    }
}

/// A WebSocket connection's bounds, whatever edge it becomes: what its session has handed and
/// not handled (the body is read only while there is room), and what its client has not read
/// (past `max_outgoing_bytes` the connection is cut).
pub(in crate::http::routes) struct Bounds {
    pub meter: Arc<OutgoingMeter>,
    /// `None`: no handle on the socket, and the outgoing buffer is unbounded (said in the log).
    pub outgoing: Option<Arc<OutgoingLimit>>,
    pub incoming: Arc<Backlog>,
}

impl Bounds {
    pub(in crate::http::routes) fn of(req: &HttpRequest, gw: &Gateway) -> Bounds {
        let config = &gw.config;
        let meter = Arc::new(OutgoingMeter::default());
        let socket = req.conn_data::<ConnSocket>();
        if socket.is_none() {
            log::warn!("no handle on this connection's socket: its outgoing buffer is unbounded");
        }
        let outgoing = socket.map(|socket| {
            Arc::new(OutgoingLimit {
                meter: meter.clone(),
                max_bytes: config.server.max_outgoing_bytes,
                disconnect: Box::new(socket.cutter()),
            })
        });
        let incoming = Backlog::new(config.server.max_incoming_bytes as usize, gw.incoming.clone());
        Bounds { meter, outgoing, incoming }
    }

    /// The request body, read only while the session keeps up with it. A body that breaks
    /// ends there (a client that sent its close frame and shut the connection at once is read
    /// to its close frame, not told apart from a lost one by which came first).
    pub(in crate::http::routes) fn body(
        payload: web::Payload,
        incoming: Arc<Backlog>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, actix_web::error::PayloadError>> + 'static {
        Gated::new(payload.take_while(|chunk| std::future::ready(chunk.is_ok())), incoming)
    }
}
