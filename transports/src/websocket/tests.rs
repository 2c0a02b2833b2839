//! The edge against a stand-in session (its port is all the edge knows of it), on a real
//! socket: what reaches the session, what the session's line brings the client, and who ends
//! what.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::{App, HttpRequest, HttpServer, web};
use futures_util::{SinkExt, StreamExt};
use omni_actors::edge::client::{ClientLine, FromClient, FromLine, SessionPort, ToClient};
use omni_actors::protocol::{CloseReason, Violation};
use parking_lot::Mutex;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::line::{Merged, line};
use super::{EdgeSettings, WebSocketEdge};
use crate::incoming::{Backlog, IncomingBudget};
use crate::limits::FragmentBudget;

const WAIT: Duration = Duration::from_secs(10);

/// A session that only says what it was handed.
struct Stand(UnboundedSender<String>);

impl Actor for Stand {
    type Context = Context<Self>;
}

impl Handler<FromLine> for Stand {
    type Result = ();
    fn handle(&mut self, FromLine { msg, .. }: FromLine, _: &mut Context<Self>) {
        let _ = self.0.send(match msg {
            FromClient::Text(t) => format!("text {t}"),
            FromClient::Audio(a) => format!("audio {} at {}", a.samples.len(), a.rate),
            FromClient::Key(k) => format!("key {}", k.key()),
            FromClient::Configure(c) => format!("configure {c:?}"),
            FromClient::Playback(p) => format!("played {p:?}"),
            FromClient::Refused(e) => format!("refused {}", e.code()),
            FromClient::Ended(r) => format!("ended {}", r.as_str()),
            FromClient::Lost(r) => format!("lost {}", r.as_str()),
        });
    }
}

/// A server whose one route is the edge, the stand-in behind it; what the stand-in heard,
/// and where the test speaks as the session.
struct Served {
    url: String,
    heard: UnboundedReceiver<String>,
    line: Arc<Mutex<Option<Box<dyn ClientLine>>>>,
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
    let session_line: Arc<Mutex<Option<Box<dyn ClientLine>>>> = Arc::default();
    let slot = session_line.clone();
    let route = move |req: HttpRequest, payload: web::Payload| {
        let (tx, slot, settings) = (tx.clone(), slot.clone(), settings.clone());
        async move {
            let start = Box::new(move |to: Box<dyn ClientLine>| {
                *slot.lock() = Some(to);
                SessionPort::new(Stand(tx).start().recipient(), 0)
            });
            let incoming = Backlog::new(1 << 20, IncomingBudget::new(1 << 20));
            let fragments = FragmentBudget::new(1 << 20);
            let (said, heard) = line();
            let edge = WebSocketEdge::new(settings, 1, fragments, None, incoming, said, start);
            let codec = actix_http::ws::Codec::new().max_size(1024);
            let mut response = actix_web_actors::ws::handshake(&req)?;
            let context = actix_web_actors::ws::WebsocketContext::with_codec(edge, payload, codec);
            Ok::<_, actix_web::Error>(response.streaming(Merged::new(context, heard, 1024)))
        }
    };
    let server = HttpServer::new(move || App::new().route("/", web::get().to(route.clone())))
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
    let url = format!("ws://{}/", server.addrs()[0]);
    actix::spawn(server.run());
    Served { url, heard, line: session_line }
}

impl Served {
    async fn heard(&mut self) -> String {
        tokio::time::timeout(WAIT, self.heard.recv()).await.expect("in time").expect("open")
    }

    fn say(&self, msg: ToClient) {
        self.line.lock().as_ref().expect("the session started").tell(msg);
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
async fn a_client_that_stops_answering_pings_is_lost_and_the_session_hears_so() {
    let mut served = serve(settings()).await;
    // Connected, then never read: its pongs never go.
    let (_client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
    assert_eq!(served.heard().await, "lost heartbeat_timeout");
}

#[actix::test]
async fn a_close_frame_ends_the_session_and_a_dropped_connection_is_lost() {
    let mut served = serve(settings()).await;
    let (mut client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
    client.close(None).await.unwrap();
    assert_eq!(served.heard().await, "ended client_closed", "a close frame: the client meant it");
    // A connection dropped without a close frame (the TCP connection simply ends).
    let (client, _) = tokio_tungstenite::connect_async(&served.url).await.unwrap();
    drop(client);
    assert_eq!(served.heard().await, "lost client_closed");
}
