//! The model's responses: one in progress at a time, opened by the duplex model's decision to
//! speak (server VAD) or by the client (manual turns, a turn-mode answer on the items since
//! the last one), written piece by piece, and closed complete, cut short or failed, with the
//! tokens it cost.

use std::collections::VecDeque;
use std::time::Instant;

use omni_actors::domain::{ChatMessage, Generation, Role, StepKind, StepOutcome, TurnInput};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{Inbound, ProtocolError};

use super::events::{Event, NewItem, ResponseRequest, ResponseStatus, ResponseView, Usage};
use super::held::{Counted, Weigh};
use super::items::{Item, ItemStatus, Part};
use super::{Driver, OUTPUT_RATE};

/// A response in progress.
#[derive(Debug)]
pub struct Response {
    pub id: String,
    pub item_id: String,
    /// Its output item and content part were announced (its first piece came).
    opened: bool,
    /// From the duplex model (server VAD) rather than a turn-mode answer.
    pub duplex: bool,
    audio: bool,
    text: String,
    tokens: Tokens,
    /// When the duplex model's last step of it came.
    pub last_step: Instant,
}

/// The tokens of one response as the backend counted them, and the audio it heard and spoke
/// (for a backend that does not count audio tokens).
#[derive(Debug, Clone, Copy, Default)]
struct Tokens {
    input: u64,
    output: u64,
    input_audio: u64,
    output_audio: u64,
    input_samples: u64,
    output_samples: u64,
}

/// A turn-mode answer asked for and not yet done.
#[derive(Debug)]
pub struct Turn {
    /// The response it belongs to; `None` once cancelled.
    pub response: Option<String>,
    /// The user item whose audio it answers, waiting for its transcript.
    pub transcript_item: Option<String>,
    /// 16 kHz samples of audio in its messages.
    input_samples: u64,
}

#[derive(Default)]
pub struct Responses {
    pub current: Option<Response>,
    /// Turn-mode answers asked for and not yet done, oldest first (the backend answers in order).
    pub turns: VecDeque<Turn>,
    /// Manual turns: the messages of the items not yet answered.
    pub pending: Counted<ChatMessage>,
    /// Manual turns: the newest user item with audio not yet answered.
    pub audio_item: Option<String>,
}

impl Driver {
    /// A message item the client wrote: kept for the next answer, added to the conversation.
    pub(super) fn create_item(&mut self, item: NewItem) -> Result<(), ProtocolError> {
        let NewItem { id, message, parts } = item;
        self.admit("conversation.item.create", "items", message.weight())?;
        let item_id = id.unwrap_or_else(|| self.conversation.new_item_id());
        if message.role == Role::User && !message.audios.is_empty() {
            self.responses.audio_item = Some(item_id.clone());
        }
        let item = Item::message(item_id, message.role, parts);
        self.responses.pending.push(message);
        let previous_item_id = self.conversation.push(item.clone());
        self.say(Event::ItemAdded { previous_item_id, item });
        Ok(())
    }

    /// The client asks for an answer: under server VAD the model decides (the gathered audio is
    /// only flushed); in manual turns one turn-mode answer on the items since the last.
    pub(super) fn create_response(&mut self, request: ResponseRequest, now: Instant) -> Result<(), ProtocolError> {
        if self.responses.current.is_some() {
            return Err(ProtocolError::NotReady(
                "a response is already in progress (conversation_already_has_active_response)".into(),
            ));
        }
        if self.setup.conf.vad.is_some() {
            self.flush_step(now);
            return Ok(());
        }
        let audio = request.audio.unwrap_or(self.setup.conf.audio_out);
        if !self.responses.pending.iter().any(|m| m.role == Role::User) {
            return Err(ProtocolError::InvalidPayload(
                "response: there is no new user input to answer (commit audio or create an item)".into(),
            ));
        }
        if self.responses.turns.len() >= self.limits.max_turns {
            metrics().buffer_refusals.with_label_values(&["turns"]).inc();
            return Err(ProtocolError::BufferFull(format!(
                "response.create: {} answers are already in progress or waiting (at most {}, limits.max_pending_turns)",
                self.responses.turns.len(),
                self.limits.max_turns
            )));
        }
        let mut messages = self.responses.pending.take();
        // The newest user audio is the one the answer's transcript will be of.
        let transcript_item = self.responses.audio_item.take().filter(|_| self.setup.conf.transcription.is_some());
        if let Some(extra) = request.instructions.filter(|s| !s.is_empty()) {
            messages.insert(0, ChatMessage::text(Role::System, extra));
        }
        let input_samples = messages.iter().flat_map(|m| &m.audios).map(|a| a.len() as u64).sum();
        let conf = &self.setup.conf;
        let input = TurnInput {
            messages,
            generation: Generation {
                max_new_tokens: conf.max_tokens,
                temperature: conf.temperature.map(|t| t as f32),
                ..Generation::default()
            },
            speech: audio,
            // The items continue the conversation the backend holds.
            continues: true,
            ..TurnInput::default()
        };
        self.start_response(false, audio);
        let response = self.responses.current.as_ref().map(|r| r.id.clone());
        self.responses.turns.push_back(Turn { response, transcript_item, input_samples });
        self.send(Inbound::Turn { input, streaming: true });
        Ok(())
    }

    /// The client cuts the response in progress short.
    pub(super) fn cancel(&mut self) -> Result<(), ProtocolError> {
        let Some(id) = self.responses.current.as_ref().map(|r| r.id.clone()) else {
            return Err(ProtocolError::NotReady(
                "there is no response in progress to cancel (response_cancel_not_active)".into(),
            ));
        };
        for turn in self.responses.turns.iter_mut().filter(|t| t.response.as_deref() == Some(id.as_str())) {
            turn.response = None;
        }
        self.finish_response(ResponseStatus::Cancelled, Some("client_cancelled"));
        self.commands.push(Inbound::Interrupt);
        self.events.push(Event::VoiceCleared);
        Ok(())
    }

    /// Opens a response: the duplex model's first closes the user's turn.
    fn start_response(&mut self, duplex: bool, audio: bool) {
        if duplex {
            self.model_takes_the_floor();
        }
        let r = Response {
            id: self.conversation.new_response_id(),
            item_id: self.conversation.new_item_id(),
            opened: false,
            duplex,
            audio,
            text: String::new(),
            tokens: Tokens::default(),
            last_step: Instant::now(),
        };
        let view = self.view(&r, ResponseStatus::InProgress, None, Vec::new());
        self.say(Event::ResponseCreated(view));
        self.responses.current = Some(r);
    }

    /// Output item, conversation item and content part, before the first piece.
    fn open_response(&mut self) {
        let Some(r) = self.responses.current.as_mut() else { return };
        if r.opened {
            return;
        }
        r.opened = true;
        let (response_id, item_id, audio) = (r.id.clone(), r.item_id.clone(), r.audio);
        let item = Item::answer(item_id.clone(), ItemStatus::InProgress, audio, None);
        let previous_item_id = self.conversation.push(item.clone());
        self.say(Event::OutputItemAdded { response_id: response_id.clone(), item: item.clone() });
        self.say(Event::ItemAdded { previous_item_id, item });
        self.say(Event::ContentPartAdded { response_id, item_id, audio });
    }

    /// A piece of the answer: its text (or its voice's transcript) and its voice.
    fn delta(&mut self, text: &str, audio: &[f32]) {
        self.open_response();
        let Some(r) = self.responses.current.as_mut() else { return };
        r.text.push_str(text);
        r.tokens.output_samples += audio.len() as u64;
        let (response_id, item_id, spoken) = (r.id.clone(), r.item_id.clone(), r.audio);
        if !text.is_empty() {
            let delta = text.to_string();
            self.say(Event::TextDelta {
                response_id: response_id.clone(),
                item_id: item_id.clone(),
                audio: spoken,
                delta,
            });
        }
        if spoken && !audio.is_empty() {
            self.say(Event::AudioDelta { response_id, item_id, samples: audio.to_vec() });
        }
    }

    /// Closes the response in progress with its done events.
    pub(super) fn finish_response(&mut self, status: ResponseStatus, reason: Option<&'static str>) {
        let Some(r) = self.responses.current.take() else { return };
        let item_status =
            if status == ResponseStatus::Completed { ItemStatus::Completed } else { ItemStatus::Incomplete };
        let mut output = Vec::new();
        let (response_id, item_id) = (r.id.clone(), r.item_id.clone());
        if r.opened {
            if r.audio {
                self.events.push(Event::VoiceDone { response_id: response_id.clone() });
                self.say(Event::AudioDone { response_id: response_id.clone(), item_id: item_id.clone() });
            }
            let text = r.text.clone();
            self.say(Event::TextDone {
                response_id: response_id.clone(),
                item_id: item_id.clone(),
                audio: r.audio,
                text,
            });
            let item = Item::answer(item_id.clone(), item_status, r.audio, Some(&r.text));
            if let Some(kept) = self.conversation.get_mut(&item_id) {
                *kept = item.clone();
            }
            let part = Part::Answer { audio: r.audio, text: r.text.clone() };
            self.say(Event::ContentPartDone { response_id: response_id.clone(), item_id, part });
            self.say(Event::OutputItemDone { response_id, item: item.clone() });
            self.say(Event::ItemDone { item: item.clone() });
            output.push(item);
        } else {
            self.events.push(Event::VoiceDone { response_id });
        }
        let view = self.view(&r, status, reason, output);
        self.say(Event::ResponseDone(view));
    }

    /// A response as the client sees it.
    fn view(
        &self,
        r: &Response,
        status: ResponseStatus,
        reason: Option<&'static str>,
        output: Vec<Item>,
    ) -> Box<ResponseView> {
        Box::new(ResponseView {
            id: r.id.clone(),
            status,
            reason,
            output,
            usage: (status != ResponseStatus::InProgress).then(|| self.usage(&r.tokens)),
            audio: r.audio,
            voice: self.setup.conf.voice.clone(),
            conversation_id: self.life.session_id.clone(),
        })
    }

    /// The response's tokens: text and audio apart, as the backend counted them, or for a
    /// backend that does not count audio, 25 tokens per second of audio heard and spoken.
    /// Output tokens are text and speech together.
    fn usage(&self, t: &Tokens) -> Usage {
        let counted = self.life.backend.as_ref().is_some_and(|b| b.token_details);
        let (input_audio, output_audio) = if counted {
            (t.input_audio, t.output_audio)
        } else {
            ((t.input_samples * 25 / 16000).min(t.input), t.output_samples * 25 / OUTPUT_RATE as u64)
        };
        Usage { input: t.input, input_audio, output: t.output + output_audio, output_text: t.output, output_audio }
    }

    /// One duplex step's outcome: the model listens (its answer is complete) or speaks (a piece
    /// of its answer, opened at its first).
    pub fn step(&mut self, outcome: &StepOutcome) {
        let heard = self.pacer.take_sent();
        match outcome.kind {
            StepKind::Listen => {
                if self.responses.current.as_ref().is_some_and(|r| r.duplex) {
                    self.finish_response(ResponseStatus::Completed, None);
                }
            }
            StepKind::Speak => {
                if self.responses.current.is_none() {
                    let audio = self.setup.conf.audio_out;
                    self.start_response(true, audio);
                }
                if let Some(r) = self.responses.current.as_mut() {
                    r.tokens.input += outcome.input_tokens as u64;
                    r.tokens.output += outcome.output_tokens as u64;
                    r.tokens.input_audio += outcome.input_audio_tokens as u64;
                    r.tokens.output_audio += outcome.output_audio_tokens as u64;
                    // The audio this step answered: what was sent since the step before.
                    r.tokens.input_samples += heard;
                    r.last_step = Instant::now();
                }
                self.delta(&outcome.text, &outcome.audio);
                if outcome.end_of_turn {
                    self.finish_response(ResponseStatus::Completed, None);
                }
            }
        }
        // The backend's pace: while it speaks and the client is silent, step on silence.
        let now = Instant::now();
        if self.responses.current.as_ref().is_some_and(|r| r.duplex) && self.intake.client_idle(now) {
            self.pad_step(now);
        }
    }

    /// A piece of a turn-mode answer.
    pub fn turn_delta(&mut self, text: &str, audio: &[f32]) {
        let owner = self.responses.turns.front().and_then(|t| t.response.clone());
        if self.turn_is_current(owner) {
            self.delta(text, audio);
        }
    }

    /// A turn-mode answer is done (or was cut short), with the tokens it cost.
    pub fn turn_done(&mut self, tokens: [u32; 4], cancelled: bool) {
        let [input_tokens, output_tokens, input_audio_tokens, output_audio_tokens] = tokens;
        let turn = self.responses.turns.pop_front();
        if let Some(item) = turn.as_ref().and_then(|t| t.transcript_item.clone()).filter(|_| !cancelled) {
            self.transcribed(&item, None);
        }
        let input_samples = turn.as_ref().map_or(0, |t| t.input_samples);
        if self.turn_is_current(turn.and_then(|t| t.response))
            && let Some(r) = self.responses.current.as_mut()
        {
            r.tokens.input_samples = input_samples;
            r.tokens.input = input_tokens as u64;
            r.tokens.output = output_tokens as u64;
            r.tokens.input_audio = input_audio_tokens as u64;
            r.tokens.output_audio = output_audio_tokens as u64;
            let status = if cancelled { ResponseStatus::Cancelled } else { ResponseStatus::Completed };
            self.finish_response(status, None);
        }
    }

    /// Whether a turn-mode answer belongs to the response in progress.
    pub(super) fn turn_is_current(&self, owner: Option<String>) -> bool {
        owner.is_some() && self.responses.current.as_ref().map(|r| &r.id) == owner.as_ref()
    }
}
