//! The app's WebSocket on a SIP call it accepted (`/v1/realtime?call_id=rtc_...`, as OpenAI's
//! SIP calls have it), carried by the one WebSocket edge (`crate::websocket`): what the call's
//! session says (its dialect's events, which the phone line cannot carry) reaches it from the
//! moment it connects, and what it sends (its settings, conversation items, a function call's
//! output, asking for an answer...) reaches the session as a client's events do. One per call; it
//! ends with the call, and the call goes on when it closes.
//!
//! Its socket has a WebSocket client's bounds: what it has not read is counted by the call's
//! edge as it hands it on (past `max_outgoing_bytes` the socket is cut: this actor does not run
//! while its client does not read, so the bound cannot wait for it), the message rate (over it,
//! the session tells the app `rate_limited`), fragmented messages within the shared budget and
//! the message timeout, the incoming backlog, and the heartbeat. It is closed with a reason:
//! 1000 "call ended", or 1008 "call has an app socket" beside another one.

use std::sync::Arc;

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::edge::client::{FromClient, ToClient};
use omni_actors::protocol::CloseReason;
use omni_actors::session::Admission;

use super::call::{Attach, Attached, Detach};
use crate::incoming::Backlog;
use crate::limits::FragmentBudget;
use crate::outgoing::OutgoingLimit;
use crate::websocket::{Carried, EdgeSettings, Io, SocketEdge, SocketParts};

/// One call's app socket, as its edge carries it; see the module's documentation.
pub struct AppSocket {
    /// The call's edge, which hands this socket the session's events.
    call: Recipient<Attach>,
    detach: Recipient<Detach>,
    /// The socket's own address, once it runs (the call lets go of this one only).
    me: Option<Recipient<ToClient>>,
    /// The bound on what the app has not read, which the call counts as it hands events on.
    outgoing: Option<Arc<OutgoingLimit>>,
    /// Counts the socket as a connection of its address while it is open.
    _admission: Admission,
}

/// A call's app socket's edge.
pub type Sideband = SocketEdge<AppSocket>;

/// What a socket is made of.
pub struct SidebandParts {
    pub label: String,
    pub settings: EdgeSettings,
    pub door: super::offers::Door,
    pub incoming: Arc<Backlog>,
    pub outgoing: Option<Arc<OutgoingLimit>>,
    pub fragments: Arc<FragmentBudget>,
    pub admission: Admission,
}

impl SocketEdge<AppSocket> {
    pub fn new(parts: SidebandParts) -> Sideband {
        let SidebandParts { label, settings, door, incoming, outgoing, fragments, admission } = parts;
        let socket =
            AppSocket { call: door.0, detach: door.1, me: None, outgoing: outgoing.clone(), _admission: admission };
        SocketEdge::with(SocketParts { label, settings, fragments, incoming, outgoing }, socket)
    }
}

impl Carried for AppSocket {
    const TELLS_RATE: bool = true;

    fn started(&mut self, edge: &mut Io<'_, Self>) {
        // The call's edge takes this socket on, or has ended, or has one already.
        let me = edge.ctx().address().recipient();
        self.me = Some(me.clone());
        let attach = self.call.send(Attach { app: me, outgoing: self.outgoing.clone() });
        edge.ctx().wait(actix::fut::wrap_future::<_, Sideband>(attach).map(|taken, act, ctx| match taken {
            Ok(Attached::On(session)) => {
                log::info!("{}: the app's socket is on the call", act.label());
                act.attached(session);
            }
            Ok(Attached::Taken) => {
                log::info!("{}: a second app socket on the call; closed", act.label());
                act.close_with(ctx, ws::CloseCode::Policy, "call has an app socket");
            }
            Ok(Attached::Ended) | Err(_) => act.close_with(ctx, ws::CloseCode::Normal, "call ended"),
        }));
        let call = self.call.clone();
        let every = edge.heartbeat_interval();
        edge.ctx().run_interval(every, move |act, ctx| {
            // The call (or its session) is gone: so is this socket, whatever it was told.
            if !call.connected() || act.session_gone() {
                act.close_with(ctx, ws::CloseCode::Normal, "call ended");
            }
        });
    }

    fn text(&mut self, text: ByteString, edge: &mut Io<'_, Self>) {
        edge.hand(FromClient::Text(text));
    }

    fn told(&mut self, msg: ToClient, edge: &mut Io<'_, Self>) {
        match msg {
            // Counted against the outgoing bound by the call's edge, as it handed it on.
            ToClient::Text(text) => edge.send_counted(text),
            // The voice is the phone line's, what became of the session the call's.
            ToClient::Audio(_) | ToClient::Notice(_) => {}
            ToClient::Close(reason) => {
                log::info!("{}: the call ended ({}); its app socket closes", edge.label(), reason.as_str());
                edge.close(ws::CloseCode::Normal, Some("call ended"));
            }
        }
    }

    /// The call goes on without its app's socket: the session hears nothing.
    fn farewell(&mut self, _reason: CloseReason, _lost: bool) -> Option<FromClient> {
        None
    }

    /// The call lets go of this socket, however it ended.
    fn stopped(&mut self) {
        if let Some(me) = self.me.take() {
            self.detach.do_send(Detach(me));
        }
    }
}
