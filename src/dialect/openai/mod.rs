//! The OpenAI Realtime API shape, in three flavors: OpenAI GA, OpenAI beta
//! (`OpenAI-Beta: realtime=v1`) and Qwen-Omni-Realtime (DashScope). Served from the same
//! actors as every dialect: this codec turns the OpenAI conversation model into duplex
//! steps or turn-mode answers and back.
//!
//! - `turn_detection: server_vad` (default): appended pcm16 audio, resampled to 16 kHz, is
//!   gathered into duplex steps (one second, or the backend's `step_samples`). The gateway's
//!   voice activity detector (`[vad]`: loudness or Silero VAD) decides the user's turn events
//!   at the speech's own edges: `speech_started` (and barge-in over an answer), then
//!   `speech_stopped`, `committed` and the user item once `silence_duration_ms` of silence
//!   follow the speech; the model's decisions drive the responses.
//!   While a response is in progress and the client has stopped sending, the codec keeps
//!   stepping the backend with silence at the backend's own pace.
//! - `turn_detection: null`: `input_audio_buffer.commit` and `conversation.item.create`
//!   collect items; `response.create` runs one turn-mode answer on them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use std::sync::Arc;

use omni_actors::domain::{BackendInfo, ChatMessage, Mode, SessionSetup};
use omni_actors::edge::dialect::{DecodeError, Dialect, Outbox, RecordedMedia};
use omni_actors::edge::vad::SharedDetectors;
use omni_actors::observe::recording::Redact;
use omni_actors::protocol::{CloseReason, Inbound, Outbound, ProtocolError, QueueInfo};
use omni_actors::session::messages::CallerAudio;
use serde_json::{Map, Value, json};

use omni_actors::observe::metrics::metrics;

use super::Limits;
use super::record::{AudioEncoding, JsonRedactor};
use super::speech::SpeechFinder;
use super::wire;
use conf::Conf;
use held::Counted;
use omni_actors::audio::StreamResampler;

mod conf;
mod held;
mod input;
mod output;
#[cfg(test)]
mod tests;

/// Samples per duplex step until the backend names its own (`BackendInfo::step_samples`): one
/// second at 16 kHz.
const DEFAULT_STEP: usize = 16000;
/// The client counts as idle (it stopped sending) after this long without audio.
const IDLE: Duration = Duration::from_millis(300);
/// A stalled turn is prompted with silent steps, one step's length apart, up to this much
/// silence in all.
const MAX_PADDING: Duration = Duration::from_secs(5);
/// A speaking model whose steps stopped coming this long ago is stepped with silence.
const STALLED: Duration = Duration::from_millis(1000);
/// Audio held while the session is being created: at most this many steps.
const MAX_HELD_STEPS: usize = 30;
/// Model output rate (the backend's 24 kHz).
const OUTPUT_RATE: u32 = 24000;
/// The token limit a Qwen session object shows when the client set none (Qwen's document).
const QWEN_MAX_TOKENS: u32 = 16384;

/// What a Qwen session object shows for the sampling settings a client did not set: the values
/// Qwen's `session.updated` documents (`seed: -1`: no fixed seed). A client's own replace them.
fn qwen_defaults() -> [(&'static str, Value); 5] {
    [
        ("top_p", json!(1.0)),
        ("top_k", json!(50)),
        ("repetition_penalty", json!(1.05)),
        ("presence_penalty", json!(0.0)),
        ("seed", json!(-1)),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Ga,
    Beta,
    Qwen,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::Ga => "openai",
            Flavor::Beta => "openai-beta",
            Flavor::Qwen => "qwen",
        }
    }
    fn ga(self) -> bool {
        self == Flavor::Ga
    }
    fn default_input_rate(self) -> u32 {
        if self == Flavor::Qwen { 16000 } else { 24000 }
    }
    fn audio_delta(self) -> &'static str {
        if self.ga() { "response.output_audio.delta" } else { "response.audio.delta" }
    }
    fn audio_done(self) -> &'static str {
        if self.ga() { "response.output_audio.done" } else { "response.audio.done" }
    }
    fn transcript_delta(self) -> &'static str {
        if self.ga() { "response.output_audio_transcript.delta" } else { "response.audio_transcript.delta" }
    }
    fn transcript_done(self) -> &'static str {
        if self.ga() { "response.output_audio_transcript.done" } else { "response.audio_transcript.done" }
    }
    fn text_delta(self) -> &'static str {
        if self.ga() { "response.output_text.delta" } else { "response.text.delta" }
    }
    fn text_done(self) -> &'static str {
        if self.ga() { "response.output_text.done" } else { "response.text.done" }
    }
    fn item_created(self) -> &'static str {
        if self.ga() { "conversation.item.added" } else { "conversation.item.created" }
    }
    /// Content part type of an assistant answer.
    fn part_type(self, audio: bool) -> &'static str {
        match (self.ga(), audio) {
            (true, true) => "output_audio",
            (true, false) => "output_text",
            (false, true) => "audio",
            (false, false) => "text",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Queued: nothing reaches the client but queue events.
    Waiting,
    /// A worker is assigned; the backend is being prepared.
    Preparing,
    Active,
}

/// The user's current spoken turn (server VAD).
struct UserTurn {
    item_id: String,
    start_ms: u64,
    announced: bool,
}

/// A response in progress.
struct Response {
    id: String,
    item_id: String,
    /// output item and content part opened.
    opened: bool,
    /// From the duplex model (server VAD) rather than a turn-mode answer.
    duplex: bool,
    audio: bool,
    text: String,
    usage: Usage,
    last_step: Instant,
}

/// The tokens of one response, as the backend counted them.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    input: u64,
    output: u64,
    /// Of `input`, those from audio; `output` counts text, this the speech.
    input_audio: u64,
    output_audio: u64,
    /// Audio heard and spoken, for a backend that does not count audio tokens itself.
    input_samples: u64,
    output_samples: u64,
}

/// A turn-mode answer asked for and not yet done.
struct Turn {
    /// The response it belongs to; `None` once cancelled.
    response: Option<String>,
    /// The user item whose audio it answers, waiting for its transcript.
    transcript_item: Option<String>,
    /// 16 kHz samples of audio in its messages.
    input_samples: u64,
}

pub struct Realtime {
    flavor: Flavor,
    model: String,
    conf: Conf,
    /// The setup the backend was last asked to take.
    prepared: Option<SessionSetup>,
    /// The configuration the backend last took (what a refused reconfigure goes back to), and
    /// the reconfigures in flight, oldest first: whether each owes the client a
    /// `session.updated`, and the configuration it carries.
    in_force: Conf,
    reconfigures: VecDeque<(bool, Conf)>,
    phase: Phase,
    session_id: Option<String>,
    update_pending: bool,
    /// Replies held while the session is not created yet (the client hears nothing).
    deferred: Counted<String>,
    events: u64,
    items: u64,
    responses: u64,
    last_item: Option<String>,
    client_event_id: Option<String>,
    // input
    resampler: StreamResampler,
    resampler_rate: u32,
    step: Vec<f32>,
    heard_audio: bool,
    last_append: Option<Instant>,
    /// Server VAD: the user's speech in the input, and for the gateway's transcription (a
    /// backend that does not transcribe) the speech itself.
    speech: SpeechFinder,
    /// The user's speech in progress (started, not yet stopped or answered).
    user: Option<UserTurn>,
    /// The user spoke and the model has not answered since.
    unanswered: bool,
    /// The newest user item committed at the end of its speech, waiting for what the model
    /// heard (it says so when it answers).
    awaiting_transcript: Option<String>,
    /// The gateway runs a recogniser (`[transcription]`).
    gateway_asr: bool,
    /// Manual mode: audio (16 kHz) not yet committed, and items not yet answered.
    buffer: Vec<f32>,
    items_pending: Counted<ChatMessage>,
    /// Images not yet sent with a step or committed with an item.
    frames: Counted<Vec<u8>>,
    /// Input held while the session is being created.
    held: Counted<Inbound>,
    limits: Limits,
    commands: Vec<Inbound>,
    last_pad: Option<Instant>,
    /// Samples sent to the backend since its last step's outcome: the input a speaking step
    /// answered (usage, for a backend that does not count audio tokens).
    sent_since_step: u64,
    pads: u32,
    response: Option<Response>,
    /// Turn-mode answers asked for and not yet done, oldest first (the backend answers in
    /// order).
    turns: VecDeque<Turn>,
    recorded: Option<RecordedMedia>,
    /// What the backend can do, once the session is created.
    backend: Option<BackendInfo>,
    /// What the duplex model heard the user say since the last user item.
    heard: Option<String>,
    /// Settings already reported to the client as not applied.
    reported: Vec<String>,
    /// Manual mode: the newest user item with audio not yet answered.
    audio_item: Option<String>,
    /// The session's edge carries audio itself: the caller's voice comes as samples, the
    /// model's goes as samples, and the audio formats are the edge's.
    carries_audio: bool,
}

impl Realtime {
    pub fn new(flavor: Flavor, model: &str, limits: Limits, voice: &SharedDetectors) -> Realtime {
        let conf = Conf::new(flavor);
        let rate = conf.input_rate;
        Realtime {
            flavor,
            model: model.to_string(),
            in_force: conf.clone(),
            conf,
            prepared: None,
            reconfigures: VecDeque::new(),
            phase: Phase::Waiting,
            session_id: None,
            update_pending: false,
            deferred: Counted::default(),
            events: 0,
            items: 0,
            responses: 0,
            last_item: None,
            client_event_id: None,
            resampler: StreamResampler::new(rate, 16000).expect("valid default rates"),
            resampler_rate: rate,
            step: Vec::new(),
            heard_audio: false,
            last_append: None,
            speech: SpeechFinder::new(voice),
            user: None,
            unanswered: false,
            awaiting_transcript: None,
            gateway_asr: false,
            buffer: Vec::new(),
            items_pending: Counted::default(),
            frames: Counted::default(),
            held: Counted::default(),
            limits,
            commands: Vec::new(),
            last_pad: None,
            sent_since_step: 0,
            pads: 0,
            response: None,
            turns: VecDeque::new(),
            recorded: None,
            backend: None,
            heard: None,
            reported: Vec::new(),
            audio_item: None,
            carries_audio: false,
        }
    }

    /// The gateway transcribes user turns for backends that do not (`[transcription]` is on).
    pub fn with_gateway_transcription(mut self, on: bool) -> Realtime {
        self.gateway_asr = on;
        self
    }

    /// The public mode sessions of this dialect queue for.
    pub fn mode() -> Mode {
        Mode::Audio
    }

    fn event(&mut self, kind: &str, fields: Value) -> String {
        self.events += 1;
        let mut obj = Map::new();
        obj.insert("type".into(), json!(kind));
        obj.insert("event_id".into(), json!(format!("event_{}", self.events)));
        if let Value::Object(f) = fields {
            obj.extend(f);
        }
        Value::Object(obj).to_string()
    }

    /// Sends now, or holds until the session is created.
    fn reply(&mut self, out: &mut Outbox, kind: &str, fields: Value) {
        let frame = self.event(kind, fields);
        if self.phase == Phase::Active {
            out.push(frame);
        } else {
            self.deferred.push(frame);
        }
    }

    /// Everything held for the client, in bytes.
    fn held_bytes(&self) -> usize {
        self.deferred.bytes()
            + self.items_pending.bytes()
            + self.frames.bytes()
            + self.held.bytes()
            + self.buffer.len() * 4
    }

    /// Refuses an event that would take what is held for the client past
    /// `limits.max_buffered_bytes`; `buffer` names what would grow (and labels the metric).
    fn admit(&self, event: &str, buffer: &'static str, extra: usize) -> Result<(), ProtocolError> {
        let (held, max) = (self.held_bytes(), self.limits.max_buffered_bytes);
        if held.saturating_add(extra) <= max {
            return Ok(());
        }
        metrics().buffer_refusals.with_label_values(&[buffer]).inc();
        Err(ProtocolError::BufferFull(format!(
            "{event}: refused: the server already holds {held} bytes for this session (audio not yet \
             committed, items and images not yet answered, replies not yet sent) and holds at most \
             {max} (limits.max_buffered_mb); commit, clear or wait for the session to start"
        )))
    }

    fn new_item(&mut self) -> String {
        self.items += 1;
        format!("item_{}", self.items)
    }

    fn received_ms(&self) -> u64 {
        self.speech.received_ms()
    }

    fn session_object(&self) -> Value {
        let c = &self.conf;
        let vad = c.vad.as_ref().map(|v| {
            json!({"type": v.kind, "threshold": v.threshold, "prefix_padding_ms": v.prefix_padding_ms,
                   "silence_duration_ms": v.silence_duration_ms, "create_response": true, "interrupt_response": true})
        });
        let id = self.session_id.clone().unwrap_or_default();
        let tokens = c.max_tokens.map_or(json!("inf"), |n| json!(n));
        let mut session = match self.flavor {
            Flavor::Ga => json!({
                "type": "realtime", "object": "realtime.session", "id": id, "model": self.model,
                "output_modalities": if c.audio_out { vec!["audio"] } else { vec!["text"] },
                "instructions": c.instructions,
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": c.input_rate}, "turn_detection": vad,
                              "transcription": c.transcription, "noise_reduction": null},
                    "output": {"format": {"type": "audio/pcm", "rate": OUTPUT_RATE}, "voice": c.voice, "speed": 1.0},
                },
                "tools": [], "tool_choice": "auto", "max_output_tokens": tokens,
            }),
            Flavor::Beta | Flavor::Qwen => {
                let format = if self.flavor == Flavor::Qwen { "pcm" } else { "pcm16" };
                let mut session = json!({
                    "id": id, "object": "realtime.session", "model": self.model,
                    "modalities": if c.audio_out { vec!["text", "audio"] } else { vec!["text"] },
                    "instructions": c.instructions, "voice": c.voice,
                    "input_audio_format": format, "output_audio_format": format,
                    "input_audio_transcription": c.transcription, "turn_detection": vad,
                    "tools": [], "tool_choice": "auto", "temperature": c.temperature.unwrap_or(0.8),
                });
                if self.flavor == Flavor::Qwen {
                    // Qwen's session objects always show search and the sampling settings (the
                    // values in force: the client's, else the document's defaults), and spell the
                    // token limit so.
                    session["enable_search"] = json!(false);
                    session["search_options"] = json!({});
                    session["max_response_output_token"] = tokens;
                    session["max_tokens"] = json!(c.max_tokens.unwrap_or(QWEN_MAX_TOKENS));
                    for (name, value) in qwen_defaults() {
                        session[name] = value;
                    }
                } else {
                    session["max_response_output_tokens"] = tokens;
                }
                session
            }
        };
        // The settings given by name, as given.
        for (name, value) in c.settings.iter() {
            session[name] = value.clone();
        }
        session
    }

    /// Tells the client, once per setting, which of its settings the model does not apply
    /// (they are passed on, and the model ignores them).
    pub(super) fn report_unsupported(&mut self, out: &mut Outbox) {
        let Some(backend) = &self.backend else { return };
        let name = backend.name.clone();
        let fresh: Vec<String> =
            self.conf.settings.unsupported(backend).into_iter().filter(|s| !self.reported.contains(s)).collect();
        for setting in fresh {
            let message = format!("session.{setting}: the model ({name}) does not apply this setting; it is ignored");
            let error = json!({"type": "invalid_request_error", "code": "unsupported_setting", "message": message,
                               "param": format!("session.{setting}"), "event_id": self.client_event_id});
            self.reply(out, "error", json!({"error": error}));
            self.reported.push(setting);
        }
    }

    /// Sends a command now, or holds it until the session is created.
    fn command(&mut self, cmd: Inbound) {
        if self.phase == Phase::Active {
            self.commands.push(cmd);
        } else {
            if matches!(cmd, Inbound::Chunk(_)) && self.held.len() >= MAX_HELD_STEPS {
                self.held.pop_front();
            }
            self.held.push(cmd);
        }
    }

    fn send_step(&mut self, samples: Vec<f32>, force_listen: bool) {
        self.sent_since_step += samples.len() as u64;
        let frames = self.frames.take();
        self.command(Inbound::Chunk(omni_actors::domain::DuplexChunk {
            audio: samples,
            frames,
            force_listen,
            max_slice_nums: None,
            audio_base64: None,
        }));
    }

    /// Fills the step with silence and sends it (the client stopped sending).
    fn pad_step(&mut self, now: Instant) {
        // Whole steps: audio gathered before the backend named its step may be more than one.
        let mut samples = std::mem::take(&mut self.step);
        let step = self.step_len();
        samples.resize(samples.len().div_ceil(step).max(1) * step, 0.0);
        // One step's length apart on average, whatever the tick's phase.
        let every = self.step_duration();
        self.last_pad = Some(match self.last_pad {
            Some(t) if now.duration_since(t) < every * 2 => t + every,
            _ => now,
        });
        self.send_step(samples, false);
    }

    /// Samples per duplex step: the backend's preferred chunk once the session is created.
    fn step_len(&self) -> usize {
        self.backend.as_ref().map_or(DEFAULT_STEP, BackendInfo::duplex_chunk_samples)
    }

    /// One step's length of audio: how often the backend is stepped with silence.
    fn step_duration(&self) -> Duration {
        Duration::from_millis(self.step_len() as u64 * 1000 / 16000)
    }

    fn client_idle(&self, now: Instant) -> bool {
        self.last_append.is_none_or(|t| now.duration_since(t) >= IDLE)
    }
}

impl Dialect for Realtime {
    fn name(&self) -> &'static str {
        self.flavor.name()
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        JsonRedactor::shared(AudioEncoding::Pcm16)
    }

    fn decode(&mut self, text: &bytestring::ByteString, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        let kind = wire::event_type(text)?.into_owned();
        let v: Value = serde_json::from_str(text).map_err(|e| DecodeError::Unparseable(e.to_string()))?;
        self.client_event_id = v.get("event_id").and_then(Value::as_str).map(String::from);
        self.recorded = None;
        let now = Instant::now();
        if self.phase != Phase::Active && !matches!(kind.as_str(), "session.update" | "session.finish") {
            // Replies to anything else are held until the session is created.
            self.admit(&kind, "replies", 1)?;
        }
        match kind.as_str() {
            "session.update" => self.update(&v, replies)?,
            "input_audio_buffer.append" => self.append(&v, now, replies)?,
            "input_audio_buffer.commit" => self.commit(now, replies)?,
            "input_audio_buffer.clear" => {
                self.buffer.clear();
                self.step.clear();
                self.reply(replies, "input_audio_buffer.cleared", json!({}));
            }
            "input_image_buffer.append" => self.image(&v)?,
            "conversation.item.create" => self.create_item(&v, replies)?,
            "response.create" => self.create_response(&v, now, replies)?,
            "response.cancel" => self.cancel(replies)?,
            "session.finish" => return Ok(vec![Inbound::Close { reason: Some("finished".into()) }]),
            other => return Err(ProtocolError::UnknownEvent(format!("unknown event type '{other}'")).into()),
        }
        Ok(std::mem::take(&mut self.commands))
    }

    fn carry_audio(&mut self) -> bool {
        self.carries_audio = true;
        true
    }

    fn hear(&mut self, audio: CallerAudio, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        self.recorded = None;
        if self.phase != Phase::Active {
            self.admit("audio", "replies", 1)?;
        }
        self.hear_samples(&audio.samples, audio.rate, Instant::now(), replies)?;
        Ok(std::mem::take(&mut self.commands))
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        match event {
            Outbound::Queued(q) | Outbound::QueueUpdate(q) => {
                let kind = if matches!(event, Outbound::Queued(_)) { "session.queued" } else { "session.queue_update" };
                let QueueInfo { ticket, position, estimated_wait_s, queue_length } = q;
                let frame = self.event(kind, json!({"position": position, "estimated_wait_s": (estimated_wait_s * 10.0).round() / 10.0,
                                                   "ticket_id": format!("ticket_{ticket}"), "queue_length": queue_length}));
                out.push(frame);
            }
            Outbound::QueueDone => {
                // Its clients never initialise: the session starts with the configuration so far.
                self.phase = Phase::Preparing;
                let setup = self.conf.setup();
                self.prepared = Some(setup.clone());
                self.commands.push(Inbound::Init(setup));
            }
            Outbound::Created { session_id, backend, .. } => {
                self.session_id = Some(session_id.to_string());
                self.backend = Some(backend.clone());
                self.phase = Phase::Active;
                let body = json!({"session": self.session_object()});
                out.push(self.event("session.created", body));
                if std::mem::take(&mut self.update_pending) {
                    let body = json!({"session": self.session_object()});
                    out.push(self.event("session.updated", body));
                }
                self.report_unsupported(out);
                out.extend(self.deferred.take());
                let held = self.held.take();
                self.commands.extend(held);
                self.in_force = self.conf.clone();
                self.reconfigure_if_changed(false);
            }
            Outbound::Reconfigured { backend, .. } => {
                self.backend = Some(backend.clone());
                if let Some((announce, conf)) = self.reconfigures.pop_front() {
                    self.in_force = conf;
                    if announce {
                        let body = json!({"session": self.session_object()});
                        out.push(self.event("session.updated", body));
                        self.report_unsupported(out);
                    }
                }
            }
            Outbound::UserTranscript { item_id, result } => self.gateway_transcribed(out, item_id, result),
            Outbound::ReconfigureFailed(e) => {
                let frame = self.error_event(e);
                out.push(frame);
                self.reconfigure_refused();
            }
            Outbound::Transcript { response_id: None, text, .. } => {
                // The duplex model's: it belongs to the user item the next response commits.
                let heard = self.heard.get_or_insert_with(String::new);
                if !heard.is_empty() {
                    heard.push(' ');
                }
                heard.push_str(text);
            }
            Outbound::Transcript { response_id: Some(_), text, .. } => {
                if let Some(item) = self.turns.front_mut().and_then(|t| t.transcript_item.take()) {
                    self.transcribed(out, &item, Some(text));
                }
            }
            Outbound::Step { outcome, .. } => self.on_step(outcome, out),
            Outbound::TurnDelta { text, audio, .. } => {
                if self.turn_is_current(self.turns.front().and_then(|t| t.response.clone())) {
                    self.delta(out, text, audio);
                }
            }
            Outbound::TurnDone {
                input_tokens,
                output_tokens,
                input_audio_tokens,
                output_audio_tokens,
                cancelled,
                ..
            } => {
                let turn = self.turns.pop_front();
                if let Some(item) = turn.as_ref().and_then(|t| t.transcript_item.clone()).filter(|_| !cancelled) {
                    self.transcribed(out, &item, None);
                }
                let input_samples = turn.as_ref().map_or(0, |t| t.input_samples);
                if self.turn_is_current(turn.and_then(|t| t.response))
                    && let Some(r) = self.response.as_mut()
                {
                    r.usage.input_samples = input_samples;
                    r.usage.input = input_tokens as u64;
                    r.usage.output = output_tokens as u64;
                    r.usage.input_audio = input_audio_tokens as u64;
                    r.usage.output_audio = output_audio_tokens as u64;
                    self.finish_response(out, if cancelled { "cancelled" } else { "completed" }, None);
                }
            }
            Outbound::Error(e) => {
                // An answer that failed ends its response.
                if matches!(e, ProtocolError::Inference(_)) && self.conf.vad.is_none() && !self.turns.is_empty() {
                    let owner = self.turns.pop_front().and_then(|t| t.response);
                    if self.turn_is_current(owner) {
                        self.finish_response(out, "failed", Some("error"));
                    }
                }
                let frame = self.error_event(e);
                out.push(frame);
            }
            Outbound::Closed { reason, .. } => match reason {
                CloseReason::Client(r) if r == "finished" => out.push(self.event("session.finished", json!({}))),
                CloseReason::Client(_) => {}
                other => {
                    let code = if *other == CloseReason::Timeout { "session_expired" } else { other.as_str() };
                    let message = format!("the session ended: {}", other.as_str());
                    let frame = self.event("error", json!({"error": {"type": "server_error", "code": code, "message": message, "param": null, "event_id": null}}));
                    out.push(frame);
                }
            },
        }
    }

    fn take_commands(&mut self) -> Vec<Inbound> {
        std::mem::take(&mut self.commands)
    }

    fn take_recorded_media(&mut self) -> Option<RecordedMedia> {
        self.recorded.take()
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(100))
    }

    fn tick(&mut self, now: Instant, _out: &mut Outbox) {
        if self.phase != Phase::Active || self.conf.vad.is_none() || !self.client_idle(now) {
            return;
        }
        let every = self.step_duration();
        let due = self.last_pad.is_none_or(|t| now.duration_since(t) >= every);
        let max_pads = (MAX_PADDING.as_millis() / every.as_millis().max(1)) as u32;
        match &self.response {
            // A speaking model whose steps stopped coming (one was dropped): keep it going.
            Some(r) if r.duplex && now.duration_since(r.last_step) >= every.max(STALLED) && due => self.pad_step(now),
            Some(_) => {}
            // The user spoke and went quiet before a full step: let the model hear the pause.
            None if (self.user.is_some() || self.unanswered) && due && self.pads < max_pads => {
                self.pads += 1;
                self.pad_step(now);
            }
            None => {}
        }
    }
}
