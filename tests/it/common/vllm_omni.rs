//! A vLLM-Omni server serving MiniCPM-o full duplex, as the tests need one: its duplex
//! WebSocket (`/v1/realtime?duplex=1`, `/v1/duplex`) and `GET /health`, in-process on a free
//! loopback port, written from its 0.30.0 contract (the `entrypoints/duplex` and
//! `engine/duplex` sources of its wheel), with a deterministic model and switches for the
//! faults a real server shows. It can be killed and brought back on the same port.
//!
//! What it keeps of the contract:
//! - `slots` sessions at once, counting sessions held after a drop; the next opening
//!   `session.update` gets the exact `resource_exhausted` error, and the socket closes.
//! - The autostart trap: `?model=` without `autostart=0` opens a default session before the
//!   client speaks, which fails with `ref_audio_required`, and the socket closes.
//! - `ref_audio` is required (a data URL of a WAV); instructions are fixed once open.
//! - Units of one second counted by samples (`pcm_f32le` or pcm16 at 16 kHz); one decision per
//!   unit: a standalone `response.listen`, or a response: `response.created` and its item
//!   events, `response.speak`, pairs of `response.output_audio.delta` (PCM16 at 24 kHz) and
//!   `response.output_audio_transcript.delta`, the done chain ending in `response.done`.
//!   The model: a voiced unit is heard; the first quiet unit after it starts "Mock reply N."
//!   (1 s of voice), the next unit ends it with " Done." (0.5 s, `end_of_turn`). Instructions of
//!   more than one line are context the model was given (a gateway's delegation): its first
//!   quiet unit starts a reply unasked that says their last line back.
//! - While it speaks and no unit comes for a second, it feeds itself a silence unit (at most 64).
//! - `response.cancel` ends the response with `response.done {status: cancelled}`, and nothing
//!   of it comes after; with no response it is the error `response_not_active`. Errors in a
//!   session never close it.
//! - `session.close` gets `session.closed`, then a close 1000 `client_close`. A socket dropped
//!   without it holds its slot for `hold` (30 s by default) and then frees it.
//!
//! Where the contract is silent, the mock guesses (each says so where it is done): the close
//! code after a handshake error (none set here, as the server sets none itself); how many
//! units the model takes to answer and how much voice a unit brings; that a force-listen unit
//! during a response ends it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use actix_ws::{CloseCode, CloseReason, Message};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// What the tests can see and switch.
#[derive(Debug, Clone)]
pub(crate) struct VllmState {
    /// `duplex_session.max_sessions`.
    pub slots: usize,
    /// `/health` answers 200 (else 503).
    pub healthy: bool,
    /// Sessions that count against the slots: open, or held after a drop.
    pub admitted: usize,
    /// The session object of every session opened.
    pub opened: Vec<Value>,
    /// `resource_exhausted` refusals sent.
    pub refused: usize,
    /// `session.close` received and confirmed.
    pub closed: usize,
    /// Sockets dropped without `session.close` (their slot held for `hold`).
    pub dropped: usize,
    /// Sessions held after a drop, by id, with their resume token.
    pub held: std::collections::HashMap<String, String>,
    /// Held sessions taken back with `session.resume`.
    pub resumed: usize,
    /// Default sessions opened by `?model=` without `autostart=0`.
    pub autostarts: usize,
    /// `response.cancel` received while a response was active.
    pub cancels: usize,
    /// Appends with `force_listen`.
    pub forced: usize,
    /// Units answered (the client's and the mock's own silence).
    pub units: usize,
    /// Pieces of voice sent (after `unit_delay`).
    pub pieces: usize,
    /// Camera frames received.
    pub frames: usize,
    /// `playback.ack` received.
    pub acks: usize,
    /// Pieces of voice sent for a response after it was cancelled (the contract says none).
    pub stale: usize,
    /// The next unit is answered with this error code instead of a decision.
    pub error_next_unit: Option<String>,
    /// How long a slot stays held after a drop.
    pub hold: Duration,
    /// How long the model takes per unit.
    pub unit_delay: Duration,
}

pub(crate) struct MockVllm {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<VllmState>>,
    running: Mutex<Option<(actix_web::dev::ServerHandle, std::thread::JoinHandle<()>)>>,
}

impl MockVllm {
    pub(crate) fn start(slots: usize) -> MockVllm {
        let state = Arc::new(Mutex::new(VllmState {
            slots,
            healthy: true,
            admitted: 0,
            opened: Vec::new(),
            refused: 0,
            closed: 0,
            dropped: 0,
            held: Default::default(),
            resumed: 0,
            autostarts: 0,
            cancels: 0,
            forced: 0,
            units: 0,
            pieces: 0,
            frames: 0,
            acks: 0,
            stale: 0,
            error_next_unit: None,
            hold: Duration::from_secs(30),
            unit_delay: Duration::ZERO,
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mock = MockVllm { addr, state, running: Mutex::new(None) };
        mock.serve(Some(listener));
        mock
    }

    fn serve(&self, listener: Option<std::net::TcpListener>) {
        let (shared, addr) = (self.state.clone(), self.addr);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let data = web::Data::new(shared);
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .route("/health", web::get().to(health))
                        .route("/v1/realtime", web::get().to(duplex))
                        .route("/v1/duplex", web::get().to(duplex))
                })
                .workers(1)
                .disable_signals();
                // Brought back on the same port: `bind` reuses the address.
                let server = match listener {
                    Some(l) => server.listen(l).unwrap(),
                    None => server.bind(addr).unwrap(),
                }
                .run();
                tx.send(server.handle()).unwrap();
                let _ = server.await;
            });
        });
        let handle = rx.recv().unwrap();
        *self.running.lock().unwrap() = Some((handle, thread));
    }

    /// The server dies: every connection is dropped, its sessions are gone.
    pub(crate) fn kill(&self) {
        let Some((handle, thread)) = self.running.lock().unwrap().take() else { return };
        stop(handle);
        thread.join().unwrap();
        self.state.lock().unwrap().admitted = 0;
    }

    /// The server is back on the same port.
    pub(crate) fn revive(&self) {
        self.serve(None);
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `[[workers]]` entry of a gateway that drives this server's `count` slots.
    /// Decisions are waited for a whole unit unless `options` says otherwise (the tests' clients
    /// send a chunk and read its answer: a longer wait stalls nothing).
    pub(crate) fn entry(&self, name: &str, count: usize, options: &str) -> String {
        let wait = if options.contains("decision_wait_ms") { "" } else { "decision_wait_ms = 1000\n" };
        format!(
            "[[workers]]\nname = \"{name}\"\nbackend = \"vllm-omni\"\nurl = \"{}\"\ncount = {count}\nmodes = [\"audio\", \"video\"]\n[workers.options]\nhealth_interval_s = 0.2\n{wait}{options}\n",
            self.url()
        )
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut VllmState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Looks at the state until `ready` holds (within 20 s), then takes `f` of it.
    pub(crate) fn wait_for<T>(&self, ready: impl Fn(&VllmState) -> bool, f: impl FnOnce(&VllmState) -> T) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            {
                let s = self.state.lock().unwrap();
                if ready(&s) {
                    return f(&s);
                }
            }
            assert!(std::time::Instant::now() < deadline, "the mock never got there: {:?}", self.state.lock().unwrap());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for MockVllm {
    fn drop(&mut self) {
        if let Some((handle, _)) = self.running.lock().unwrap().take() {
            stop(handle);
        }
    }
}

/// Stops the server at once, its connections dropped.
fn stop(handle: actix_web::dev::ServerHandle) {
    // On a thread of its own: the tests call it from their own runtime.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(handle.stop(false))
    })
    .join()
    .unwrap();
}

type Shared = web::Data<Arc<Mutex<VllmState>>>;

async fn health(state: Shared) -> HttpResponse {
    if state.lock().unwrap().healthy {
        HttpResponse::Ok().json(json!({"status": "healthy"}))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({"status": "unhealthy"}))
    }
}

/// Frames of at most 15 MiB, as the server reads them.
const MAX_FRAME: usize = 15 << 20;
/// One unit: a second at 16 kHz.
const UNIT: usize = 16000;
/// The most units the server feeds itself per response.
const MAX_SELF_FED: u32 = 64;

fn hex_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn pcm16_b64(samples: usize) -> String {
    let bytes: Vec<u8> =
        (0..samples).flat_map(|i| ((0.1 * (i as f32 * 0.05).sin() * 32767.0) as i16).to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

/// One session on one socket.
struct Model {
    session_id: String,
    resume_token: String,
    epoch: u64,
    seq: u64,
    input_f32: bool,
    pending: Vec<f32>,
    heard: bool,
    replies: u32,
    /// The last line of instructions that gave the model context, told in its next reply.
    told: String,
    /// The active response: its id and the pieces it has said.
    response: Option<(String, u32)>,
    self_fed: u32,
}

impl Model {
    /// An event with its id and journal number.
    fn event(&mut self, mut v: Value) -> String {
        self.seq += 1;
        v["event_id"] = json!(format!("event_{}", hex_id()));
        v["server_event_seq"] = json!(self.seq);
        v.to_string()
    }

    fn listen(&mut self, response_id: Option<&str>) -> String {
        let mut v = json!({"type": "response.listen", "session_id": self.session_id, "epoch": self.epoch,
            "response": {"object": "realtime.response", "status": "listening",
                         "metadata": {"type": "listen", "session_id": self.session_id, "epoch": self.epoch,
                                      "reason": "model_listen", "model_listen": true}}});
        if let Some(id) = response_id {
            v["response_id"] = json!(id);
        }
        self.event(v)
    }

    fn piece(&mut self, id: &str, text: &str, samples: usize, end_of_turn: bool) -> Vec<String> {
        let item = format!("item_{id}");
        vec![
            self.event(json!({"type": "response.output_audio.delta", "response_id": id, "item_id": item,
                "output_index": 0, "content_index": 0, "delta": pcm16_b64(samples), "format": "pcm16",
                "sample_rate_hz": 24000, "metadata": {"session_id": self.session_id, "epoch": self.epoch,
                "model_speak": true, "end_of_turn": end_of_turn, "audio_duration_ms": samples / 24}})),
            self.event(json!({"type": "response.output_audio_transcript.delta", "response_id": id, "item_id": item,
                "output_index": 0, "content_index": 0, "delta": text})),
        ]
    }

    fn done(&mut self, id: &str, status: &str, reason: &str) -> Vec<String> {
        let item = format!("item_{id}");
        let mut out = Vec::new();
        if status == "completed" {
            for kind in [
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
            ] {
                out.push(self.event(json!({"type": kind, "response_id": id, "item_id": item})));
            }
        }
        out.push(self.event(json!({"type": "response.done", "response_id": id,
            "response": {"id": id, "object": "realtime.response", "status": status,
                         "status_details": {"type": status, "reason": reason}, "output": []}})));
        out.push(self.event(json!({"type": "rate_limits.updated", "rate_limits": []})));
        out
    }

    /// The model's decision for one unit.
    fn decide(&mut self, unit: &[f32], force_listen: bool) -> Vec<String> {
        let rms = (unit.iter().map(|s| s * s).sum::<f32>() / unit.len().max(1) as f32).sqrt();
        if force_listen {
            // Guessed: a force-listen unit during a response ends it (the source masks the
            // model's logits to listen; how the response then ends is the model's).
            self.heard = false;
            return match self.response.take() {
                Some((id, _)) => {
                    let mut out = vec![self.listen(Some(&id))];
                    out.extend(self.done(&id, "completed", "stop"));
                    out
                }
                None => vec![self.listen(None)],
            };
        }
        if let Some((id, said)) = self.response.clone() {
            debug_assert_eq!(said, 1);
            self.response = None;
            let mut out = self.piece(&id, " Done.", 12000, true);
            out.extend(self.done(&id, "completed", "stop"));
            return out;
        }
        if rms > 0.02 {
            self.heard = true;
            return vec![self.listen(None)];
        }
        let told = std::mem::take(&mut self.told);
        if !self.heard && told.is_empty() {
            return vec![self.listen(None)];
        }
        self.heard = false;
        self.replies += 1;
        self.self_fed = 0;
        let id = format!("resp_{}", hex_id());
        let item = format!("item_{id}");
        let mut out = vec![self.event(json!({"type": "response.created", "response_id": id,
            "response": {"id": id, "object": "realtime.response", "status": "in_progress", "status_details": null,
                         "output": [], "modalities": ["audio", "text"]}}))];
        for kind in ["conversation.item.added", "conversation.item.created", "response.output_item.added"] {
            out.push(self.event(json!({"type": kind, "item": {"id": item, "type": "message", "role": "assistant"}})));
        }
        out.push(self.event(json!({"type": "response.content_part.added", "response_id": id, "item_id": item,
            "part": {"type": "audio", "transcript": ""}})));
        out.push(self.event(json!({"type": "response.speak", "response_id": id, "item_id": item, "output_index": 0,
            "content_index": 0, "metadata": {"session_id": self.session_id, "epoch": self.epoch, "model_speak": true}})));
        let text = match told.as_str() {
            "" => format!("Mock reply {}.", self.replies),
            told => format!("Mock reply {}, from what I was told: {told}", self.replies),
        };
        out.extend(self.piece(&id, &text, 24000, false));
        self.response = Some((id, 1));
        out
    }
}

/// An error event as the server writes it (no `error.event_id`).
fn error(kind: &str, code: &str, message: &str) -> String {
    json!({"type": "error", "event_id": format!("event_{}", hex_id()),
           "error": {"type": kind, "code": code, "message": message}})
    .to_string()
}

/// Takes a slot, or says the server is full.
fn admit(state: &Shared) -> Result<(), String> {
    let mut s = state.lock().unwrap();
    if s.admitted >= s.slots {
        s.refused += 1;
        let message = format!("duplex_session_capacity_exhausted: limit={}", s.slots);
        return Err(error("rate_limit_error", "resource_exhausted", &message));
    }
    s.admitted += 1;
    Ok(())
}

fn release(state: &Shared) {
    let mut s = state.lock().unwrap();
    s.admitted = s.admitted.saturating_sub(1);
}

/// A data URL of a WAV file.
fn is_wav_data_url(v: &Value) -> bool {
    v.as_str()
        .and_then(|u| u.strip_prefix("data:audio/wav;base64,"))
        .and_then(|b| STANDARD.decode(b).ok())
        .is_some_and(|w| w.len() > 44 && &w[..4] == b"RIFF" && &w[8..12] == b"WAVE")
}

async fn duplex(req: HttpRequest, body: web::Payload, state: Shared) -> actix_web::Result<HttpResponse> {
    let query: Vec<(String, String)> = req
        .query_string()
        .split('&')
        .filter_map(|pair| pair.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let q = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.to_lowercase());
    if req.path() == "/v1/realtime" && q("duplex").is_some_and(|d| !["1", "true", "on"].contains(&d.as_str())) {
        return Ok(HttpResponse::BadRequest().finish());
    }
    let autostart = q("model").is_some()
        && !q("autostart").is_some_and(|a| ["0", "false", "no", "off"].contains(&a.as_str()))
        && !q("resume").is_some_and(|r| ["1", "true", "yes", "on"].contains(&r.as_str()));
    let (response, mut ws, stream) = actix_ws::handle(&req, body)?;
    let mut stream = stream.max_frame_size(MAX_FRAME);
    actix_web::rt::spawn(async move {
        if autostart {
            // The default session is opened before any message: no ref_audio, so it fails.
            state.lock().unwrap().autostarts += 1;
            let said = match admit(&state) {
                Ok(()) => {
                    release(&state);
                    error("invalid_request_error", "ref_audio_required", "ref_audio is required for audio output")
                }
                Err(full) => full,
            };
            let _ = ws.text(said).await;
            let _ = ws.close(None).await;
            return;
        }
        // The first message, within 10 s.
        let first = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match stream.recv().await {
                    Some(Ok(Message::Text(t))) => return Some(t.to_string()),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                    Some(Ok(_)) => continue,
                }
            }
        })
        .await;
        let first = match first {
            Ok(Some(text)) => text,
            Ok(None) => return,
            Err(_) => {
                let _ = ws.text(error("invalid_request_error", "config_timeout", "no session config")).await;
                let _ = ws.close(None).await;
                return;
            }
        };
        let Ok(v) = serde_json::from_str::<Value>(&first) else {
            let _ = ws.text(error("invalid_request_error", "invalid_json", "not JSON")).await;
            let _ = ws.close(None).await;
            return;
        };
        if v["type"] == "session.resume" {
            return resume(ws, stream, &v, state).await;
        }
        if v["type"] != "session.update" {
            let _ = ws.text(error("invalid_request_error", "bad_event", "expected session.update")).await;
            let _ = ws.close(None).await;
            return;
        }
        if let Err(full) = admit(&state) {
            // Guessed: the close after a handshake error has no code of the server's choosing.
            let _ = ws.text(full).await;
            let _ = ws.close(None).await;
            return;
        }
        let session = v["session"].clone();
        let wants_audio = session["modalities"].as_array().is_none_or(|m| m.iter().any(|x| x == "audio"));
        if wants_audio && !is_wav_data_url(&session["ref_audio"]) {
            release(&state);
            let code = if session["ref_audio"].is_null() { "ref_audio_required" } else { "invalid_session_config" };
            let _ = ws.text(error("invalid_request_error", code, "ref_audio must be a WAV data URL")).await;
            let _ = ws.close(None).await;
            return;
        }
        state.lock().unwrap().opened.push(session.clone());
        let mut m = Model {
            session_id: format!("duplex-{}", hex_id()),
            resume_token: hex_id(),
            epoch: 0,
            seq: 0,
            input_f32: session["input_audio_format"] == "pcm_f32le",
            pending: Vec::new(),
            heard: false,
            replies: 0,
            told: match session["instructions"].as_str() {
                Some(i) if i.contains('\n') => i.lines().last().unwrap_or_default().to_string(),
                _ => String::new(),
            },
            response: None,
            self_fed: 0,
        };
        let object = json!({"id": m.session_id, "object": "realtime.session", "type": "realtime", "state": "open",
            "epoch": 0, "instructions": session["instructions"], "capabilities": {"chunk_period_ms": 1000,
            "supports_session_resume": true}});
        let created = json!({"type": "session.created", "event_id": format!("event_{}", hex_id()), "session": object,
            "attachment_generation": 1, "resume_token": m.resume_token});
        let updated = m.event(json!({"type": "session.updated", "session": object}));
        if ws.text(created.to_string()).await.is_err() || ws.text(updated).await.is_err() {
            return drop_held(state, &m).await;
        }
        let mut last_unit = tokio::time::Instant::now();
        loop {
            // While it speaks with no input, its own silence unit a second after the last.
            let self_feed = m.response.is_some() && m.self_fed < MAX_SELF_FED;
            let next = tokio::select! {
                msg = stream.recv() => msg,
                _ = tokio::time::sleep_until(last_unit + Duration::from_secs(1)), if self_feed => {
                    m.self_fed += 1;
                    last_unit = tokio::time::Instant::now();
                    state.lock().unwrap().units += 1;
                    let out = m.decide(&[0.0; UNIT], false);
                    if send_all(&mut ws, out).await.is_err() {
                        return drop_held(state, &m).await;
                    }
                    continue;
                }
            };
            let text = match next {
                Some(Ok(Message::Text(t))) => t.to_string(),
                Some(Ok(Message::Ping(p))) => {
                    let _ = ws.pong(&p).await;
                    continue;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return drop_held(state, &m).await,
                Some(Ok(_)) => continue,
            };
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                let _ = ws.text(error("invalid_request_error", "invalid_json", "not JSON")).await;
                continue;
            };
            let delay = state.lock().unwrap().unit_delay;
            match command(&mut m, &v, &state) {
                Reply::Events(out) => {
                    let pieces = out.iter().filter(|e| e.contains("\"response.output_audio.delta\"")).count();
                    if pieces > 0 && !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    if !out.is_empty() && v["type"] == "input_audio_buffer.append" {
                        last_unit = tokio::time::Instant::now();
                    }
                    if send_all(&mut ws, out).await.is_err() {
                        return drop_held(state, &m).await;
                    }
                    state.lock().unwrap().pieces += pieces;
                }
                Reply::Closed(closed) => {
                    let _ = ws.text(closed).await;
                    state.lock().unwrap().closed += 1;
                    release(&state);
                    let _ = ws.close(Some(closing())).await;
                    return;
                }
            }
        }
    });
    Ok(response)
}

enum Reply {
    Events(Vec<String>),
    /// `session.closed`: the socket closes after it.
    Closed(String),
}

/// One client command in an open session. Errors never close it.
fn command(m: &mut Model, v: &Value, state: &Shared) -> Reply {
    let unknown = || error("invalid_request_error", "unknown_event", &format!("unknown event type {}", v["type"]));
    let out = match v["type"].as_str().unwrap_or("") {
        "input_audio_buffer.append" => {
            let Some(bytes) = v["audio"].as_str().or(v["delta"].as_str()).and_then(|b| STANDARD.decode(b).ok()) else {
                return Reply::Events(vec![error("invalid_request_error", "bad_audio", "audio is not valid base64")]);
            };
            let frames = v["video_frames"].as_array().map_or(0, Vec::len);
            if frames > 2 {
                let e = error("invalid_request_error", "invalid_video_frames", "at most 2 frames per append");
                return Reply::Events(vec![e]);
            }
            let force = v["force_listen"] == true;
            {
                let mut s = state.lock().unwrap();
                s.frames += frames;
                s.forced += force as usize;
            }
            if m.input_f32 {
                m.pending.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
            } else {
                m.pending.extend(bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0));
            }
            let mut out = Vec::new();
            while m.pending.len() >= UNIT {
                let unit: Vec<f32> = m.pending.drain(..UNIT).collect();
                let error_instead = {
                    let mut s = state.lock().unwrap();
                    s.units += 1;
                    s.error_next_unit.take()
                };
                match error_instead {
                    Some(code) => out.push(error("server_error", &code, &format!("the mock's {code}"))),
                    None => out.extend(m.decide(&unit, force)),
                }
            }
            out
        }
        "response.cancel" => match m.response.take() {
            Some((id, _)) if v["response_id"].as_str().is_none_or(|r| r == id) => {
                state.lock().unwrap().cancels += 1;
                m.epoch += 1;
                m.done(&id, "cancelled", "client_cancelled")
            }
            other => {
                m.response = other;
                vec![error("invalid_request_error", "response_not_active", "no active response")]
            }
        },
        "playback.ack" | "audio.playback_ack" => {
            if v["played_ms"].as_f64().is_none() {
                vec![error("invalid_request_error", "bad_event", "played_ms is required")]
            } else {
                state.lock().unwrap().acks += 1;
                vec![m.event(json!({"type": "playback.acknowledged", "event": {"played_ms": v["played_ms"]}}))]
            }
        }
        "session.update" if v["session"].get("instructions").is_some() => {
            vec![error("invalid_request_error", "instructions_update_unsupported", "instructions are fixed once open")]
        }
        "session.heartbeat" => vec![m.event(json!({"type": "session.heartbeat_ack", "session_id": m.session_id}))],
        "session.close" | "close" | "close_session" => {
            let reason = v["reason"].as_str().unwrap_or("client_close");
            return Reply::Closed(m.event(json!({"type": "session.closed", "session_id": m.session_id,
                "reason": reason, "event": {}})));
        }
        _ => vec![unknown()],
    };
    Reply::Events(out)
}

/// A socket dropped without `session.close`: the session and its slot stay held for the
/// disconnect grace, unless it is taken back (`session.resume`).
async fn drop_held(state: Shared, m: &Model) {
    let hold = {
        let mut s = state.lock().unwrap();
        s.dropped += 1;
        s.held.insert(m.session_id.clone(), m.resume_token.clone());
        s.hold
    };
    tokio::time::sleep(hold).await;
    if state.lock().unwrap().held.remove(&m.session_id).is_some() {
        release(&state);
    }
}

/// `session.resume` as the first message: a held session taken back (the mock only closes it
/// then; nothing is replayed).
async fn resume(mut ws: actix_ws::Session, mut stream: actix_ws::MessageStream, v: &Value, state: Shared) {
    let id = v["session_id"].as_str().unwrap_or("").to_string();
    let taken = {
        let mut s = state.lock().unwrap();
        let ok = s.held.get(&id).is_some_and(|t| Some(t.as_str()) == v["resume_token"].as_str());
        if ok {
            s.held.remove(&id);
            s.resumed += 1;
        }
        ok
    };
    if !taken {
        let _ = ws.text(error("invalid_request_error", "session_resume_expired", "no such session")).await;
        let _ = ws.close(None).await;
        return;
    }
    let resumed = json!({"type": "session.resumed", "event_id": format!("event_{}", hex_id()), "session_id": id,
        "session": {"id": id}, "attachment_generation": 2, "resume_token": hex_id()});
    let _ = ws.text(resumed.to_string()).await;
    while let Some(Ok(msg)) = stream.recv().await {
        if let Message::Text(t) = msg
            && serde_json::from_str::<Value>(&t).is_ok_and(|v| v["type"] == "session.close")
        {
            let closed = json!({"type": "session.closed", "event_id": format!("event_{}", hex_id()),
                "session_id": id, "reason": "client_close", "event": {}});
            let _ = ws.text(closed.to_string()).await;
            state.lock().unwrap().closed += 1;
            break;
        }
    }
    release(&state);
    let _ = ws.close(Some(closing())).await;
}

async fn send_all(ws: &mut actix_ws::Session, events: Vec<String>) -> Result<(), actix_ws::Closed> {
    for e in events {
        ws.text(e).await?;
    }
    Ok(())
}

fn closing() -> CloseReason {
    CloseReason { code: CloseCode::Normal, description: Some("client_close".into()) }
}

/// Writes `seconds` of a 16 kHz tone of `amplitude` (of 32767) as a 16-bit WAV at `path`.
pub(crate) fn write_wav(path: &std::path::Path, seconds: usize, amplitude: f32) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..seconds * 16000 {
        w.write_sample(((i as f32 * 0.05).sin() * amplitude) as i16).unwrap();
    }
    w.finalize().unwrap();
}

/// A WAV voice prompt in a directory that lives as long as the test.
pub(crate) fn voice() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("voice.wav");
    write_wav(&path, 1, 8000.0);
    (dir, path)
}
