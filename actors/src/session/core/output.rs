//! What the worker's BackendActor says to a session, and how it reaches the client: the
//! worker taken (`session.queue_done`), the session prepared (`session.created`), duplex
//! steps and turn-mode answers routed by the session's [`Flow`](crate::session::flow::Flow),
//! and the endings the backend decides (context full, backend failure).

use std::time::Instant;

use super::SessionCore;
use crate::domain::{BackendInfo, StepOutcome, TurnPiece, TurnSummary};
use crate::edge::backend::BackendError;
use crate::edge::client::Notice;
use crate::messages::worker::BackendEvent;
use crate::observe::metrics;
use crate::observe::{Output, SessionEvent};
use crate::protocol::{CloseReason, Outbound, ProtocolError};
use crate::session::state::Phase;

impl SessionCore {
    /// What the session's worker says.
    pub fn backend(&mut self, event: BackendEvent) {
        self.on_backend_event(event);
        self.run_work();
    }

    fn on_backend_event(&mut self, event: BackendEvent) {
        if self.end.is_some() {
            return;
        }
        match event {
            BackendEvent::Prepared { prompt_length, backend } if self.state.phase() == Phase::Active => {
                self.setups.took();
                self.emit(Outbound::Reconfigured { prompt_length, backend: &backend })
            }
            BackendEvent::Prepared { prompt_length, backend } => {
                self.setups.took();
                self.created(prompt_length, &backend)
            }
            BackendEvent::PrepareFailed(e) if self.state.phase() == Phase::Active => self.reconfigure_failed(e),
            BackendEvent::NoRoom { reason } if self.state.phase() == Phase::Initializing => self.reseat(&reason),
            BackendEvent::NoRoom { reason } => {
                log::error!("session {}: worker {} lost its slot: {reason}", self.who(), self.worker_name());
                self.finish(CloseReason::BackendError(reason));
            }
            BackendEvent::PrepareFailed(e) => {
                self.state.init_failed();
                self.setups.refused();
                match e {
                    BackendError::ContextFull(_) => self.finish(CloseReason::ContextFull),
                    BackendError::InvalidArgument(why) => self.send_error(&ProtocolError::InvalidPayload(why)),
                    BackendError::Unsupported(why) => self.send_error(&ProtocolError::ServiceUnavailable(why)),
                    other => self.send_error(&ProtocolError::Inference(other.to_string())),
                }
            }
            BackendEvent::Step { seq, result, .. } => self.on_step(seq, result),
            BackendEvent::Dropped { seq } => {
                self.flow.dropped(seq);
                self.links.sinks.publish(SessionEvent::ChunkDropped { seq });
                metrics().chunks_dropped.with_label_values(&self.mode_label()).inc();
                log::debug!("session {}: input_{seq} dropped (client ahead of the worker)", self.who());
            }
            BackendEvent::TurnPiece { seq, piece } => self.on_turn_piece(seq, piece),
            BackendEvent::TurnDone { seq, result } => self.on_turn_done(seq, result),
            BackendEvent::Failed { reason } => {
                log::error!("session {}: worker {} failed: {reason}", self.who(), self.worker_name());
                self.finish(CloseReason::BackendError(reason));
            }
            BackendEvent::Drained => self.finish(CloseReason::ServerShutdown),
            BackendEvent::Attached(Ok(())) if self.reseating => self.attached_again(),
            BackendEvent::Attached(Ok(())) => self.attached(),
            BackendEvent::Attached(Err(e)) => self.attach_failed(e),
        }
    }

    /// The backend refused new settings: one error, and the settings it had are asked again
    /// (the session goes on as it was; the dialect keeps its previous configuration).
    fn reconfigure_failed(&mut self, e: BackendError) {
        if let BackendError::ContextFull(_) = e {
            return self.finish(CloseReason::ContextFull);
        }
        let error = match e {
            BackendError::InvalidArgument(why) => ProtocolError::InvalidPayload(why),
            BackendError::Unsupported(why) => ProtocolError::ServiceUnavailable(why),
            other => ProtocolError::Inference(other.to_string()),
        };
        log::warn!(
            "session {}: worker {} refused new settings ({error}); going on with the previous ones",
            self.who(),
            self.worker_name()
        );
        metrics().errors.with_label_values(&[error.code()]).inc();
        if self.links.sinks.wants(crate::observe::Interest::ERRORS) {
            let message = error.to_string();
            self.links.sinks.publish(SessionEvent::Error { code: error.code(), message: &message });
        }
        self.emit(Outbound::ReconfigureFailed(&error));
        if let Some(previous) = self.setups.refused() {
            self.restore(previous);
        }
    }

    fn attached(&mut self) {
        self.state.connected();
        if let Some(admission) = self.links.admission.as_mut() {
            admission.assigned();
        }
        let waited = self.upgraded.elapsed();
        metrics().queue_wait_seconds.observe(waited.as_secs_f64());
        log::info!(
            "session c{}: worker {} assigned after {} ms",
            self.links.conn,
            self.worker_name(),
            waited.as_millis()
        );
        if let Some(w) = &self.worker {
            self.links.sinks.publish(SessionEvent::Assigned { worker: &w.name, waited });
        }
        self.emit(Outbound::QueueDone);
    }

    /// A worker taken again after the last one had no room ([`SessionCore::reseat`]): no
    /// second `session.queue_done`; the setup is asked again.
    fn attached_again(&mut self) {
        log::info!(
            "session c{}: worker {} assigned after {} ms",
            self.links.conn,
            self.worker_name(),
            self.upgraded.elapsed().as_millis()
        );
        if let Some(w) = &self.worker {
            self.links.sinks.publish(SessionEvent::Assigned { worker: &w.name, waited: self.upgraded.elapsed() });
        }
        self.prepare_again();
    }

    fn created(&mut self, prompt_length: u64, backend: &BackendInfo) {
        self.state.created();
        let dialect = self.dialect.name();
        self.active_as = Some(dialect);
        metrics()
            .sessions_active
            .with_label_values(&[self.settings.mode.as_str(), dialect, self.links.client.transport])
            .inc();
        self.links.registry.set_active(self.settings.mode, true);
        let session_id = self.session_id.clone().unwrap_or_default();
        let queue_wait_ms = self.upgraded.elapsed().as_millis() as u64;
        let kind = self.settings.mode.session_kind();
        self.emit(Outbound::Created { session_id: &session_id, kind, prompt_length, queue_wait_ms, backend });
        self.notice(Notice::Created { session_id: session_id.clone() });
    }

    fn on_step(&mut self, seq: u64, result: Result<StepOutcome, BackendError>) {
        let outcome = match result {
            Ok(o) => o,
            Err(BackendError::ContextFull(why)) => {
                log::info!("session {}: context full ({why})", self.who());
                return self.context_full();
            }
            Err(e) => {
                log::warn!("session {}: step for input_{seq} failed on worker {}: {e}", self.who(), self.worker_name());
                return self.send_error(&ProtocolError::Inference(e.to_string()));
            }
        };
        let input_id = format!("input_{seq}");
        let session_id = self.session_id.clone().unwrap_or_default();
        if let Some(text) = &outcome.transcript {
            // What the user said stands whatever becomes of the answer.
            self.links.sinks.publish(SessionEvent::Output(Output::Transcript { seq, text }));
            let event = Outbound::Transcript { session_id: &session_id, input_id: &input_id, response_id: None, text };
            self.emit(event);
        }
        let Some(route) = self.flow.step(seq, outcome.kind, outcome.end_of_turn) else {
            // Speech computed before a force-listen: never sent.
            log::debug!("session {}: discarding speech for input_{seq} after force_listen", self.who());
            return;
        };
        metrics().chunks_answered.with_label_values(&self.mode_label()).inc();
        if route.starts_turn
            && !outcome.audio.is_empty()
            && let Some(at) = route.arrived
        {
            let mode = self.mode_label();
            metrics().first_audio_seconds.with_label_values(&mode).observe(at.elapsed().as_secs_f64());
        }
        let response_id = route.response_id;
        self.links.sinks.publish(SessionEvent::Output(Output::Step {
            seq,
            kind: outcome.kind,
            text: &outcome.text,
            audio_samples: outcome.audio.len(),
            end_of_turn: outcome.end_of_turn,
            kv_length: outcome.kv_length,
        }));
        self.emit(Outbound::Step {
            session_id: &session_id,
            response_id: response_id.as_deref(),
            input_id: &input_id,
            outcome: &outcome,
        });
        if let Some(at) = route.arrived {
            metrics().chunk_latency_seconds.with_label_values(&self.mode_label()).observe(at.elapsed().as_secs_f64());
        }
        if outcome.kv_length >= self.settings.context_tokens {
            log::info!("session {}: KV length {} reached the context limit", self.who(), outcome.kv_length);
            self.context_full();
        }
    }

    fn on_turn_piece(&mut self, seq: u64, piece: TurnPiece) {
        let session_id = self.session_id.clone().unwrap_or_default();
        let mode = self.mode_label();
        let Some(answer) = self.flow.turn_answer(seq) else { return };
        if !piece.audio.is_empty() && !answer.heard_audio {
            answer.heard_audio = true;
            metrics().first_audio_seconds.with_label_values(&mode).observe(answer.submitted.elapsed().as_secs_f64());
        }
        answer.text.push_str(&piece.text);
        let input_id = format!("input_{seq}");
        let audio_samples = piece.audio.len();
        self.links.sinks.publish(SessionEvent::Output(Output::TurnPiece { seq, text: &piece.text, audio_samples }));
        if let Some(text) = &piece.transcript {
            self.links.sinks.publish(SessionEvent::Output(Output::Transcript { seq, text }));
            let Some(answer) = self.flow.turn_answer(seq) else { return };
            let response_id = answer.response_id.clone();
            let event = Outbound::Transcript {
                session_id: &session_id,
                input_id: &input_id,
                response_id: Some(&response_id),
                text,
            };
            self.emit(event);
        }
        let Some(answer) = self.flow.turn_answer(seq) else { return };
        if answer.streaming {
            let response_id = answer.response_id.clone();
            self.emit(Outbound::TurnDelta {
                session_id: &session_id,
                response_id: &response_id,
                input_id: &input_id,
                text: &piece.text,
                audio: &piece.audio,
                kv_length: piece.kv_length,
                generate_us: piece.generate_us,
                call: piece.call.as_ref(),
            });
        } else {
            answer.audio.extend_from_slice(&piece.audio);
        }
    }

    fn on_turn_done(&mut self, seq: u64, result: Result<TurnSummary, BackendError>) {
        let Some(answer) = self.flow.turn_done(seq) else { return };
        let (summary, cancelled) = match result {
            Ok(summary) => (summary, false),
            Err(BackendError::Interrupted) => {
                let duration = Instant::now().saturating_duration_since(answer.submitted);
                (TurnSummary { duration, ..TurnSummary::default() }, true)
            }
            Err(BackendError::ContextFull(why)) => {
                log::info!("session {}: context full in answer {} ({why})", self.who(), answer.response_id);
                return self.context_full();
            }
            Err(e) => {
                log::warn!("session {}: answer {} failed: {e}", self.who(), answer.response_id);
                let error = ProtocolError::Inference(e.to_string());
                self.count_error(&error);
                return self.emit(Outbound::TurnFailed { response_id: &answer.response_id, error: &error });
            }
        };
        let session_id = self.session_id.clone().unwrap_or_default();
        self.links.sinks.publish(SessionEvent::Output(Output::TurnDone {
            seq,
            text: &answer.text,
            input_tokens: summary.input_tokens,
            output_tokens: summary.output_tokens,
            cancelled,
        }));
        let audio = (!answer.streaming && !answer.audio.is_empty()).then_some(answer.audio.as_slice());
        self.emit(Outbound::TurnDone {
            session_id: &session_id,
            response_id: &answer.response_id,
            text: &answer.text,
            audio,
            input_tokens: summary.input_tokens,
            output_tokens: summary.output_tokens,
            input_audio_tokens: summary.input_audio_tokens,
            output_audio_tokens: summary.output_audio_tokens,
            kv_length: summary.kv_length,
            duration_ms: summary.duration.as_millis() as u64,
            cancelled,
        });
        if summary.kv_length >= self.settings.context_tokens {
            self.context_full();
        }
    }

    /// The backend's context is full: the session goes on if its dialect makes room (its
    /// commands follow), else it ends with `context_full`.
    fn context_full(&mut self) {
        let mut out = self.take_outbox();
        let goes_on = self.dialect.context_full(&mut out);
        self.absorb(&mut out);
        self.outbox = out;
        if goes_on {
            metrics().context_evictions.inc();
            log::info!(
                "session {}: context full on worker {}: the conversation was cut and replayed",
                self.who(),
                self.worker_name()
            );
        } else {
            self.finish(CloseReason::ContextFull);
        }
    }
}
