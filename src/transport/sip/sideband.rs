//! The app's WebSocket on a SIP call it accepted (`/v1/realtime?call_id=rtc_...`, as OpenAI's
//! SIP calls have it): what the call's session says (the OpenAI dialect's events, which the
//! phone line cannot carry) reaches it from the moment it connects, and what it sends
//! (`session.update`, conversation items, a function call's output, `response.create`...)
//! reaches the session as a client's events do. One per call; it ends with the call, and the
//! call goes on when it closes. Its socket has a WebSocket client's bounds: the outgoing limit
//! (`slow_consumer`), the message rate, the incoming backlog, and the heartbeat.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation};
use omni_actors::session::messages::{FromClient, SessionPort, ToClient};

use super::call::{Attach, Detach};
use crate::transport::incoming::Backlog;
use crate::transport::limits::{MessageRate, RateLimit};
use crate::transport::outgoing::OutgoingLimit;

/// What the socket may do, from `[server]`.
#[derive(Debug, Clone)]
pub struct SidebandSettings {
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    pub rate: Option<RateLimit>,
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
    last_heard: Instant,
}

impl Sideband {
    pub fn new(
        label: String,
        settings: SidebandSettings,
        (call, detach): (Recipient<Attach>, Recipient<Detach>),
        incoming: Arc<Backlog>,
        outgoing: Option<Arc<OutgoingLimit>>,
    ) -> Sideband {
        Sideband {
            label,
            rate: settings.rate.map(|limit| MessageRate::new(limit, Instant::now())),
            settings,
            call,
            detach,
            session: None,
            incoming,
            outgoing,
            last_heard: Instant::now(),
        }
    }

    fn close(&mut self, ctx: &mut ws::WebsocketContext<Self>, reason: CloseReason) {
        ctx.close(Some(ws::CloseReason { code: ws::CloseCode::from(reason.close_code()), description: None }));
        ctx.stop();
    }

    /// An event for the app, counted against the outgoing bound (an app that does not read is
    /// cut; the call goes on).
    fn send(&mut self, ctx: &mut ws::WebsocketContext<Self>, text: ByteString) {
        if let Some(limit) = &self.outgoing {
            let waiting = limit.meter.wrote(text.len());
            if waiting > limit.max_bytes {
                log::warn!("{}: the app does not read its call's socket ({waiting} bytes waiting); cut", self.label);
                metrics().slow_consumers.inc();
                limit.disconnect.disconnect();
                return self.close(ctx, CloseReason::SlowConsumer);
            }
        }
        metrics().bytes_sent.inc_by(text.len() as u64);
        ctx.text(text);
    }

    fn within_rate(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        MessageRate::passes(&mut self.rate, Instant::now()).unwrap_or_else(|| {
            log::warn!("{}: the app's socket over the message rate for too long; closed", self.label);
            self.close(ctx, CloseReason::ProtocolViolation(Violation::RateLimited));
            false
        })
    }
}

impl Actor for Sideband {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The call's edge takes this socket on, or has ended (or has one already).
        let attach = self.call.send(Attach(ctx.address().recipient()));
        ctx.wait(attach.into_actor(self).map(|taken, act, ctx| match taken {
            Ok(Some(session)) => {
                log::info!("{}: the app's socket is on the call", act.label);
                act.session = Some(session);
            }
            _ => {
                log::info!("{}: the app's socket came after the call ended, or beside another", act.label);
                act.close(ctx, CloseReason::Client("call_ended".into()));
            }
        }));
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            if act.incoming.waiting() > 0 {
                act.last_heard = Instant::now();
            }
            if Instant::now().saturating_duration_since(act.last_heard) > act.settings.heartbeat_timeout {
                log::info!("{}: nothing heard on the app's socket; closed", act.label);
                return act.close(ctx, CloseReason::HeartbeatTimeout);
            }
            ctx.ping(b"");
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.detach.do_send(Detach);
    }
}

impl Handler<ToClient> for Sideband {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        match msg {
            ToClient::Text(text) => self.send(ctx, text),
            // The voice is the phone line's.
            ToClient::Audio(_) => {}
            ToClient::Close(reason) => {
                log::info!("{}: the call ended ({}); its app socket closes", self.label, reason.as_str());
                self.close(ctx, reason);
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
                if self.within_rate(ctx)
                    && let Some(session) = &self.session
                {
                    self.incoming.hand(session, FromClient::Text(text));
                }
            }
            Ok(ws::Message::Ping(payload)) => ctx.pong(&payload),
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(_)) => self.close(ctx, CloseReason::ClientGone),
            Ok(ws::Message::Binary(_)) | Ok(ws::Message::Continuation(_)) => {
                self.close(ctx, CloseReason::ProtocolViolation(Violation::BinaryFrame))
            }
            Err(ws::ProtocolError::Overflow) => {
                self.close(ctx, CloseReason::ProtocolViolation(Violation::MessageTooBig))
            }
            Err(e) => {
                log::info!("{}: the app's socket: {e}", self.label);
                self.close(ctx, CloseReason::ClientGone);
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
