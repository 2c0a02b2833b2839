//! The session's line to its WebSocket: what the session says goes straight into the
//! connection's outgoing stream, encoded as frames on the session's own thread, with no hop
//! through the edge's mailbox (a waiting client's position updates, every answer's events).
//! The edge hears only what it must act on: the session's close, and a client that does not
//! read.
//!
//! The connection's outgoing stream is the edge's own (pings, pongs, the close of a connection
//! the edge ends) merged with the session's line ([`Merged`]). The session's close is written
//! after everything it said before and ends the stream; the edge's end ends it too, whatever
//! of the session's is left unsent.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix::prelude::*;
use actix_http::ws::{CloseCode, CloseReason as WsCloseReason, Codec, Message};
use actix_web::web::{Bytes, BytesMut};
use futures_util::Stream;
use omni_actors::edge::client::{ClientLine, ToClient};
use omni_actors::observe::metrics;
use omni_actors::protocol::{CloseReason, bounded};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::codec::Encoder;

use crate::outgoing::OutgoingLimit;

/// The close frame's description of a session's ending (at most the 123 bytes a close frame
/// holds).
pub(super) fn close_frame(reason: &CloseReason) -> WsCloseReason {
    let description = match reason {
        CloseReason::BackendError(why) => bounded(why, 123).to_string(),
        other => bounded(other.as_str(), 123).to_string(),
    };
    WsCloseReason { code: CloseCode::from(reason.close_code()), description: Some(description) }
}

/// What the session's line carries to the connection.
pub enum Said {
    /// An encoded frame.
    Frame(Bytes),
    /// The session's end: its close frame goes last.
    Close(CloseReason),
}

/// The client does not read: `waiting` bytes wait for it (the edge drops the connection).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct SlowConsumer(pub(super) u64);

/// The session's end of the line, handed to the session when the edge starts it.
pub(super) struct Line {
    said: UnboundedSender<Said>,
    /// The edge: it hears the session's close, and a client that does not read.
    edge: Recipient<ToClient>,
    slow: Recipient<SlowConsumer>,
    /// The bound on what waits for a client that does not read; `None`: unbounded.
    outgoing: Option<Arc<OutgoingLimit>>,
    codec: parking_lot::Mutex<Codec>,
}

impl ClientLine for Line {
    fn tell(&self, msg: ToClient) {
        match msg {
            ToClient::Text(text) => {
                if let Some(limit) = &self.outgoing
                    && let Err(waiting) = limit.wrote(text.len())
                {
                    self.slow.do_send(SlowConsumer(waiting));
                    return;
                }
                metrics().bytes_sent.inc_by(text.len() as u64);
                let mut frame = BytesMut::with_capacity(text.len() + 10);
                if self.codec.lock().encode(Message::Text(text), &mut frame).is_ok() {
                    let _ = self.said.send(Said::Frame(frame.freeze()));
                }
            }
            // This transport carries no audio of its own: its sessions' dialects send it in events.
            ToClient::Audio(_) => log::debug!("a WebSocket session's audio not in its dialect's events: dropped"),
            // Its client hears what became of its session in the dialect's own events.
            ToClient::Notice(_) => {}
            ToClient::Close(reason) => {
                let _ = self.said.send(Said::Close(reason.clone()));
                self.edge.do_send(ToClient::Close(reason));
            }
        }
    }
}

/// The connection's side of the line.
pub struct Hearing {
    said: UnboundedReceiver<Said>,
}

/// A new line: the session's end (completed by the edge when it starts), and the connection's.
pub fn line() -> (UnboundedSender<Said>, Hearing) {
    let (said, heard) = unbounded_channel();
    (said, Hearing { said: heard })
}

/// What the edge hands its session: the line, with the edge's own addresses.
pub(super) struct LineEnd {
    pub(super) said: UnboundedSender<Said>,
    pub(super) outgoing: Option<Arc<OutgoingLimit>>,
    pub(super) max_frame_bytes: usize,
}

impl LineEnd {
    pub(super) fn complete(self, edge: Recipient<ToClient>, slow: Recipient<SlowConsumer>) -> Line {
        let codec = Codec::new().max_size(self.max_frame_bytes);
        Line { said: self.said, edge, slow, outgoing: self.outgoing, codec: parking_lot::Mutex::new(codec) }
    }
}

/// The connection's outgoing stream: the edge's frames and the session's, until either ends it.
pub struct Merged<S> {
    edge: Pin<Box<S>>,
    session: Hearing,
    codec: Codec,
    done: bool,
}

impl<S> Merged<S> {
    pub fn new(edge: S, session: Hearing, max_frame_bytes: usize) -> Merged<S> {
        Merged { edge: Box::pin(edge), session, codec: Codec::new().max_size(max_frame_bytes), done: false }
    }
}

impl<S, E> Stream for Merged<S>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    type Item = Result<Bytes, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // The edge's own first: a ping, a pong, or the close of a connection it ends (after
        // which nothing of the session's goes).
        match this.edge.as_mut().poll_next(cx) {
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
            Poll::Pending => {}
        }
        match this.session.said.poll_recv(cx) {
            Poll::Ready(Some(Said::Frame(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Said::Close(reason))) => {
                this.done = true;
                let mut frame = BytesMut::new();
                match this.codec.encode(Message::Close(Some(close_frame(&reason))), &mut frame) {
                    Ok(()) => Poll::Ready(Some(Ok(frame.freeze()))),
                    Err(_) => Poll::Ready(None),
                }
            }
            // The session is gone: the edge ends the connection.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}
