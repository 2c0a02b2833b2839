//! The app's WebSocket on a SIP call it accepted (`/v1/realtime?call_id=rtc_...`, as OpenAI's
//! SIP calls have it): what the call's session says (the OpenAI dialect's events, which the
//! phone line cannot carry) reaches it from the moment it connects, and what it sends
//! (its settings, conversation items, a function call's output, asking for an answer...)
//! reaches the session as a client's events do. One per call; it ends with the call, and the
//! call goes on when it closes.
//!
//! Its socket has a WebSocket client's bounds: what it has not read is counted by the call's
//! edge as it hands it on (past `max_outgoing_bytes` the socket is cut: this actor does not run
//! while its client does not read, so the bound cannot wait for it), the message rate (over it,
//! the session tells the app `rate_limited`), fragmented messages within the shared budget and
//! the message timeout, the incoming backlog, and the heartbeat. It is closed with a reason:
//! 1000 "call ended", or 1008 "call has an app socket" beside another one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::edge::client::{FromClient, SessionPort, ToClient};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation};

use super::call::{Attach, Attached, Detach};
use crate::incoming::Backlog;
use crate::limits::{Admit, Fragment, FragmentBudget, Fragments, MessageRate, RateLimit};
use crate::outgoing::OutgoingLimit;
use omni_actors::session::Admission;

/// What the socket may do, from `[server]`.
#[derive(Debug, Clone)]
pub struct SidebandSettings {
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    pub rate: Option<RateLimit>,
    pub max_frame_bytes: usize,
    pub message_timeout: Duration,
}

/// One call's app socket; see the module's documentation.
pub struct Sideband {
    label: String,
    settings: SidebandSettings,
    /// The call's edge, which hands this socket the session's events.
    call: Recipient<Attach>,
    detach: Recipient<Detach>,
    session: Option<SessionPort>,
    incoming: Arc<Backlog>,
    outgoing: Option<Arc<OutgoingLimit>>,
    rate: Option<MessageRate>,
    fragments: Fragments,
    last_heard: Instant,
    /// Counts the socket as a connection of its address while it is open.
    _admission: Admission,
}

/// What a socket is made of.
pub struct SidebandParts {
    pub label: String,
    pub settings: SidebandSettings,
    pub door: super::offers::Door,
    pub incoming: Arc<Backlog>,
    pub outgoing: Option<Arc<OutgoingLimit>>,
    pub fragments: Arc<FragmentBudget>,
    pub admission: Admission,
}

impl Sideband {
    pub fn new(parts: SidebandParts) -> Sideband {
        let settings = parts.settings;
        Sideband {
            label: parts.label,
            rate: settings.rate.map(|limit| MessageRate::new(limit, Instant::now())),
            fragments: Fragments::new(parts.fragments, settings.max_frame_bytes, settings.message_timeout),
            settings,
            call: parts.door.0,
            detach: parts.door.1,
            session: None,
            incoming: parts.incoming,
            outgoing: parts.outgoing,
            last_heard: Instant::now(),
            _admission: parts.admission,
        }
    }

    fn close(&mut self, ctx: &mut ws::WebsocketContext<Self>, code: ws::CloseCode, why: &str) {
        ctx.close(Some(ws::CloseReason { code, description: Some(why.to_string()) }));
        ctx.stop();
    }

    fn violation(&mut self, ctx: &mut ws::WebsocketContext<Self>, v: Violation) {
        let code = CloseReason::ProtocolViolation(v).close_code();
        self.close(ctx, ws::CloseCode::from(code), v.as_str());
    }

    /// Whether a message is taken under the rate; over it, the app hears why from the session,
    /// and a socket over it for too long is closed.
    fn within_rate(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        let Some(rate) = self.rate.as_mut() else { return true };
        match rate.admit(Instant::now()) {
            Admit::Process => true,
            Admit::Drop => false,
            Admit::Tell(error) => {
                if let Some(session) = &self.session {
                    session.do_send(FromClient::Refused(error));
                }
                false
            }
            Admit::End => {
                log::warn!("{}: the app's socket over the message rate for too long; closed", self.label);
                self.violation(ctx, Violation::RateLimited);
                false
            }
        }
    }

    fn hand(&mut self, text: ByteString) {
        if let Some(session) = &self.session {
            self.incoming.hand(session, FromClient::Text(text));
        }
    }

    fn on_fragment(&mut self, item: Item, ctx: &mut ws::WebsocketContext<Self>) {
        if matches!(item, Item::FirstText(_)) && !self.within_rate(ctx) {
            return self.fragments.clear();
        }
        match self.fragments.take(item, Instant::now()) {
            Fragment::Pending => {}
            Fragment::Whole(text) => self.hand(text),
            Fragment::Violation(v) => self.violation(ctx, v),
        }
    }
}

impl Actor for Sideband {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The call's edge takes this socket on, or has ended, or has one already.
        let attach = self.call.send(Attach { app: ctx.address().recipient(), outgoing: self.outgoing.clone() });
        ctx.wait(attach.into_actor(self).map(|taken, act, ctx| match taken {
            Ok(Attached::On(session)) => {
                log::info!("{}: the app's socket is on the call", act.label);
                act.session = Some(session);
            }
            Ok(Attached::Taken) => {
                log::info!("{}: a second app socket on the call; closed", act.label);
                act.close(ctx, ws::CloseCode::Policy, "call has an app socket");
            }
            Ok(Attached::Ended) | Err(_) => act.close(ctx, ws::CloseCode::Normal, "call ended"),
        }));
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            // The call (or its session) is gone: so is this socket, whatever it was told.
            if !act.call.connected() || act.session.as_ref().is_some_and(|s| !s.connected()) {
                return act.close(ctx, ws::CloseCode::Normal, "call ended");
            }
            if act.incoming.waiting() > 0 {
                act.last_heard = Instant::now();
            }
            let now = Instant::now();
            if act.fragments.overdue(now) {
                return act.violation(ctx, Violation::MessageTimeout);
            }
            if now.saturating_duration_since(act.last_heard) > act.settings.heartbeat_timeout {
                log::info!("{}: nothing heard on the app's socket; closed", act.label);
                let code = ws::CloseCode::from(CloseReason::HeartbeatTimeout.close_code());
                return act.close(ctx, code, CloseReason::HeartbeatTimeout.as_str());
            }
            ctx.ping(b"");
        });
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.detach.do_send(Detach(ctx.address().recipient()));
    }
}

impl Handler<ToClient> for Sideband {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        match msg {
            // Counted against the outgoing bound by the call's edge, as it handed it on.
            ToClient::Text(text) => {
                metrics().bytes_sent.inc_by(text.len() as u64);
                ctx.text(text);
            }
            // The voice is the phone line's, what became of the session the call's.
            ToClient::Audio(_) | ToClient::Notice(_) => {}
            ToClient::Close(reason) => {
                log::info!("{}: the call ended ({}); its app socket closes", self.label, reason.as_str());
                self.close(ctx, ws::CloseCode::Normal, "call ended");
            }
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Sideband {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
        match msg {
            Ok(ws::Message::Text(text)) => {
                metrics().bytes_received.inc_by(text.len() as u64);
                if self.within_rate(ctx) {
                    self.hand(text);
                }
            }
            Ok(ws::Message::Continuation(item)) => self.on_fragment(item, ctx),
            Ok(ws::Message::Ping(payload)) => {
                if self.within_rate(ctx) {
                    ctx.pong(&payload);
                }
            }
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(_)) => ctx.stop(),
            Ok(ws::Message::Binary(_)) => self.violation(ctx, Violation::BinaryFrame),
            Err(ws::ProtocolError::Overflow) => self.violation(ctx, Violation::MessageTooBig),
            Err(e) => {
                log::info!("{}: the app's socket: {e}", self.label);
                ctx.stop();
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
