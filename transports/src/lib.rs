//! omni-transports: how clients reach their sessions. A transport's edge is an actor between a
//! connection and its [`omni_actors::session::SessionActor`]: it hands the session whole
//! messages and carries out what the session tells it (`omni_actors::edge::client`). A new
//! transport is one more edge here; it depends on the actors crate only, and its session starts
//! as the server that admitted its caller says ([`StartSession`]).
//!
//! - [`caller`]: a caller as every transport describes it, how it reaches its session, and why
//!   it may be refused (the server's admission checks every caller on these);
//! - [`websocket`]: the one WebSocket edge, generic over what its socket carries (frames,
//!   fragments, pings, rate, bounds, close codes), and the realtime route's dialect text;
//! - [`webrtc`]: WebRTC calls (an SDP offer and answer, Opus on an audio track, events on a
//!   data channel);
//! - [`twilio`]: telephone calls streamed by Twilio Media Streams (μ-law frames on a WebSocket);
//! - [`telnyx`]: telephone calls streamed by Telnyx Media Streaming (G.711 frames on a WebSocket);
//! - [`sip`]: telephone calls from a SIP trunk (SIP over UDP, G.711 over RTP);
//! - [`playout`]: the model's voice leaving a call 20 ms at a time (WebRTC and SIP calls);
//! - [`phone`]: what the phone edges (Twilio, Telnyx, SIP) share: which of their session's
//!   notices are logged, and the model's voice on its way to a telephony stream;
//! - [`udp`]: a call's socket as a stream of datagrams (WebRTC and SIP calls);
//! - [`limits`]: what one connection may send (the message rate, unfinished fragments);
//! - [`outgoing`] and [`socket`]: the bound on what a client has not read, and dropping its
//!   connection when it is over it;
//! - [`incoming`]: the bound on what a client sent and its session has not handled (the
//!   connection is not read past it).

use omni_actors::edge::client::ClientLine;
pub use omni_actors::edge::client::SessionPort;

pub mod caller;
pub mod incoming;
pub mod limits;
pub mod outgoing;
pub mod phone;
pub mod playout;
pub mod sip;
pub mod socket;
pub mod telnyx;
pub mod twilio;
pub mod udp;
pub mod webrtc;
pub mod websocket;

/// Starts a client's session, given its line to the client (its edge's recipient, or a line
/// of the edge's transport; the edge calls it once started), and answers the session's port:
/// where the edge hands it what the client sends. An edge knows its session only by that port,
/// so that it is tested against a stand-in session.
pub type StartSession = Box<dyn FnOnce(Box<dyn ClientLine>) -> SessionPort>;
