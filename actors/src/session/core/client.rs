//! The session and its client: what the client's edge hands it (its messages through the
//! dialect, its voice, its keys, a call's settings, what it heard, how its connection ended),
//! what the client hears (encoded by the dialect, recorded, numbered for a resume), and the
//! commands that follow (to the queue, the worker, the recogniser).

use std::time::Instant;

use bytestring::ByteString;

use super::{Effect, SessionCore, ToWorker};
use crate::edge::client::{CallSettings, CallerAudio, FromClient, Keypress, ModelAudio, Notice, Playback, ToClient};
use crate::edge::dialect::{DecodeError, Emit, Outbox, Voiced};
use crate::edge::redact::RecordedMedia;
use crate::messages::queue::QueueNotice;
use crate::observe::metrics;
use crate::observe::{Interest, SessionEvent};
use crate::protocol::{CloseReason, Inbound, Outbound, ProtocolError, Violation, bounded};
use crate::session::registry::Labels;
use crate::session::resume;
use crate::session::state::Phase;
use crate::session::{MAX_CLOSE_REASON, MAX_REFUSED_RECORDED};

impl SessionCore {
    /// What the client's edge hands the session, on line `line`: heard only from its current
    /// line (a line it has left, on a resume, is not its client's now).
    pub fn client(&mut self, line: u64, msg: FromClient) {
        if self.end.is_some() || line != self.line_no {
            return;
        }
        match msg {
            FromClient::Text(text) => self.handle_text(text),
            FromClient::Audio(audio) => self.handle_audio(audio),
            FromClient::Key(key) => self.handle_key(key),
            FromClient::Configure(settings) => self.handle_configure(settings),
            FromClient::Playback(playback) => self.handle_playback(playback),
            FromClient::Refused(e) => self.send_error(&e),
            FromClient::Ended(reason) => {
                // The edge has closed the connection: nothing more reaches the client.
                log::debug!("session {}: its connection ended ({})", self.who(), reason.as_str());
                self.end_untold(reason);
            }
            FromClient::Lost(reason) => self.lose(reason, Instant::now()),
        }
        self.run_work();
    }

    /// The decider's answer about a user turn.
    pub fn decided(&mut self, id: u64, result: &Result<crate::domain::Decision, crate::domain::DeciderError>) {
        if self.end.is_some() {
            return;
        }
        self.emit(Outbound::Decided { id, result });
        self.run_work();
    }

    /// The gateway's transcript of a user item (`Ok`), or why there is none.
    pub fn transcribed(&mut self, item_id: &str, result: Result<&str, &str>) {
        if self.end.is_some() {
            return;
        }
        self.emit(Outbound::UserTranscript { item_id, result });
        self.run_work();
    }

    /// Encodes an event, sends what the dialect made of it, and records it as sent. While
    /// the client is away the model's voice is left out of it (and counted), and a new place
    /// in the queue is only remembered.
    pub(super) fn emit(&mut self, event: Outbound<'_>) {
        if let Outbound::Queued(info) | Outbound::QueueUpdate(info) = &event {
            self.last_queue = Some(*info);
        }
        if self.replay.away() {
            return self.emit_while_away(event);
        }
        self.encode_and_send(event);
    }

    /// The outbox for a call of the dialect, saying whether text frames are read now: by the
    /// client's side (a phone line with no app on its call reads none), or by the recording.
    pub(super) fn take_outbox(&mut self) -> Outbox {
        let mut out = std::mem::take(&mut self.outbox);
        out.set_wants_text(self.links.line.wants_text() || self.links.sinks.wants(Interest::WIRE));
        out
    }

    /// A notice of what became of the session, for its edge (while its client is there).
    pub(super) fn notice(&mut self, notice: Notice) {
        if !self.replay.away() {
            self.links.line.tell(ToClient::Notice(notice));
        }
    }

    pub(super) fn encode_and_send(&mut self, event: Outbound<'_>) {
        let mut out = self.take_outbox();
        self.dialect.encode(event, &mut out);
        self.absorb(&mut out);
        self.outbox = out;
    }

    /// An event while the client is away: said without the model's voice, which it would
    /// otherwise hear late as if fresh.
    fn emit_while_away(&mut self, event: Outbound<'_>) {
        match event {
            Outbound::QueueUpdate(_) => {}
            Outbound::Step { session_id, response_id, input_id, outcome } if !outcome.audio.is_empty() => {
                self.replay.skip_voice(outcome.audio.len());
                let quiet = crate::domain::StepOutcome { audio: Vec::new(), ..outcome.clone() };
                self.encode_and_send(Outbound::Step { session_id, response_id, input_id, outcome: &quiet });
            }
            other => {
                let (quiet, samples) = other.without_voice();
                self.replay.skip_voice(samples);
                self.encode_and_send(quiet);
            }
        }
    }

    /// What a call of the dialect made, in order: its words and the model's voice sent now,
    /// the commands it issued queued behind the work at hand; `out` is empty afterwards.
    pub(super) fn absorb(&mut self, out: &mut Outbox) {
        for item in out.drain() {
            match item {
                Emit::Text(frame) => self.send_frame(ByteString::from(frame)),
                Emit::Voiced(voiced) => self.send_voiced(voiced),
                Emit::Audio(audio) => self.send_audio(audio),
                Emit::Command(cmd) => self.work.push_back(cmd),
            }
        }
    }

    /// A message for the client: recorded, numbered and kept on its line (the session's
    /// first carries its resume token, which the recording never sees), and sent unless the
    /// client is away.
    fn send_frame(&mut self, frame: ByteString) {
        self.record_out(frame.as_bytes().clone());
        // Kept without the token: a message sent again never carries a token already used.
        if self.replay.say(&frame) {
            let frame = match self.token_first.take() {
                Some(token) => resume::with_token(&frame, &token),
                None => frame,
            };
            self.links.line.tell(ToClient::Text(frame));
        }
    }

    /// A message carrying the model's voice: recorded and numbered like any, but kept on its
    /// line without the voice (a resumed client is not sent it late).
    fn send_voiced(&mut self, voiced: Voiced) {
        let send = self.replay.say_voiced(voiced.samples, || voiced.quiet());
        let frame = ByteString::from(voiced.text);
        self.record_out(frame.as_bytes().clone());
        if send {
            let frame = match self.token_first.take() {
                Some(token) => resume::with_token(&frame, &token),
                None => frame,
            };
            self.links.line.tell(ToClient::Text(frame));
        }
    }

    /// A message for the client, to the wire's subscribers (the recording).
    pub(super) fn record_out(&mut self, frame: bytes::Bytes) {
        if self.links.sinks.wants(Interest::WIRE) {
            self.links.sinks.publish(SessionEvent::WireOut { frame: &frame, audio: None });
        }
    }

    /// The model's voice to an edge that carries audio; recorded as a `model.audio` event.
    fn send_audio(&mut self, audio: ModelAudio) {
        if self.links.sinks.wants(Interest::WIRE)
            && let ModelAudio::Delta { response, samples, rate } = &audio
        {
            let frame = serde_json::json!({"type": "model.audio", "response_id": response, "rate": rate, "audio": ""});
            let bytes = bytes::Bytes::from(frame.to_string());
            self.links.sinks.publish(SessionEvent::WireOut { frame: &bytes, audio: Some(samples) });
        }
        if !self.replay.away() {
            self.links.line.tell(ToClient::Audio(audio));
        } else if let ModelAudio::Delta { samples, rate, .. } = &audio {
            self.replay.skip_voice(samples.len() * 24_000 / (*rate).max(1) as usize);
        }
    }

    /// An error for the client; one that refuses the session ends it.
    pub(super) fn send_error(&mut self, e: &ProtocolError) {
        self.count_error(e);
        self.emit(Outbound::Error(e));
        self.notice(Notice::Error(e.clone()));
        if let Some(reason) = CloseReason::rejected(e) {
            self.finish(reason);
        }
    }

    /// An error the client is about to hear: logged, counted, and told the subscribers.
    pub(super) fn count_error(&mut self, e: &ProtocolError) {
        log::debug!("session {}: error {}: {e}", self.who(), e.code());
        metrics().errors.with_label_values(&[e.code()]).inc();
        if self.links.sinks.wants(Interest::ERRORS) {
            let message = e.to_string();
            self.links.sinks.publish(SessionEvent::Error { code: e.code(), message: &message });
        }
    }

    /// The caller's voice, from an edge that carries audio.
    fn handle_audio(&mut self, audio: CallerAudio) {
        let mut replies = self.take_outbox();
        let rate = audio.rate;
        let Some(decoded) = self.decode_with("audio", |dialect| dialect.hear(audio, &mut replies)) else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = self.media_of(&decoded);
            let frame = serde_json::json!({"type": "caller.audio", "rate": rate, "audio": ""});
            let frame = bytes::Bytes::from(frame.to_string());
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies);
        self.outbox = replies;
    }

    /// A key the caller pressed: the dialect's to tell and to carry into the conversation.
    fn handle_key(&mut self, key: Keypress) {
        let mut replies = self.take_outbox();
        let Some(decoded) = self.decode_with("a key", |dialect| dialect.press(key, &mut replies)) else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            // Which key is the recording's to keep (in the dialect's event), not the wire log's.
            let media = self.media_of(&decoded);
            let frame = bytes::Bytes::from_static(br#"{"type":"caller.key"}"#);
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies);
        self.outbox = replies;
    }

    /// A call's settings from its edge: the dialect's to apply as its client's own.
    fn handle_configure(&mut self, settings: CallSettings) {
        let mut replies = self.take_outbox();
        let Some(decoded) = self.decode_with("call settings", |dialect| dialect.configure(settings, &mut replies))
        else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = self.media_of(&decoded);
            let frame = bytes::Bytes::from_static(br#"{"type":"caller.settings"}"#);
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies);
        self.outbox = replies;
    }

    /// What the caller heard of the model's voice: the dialect's to tell its client.
    fn handle_playback(&mut self, playback: Playback) {
        let mut out = self.take_outbox();
        self.dialect.played(playback, &mut out);
        self.absorb(&mut out);
        self.outbox = out;
    }

    /// The media a decoded input brought, for the recording: the dialect's word, else the
    /// audio and images of its commands.
    fn media_of(&mut self, decoded: &Result<Vec<Inbound>, DecodeError>) -> RecordedMedia {
        match (decoded, self.dialect.take_recorded_media()) {
            (_, Some(media)) => media,
            (Ok(commands), None) => recorded_media(commands),
            (Err(_), None) => (Vec::new(), Vec::new()),
        }
    }

    /// Sends what a decode answered and queues its commands (or tells its error).
    fn carry_out(&mut self, decoded: Result<Vec<Inbound>, DecodeError>, replies: &mut Outbox) {
        match decoded {
            Err(DecodeError::Unparseable(why)) => {
                log::info!("session {}: unparseable frame ({why}); closing with 1003", self.who());
                self.finish(CloseReason::ProtocolViolation(Violation::InvalidJson));
            }
            Err(DecodeError::Protocol(e)) => {
                replies.clear();
                self.send_error(&e)
            }
            Ok(commands) => {
                self.absorb(replies);
                // The client's own commands come before those the dialect issued on its own.
                for (i, cmd) in commands.into_iter().enumerate() {
                    self.work.insert(i, cmd);
                }
            }
        }
    }

    /// A whole message from the client.
    fn handle_text(&mut self, text: ByteString) {
        let mut replies = self.take_outbox();
        let Some(decoded) = self.decode_with("a frame", |dialect| dialect.decode(&text, &mut replies)) else {
            return;
        };
        if self.links.sinks.wants(Interest::WIRE) {
            let media = self.media_of(&decoded);
            let frame = match &decoded {
                // A frame the dialect refused is kept whole only when small: a client cannot
                // turn junk into disk writes (what was refused is in the error sent back).
                Err(e) if text.len() > MAX_REFUSED_RECORDED => refused_stub(text.len(), e),
                _ => text.as_bytes().clone(),
            };
            self.links.sinks.publish(SessionEvent::WireIn { frame: &frame, media: &media });
        }
        self.carry_out(decoded, &mut replies);
        self.outbox = replies;
    }

    /// A user item's audio to the gateway's recogniser; without one, the client hears why.
    fn transcribe(&mut self, item_id: String, audio: Vec<f32>) {
        if self.links.transcribes {
            self.effects.push_back(Effect::Transcribe { item_id, audio });
        } else {
            let why = "the model does not transcribe speech and the gateway's transcription is off ([transcription])";
            self.emit(Outbound::UserTranscript { item_id: &item_id, result: Err(why) });
        }
    }

    /// The newest user turn to the decider beside the voice; without one, the client hears why.
    fn decide(&mut self, id: u64, request: Box<crate::domain::DecideRequest>) {
        if self.links.decides {
            self.effects.push_back(Effect::Decide { id, request });
        } else {
            let why = crate::domain::DeciderError::Unavailable(
                "the model calls no tools and no decider is configured ([delegation])".into(),
            );
            self.emit(Outbound::Decided { id, result: &Err(why) });
        }
    }

    /// Asks the backend again for the setup it had, after it refused a new one.
    pub(super) fn restore(&mut self, setup: crate::domain::SessionSetup) {
        if self.worker.is_none() {
            return;
        }
        self.flow.cut();
        self.effects.push_back(Effect::Worker(ToWorker::Reconfigure(setup)));
    }

    /// Carries out one command: the client's, or the dialect's own.
    pub(super) fn command(&mut self, cmd: Inbound) {
        if let Err(e) = self.state.admit(&cmd) {
            return self.send_error(&e);
        }
        if let Inbound::Close { reason } = cmd {
            let reason = reason.map_or_else(|| "user_stop".into(), |r| bounded(&r, MAX_CLOSE_REASON).to_string());
            return self.finish(CloseReason::Client(reason));
        }
        // Everything else is admitted only with a worker attached.
        if self.worker.is_none() || self.draining {
            return;
        }
        let now = Instant::now();
        match cmd {
            Inbound::Close { .. } => {}
            Inbound::Init(setup) => self.init(setup),
            Inbound::Chunk(chunk) => {
                let seq = self.flow.chunk(chunk.force_listen, now);
                metrics().chunks_received.with_label_values(&self.mode_label()).inc();
                let (samples, frames) = (chunk.audio.len(), chunk.frames.len());
                self.links.sinks.publish(SessionEvent::ChunkReceived { seq, samples, frames });
                self.effects.push_back(Effect::Worker(ToWorker::Chunk(seq, chunk)));
            }
            Inbound::Turn { input, streaming } => match self.flow.turn(streaming, now) {
                Ok((seq, _)) => {
                    let m = &input.messages;
                    self.links.sinks.publish(SessionEvent::TurnReceived {
                        seq,
                        messages: m.len(),
                        samples: m.iter().flat_map(|m| &m.audios).map(Vec::len).sum(),
                        images: m.iter().map(|m| m.images.len()).sum(),
                    });
                    self.effects.push_back(Effect::Worker(ToWorker::Turn(seq, input)));
                }
                Err(e) => {
                    metrics().buffer_refusals.with_label_values(&["turns"]).inc();
                    self.send_error(&e)
                }
            },
            Inbound::Reconfigure(setup) => {
                // Output of everything sent so far is void.
                self.flow.cut();
                self.setups.asked(setup.clone());
                self.effects.push_back(Effect::Worker(ToWorker::Reconfigure(setup)));
            }
            Inbound::Interrupt => {
                self.flow.cut();
                self.effects.push_back(Effect::Worker(ToWorker::Interrupt));
            }
            Inbound::Transcribe { item_id, audio } => self.transcribe(item_id, audio),
            Inbound::Decide { id, request } => self.decide(id, request),
        }
    }

    /// The client initialises: the session gets its id and its backend its setup.
    fn init(&mut self, setup: crate::domain::SessionSetup) {
        let session_id = self.dialect.new_session_id();
        let dialect = self.dialect.name();
        log::info!(
            "session {session_id}: c{} ({} mode, {dialect} dialect, {}) initialising on worker {}",
            self.links.conn,
            self.settings.mode,
            self.links.client.addr,
            self.worker_name()
        );
        let redactor = self.dialect.redactor();
        self.links.sinks.publish(SessionEvent::Started { session_id: &session_id, dialect, redactor: &redactor });
        self.session_id = Some(session_id.clone());
        self.state.initializing();
        self.setups.asked(setup.clone());
        let transport = self.links.client.transport;
        self.links.registry.label(self.links.conn, Labels { session_id, dialect, transport });
        self.effects.push_back(Effect::Worker(ToWorker::Prepare(setup)));
    }

    pub(super) fn on_queue_notice(&mut self, notice: QueueNotice) {
        if self.end.is_some() {
            return;
        }
        match notice {
            QueueNotice::Queued(info) if self.reseating => {
                log::info!(
                    "session c{}: waiting again at position {} of {}",
                    self.links.conn,
                    info.position,
                    info.queue_length
                );
            }
            QueueNotice::Queued(info) => {
                log::info!(
                    "session c{}: waiting at position {} of {}",
                    self.links.conn,
                    info.position,
                    info.queue_length
                );
                self.links.sinks.publish(SessionEvent::Queued { position: info.position });
                self.emit(Outbound::Queued(info));
                self.notice(Notice::Queued(info));
            }
            QueueNotice::Update(info) => {
                if self.state.phase() == Phase::Queued && self.worker.is_none() {
                    self.emit(Outbound::QueueUpdate(info));
                }
            }
            QueueNotice::Assigned { worker, .. } => {
                self.effects.push_back(Effect::Claim);
                self.worker = Some(worker);
                self.attach_sent = true;
                // If the worker's actor is gone, the attach's delivery answers for it.
                self.effects.push_back(Effect::Worker(ToWorker::Attach));
            }
            QueueNotice::Rejected(e) => {
                log::info!("session c{}: refused: {e}", self.links.conn);
                self.send_error(&e);
            }
            QueueNotice::Cancelled => {
                log::info!("session c{}: ticket cancelled by an operator", self.links.conn);
                self.finish(CloseReason::Cancelled);
            }
        }
    }

    /// Its worker had no room for the first setup (see `reseating`): back to the head of the
    /// queue, as many times as it takes (each time the worker is retried with backoff).
    pub(super) fn reseat(&mut self, reason: &str) {
        log::warn!(
            "session c{}: worker {} has no room for it now ({reason}); back to the head of the queue",
            self.links.conn,
            self.worker_name()
        );
        self.worker = None;
        self.attach_sent = false;
        self.reseating = true;
        self.effects.push_back(Effect::Join { front: true });
    }

    /// A worker took a session whose setup the last one had no room for: it is asked the same.
    pub(super) fn prepare_again(&mut self) {
        self.reseating = false;
        if self.draining || self.worker.is_none() {
            return;
        }
        let Some(setup) = self.setups.pending().cloned() else { return };
        log::info!("session c{}: asking worker {} for its setup", self.links.conn, self.worker_name());
        self.effects.push_back(Effect::Worker(ToWorker::Prepare(setup)));
    }

    /// The worker it was assigned could not be taken: once, the session goes back to the
    /// head of the queue; a second time, it ends with the error (close 1013). A session waiting
    /// again because its last worker had no room goes back each time.
    pub(super) fn attach_failed(&mut self, e: ProtocolError) {
        let worker = self.worker_name().to_string();
        self.worker = None;
        self.attach_sent = false;
        if self.reseating || (!self.requeued && self.state.phase() == Phase::Queued) {
            self.requeued |= !self.reseating;
            log::warn!(
                "session c{}: worker {worker} could not be taken ({e}); back to the head of the queue",
                self.links.conn
            );
            self.effects.push_back(Effect::Join { front: true });
            return;
        }
        log::warn!("session c{}: worker {worker} could not be taken ({e})", self.links.conn);
        self.send_error(&e);
    }
}

/// What the wire's subscribers get of a refused frame over [`MAX_REFUSED_RECORDED`]: its size
/// and why it was refused, as an event of type `unrecorded`.
fn refused_stub(bytes: usize, why: &DecodeError) -> bytes::Bytes {
    let code = match why {
        DecodeError::Unparseable(_) => "invalid_json",
        DecodeError::Protocol(e) => e.code(),
    };
    serde_json::json!({"type": "unrecorded", "bytes": bytes, "refused": code}).to_string().into()
}

/// The audio and images a client event carried, for the recording.
fn recorded_media(commands: &[Inbound]) -> RecordedMedia {
    let (mut audio, mut frames) = (Vec::new(), Vec::new());
    for cmd in commands {
        match cmd {
            Inbound::Chunk(c) => {
                audio.push(c.audio.clone());
                frames.extend(c.frames.iter().cloned());
            }
            Inbound::Turn { input, .. } => {
                for m in &input.messages {
                    audio.extend(m.audios.iter().cloned());
                    frames.extend(m.images.iter().cloned());
                }
            }
            Inbound::Init(_)
            | Inbound::Close { .. }
            | Inbound::Reconfigure(_)
            | Inbound::Interrupt
            | Inbound::Transcribe { .. }
            | Inbound::Decide { .. } => {}
        }
    }
    (audio, frames)
}
