//! The model's responses: one in progress at a time, opened by the duplex model's decision to
//! speak (server VAD) or by the client (`response.create`: a turn-mode answer, under any turn
//! detection), written piece by piece into output items (a message, or the function calls
//! the model makes), and closed complete, cut short or failed, with the tokens it cost.

use std::collections::VecDeque;
use std::time::Instant;

use omni_actors::domain::{CallPiece, Generation, Role, StepKind, StepOutcome, Tools, TurnInput};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{Inbound, ProtocolError};

use super::calls::{self, WrittenCall};
use super::events::{Event, Output, ResponseRequest, ResponseStatus, ResponseView, Usage};
use super::items::{Item, ItemStatus, Part};
use super::{Driver, OUTPUT_RATE};

/// A response in progress.
#[derive(Debug)]
pub struct Response {
    pub id: String,
    /// Its output items, in order; the last is open while pieces come.
    outputs: Vec<Out>,
    /// From the duplex model (server VAD) rather than a turn-mode answer.
    pub duplex: bool,
    audio: bool,
    tokens: Tokens,
    /// When the duplex model's last step of it came.
    pub last_step: Instant,
    metadata: Option<Vec<(String, String)>>,
    max_tokens: Option<u32>,
    /// `conversation: "none"`: its items are not the conversation's.
    out_of_band: bool,
    /// The tools it may call (the request's, else the session's).
    tools: Tools,
    /// A call being written, told once it is whole and checked ([`calls`]).
    call: Option<WrittenCall>,
    /// Asked by the client of a voice that takes no typed turns (delegation): it waits for the
    /// voice's next words (a listen step does not end it) or a decided call, until this instant.
    pub waits_until: Option<Instant>,
}

impl Response {
    /// It was asked of the voice, which has said nothing of it yet.
    pub fn awaits_voice(&self) -> bool {
        self.waits_until.is_some() && self.outputs.is_empty()
    }
}

/// One output item of a response.
#[derive(Debug)]
struct Out {
    item_id: String,
    kind: OutKind,
    /// Its done events were sent.
    closed: bool,
}

#[derive(Debug)]
enum OutKind {
    /// Words, spoken or written; `samples` of voice at 24 kHz.
    Message { text: String, samples: u64 },
    /// A call of a tool, its arguments as they came.
    Call { call_id: String, name: String, arguments: String },
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

/// A turn-mode answer asked for and not yet done (or a replay, which answers nothing).
#[derive(Debug)]
pub struct Turn {
    /// The response it belongs to; `None` once cancelled, or for a replay.
    pub response: Option<String>,
    /// The user item whose audio it answers, waiting for its transcript.
    pub transcript_item: Option<String>,
    /// 16 kHz samples of audio in its messages.
    input_samples: u64,
    /// It replays the conversation (and answers nothing).
    replay: bool,
}

impl Turn {
    /// A turn that answers nothing: the conversation replayed into a backend.
    pub fn replay() -> Turn {
        Turn { response: None, transcript_item: None, input_samples: 0, replay: true }
    }
}

#[derive(Default)]
pub struct Responses {
    pub current: Option<Response>,
    /// Turn-mode answers asked for and not yet done, oldest first (the backend answers in order).
    pub turns: VecDeque<Turn>,
    /// The newest user item with audio not yet answered.
    pub audio_item: Option<String>,
    /// `response.create`s that came before the session was created.
    pub deferred: Vec<ResponseRequest>,
}

impl Driver {
    /// The client asks for an answer, under any turn detection: a turn-mode answer on the
    /// items the backend does not hold yet (or on the whole conversation, when the backend's
    /// context no longer follows it), with the response's own instructions, tools and limits.
    pub(super) fn create_response(&mut self, request: ResponseRequest, now: Instant) -> Result<(), ProtocolError> {
        if !self.active() {
            // What the backend can take is known once the session is created.
            if self.responses.deferred.len() >= self.limits.max_turns {
                metrics().buffer_refusals.with_label_values(&["turns"]).inc();
                return Err(ProtocolError::BufferFull(format!(
                    "response.create: {} responses already wait for the session to start (at most {}, \
                     limits.max_pending_turns)",
                    self.responses.deferred.len(),
                    self.limits.max_turns
                )));
            }
            self.responses.deferred.push(request);
            return Ok(());
        }
        if self.responses.current.is_some() {
            return Err(ProtocolError::Refused {
                code: "conversation_already_has_active_response",
                message: "response.create: a response is already in progress; wait for its response.done or \
                          cancel it"
                    .into(),
            });
        }
        if !request.out_of_band {
            // A typed turn's decision (a spoken turn's was asked when its transcript came).
            self.decide_typed();
        }
        let holds = self.holds_conversations();
        if self.setup.conf.vad.is_some() && !holds && self.delegates() && request.out_of_band {
            // The voice answers only aloud, from its conversation: the decider answers in words.
            return self.answer_out_of_band(request);
        }
        if self.setup.conf.vad.is_some() && !holds && self.delegates() {
            // The voice takes no typed turns: it is prepared again with the conversation (a
            // tool's result among it), and the response is what it says next (or a call the
            // decider makes first).
            self.brief_voice(request.instructions.as_deref());
            let conf = &self.setup.conf;
            let (audio, max_tokens) =
                (request.audio.unwrap_or(conf.audio_out), request.max_tokens.unwrap_or(conf.max_tokens));
            let tools = match request.tools.clone() {
                Some(t) if t.functions.is_empty() => Tools { functions: conf.tools.functions.clone(), ..t },
                Some(t) => t,
                None => conf.tools.clone(),
            };
            // Opened by the client, not by the voice taking the floor: the user's turn stays as it is.
            self.start_response(false, audio, request.metadata, max_tokens, (false, tools));
            if let Some(r) = self.responses.current.as_mut() {
                r.duplex = true;
                // Stepped with silence from the next tick while the client says nothing: the
                // voice's words are waited for, not a stalled answer's next step.
                r.last_step = now.checked_sub(super::pacing::STALLED).unwrap_or(now);
                r.waits_until = Some(now + super::delegation::VOICE_WAIT);
            }
            return Ok(());
        }
        if self.setup.conf.vad.is_some() && !holds {
            let model = self.life.backend.as_ref().map_or("the model", |b| b.name.as_str());
            return Err(ProtocolError::Refused {
                code: "response_create_unsupported",
                message: format!(
                    "response.create: under server VAD {model} answers speech only (its ABI revision keeps no \
                     conversation of typed turns); set turn_detection to null to ask for answers yourself"
                ),
            });
        }
        if self.responses.turns.len() >= self.limits.max_turns {
            metrics().buffer_refusals.with_label_values(&["turns"]).inc();
            return Err(ProtocolError::BufferFull(format!(
                "response.create: {} answers are already in progress or waiting (at most {}, limits.max_pending_turns)",
                self.responses.turns.len(),
                self.limits.max_turns
            )));
        }
        let (mut messages, continues) = match request.input {
            Some(ref input) => (input.iter().map(|i| i.message.clone()).collect(), false),
            None if request.out_of_band || self.sync.stale => (self.replay_messages(), false),
            None => (self.sync.pending.iter().map(|p| p.message.clone()).collect(), true),
        };
        if !holds && !messages.iter().any(|m| m.role == Role::User) {
            // Before ABI 1.3 a turn answers a user's message: the conversation is read again.
            messages = self.replay_messages();
            if !messages.iter().any(|m| m.role == Role::User) {
                return Err(ProtocolError::Refused {
                    code: "input_audio_buffer_commit_empty",
                    message: "response.create: there is no user input to answer (commit audio or create an item)"
                        .into(),
                });
            }
            return self.answer(request, messages, false, now);
        }
        self.answer(request, messages, continues, now)
    }

    /// Sends a turn-mode answer of `messages` for a new response.
    fn answer(
        &mut self,
        request: ResponseRequest,
        mut messages: Vec<omni_actors::domain::ChatMessage>,
        continues: bool,
        _now: Instant,
    ) -> Result<(), ProtocolError> {
        let conf = &self.setup.conf;
        let audio = request.audio.unwrap_or(conf.audio_out);
        let max_tokens = request.max_tokens.unwrap_or(conf.max_tokens);
        // The response's own instructions come last, for it alone: the backend's context goes
        // back to the conversation at the next answer.
        let own_instructions = request.instructions.filter(|s| !s.is_empty());
        if let Some(extra) = &own_instructions {
            messages.push(omni_actors::domain::ChatMessage::text(Role::System, extra.clone()));
        }
        let out_of_band = request.out_of_band;
        let messages = self.for_backend(messages);
        let input_samples = messages.iter().flat_map(|m| &m.audios).map(|a| a.len() as u64).sum();
        // The newest user audio is the one the answer's transcript will be of.
        let transcript_item = self.responses.audio_item.take().filter(|_| conf.transcription.is_some());
        let tools = request.tools.map(|mut t| {
            if t.functions.is_empty() && !conf.tools.functions.is_empty() {
                t.functions = conf.tools.functions.clone();
            }
            t
        });
        let callable = tools.clone().unwrap_or_else(|| conf.tools.clone());
        let input = TurnInput {
            messages,
            generation: Generation {
                max_new_tokens: max_tokens,
                temperature: conf.temperature.map(|t| t as f32),
                ..Generation::default()
            },
            speech: audio,
            continues,
            tools,
            ..TurnInput::default()
        };
        if out_of_band || own_instructions.is_some() {
            // The backend's context is now the response's: the next answer replays the conversation.
            self.sync.stale = true;
        } else if request.input.is_none() {
            self.sync.pending.take();
            self.sync.stale = false;
        }
        self.start_response(false, audio, request.metadata, max_tokens, (out_of_band, callable));
        let response = self.responses.current.as_ref().map(|r| r.id.clone());
        self.responses.turns.push_back(Turn { response, transcript_item, input_samples, replay: false });
        self.send(Inbound::Turn { input, streaming: true });
        Ok(())
    }

    /// The `response.create`s that waited for the session to be created.
    pub(super) fn run_deferred(&mut self, now: Instant) {
        for request in std::mem::take(&mut self.responses.deferred) {
            if let Err(e) = self.create_response(request, now) {
                self.events.push(Event::Error(e));
            }
        }
    }

    /// The client cuts the response in progress short.
    pub(super) fn cancel(&mut self) -> Result<(), ProtocolError> {
        if self.responses.current.is_none() {
            return Err(ProtocolError::Refused {
                code: "response_cancel_not_active",
                message: "response.cancel: there is no response in progress to cancel".into(),
            });
        }
        self.cut_response("client_cancelled");
        Ok(())
    }

    /// The response in progress ends cancelled (`reason`), and the backend stops producing it.
    pub(super) fn cut_response(&mut self, reason: &'static str) {
        let Some(id) = self.responses.current.as_ref().map(|r| r.id.clone()) else { return };
        for turn in self.responses.turns.iter_mut().filter(|t| t.response.as_deref() == Some(id.as_str())) {
            turn.response = None;
        }
        self.finish_response(ResponseStatus::Cancelled, Some(reason));
        self.commands.push(Inbound::Interrupt);
        self.events.push(Event::VoiceCleared);
    }

    /// Opens a response: the duplex model's first closes the user's turn.
    pub(super) fn start_response(
        &mut self,
        duplex: bool,
        audio: bool,
        metadata: Option<Vec<(String, String)>>,
        max_tokens: Option<u32>,
        (out_of_band, tools): (bool, Tools),
    ) {
        if duplex {
            self.model_takes_the_floor();
        }
        let r = Response {
            id: self.conversation.new_response_id(),
            outputs: Vec::new(),
            duplex,
            audio,
            tokens: Tokens::default(),
            last_step: Instant::now(),
            metadata,
            max_tokens,
            out_of_band,
            tools,
            call: None,
            waits_until: None,
        };
        let view = self.view(&r, ResponseStatus::InProgress, None, Vec::new());
        self.say(Event::ResponseCreated(view));
        self.responses.current = Some(r);
    }

    /// Where the open output of the response in progress is.
    fn output_at(r: &Response) -> Option<Output> {
        let index = r.outputs.len().checked_sub(1)?;
        Some(Output { response_id: r.id.clone(), output_index: index, item_id: r.outputs[index].item_id.clone() })
    }

    /// The response's open message, opened (output item, conversation item, content part)
    /// before its first piece.
    fn open_message(&mut self) -> Option<Output> {
        let r = self.responses.current.as_ref()?;
        if let Some(Out { kind: OutKind::Message { .. }, closed: false, .. }) = r.outputs.last() {
            return Self::output_at(r);
        }
        self.close_output(ItemStatus::Completed);
        let item_id = self.conversation.new_item_id();
        let r = self.responses.current.as_mut()?;
        let (audio, out_of_band) = (r.audio, r.out_of_band);
        r.outputs.push(Out {
            item_id: item_id.clone(),
            kind: OutKind::Message { text: String::new(), samples: 0 },
            closed: false,
        });
        let at = Self::output_at(r)?;
        let item = Item::answer(item_id, ItemStatus::InProgress, audio, None);
        self.say(Event::OutputItemAdded { at: at.clone(), item: item.clone() });
        if !out_of_band {
            let previous_item_id = self.conversation.push(item.clone());
            self.say(Event::ItemAdded { previous_item_id, item });
        }
        self.say(Event::ContentPartAdded { at: at.clone(), audio });
        Some(at)
    }

    /// A piece of the answer: its text (or its voice's transcript) and its voice.
    pub(super) fn delta(&mut self, text: &str, audio: &[f32]) {
        if text.is_empty() && audio.is_empty() {
            return;
        }
        let Some(at) = self.open_message() else { return };
        let Some(r) = self.responses.current.as_mut() else { return };
        let spoken = r.audio;
        r.tokens.output_samples += audio.len() as u64;
        if let Some(Out { kind: OutKind::Message { text: t, samples }, .. }) = r.outputs.last_mut() {
            t.push_str(text);
            *samples += if spoken { audio.len() as u64 } else { 0 };
        }
        if !text.is_empty() {
            self.say(Event::TextDelta { at: at.clone(), audio: spoken, delta: text.to_string() });
        }
        if spoken && !audio.is_empty() {
            self.say(Event::AudioDelta { at, samples: audio.to_vec() });
        }
    }

    /// A piece of a function call: a new call begins with its tool's name; its arguments come
    /// in pieces. It is held until written whole ([`calls`]).
    pub(super) fn call_piece(&mut self, piece: &CallPiece) {
        let Some(r) = self.responses.current.as_ref() else { return };
        if piece.name.is_some() || r.call.is_none() {
            // The open message, or a call written before, is done.
            self.close_output(ItemStatus::Completed);
            let Some(r) = self.responses.current.as_mut() else { return };
            r.call = Some(WrittenCall::new(piece.name.as_deref().unwrap_or_default()));
        }
        if let Some(call) = self.responses.current.as_mut().and_then(|r| r.call.as_mut()) {
            call.push(&piece.arguments);
        }
    }

    /// The call written so far, checked: told as an output item with its arguments (which
    /// [`Driver::close_output`] then closes), or refused with one error. A response that did
    /// not complete drops it.
    fn tell_call(&mut self, status: ItemStatus) {
        let Some(r) = self.responses.current.as_mut() else { return };
        let Some(call) = r.call.take() else { return };
        if status != ItemStatus::Completed {
            return;
        }
        if let Err(e) = calls::check(&call, &r.tools) {
            metrics().function_calls_refused.with_label_values(&[e.code()]).inc();
            self.events.push(Event::Error(e));
            // The backend's context holds the call it wrote, the conversation does not: the
            // next answer replays the conversation.
            self.sync.stale = true;
            return;
        }
        metrics().function_calls.inc();
        let item_id = self.conversation.new_item_id();
        let call_id = format!("call_{}", item_id.trim_start_matches("item_"));
        let Some(r) = self.responses.current.as_mut() else { return };
        let out_of_band = r.out_of_band;
        let WrittenCall { name, arguments, .. } = call;
        let kind = OutKind::Call { call_id: call_id.clone(), name: name.clone(), arguments: arguments.clone() };
        r.outputs.push(Out { item_id: item_id.clone(), kind, closed: false });
        let Some(at) = Self::output_at(r) else { return };
        let item = Item::function_call(item_id, ItemStatus::InProgress, &call_id, &name, "");
        self.say(Event::OutputItemAdded { at: at.clone(), item: item.clone() });
        if !out_of_band {
            let previous_item_id = self.conversation.push(item.clone());
            self.say(Event::ItemAdded { previous_item_id, item });
        }
        if !arguments.is_empty() {
            self.say(Event::ArgumentsDelta { at, call_id, delta: arguments });
        }
    }

    /// Closes the response's open output item with its done events, as `status`.
    fn close_output(&mut self, status: ItemStatus) {
        self.tell_call(status);
        let Some(r) = self.responses.current.as_mut() else { return };
        let (audio, out_of_band) = (r.audio, r.out_of_band);
        let Some(at) = Self::output_at(r) else { return };
        let Some(out) = r.outputs.last_mut().filter(|o| !o.closed) else { return };
        out.closed = true;
        let item = match &out.kind {
            OutKind::Message { text, samples } => {
                let (text, audio_ms) = (text.clone(), samples * 1000 / OUTPUT_RATE as u64);
                if audio {
                    self.say(Event::AudioDone { at: at.clone() });
                }
                self.say(Event::TextDone { at: at.clone(), audio, text: text.clone() });
                let part = Part::Answer { audio, text: text.clone(), audio_ms };
                self.say(Event::ContentPartDone { at: at.clone(), part });
                Item::answer(at.item_id.clone(), status, audio, Some((&text, audio_ms)))
            }
            OutKind::Call { call_id, name, arguments } => {
                let (call_id, name, arguments) = (call_id.clone(), name.clone(), arguments.clone());
                let item = Item::function_call(at.item_id.clone(), status, &call_id, &name, &arguments);
                self.say(Event::ArgumentsDone { at: at.clone(), call_id, name, arguments });
                item
            }
        };
        if !out_of_band && let Some(kept) = self.conversation.get_mut(&at.item_id) {
            *kept = item.clone();
        }
        self.say(Event::OutputItemDone { at, item: item.clone() });
        if !out_of_band {
            self.say(Event::ItemDone { item });
        }
    }

    /// Closes the response in progress with its done events.
    pub(super) fn finish_response(&mut self, status: ResponseStatus, reason: Option<&'static str>) {
        let item_status =
            if status == ResponseStatus::Completed { ItemStatus::Completed } else { ItemStatus::Incomplete };
        let Some(id) = self.responses.current.as_ref().map(|r| r.id.clone()) else { return };
        // A call written last is told (or refused) before the voice ends.
        self.tell_call(item_status);
        // An edge that plays the voice hears its end first.
        self.events.push(Event::VoiceDone { response_id: id });
        self.close_output(item_status);
        let Some(r) = self.responses.current.take() else { return };
        self.turns.quiet_since = Some(Instant::now());
        let output: Vec<Item> = r.outputs.iter().filter_map(|o| self.finished_item(&r, o, item_status)).collect();
        let view = self.view(&r, status, reason, output);
        self.say(Event::ResponseDone(view));
        self.release_held_call();
    }

    /// An output item as it ended.
    fn finished_item(&self, r: &Response, o: &Out, last_status: ItemStatus) -> Option<Item> {
        if !r.out_of_band
            && let Some(item) = self.conversation.get(&o.item_id)
        {
            return Some(item.clone());
        }
        Some(match &o.kind {
            OutKind::Message { text, samples } => {
                Item::answer(o.item_id.clone(), last_status, r.audio, Some((text, samples * 1000 / OUTPUT_RATE as u64)))
            }
            OutKind::Call { call_id, name, arguments } => {
                Item::function_call(o.item_id.clone(), ItemStatus::Completed, call_id, name, arguments)
            }
        })
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
            conversation_id: if r.out_of_band { None } else { self.life.session_id.clone() },
            metadata: r.metadata.clone(),
            max_tokens: r.max_tokens,
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
            StepKind::Listen => match self.responses.current.as_ref() {
                // Asked of the voice: it waits for its words, within its bound.
                Some(r) if r.awaits_voice() && r.waits_until.is_some_and(|t| Instant::now() < t) => {}
                // The voice said nothing within the bound (docs/agents.md): incomplete.
                Some(r) if r.awaits_voice() => self.finish_response(ResponseStatus::Incomplete, None),
                Some(r) if r.duplex => self.finish_response(ResponseStatus::Completed, None),
                _ => {}
            },
            StepKind::Speak if self.responses.current.as_ref().is_some_and(|r| !r.duplex) => {
                // A turn-mode answer has the floor; the duplex model's words meanwhile are void.
                log::debug!("session {:?}: duplex speech during a turn-mode answer discarded", self.life.session_id);
            }
            StepKind::Speak => {
                if self.responses.current.is_none() {
                    let (audio, max_tokens) = (self.setup.conf.audio_out, self.setup.conf.max_tokens);
                    let tools = self.setup.conf.tools.clone();
                    self.start_response(true, audio, None, max_tokens, (false, tools));
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
                for call in &outcome.calls {
                    self.call_piece(call);
                }
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

    /// A piece of a turn-mode answer: words and voice, or a piece of a function call.
    pub fn turn_delta(&mut self, text: &str, audio: &[f32], call: Option<&CallPiece>) {
        let owner = self.responses.turns.front().and_then(|t| t.response.clone());
        if !self.turn_is_current(owner) {
            return;
        }
        match call {
            Some(piece) => self.call_piece(piece),
            None => self.delta(text, audio),
        }
    }

    /// A turn-mode answer is done (or was cut short), with the tokens it cost.
    pub fn turn_done(&mut self, tokens: [u32; 4], cancelled: bool) {
        let [input_tokens, output_tokens, input_audio_tokens, output_audio_tokens] = tokens;
        let turn = self.responses.turns.pop_front();
        if cancelled && turn.as_ref().is_some_and(|t| t.replay) {
            // The replay was cut (the user spoke over what came before it): the next answer gives it again.
            self.sync.stale = true;
        }
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
            let limited = r.max_tokens.is_some_and(|max| output_tokens >= max);
            let status = match (cancelled, limited) {
                (true, _) => ResponseStatus::Cancelled,
                (false, true) => ResponseStatus::Incomplete,
                (false, false) => ResponseStatus::Completed,
            };
            let reason = (status == ResponseStatus::Incomplete).then_some("max_output_tokens");
            self.finish_response(status, reason);
        }
    }

    /// Whether a turn-mode answer belongs to the response in progress.
    pub(super) fn turn_is_current(&self, owner: Option<String>) -> bool {
        owner.is_some() && self.responses.current.as_ref().map(|r| &r.id) == owner.as_ref()
    }

    /// Whether the item is an output of the response in progress.
    pub(super) fn in_current_response(&self, item_id: &str) -> bool {
        self.responses.current.as_ref().is_some_and(|r| r.outputs.iter().any(|o| o.item_id == item_id))
    }

    /// The backend answers again, within the response in progress, on `messages` that replace
    /// its context (after the context was full and the conversation was cut).
    pub(super) fn answer_again(&mut self, messages: Vec<omni_actors::domain::ChatMessage>) {
        // A call the failed attempt was writing is not the answer's: the new attempt writes its own.
        let Some(r) = self.responses.current.as_mut() else { return };
        r.call = None;
        let messages = self.for_backend(messages);
        let Some(r) = self.responses.current.as_ref() else { return };
        let response = Some(r.id.clone());
        let conf = &self.setup.conf;
        let input = TurnInput {
            messages,
            generation: Generation {
                max_new_tokens: r.max_tokens,
                temperature: conf.temperature.map(|t| t as f32),
                ..Generation::default()
            },
            speech: r.audio,
            continues: false,
            tools: Some(r.tools.clone()),
            ..TurnInput::default()
        };
        self.responses.turns.push_back(Turn { response, transcript_item: None, input_samples: 0, replay: false });
        self.commands.push(Inbound::Turn { input, streaming: true });
    }
}
