//! Opening a session on the server, closing it, and taking back a session whose connection was
//! lost, to close it.

use std::collections::VecDeque;
use std::time::Instant;

use omni_actors::domain::SessionSetup;
use omni_actors::edge::backend::BackendError;
use omni_actors::observe::metrics::metrics;
use tungstenite::Message;

use super::VllmOmniBackend;
use super::link::{Link, next_text};
use super::wire::{self, Event};

/// Errors of a server that cannot hold duplex sessions at all: the slot is out, not the client.
const SERVER_ERRORS: [&str; 3] = ["multi_api_duplex_unsupported", "unsupported", "config_timeout"];

impl VllmOmniBackend {
    pub(super) fn open_session(&mut self, setup: &SessionSetup) -> Result<(), BackendError> {
        self.server.usable(&self.name, self.options.connect_timeout)?;
        let update = wire::session_update(setup, self.ref_audio(setup)?, self.options.model.as_deref());
        let mut socket = self.connect()?;
        let refused = |e: String| {
            self.server.suspect();
            BackendError::Unavailable(format!("{}: the session was not opened: {e}", self.url))
        };
        socket.send(Message::text(update)).map_err(|e| refused(e.to_string()))?;
        let deadline = Instant::now() + self.options.reply_timeout;
        loop {
            let text = next_text(&mut socket, deadline).map_err(|e| refused(format!("no session.created ({e})")))?;
            match wire::parse(&text).map_err(|e| self.lost("session.update", e))?.0 {
                Event::Created { session_id, resume_token } => {
                    self.server.had_room();
                    log::debug!("worker {}: vLLM-Omni session {session_id} open", self.name);
                    self.link = Some(Link {
                        socket,
                        session_id,
                        resume_token,
                        seq: 0,
                        acked: 0,
                        speaking: None,
                        cancelled: VecDeque::new(),
                        cancelling_unknown: false,
                        owed: false,
                        heard_at: Instant::now(),
                        told_slices: false,
                        error: None,
                    });
                    return Ok(());
                }
                Event::Error { code, message } if code == "resource_exhausted" => {
                    self.server.full();
                    metrics().remote_worker_health.with_label_values(&[&self.name, "full"]).inc();
                    let why = format!("{} has no free session slot ({code}: {message})", self.url);
                    return Err(BackendError::Unavailable(why));
                }
                Event::Error { code, message } if SERVER_ERRORS.contains(&code.as_str()) => {
                    self.server.suspect();
                    let why = format!("{} cannot hold a duplex session: {message} ({code})", self.url);
                    return Err(BackendError::Unavailable(why));
                }
                Event::Error { code, message } => {
                    let why = format!("vLLM-Omni refused the session: {message} ({code})");
                    return Err(BackendError::InvalidArgument(why));
                }
                _ => {}
            }
        }
    }

    /// Ends the session on the server and waits for its `session.closed`, so that its slot is
    /// free when this one is offered again. Unconfirmed, the session is taken back on a new
    /// connection to be closed ([`Self::close_orphan`]).
    pub(super) fn close_session(&mut self) -> Result<(), BackendError> {
        let Some(mut link) = self.link.take() else { return Ok(()) };
        let session_id = link.session_id.clone();
        self.orphan = Some(link.orphan());
        let deadline = Instant::now() + self.options.close_timeout;
        let confirmed = link.send(wire::close()).map_err(|e| e.to_string()).and_then(|_| {
            loop {
                let text = next_text(&mut link.socket, deadline).map_err(|e| e.to_string())?;
                if let Ok((Event::Ended { kind, .. }, _)) = wire::parse(&text)
                    && kind == "session.closed"
                {
                    break Ok(());
                }
            }
        });
        if let Err(why) = confirmed {
            return Err(BackendError::Internal(format!(
                "{} did not confirm the end of session {session_id} ({why}): it is taken back to be closed",
                self.url
            )));
        }
        self.orphan = None;
        // A slot of that server is free: it is asked again at once, whatever refusal came before.
        self.server.had_room();
        // The server closes the socket next; the close handshake is not waited for.
        let _ = link.socket.close(None);
        let _ = link.socket.flush();
        log::debug!("worker {}: vLLM-Omni session {session_id} closed", self.name);
        Ok(())
    }

    /// Takes a session whose connection was lost back on a new one and closes it, so that the
    /// server does not hold its slot for 30 to 35 s. A server that cannot be reached holds
    /// nothing (it died, or its grace ends it); one that refuses the token has ended it.
    pub(super) fn close_orphan(&mut self) {
        let Some(o) = self.orphan.take() else { return };
        let said = |what: &str| log::info!("worker {}: vLLM-Omni session {} {what}", self.name, o.session_id);
        let Ok(mut socket) = self.connect() else {
            return said("was lost with its connection, and the server cannot be reached to close it");
        };
        let deadline = Instant::now() + self.options.close_timeout;
        let mut closed =
            socket.send(Message::text(wire::resume(&o.session_id, &o.resume_token, o.seq))).map_err(|e| e.to_string());
        // Until it is taken back, an error is the refusal; after, the replay of old ones.
        let mut resumed = false;
        while closed.is_ok() {
            let event = next_text(&mut socket, deadline)
                .map_err(|e| e.to_string())
                .and_then(|text| wire::parse(&text).map(|(event, _)| event).map_err(|e| e.to_string()));
            match event {
                Ok(Event::Resumed) => {
                    resumed = true;
                    closed = socket.send(Message::text(wire::close())).map_err(|e| e.to_string());
                }
                Ok(Event::Error { code, message }) if !resumed => closed = Err(format!("{message} ({code})")),
                Ok(Event::Ended { kind, .. }) if kind == "session.closed" => break,
                Ok(Event::Ended { kind, .. }) => closed = Err(kind),
                Ok(_) => {}
                Err(e) => closed = Err(e),
            }
        }
        match closed {
            Ok(()) => said("was lost with its connection: taken back and closed"),
            Err(why) => said(&format!("was lost with its connection, and could not be taken back to close it ({why})")),
        }
        let _ = socket.close(None);
    }
}
