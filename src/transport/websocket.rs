//! The WebSocket edge: one actor per connection (on `actix-web-actors`) between the socket and
//! its session (`omni_actors::session::SessionActor`). It owns what is the socket's: frames and their fragments, pings and
//! the heartbeat, the message rate, the outgoing bound, and close codes. It hands the session
//! whole text messages ([`FromClient`]) and carries out what the session says ([`ToClient`]).
//!
//! The edge ends the connection itself when the client breaks the WebSocket's rules (a binary
//! frame, a message too big, a fragmented message never finished, too fast for too long), stops
//! answering pings, or does not read; the session then hears why ([`FromClient::Ended`]) and
//! ends untold. The session ends it for everything else ([`ToClient::Close`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_http::ws::Item;
use actix_web::web::Bytes;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation, bounded};
use omni_actors::session::messages::{FromClient, ToClient};

use super::incoming::Backlog;
use super::limits::{Admit, FragmentBudget, FragmentRefusal, Fragments, MessageRate, RateLimit};
use super::outgoing::OutgoingLimit;
use super::{SessionPort, StartSession};

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

pub struct WebSocketEdge {
    settings: EdgeSettings,
    /// Names the connection in logs (`c12`).
    label: String,
    start: Option<StartSession>,
    /// An event the session gets before the client's own (a client secret's settings).
    first: Option<String>,
    session: Option<SessionPort>,
    fragments: Fragments,
    rate: Option<MessageRate>,
    last_heard: Instant,
    /// The bound on what waits to be sent to a client that does not read; `None`: unbounded.
    outgoing: Option<OutgoingLimit>,
    /// What the session has been handed and not handled yet (the request body waits on it).
    incoming: Arc<Backlog>,
    /// Why the edge ended the connection (the session is told when the edge stops).
    ended: Option<CloseReason>,
    /// The session asked for the close: it needs no telling.
    closed_by_session: bool,
}

impl WebSocketEdge {
    pub fn new(
        settings: EdgeSettings,
        conn: u64,
        fragments: std::sync::Arc<FragmentBudget>,
        outgoing: Option<OutgoingLimit>,
        incoming: Arc<Backlog>,
        start: StartSession,
    ) -> WebSocketEdge {
        let now = Instant::now();
        WebSocketEdge {
            fragments: Fragments::new(fragments, settings.max_frame_bytes, settings.message_timeout),
            rate: settings.rate.map(|limit| MessageRate::new(limit, now)),
            settings,
            label: format!("c{conn}"),
            start: Some(start),
            first: None,
            session: None,
            last_heard: now,
            outgoing,
            incoming,
            ended: None,
            closed_by_session: false,
        }
    }

    /// The session gets `first` before the client's own events.
    pub fn with_first(mut self, first: Option<String>) -> WebSocketEdge {
        self.first = first;
        self
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
                return act.end(ctx, CloseReason::HeartbeatTimeout);
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
        let result = match item {
            Item::FirstText(data) => {
                if !self.within_rate(ctx) {
                    // The rest of it is refused too: nothing is started.
                    self.fragments.clear();
                    return;
                }
                self.fragments.first(data, Instant::now())
            }
            Item::FirstBinary(_) => return self.violation(ctx, Violation::BinaryFrame),
            Item::Continue(data) => self.fragments.append(data),
            Item::Last(data) => match self.fragments.finish(data) {
                Ok(bytes) => {
                    metrics().bytes_received.inc_by(bytes.len() as u64);
                    return match ByteString::try_from(Bytes::from(bytes)) {
                        Ok(text) => self.hand(text),
                        Err(_) => self.violation(ctx, Violation::InvalidUtf8),
                    };
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => {}
            Err(FragmentRefusal::TooBig) => {
                log::info!(
                    "session {}: message over {} bytes; closing with 1009",
                    self.label,
                    self.settings.max_frame_bytes
                );
                self.violation(ctx, Violation::MessageTooBig);
            }
            Err(FragmentRefusal::BudgetFull) => {
                log::warn!(
                    "session {}: every connection's unfinished messages are at their bound \
                     (server.max_fragment_buffer_mb); closing with 1013",
                    self.label
                );
                self.violation(ctx, Violation::FragmentsFull);
            }
            Err(FragmentRefusal::NotStarted) => self.violation(ctx, Violation::InvalidFrame),
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
        if let Some(start) = self.start.take() {
            self.session = Some(start(ctx.address().recipient()));
        }
        if let Some(first) = self.first.take() {
            self.tell(FromClient::Text(ByteString::from(first)));
        }
        self.heartbeat(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.fragments.clear();
        if !self.closed_by_session {
            let reason = self.ended.take().unwrap_or(CloseReason::ClientGone);
            self.tell(FromClient::Ended(reason));
        }
    }
}

impl Handler<ToClient> for WebSocketEdge {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        if self.ended.is_some() || self.closed_by_session {
            return;
        }
        match msg {
            ToClient::Text(frame) => {
                if let Some(limit) = &self.outgoing {
                    let waiting = limit.meter.wrote(frame.len());
                    if waiting > limit.max_bytes {
                        return self.slow_consumer(ctx, waiting);
                    }
                }
                metrics().bytes_sent.inc_by(frame.len() as u64);
                ctx.text(frame);
            }
            // This edge carries no audio of its own: its sessions' dialects send it in events.
            ToClient::Audio(_) => {
                log::debug!("session {}: model audio for an edge that does not carry audio", self.label)
            }
            ToClient::Close(reason) => {
                let description = match &reason {
                    CloseReason::BackendError(why) => bounded(why, 123).to_string(),
                    other => bounded(other.as_str(), 123).to_string(),
                };
                ctx.close(Some(ws::CloseReason {
                    code: ws::CloseCode::from(reason.close_code()),
                    description: Some(description),
                }));
                self.closed_by_session = true;
                ctx.stop();
            }
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
            self.ended = Some(CloseReason::ClientGone);
        }
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    //! The edge against a stand-in session (its port is all the edge knows of it), on a real
    //! socket: what reaches the session, what reaches the client, and who ends what.

    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use actix_web::{App, HttpRequest, HttpServer, web};
    use futures_util::{SinkExt, StreamExt};
    use omni_actors::protocol::{CloseReason, Violation};
    use omni_actors::session::messages::{FromClient, ToClient};
    use parking_lot::Mutex;
    use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

    use super::{EdgeSettings, WebSocketEdge};
    use crate::transport::incoming::{Backlog, IncomingBudget};
    use crate::transport::limits::FragmentBudget;

    const WAIT: Duration = Duration::from_secs(10);

    /// A session that only says what it was handed.
    struct Stand(UnboundedSender<String>);

    impl Actor for Stand {
        type Context = Context<Self>;
    }

    impl Handler<FromClient> for Stand {
        type Result = ();
        fn handle(&mut self, msg: FromClient, _: &mut Context<Self>) {
            let _ = self.0.send(match msg {
                FromClient::Text(t) => format!("text {t}"),
                FromClient::Audio(a) => format!("audio {} at {}", a.samples.len(), a.rate),
                FromClient::Refused(e) => format!("refused {}", e.code()),
                FromClient::Ended(r) => format!("ended {}", r.as_str()),
            });
        }
    }

    /// A server whose one route is the edge, the stand-in behind it; what the stand-in heard,
    /// and where the test speaks as the session.
    struct Served {
        url: String,
        heard: UnboundedReceiver<String>,
        edge: Arc<Mutex<Option<Recipient<ToClient>>>>,
    }

    fn settings() -> EdgeSettings {
        EdgeSettings {
            max_frame_bytes: 1024,
            heartbeat_interval: Duration::from_millis(50),
            heartbeat_timeout: Duration::from_millis(300),
            message_timeout: Duration::from_secs(5),
            rate: None,
        }
    }

    async fn serve(settings: EdgeSettings) -> Served {
        let (tx, heard) = unbounded_channel();
        let edge: Arc<Mutex<Option<Recipient<ToClient>>>> = Arc::default();
        let slot = edge.clone();
        let route = move |req: HttpRequest, payload: web::Payload| {
            let (tx, slot, settings) = (tx.clone(), slot.clone(), settings.clone());
            async move {
                let start = Box::new(move |to: Recipient<ToClient>| {
                    *slot.lock() = Some(to);
                    Stand(tx).start().recipient()
                });
                let incoming = Backlog::new(1 << 20, IncomingBudget::new(1 << 20));
                let fragments = FragmentBudget::new(1 << 20);
                let edge = WebSocketEdge::new(settings, 1, fragments, None, incoming, start);
                let codec = actix_http::ws::Codec::new().max_size(1024);
                let mut response = actix_web_actors::ws::handshake(&req)?;
                Ok::<_, actix_web::Error>(
                    response.streaming(actix_web_actors::ws::WebsocketContext::with_codec(edge, payload, codec)),
                )
            }
        };
        let server = HttpServer::new(move || App::new().route("/", web::get().to(route.clone())))
            .workers(1)
            .bind(("127.0.0.1", 0))
            .unwrap();
        let url = format!("ws://{}/", server.addrs()[0]);
        actix::spawn(server.run());
        Served { url, heard, edge }
    }

    impl Served {
        async fn heard(&mut self) -> String {
            tokio::time::timeout(WAIT, self.heard.recv()).await.expect("in time").expect("open")
        }

        fn say(&self, msg: ToClient) {
            self.edge.lock().as_ref().expect("the session started").do_send(msg);
        }
    }

    type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

    async fn next(client: &mut Socket) -> Message {
        loop {
            match tokio::time::timeout(WAIT, client.next()).await.expect("in time").expect("open").unwrap() {
                Message::Ping(_) | Message::Pong(_) => {}
                other => return other,
            }
        }
    }

    #[actix::test]
    async fn messages_go_both_ways_whole_and_the_session_closes_with_its_reason() {
        let mut served = serve(settings()).await;
        let (mut client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
        client.send(Message::text("{\"type\":\"x\"}")).await.unwrap();
        assert_eq!(served.heard().await, "text {\"type\":\"x\"}");
        served.say(ToClient::Text("hello".into()));
        assert_eq!(next(&mut client).await, Message::text("hello"));
        served.say(ToClient::Close(CloseReason::Client("bye".into())));
        let Message::Close(Some(frame)) = next(&mut client).await else { panic!("a close frame") };
        assert_eq!((frame.code, frame.reason.as_str()), (CloseCode::Normal, "bye"));
    }

    #[actix::test]
    async fn a_binary_frame_ends_the_connection_with_1003_and_the_session_hears_why() {
        let mut served = serve(settings()).await;
        let (mut client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
        client.send(Message::binary(vec![1, 2, 3])).await.unwrap();
        let Message::Close(Some(frame)) = next(&mut client).await else { panic!("a close frame") };
        assert_eq!(u16::from(frame.code), 1003);
        assert_eq!(served.heard().await, format!("ended {}", Violation::BinaryFrame.as_str()));
    }

    #[actix::test]
    async fn a_message_over_the_limit_is_1009_and_nothing_of_it_reaches_the_session() {
        let mut served = serve(settings()).await;
        let (mut client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
        client.send(Message::text("x".repeat(2048))).await.unwrap();
        let Message::Close(Some(frame)) = next(&mut client).await else { panic!("a close frame") };
        assert_eq!(u16::from(frame.code), 1009);
        assert_eq!(served.heard().await, format!("ended {}", Violation::MessageTooBig.as_str()));
    }

    #[actix::test]
    async fn a_client_that_stops_answering_pings_is_gone_and_the_session_hears_so() {
        let mut served = serve(settings()).await;
        // Connected, then never read: its pongs never go.
        let (_client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
        assert_eq!(served.heard().await, "ended heartbeat_timeout");
    }
}
