//! How clients reach their sessions. A transport's edge is an actor between a connection and
//! its [`omni_actors::session::SessionActor`]: it hands the session whole messages and carries
//! out what the session tells it (`omni_actors::session::messages`). A new transport is one
//! more edge here.
//!
//! - [`admission`]: the checks every transport's caller passes before its session starts,
//!   on a transport-neutral description of the caller;
//! - [`websocket`]: the WebSocket edge (frames, fragments, pings, rate, close codes);
//! - [`webrtc`]: WebRTC calls (an SDP offer and answer, Opus on an audio track, events on a
//!   data channel);
//! - [`twilio`]: telephone calls streamed by Twilio Media Streams (μ-law frames on a WebSocket);
//! - [`sip`]: telephone calls from a SIP trunk (SIP over UDP, G.711 over RTP);
//! - [`playout`]: the model's voice leaving a call 20 ms at a time (WebRTC and SIP calls);
//! - [`limits`]: what one connection may send (the message rate, unfinished fragments);
//! - [`outgoing`] and [`socket`]: the bound on what a client has not read, and dropping its
//!   connection when it is over it;
//! - [`incoming`]: the bound on what a client sent and its session has not handled (the
//!   connection is not read past it).

use omni_actors::session::messages::ClientLine;
pub use omni_actors::session::messages::SessionPort;

pub mod admission;
pub mod incoming;
pub mod limits;
pub mod outgoing;
pub mod playout;
pub mod sip;
pub mod socket;
pub mod twilio;
pub mod webrtc;
pub mod websocket;

/// Starts a client's session, given its line to the client (its edge's recipient, or a line
/// of the edge's transport; the edge calls it once started), and answers the session's port:
/// where the edge hands it what the client sends. An edge knows its session only by that port,
/// so that it is tested against a stand-in session.
pub type StartSession = Box<dyn FnOnce(Box<dyn ClientLine>) -> SessionPort>;

/// A phone call's settings (its instructions and the model's voice, from a Twilio stream's
/// parameters or a SIP route) as its session's first `session.update` (the OpenAI dialect's:
/// every phone edge opens an OpenAI-dialect session); `None` when it has neither.
pub fn call_settings(instructions: Option<&str>, voice: Option<&str>) -> Option<String> {
    use serde_json::json;
    if instructions.is_none() && voice.is_none() {
        return None;
    }
    let mut session = json!({"type": "realtime"});
    if let Some(i) = instructions {
        session["instructions"] = json!(i);
    }
    if let Some(v) = voice {
        session["audio"] = json!({"output": {"voice": v}});
    }
    Some(json!({"type": "session.update", "session": session}).to_string())
}

/// The code of an `error` event of a phone call's session (its dialect's JSON), when it says the
/// session refused something of the call's own (a setting of its route or its parameters): a
/// phone line has nowhere to show it, so its edge logs the code (never the event: it may carry
/// the resume token). `not_ready` (the caller spoke before the session was created) is not.
pub fn refused_setting(text: &str) -> Option<String> {
    if !text.contains(r#""type":"error""#) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let code = v["error"]["code"].as_str().unwrap_or("error");
    (v["type"] == "error" && code != "not_ready").then(|| code.to_string())
}

/// What a UDP socket receives, as a stream of datagrams (at most `max` bytes each) and their
/// senders: a call's edge adds it to its context.
pub fn datagrams(
    socket: std::sync::Arc<tokio::net::UdpSocket>,
    max: usize,
) -> impl futures_util::Stream<Item = std::io::Result<(Vec<u8>, std::net::SocketAddr)>> {
    futures_util::stream::unfold(socket, move |socket| async move {
        let mut buf = vec![0u8; max];
        let got = socket.recv_from(&mut buf).await.map(|(n, from)| {
            buf.truncate(n);
            (buf, from)
        });
        Some((got, socket))
    })
}
