//! A MiniCPM-o model worker as the tests need one: the worker protocol (`GET /health`,
//! `WS /ws/duplex`, `WS /ws/chat`) served in-process on a free loopback port, with a
//! deterministic model and switches for the faults a real worker shows.
//!
//! Duplex: the first three steps listen (as the real worker's do); after that a chunk of
//! sound is heard, and the first quiet chunk after it starts a reply of two speaking steps
//! ("Mock reply N." with 1 s of 24 kHz audio, then " Done." with 0.5 s and `end_of_turn`).
//! `force_listen` ends a reply at once. A system prompt of more than one line is context the
//! model was given (what a gateway's delegation prepares it with): its first reply after the
//! three warm-up steps comes unasked and says the prompt's last line back ("Mock reply N, from
//! what I was told: ..."). `kv_cache_length` grows by 25 a chunk and 64 a frame.
//! Chat: "Reply with exactly: X" answers X, anything else "Mock answer to N message(s).",
//! one streamed chunk per word (with 0.25 s of audio each when TTS is on).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use actix_ws::Message;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// What the tests can see and switch.
#[derive(Debug, Clone)]
pub(crate) struct MockState {
    /// `worker_status` of `/health` while no job runs: idle, or what a test sets (loading, error).
    pub status: String,
    /// A job is running (a duplex session or a chat request).
    pub busy: bool,
    /// The next audio_chunk drops the connection without an answer.
    pub drop_next_chunk: bool,
    /// Every `prepare` received.
    pub prepares: Vec<Value>,
    /// Every chat request received.
    pub chats: Vec<Value>,
    /// Chunks received, and of those with force_listen.
    pub chunks: usize,
    /// Every chunk's `audio_base64`, as it arrived.
    pub audio: Vec<String>,
    pub forced: usize,
    /// Seconds a step takes.
    pub step_delay: f64,
    /// `GET /health` requests received.
    pub health_asks: usize,
    /// Seconds `/health` takes to answer.
    pub health_delay: f64,
    /// How the worker misbehaves when asked for an answer (a step or a chat), if it does.
    pub misbehave: Option<Misbehave>,
}

/// What a broken or hostile worker does instead of answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misbehave {
    /// Pings every 100 ms, and never answers.
    PingsOnly,
    /// Streams words of a chat answer without end (1 KB a message, as fast as they are taken).
    EndlessAnswer,
    /// Answers with one 8 MB text message.
    HugeMessage,
}

/// Does what `how` says instead of an answer, until the peer goes (or, for a huge message, once).
async fn misbehave(how: Misbehave, session: &mut actix_ws::Session) {
    match how {
        Misbehave::PingsOnly => loop {
            if session.ping(b"still here").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await; // the pace of its pings
        },
        Misbehave::EndlessAnswer => {
            let word = "word ".repeat(200);
            while session.text(json!({"type": "chunk", "text_delta": word}).to_string()).await.is_ok() {}
        }
        Misbehave::HugeMessage => {
            let _ = session.text(json!({"type": "chunk", "text_delta": "x".repeat(8 << 20)}).to_string()).await;
        }
    }
}

pub(crate) struct MockWorker {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<MockState>>,
}

impl MockWorker {
    pub(crate) fn start() -> MockWorker {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(MockState {
            status: "idle".into(),
            busy: false,
            drop_next_chunk: false,
            prepares: Vec::new(),
            chats: Vec::new(),
            chunks: 0,
            audio: Vec::new(),
            forced: 0,
            step_delay: 0.0,
            health_asks: 0,
            health_delay: 0.0,
            misbehave: None,
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let data = web::Data::new(shared);
                HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .route("/health", web::get().to(health))
                        .route("/ws/duplex", web::get().to(duplex))
                        .route("/ws/chat", web::get().to(chat))
                })
                .workers(1)
                .listen(listener)
                .unwrap()
                .run()
                .await
                .unwrap();
            });
        });
        MockWorker { addr, state }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `[[workers]]` entry of a gateway that drives this worker.
    pub(crate) fn entry(&self, name: &str, options: &str) -> String {
        format!(
            "[[workers]]\nname = \"{name}\"\nbackend = \"minicpmo-worker\"\nurl = \"{}\"\n[workers.options]\n{options}\n",
            self.url()
        )
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut MockState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Looks at the state until `ready` holds (within 10 s), then takes `f` of it.
    pub(crate) fn wait_for<T>(&self, ready: impl Fn(&MockState) -> bool, f: impl FnOnce(&MockState) -> T) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            {
                let s = self.state.lock().unwrap();
                if ready(&s) {
                    return f(&s);
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the worker never got there: {:?}",
                self.state.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

type Shared = web::Data<Arc<Mutex<MockState>>>;

async fn health(state: Shared) -> HttpResponse {
    let delay = {
        let mut s = state.lock().unwrap();
        s.health_asks += 1;
        s.health_delay
    };
    if delay > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(delay)).await;
    }
    let s = state.lock().unwrap().clone();
    let worker_status = if s.busy { "duplex_active" } else { s.status.as_str() };
    let status = match worker_status {
        "loading" => "initializing",
        "error" => "error",
        _ => "healthy",
    };
    HttpResponse::Ok().json(json!({
        "status": status, "worker_status": worker_status, "gpu_id": 0, "model_loaded": status == "healthy",
        "current_session_id": null, "total_requests": 0, "avg_inference_time_ms": 100.0, "kv_cache_length": 0,
    }))
}

/// Takes the worker for a job, or says it is busy (the real worker waits 5 s first).
fn take(state: &Shared) -> Result<(), String> {
    let mut s = state.lock().unwrap();
    if s.busy || s.status != "idle" {
        return Err(format!("Worker busy after waiting 5s: {}", if s.busy { "duplex_active" } else { &s.status }));
    }
    s.busy = true;
    Ok(())
}

fn release(state: &Shared) {
    state.lock().unwrap().busy = false;
}

fn f32_b64(samples: &[f32]) -> String {
    STANDARD.encode(samples.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>())
}

fn tone(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.1 * (i as f32 * 0.05).sin()).collect()
}

/// A worker takes frames of up to 16 MiB.
const MAX_FRAME: usize = 16 << 20;

async fn duplex(req: HttpRequest, body: web::Payload, state: Shared) -> actix_web::Result<HttpResponse> {
    let (response, mut session, stream) = actix_ws::handle(&req, body)?;
    let mut stream = stream.max_frame_size(MAX_FRAME);
    actix_web::rt::spawn(async move {
        if let Err(why) = take(&state) {
            let _ = session.text(json!({"type": "error", "error": why}).to_string()).await;
            let _ = session.close(None).await;
            return;
        }
        let (mut steps, mut kv, mut heard, mut speaking, mut replies) = (0u64, 0u64, false, 0u32, 0u32);
        // The last line of a prompt that gave the model context, told in its next reply.
        let mut told = String::new();
        let mut paused: Option<tokio::time::Instant> = None;
        loop {
            let next = match paused {
                Some(deadline) => tokio::select! {
                    m = stream.recv() => m,
                    _ = tokio::time::sleep_until(deadline) => {
                        let _ = session.text(json!({"type": "timeout", "reason": "pause timeout"}).to_string()).await;
                        break;
                    }
                },
                None => stream.recv().await,
            };
            let text = match next {
                Some(Ok(Message::Text(t))) => t.to_string(),
                Some(Ok(Message::Ping(p))) => {
                    let _ = session.pong(&p).await;
                    continue;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => continue,
            };
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                break; // the real worker ends the session silently on malformed input
            };
            let reply = match v["type"].as_str().unwrap_or("") {
                "prepare" => {
                    state.lock().unwrap().prepares.push(v.clone());
                    (steps, kv, heard, speaking) = (0, 50, false, 0);
                    let prompt = v["system_prompt"].as_str().unwrap_or_default();
                    told = if prompt.contains('\n') {
                        prompt.lines().last().unwrap_or_default().to_string()
                    } else {
                        String::new()
                    };
                    let len = prompt.len();
                    json!({"type": "prepared", "prompt_length": len})
                }
                "audio_chunk" => {
                    let (drop_now, delay, broken) = {
                        let mut s = state.lock().unwrap();
                        s.chunks += 1;
                        s.forced += (v["force_listen"] == true) as usize;
                        (std::mem::take(&mut s.drop_next_chunk), s.step_delay, s.misbehave)
                    };
                    if let Some(how) = broken {
                        misbehave(how, &mut session).await;
                        break;
                    }
                    if drop_now {
                        release(&state);
                        return; // dropped without a word: the socket closes
                    }
                    let Some(b64) = v["audio_base64"].as_str() else {
                        let _ =
                            session.text(json!({"type": "error", "error": "Missing audio_base64"}).to_string()).await;
                        continue;
                    };
                    state.lock().unwrap().audio.push(b64.to_string());
                    if delay > 0.0 {
                        tokio::time::sleep(Duration::from_secs_f64(delay)).await;
                    }
                    let bytes = STANDARD.decode(b64).unwrap_or_default();
                    let samples: Vec<f32> =
                        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                    let rms = (samples.iter().map(|s| s * s).sum::<f32>() / samples.len().max(1) as f32).sqrt();
                    let frames = v["frame_base64_list"].as_array().map_or(0, Vec::len) as u64;
                    steps += 1;
                    kv += 25 + 64 * frames;
                    if v["force_listen"] == true {
                        speaking = 0;
                        heard = false;
                    } else if steps > 3 && speaking == 0 {
                        if !told.is_empty() && rms <= 0.02 {
                            replies += 1;
                            speaking = 1;
                        } else if rms > 0.02 {
                            heard = true;
                        } else if heard {
                            replies += 1;
                            speaking = 1;
                            heard = false;
                        }
                    }
                    let mut result = json!({"type": "result", "is_listen": true, "text": "", "audio_data": null,
                        "end_of_turn": false, "current_time": steps, "kv_cache_length": kv, "cost_all_ms": 1.0,
                        "n_tokens": 0, "n_tts_tokens": 0, "wall_clock_ms": 1.0});
                    match speaking {
                        1 => {
                            result["is_listen"] = json!(false);
                            let text = match std::mem::take(&mut told) {
                                t if t.is_empty() => format!("Mock reply {replies}."),
                                t => format!("Mock reply {replies}, from what I was told: {t}"),
                            };
                            result["text"] = json!(text);
                            result["audio_data"] = json!(f32_b64(&tone(24000)));
                            result["n_tokens"] = json!(3);
                            kv += 3;
                            speaking = 2;
                        }
                        2 => {
                            result["is_listen"] = json!(false);
                            result["text"] = json!(" Done.");
                            result["audio_data"] = json!(f32_b64(&tone(12000)));
                            result["end_of_turn"] = json!(true);
                            result["n_tokens"] = json!(1);
                            kv += 1;
                            speaking = 0;
                        }
                        _ => {}
                    }
                    result["kv_cache_length"] = json!(kv);
                    result
                }
                "pause" => {
                    let timeout = v["timeout"].as_f64().unwrap_or(60.0);
                    paused = Some(tokio::time::Instant::now() + Duration::from_secs_f64(timeout));
                    json!({"type": "paused", "timeout": timeout})
                }
                "resume" => {
                    paused = None;
                    json!({"type": "resumed"})
                }
                "stop" => {
                    let _ = session.text(json!({"type": "stopped"}).to_string()).await;
                    break;
                }
                other => json!({"type": "error", "error": format!("Unknown message type: {other}")}),
            };
            if session.text(reply.to_string()).await.is_err() {
                break;
            }
        }
        release(&state);
        let _ = session.close(None).await;
    });
    Ok(response)
}

async fn chat(req: HttpRequest, body: web::Payload, state: Shared) -> actix_web::Result<HttpResponse> {
    let (response, mut session, stream) = actix_ws::handle(&req, body)?;
    let mut stream = stream.max_frame_size(MAX_FRAME);
    actix_web::rt::spawn(async move {
        let request = loop {
            match stream.recv().await {
                Some(Ok(Message::Text(t))) => break serde_json::from_str::<Value>(&t).unwrap_or(Value::Null),
                Some(Ok(_)) => continue,
                _ => return,
            }
        };
        if let Err(why) = take(&state) {
            let _ = session.text(json!({"type": "error", "error": why}).to_string()).await;
            let _ = session.close(None).await;
            return;
        }
        let broken = {
            let mut s = state.lock().unwrap();
            s.chats.push(request.clone());
            s.misbehave
        };
        if let Some(how) = broken {
            let _ = session.text(json!({"type": "prefill_done", "input_tokens": 1}).to_string()).await;
            misbehave(how, &mut session).await;
            release(&state);
            return;
        }
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let words = |v: &Value| match v {
            Value::String(s) => s.split_whitespace().count(),
            Value::Array(items) => {
                items.iter().filter_map(|i| i["text"].as_str()).map(|t| t.split_whitespace().count()).sum()
            }
            _ => 0,
        };
        let input_tokens: usize = messages.iter().map(|m| words(&m["content"]) + 1).sum();
        let last_user = messages.iter().rev().find(|m| m["role"] == "user").map(|m| m["content"].clone());
        let said = match &last_user {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => items.iter().filter_map(|i| i["text"].as_str()).collect::<Vec<_>>().join(" "),
            _ => String::new(),
        };
        let answer = match said.trim().strip_prefix("Reply with exactly:") {
            Some(x) => x.trim().to_string(),
            None => format!("Mock answer to {} message(s).", messages.len()),
        };
        let tts = request["tts"]["enabled"] == true;
        let _ = session.text(json!({"type": "prefill_done", "input_tokens": input_tokens}).to_string()).await;
        let pieces: Vec<String> =
            answer.split(' ').enumerate().map(|(i, w)| if i == 0 { w.to_string() } else { format!(" {w}") }).collect();
        for piece in &pieces {
            let mut chunk = json!({"type": "chunk", "text_delta": piece});
            if tts {
                chunk["audio_data"] = json!(f32_b64(&tone(6000)));
            }
            if session.text(chunk.to_string()).await.is_err() {
                release(&state);
                return;
            }
        }
        let done =
            json!({"type": "done", "text": answer, "generated_tokens": pieces.len(), "input_tokens": input_tokens});
        let _ = session.text(done.to_string()).await;
        release(&state);
        let _ = session.close(None).await;
    });
    Ok(response)
}
