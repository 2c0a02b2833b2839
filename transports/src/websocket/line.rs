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
    /// A text frame: its header, and its payload as the session made it (not copied: the
    /// connection's writer copies both once into what it sends).
    Frame { head: Bytes, payload: Bytes },
    /// The session's end: its close frame goes last.
    Close(CloseReason),
}

/// The header of a server's text frame of `len` bytes, whole (RFC 6455 5.2: FIN, opcode 1, no
/// mask, the length in 7, 16 or 64 bits).
fn text_head(len: usize) -> Bytes {
    let mut head = Vec::with_capacity(10);
    head.push(0x81);
    match len {
        0..=125 => head.push(len as u8),
        126..=0xFFFF => {
            head.push(126);
            head.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            head.push(127);
            head.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    Bytes::from(head)
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
                let _ = self.said.send(Said::Frame { head: text_head(text.len()), payload: text.into_bytes() });
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
}

impl LineEnd {
    pub(super) fn complete(self, edge: Recipient<ToClient>, slow: Recipient<SlowConsumer>) -> Line {
        Line { said: self.said, edge, slow, outgoing: self.outgoing }
    }
}

/// The connection's outgoing stream: the edge's frames and the session's, until either ends it.
pub struct Merged<S> {
    edge: Pin<Box<S>>,
    session: Hearing,
    codec: Codec,
    /// A frame's payload whose header went out: next, before anything else.
    payload: Option<Bytes>,
    done: bool,
}

impl<S> Merged<S> {
    pub fn new(edge: S, session: Hearing, max_frame_bytes: usize) -> Merged<S> {
        let codec = Codec::new().max_size(max_frame_bytes);
        Merged { edge: Box::pin(edge), session, codec, payload: None, done: false }
    }
}

impl<S, E> Stream for Merged<S>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    type Item = Result<Bytes, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(payload) = this.payload.take() {
            return Poll::Ready(Some(Ok(payload)));
        }
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
            Poll::Ready(Some(Said::Frame { head, payload })) => {
                this.payload = Some(payload);
                Poll::Ready(Some(Ok(head)))
            }
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
