//! `backend = "minicpmo-worker"`: a MiniCPM-o model worker that an operator already runs on
//! a GPU, driven over its own HTTP/WebSocket protocol, behind a BackendActor like any other
//! backend (so the queue, the limits, silent drop, force-listen, the step watchdog and
//! recording hold as for any worker).
//!
//! - Open: `GET /health` must say the worker is healthy and idle; loading, busy, in error
//!   or unreachable is [`BackendError::Unavailable`] (the gateway tries again with backoff,
//!   and waiting clients keep waiting).
//! - Duplex: `WS /ws/duplex`: `prepare` (system prompt, voices, the session's settings as
//!   its `config`), then one `audio_chunk` per step answered by one `result`, `stop` at the
//!   end. The worker answers strictly in order, so the gateway never queues behind it: it
//!   sends one step at a time, and force-listen rides on the next chunk.
//! - Chat: `WS /ws/chat`, one connection per answer: the whole conversation (the worker
//!   keeps none), streamed `chunk`s, then `done`.
//! - While no session runs, `/health` is asked every `health_interval_s`
//!   ([`Backend::check_idle`], a job the BackendActor runs on the link's own thread): a worker
//!   that went offline or into error fails its link, which the pool reopens when the worker is
//!   healthy again. A link has no thread or connection besides.
//!
//! The worker is not trusted with the gateway's memory or threads: its messages are at most
//! [`MAX_MESSAGE`], a piece's text and audio and an answer's text are capped, each reply has one
//! deadline (`reply_timeout_s`) that pings do not extend, and a link the gateway gives up on
//! (the step watchdog, a failed worker) has its socket shut down, which ends the blocked read.

use parking_lot::Mutex;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::domain::{
    BackendInfo, ChatMessage, DuplexChunk, Role, SessionKind, SessionSetup, SetupField, StepKind, StepOutcome,
    StepPiece, TurnInput, TurnPiece,
};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};
use omni_actors::observe::metrics::metrics;
use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// The DuplexConfig settings the worker applies per session (its other settings are fixed
/// when it loads the model), and `repetition_penalty`, the Realtime API's name for its
/// `text_repetition_penalty` ([`worker_name`]).
const APPLIED: [&str; 8] = [
    "repetition_penalty",
    "decode_mode",
    "top_k",
    "top_p",
    "listen_prob_scale",
    "listen_top_k",
    "text_repetition_penalty",
    "text_repetition_window_size",
];

/// The largest message the worker may send: a step's or a chat piece's answer with its audio (a
/// second of 24 kHz float32 is 128 KB of base64).
const MAX_MESSAGE: usize = 4 << 20;
/// The text of one piece (a step's, a chat chunk's), at most.
const MAX_PIECE_TEXT: usize = 16 << 10;
/// The text of one chat answer, at most (the conversation keeps it).
const MAX_ANSWER_TEXT: usize = 256 << 10;
/// The audio of one piece, at most: ten seconds at 24 kHz.
const MAX_PIECE_SAMPLES: usize = 240_000;

/// The worker's own name of a setting a client gave under the Realtime API's.
fn worker_name(setting: &str) -> &str {
    match setting {
        "repetition_penalty" => "text_repetition_penalty",
        other => other,
    }
}

/// A number the client wrote as decimal (carried as `f32`), in JSON as it was written: 1.2, not
/// the 1.2000000476837158 of its widening to `f64`.
fn decimal(x: f32) -> Value {
    x.to_string().parse::<f64>().map_or(Value::Null, |v| json!(v))
}

/// The worker's options (`[workers.options]`).
#[derive(Debug, Clone)]
struct Options {
    connect_timeout: Duration,
    /// The longest a reply may take (a step or a chat piece); the gateway's step watchdog
    /// usually ends a slow step first.
    reply_timeout: Duration,
    health_interval: Duration,
    context_tokens: u32,
}

impl Options {
    fn parse(options: &[(String, String)]) -> Result<Options, BackendError> {
        let mut o = Options {
            connect_timeout: Duration::from_secs(5),
            reply_timeout: Duration::from_secs(300),
            health_interval: Duration::from_secs(10),
            context_tokens: 8192,
        };
        for (k, v) in options {
            let number = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|n| *n > 0.0 && n.is_finite())
                    .ok_or_else(|| BackendError::Open(format!("option {k}: '{v}' is not a positive number")))
            };
            match k.as_str() {
                "connect_timeout_s" => o.connect_timeout = Duration::from_secs_f64(number()?),
                "reply_timeout_s" => o.reply_timeout = Duration::from_secs_f64(number()?),
                "health_interval_s" => o.health_interval = Duration::from_secs_f64(number()?),
                "context_tokens" => o.context_tokens = number()? as u32,
                _ => {
                    return Err(BackendError::Open(format!(
                        "unknown option '{k}' for a minicpmo-worker (known: connect_timeout_s, reply_timeout_s, \
                         health_interval_s, context_tokens)"
                    )));
                }
            }
        }
        Ok(o)
    }
}

/// What `/health` says, as a gateway worker state.
#[derive(Debug, Clone, PartialEq)]
enum Health {
    Healthy,
    /// Not available now, with the label for the metric and the reason.
    Not(&'static str, String),
}

fn health(agent: &ureq::Agent, name: &str, url: &str) -> Health {
    let answer = agent.get(&format!("{url}/health")).call().map_err(|e| e.to_string()).and_then(|mut r| {
        let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
        serde_json::from_str::<Value>(&text).map_err(|e| format!("not JSON: {e}"))
    });
    let health = match answer {
        Err(e) => Health::Not("offline", format!("{url} is offline: {e}")),
        Ok(v) => {
            let status = v["status"].as_str().unwrap_or("");
            let worker = v["worker_status"].as_str().unwrap_or("idle");
            match (status, worker) {
                ("healthy", "idle") => Health::Healthy,
                ("initializing", _) | (_, "loading") => Health::Not("loading", format!("{url} is loading its model")),
                ("error", _) | (_, "error") => Health::Not("error", format!("{url} reports an error ({v})")),
                ("healthy", busy) => Health::Not("busy", format!("{url} is busy ({busy})")),
                (other, _) => Health::Not("error", format!("{url} reports status '{other}'")),
            }
        }
    };
    let label = match &health {
        Health::Healthy => "healthy",
        Health::Not(label, _) => label,
    };
    metrics().remote_worker_health.with_label_values(&[name, label]).inc();
    health
}

/// A WebSocket to the worker, which is the link's live connection ([`Control::terminate`]
/// shuts it down) until it is dropped.
struct Socket {
    ws: WebSocket<TcpStream>,
    /// Its number among the link's connections.
    number: u64,
    control: Arc<Control>,
}

impl std::ops::Deref for Socket {
    type Target = WebSocket<TcpStream>;
    fn deref(&self) -> &WebSocket<TcpStream> {
        &self.ws
    }
}

impl std::ops::DerefMut for Socket {
    fn deref_mut(&mut self) -> &mut WebSocket<TcpStream> {
        &mut self.ws
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // No longer the live one: its copy for terminate() goes, and the connection closes.
        let mut live = self.control.live.lock();
        if live.as_ref().is_some_and(|(n, _)| *n == self.number) {
            *live = None;
        }
    }
}

/// The any-thread half.
struct Control {
    force_listen: AtomicBool,
    kv_length: AtomicU64,
    /// How often an idle worker's `/health` is asked.
    health_interval: Duration,
    /// The connection of the reply being waited for (its number, and a copy of its socket):
    /// shut down when the link is given up on, so the thread blocked reading it ends instead
    /// of holding it.
    live: Mutex<Option<(u64, TcpStream)>>,
    /// Connections made so far.
    connections: AtomicU64,
}

impl BackendControl for Control {
    fn interrupt(&self) {
        // The worker answers strictly in order and cannot be cut short; the session discards
        // what it answers for input sent before a force-listen.
    }
    fn set_force_listen(&self, on: bool) {
        self.force_listen.store(on, Ordering::Relaxed);
    }
    fn kv_length(&self) -> u64 {
        self.kv_length.load(Ordering::Relaxed)
    }
    fn terminate(&self) {
        if let Some((_, tcp)) = self.live.lock().take() {
            let _ = tcp.shutdown(std::net::Shutdown::Both);
        }
    }
    fn never_blocks(&self) -> bool {
        true // flags, and a socket's shutdown
    }
    fn idle_check_every(&self) -> Option<Duration> {
        Some(self.health_interval)
    }
}

/// A chat answer being received.
struct Answer {
    socket: Socket,
    input_tokens: u32,
    first: bool,
    text: String,
}

pub struct MinicpmoBackend {
    name: String,
    /// `http://host:port`.
    url: String,
    options: Options,
    info: BackendInfo,
    control: Arc<Control>,
    setup: Option<SessionSetup>,
    duplex: Option<Socket>,
    /// The chunk of the step in flight, sent by prefill, answered by generate.
    pending: bool,
    /// The conversation so far (chat), the worker keeping none.
    conversation: Vec<ChatMessage>,
    answer: Option<Answer>,
    sessions: u64,
    /// The KV length after the last duplex step: its growth, less what the model said, is what
    /// the step heard (the worker counts no input tokens itself).
    last_kv: u64,
}

impl MinicpmoBackend {
    /// Checks the worker is healthy and idle.
    pub fn open(name: &str, url: &str, options: &[(String, String)]) -> Result<MinicpmoBackend, BackendError> {
        let options = Options::parse(options)?;
        if let Health::Not(_, why) = health(&agent(options.connect_timeout), name, url) {
            return Err(BackendError::Unavailable(why));
        }
        let control = Arc::new(Control {
            force_listen: AtomicBool::new(false),
            kv_length: AtomicU64::new(0),
            health_interval: options.health_interval,
            live: Mutex::new(None),
            connections: AtomicU64::new(0),
        });
        let info = BackendInfo {
            name: "minicpmo-worker".into(),
            vision: true,
            speech_output: true,
            duplex: true,
            turn: true,
            input_sample_rate: 16000,
            output_sample_rate: 24000,
            context_size: options.context_tokens,
            max_output_samples: 48000,
            max_output_text_bytes: 4096,
            abi_revision: 1,
            transcripts: false,
            token_details: false,
            settings: APPLIED.iter().map(|s| s.to_string()).collect(),
            // The model's own unit: one-second chunks.
            step_samples: 0,
            // Its worker API takes no tools.
            tools: false,
            // Its voice is the reference audio the client sends; it knows no voice names.
            ignored: vec![SetupField::Voice],
        };
        log::info!("worker {name}: MiniCPM-o worker at {url} is healthy");
        Ok(MinicpmoBackend {
            name: name.to_string(),
            url: url.to_string(),
            options,
            info,
            control,
            setup: None,
            duplex: None,
            pending: false,
            conversation: Vec::new(),
            answer: None,
            sessions: 0,
            last_kv: 0,
        })
    }

    /// A WebSocket to `path` of the worker, its messages bounded, its reads and writes timed;
    /// the live connection from now on (see [`Control::terminate`]).
    fn connect(&self, path: &str) -> Result<Socket, BackendError> {
        let dial = super::ws_client::Dial {
            connect_timeout: self.options.connect_timeout,
            read_timeout: self.options.reply_timeout,
            write_timeout: Some(self.options.reply_timeout),
            config: Some(
                tungstenite::protocol::WebSocketConfig::default()
                    .max_message_size(Some(MAX_MESSAGE))
                    .max_frame_size(Some(MAX_MESSAGE)),
            ),
        };
        let ws = super::ws_client::connect(&self.url, path, &dial)
            .map_err(|e| BackendError::Unavailable(format!("{}{path}: {e}", self.url)))?;
        let number = self.control.connections.fetch_add(1, Ordering::Relaxed) + 1;
        *self.control.live.lock() = ws.get_ref().try_clone().ok().map(|tcp| (number, tcp));
        Ok(Socket { ws, number, control: self.control.clone() })
    }

    fn lost(&self, what: &str, e: impl std::fmt::Display) -> BackendError {
        BackendError::Crashed(format!("worker {} ({}): {what}: {e}", self.name, self.url))
    }

    /// The next JSON message, within `reply_timeout_s` of the call however many pings come;
    /// the worker's `error` events become errors.
    fn receive(&self, socket: &mut Socket, what: &str) -> Result<Value, BackendError> {
        let deadline = Instant::now() + self.options.reply_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let waited = self.options.reply_timeout.as_secs_f64();
                return Err(self.lost(what, format!("no answer within {waited} s")));
            }
            let _ = socket.get_ref().set_read_timeout(Some(left));
            let message = socket.read().map_err(|e| match e {
                tungstenite::Error::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    self.lost(what, format!("no answer within {} s", self.options.reply_timeout.as_secs_f64()))
                }
                other => self.lost(what, other),
            })?;
            let text = match message {
                Message::Text(text) => text,
                Message::Close(frame) => {
                    return Err(self.lost(what, format!("the worker closed the connection ({frame:?})")));
                }
                Message::Binary(_) => return Err(self.lost(what, "a binary frame")),
                _ => continue,
            };
            let v: Value = serde_json::from_str(&text).map_err(|e| self.lost(what, format!("not JSON: {e}")))?;
            if v["type"] == "error" {
                let why = v["error"].as_str().map_or_else(|| v["error"].to_string(), String::from);
                return Err(BackendError::Inference(format!("worker {}: {what}: {why}", self.name)));
            }
            return Ok(v);
        }
    }

    fn send(&self, socket: &mut Socket, what: &str, v: &Value) -> Result<(), BackendError> {
        self.send_text(socket, what, v.to_string())
    }

    fn send_text(&self, socket: &mut Socket, what: &str, text: String) -> Result<(), BackendError> {
        socket.send(Message::text(text)).map_err(|e| self.lost(what, e))
    }

    fn close_duplex(&mut self) {
        if let Some(mut socket) = self.duplex.take() {
            // A clean end: the worker finishes the step, finalizes its recording and frees
            // the model. A worker that does not answer is left to close on its own.
            let _ = socket.get_ref().set_read_timeout(Some(Duration::from_secs(5)));
            if self.send(&mut socket, "stop", &json!({"type": "stop"})).is_ok() {
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    match socket.read() {
                        Ok(Message::Text(t)) if t.contains("\"stopped\"") => break,
                        Ok(Message::Close(_)) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            }
            let _ = socket.close(None);
        }
        self.pending = false;
    }

    /// `prepare` for a duplex session: the prompt, the voices and the settings.
    fn prepare_duplex(&mut self, s: &SessionSetup) -> Result<(), BackendError> {
        self.sessions += 1;
        self.last_kv = 0;
        let id = format!("omni_{}_{}", std::process::id(), self.sessions);
        let mut socket = self.connect(&format!("/ws/duplex?session_id={id}"))?;
        let g = &s.generation;
        let mut config = serde_json::Map::new();
        // Only the settings the worker documents as applied per session: a client names any
        // setting it likes, and the worker's other settings are its operator's.
        for (k, v) in g.settings.iter().filter(|(k, _)| APPLIED.contains(&k.as_str())) {
            // Back to JSON: numbers and booleans as such (as written), words as text.
            let value = serde_json::from_str::<Value>(v).unwrap_or_else(|_| Value::String(v.clone()));
            config.insert(worker_name(k).to_string(), value);
        }
        if let Some(t) = g.temperature {
            config.insert("temperature".into(), decimal(t));
        }
        if let Some(p) = g.length_penalty {
            config.insert("length_penalty".into(), decimal(p));
        }
        if let Some(n) = g.force_listen_count {
            config.insert("force_listen_count".into(), json!(n));
        }
        let mut prepare = json!({
            "type": "prepare",
            "system_prompt": if s.system_prompt.is_empty() { "You are a helpful assistant." } else { s.system_prompt.as_str() },
            "config": config,
            "deferred_finalize": true,
            "max_slice_nums": g.max_slice_nums.unwrap_or(1),
        });
        if !s.ref_audio.is_empty() {
            prepare["ref_audio_base64"] = json!(f32_base64(&s.ref_audio));
        }
        if !s.tts_ref_audio.is_empty() && s.tts_ref_audio != s.ref_audio {
            prepare["tts_ref_audio_base64"] = json!(f32_base64(&s.tts_ref_audio));
        }
        self.send(&mut socket, "prepare", &prepare)?;
        let answer = self.receive(&mut socket, "prepare")?;
        if answer["type"] != "prepared" {
            return Err(self.lost("prepare", format!("answered {}", answer["type"])));
        }
        log::debug!("worker {}: duplex session {id} prepared", self.name);
        self.duplex = Some(socket);
        Ok(())
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into()
}

/// The `audio_chunk` message, written as text: base64 needs no JSON escaping (serde_json would
/// look at each of its 85,000 bytes for one), and the client's own base64 of the audio is
/// forwarded when it has it (it was checked when the chunk was decoded), else encoded once.
pub fn audio_chunk(c: &DuplexChunk, force_listen: bool) -> String {
    let mut m = String::with_capacity(128 + super::chunk_text::encoded_len(c, &c.frames));
    m.push_str(r#"{"type":"audio_chunk","force_listen":"#);
    m.push_str(if force_listen { "true" } else { "false" });
    if let Some(n) = c.max_slice_nums {
        m.push_str(&format!(r#","max_slice_nums":{n}"#));
    }
    super::chunk_text::push_frames("frame_base64_list", &c.frames, &mut m);
    super::chunk_text::push_audio("audio_base64", c, &mut m);
    m.push('}');
    m
}

fn f32_base64(samples: &[f32]) -> String {
    let mut out = String::new();
    omni_actors::audio::pcm::encode_pcm_f32(samples, &mut out);
    out
}

/// A piece's text, within [`MAX_PIECE_TEXT`].
fn piece_text(v: &Value) -> Result<String, String> {
    let text = v.as_str().unwrap_or("");
    if text.len() > MAX_PIECE_TEXT {
        return Err(format!("a piece of {} KB of text (at most {} KB)", text.len() >> 10, MAX_PIECE_TEXT >> 10));
    }
    Ok(text.to_string())
}

/// f32 PCM from base64 (the worker's `audio_data`), at most [`MAX_PIECE_SAMPLES`]; a broken
/// field is the worker's fault.
fn f32_samples(b64: &str) -> Result<Vec<f32>, String> {
    if b64.len() / 4 * 3 / 4 > MAX_PIECE_SAMPLES {
        return Err(format!("audio_data of more than {MAX_PIECE_SAMPLES} samples"));
    }
    let bytes = STANDARD.decode(b64).map_err(|e| format!("audio_data: {e}"))?;
    if bytes.len() % 4 != 0 {
        return Err(format!("audio_data: {} bytes is not whole float32 samples", bytes.len()));
    }
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// A message in the worker's chat format.
fn chat_item(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::System => "system",
        // A tool's result is the user's words to this worker (it takes no tools).
        Role::User | Role::Tool => "user",
        Role::Assistant => "assistant",
    };
    if m.images.is_empty() && m.audios.is_empty() {
        return json!({"role": role, "content": m.text});
    }
    let mut content = Vec::new();
    if !m.text.is_empty() {
        content.push(json!({"type": "text", "text": m.text}));
    }
    for image in &m.images {
        content.push(json!({"type": "image", "data": STANDARD.encode(image)}));
    }
    for audio in &m.audios {
        content.push(json!({"type": "audio", "data": f32_base64(audio), "sample_rate": 16000}));
    }
    json!({"role": role, "content": content})
}

impl Backend for MinicpmoBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn prepare(&mut self, setup: &SessionSetup) -> Result<(), BackendError> {
        self.close_duplex();
        self.answer = None;
        self.conversation.clear();
        self.control.kv_length.store(0, Ordering::Relaxed);
        self.control.force_listen.store(false, Ordering::Relaxed);
        if setup.kind == SessionKind::Duplex {
            self.prepare_duplex(setup)?;
        }
        self.setup = Some(setup.clone());
        Ok(())
    }

    fn reset(&mut self) -> Result<(), BackendError> {
        self.close_duplex();
        self.answer = None;
        self.conversation.clear();
        self.setup = None;
        self.control.kv_length.store(0, Ordering::Relaxed);
        Ok(())
    }

    fn duplex_prefill(&mut self, c: &DuplexChunk) -> Result<(), BackendError> {
        // Both ways of asking are consumed here, once (an || would leave a pending one for
        // the next chunk).
        let pending = self.control.force_listen.swap(false, Ordering::Relaxed);
        let force = c.force_listen || pending;
        let chunk = audio_chunk(c, force);
        let mut socket =
            self.duplex.take().ok_or_else(|| BackendError::BadState("no duplex session is prepared".into()))?;
        let sent = self.send_text(&mut socket, "audio_chunk", chunk);
        self.duplex = Some(socket);
        sent?;
        self.pending = true;
        Ok(())
    }

    fn duplex_generate(&mut self) -> Result<StepPiece, BackendError> {
        if !std::mem::take(&mut self.pending) {
            return Err(BackendError::BadState("duplex_generate without a chunk".into()));
        }
        let mut socket = self.duplex.take().ok_or_else(|| BackendError::BadState("no duplex session".into()))?;
        let answer = self.receive(&mut socket, "audio_chunk");
        // A worker that failed the step (its `error` event) goes on with the session.
        if !matches!(answer, Err(BackendError::Crashed(_))) {
            self.duplex = Some(socket);
        }
        let v = answer?;
        if v["type"] != "result" {
            return Err(self.lost("audio_chunk", format!("answered {}", v["type"])));
        }
        let kv_length = v["kv_cache_length"].as_u64().unwrap_or(0);
        self.control.kv_length.store(kv_length, Ordering::Relaxed);
        let ms = |k: &str| (v[k].as_f64().unwrap_or(0.0) * 1000.0) as u32;
        let output_tokens = v["n_tokens"].as_u64().unwrap_or(0);
        let heard = kv_length.saturating_sub(self.last_kv).saturating_sub(output_tokens);
        self.last_kv = kv_length;
        let mut piece = StepPiece {
            kv_length,
            input_tokens: heard.min(u32::MAX as u64) as u32,
            output_tokens: output_tokens as u32,
            output_audio_tokens: v["n_tts_tokens"].as_u64().unwrap_or(0) as u32,
            generate_us: ms("cost_all_ms"),
            ..StepPiece::default()
        };
        if v["is_listen"] != true {
            piece.kind = StepKind::Speak;
            piece.text = piece_text(&v["text"]).map_err(|e| self.lost("result", e))?;
            piece.end_of_turn = v["end_of_turn"] == true;
            if let Some(b64) = v["audio_data"].as_str() {
                piece.audio = f32_samples(b64).map_err(|e| self.lost("result", e))?;
            }
        }
        Ok(piece)
    }

    fn duplex_drain(&mut self) -> Result<Option<StepPiece>, BackendError> {
        Ok(None)
    }

    fn duplex_finalize(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn duplex_step(&mut self, chunk: &DuplexChunk) -> Result<StepOutcome, BackendError> {
        self.duplex_prefill(chunk)?;
        Ok(StepOutcome::from_first(self.duplex_generate()?))
    }

    fn turn_prefill(&mut self, input: &TurnInput) -> Result<(), BackendError> {
        self.answer = None;
        let setup = self.setup.clone().unwrap_or_else(|| SessionSetup::new(SessionKind::Turn));
        if !input.continues {
            self.conversation.clear();
        }
        self.conversation.extend(input.messages.iter().cloned());
        let mut messages: Vec<Value> = Vec::new();
        if !setup.system_prompt.is_empty() && self.conversation.first().is_none_or(|m| m.role != Role::System) {
            messages.push(json!({"role": "system", "content": setup.system_prompt}));
        }
        messages.extend(self.conversation.iter().map(chat_item));
        let g = &input.generation;
        let mut generation = json!({"max_new_tokens": g.max_new_tokens.unwrap_or(256)});
        if let Some(p) = g.length_penalty {
            generation["length_penalty"] = json!(p);
        }
        let voice = if input.tts_ref_audio.is_empty() { &setup.tts_ref_audio } else { &input.tts_ref_audio };
        let mut tts = json!({"enabled": input.speech});
        if input.speech && !voice.is_empty() {
            tts["ref_audio_data"] = json!(f32_base64(voice));
        }
        let mut request = json!({
            "messages": messages,
            "streaming": true,
            "generation": generation,
            "tts": tts,
            "use_tts_template": input.tts_template,
            "omni_mode": input.omni,
            "enable_thinking": input.thinking,
        });
        if let Some(n) = g.max_slice_nums {
            request["image"] = json!({"max_slice_nums": n});
        }
        let mut socket = self.connect("/ws/chat")?;
        self.send(&mut socket, "chat", &request)?;
        let first = self.receive(&mut socket, "chat")?;
        if first["type"] != "prefill_done" {
            return Err(self.lost("chat", format!("answered {} before prefill_done", first["type"])));
        }
        let input_tokens = first["input_tokens"].as_u64().unwrap_or(0) as u32;
        self.control.kv_length.store(input_tokens as u64, Ordering::Relaxed);
        self.answer = Some(Answer { socket, input_tokens, first: true, text: String::new() });
        Ok(())
    }

    fn turn_generate(&mut self) -> Result<TurnPiece, BackendError> {
        let mut answer =
            self.answer.take().ok_or_else(|| BackendError::BadState("no chat answer in progress".into()))?;
        let v = self.receive(&mut answer.socket, "chat")?;
        let mut piece = TurnPiece::default();
        if std::mem::take(&mut answer.first) {
            piece.input_tokens = answer.input_tokens;
        }
        match v["type"].as_str() {
            Some("chunk") => {
                piece.text = piece_text(&v["text_delta"]).map_err(|e| self.lost("chunk", e))?;
                if let Some(b64) = v["audio_data"].as_str() {
                    piece.audio = f32_samples(b64).map_err(|e| self.lost("chunk", e))?;
                }
                if answer.text.len() + piece.text.len() > MAX_ANSWER_TEXT {
                    return Err(
                        self.lost("chat", format!("an answer of more than {} KB of text", MAX_ANSWER_TEXT >> 10))
                    );
                }
                answer.text.push_str(&piece.text);
                piece.kv_length = self.control.kv_length();
                self.answer = Some(answer);
            }
            Some("done") => {
                piece.done = true;
                piece.output_tokens = v["generated_tokens"].as_u64().unwrap_or(0) as u32;
                let kv = answer.input_tokens as u64 + piece.output_tokens as u64;
                self.control.kv_length.store(kv, Ordering::Relaxed);
                piece.kv_length = kv;
                let text = match v["text"].as_str() {
                    Some(t) if t.len() <= MAX_ANSWER_TEXT => t.to_string(),
                    _ => answer.text,
                };
                self.conversation.push(ChatMessage::text(Role::Assistant, &text));
                let _ = answer.socket.close(None);
            }
            other => return Err(self.lost("chat", format!("answered {other:?}"))),
        }
        Ok(piece)
    }

    /// Asked only while no session runs (a session's own answers tell the worker's health).
    fn check_idle(&mut self) -> Result<(), BackendError> {
        match health(&agent(self.options.connect_timeout), &self.name, &self.url) {
            // Busy with someone else's job: not ours to take now, but not broken.
            Health::Healthy | Health::Not("busy", _) => Ok(()),
            Health::Not(_, why) => Err(BackendError::Unavailable(why)),
        }
    }

    fn control(&self) -> Arc<dyn BackendControl> {
        self.control.clone()
    }
}

impl Drop for MinicpmoBackend {
    fn drop(&mut self) {
        self.close_duplex();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_forwards_the_clients_base64_and_encodes_only_without_it() {
        let chunk = DuplexChunk {
            audio: vec![1.0],
            // Not the base64 of `audio`: what is sent shows which one was used.
            audio_base64: Some(bytes::Bytes::from_static(b"AAAAAA==")),
            frames: vec![vec![0xFF, 0xD8]],
            max_slice_nums: Some(2),
            ..DuplexChunk::default()
        };
        let forwarded: Value = serde_json::from_str(&audio_chunk(&chunk, true)).unwrap();
        assert_eq!(
            forwarded,
            json!({"type": "audio_chunk", "force_listen": true, "max_slice_nums": 2,
                   "frame_base64_list": ["/9g="], "audio_base64": "AAAAAA=="})
        );
        let encoded: Value =
            serde_json::from_str(&audio_chunk(&DuplexChunk { audio_base64: None, ..chunk }, false)).unwrap();
        assert_eq!(encoded["audio_base64"], STANDARD.encode(1.0f32.to_le_bytes()));
        assert_eq!(encoded["force_listen"], false);
    }
}
