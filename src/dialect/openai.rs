//! The OpenAI Realtime API shape, in three flavors: OpenAI GA, OpenAI beta
//! (`OpenAI-Beta: realtime=v1`) and Qwen-Omni-Realtime (DashScope). Served from the same
//! actors as every dialect: this codec turns the OpenAI conversation model into duplex
//! steps or turn-mode answers and back.
//!
//! - `turn_detection: server_vad` (default): appended pcm16 audio, resampled to 16 kHz, is
//!   gathered into one-second duplex steps. The model's listen/speak decisions drive the
//!   turn events; an energy detector on the input gives `speech_started` and barge-in.
//!   While a response is in progress and the client has stopped sending, the codec keeps
//!   stepping the backend with silence at the backend's own pace.
//! - `turn_detection: null`: `input_audio_buffer.commit` and `conversation.item.create`
//!   collect items; `response.create` runs one turn-mode answer on them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::dialect::{AudioFormat, DecodeError, Dialect, RecordedMedia};
use omni_actors::domain::{ChatMessage, Generation, Mode, Role, SessionKind, SessionSetup, StepKind, TurnInput};
use omni_actors::protocol::{CloseReason, ErrorKind, Inbound, Outbound, ProtocolError, QueueInfo};
use serde_json::{Map, Value, json};

use super::wire;
use crate::audio::StreamResampler;

/// Samples per duplex step: one second at 16 kHz.
const STEP: usize = 16000;
/// The client counts as idle (it stopped sending) after this long without audio.
const IDLE: Duration = Duration::from_millis(300);
/// A stalled turn is prompted with silent steps this far apart, this many times.
const PAD_EVERY: Duration = Duration::from_millis(1000);
const MAX_PADS: u32 = 5;
/// Audio held while the session is being created: at most this many steps.
const MAX_HELD_STEPS: usize = 30;
/// VAD: 20 ms windows, 100 ms of voice make an onset.
const VAD_WINDOW: usize = 320;
const VAD_ONSET_WINDOWS: u32 = 5;
/// Model output rate (the backend's 24 kHz).
const OUTPUT_RATE: u32 = 24000;

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

/// Server VAD settings as the client gave them.
#[derive(Debug, Clone, PartialEq)]
struct Vad {
    kind: String,
    threshold: f64,
    prefix_padding_ms: u64,
    silence_duration_ms: u64,
}

impl Default for Vad {
    fn default() -> Self {
        Vad { kind: "server_vad".into(), threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 }
    }
}

/// The session configuration (`session.update`).
#[derive(Debug, Clone, PartialEq)]
struct Conf {
    instructions: String,
    voice: String,
    audio_out: bool,
    vad: Option<Vad>,
    temperature: Option<f32>,
    max_tokens: Option<u32>,
    input_rate: u32,
}

impl Conf {
    fn new(flavor: Flavor) -> Conf {
        Conf {
            instructions: String::new(),
            voice: if flavor == Flavor::Qwen { "Cherry".into() } else { "alloy".into() },
            audio_out: true,
            vad: Some(Vad::default()),
            temperature: None,
            max_tokens: None,
            input_rate: flavor.default_input_rate(),
        }
    }

    fn setup(&self) -> SessionSetup {
        let mut s = SessionSetup::new(if self.vad.is_some() { SessionKind::Duplex } else { SessionKind::Turn });
        s.system_prompt = self.instructions.clone();
        s.voice = self.voice.clone();
        s.generation =
            Generation { max_new_tokens: self.max_tokens, temperature: self.temperature, ..Generation::default() };
        s
    }

    /// The RMS that counts as speech for the input detector: 0.02 at threshold 0.5.
    fn rms_threshold(&self) -> f32 {
        self.vad.as_ref().map_or(0.02, |v| (v.threshold * 0.04).clamp(0.004, 0.2) as f32)
    }
}

fn invalid(param: &str, why: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::InvalidPayload(format!("{param}: {why}"))
}

/// `input_audio_format` / `audio.input.format`: only 16-bit PCM; returns the rate if given.
fn pcm_format(v: &Value, param: &str) -> Result<Option<u32>, ProtocolError> {
    let (kind, rate) = match v {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("type").and_then(Value::as_str).unwrap_or("pcm"),
            o.get("rate").or_else(|| o.get("sample_rate")).and_then(Value::as_u64),
        ),
        _ => return Err(invalid(param, "must be a string or an object")),
    };
    if !matches!(kind, "pcm16" | "pcm" | "audio/pcm") {
        return Err(invalid(param, format!("'{kind}' is not supported (16-bit PCM only: pcm16, pcm, audio/pcm)")));
    }
    match rate {
        Some(r) if !(8000..=96000).contains(&r) => {
            Err(invalid(param, format!("sample rate {r} is outside 8000..96000")))
        }
        r => Ok(r.map(|r| r as u32)),
    }
}

fn turn_detection(v: &Value, param: &str) -> Result<Option<Vad>, ProtocolError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(o) => {
            let mut vad = Vad::default();
            if let Some(kind) = o.get("type").and_then(Value::as_str) {
                if !matches!(kind, "server_vad" | "semantic_vad") {
                    return Err(invalid(param, format!("type '{kind}' is not supported (server_vad, semantic_vad)")));
                }
                vad.kind = kind.to_string();
            }
            if let Some(t) = o.get("threshold").and_then(Value::as_f64) {
                vad.threshold = t;
            }
            if let Some(p) = o.get("prefix_padding_ms").and_then(Value::as_u64) {
                vad.prefix_padding_ms = p;
            }
            if let Some(s) = o.get("silence_duration_ms").and_then(Value::as_u64) {
                vad.silence_duration_ms = s;
            }
            Ok(Some(vad))
        }
        _ => Err(invalid(param, "must be an object or null")),
    }
}

fn modalities(v: &Value, param: &str) -> Result<bool, ProtocolError> {
    let list = v.as_array().ok_or_else(|| invalid(param, "must be a list"))?;
    let mut audio = false;
    for m in list {
        match m.as_str() {
            Some("audio") => audio = true,
            Some("text") => {}
            other => return Err(invalid(param, format!("{other:?} is not a modality (text, audio)"))),
        }
    }
    Ok(audio)
}

fn max_tokens(v: &Value, param: &str) -> Result<Option<u32>, ProtocolError> {
    match v {
        Value::String(s) if s == "inf" => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(n @ 1..=1_000_000) => Ok(Some(n as u32)),
            _ => Err(invalid(param, "must be a positive integer or \"inf\"")),
        },
        _ => Err(invalid(param, "must be a positive integer or \"inf\"")),
    }
}

impl Conf {
    /// Applies a `session` object in any flavor's shape (beta, GA, Qwen).
    fn apply(&mut self, s: &Value) -> Result<(), ProtocolError> {
        let s = s.as_object().ok_or_else(|| ProtocolError::MissingField("session must be an object".into()))?;
        let mut next = self.clone();
        let text = |key: &str| -> Result<Option<String>, ProtocolError> {
            match s.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(v)) => Ok(Some(v.clone())),
                Some(_) => Err(invalid(&format!("session.{key}"), "must be a string")),
            }
        };
        if let Some(i) = text("instructions")? {
            next.instructions = i;
        }
        if let Some(v) = text("voice")? {
            next.voice = v;
        }
        if let Some(m) = s.get("modalities") {
            next.audio_out = modalities(m, "session.modalities")?;
        }
        if let Some(m) = s.get("output_modalities") {
            next.audio_out = modalities(m, "session.output_modalities")?;
        }
        if let Some(td) = s.get("turn_detection") {
            next.vad = turn_detection(td, "session.turn_detection")?;
        }
        if let Some(f) = s.get("input_audio_format")
            && let Some(rate) = pcm_format(f, "session.input_audio_format")?
        {
            next.input_rate = rate;
        }
        if let Some(f) = s.get("output_audio_format")
            && let Some(rate) = pcm_format(f, "session.output_audio_format")?
            && rate != OUTPUT_RATE
        {
            return Err(invalid(
                "session.output_audio_format",
                format!("output audio is {OUTPUT_RATE} Hz, not {rate}"),
            ));
        }
        if let Some(t) = s.get("temperature") {
            next.temperature =
                Some(t.as_f64().ok_or_else(|| invalid("session.temperature", "must be a number"))? as f32);
        }
        for key in ["max_response_output_tokens", "max_output_tokens", "max_tokens"] {
            if let Some(v) = s.get(key) {
                next.max_tokens = max_tokens(v, &format!("session.{key}"))?;
            }
        }
        // GA: audio.input.{format, turn_detection}, audio.output.{format, voice}
        if let Some(audio) = s.get("audio") {
            let input = &audio["input"];
            if let Some(f) = input.get("format")
                && let Some(rate) = pcm_format(f, "session.audio.input.format")?
            {
                next.input_rate = rate;
            }
            if let Some(td) = input.get("turn_detection") {
                next.vad = turn_detection(td, "session.audio.input.turn_detection")?;
            }
            let output = &audio["output"];
            if let Some(v) = output.get("voice").and_then(Value::as_str) {
                next.voice = v.to_string();
            }
            if let Some(f) = output.get("format")
                && let Some(rate) = pcm_format(f, "session.audio.output.format")?
                && rate != OUTPUT_RATE
            {
                return Err(invalid(
                    "session.audio.output.format",
                    format!("output audio is {OUTPUT_RATE} Hz, not {rate}"),
                ));
            }
        }
        *self = next;
        Ok(())
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
    committed: bool,
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
    input_tokens: u64,
    output_tokens: u64,
    audio_samples: u64,
    last_step: Instant,
}

pub struct Realtime {
    flavor: Flavor,
    model: String,
    conf: Conf,
    /// The setup the backend was last prepared with.
    prepared: Option<SessionSetup>,
    phase: Phase,
    session_id: Option<String>,
    update_pending: bool,
    /// Replies held while the session is not created yet (the client hears nothing).
    deferred: Vec<String>,
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
    received_samples: u64,
    voiced_run: u32,
    silent_run: u32,
    /// The input detector hears the user speaking.
    in_speech: bool,
    user: Option<UserTurn>,
    /// Manual mode: audio (16 kHz) not yet committed, and items not yet answered.
    buffer: Vec<f32>,
    items_pending: Vec<ChatMessage>,
    frames: Vec<Vec<u8>>,
    held: VecDeque<Inbound>,
    commands: Vec<Inbound>,
    last_pad: Option<Instant>,
    pads: u32,
    response: Option<Response>,
    /// Turn-mode answers asked for and not yet done, oldest first (the backend answers in
    /// order): the response each belongs to, `None` once cancelled.
    turns: VecDeque<Option<String>>,
    recorded: Option<RecordedMedia>,
}

impl Realtime {
    pub fn new(flavor: Flavor, model: &str) -> Realtime {
        let conf = Conf::new(flavor);
        let rate = conf.input_rate;
        Realtime {
            flavor,
            model: model.to_string(),
            conf,
            prepared: None,
            phase: Phase::Waiting,
            session_id: None,
            update_pending: false,
            deferred: Vec::new(),
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
            received_samples: 0,
            voiced_run: 0,
            silent_run: 0,
            in_speech: false,
            user: None,
            buffer: Vec::new(),
            items_pending: Vec::new(),
            frames: Vec::new(),
            held: VecDeque::new(),
            commands: Vec::new(),
            last_pad: None,
            pads: 0,
            response: None,
            turns: VecDeque::new(),
            recorded: None,
        }
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
    fn reply(&mut self, out: &mut Vec<String>, kind: &str, fields: Value) {
        let frame = self.event(kind, fields);
        if self.phase == Phase::Active {
            out.push(frame);
        } else {
            self.deferred.push(frame);
        }
    }

    fn new_item(&mut self) -> String {
        self.items += 1;
        format!("item_{}", self.items)
    }

    fn received_ms(&self) -> u64 {
        self.received_samples * 1000 / 16000
    }

    fn session_object(&self) -> Value {
        let c = &self.conf;
        let vad = c.vad.as_ref().map(|v| {
            json!({"type": v.kind, "threshold": v.threshold, "prefix_padding_ms": v.prefix_padding_ms,
                   "silence_duration_ms": v.silence_duration_ms, "create_response": true, "interrupt_response": true})
        });
        let id = self.session_id.clone().unwrap_or_default();
        let tokens = c.max_tokens.map_or(json!("inf"), |n| json!(n));
        match self.flavor {
            Flavor::Ga => json!({
                "type": "realtime", "object": "realtime.session", "id": id, "model": self.model,
                "output_modalities": if c.audio_out { vec!["audio"] } else { vec!["text"] },
                "instructions": c.instructions,
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": c.input_rate}, "turn_detection": vad,
                              "transcription": null, "noise_reduction": null},
                    "output": {"format": {"type": "audio/pcm", "rate": OUTPUT_RATE}, "voice": c.voice, "speed": 1.0},
                },
                "tools": [], "tool_choice": "auto", "max_output_tokens": tokens,
            }),
            Flavor::Beta | Flavor::Qwen => {
                let format = if self.flavor == Flavor::Qwen { "pcm" } else { "pcm16" };
                json!({
                    "id": id, "object": "realtime.session", "model": self.model,
                    "modalities": if c.audio_out { vec!["text", "audio"] } else { vec!["text"] },
                    "instructions": c.instructions, "voice": c.voice,
                    "input_audio_format": format, "output_audio_format": format,
                    "input_audio_transcription": null, "turn_detection": vad,
                    "tools": [], "tool_choice": "auto", "temperature": c.temperature.unwrap_or(0.8),
                    "max_response_output_tokens": tokens,
                })
            }
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
            self.held.push_back(cmd);
        }
    }

    fn send_step(&mut self, samples: Vec<f32>, force_listen: bool) {
        let frames = std::mem::take(&mut self.frames);
        self.command(Inbound::Chunk(omni_actors::domain::DuplexChunk {
            audio: samples,
            frames,
            force_listen,
            max_slice_nums: None,
        }));
    }

    /// Fills the step with silence and sends it (the client stopped sending).
    fn pad_step(&mut self, now: Instant) {
        let mut samples = std::mem::take(&mut self.step);
        samples.resize(STEP, 0.0);
        self.last_pad = Some(now);
        self.send_step(samples, false);
    }

    fn client_idle(&self, now: Instant) -> bool {
        self.last_append.is_none_or(|t| now.duration_since(t) >= IDLE)
    }
}

// ---- input -----------------------------------------------------------------

/// pcm16 little-endian base64 into float32 samples.
fn decode_pcm16(b64: &str, param: &str) -> Result<Vec<f32>, ProtocolError> {
    let bytes = STANDARD.decode(b64).map_err(|e| invalid(param, format!("not valid base64 ({e})")))?;
    if bytes.len() % 2 != 0 {
        return Err(invalid(param, format!("{} bytes is not a whole number of 16-bit samples", bytes.len())));
    }
    Ok(bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0).collect())
}

fn encode_pcm16(samples: &[f32]) -> String {
    let bytes: Vec<u8> =
        samples.iter().flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

fn field_str<'a>(v: &'a Value, key: &str) -> Result<&'a str, ProtocolError> {
    match v.get(key) {
        None | Some(Value::Null) => Err(ProtocolError::MissingField(format!("{key} is required"))),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(invalid(key, "must be a string")),
    }
}

impl Realtime {
    fn update(&mut self, v: &Value, out: &mut Vec<String>) -> Result<(), ProtocolError> {
        let session = v.get("session").ok_or_else(|| ProtocolError::MissingField("session is required".into()))?;
        self.conf.apply(session)?;
        if self.conf.input_rate != self.resampler_rate {
            self.resampler = StreamResampler::new(self.conf.input_rate, 16000).map_err(|e| invalid("session", e))?;
            self.resampler_rate = self.conf.input_rate;
        }
        match self.phase {
            Phase::Active => {
                let body = json!({"session": self.session_object()});
                self.reply(out, "session.updated", body);
                self.reconfigure_if_changed();
            }
            _ => self.update_pending = true,
        }
        Ok(())
    }

    /// The backend follows the configuration (mode, instructions, voice...).
    fn reconfigure_if_changed(&mut self) {
        let setup = self.conf.setup();
        if self.prepared.as_ref() != Some(&setup) {
            self.prepared = Some(setup.clone());
            self.response = None;
            self.step.clear();
            self.commands.push(Inbound::Reconfigure(setup));
        }
    }

    fn append(&mut self, v: &Value, now: Instant, out: &mut Vec<String>) -> Result<(), ProtocolError> {
        let pcm = decode_pcm16(field_str(v, "audio")?, "audio")?;
        let mut samples = Vec::with_capacity(pcm.len() * 16000 / self.conf.input_rate as usize + 1);
        self.resampler.push(&pcm, &mut samples);
        self.heard_audio = true;
        self.last_append = Some(now);
        self.recorded = Some((vec![samples.clone()], Vec::new()));
        if self.conf.vad.is_none() {
            self.buffer.extend_from_slice(&samples);
            return Ok(());
        }
        self.detect_speech(&samples, out);
        self.step.extend_from_slice(&samples);
        while self.step.len() >= STEP {
            let rest = self.step.split_off(STEP);
            let step = std::mem::replace(&mut self.step, rest);
            self.send_step(step, false);
        }
        Ok(())
    }

    /// Energy detector on the 16 kHz input: speech onset is `speech_started`, and while
    /// the model speaks it is a barge-in.
    fn detect_speech(&mut self, samples: &[f32], out: &mut Vec<String>) {
        let threshold = self.conf.rms_threshold();
        let pause_windows = self.conf.vad.as_ref().map_or(25, |v| (v.silence_duration_ms / 20).max(1)) as u32;
        for window in samples.chunks(VAD_WINDOW) {
            self.received_samples += window.len() as u64;
            let rms = (window.iter().map(|s| s * s).sum::<f32>() / window.len() as f32).sqrt();
            if rms >= threshold {
                self.voiced_run += 1;
                self.silent_run = 0;
            } else {
                self.silent_run += 1;
                self.voiced_run = 0;
            }
            if self.in_speech && self.silent_run >= pause_windows {
                self.in_speech = false;
            }
            if self.in_speech || self.voiced_run < VAD_ONSET_WINDOWS {
                continue;
            }
            self.in_speech = true;
            if self.user.is_none() {
                let start_ms = self.received_ms().saturating_sub(100);
                if self.response.as_ref().is_some_and(|r| r.duplex) {
                    // Barge-in: the answer in flight is cancelled, the backend listens.
                    self.finish_response(out, "cancelled", Some("turn_detected"));
                    self.commands.push(Inbound::Interrupt);
                }
                let item_id = self.new_item();
                self.user = Some(UserTurn { item_id: item_id.clone(), start_ms, announced: true, committed: false });
                self.pads = 0;
                self.reply(
                    out,
                    "input_audio_buffer.speech_started",
                    json!({"audio_start_ms": start_ms, "item_id": item_id}),
                );
            }
        }
    }

    fn commit(&mut self, now: Instant, out: &mut Vec<String>) -> Result<(), ProtocolError> {
        if self.conf.vad.is_some() {
            // With server VAD the model decides; a commit only flushes what is gathered.
            if !self.step.is_empty() {
                self.pad_step(now);
            }
            return Ok(());
        }
        self.resampler.flush(&mut self.buffer);
        if self.buffer.is_empty() {
            return Err(ProtocolError::InvalidPayload(
                "input_audio_buffer: nothing to commit (append audio first)".into(),
            ));
        }
        let item_id = self.new_item();
        let audio = std::mem::take(&mut self.buffer);
        let images = std::mem::take(&mut self.frames);
        self.items_pending.push(ChatMessage { role: Role::User, text: String::new(), images, audios: vec![audio] });
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "input_audio_buffer.committed", json!({"item_id": item_id, "previous_item_id": previous}));
        let item = json!({"id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
                          "role": "user", "content": [{"type": "input_audio", "transcript": null}]});
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        Ok(())
    }

    fn create_item(&mut self, v: &Value, out: &mut Vec<String>) -> Result<(), ProtocolError> {
        let item = v.get("item").ok_or_else(|| ProtocolError::MissingField("item is required".into()))?;
        if item.get("type").and_then(Value::as_str).unwrap_or("message") != "message" {
            return Err(invalid("item.type", "only message items are supported"));
        }
        let role: Role = field_str(item, "role")
            .map_err(|_| ProtocolError::MissingField("item.role is required".into()))?
            .parse()
            .map_err(|e| invalid("item.role", e))?;
        let mut message = ChatMessage::text(role, "");
        for (i, part) in item.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let at = format!("item.content[{i}]");
            match part.get("type").and_then(Value::as_str) {
                Some("input_text" | "text" | "output_text") => {
                    let text = part
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{at}.text is required")))?;
                    message.text.push_str(text);
                }
                Some("input_audio") => {
                    let b64 = part
                        .get("audio")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{at}.audio is required")))?;
                    let pcm = decode_pcm16(b64, &format!("{at}.audio"))?;
                    let audio =
                        crate::audio::resample(&pcm, self.conf.input_rate, 16000).map_err(|e| invalid(&at, e))?;
                    message.audios.push(audio);
                }
                Some("input_image") => {
                    let b64 = part
                        .get("image_url")
                        .or_else(|| part.get("image"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| ProtocolError::MissingField(format!("{at}.image_url is required")))?;
                    message.images.push(wire::decode_jpeg(b64, &format!("{at}.image_url"))?);
                }
                other => {
                    return Err(invalid(
                        &format!("{at}.type"),
                        format!("{other:?} is not supported (input_text, input_audio, input_image)"),
                    ));
                }
            }
        }
        let item_id = item.get("id").and_then(Value::as_str).map(String::from).unwrap_or_else(|| self.new_item());
        let previous = self.last_item.replace(item_id.clone());
        let mut echoed = item.clone();
        echoed["id"] = json!(item_id);
        echoed["object"] = json!("realtime.item");
        echoed["status"] = json!("completed");
        self.items_pending.push(message);
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": echoed}));
        Ok(())
    }

    fn create_response(&mut self, v: &Value, now: Instant, out: &mut Vec<String>) -> Result<(), ProtocolError> {
        if self.response.is_some() {
            return Err(ProtocolError::NotReady(
                "a response is already in progress (conversation_already_has_active_response)".into(),
            ));
        }
        if self.conf.vad.is_some() {
            // The duplex model decides when it speaks; this only flushes gathered audio.
            if !self.step.is_empty() {
                self.pad_step(now);
            }
            return Ok(());
        }
        let r = v.get("response").cloned().unwrap_or(Value::Null);
        let audio = match r.get("modalities").or_else(|| r.get("output_modalities")) {
            Some(m) => modalities(m, "response.modalities")?,
            None => self.conf.audio_out,
        };
        let mut messages = std::mem::take(&mut self.items_pending);
        if !messages.iter().any(|m| m.role == Role::User) {
            return Err(ProtocolError::InvalidPayload(
                "response: there is no new user input to answer (commit audio or create an item)".into(),
            ));
        }
        if let Some(extra) = r.get("instructions").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            messages.insert(0, ChatMessage::text(Role::System, extra));
        }
        let input = TurnInput {
            messages,
            generation: Generation {
                max_new_tokens: self.conf.max_tokens,
                temperature: self.conf.temperature,
                ..Generation::default()
            },
            speech: audio,
            ..TurnInput::default()
        };
        self.start_response(out, false, audio);
        let id = self.response.as_ref().map(|r| r.id.clone());
        self.turns.push_back(id);
        self.command(Inbound::Turn { input, streaming: true });
        Ok(())
    }

    fn cancel(&mut self, out: &mut Vec<String>) -> Result<(), ProtocolError> {
        if self.response.is_none() {
            return Err(ProtocolError::NotReady(
                "there is no response in progress to cancel (response_cancel_not_active)".into(),
            ));
        }
        if let Some(r) = &self.response {
            let id = r.id.clone();
            for entry in self.turns.iter_mut().filter(|e| e.as_deref() == Some(id.as_str())) {
                *entry = None;
            }
        }
        self.finish_response(out, "cancelled", Some("client_cancelled"));
        self.commands.push(Inbound::Interrupt);
        Ok(())
    }

    fn image(&mut self, v: &Value) -> Result<(), ProtocolError> {
        if !self.heard_audio {
            return Err(ProtocolError::NotReady("input_image_buffer.append: send audio before the first image".into()));
        }
        let image = wire::decode_jpeg(field_str(v, "image")?, "image")?;
        self.recorded = Some((Vec::new(), vec![image.clone()]));
        self.frames.push(image);
        Ok(())
    }
}

// ---- output ----------------------------------------------------------------

impl Realtime {
    fn response_object(&self, r: &Response, status: &str, details: Option<&str>, output: Vec<Value>) -> Value {
        let usage = json!({
            "total_tokens": r.input_tokens + r.output_tokens,
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "input_token_details": {"text_tokens": 0, "audio_tokens": r.input_tokens, "cached_tokens": 0},
            "output_token_details": {"text_tokens": r.output_tokens, "audio_tokens": r.audio_samples * 50 / OUTPUT_RATE as u64},
        });
        let modalities = if r.audio { vec!["text", "audio"] } else { vec!["text"] };
        let mut obj = json!({
            "id": r.id, "object": "realtime.response", "status": status,
            "status_details": details.map(|reason| json!({"type": status, "reason": reason})),
            "output": output, "conversation_id": self.session_id, "voice": self.conf.voice,
            "usage": if status == "in_progress" { Value::Null } else { usage },
        });
        if self.flavor.ga() {
            obj["output_modalities"] = json!(if r.audio { vec!["audio"] } else { vec!["text"] });
        } else {
            obj["modalities"] = json!(modalities);
            obj["output_audio_format"] = json!(if self.flavor == Flavor::Qwen { "pcm" } else { "pcm16" });
        }
        obj
    }

    fn assistant_item(&self, r: &Response, status: &str) -> Value {
        let part = if r.audio {
            json!({"type": self.flavor.part_type(true), "transcript": r.text})
        } else {
            json!({"type": self.flavor.part_type(false), "text": r.text})
        };
        let content = if status == "in_progress" { json!([]) } else { json!([part]) };
        json!({"id": r.item_id, "object": "realtime.item", "type": "message", "status": status, "role": "assistant", "content": content})
    }

    /// Opens a response: for the duplex model, first closes the user's turn.
    fn start_response(&mut self, out: &mut Vec<String>, duplex: bool, audio: bool) {
        if duplex {
            // The model takes the floor: whatever the user says from now on is a new turn.
            self.in_speech = false;
            self.voiced_run = 0;
            let end_ms = self.received_ms();
            let mut user = self.user.take().unwrap_or_else(|| UserTurn {
                item_id: self.new_item(),
                start_ms: end_ms.saturating_sub(1000),
                announced: false,
                committed: false,
            });
            let item_id = user.item_id.clone();
            if !user.announced {
                user.announced = true;
                self.reply(
                    out,
                    "input_audio_buffer.speech_started",
                    json!({"audio_start_ms": user.start_ms, "item_id": item_id}),
                );
            }
            self.reply(out, "input_audio_buffer.speech_stopped", json!({"audio_end_ms": end_ms, "item_id": item_id}));
            if !user.committed {
                let previous = self.last_item.replace(item_id.clone());
                self.reply(
                    out,
                    "input_audio_buffer.committed",
                    json!({"item_id": item_id, "previous_item_id": previous}),
                );
                let item = json!({"id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
                                  "role": "user", "content": [{"type": "input_audio", "transcript": null}]});
                self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
            }
        }
        self.responses += 1;
        let r = Response {
            id: format!("resp_{}", self.responses),
            item_id: self.new_item(),
            opened: false,
            duplex,
            audio,
            text: String::new(),
            input_tokens: 0,
            output_tokens: 0,
            audio_samples: 0,
            last_step: Instant::now(),
        };
        let body = json!({"response": self.response_object(&r, "in_progress", None, vec![])});
        self.reply(out, "response.created", body);
        self.response = Some(r);
    }

    /// Output item, conversation item and content part, before the first delta.
    fn open_response(&mut self, out: &mut Vec<String>) {
        let Some(r) = self.response.as_mut() else { return };
        if r.opened {
            return;
        }
        r.opened = true;
        let (id, item_id, audio) = (r.id.clone(), r.item_id.clone(), r.audio);
        let r = self.response.as_ref().expect("checked above");
        let item = self.assistant_item(r, "in_progress");
        let previous = self.last_item.replace(item_id.clone());
        self.reply(out, "response.output_item.added", json!({"response_id": id, "output_index": 0, "item": item}));
        self.reply(out, self.flavor.item_created(), json!({"previous_item_id": previous, "item": item}));
        let part = if audio {
            json!({"type": self.flavor.part_type(true), "transcript": ""})
        } else {
            json!({"type": self.flavor.part_type(false), "text": ""})
        };
        self.reply(
            out,
            "response.content_part.added",
            json!({"response_id": id, "item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
        );
    }

    fn delta(&mut self, out: &mut Vec<String>, text: &str, audio: &[f32]) {
        self.open_response(out);
        let Some(r) = self.response.as_mut() else { return };
        r.text.push_str(text);
        r.audio_samples += audio.len() as u64;
        let (id, item_id, with_audio) = (r.id.clone(), r.item_id.clone(), r.audio);
        let at = json!({"response_id": id, "item_id": item_id, "output_index": 0, "content_index": 0});
        let with = |mut v: Value, k: &str, x: Value| {
            v[k] = x;
            v
        };
        if !text.is_empty() {
            let kind = if with_audio { self.flavor.transcript_delta() } else { self.flavor.text_delta() };
            self.reply(out, kind, with(at.clone(), "delta", json!(text)));
        }
        if with_audio && !audio.is_empty() {
            self.reply(out, self.flavor.audio_delta(), with(at, "delta", json!(encode_pcm16(audio))));
        }
    }

    /// Closes the response in progress with its done events.
    fn finish_response(&mut self, out: &mut Vec<String>, status: &str, reason: Option<&str>) {
        let Some(r) = self.response.take() else { return };
        let item_status = if status == "completed" { "completed" } else { "incomplete" };
        let mut output = Vec::new();
        if r.opened {
            let at = json!({"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0});
            let with = |mut v: Value, k: &str, x: Value| {
                v[k] = x;
                v
            };
            if r.audio {
                self.reply(out, self.flavor.audio_done(), at.clone());
                self.reply(out, self.flavor.transcript_done(), with(at.clone(), "transcript", json!(r.text)));
            } else {
                self.reply(out, self.flavor.text_done(), with(at.clone(), "text", json!(r.text)));
            }
            let item = self.assistant_item(&r, item_status);
            let part = item["content"][0].clone();
            self.reply(out, "response.content_part.done", with(at, "part", part));
            self.reply(out, "response.output_item.done", json!({"response_id": r.id, "output_index": 0, "item": item}));
            if self.flavor.ga() {
                self.reply(out, "conversation.item.done", json!({"item": item}));
            }
            output.push(item);
        }
        let body = json!({"response": self.response_object(&r, status, reason, output)});
        self.reply(out, "response.done", body);
    }

    fn on_step(&mut self, outcome: &omni_actors::domain::StepOutcome, out: &mut Vec<String>) {
        match outcome.kind {
            StepKind::Listen => {
                if self.response.as_ref().is_some_and(|r| r.duplex) {
                    self.finish_response(out, "completed", None);
                }
            }
            StepKind::Speak => {
                if self.response.is_none() {
                    let audio = self.conf.audio_out;
                    self.start_response(out, true, audio);
                }
                if let Some(r) = self.response.as_mut() {
                    r.input_tokens += outcome.input_tokens as u64;
                    r.output_tokens += outcome.output_tokens as u64;
                    r.last_step = Instant::now();
                }
                self.delta(out, &outcome.text, &outcome.audio);
                if outcome.end_of_turn {
                    self.finish_response(out, "completed", None);
                }
            }
        }
        // The backend's pace: while it speaks and the client is silent, step on silence.
        let now = Instant::now();
        if self.response.as_ref().is_some_and(|r| r.duplex) && self.client_idle(now) {
            self.pad_step(now);
        }
    }

    /// Whether a turn-mode answer belongs to the response in progress.
    fn turn_is_current(&self, owner: Option<String>) -> bool {
        owner.is_some() && self.response.as_ref().map(|r| &r.id) == owner.as_ref()
    }

    fn error_event(&mut self, e: &ProtocolError) -> String {
        let message = e.to_string();
        let param = message
            .split_once(": ")
            .map(|(p, _)| p)
            .or_else(|| message.strip_suffix(" is required"))
            .filter(|p| !p.contains(' '))
            .map(String::from);
        let kind = match e.kind() {
            ErrorKind::Client => "invalid_request_error",
            ErrorKind::Server => "server_error",
        };
        let client_event = self.client_event_id.clone();
        self.event("error", json!({"error": {"type": kind, "code": e.code(), "message": message, "param": param, "event_id": client_event}}))
    }
}

impl Dialect for Realtime {
    fn name(&self) -> &'static str {
        self.flavor.name()
    }

    fn output_audio(&self) -> AudioFormat {
        AudioFormat::Pcm16
    }

    fn decode(&mut self, text: &str, replies: &mut Vec<String>) -> Result<Vec<Inbound>, DecodeError> {
        let kind = wire::event_type(text)?.into_owned();
        let v: Value = serde_json::from_str(text).map_err(|e| DecodeError::Unparseable(e.to_string()))?;
        self.client_event_id = v.get("event_id").and_then(Value::as_str).map(String::from);
        self.recorded = None;
        let now = Instant::now();
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

    fn encode(&mut self, event: Outbound<'_>, out: &mut Vec<String>) {
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
            Outbound::Created { session_id, .. } => {
                self.session_id = Some(session_id.to_string());
                self.phase = Phase::Active;
                let body = json!({"session": self.session_object()});
                out.push(self.event("session.created", body));
                if std::mem::take(&mut self.update_pending) {
                    let body = json!({"session": self.session_object()});
                    out.push(self.event("session.updated", body));
                }
                out.append(&mut self.deferred);
                let held: Vec<Inbound> = self.held.drain(..).collect();
                self.commands.extend(held);
                self.reconfigure_if_changed();
            }
            Outbound::Reconfigured { .. } => {}
            Outbound::Step { outcome, .. } => self.on_step(outcome, out),
            Outbound::TurnDelta { text, audio, .. } => {
                if self.turn_is_current(self.turns.front().cloned().flatten()) {
                    self.delta(out, text, audio);
                }
            }
            Outbound::TurnDone { input_tokens, output_tokens, cancelled, .. } => {
                let owner = self.turns.pop_front().flatten();
                if self.turn_is_current(owner)
                    && let Some(r) = self.response.as_mut()
                {
                    r.input_tokens = input_tokens as u64;
                    r.output_tokens = output_tokens as u64;
                    self.finish_response(out, if cancelled { "cancelled" } else { "completed" }, None);
                }
            }
            Outbound::Error(e) => {
                // An answer that failed ends its response.
                if matches!(e, ProtocolError::Inference(_)) && self.conf.vad.is_none() && !self.turns.is_empty() {
                    let owner = self.turns.pop_front().flatten();
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

    fn tick(&mut self, now: Instant, _out: &mut Vec<String>) {
        if self.phase != Phase::Active || self.conf.vad.is_none() || !self.client_idle(now) {
            return;
        }
        let due = self.last_pad.is_none_or(|t| now.duration_since(t) >= PAD_EVERY);
        match &self.response {
            // A speaking model whose steps stopped coming (one was dropped): keep it going.
            Some(r) if r.duplex && now.duration_since(r.last_step) >= PAD_EVERY && due => self.pad_step(now),
            Some(_) => {}
            // The user spoke and went quiet before a full step: let the model hear the pause.
            None if self.user.is_some() && due && self.pads < MAX_PADS => {
                self.pads += 1;
                self.pad_step(now);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcm16_b64(samples: &[f32]) -> String {
        encode_pcm16(samples)
    }

    fn types(frames: &[String]) -> Vec<String> {
        frames.iter().map(|f| serde_json::from_str::<Value>(f).unwrap()["type"].as_str().unwrap().to_string()).collect()
    }

    #[test]
    fn session_update_in_every_shape() {
        let mut c = Conf::new(Flavor::Beta);
        c.apply(&json!({"instructions": "hi", "voice": "echo", "modalities": ["text"], "turn_detection": null,
                         "input_audio_format": "pcm16", "max_response_output_tokens": 64}))
            .unwrap();
        assert_eq!(
            (c.instructions.as_str(), c.voice.as_str(), c.audio_out, c.vad.is_none(), c.max_tokens),
            ("hi", "echo", false, true, Some(64))
        );
        assert_eq!(c.setup().kind, SessionKind::Turn);
        let mut g = Conf::new(Flavor::Ga);
        g.apply(&json!({"type": "realtime", "output_modalities": ["audio"],
                         "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad", "threshold": 0.7}},
                                   "output": {"voice": "marin"}}}))
            .unwrap();
        assert_eq!((g.voice.as_str(), g.audio_out, g.vad.as_ref().unwrap().threshold), ("marin", true, 0.7));
        let mut q = Conf::new(Flavor::Qwen);
        q.apply(&json!({"modalities": ["text", "audio"], "voice": "Chelsie", "input_audio_format": "pcm", "output_audio_format": "pcm",
                         "audio": {"input": {"format": {"type": "pcm", "sample_rate": 16000}}}}))
            .unwrap();
        assert_eq!(q.input_rate, 16000);
        for (bad, param) in [
            (json!({"input_audio_format": "g711_ulaw"}), "session.input_audio_format"),
            (json!({"modalities": ["video"]}), "session.modalities"),
            (json!({"turn_detection": {"type": "magic"}}), "session.turn_detection"),
            (json!({"temperature": "hot"}), "session.temperature"),
            (json!({"max_response_output_tokens": 0}), "session.max_response_output_tokens"),
            (json!({"output_audio_format": {"type": "pcm", "sample_rate": 16000}}), "session.output_audio_format"),
        ] {
            let e = Conf::new(Flavor::Qwen).apply(&bad).unwrap_err();
            assert!(e.to_string().starts_with(param), "{bad}: {e}");
        }
    }

    fn active(flavor: Flavor) -> (Realtime, Vec<String>) {
        let mut d = Realtime::new(flavor, "m");
        let mut out = Vec::new();
        d.encode(Outbound::QueueDone, &mut out);
        assert!(matches!(d.take_commands()[..], [Inbound::Init(_)]));
        let kind = SessionKind::Duplex;
        d.encode(Outbound::Created { session_id: "sess_1", kind, prompt_length: 0, queue_wait_ms: 0 }, &mut out);
        (d, out)
    }

    #[test]
    fn nothing_but_queue_events_before_created_then_updates_in_order() {
        let mut d = Realtime::new(Flavor::Beta, "m");
        let mut out = Vec::new();
        let cmds = d
            .decode(&json!({"type": "session.update", "session": {"instructions": "x"}}).to_string(), &mut out)
            .unwrap();
        assert!(cmds.is_empty() && out.is_empty(), "a waiting client hears nothing");
        d.encode(Outbound::QueueDone, &mut out);
        let Inbound::Init(setup) = d.take_commands().remove(0) else { panic!() };
        assert_eq!(setup.system_prompt, "x", "the session starts with the configuration so far");
        d.encode(
            Outbound::Created { session_id: "sess_9", kind: SessionKind::Duplex, prompt_length: 1, queue_wait_ms: 0 },
            &mut out,
        );
        assert_eq!(types(&out), ["session.created", "session.updated"]);
        let created: Value = serde_json::from_str(&out[0]).unwrap();
        assert_eq!(created["session"]["id"], "sess_9");
        assert!(d.take_commands().is_empty(), "prepared as configured: no reconfigure");
    }

    #[test]
    fn appended_audio_of_any_size_is_gathered_into_steps() {
        let (mut d, _) = active(Flavor::Beta);
        let mut out = Vec::new();
        let piece = pcm16_b64(&vec![0.0; 2400]); // 100 ms at 24 kHz
        let mut chunks = Vec::new();
        for _ in 0..25 {
            chunks.extend(
                d.decode(&json!({"type": "input_audio_buffer.append", "audio": piece}).to_string(), &mut out).unwrap(),
            );
        }
        assert_eq!(chunks.len(), 2, "2.5 s of audio is 2 one-second steps");
        assert!(chunks.iter().all(|c| matches!(c, Inbound::Chunk(ch) if ch.audio.len() == STEP)));
    }

    #[test]
    fn the_duplex_models_speech_becomes_a_response() {
        let (mut d, _) = active(Flavor::Qwen);
        let mut out = Vec::new();
        let loud: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.1).sin()).collect();
        d.decode(&json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&loud)}).to_string(), &mut out)
            .unwrap();
        assert_eq!(types(&out), ["input_audio_buffer.speech_started"]);
        out.clear();
        let speak = |text: &str, eot| omni_actors::domain::StepOutcome {
            kind: StepKind::Speak,
            text: text.into(),
            audio: vec![0.1; 24000],
            end_of_turn: eot,
            kv_length: 0,
            input_tokens: 5,
            output_tokens: 2,
            prefill_us: 0,
            generate_us: 0,
        };
        let s1 = speak("Hello", false);
        d.encode(
            Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_2", outcome: &s1 },
            &mut out,
        );
        let s2 = speak(" there", true);
        d.encode(
            Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_3", outcome: &s2 },
            &mut out,
        );
        assert_eq!(
            types(&out),
            [
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.created",
                "response.created",
                "response.output_item.added",
                "conversation.item.created",
                "response.content_part.added",
                "response.audio_transcript.delta",
                "response.audio.delta",
                "response.audio_transcript.delta",
                "response.audio.delta",
                "response.audio.done",
                "response.audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.done",
            ]
        );
        let done: Value = serde_json::from_str(out.last().unwrap()).unwrap();
        assert_eq!(done["response"]["status"], "completed");
        assert_eq!(done["response"]["usage"]["output_tokens"], 4);
        assert_eq!(done["response"]["output"][0]["content"][0]["transcript"], "Hello there");
        let audio: Value = serde_json::from_str(&out[8]).unwrap();
        assert_eq!(decode_pcm16(audio["delta"].as_str().unwrap(), "d").unwrap().len(), 24000);
    }

    #[test]
    fn manual_turn_commit_and_create() {
        let (mut d, _) = active(Flavor::Ga);
        let mut out = Vec::new();
        let cmds = d
            .decode(&json!({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": null}}}}).to_string(), &mut out)
            .unwrap();
        assert!(matches!(cmds[..], [Inbound::Reconfigure(ref s)] if s.kind == SessionKind::Turn));
        assert_eq!(types(&out), ["session.updated"]);
        out.clear();
        let e = d.decode(&json!({"type": "input_audio_buffer.commit"}).to_string(), &mut out).unwrap_err();
        assert!(matches!(e, DecodeError::Protocol(ProtocolError::InvalidPayload(_))));
        d.decode(
            &json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&vec![0.2; 24000])}).to_string(),
            &mut out,
        )
        .unwrap();
        d.decode(&json!({"type": "input_audio_buffer.commit"}).to_string(), &mut out).unwrap();
        let cmds = d.decode(&json!({"type": "response.create"}).to_string(), &mut out).unwrap();
        let [Inbound::Turn { input, streaming: true }] = &cmds[..] else { panic!("{cmds:?}") };
        assert!((input.messages[0].audios[0].len() as i64 - 16000).abs() < 400);
        assert_eq!(types(&out), ["input_audio_buffer.committed", "conversation.item.added", "response.created"]);
        out.clear();
        d.encode(Outbound::TurnDelta { session_id: "s", response_id: "r", text: "ok", audio: &[0.1; 6000] }, &mut out);
        d.encode(
            Outbound::TurnDone {
                session_id: "s",
                response_id: "r",
                text: "ok",
                audio: None,
                input_tokens: 3,
                output_tokens: 1,
                kv_length: 4,
                duration_ms: 1,
                cancelled: false,
            },
            &mut out,
        );
        assert_eq!(
            types(&out),
            [
                "response.output_item.added",
                "conversation.item.added",
                "response.content_part.added",
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
        );
    }

    #[test]
    fn images_need_audio_first_and_errors_have_the_openai_shape() {
        let (mut d, _) = active(Flavor::Qwen);
        let mut out = Vec::new();
        let e = d
            .decode(
                &json!({"type": "input_image_buffer.append", "image": "/9j/4AAQ", "event_id": "c1"}).to_string(),
                &mut out,
            )
            .unwrap_err();
        let DecodeError::Protocol(e) = e else { panic!() };
        assert_eq!(e.code(), "not_ready");
        let frame: Value = serde_json::from_str(&{
            let mut o = Vec::new();
            d.encode(Outbound::Error(&e), &mut o);
            o.remove(0)
        })
        .unwrap();
        assert_eq!(frame["type"], "error");
        assert_eq!(frame["error"]["event_id"], "c1");
        assert_eq!(frame["error"]["param"], "input_image_buffer.append");
        assert!(frame["event_id"].as_str().unwrap().starts_with("event_"));
    }
}
