//! One session on a vLLM-Omni server: its socket, the response being spoken, the responses
//! cancelled, and what takes the session back when its connection is lost.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::Instant;

use omni_actors::edge::backend::BackendError;
use tungstenite::{Message, WebSocket};

use super::wire;

pub(super) type Socket = WebSocket<TcpStream>;

/// Cancelled responses remembered, to drop their late pieces.
const CANCELLED_KEPT: usize = 8;

/// The response being spoken, and the voice of it handed on.
pub(super) struct Speaking {
    pub(super) id: String,
    pub(super) sent_samples: u64,
}

/// A session whose connection was lost: what takes it back, to close it (no `Debug`: the token
/// is a secret).
pub(super) struct Orphan {
    pub(super) session_id: String,
    pub(super) resume_token: String,
    /// The last event received.
    pub(super) seq: u64,
}

/// One session on the server.
pub(super) struct Link {
    pub(super) socket: Socket,
    pub(super) session_id: String,
    pub(super) resume_token: String,
    /// The last `server_event_seq` received.
    pub(super) seq: u64,
    /// The last `server_event_seq` acknowledged (`session.event_ack`).
    pub(super) acked: u64,
    pub(super) speaking: Option<Speaking>,
    pub(super) cancelled: VecDeque<String>,
    /// A cancel went out with no response known: the response whose start is read before its
    /// answer (`response.done`, or the error that nothing was active) was cancelled.
    pub(super) cancelling_unknown: bool,
    /// The last step ended before its unit's decision: the first decision the next step reads
    /// is that one, and the step goes on waiting for its own.
    pub(super) owed: bool,
    /// When the server last said anything.
    pub(super) heard_at: Instant,
    /// A unit's frames were asked in slices, and told to go whole (once a session).
    pub(super) told_slices: bool,
    /// An error that came after a step's output: told with the next step.
    pub(super) error: Option<BackendError>,
}

impl Link {
    pub(super) fn send(&mut self, text: String) -> Result<(), tungstenite::Error> {
        self.socket.send(Message::text(text))
    }

    /// Cancels the response being spoken, or the one whose start is not read yet; its late
    /// pieces are dropped.
    pub(super) fn cancel(&mut self) -> Result<(), tungstenite::Error> {
        match self.speaking.take() {
            Some(speaking) => {
                self.send(wire::cancel(Some(&speaking.id)))?;
                self.forget(speaking.id);
            }
            None => {
                self.send(wire::cancel(None))?;
                self.cancelling_unknown = true;
            }
        }
        Ok(())
    }

    /// Drops what comes of `response_id` from now on.
    pub(super) fn forget(&mut self, response_id: String) {
        if self.cancelled.len() == CANCELLED_KEPT {
            self.cancelled.pop_front();
        }
        self.cancelled.push_back(response_id);
    }

    pub(super) fn is_cancelled(&self, response_id: &str) -> bool {
        self.cancelled.iter().any(|id| id == response_id)
    }

    pub(super) fn orphan(&self) -> Orphan {
        Orphan { session_id: self.session_id.clone(), resume_token: self.resume_token.clone(), seq: self.seq }
    }
}

/// Why no text message came before a deadline.
#[derive(Debug, thiserror::Error)]
pub(super) enum Silence {
    #[error("nothing in time")]
    Timeout,
    #[error("the server closed the connection ({0})")]
    Closed(String),
    #[error("{0}")]
    Failed(String),
}

/// The next text message on `socket` before `deadline` (other frames are skipped: however many
/// come, the deadline holds).
pub(super) fn next_text(socket: &mut Socket, deadline: Instant) -> Result<String, Silence> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Silence::Timeout);
        }
        let _ = socket.get_ref().set_read_timeout(Some(left));
        match socket.read() {
            Ok(Message::Text(text)) => return Ok(text.to_string()),
            Ok(Message::Close(frame)) => return Err(Silence::Closed(format!("{frame:?}"))),
            Ok(_) => {}
            Err(tungstenite::Error::Io(io)) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Silence::Timeout);
            }
            Err(e) => return Err(Silence::Failed(e.to_string())),
        }
    }
}
