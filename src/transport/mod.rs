//! How clients reach their sessions. A transport's edge is an actor between a connection and
//! its [`omni_actors::session::SessionActor`]: it hands the session whole messages and carries
//! out what the session tells it (`omni_actors::session::messages`). A new transport (a WebRTC
//! data channel...) is one more edge here.
//!
//! - [`websocket`]: the WebSocket edge (frames, fragments, pings, rate, close codes);
//! - [`limits`]: what one connection may send (the message rate, unfinished fragments);
//! - [`outgoing`] and [`socket`]: the bound on what a client has not read, and dropping its
//!   connection when it is over it.

pub mod limits;
pub mod outgoing;
pub mod socket;
pub mod websocket;
