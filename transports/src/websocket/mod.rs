//! The WebSocket edge: one actor per connection (on `actix-web-actors`) between the socket and
//! its session (`omni_actors::session::SessionActor`). It owns what is the socket's: frames and
//! their fragments, pings and the heartbeat, the message rate, the outgoing bound, and close
//! codes. It hands the session whole text messages ([`FromClient`]); what the session says
//! ([`ToClient`]) goes straight into the connection's outgoing stream on the session's line
//! ([`line`]), the edge hearing only the session's close and a client that does not read.
//!
//! The edge ends the connection itself when the client breaks the WebSocket's rules (a binary
//! frame, a message too big, a fragmented message never finished, too fast for too long), stops
//! answering pings, or does not read; the session then hears why ([`FromClient::Ended`]) and
//! ends untold. The session ends it for everything else ([`ToClient::Close`]). A connection
//! that breaks, or ends without a close frame, or whose client stops answering pings, is
//! lost rather than ended ([`FromClient::Lost`]): its session may be held for a resume.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::edge::client::{FromClient, ToClient};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation, bounded};

use super::incoming::Backlog;
use super::limits::{Admit, Fragment, FragmentBudget, Fragments, MessageRate, RateLimit};
use super::outgoing::OutgoingLimit;
use super::{SessionPort, StartSession};
use line::{LineEnd, SlowConsumer};

/// What a connection may do, from `[server]`.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Largest message, also across continuation frames.
    pub max_frame_bytes: usize,
    /// How often the server pings.
    pub heartbeat_interval: Duration,
    /// Silence from the client (no frame, no pong) after which it is considered gone.
    pub heartbeat_timeout: Duration,
    /// A fragmented message must be finished this long after its first frame.
    pub message_timeout: Duration,
    /// Messages per second the client may send; `None`: no limit.
    pub rate: Option<RateLimit>,
}

pub mod line;

pub struct WebSocketEdge {
    settings: EdgeSettings,
    /// The session's line to the connection, until it is handed to the session.
    line: Option<LineEnd>,
    /// Names the connection in logs (`c12`).
    label: String,
    start: Option<StartSession>,
    session: Option<SessionPort>,
    fragments: Fragments,
    rate: Option<MessageRate>,
    last_heard: Instant,
    /// The bound on what waits to be sent to a client that does not read; `None`: unbounded.
    outgoing: Option<Arc<OutgoingLimit>>,
    /// What the session has been handed and not handled yet (the request body waits on it).
    incoming: Arc<Backlog>,
    /// Why the edge ended the connection (the session is told when the edge stops).
    ended: Option<CloseReason>,
    /// The connection was lost rather than closed (no close frame): the session may hold.
    lost: bool,
    /// The session asked for the close: it needs no telling.
    closed_by_session: bool,
}

impl WebSocketEdge {
    pub fn new(
        settings: EdgeSettings,
        conn: u64,
        fragments: std::sync::Arc<FragmentBudget>,
        outgoing: Option<Arc<OutgoingLimit>>,
        incoming: Arc<Backlog>,
        said: tokio::sync::mpsc::UnboundedSender<line::Said>,
        start: StartSession,
    ) -> WebSocketEdge {
        let now = Instant::now();
        let line = LineEnd { said, outgoing: outgoing.clone(), max_frame_bytes: settings.max_frame_bytes };
        WebSocketEdge {
            line: Some(line),
            fragments: Fragments::new(fragments, settings.max_frame_bytes, settings.message_timeout),
            rate: settings.rate.map(|limit| MessageRate::new(limit, now)),
            settings,
            label: format!("c{conn}"),
            start: Some(start),
            session: None,
            last_heard: now,
            outgoing,
            incoming,
            ended: None,
            lost: false,
            closed_by_session: false,
        }
    }

    fn tell(&self, msg: FromClient) {
        if let Some(s) = &self.session {
            s.do_send(msg);
        }
    }

    fn hand(&self, text: ByteString) {
        if let Some(s) = &self.session {
            self.incoming.hand(s, FromClient::Text(text));
        }
    }

    /// The edge ends the connection: its close code goes to the client, the reason to the
    /// session (when the edge stops).
    fn end(&mut self, ctx: &mut ws::WebsocketContext<Self>, reason: CloseReason) {
        if self.ended.is_some() || self.closed_by_session {
            return;
        }
        let description = bounded(reason.as_str(), 123).to_string();
        ctx.close(Some(ws::CloseReason {
            code: ws::CloseCode::from(reason.close_code()),
            description: Some(description),
        }));
        self.ended = Some(reason);
        ctx.stop();
    }

    /// The connection is lost rather than closed (it broke, or the client stopped answering
    /// pings): the session hears [`FromClient::Lost`] and may hold for a resume.
    fn lose(&mut self, ctx: &mut ws::WebsocketContext<Self>, reason: CloseReason) {
        if self.ended.is_none() && !self.closed_by_session {
            self.lost = true;
            self.end(ctx, reason);
        }
    }

    fn violation(&mut self, ctx: &mut ws::WebsocketContext<Self>, v: Violation) {
        self.end(ctx, CloseReason::ProtocolViolation(v));
    }

    /// Pings the client; ends the connection when it has been silent too long, or when a
    /// fragmented message stays unfinished past its deadline (pings do not extend it).
    fn heartbeat(&self, ctx: &mut ws::WebsocketContext<Self>) {
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            if act.session.as_ref().is_some_and(|s| !s.connected()) {
                // The session is gone without a close (it cannot be: a bug); so is the connection.
                return ctx.stop();
            }
            let now = Instant::now();
            if act.incoming.waiting() > 0 {
                // The session is behind on this client's messages, and the connection may be
                // held unread (`incoming`): its pongs and fragments wait there; it is not silent.
                act.last_heard = now;
                return ctx.ping(b"");
            }
            if now.saturating_duration_since(act.last_heard) > act.settings.heartbeat_timeout {
                log::info!(
                    "session {}: nothing heard for {:?}; the client is gone",
                    act.label,
                    act.settings.heartbeat_timeout
                );
                return act.lose(ctx, CloseReason::HeartbeatTimeout);
            }
            if act.fragments.overdue(now) {
                log::info!(
                    "session {}: a fragmented message unfinished after {:?}; closing with 1008",
                    act.label,
                    act.settings.message_timeout
                );
                return act.violation(ctx, Violation::MessageTimeout);
            }
            ctx.ping(b"");
        });
    }

    /// A complete message counts against the rate; `false` when it is not to be processed.
    fn within_rate(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        let Some(rate) = self.rate.as_mut() else { return true };
        match rate.admit(Instant::now()) {
            Admit::Process => true,
            Admit::Drop => false,
            Admit::Tell(error) => {
                self.tell(FromClient::Refused(error));
                false
            }
            Admit::End => {
                log::warn!("session {}: over the message rate for too long; closing with 1008", self.label);
                self.violation(ctx, Violation::RateLimited);
                false
            }
        }
    }

    fn on_fragment(&mut self, item: Item, ctx: &mut ws::WebsocketContext<Self>) {
        if matches!(item, Item::FirstText(_)) && !self.within_rate(ctx) {
            // The rest of it is refused too: nothing is started.
            return self.fragments.clear();
        }
        match self.fragments.take(item, Instant::now()) {
            Fragment::Pending => {}
            Fragment::Whole(text) => self.hand(text),
            Fragment::Violation(v) => {
                match v {
                    Violation::MessageTooBig => log::info!(
                        "session {}: message over {} bytes; closing with 1009",
                        self.label,
                        self.settings.max_frame_bytes
                    ),
                    Violation::FragmentsFull => log::warn!(
                        "session {}: every connection's unfinished messages are at their bound \
                         (server.max_fragment_buffer_mb); closing with 1013",
                        self.label
                    ),
                    _ => {}
                }
                self.violation(ctx, v);
            }
        }
    }

    /// The client has not read `waiting` bytes: the connection is dropped (a close frame would
    /// wait behind the backlog forever).
    fn slow_consumer(&mut self, ctx: &mut ws::WebsocketContext<Self>, waiting: u64) {
        log::warn!(
            "session {}: the client does not read its output ({waiting} bytes waiting); dropping the connection",
            self.label
        );
        metrics().slow_consumers.inc();
        self.end(ctx, CloseReason::SlowConsumer);
        if let Some(limit) = &self.outgoing {
            limit.disconnect.disconnect();
        }
    }
}

impl Actor for WebSocketEdge {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let (Some(start), Some(line)) = (self.start.take(), self.line.take()) {
            let line = line.complete(ctx.address().recipient(), ctx.address().recipient());
            self.session = Some(start(Box::new(line)));
        }
        self.heartbeat(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.fragments.clear();
        if !self.closed_by_session {
            // No reason: the connection went away under the edge (a write to it failed): lost.
            let msg = match self.ended.take() {
                Some(reason) if !self.lost => FromClient::Ended(reason),
                Some(reason) => FromClient::Lost(reason),
                None => FromClient::Lost(CloseReason::ClientGone),
            };
            self.tell(msg);
        }
    }
}

impl Handler<ToClient> for WebSocketEdge {
    type Result = ();

    /// The session's line carries what it says; the edge hears its close: the close frame
    /// leaves on the line after everything before it, the connection's stream ends with it, and
    /// the edge with the stream.
    fn handle(&mut self, msg: ToClient, _: &mut Self::Context) {
        match msg {
            ToClient::Close(_) => self.closed_by_session = true,
            ToClient::Notice(_) => {}
            ToClient::Text(_) | ToClient::Audio(_) => {
                log::debug!("session {}: its words reach the edge, not its line: not sent", self.label)
            }
        }
    }
}

impl Handler<SlowConsumer> for WebSocketEdge {
    type Result = ();

    fn handle(&mut self, msg: SlowConsumer, ctx: &mut Self::Context) {
        if self.ended.is_none() && !self.closed_by_session {
            self.slow_consumer(ctx, msg.0);
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for WebSocketEdge {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        if self.ended.is_some() || self.closed_by_session {
            return;
        }
        self.last_heard = Instant::now();
        match msg {
            Ok(ws::Message::Text(text)) => {
                metrics().bytes_received.inc_by(text.len() as u64);
                if self.within_rate(ctx) {
                    self.hand(text);
                }
            }
            Ok(ws::Message::Binary(data)) => {
                metrics().bytes_received.inc_by(data.len() as u64);
                log::info!("session {}: binary frame; closing with 1003", self.label);
                self.violation(ctx, Violation::BinaryFrame);
            }
            Ok(ws::Message::Continuation(item)) => self.on_fragment(item, ctx),
            Ok(ws::Message::Ping(payload)) => {
                if self.within_rate(ctx) {
                    ctx.pong(&payload);
                }
            }
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(reason)) => {
                log::debug!("session {}: client sent close {:?}", self.label, reason);
                self.ended = Some(CloseReason::ClientGone);
                ctx.close(reason);
                ctx.stop();
            }
            Err(ws::ProtocolError::Overflow) => {
                log::info!(
                    "session {}: frame over {} bytes; closing with 1009",
                    self.label,
                    self.settings.max_frame_bytes
                );
                self.violation(ctx, Violation::MessageTooBig);
            }
            Err(ws::ProtocolError::Io(e)) => {
                // The connection broke (reset, or closed mid-frame): the client is gone.
                log::info!("session {}: connection lost: {e}", self.label);
                self.ended = Some(CloseReason::ClientGone);
                self.lost = true;
                ctx.stop();
            }
            Err(e) => {
                log::info!("session {}: WebSocket protocol error: {e}", self.label);
                self.violation(ctx, Violation::ProtocolError);
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        if self.ended.is_none() {
            // The stream ended without a close frame: the connection was lost.
            log::info!("session {}: the connection ended without a close frame", self.label);
            self.ended = Some(CloseReason::ClientGone);
            self.lost = true;
        }
        ctx.stop();
    }
}

#[cfg(test)]
mod tests;
