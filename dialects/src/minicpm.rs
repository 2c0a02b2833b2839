//! The MiniCPM-o Realtime API (docs/protocol.md):
//! `session.init`, `input.append`, `session.close` in; queue events, `session.created`,
//! `response.output.delta` (listen / text / audio), `response.done`, `session.closed` and
//! `error` out.

use bytestring::ByteString;
use omni_actors::domain::{
    BackendInfo, ChatMessage, DuplexChunk, Generation, Mode, Role, SessionSetup, SetupField, StepKind, StepOutcome,
    TurnInput,
};
use omni_actors::edge::dialect::{DecodeError, Dialect, Outbox};
use omni_actors::protocol::{Inbound, Outbound, ProtocolError, QueueInfo};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use std::collections::VecDeque;
use std::sync::Arc;

use omni_actors::edge::redact::Redact;

use super::Limits;
use super::record::{AudioEncoding, JsonRedactor};
use super::settings::{self, DUPLEX_CONFIG, Settings};
use super::speech::SpeechFinder;
use super::wire::{self, JsonWriter, Text};
use omni_actors::edge::vad::{Edge, EdgeRules, SharedDetectors};

/// The current dialect for one connection of a given public mode.
pub struct Current {
    mode: Mode,
    limits: Limits,
    /// `payload.config` as accepted, echoed in `session.created`.
    config: Map<String, Value>,
    /// The settings of `config` beyond the ABI's own fields.
    settings: Settings,
    /// The client asked for `input.transcript` events (`payload.transcripts`).
    transcripts: bool,
    /// Once created.
    session_id: String,
    /// Chat: the settings the backend applies (known once the session is created), and for
    /// each turn the session took and has not answered, in order, the settings of its
    /// `generation` the backend does not apply (told in its `response.done`). A turn the
    /// session refuses (`limits.max_turns` outstanding, or before the session is created) is
    /// not counted, by the same rule.
    applied: Option<Vec<String>>,
    turns: VecDeque<Vec<String>>,
    /// Full duplex, for a backend that reports no transcripts while the gateway runs a
    /// recogniser: the user's turns, found by the gateway's detector, to transcribe.
    heard: Heard,
}

/// What the gateway transcribes for a backend that does not.
struct Heard {
    speech: SpeechFinder,
    /// `[transcription]` is on.
    gateway_asr: bool,
    /// Once the session is created: the gateway transcribes its turns.
    on: bool,
    /// Appends since the session was created (the session's own `input_N` numbering).
    inputs: u64,
    /// The user's speech in progress: where it started.
    started_ms: Option<u64>,
}

/// The gateway's detector's rules for MiniCPM-o sessions: the defaults of the Realtime API's
/// `server_vad` (the dialect has no setting for them).
const TURN_RULES: EdgeRules = EdgeRules { threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 };

impl Current {
    pub fn new(mode: Mode, limits: Limits, voice: &SharedDetectors) -> Current {
        Current {
            mode,
            limits,
            config: Map::new(),
            settings: Settings::default(),
            transcripts: false,
            session_id: String::new(),
            applied: None,
            turns: VecDeque::new(),
            heard: Heard {
                speech: SpeechFinder::new(voice),
                gateway_asr: false,
                on: false,
                inputs: 0,
                started_ms: None,
            },
        }
    }

    /// The gateway transcribes the user's turns for backends that do not (`[transcription]`
    /// is on), for clients that ask (`payload.transcripts`).
    pub fn with_gateway_transcription(mut self, on: bool) -> Current {
        self.heard.gateway_asr = on;
        self
    }

    /// A duplex append's audio, once the session is created: when it ends the user's speech,
    /// the speech goes to the gateway's transcription, named by this append.
    fn hear(&mut self, audio: &[f32], commands: &mut Vec<Inbound>) {
        let heard = &mut self.heard;
        if !heard.on {
            return;
        }
        heard.inputs += 1;
        for edge in heard.speech.hear(audio, &TURN_RULES, true) {
            match edge {
                Edge::Started { audio_start_ms } => heard.started_ms = Some(audio_start_ms),
                Edge::Stopped { audio_end_ms } => {
                    let start = heard.started_ms.take().unwrap_or(0);
                    let audio = heard.speech.speech(start, audio_end_ms);
                    commands.push(Inbound::Transcribe { item_id: format!("input_{}", heard.inputs), audio });
                }
            }
        }
        heard.speech.trim(heard.speech.in_speech(), TURN_RULES.prefix_padding_ms);
    }

    /// A reference voice sent as raw 16 kHz float32 PCM, within the reference limit.
    fn reference(&self, b64: &str, field: &str) -> Result<Vec<f32>, ProtocolError> {
        wire::decode_pcm_f32_max(b64, field, self.limits.reference.max_samples(16000), 16000)
    }
}

#[derive(Deserialize)]
struct InitEvent<'a> {
    #[serde(borrow)]
    payload: Option<InitPayload<'a>>,
}

#[derive(Deserialize)]
struct InitPayload<'a> {
    #[serde(borrow, default)]
    system_prompt: Option<Text<'a>>,
    #[serde(borrow, default)]
    instructions: Option<Text<'a>>,
    #[serde(default)]
    config: Option<Map<String, Value>>,
    #[serde(borrow, default)]
    voice: Option<Voice<'a>>,
    /// An addition: `true` asks for `input.transcript` events.
    #[serde(default)]
    transcripts: Option<bool>,
}

#[derive(Deserialize, Default)]
struct Voice<'a> {
    #[serde(borrow, default)]
    ref_audio_base64: Option<Text<'a>>,
    #[serde(borrow, default)]
    tts_ref_audio_base64: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct AppendEvent<I> {
    input: Option<I>,
}

#[derive(Deserialize)]
struct DuplexInput<'a> {
    #[serde(borrow)]
    audio: Option<Text<'a>>,
    #[serde(borrow, default)]
    video_frames: Option<Vec<Text<'a>>>,
    #[serde(default)]
    force_listen: Option<bool>,
    #[serde(default)]
    max_slice_nums: Option<i64>,
}

#[derive(Deserialize)]
struct ChatInput {
    messages: Option<Vec<Value>>,
    #[serde(default)]
    streaming: Option<bool>,
    #[serde(default)]
    generation: Option<Map<String, Value>>,
    #[serde(default)]
    image: Option<ChatImage>,
    #[serde(default)]
    omni_mode: Option<bool>,
    #[serde(default)]
    tts: Option<ChatTts>,
    #[serde(default)]
    use_tts_template: Option<bool>,
    #[serde(default)]
    enable_thinking: Option<bool>,
}

#[derive(Deserialize)]
struct ChatImage {
    max_slice_nums: Option<i64>,
}

#[derive(Deserialize)]
struct ChatTts {
    enabled: Option<bool>,
    ref_audio_data: Option<String>,
}

#[derive(Deserialize)]
struct CloseEvent<'a> {
    #[serde(borrow, default)]
    reason: Option<Text<'a>>,
}

/// A duplex chunk from its wire fields, validated as the spec says: the frame and the audio
/// borrowed from it (kept as a slice of the frame, for a backend that takes it as written).
/// `at` prefixes field names in errors (`input.` here, nothing in the legacy dialect).
pub(crate) fn duplex_chunk(
    (frame, audio): (&ByteString, Option<&str>),
    frames: Option<&[Text<'_>]>,
    force_listen: Option<bool>,
    max_slice_nums: Option<i64>,
    mode: Mode,
    min_samples: usize,
    at: &str,
) -> Result<DuplexChunk, ProtocolError> {
    let audio_field = format!("{at}audio");
    let b64 = audio.ok_or_else(|| ProtocolError::MissingField(format!("{audio_field} is required")))?;
    let samples = wire::decode_pcm_f32(b64, &audio_field)?;
    if samples.len() < min_samples {
        return Err(ProtocolError::InvalidPayload(format!(
            "{audio_field}: {} samples; at least {min_samples} (16 kHz mono float32) are required",
            samples.len()
        )));
    }
    // Audio mode is video mode without frames: frames sent anyway are ignored.
    let frames = match (mode, frames) {
        (Mode::Video, Some(frames)) => frames
            .iter()
            .enumerate()
            .map(|(i, f)| wire::decode_jpeg(f, &format!("{at}video_frames[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
        _ => Vec::new(),
    };
    Ok(DuplexChunk {
        audio_base64: wire::slice_of(frame, b64),
        audio: samples,
        frames,
        force_listen: force_listen.unwrap_or(false),
        max_slice_nums: wire::slice_nums(max_slice_nums, &format!("{at}max_slice_nums"))?,
    })
}

fn chat_message(v: &Value, i: usize) -> Result<ChatMessage, ProtocolError> {
    let at = format!("input.messages[{i}]");
    let obj = v.as_object().ok_or_else(|| ProtocolError::InvalidPayload(format!("{at}: must be an object")))?;
    let role = match obj.get("role") {
        None => {
            return Err(ProtocolError::MissingField(format!("{at}.role is required")));
        }
        Some(Value::String(r)) => {
            r.parse::<Role>().map_err(|e| ProtocolError::InvalidPayload(format!("{at}.role: {e}")))?
        }
        Some(_) => {
            return Err(ProtocolError::InvalidPayload(format!("{at}.role: must be a string")));
        }
    };
    let mut message = ChatMessage::text(role, "");
    match obj.get("content") {
        None => {
            return Err(ProtocolError::MissingField(format!("{at}.content is required")));
        }
        Some(Value::String(text)) => message.text = text.clone(),
        Some(Value::Array(parts)) => {
            for (k, part) in parts.iter().enumerate() {
                let pat = format!("{at}.content[{k}]");
                let kind = part.get("type").and_then(Value::as_str).ok_or_else(|| {
                    ProtocolError::MissingField(format!("{pat}.type is required (text, image or audio)"))
                })?;
                let data = |name: &str| {
                    part.get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{pat}.{name} is required")))
                };
                match kind {
                    "text" => {
                        if !message.text.is_empty() {
                            message.text.push('\n');
                        }
                        message.text.push_str(data("text")?);
                    }
                    "image" => {
                        let bytes = wire::decode_base64(data("data")?, &format!("{pat}.data"))?;
                        wire::image_type(&bytes, &format!("{pat}.data"))?;
                        message.images.push(bytes);
                    }
                    "audio" => message.audios.push(wire::decode_pcm_f32(data("data")?, &format!("{pat}.data"))?),
                    other => {
                        return Err(ProtocolError::InvalidPayload(format!(
                            "{pat}.type: unknown content type '{other}' (expected text, image or audio)"
                        )));
                    }
                }
            }
        }
        Some(_) => {
            return Err(ProtocolError::InvalidPayload(format!("{at}.content: must be a string or a list of parts")));
        }
    }
    Ok(message)
}

/// `payload.config`: the ABI's own fields typed, every other setting by name (checked
/// when the documents name it).
fn duplex_config(config: &Map<String, Value>) -> Result<(Generation, Settings), ProtocolError> {
    generation_settings(config, "payload.config.")
}

/// Generation settings as a client gives them (`payload.config`, a chat turn's
/// `input.generation`): the ABI's own fields, and every other setting by name, checked where
/// documented; `at` prefixes names in errors.
fn generation_settings(config: &Map<String, Value>, at: &str) -> Result<(Generation, Settings), ProtocolError> {
    let invalid = |name: &str, why: &str| ProtocolError::InvalidPayload(format!("{at}{name}: {why}"));
    let whole = |name: &str, min: u64, max: u64| -> Result<Option<u32>, ProtocolError> {
        match config.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n as u32)),
                _ => Err(invalid(name, &format!("must be a whole number in {min}..={max}"))),
            },
        }
    };
    let mut g = Generation {
        max_new_tokens: whole("max_new_tokens", 1, 1_000_000)?,
        force_listen_count: whole("force_listen_count", 0, 1000)?,
        ..Generation::default()
    };
    if let Some(v) = config.get("max_slice_nums").filter(|v| !v.is_null()) {
        let n = v.as_i64().ok_or_else(|| invalid("max_slice_nums", "must be a whole number"))?;
        g.max_slice_nums = wire::slice_nums(Some(n), &format!("{at}max_slice_nums"))?;
    }
    if let Some(v) = config.get("temperature").filter(|v| !v.is_null()) {
        g.temperature = Some(settings::temperature(v, &format!("{at}temperature"))? as f32);
    }
    if let Some(v) = config.get("length_penalty").filter(|v| !v.is_null()) {
        match v.as_f64() {
            Some(x) if x > 0.0 && x <= 10.0 => g.length_penalty = Some(x as f32),
            _ => return Err(invalid("length_penalty", "must be a number above 0, at most 10")),
        }
    }
    let own = ["max_new_tokens", "force_listen_count", "max_slice_nums", "temperature", "length_penalty"];
    let mut s = Settings::default();
    for (name, v) in config.iter().filter(|(k, _)| !own.contains(&k.as_str())) {
        s.set(DUPLEX_CONFIG, name, v, at)?;
    }
    g.settings = s.for_backend();
    Ok((g, s))
}

impl Current {
    fn init(&mut self, text: &str) -> Result<Inbound, DecodeError> {
        let event: InitEvent = wire::parse_event(text, &["payload", "payload.config", "payload.voice"])?;
        let p = event.payload.ok_or_else(|| ProtocolError::MissingField("payload is required (an object)".into()))?;
        let mut setup = SessionSetup::new(self.mode.session_kind());
        setup.system_prompt = p.system_prompt.or(p.instructions).map(|t| t.0.into_owned()).unwrap_or_default();
        let config = p.config.unwrap_or_default();
        let (generation, settings) = duplex_config(&config)?;
        setup.generation = generation;
        let voice = p.voice.unwrap_or_default();
        if let Some(b64) = &voice.ref_audio_base64 {
            setup.ref_audio = self.reference(b64, "payload.voice.ref_audio_base64")?;
        }
        setup.tts_ref_audio = match &voice.tts_ref_audio_base64 {
            Some(b64) => self.reference(b64, "payload.voice.tts_ref_audio_base64")?,
            // The reference voice is the speech voice too unless another is given.
            None => setup.ref_audio.clone(),
        };
        self.config = config;
        self.settings = settings;
        self.transcripts = p.transcripts.unwrap_or(false);
        Ok(Inbound::Init(setup))
    }

    fn append(&mut self, text: &ByteString) -> Result<Vec<Inbound>, DecodeError> {
        if self.mode == Mode::Chat {
            return Ok(vec![self.turn(text)?]);
        }
        let event: AppendEvent<DuplexInput> = wire::parse_event(text, &["input"])?;
        let input = event.input.ok_or_else(|| ProtocolError::MissingField("input is required (an object)".into()))?;
        let chunk = duplex_chunk(
            (text, input.audio.as_deref()),
            input.video_frames.as_deref(),
            input.force_listen,
            input.max_slice_nums,
            self.mode,
            self.limits.min_audio_samples,
            "input.",
        )?;
        let mut commands = Vec::with_capacity(1);
        self.hear(&chunk.audio, &mut commands);
        commands.insert(0, Inbound::Chunk(chunk));
        Ok(commands)
    }

    fn turn(&mut self, text: &str) -> Result<Inbound, DecodeError> {
        let event: AppendEvent<ChatInput> =
            wire::parse_event(text, &["input", "input.generation", "input.image", "input.tts"])?;
        let input = event.input.ok_or_else(|| ProtocolError::MissingField("input is required (an object)".into()))?;
        let messages =
            input.messages.ok_or_else(|| ProtocolError::MissingField("input.messages is required".into()))?;
        if messages.is_empty() {
            return Err(ProtocolError::InvalidPayload("input.messages: must not be empty".into()).into());
        }
        let messages = messages.iter().enumerate().map(|(i, m)| chat_message(m, i)).collect::<Result<Vec<_>, _>>()?;
        if !messages.iter().any(|m| m.role == Role::User) {
            return Err(ProtocolError::InvalidPayload("input.messages: needs at least one user message".into()).into());
        }
        let (generation, settings) = match &input.generation {
            Some(g) => generation_settings(g, "input.generation.")?,
            None => (Generation::default(), Settings::default()),
        };
        // The session takes the turn unless it is not created yet or has too many outstanding.
        if let Some(applied) = &self.applied
            && self.turns.len() < self.limits.max_turns
        {
            let backend = omni_actors::domain::BackendInfo { settings: applied.clone(), ..Default::default() };
            self.turns.push_back(settings.unsupported(&backend));
        }
        let max_slice_nums =
            wire::slice_nums(input.image.and_then(|i| i.max_slice_nums), "input.image.max_slice_nums")?;
        let tts = input.tts.unwrap_or(ChatTts { enabled: None, ref_audio_data: None });
        let tts_ref_audio = match &tts.ref_audio_data {
            Some(b64) => self.reference(b64, "input.tts.ref_audio_data")?,
            None => Vec::new(),
        };
        Ok(Inbound::Turn {
            input: TurnInput {
                messages,
                generation: Generation { max_slice_nums, ..generation },
                speech: tts.enabled.unwrap_or(false),
                thinking: input.enable_thinking.unwrap_or(false),
                tts_template: input.use_tts_template.unwrap_or(false),
                omni: input.omni_mode.unwrap_or(false),
                tts_ref_audio,
                // Each append carries the whole conversation.
                continues: false,
                ..TurnInput::default()
            },
            streaming: input.streaming.unwrap_or(true),
        })
    }
}

/// `session.close`, shared with the legacy dialect.
pub(crate) fn close(text: &str) -> Result<Inbound, DecodeError> {
    let event: CloseEvent = wire::parse_event(text, &[])?;
    Ok(Inbound::Close { reason: event.reason.map(|t| t.0.into_owned()) })
}

impl Dialect for Current {
    fn name(&self) -> &'static str {
        "minicpm"
    }

    fn decode(&mut self, text: &ByteString, _replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        let kind = wire::event_type(text)?;
        Ok(match kind.as_ref() {
            "session.init" => vec![self.init(text)?],
            "input.append" => self.append(text)?,
            "session.close" => vec![close(text)?],
            other => {
                return Err(ProtocolError::UnknownEvent(format!("unknown event type '{other}'")).into());
            }
        })
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        match event {
            Outbound::Created { session_id, kind, prompt_length, queue_wait_ms, backend } => {
                self.applied = Some(backend.settings.clone());
                self.heard.on =
                    self.heard.gateway_asr && self.transcripts && !backend.transcripts && self.mode != Mode::Chat;
                self.session_id = session_id.to_string();
                out.push(self.created(session_id, kind, prompt_length, queue_wait_ms, backend))
            }
            Outbound::TurnDone { .. } => {
                // The settings of the turn's `generation` the backend does not apply.
                let unsupported = self.turns.pop_front().unwrap_or_default();
                let names: Vec<String> = unsupported.into_iter().map(|n| format!("generation.{n}")).collect();
                turn_done(event, &names, out);
            }
            // What the model heard the user say, when the backend reports it and the client
            // asked (`payload.transcripts`).
            Outbound::Transcript { session_id, input_id, response_id, text } if self.transcripts => {
                let mut v =
                    json!({"type": "input.transcript", "session_id": session_id, "input_id": input_id, "text": text});
                if let Some(r) = response_id {
                    v["response_id"] = json!(r);
                }
                out.push(v.to_string());
            }
            // The gateway's transcript of a turn its detector found (a failure is logged where
            // it happened; the client hears nothing of a turn it could not transcribe).
            Outbound::UserTranscript { item_id, result: Ok(text) } if self.transcripts && !text.is_empty() => {
                let v = json!({"type": "input.transcript", "session_id": self.session_id, "input_id": item_id,
                               "text": text});
                out.push(v.to_string());
            }
            other => encode(other, out),
        }
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        JsonRedactor::shared(AudioEncoding::F32)
    }
}

fn queue_event(kind: &str, q: QueueInfo) -> String {
    json!({
        "type": kind,
        "position": q.position,
        "estimated_wait_s": (q.estimated_wait_s * 10.0).round() / 10.0,
        "estimate": if q.measured { "measured" } else { "typical" },
        "ticket_id": format!("ticket_{}", q.ticket),
        "queue_length": q.queue_length,
    })
    .to_string()
}

/// The queue, error and close events every MiniCPM-o dialect shares.
pub(crate) fn encode_common(event: &Outbound<'_>, closed_reason: &str) -> Option<String> {
    Some(match event {
        Outbound::Queued(q) => queue_event("session.queued", *q),
        Outbound::QueueUpdate(q) => queue_event("session.queue_update", *q),
        Outbound::QueueDone => json!({"type": "session.queue_done"}).to_string(),
        Outbound::Resumed { session_id, token, replayed, lost, voice_skipped_ms, away_ms } => json!({
            "type": "session.resumed", "session_id": session_id, "resume_token": token, "replayed": replayed,
            "lost": lost, "audio_skipped_ms": voice_skipped_ms, "away_ms": away_ms,
        })
        .to_string(),
        Outbound::Error(e) | Outbound::ReconfigureFailed(e) | Outbound::TurnFailed { error: e, .. } => json!({
            "type": "error",
            "error": {"code": e.code(), "message": e.to_string(), "type": e.kind().as_str()},
        })
        .to_string(),
        Outbound::Closed { session_id, .. } => {
            let mut v = json!({"type": "session.closed", "reason": closed_reason});
            if let Some(id) = session_id {
                v["session_id"] = json!(id);
            }
            v.to_string()
        }
        _ => return None,
    })
}

/// The part of a session's setup a `payload.config` setting of this name sets.
fn setup_field(name: &str) -> Option<SetupField> {
    match name {
        "length_penalty" => Some(SetupField::LengthPenalty),
        "max_slice_nums" => Some(SetupField::MaxSliceNums),
        "temperature" => Some(SetupField::Temperature),
        "max_new_tokens" => Some(SetupField::MaxNewTokens),
        _ => None,
    }
}

impl Current {
    /// The settings of `payload.config` the backend does not apply: by name, and those of the
    /// ABI's own fields it ignores (a `max_slice_nums` of 1 asks for nothing).
    fn unsupported(&self, backend: &BackendInfo) -> Vec<String> {
        let mut names = self.settings.unsupported(backend);
        for (name, v) in &self.config {
            // Null, or one slice, asks for nothing.
            let neutral = v.is_null() || (name == "max_slice_nums" && v.as_i64() == Some(1));
            let ignored = setup_field(name).is_some_and(|f| backend.ignored.contains(&f));
            if !neutral && ignored && !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// `session.created`, echoing the configuration accepted and naming the settings the
    /// backend does not apply.
    fn created(
        &self,
        session_id: &str,
        kind: omni_actors::domain::SessionKind,
        prompt_length: u64,
        queue_wait_ms: u64,
        backend: &BackendInfo,
    ) -> String {
        let mut created = json!({
            "type": "session.created",
            "session_id": session_id,
            "mode": kind.runtime_name(),
            "config": self.config,
            "unsupported_settings": self.unsupported(backend),
            "metrics": {"prompt_length": prompt_length, "queue_wait_ms": queue_wait_ms},
            "backend": backend.name,
        });
        if kind == omni_actors::domain::SessionKind::Duplex {
            // The chunk the model answers best on, from the smallest `input.append` takes
            // (`limits.min_audio_samples`, 250 ms by default) to one second: a client may send
            // chunks this short.
            let smallest = (self.limits.min_audio_samples * 1000).div_ceil(16000);
            created["input_chunk_ms"] = json!((backend.duplex_chunk_samples() * 1000 / 16000).max(smallest));
        }
        created.to_string()
    }
}

fn step_metrics(o: &StepOutcome) -> Value {
    json!({
        "kv_cache_length": o.kv_length,
        "prefill_ms": o.prefill_us as f64 / 1000.0,
        "generate_ms": o.generate_us as f64 / 1000.0,
    })
}

fn encode(event: Outbound<'_>, out: &mut Outbox) {
    let reason = match &event {
        Outbound::Closed { reason, .. } => reason.as_str(),
        _ => "",
    };
    if let Some(frame) = encode_common(&event, reason) {
        out.push(frame);
        return;
    }
    let delta = |kind: &str, session_id: &str, capacity: usize| {
        JsonWriter::new(capacity)
            .field("type", "response.output.delta")
            .field("kind", kind)
            .field("session_id", session_id)
    };
    match event {
        Outbound::Step { session_id, response_id, input_id, outcome } => match outcome.kind {
            StepKind::Listen => out.push(
                delta("listen", session_id, 256)
                    .field("input_id", input_id)
                    .field("metrics", step_metrics(outcome))
                    .finish(),
            ),
            StepKind::Speak => {
                if !outcome.text.is_empty() {
                    out.push(
                        delta("text", session_id, 256 + outcome.text.len())
                            .field("response_id", response_id)
                            .field("input_id", input_id)
                            .field("text", &outcome.text)
                            .field("metrics", step_metrics(outcome))
                            .finish(),
                    );
                }
                // The turn's end rides on an audio delta, one with no audio when the step that
                // ends it said nothing more (a model that did not know the answer was over when
                // it sent its last words).
                if !outcome.audio.is_empty() || outcome.end_of_turn {
                    delta("audio", session_id, 256 + wire::pcm_b64_len(outcome.audio.len()))
                        .field("response_id", response_id)
                        .field("input_id", input_id)
                        .pcm_field("audio", &outcome.audio)
                        .field("end_of_turn", outcome.end_of_turn)
                        .field("metrics", step_metrics(outcome))
                        .finish_into(out, outcome.audio.len());
                }
            }
        },
        Outbound::TurnDelta { session_id, response_id, input_id, text, audio, kv_length, generate_us, .. } => {
            let metrics = json!({"kv_cache_length": kv_length, "generate_ms": generate_us as f64 / 1000.0});
            if !text.is_empty() {
                out.push(
                    delta("text", session_id, 256 + text.len())
                        .field("response_id", response_id)
                        .field("input_id", input_id)
                        .field("text", text)
                        .field("metrics", &metrics)
                        .finish(),
                );
            }
            if !audio.is_empty() {
                delta("audio", session_id, 256 + wire::pcm_b64_len(audio.len()))
                    .field("response_id", response_id)
                    .field("input_id", input_id)
                    .pcm_field("audio", audio)
                    .field("metrics", &metrics)
                    .finish_into(out, audio.len());
            }
        }
        Outbound::TurnDone { .. } => turn_done(event, &[], out),
        Outbound::Queued(_)
        | Outbound::QueueUpdate(_)
        | Outbound::QueueDone
        | Outbound::Resumed { .. }
        | Outbound::Error(_)
        | Outbound::ReconfigureFailed(_)
        | Outbound::TurnFailed { .. }
        | Outbound::UserTranscript { .. }
        | Outbound::Decided { .. }
        | Outbound::Closed { .. }
        | Outbound::Created { .. }
        | Outbound::Transcript { .. }
        | Outbound::Reconfigured { .. } => {}
    }
}

/// `response.done`, with the settings of the turn the backend did not apply when there are some.
fn turn_done(event: Outbound<'_>, unsupported: &[String], out: &mut Outbox) {
    let Outbound::TurnDone {
        session_id,
        response_id,
        text,
        audio,
        input_tokens,
        output_tokens,
        kv_length,
        duration_ms,
        cancelled,
        ..
    } = event
    else {
        return;
    };
    let metrics = json!({
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "kv_cache_length": kv_length,
        "duration_ms": duration_ms,
    });
    let mut w = JsonWriter::new(256 + text.len() + audio.map_or(0, |a| wire::pcm_b64_len(a.len())))
        .field("type", "response.done")
        .field("session_id", session_id)
        .field("response_id", response_id)
        .field("text", text)
        .field("reason", if cancelled { "cancelled" } else { "turn_end" })
        .field("metrics", metrics);
    if !unsupported.is_empty() {
        w = w.field("unsupported_settings", unsupported);
    }
    if let Some(audio) = audio {
        w = w.pcm_field("audio", audio);
    }
    w.finish_into(out, audio.map_or(0, <[f32]>::len));
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::SessionKind;

    fn b64(samples: &[f32]) -> String {
        let mut s = String::new();
        wire::encode_pcm_f32(samples, &mut s);
        s
    }

    fn decode(d: &mut Current, v: Value) -> Result<Inbound, DecodeError> {
        d.decode(&bytestring::ByteString::from(String::from(&v.to_string())), &mut Outbox::default())
            .map(|mut c| c.remove(0))
    }

    #[test]
    fn chat_generation_settings_travel_by_name_and_those_not_applied_are_told_in_response_done() {
        let mut d = Current::new(Mode::Chat, Limits::default(), &crate::vad::energy());
        let backend = BackendInfo { settings: vec!["top_k".into()], ..BackendInfo::default() };
        let mut out = Outbox::default();
        let kind = SessionKind::Turn;
        d.encode(
            Outbound::Created { session_id: "s", kind, prompt_length: 0, queue_wait_ms: 0, backend: &backend },
            &mut out,
        );
        let turn = |generation: Value| {
            json!({"type": "input.append", "input": {"generation": generation,
                "messages": [{"role": "user", "content": "hi"}]}})
        };
        let Ok(Inbound::Turn { input, .. }) =
            decode(&mut d, turn(json!({"top_k": 5, "mystery": 1, "temperature": 0.5})))
        else {
            panic!()
        };
        assert_eq!(input.generation.temperature, Some(0.5));
        let sent: Vec<&str> = input.generation.settings.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(sent, ["mystery", "top_k"], "every setting travels by name");
        decode(&mut d, turn(json!({"top_k": 5}))).unwrap();
        assert_eq!(
            code(decode(&mut d, turn(json!({"top_k": "x"})))),
            "invalid_payload: input.generation.top_k: must be a whole number"
        );
        // The first answer is spoken and not streamed: its `response.done` carries the audio.
        let voice = [0.25f32; 8];
        let done = |d: &mut Current, audio: Option<&[f32]>| {
            let mut out = Outbox::default();
            d.encode(
                Outbound::TurnDone {
                    session_id: "s",
                    response_id: "r",
                    text: "ok",
                    audio,
                    input_tokens: 1,
                    output_tokens: 1,
                    input_audio_tokens: 0,
                    output_audio_tokens: 0,
                    kv_length: 2,
                    duration_ms: 1,
                    cancelled: false,
                },
                &mut out,
            );
            serde_json::from_str::<Value>(out.texts()[0]).unwrap()
        };
        let first = done(&mut d, Some(&voice));
        assert_eq!(first["unsupported_settings"], json!(["generation.mystery"]));
        assert_eq!(first["audio"], json!(b64(&voice)));
        assert!(done(&mut d, None).get("unsupported_settings").is_none(), "the second turn asked for none");
    }

    /// A session created on a backend that reports no transcripts, for a client that asked.
    fn created_without_transcripts(gateway_asr: bool, asked: bool) -> Current {
        let mut d =
            Current::new(Mode::Audio, Limits::default(), &crate::vad::energy()).with_gateway_transcription(gateway_asr);
        let init = json!({"type": "session.init", "payload": {"transcripts": asked}});
        decode(&mut d, init).unwrap();
        let backend = BackendInfo { transcripts: false, ..BackendInfo::default() };
        let created = Outbound::Created {
            session_id: "sess_1",
            kind: SessionKind::Duplex,
            prompt_length: 0,
            queue_wait_ms: 0,
            backend: &backend,
        };
        d.encode(created, &mut Outbox::default());
        d
    }

    fn append_all(d: &mut Current, samples: &[f32]) -> Vec<Inbound> {
        let v = json!({"type": "input.append", "input": {"audio": b64(samples)}});
        d.decode(&bytestring::ByteString::from(v.to_string()), &mut Outbox::default()).unwrap()
    }

    #[test]
    fn the_gateway_transcribes_the_users_turns_for_a_backend_that_does_not() {
        let mut d = created_without_transcripts(true, true);
        let tone: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.157).sin()).collect();
        let silence = vec![0.0f32; 16000];
        // input_1 silence, input_2 the speech, input_3 silence: its end is found in input_3.
        assert!(matches!(&append_all(&mut d, &silence)[..], [Inbound::Chunk(_)]));
        assert!(matches!(&append_all(&mut d, &tone)[..], [Inbound::Chunk(_)]));
        let cmds = append_all(&mut d, &silence);
        let [Inbound::Chunk(_), Inbound::Transcribe { item_id, audio }] = &cmds[..] else { panic!("{cmds:?}") };
        assert_eq!(item_id, "input_3");
        // All of the speech, with the padding before it (300 ms) and a tail after it (200 ms).
        let loud = |s: &[f32]| s.iter().filter(|s| s.abs() > 0.05).count();
        assert_eq!(loud(audio), loud(&tone));
        assert_eq!(audio.len(), (300 + 1000 + 200) * 16);
        let mut out = Outbox::default();
        d.encode(Outbound::UserTranscript { item_id: "input_3", result: Ok("What is two plus two?") }, &mut out);
        let v: Value = serde_json::from_str(out.texts()[0]).unwrap();
        assert_eq!(
            v,
            json!({"type": "input.transcript", "session_id": "sess_1", "input_id": "input_3",
                   "text": "What is two plus two?"})
        );
        // A turn it could not transcribe, or heard as nothing, says nothing.
        out.clear();
        d.encode(Outbound::UserTranscript { item_id: "input_3", result: Err("too many waiting") }, &mut out);
        d.encode(Outbound::UserTranscript { item_id: "input_3", result: Ok("") }, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn no_transcription_unless_the_client_asked_and_the_gateway_runs_one() {
        let tone: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.157).sin()).collect();
        for (gateway_asr, asked) in [(false, true), (true, false)] {
            let mut d = created_without_transcripts(gateway_asr, asked);
            for samples in [&tone, &vec![0.0; 16000]] {
                assert!(matches!(&append_all(&mut d, samples)[..], [Inbound::Chunk(_)]));
            }
        }
    }

    fn code(r: Result<Inbound, DecodeError>) -> String {
        match r {
            Err(DecodeError::Protocol(e)) => format!("{}: {e}", e.code()),
            Err(DecodeError::Unparseable(_)) => "unparseable".into(),
            Ok(_) => "ok".into(),
        }
    }

    #[test]
    fn a_chunk_keeps_the_clients_base64_unless_the_json_escaped_it() {
        let mut d = Current::new(Mode::Audio, Limits::default(), &crate::vad::energy());
        let samples: Vec<f32> = (0..16000).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        let audio = b64(&samples);
        let Ok(Inbound::Chunk(c)) = decode(&mut d, json!({"type": "input.append", "input": {"audio": audio}})) else {
            panic!("a chunk")
        };
        assert_eq!(c.audio_base64.as_deref(), Some(audio.as_bytes()));
        let escaped = format!(r#"{{"type":"input.append","input":{{"audio":"{}"}}}}"#, audio.replace('/', "\\/"));
        assert!(escaped.contains("\\/"), "the audio has a slash to escape");
        let decoded = d.decode(&escaped.into(), &mut Outbox::default());
        let Ok([Inbound::Chunk(c)]) = decoded.as_deref() else { panic!("a chunk") };
        assert_eq!(c.audio_base64, None, "the parser unescaped a copy: encoded again when needed");
        assert_eq!(c.audio, samples);
    }

    #[test]
    fn init_reaches_the_backend_setup() {
        let mut d = Current::new(Mode::Video, Limits::default(), &crate::vad::energy());
        let cmd = decode(
            &mut d,
            json!({"type": "session.init", "payload": {
                "instructions": "be kind", "config": {"length_penalty": 1.2, "max_slice_nums": 4},
                "voice": {"ref_audio_base64": b64(&[0.5; 8]), "tts_ref_audio_base64": b64(&[0.25; 4])}}}),
        )
        .unwrap();
        let Inbound::Init(s) = cmd else { panic!("{cmd:?}") };
        assert_eq!(s.kind, SessionKind::Duplex);
        assert_eq!(s.system_prompt, "be kind");
        assert_eq!(s.generation.length_penalty, Some(1.2));
        assert_eq!(s.generation.max_slice_nums, Some(4));
        assert_eq!((s.ref_audio.len(), s.tts_ref_audio.len()), (8, 4));
    }

    #[test]
    fn the_reference_voice_speaks_too_unless_another_is_given_and_settings_pass_by_name() {
        let mut d = Current::new(Mode::Audio, Limits::default(), &crate::vad::energy());
        let cmd = decode(
            &mut d,
            json!({"type": "session.init", "payload": {"config": {"top_p": 0.8, "listen_top_k": null, "temperature": 0.7},
                   "voice": {"ref_audio_base64": b64(&[0.5; 8])}}}),
        )
        .unwrap();
        let Inbound::Init(s) = cmd else { panic!("{cmd:?}") };
        assert_eq!(s.tts_ref_audio, vec![0.5; 8], "tts_ref_audio_base64 falls back to ref_audio_base64");
        assert_eq!(s.generation.settings, vec![("top_p".to_string(), "0.8".to_string())]);
        assert_eq!(s.generation.temperature, Some(0.7));
    }

    #[test]
    fn init_errors() {
        let mut d = Current::new(Mode::Video, Limits::default(), &crate::vad::energy());
        assert_eq!(
            code(decode(&mut d, json!({"type": "session.init"}))),
            "missing_field: payload is required (an object)"
        );
        assert_eq!(
            code(decode(&mut d, json!({"type": "session.init", "payload": 3}))),
            "missing_field: payload must be an object"
        );
        assert_eq!(
            code(decode(&mut d, json!({"type": "session.init", "payload": {"system_prompt": 5}}))),
            "invalid_payload: payload.system_prompt: invalid type: integer `5`, expected a string"
        );
        assert!(
            code(decode(&mut d, json!({"type": "session.init", "payload": {"voice": {"ref_audio_base64": "%%"}}})))
                .starts_with("invalid_payload: payload.voice.ref_audio_base64: not valid base64")
        );
    }

    #[test]
    fn duplex_append_is_validated() {
        let mut d = Current::new(Mode::Video, Limits::default(), &crate::vad::energy());
        let jpeg = wire::decode_base64("/9j/4AAQ", "x").unwrap();
        assert!(wire::is_jpeg(&jpeg));
        let ok = decode(
            &mut d,
            json!({"type": "input.append", "input": {"audio": b64(&[0.0; 4000]), "video_frames": ["/9j/4AAQ"], "force_listen": true, "max_slice_nums": 2}}),
        )
        .unwrap();
        let Inbound::Chunk(c) = ok else { panic!() };
        assert_eq!((c.audio.len(), c.frames.len(), c.force_listen, c.max_slice_nums), (4000, 1, true, Some(2)));

        let cases = [
            (json!({"type": "input.append"}), "missing_field: input is required (an object)"),
            (json!({"type": "input.append", "input": "x"}), "missing_field: input must be an object"),
            (json!({"type": "input.append", "input": {}}), "missing_field: input.audio is required"),
            (
                json!({"type": "input.append", "input": {"audio": 1}}),
                "invalid_payload: input.audio: invalid type: integer `1`, expected a string",
            ),
            (
                json!({"type": "input.append", "input": {"audio": b64(&[0.0; 3999])}}),
                "invalid_payload: input.audio: 3999 samples; at least 4000 (16 kHz mono float32) are required",
            ),
            (
                json!({"type": "input.append", "input": {"audio": "AAAAAAA="}}),
                "invalid_payload: input.audio: 5 bytes is not a whole number of float32 samples (a multiple of 4)",
            ),
            (
                json!({"type": "input.append", "input": {"audio": b64(&[0.0; 4000]), "video_frames": ["R0lGODlh"]}}),
                "invalid_payload: input.video_frames[0]: not a JPEG image",
            ),
            (
                json!({"type": "input.append", "input": {"audio": b64(&[0.0; 4000]), "max_slice_nums": 10}}),
                "invalid_payload: input.max_slice_nums: 10 is outside 1..9",
            ),
            (
                json!({"type": "input.append", "input": {"audio": b64(&[0.0; 4000]), "force_listen": "yes"}}),
                "invalid_payload: input.force_listen: invalid type: string \"yes\", expected a boolean",
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(code(decode(&mut d, event.clone())), expected, "{event}");
        }
    }

    #[test]
    fn audio_mode_ignores_frames() {
        let mut d = Current::new(Mode::Audio, Limits::default(), &crate::vad::energy());
        let cmd = decode(
            &mut d,
            json!({"type": "input.append", "input": {"audio": b64(&[0.0; 4000]), "video_frames": ["not even base64"]}}),
        );
        let Ok(Inbound::Chunk(c)) = cmd else { panic!("{cmd:?}") };
        assert!(c.frames.is_empty());
    }

    #[test]
    fn chat_append() {
        let mut d = Current::new(Mode::Chat, Limits::default(), &crate::vad::energy());
        let cmd = decode(
            &mut d,
            json!({"type": "input.append", "input": {
                "messages": [{"role": "system", "content": "short"}, {"role": "user", "content": [
                    {"type": "text", "text": "Describe"}, {"type": "image", "data": "/9j/4AAQ"}, {"type": "audio", "data": b64(&[0.1; 16])}]}],
                "streaming": false, "generation": {"max_new_tokens": 64, "length_penalty": 1.1}, "image": {"max_slice_nums": 1},
                "tts": {"enabled": true}, "enable_thinking": true}}),
        )
        .unwrap();
        let Inbound::Turn { input, streaming } = cmd else { panic!() };
        assert!(!streaming && input.speech && input.thinking);
        assert_eq!(input.messages.len(), 2);
        assert_eq!(
            (input.messages[1].text.as_str(), input.messages[1].images.len(), input.messages[1].audios[0].len()),
            ("Describe", 1, 16)
        );
        assert_eq!(input.generation.max_new_tokens, Some(64));

        let cases = [
            (json!({"type": "input.append", "input": {}}), "missing_field: input.messages is required"),
            (
                json!({"type": "input.append", "input": {"messages": []}}),
                "invalid_payload: input.messages: must not be empty",
            ),
            (
                json!({"type": "input.append", "input": {"messages": [{"content": "x"}]}}),
                "missing_field: input.messages[0].role is required",
            ),
            (
                json!({"type": "input.append", "input": {"messages": [{"role": "robot", "content": "x"}]}}),
                "invalid_payload: input.messages[0].role: unknown role 'robot' (expected system, user or assistant)",
            ),
            (
                json!({"type": "input.append", "input": {"messages": [{"role": "user"}]}}),
                "missing_field: input.messages[0].content is required",
            ),
            (
                json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": [{"type": "video"}]}]}}),
                "invalid_payload: input.messages[0].content[0].type: unknown content type 'video' (expected text, image or audio)",
            ),
            (
                json!({"type": "input.append", "input": {"messages": [{"role": "assistant", "content": "x"}]}}),
                "invalid_payload: input.messages: needs at least one user message",
            ),
            (
                json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": "x"}], "streaming": 1}}),
                "invalid_payload: input.streaming: invalid type: integer `1`, expected a boolean",
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(code(decode(&mut d, event.clone())), expected, "{event}");
        }
    }

    #[test]
    fn unknown_and_unparseable() {
        let mut d = Current::new(Mode::Video, Limits::default(), &crate::vad::energy());
        assert_eq!(
            code(decode(&mut d, json!({"type": "session.dance"}))),
            "unknown_event: unknown event type 'session.dance'"
        );
        assert_eq!(
            code(
                d.decode(&bytestring::ByteString::from(String::from("{not json")), &mut Outbox::default())
                    .map(|mut c| c.remove(0))
            ),
            "unparseable"
        );
        assert_eq!(
            code(
                d.decode(&bytestring::ByteString::from(String::from("[]")), &mut Outbox::default())
                    .map(|mut c| c.remove(0))
            ),
            "unparseable"
        );
        // The type is read from the prefix, but the rest must still be JSON.
        let truncated = r#"{"type":"input.append","input":{"audio":"AAAA"#;
        assert_eq!(
            code(
                d.decode(&bytestring::ByteString::from(String::from(truncated)), &mut Outbox::default())
                    .map(|mut c| c.remove(0))
            ),
            "unparseable"
        );
        assert_eq!(code(decode(&mut d, json!({"type": "session.close", "reason": "bye"}))), "ok");
    }

    #[test]
    fn speech_is_a_text_delta_then_an_audio_delta() {
        let outcome = StepOutcome {
            kind: StepKind::Speak,
            text: "Hi".into(),
            audio: vec![0.5; 24000],
            end_of_turn: true,
            kv_length: 77,
            output_tokens: 1,
            ..StepOutcome::default()
        };
        let mut out = Outbox::default();
        encode(
            Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_3", outcome: &outcome },
            &mut out,
        );
        let v: Vec<Value> = out.texts().into_iter().map(|f| serde_json::from_str(f).unwrap()).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0]["kind"].as_str(), v[0]["text"].as_str(), v[0]["response_id"].as_str()),
            (Some("text"), Some("Hi"), Some("r"))
        );
        assert_eq!(
            (v[1]["kind"].as_str(), v[1]["input_id"].as_str(), v[1]["end_of_turn"].as_bool()),
            (Some("audio"), Some("input_3"), Some(true))
        );
        assert_eq!(wire::decode_pcm_f32(v[1]["audio"].as_str().unwrap(), "a").unwrap().len(), 24000);
        assert_eq!(v[1]["metrics"]["kv_cache_length"], 77);
    }

    #[test]
    fn a_turn_that_ends_in_a_silent_step_still_ends() {
        let outcome = StepOutcome { kind: StepKind::Speak, end_of_turn: true, ..StepOutcome::default() };
        let mut out = Outbox::default();
        encode(
            Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_4", outcome: &outcome },
            &mut out,
        );
        let v: Vec<Value> = out.texts().into_iter().map(|f| serde_json::from_str(f).unwrap()).collect();
        assert_eq!(v.len(), 1, "{out:?}");
        assert_eq!((v[0]["kind"].as_str(), v[0]["end_of_turn"].as_bool()), (Some("audio"), Some(true)));
        assert_eq!(v[0]["audio"], "");
        // A silent step that does not end the turn says nothing.
        let quiet = StepOutcome { kind: StepKind::Speak, ..StepOutcome::default() };
        out.clear();
        encode(
            Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_5", outcome: &quiet },
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
    }
}
