//! A step's events: read until its unit's decision or the wait, turned into the step's piece,
//! and what goes back to the server after them.

use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use omni_actors::domain::{StepKind, StepPiece};
use omni_actors::edge::backend::BackendError;
use tungstenite::Message;

use super::VllmOmniBackend;
use super::link::{Link, Speaking};
use super::wire::{self, Event};

/// The server's journal is acknowledged every this many events.
const ACK_EVERY: u64 = 64;
/// A server that says nothing for this long while it is sent units is gone: longer than the 64
/// units a response may go on without a word (its model listening on, its own silence fed).
const SILENT_FOR: Duration = Duration::from_secs(150);
/// How often a step waiting for its decision looks for an interrupt.
const POLL: Duration = Duration::from_millis(20);
/// Errors of the playback acknowledgements sent on the client's behalf, and of a cancel that
/// crossed the response's end: nothing the client asked for.
const OWN_ERRORS: [&str; 4] =
    ["response_not_active", "playback_ack_too_late", "playback_item_not_found", "playback_item_mismatch"];

/// What a step's collected events came to.
#[derive(Default)]
pub(super) struct Collected {
    piece: StepPiece,
    /// The unit's decision arrived (a listen, or voice with its words, or a response's end).
    decided: bool,
    /// A piece of voice waits for its words.
    voice_without_words: bool,
    /// The response whose voice was handed on, and how much of it in all (24 kHz samples).
    played: Option<(String, u64)>,
    /// The step was cut short by an interrupt.
    interrupted: bool,
}

impl Collected {
    /// A unit's decision was read: this step's, unless the last step still owed one.
    fn decision(&mut self, link: &mut Link) {
        if std::mem::take(&mut link.owed) {
            return;
        }
        self.decided = true;
    }
}

impl VllmOmniBackend {
    /// Reads the server's events into the step's piece until the unit's decision, for at most
    /// the decision wait; an interrupt seen meanwhile cancels the response.
    pub(super) fn collect(&mut self) -> Result<StepPiece, BackendError> {
        let deadline = Instant::now() + self.options.decision_wait;
        let mut got = Collected::default();
        let mut link = self.link.take().ok_or_else(|| BackendError::BadState("no session is prepared".into()))?;
        let result = loop {
            if self.control.cancel.swap(false, Ordering::SeqCst) {
                got.interrupted = true;
                break link.cancel().map_err(|e| self.lost("response.cancel", e)).and(Err(BackendError::Interrupted));
            }
            let now = Instant::now();
            // After the decision, only what is already there: a read that does not wait (a
            // timeout of a millisecond would wait a scheduler tick, up to 10 ms).
            let settled = got.decided && !got.voice_without_words;
            // Never past the wait, nor more than a step hands on, however fast the server
            // sends: the rest is read by the next step.
            if now >= deadline
                || got.piece.audio.len() >= self.info.max_output_samples as usize
                || got.piece.text.len() >= self.info.max_output_text_bytes as usize
            {
                break Ok(());
            }
            let tcp = link.socket.get_ref();
            let _ = tcp.set_nonblocking(settled);
            if !settled {
                let _ = tcp.set_read_timeout(Some((deadline - now).min(POLL)));
            }
            match link.socket.read() {
                Ok(Message::Text(text)) => match wire::parse(&text) {
                    Ok((event, seq)) => {
                        link.seq = seq.unwrap_or(link.seq);
                        link.heard_at = Instant::now();
                        if let Err(e) = self.absorb(&mut link, &mut got, event) {
                            break Err(e);
                        }
                    }
                    Err(e) => break Err(self.lost("an event", e)),
                },
                Ok(Message::Close(frame)) => break Err(self.lost("step", format!("the server closed ({frame:?})"))),
                Ok(_) => {}
                Err(tungstenite::Error::Io(io)) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if settled {
                        break Ok(());
                    }
                }
                Err(e) => break Err(self.lost("step", e)),
            }
        };
        let _ = link.socket.get_ref().set_nonblocking(false);
        // A unit whose decision did not come is owed by the next step's first.
        link.owed = !got.decided && result.is_ok();
        let result = result.and_then(|()| self.after_step(&mut link, &mut got));
        match result {
            Err(e @ BackendError::Crashed(_)) => {
                self.orphan = Some(link.orphan());
                Err(e)
            }
            other => {
                let stashed = link.error.take();
                self.link = Some(link);
                other?;
                match stashed {
                    Some(e) if got.piece.audio.is_empty() && got.piece.text.is_empty() => Err(e),
                    Some(e) => {
                        self.link.as_mut().expect("just put back").error = Some(e);
                        Ok(got.piece)
                    }
                    None => Ok(got.piece),
                }
            }
        }
    }

    /// What a step sends back once it has its events: the voice it hands on counts as played,
    /// and the server's journal of the events received is trimmed now and then. A server that
    /// has said nothing for [`SILENT_FOR`] while units were sent is taken as gone.
    fn after_step(&self, link: &mut Link, got: &mut Collected) -> Result<(), BackendError> {
        if let Some((id, samples)) = got.played.take()
            && let Err(e) = link.send(wire::playback_ack(&id, samples / 24))
        {
            return Err(self.lost("playback.ack", e));
        }
        if link.seq >= link.acked + ACK_EVERY {
            link.send(wire::event_ack(link.seq)).map_err(|e| self.lost("session.event_ack", e))?;
            link.acked = link.seq;
        }
        let silent = link.heard_at.elapsed();
        if silent > SILENT_FOR {
            let why = format!("nothing from the server for {:.0} s while units were sent", silent.as_secs_f64());
            return Err(self.lost("step", why));
        }
        Ok(())
    }

    /// One server event into the step's piece.
    fn absorb(&self, link: &mut Link, got: &mut Collected, event: Event) -> Result<(), BackendError> {
        match event {
            // Begun before a cancel that named no response: that cancel is for it.
            Event::ResponseCreated { id } if link.cancelling_unknown => link.forget(id),
            Event::ResponseCreated { id } => link.speaking = Some(Speaking { id, sent_samples: 0 }),
            Event::Audio { response_id, samples, end_of_turn } if !link.is_cancelled(&response_id) => {
                if let Some(s) = link.speaking.as_mut().filter(|s| s.id == response_id) {
                    s.sent_samples += samples.len() as u64;
                    got.played = Some((s.id.clone(), s.sent_samples));
                }
                got.piece.kind = StepKind::Speak;
                got.piece.audio.extend_from_slice(&samples);
                got.piece.end_of_turn |= end_of_turn;
                got.voice_without_words = true;
            }
            Event::Text { response_id, text } if !link.is_cancelled(&response_id) => {
                if !text.is_empty() {
                    got.piece.kind = StepKind::Speak;
                    got.piece.text.push_str(&text);
                }
                got.voice_without_words = false;
                got.decision(link);
            }
            // A cancelled response's words: still the decision of their unit.
            Event::Audio { .. } => {}
            Event::Text { .. } => got.decision(link),
            Event::Listen { response_id } => {
                // With a response: its end (the model listens again).
                if let Some(id) = response_id
                    && !link.is_cancelled(&id)
                    && got.piece.kind == StepKind::Speak
                {
                    got.piece.end_of_turn = true;
                }
                got.decision(link);
            }
            Event::Done { id, status, reason } => {
                if link.speaking.as_ref().is_some_and(|s| s.id == id) {
                    link.speaking = None;
                }
                if status == "cancelled" {
                    link.cancelling_unknown = false;
                }
                match status.as_str() {
                    "failed" => {
                        let e = BackendError::Inference(format!("vLLM-Omni: the answer failed ({reason})"));
                        if got.piece.audio.is_empty() && got.piece.text.is_empty() {
                            return Err(e);
                        }
                        link.error = Some(e);
                    }
                    "cancelled" => {}
                    _ if !link.is_cancelled(&id) && got.piece.kind == StepKind::Speak => got.piece.end_of_turn = true,
                    _ => {}
                }
                // Not a unit's decision: it follows the last piece, or answers a cancel.
            }
            Event::Cleared => link.cancelling_unknown = false,
            Event::Error { code, message } if OWN_ERRORS.contains(&code.as_str()) => {
                if code == "response_not_active" {
                    link.cancelling_unknown = false;
                }
                log::debug!("worker {}: vLLM-Omni: {message} ({code})", self.name);
            }
            Event::Error { code, message } => {
                // Errors do not end a vLLM-Omni session: the step (or the next) tells it.
                let e = BackendError::Inference(format!("vLLM-Omni: {message} ({code})"));
                if got.piece.audio.is_empty() && got.piece.text.is_empty() {
                    return Err(e);
                }
                link.error = Some(e);
            }
            Event::Unjournaled { reason } => {
                // Only a lost connection's session can no longer be taken back to be closed.
                log::warn!(
                    "worker {}: vLLM-Omni keeps no more events of session {} for a resume ({reason})",
                    self.name,
                    link.session_id
                );
            }
            Event::Ended { kind, reason } => {
                return Err(
                    self.lost("session", format!("the server ended session {} ({kind}: {reason})", link.session_id))
                );
            }
            Event::Created { .. } | Event::Resumed | Event::Other => {}
        }
        Ok(())
    }
}
