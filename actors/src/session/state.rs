//! The session's protocol state machine, as a plain struct: which commands each phase
//! admits. QUEUED until a worker is attached, CONNECTED until the client initialises,
//! ACTIVE once the backend prepared the session, CLOSED at the end.

use crate::protocol::{Inbound, ProtocolError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for a worker; `session.queue_done` not sent yet.
    Queued,
    /// A worker is attached; the client must initialise.
    Connected,
    /// Initialisation sent to the backend; waiting for it.
    Initializing,
    /// Created: input is accepted.
    Active,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SessionState {
    phase: Phase,
}

impl Default for SessionState {
    fn default() -> Self {
        SessionState { phase: Phase::Queued }
    }
}

impl SessionState {
    pub(super) fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether `cmd` is allowed now; the error tells the client why not.
    pub(super) fn admit(&self, cmd: &Inbound) -> Result<(), ProtocolError> {
        let not_ready = |why: &str| Err(ProtocolError::NotReady(why.to_string()));
        match (cmd, self.phase) {
            (Inbound::Close { .. }, _) => Ok(()),
            (_, Phase::Closed) => not_ready("the session is closed"),
            (Inbound::Init(_), Phase::Connected) => Ok(()),
            (Inbound::Init(_), Phase::Queued) => {
                not_ready("initialisation is accepted only after session.queue_done (a worker is not assigned yet)")
            }
            (Inbound::Init(_), _) => not_ready("the session is already initialised"),
            (_, Phase::Active) => Ok(()),
            _ => not_ready("input is accepted only after session.created"),
        }
    }

    /// A worker is attached (`session.queue_done` goes out).
    pub(super) fn connected(&mut self) {
        if self.phase == Phase::Queued {
            self.phase = Phase::Connected;
        }
    }

    /// Initialisation was handed to the backend.
    pub(super) fn initializing(&mut self) {
        if self.phase == Phase::Connected {
            self.phase = Phase::Initializing;
        }
    }

    /// The backend refused the initialisation: the client may try again.
    pub(super) fn init_failed(&mut self) {
        if self.phase == Phase::Initializing {
            self.phase = Phase::Connected;
        }
    }

    /// The backend prepared the session (`session.created` goes out).
    pub(super) fn created(&mut self) {
        if self.phase == Phase::Initializing {
            self.phase = Phase::Active;
        }
    }

    pub(super) fn close(&mut self) {
        self.phase = Phase::Closed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DuplexChunk, SessionKind, SessionSetup, TurnInput};

    fn init() -> Inbound {
        Inbound::Init(SessionSetup::new(SessionKind::Duplex))
    }
    fn chunk() -> Inbound {
        Inbound::Chunk(DuplexChunk::default())
    }
    fn turn() -> Inbound {
        Inbound::Turn { input: TurnInput::default(), streaming: true }
    }
    fn close() -> Inbound {
        Inbound::Close { reason: None }
    }
    fn code(r: Result<(), ProtocolError>) -> &'static str {
        r.err().map_or("ok", |e| e.code())
    }

    #[test]
    fn queued_admits_only_close() {
        let s = SessionState::default();
        assert_eq!(code(s.admit(&init())), "not_ready");
        assert_eq!(code(s.admit(&chunk())), "not_ready");
        assert_eq!(code(s.admit(&turn())), "not_ready");
        assert_eq!(code(s.admit(&close())), "ok");
    }

    #[test]
    fn the_lifecycle_admits_init_once_then_input() {
        let mut s = SessionState::default();
        s.connected();
        assert_eq!(code(s.admit(&init())), "ok");
        assert_eq!(code(s.admit(&chunk())), "not_ready", "input before session.created");
        s.initializing();
        assert_eq!(code(s.admit(&init())), "not_ready", "a second init while the first runs");
        s.created();
        assert_eq!(s.phase(), Phase::Active);
        assert_eq!(code(s.admit(&chunk())), "ok");
        assert_eq!(code(s.admit(&turn())), "ok");
        assert_eq!(code(s.admit(&init())), "not_ready", "a second init");
        s.close();
        assert_eq!(code(s.admit(&chunk())), "not_ready");
    }

    #[test]
    fn a_refused_init_can_be_retried() {
        let mut s = SessionState::default();
        s.connected();
        s.initializing();
        s.init_failed();
        assert_eq!(s.phase(), Phase::Connected);
        assert_eq!(code(s.admit(&init())), "ok");
    }

    #[test]
    fn transitions_only_go_forward() {
        let mut s = SessionState::default();
        s.created();
        s.initializing();
        assert_eq!(s.phase(), Phase::Queued, "nothing skips the queue");
    }
}
