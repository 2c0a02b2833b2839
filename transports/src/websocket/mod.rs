//! The one WebSocket edge: an actor per connection (on `actix-web-actors`) between a socket and
//! a session, generic over what the socket carries ([`Carried`]): a dialect's text (the
//! realtime route: [`realtime`]), a telephony provider's media stream (`crate::twilio`), or the
//! app's events on a call it accepted (`crate::sip::sideband`). What every socket needs is here,
//! once: frames and their fragments (within the shared budget and the message timeout), pings and
//! the heartbeat, the message rate, the bound on what the peer has not read, the incoming
//! backlog (the connection is not read past it), close codes, and how the session hears the
//! socket ended. What the carried thing is, its messages in and out, is its own.
//!
//! The edge ends the connection itself when the peer breaks the WebSocket's rules (a binary
//! frame, a message too big, a fragmented message never finished, too fast for too long), stops
//! answering pings, or does not read; the session then hears why (as the carried thing says:
//! [`Carried::farewell`]). The session ends it for everything else ([`ToClient::Close`]). A
//! connection that breaks, or ends without a close frame, or whose peer stops answering pings, is
//! lost rather than ended: a session whose client may come back is held for a resume.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::edge::client::{FromClient, SessionPort, ToClient};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation, bounded};

use crate::incoming::Backlog;
use crate::limits::{Admit, Fragment, FragmentBudget, Fragments, MessageRate, RateLimit};
use crate::outgoing::OutgoingLimit;

pub mod line;
pub mod realtime;
#[cfg(test)]
mod tests;

pub use realtime::{Realtime, WebSocketEdge};

/// What a connection may do, from `[server]`.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Largest message, also across continuation frames.
    pub max_frame_bytes: usize,
    /// How often the server pings.
    pub heartbeat_interval: Duration,
    /// Silence from the peer (no frame, no pong) after which it is considered gone.
    pub heartbeat_timeout: Duration,
    /// A fragmented message must be finished this long after its first frame.
    pub message_timeout: Duration,
    /// Messages per second the peer may send; `None`: no limit.
    pub rate: Option<RateLimit>,
}

/// What a WebSocket carries between its peer and a session: the one part of an edge that
/// differs from one socket to the next.
pub trait Carried: Unpin + Sized + 'static {
    /// Whether the peer hears of its messages dropped over the rate (its session tells it,
    /// `rate_limited`); a peer that cannot (a phone line's) has them dropped without a word.
    const TELLS_RATE: bool;

    /// The socket is up: reach the session (start it, or attach to it).
    fn started(&mut self, edge: &mut Io<'_, Self>);

    /// A whole text message from the peer, within the rate (fragments joined).
    fn text(&mut self, text: ByteString, edge: &mut Io<'_, Self>);

    /// What the session says to the peer (what it did not put on a line of its own).
    fn told(&mut self, msg: ToClient, edge: &mut Io<'_, Self>);

    /// The close frame of an ending the edge decided.
    fn close_frame(reason: &CloseReason) -> ws::CloseReason {
        let description = bounded(reason.as_str(), 123).to_string();
        ws::CloseReason { code: ws::CloseCode::from(reason.close_code()), description: Some(description) }
    }

    /// What the session hears when the socket ended for `reason` (`lost`: it broke, ended
    /// without a close frame, or stopped answering pings), unless the session ended it: by
    /// default, lost (it may be held for a resume) or ended.
    fn farewell(&mut self, reason: CloseReason, lost: bool) -> Option<FromClient> {
        Some(if lost { FromClient::Lost(reason) } else { FromClient::Ended(reason) })
    }

    /// The socket has stopped, however it ended (after [`Carried::farewell`], when called).
    fn stopped(&mut self) {}
}

/// What every socket's edge keeps, whatever it carries.
pub struct Common {
    settings: EdgeSettings,
    /// Names the connection in logs (`c12`, `call rtc_...`).
    label: String,
    session: Option<SessionPort>,
    fragments: Fragments,
    rate: Option<MessageRate>,
    last_heard: Instant,
    /// What the session has been handed and not handled yet (the request body waits on it).
    incoming: Arc<Backlog>,
    /// The bound on what waits to be sent to a peer that does not read; `None`: unbounded.
    outgoing: Option<Arc<OutgoingLimit>>,
    /// Why the edge ended the connection (the session is told when the edge stops).
    ended: Option<CloseReason>,
    /// The connection was lost rather than closed (no close frame): the session may hold.
    lost: bool,
    /// The session asked for the close (or the carried thing closed it): nobody to tell.
    closed_by_session: bool,
}

/// What a socket is made of, whatever it carries.
pub struct SocketParts {
    pub label: String,
    pub settings: EdgeSettings,
    pub fragments: Arc<FragmentBudget>,
    pub incoming: Arc<Backlog>,
    pub outgoing: Option<Arc<OutgoingLimit>>,
}

/// One socket's edge; see the module's documentation.
pub struct SocketEdge<C: Carried> {
    common: Common,
    carried: C,
}

/// The edge as a carried thing reaches it: the session, the peer, the socket's end.
pub struct Io<'a, C: Carried> {
    common: &'a mut Common,
    ctx: &'a mut ws::WebsocketContext<SocketEdge<C>>,
}

impl<C: Carried> SocketEdge<C> {
    /// An edge of `parts` carrying `carried`.
    pub fn with(parts: SocketParts, carried: C) -> SocketEdge<C> {
        let now = Instant::now();
        let settings = parts.settings;
        let common = Common {
            fragments: Fragments::new(parts.fragments, settings.max_frame_bytes, settings.message_timeout),
            rate: settings.rate.map(|limit| MessageRate::new(limit, now)),
            settings,
            label: parts.label,
            session: None,
            last_heard: now,
            incoming: parts.incoming,
            outgoing: parts.outgoing,
            ended: None,
            lost: false,
            closed_by_session: false,
        };
        SocketEdge { common, carried }
    }

    /// The carried thing and the edge, apart.
    fn split<'a>(&'a mut self, ctx: &'a mut ws::WebsocketContext<Self>) -> (&'a mut C, Io<'a, C>) {
        (&mut self.carried, Io { common: &mut self.common, ctx })
    }

    /// The session this socket reaches, once it has one (a socket that attaches to a call's
    /// session gets it later than it starts).
    pub fn attached(&mut self, session: SessionPort) {
        self.common.session = Some(session);
    }

    /// Names the connection in logs.
    pub fn label(&self) -> &str {
        &self.common.label
    }

    /// Whether the session it had is gone.
    pub fn session_gone(&self) -> bool {
        self.common.session.as_ref().is_some_and(|s| !s.connected())
    }

    /// Closes the connection with `code` and `why`, the session told nothing (it goes on
    /// without this socket, or ended it).
    pub fn close_with(&mut self, ctx: &mut ws::WebsocketContext<Self>, code: ws::CloseCode, why: &str) {
        self.split(ctx).1.close(code, Some(why));
    }

    /// Pings the peer; ends the connection when it has been silent too long, or when a
    /// fragmented message stays unfinished past its deadline (pings do not extend it).
    fn heartbeat(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.common.settings.heartbeat_interval, |act, ctx| {
            let (_, mut io) = act.split(ctx);
            if io.common.session.as_ref().is_some_and(|s| !s.connected()) {
                // The session is gone without a close (it cannot be: a bug); so is the socket.
                io.common.closed_by_session = true;
                return io.ctx.stop();
            }
            let now = Instant::now();
            if io.common.incoming.waiting() > 0 {
                // The session is behind on this peer's messages, and the connection may be held
                // unread (`incoming`): its pongs and fragments wait there; it is not silent.
                io.common.last_heard = now;
                return io.ctx.ping(b"");
            }
            if now.saturating_duration_since(io.common.last_heard) > io.common.settings.heartbeat_timeout {
                log::info!(
                    "session {}: nothing heard for {:?}; the peer is gone",
                    io.common.label,
                    io.common.settings.heartbeat_timeout
                );
                return io.lose(CloseReason::HeartbeatTimeout);
            }
            if io.common.fragments.overdue(now) {
                log::info!(
                    "session {}: a fragmented message unfinished after {:?}; closing with 1008",
                    io.common.label,
                    io.common.settings.message_timeout
                );
                return io.violation(Violation::MessageTimeout);
            }
            io.ctx.ping(b"");
        });
    }

    /// A whole message counts against the rate; `false` when it is not to be processed.
    fn within_rate(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        let (_, mut io) = self.split(ctx);
        let Some(rate) = io.common.rate.as_mut() else { return true };
        match rate.admit(Instant::now()) {
            Admit::Process => true,
            Admit::Drop => false,
            Admit::Tell(error) => {
                if C::TELLS_RATE {
                    io.tell(FromClient::Refused(error));
                }
                false
            }
            Admit::End => {
                log::warn!("session {}: over the message rate for too long; closing with 1008", io.common.label);
                io.violation(Violation::RateLimited);
                false
            }
        }
    }

    fn on_text(&mut self, text: ByteString, ctx: &mut ws::WebsocketContext<Self>) {
        let (carried, mut io) = self.split(ctx);
        carried.text(text, &mut io);
    }

    fn on_fragment(&mut self, item: Item, ctx: &mut ws::WebsocketContext<Self>) {
        if matches!(item, Item::FirstText(_)) && !self.within_rate(ctx) {
            // The rest of it is refused too: nothing is started.
            return self.common.fragments.clear();
        }
        match self.common.fragments.take(item, Instant::now()) {
            Fragment::Pending => {}
            Fragment::Whole(text) => self.on_text(text, ctx),
            Fragment::Violation(v) => {
                match v {
                    Violation::MessageTooBig => log::info!(
                        "session {}: message over {} bytes; closing with 1009",
                        self.common.label,
                        self.common.settings.max_frame_bytes
                    ),
                    Violation::FragmentsFull => log::warn!(
                        "session {}: every connection's unfinished messages are at their bound \
                         (server.max_fragment_buffer_mb); closing with 1013",
                        self.common.label
                    ),
                    _ => {}
                }
                self.split(ctx).1.violation(v);
            }
        }
    }
}

impl<C: Carried> Io<'_, C> {
    /// Names the connection in logs.
    pub fn label(&self) -> &str {
        &self.common.label
    }

    /// The session, once there is one.
    pub fn session(&self) -> Option<&SessionPort> {
        self.common.session.as_ref()
    }

    /// The socket's session from now on.
    pub fn attached(&mut self, session: SessionPort) {
        self.common.session = Some(session);
    }

    /// Hands the session a message of the peer's, counted until it is handled (past
    /// `max_incoming_bytes` the connection is not read).
    pub fn hand(&self, msg: FromClient) {
        if let Some(s) = &self.common.session {
            self.common.incoming.hand(s, msg);
        }
    }

    /// Tells the session something of the socket's own, not counted.
    pub fn tell(&self, msg: FromClient) {
        if let Some(s) = &self.common.session {
            s.do_send(msg);
        }
    }

    /// A text frame for the peer, counted against what it has not read: a peer past the bound
    /// is cut (`slow_consumer`).
    pub fn send(&mut self, frame: String) {
        if let Some(limit) = &self.common.outgoing
            && let Err(waiting) = limit.wrote(frame.len())
        {
            return self.slow_consumer(waiting);
        }
        metrics().bytes_sent.inc_by(frame.len() as u64);
        self.ctx.text(frame);
    }

    /// A text frame for the peer, already counted against its bound (by whoever handed it on).
    pub fn send_counted(&mut self, frame: ByteString) {
        metrics().bytes_sent.inc_by(frame.len() as u64);
        self.ctx.text(frame);
    }

    /// The peer does not read: `waiting` bytes wait for it. The connection is dropped (a close
    /// frame would wait behind the backlog forever).
    pub fn slow_consumer(&mut self, waiting: u64) {
        log::warn!(
            "session {}: the peer does not read its output ({waiting} bytes waiting); dropping the connection",
            self.common.label
        );
        self.end(CloseReason::SlowConsumer);
        // Cut (and counted, `omni_slow_consumers_total`) where the bound is kept.
        if let Some(limit) = &self.common.outgoing {
            limit.cut();
        }
    }

    /// The edge ends the connection: its close frame goes to the peer, the reason to the
    /// session (when the edge stops).
    pub fn end(&mut self, reason: CloseReason) {
        if self.common.ended.is_some() || self.common.closed_by_session {
            return;
        }
        self.ctx.close(Some(C::close_frame(&reason)));
        self.common.ended = Some(reason);
        self.ctx.stop();
    }

    /// The connection is lost rather than closed: the session may be held for a resume.
    pub fn lose(&mut self, reason: CloseReason) {
        if self.common.ended.is_none() && !self.common.closed_by_session {
            self.common.lost = true;
            self.end(reason);
        }
    }

    /// The peer broke the protocol: the connection ends with the violation's code.
    pub fn violation(&mut self, v: Violation) {
        self.end(CloseReason::ProtocolViolation(v));
    }

    /// The connection closes with `code` (and `why`, when given), and the session hears
    /// nothing of it (it ended it, or it goes on without this socket).
    pub fn close(&mut self, code: ws::CloseCode, why: Option<&str>) {
        self.common.closed_by_session = true;
        self.ctx.close(Some(ws::CloseReason { code, description: why.map(String::from) }));
        self.ctx.stop();
    }

    /// The session ended: its close was written on the socket (by its line, or here), and the
    /// socket ends with it.
    pub fn session_closed(&mut self) {
        self.common.closed_by_session = true;
    }

    /// How often the peer is pinged (and a carried thing may look at what it waits on).
    pub fn heartbeat_interval(&self) -> Duration {
        self.common.settings.heartbeat_interval
    }

    /// The socket's actor context, for a carried thing that waits on something of its own.
    pub fn ctx(&mut self) -> &mut ws::WebsocketContext<SocketEdge<C>> {
        self.ctx
    }
}

impl<C: Carried> Actor for SocketEdge<C> {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let (carried, mut io) = self.split(ctx);
        carried.started(&mut io);
        self.heartbeat(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.common.fragments.clear();
        self.told_the_end();
        self.carried.stopped();
    }
}

impl<C: Carried> SocketEdge<C> {
    /// The session hears how the socket ended, unless it ended it.
    fn told_the_end(&mut self) {
        if self.common.closed_by_session {
            return;
        }
        // No reason: the connection went away under the edge (a write to it failed): lost.
        let (reason, lost) = match self.common.ended.take() {
            Some(reason) => (reason, self.common.lost),
            None => (CloseReason::ClientGone, true),
        };
        if let Some(msg) = self.carried.farewell(reason, lost)
            && let Some(s) = &self.common.session
        {
            s.do_send(msg);
        }
    }
}

impl<C: Carried> Handler<ToClient> for SocketEdge<C> {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        let (carried, mut io) = self.split(ctx);
        carried.told(msg, &mut io);
    }
}

impl<C: Carried> Handler<line::SlowConsumer> for SocketEdge<C> {
    type Result = ();

    fn handle(&mut self, msg: line::SlowConsumer, ctx: &mut Self::Context) {
        if self.common.ended.is_none() && !self.common.closed_by_session {
            self.split(ctx).1.slow_consumer(msg.0);
        }
    }
}

impl<C: Carried> StreamHandler<Result<ws::Message, ws::ProtocolError>> for SocketEdge<C> {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        if self.common.ended.is_some() || self.common.closed_by_session {
            return;
        }
        self.common.last_heard = Instant::now();
        match msg {
            Ok(ws::Message::Text(text)) => {
                metrics().bytes_received.inc_by(text.len() as u64);
                if self.within_rate(ctx) {
                    self.on_text(text, ctx);
                }
            }
            Ok(ws::Message::Binary(data)) => {
                metrics().bytes_received.inc_by(data.len() as u64);
                log::info!("session {}: binary frame; closing with 1003", self.common.label);
                self.split(ctx).1.violation(Violation::BinaryFrame);
            }
            Ok(ws::Message::Continuation(item)) => self.on_fragment(item, ctx),
            Ok(ws::Message::Ping(payload)) => {
                if self.within_rate(ctx) {
                    ctx.pong(&payload);
                }
            }
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(reason)) => {
                log::debug!("session {}: the peer sent close {:?}", self.common.label, reason);
                self.common.ended = Some(CloseReason::ClientGone);
                ctx.close(reason);
                ctx.stop();
            }
            Err(ws::ProtocolError::Overflow) => {
                log::info!(
                    "session {}: frame over {} bytes; closing with 1009",
                    self.common.label,
                    self.common.settings.max_frame_bytes
                );
                self.split(ctx).1.violation(Violation::MessageTooBig);
            }
            Err(ws::ProtocolError::Io(e)) => {
                // The connection broke (reset, or closed mid-frame): the peer is gone.
                log::info!("session {}: connection lost: {e}", self.common.label);
                self.common.ended = Some(CloseReason::ClientGone);
                self.common.lost = true;
                ctx.stop();
            }
            Err(e) => {
                log::info!("session {}: WebSocket protocol error: {e}", self.common.label);
                self.split(ctx).1.violation(Violation::ProtocolError);
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        if self.common.ended.is_none() && !self.common.closed_by_session {
            // The stream ended without a close frame: the connection was lost.
            log::info!("session {}: the connection ended without a close frame", self.common.label);
            self.common.ended = Some(CloseReason::ClientGone);
            self.common.lost = true;
        }
        ctx.stop();
    }
}
