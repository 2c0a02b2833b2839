//! What the realtime route's socket carries: a dialect's text, both ways. The client's whole
//! messages are handed to its session; what the session says goes straight into the connection's
//! outgoing stream on its line (`super::line`), encoded on the session's own thread, with no hop
//! through the edge: the edge hears only the session's close and a client that does not read.

use std::sync::Arc;

use actix::AsyncContext;
use bytestring::ByteString;
use omni_actors::edge::client::{FromClient, ToClient};

use super::line::{LineEnd, Said};
use super::{Carried, EdgeSettings, Io, SocketEdge, SocketParts};
use crate::StartSession;
use crate::incoming::Backlog;
use crate::limits::FragmentBudget;
use crate::outgoing::OutgoingLimit;

/// A dialect's text on a WebSocket (the realtime route's).
pub struct Realtime {
    /// The session's line to the connection, until it is handed to the session.
    line: Option<LineEnd>,
    start: Option<StartSession>,
}

/// The realtime route's edge.
pub type WebSocketEdge = SocketEdge<Realtime>;

impl SocketEdge<Realtime> {
    /// The edge of connection `conn`, whose session `start` starts with the line `said` into the
    /// connection's outgoing stream.
    pub fn new(
        settings: EdgeSettings,
        conn: u64,
        fragments: Arc<FragmentBudget>,
        outgoing: Option<Arc<OutgoingLimit>>,
        incoming: Arc<Backlog>,
        said: tokio::sync::mpsc::UnboundedSender<Said>,
        start: StartSession,
    ) -> WebSocketEdge {
        let line = LineEnd { said, outgoing: outgoing.clone() };
        let parts = SocketParts { label: format!("c{conn}"), settings, fragments, incoming, outgoing };
        SocketEdge::with(parts, Realtime { line: Some(line), start: Some(start) })
    }
}

impl Carried for Realtime {
    const TELLS_RATE: bool = true;

    fn started(&mut self, edge: &mut Io<'_, Self>) {
        if let (Some(start), Some(line)) = (self.start.take(), self.line.take()) {
            let addr = edge.ctx().address();
            let line = line.complete(addr.clone().recipient(), addr.recipient());
            edge.attached(start(Box::new(line)));
        }
    }

    fn text(&mut self, text: ByteString, edge: &mut Io<'_, Self>) {
        edge.hand(FromClient::Text(text));
    }

    /// The session's line carries what it says; the edge hears its close: the close frame
    /// leaves on the line after everything before it, the connection's stream ends with it, and
    /// the edge with the stream.
    fn told(&mut self, msg: ToClient, edge: &mut Io<'_, Self>) {
        match msg {
            ToClient::Close(_) => edge.session_closed(),
            // Its client hears what became of its session in the dialect's own events.
            ToClient::Notice(_) => {}
            ToClient::Text(_) | ToClient::Audio(_) => {
                log::debug!("session {}: its words reach the edge, not its line: not sent", edge.label())
            }
        }
    }
}
