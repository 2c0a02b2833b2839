//! `omni-gateway probe`: one session against a server speaking the current or the earlier
//! MiniCPM-o dialect. Streams a WAV file in one-second chunks (or `--chunk-ms`; real time, or
//! `--speed N`),
//! optional JPEG frames, a force-listen at a chosen second; or, in chat mode, one message.
//! Prints events as they arrive, saves the model's audio, and ends with a summary.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::client::{self, WireDialect, next};
use omni_actors::audio;

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    /// The server, e.g. ws://127.0.0.1:8006 (wss:// is not supported by the probe).
    #[arg(long, default_value = "ws://127.0.0.1:8006")]
    pub url: String,
    /// chat, video or audio.
    #[arg(long, default_value = "video")]
    pub mode: String,
    #[arg(long, value_enum, default_value = "current")]
    pub dialect: WireDialect,
    /// A WAV file (any rate and channel count; resampled to 16 kHz mono) to stream. Without
    /// it, 2 s of a synthetic voice (a tone the reference backend hears as speech) are sent.
    #[arg(long, conflicts_with = "say")]
    pub wav: Option<PathBuf>,
    /// Speak TEXT with espeak-ng (run here) and stream it: a spoken question for a real model.
    #[arg(long)]
    pub say: Option<String>,
    /// JPEG frames: a file, or a folder whose .jpg files are sent in name order, one per chunk.
    #[arg(long)]
    pub frames: Option<PathBuf>,
    /// Stream N times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Milliseconds of audio per chunk: at least 250 (the gateway's smallest); a model that
    /// steps on every chunk (the CPU model) hears the end of a question sooner with 250.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(250..=10000))]
    pub chunk_ms: u32,
    /// Send force_listen with the chunk that starts at this second.
    #[arg(long)]
    pub force_listen_at: Option<f64>,
    /// Chat mode: the message to send.
    #[arg(long)]
    pub message: Option<String>,
    /// Chat mode: ask for speech too.
    #[arg(long)]
    pub tts: bool,
    /// Where to save the model's audio (24 kHz WAV).
    #[arg(long, default_value = "probe-reply.wav")]
    pub out: PathBuf,
    /// The system prompt; empty: the model's own (a backend may have it ready, so the session
    /// starts sooner).
    #[arg(long, default_value = "")]
    pub instructions: String,
    /// Seconds of silence streamed after the WAV, so that the model can answer.
    #[arg(long, default_value_t = 3.0)]
    pub tail: f64,
    /// The API key, when the server has `[auth] api_keys` (sent as `Authorization: Bearer`).
    #[arg(long, env = "OMNI_API_KEY")]
    pub api_key: Option<String>,
    /// Also print the summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// What the probe measured.
#[derive(Debug, Default)]
struct Summary {
    queued_at: Option<u64>,
    queue_done_ms: Option<f64>,
    created_ms: Option<f64>,
    first_audio_ms: Option<f64>,
    session_id: String,
    text: String,
    audio_samples: usize,
    chunks_sent: usize,
    answered: HashSet<String>,
    answers: usize,
    listens: usize,
    errors: Vec<String>,
    closed: Option<String>,
    /// What the model heard (`input.transcript`).
    heard: Vec<String>,
}

fn load_frames(path: &Path) -> Result<Vec<String>, String> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("jpg") || x.eq_ignore_ascii_case("jpeg")))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    if files.is_empty() {
        return Err(format!("{}: no .jpg files", path.display()));
    }
    files
        .iter()
        .map(|f| std::fs::read(f).map(|b| STANDARD.encode(b)).map_err(|e| format!("{}: {e}", f.display())))
        .collect()
}

pub fn run(args: ProbeArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(probe(args))
}

async fn probe(args: ProbeArgs) -> Result<(), String> {
    let chat = args.mode == "chat";
    if chat && args.message.is_none() {
        return Err("chat mode needs --message TEXT".into());
    }
    if chat && args.dialect == WireDialect::Legacy {
        return Err("the earlier dialect has no chat mode".into());
    }
    let mut samples = match &args.wav {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            audio::wav_to_16k_mono(&bytes, audio::AudioLimits { max_seconds: 3600.0 })
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None if chat => Vec::new(),
        None if args.say.is_some() => {
            let text = args.say.as_deref().unwrap_or_default();
            println!("saying {text:?} (espeak-ng), then silence");
            spoken(text)?
        }
        None => {
            println!("no --wav given: sending 2 s of a synthetic voice (a 220 Hz tone), then silence");
            synthetic_voice()
        }
    };
    samples.extend(std::iter::repeat_n(0.0, (args.tail * 16000.0) as usize));
    let frames = match &args.frames {
        Some(p) => load_frames(p)?,
        None => {
            if args.mode == "video" {
                println!("video mode without --frames: no frames are sent, the model sees nothing (--frames DIR)");
            }
            Vec::new()
        }
    };
    let speed = args.speed.max(0.01);

    let t0 = Instant::now();
    let ms = || t0.elapsed().as_secs_f64() * 1000.0;
    let stamp = || format!("[{:6.2}s]", t0.elapsed().as_secs_f64());
    let ws = client::connect(&args.url, &args.mode, args.api_key.as_deref()).await?;
    println!("{} connected to {} (mode {}, {:?} dialect)", stamp(), args.url, args.mode, args.dialect);
    let (mut sink, mut stream) = ws.split();
    // The session, until it ends or the user presses Ctrl-C: then its close goes to the server
    // (a probe cut off without one would leave its worker held for a resume).
    let mut session = Box::pin(async {
        let mut s = Summary::default();
        let mut reply_audio: Vec<f32> = Vec::new();
        let wait = Duration::from_secs(600);

        // Queue, then initialise.
        loop {
            let text = next(&mut stream, wait).await?.ok_or("closed while waiting for a worker")?;
            let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            match v["type"].as_str().unwrap_or_default() {
                "session.queued" | "session.queue_update" => {
                    s.queued_at.get_or_insert(v["position"].as_u64().unwrap_or(0));
                    println!(
                        "{} queue: position {} of {}, about {} s",
                        stamp(),
                        v["position"],
                        v["queue_length"],
                        v["estimated_wait_s"]
                    );
                }
                "session.queue_done" => {
                    s.queue_done_ms = Some(ms());
                    println!("{} queue done: a worker is assigned", stamp());
                    break;
                }
                "error" => return Err(format!("refused: {}", v["error"])),
                other => println!("{} {other}", stamp()),
            }
        }
        futures_util::SinkExt::send(
            &mut sink,
            Message::text(client::init_event_with_transcripts(args.dialect, &args.instructions)),
        )
        .await
        .map_err(|e| e.to_string())?;

        let chunk_len = 16 * args.chunk_ms as usize;
        let chunk_s = args.chunk_ms as f64 / 1000.0;
        let mut chunks = samples.chunks(chunk_len).map(|c| {
            let mut c = c.to_vec();
            c.resize(chunk_len, 0.0);
            c
        });
        let total_chunks = samples.len().div_ceil(chunk_len);
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(chunk_s / speed));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut created = false;
        let mut sent_all_at: Option<Instant> = None;
        let mut closing = false;
        let mut chat_sent = false;

        loop {
            tokio::select! {
                _ = ticker.tick(), if created && !chat && !closing => {
                    match chunks.next() {
                        Some(chunk) => {
                            let i = s.chunks_sent;
                            let at = i as f64 * chunk_s; // seconds of audio before this chunk
                            let force = args.force_listen_at.is_some_and(|f| at >= f && at < f + chunk_s);
                            let frame: Vec<String> = if frames.is_empty() { vec![] } else { vec![frames[i % frames.len()].clone()] };
                            let event = client::chunk_event(args.dialect, &chunk, &frame, force);
                            futures_util::SinkExt::send(&mut sink, Message::text(event)).await.map_err(|e| e.to_string())?;
                            s.chunks_sent += 1;
                            if force {
                                println!("{} -> input_{} with force_listen", stamp(), s.chunks_sent);
                            }
                            if s.chunks_sent == total_chunks {
                                sent_all_at = Some(Instant::now());
                            }
                        }
                        None => {
                            // Everything sent: close once the last chunk is answered (or after 5 s).
                            let last = format!("input_{}", s.chunks_sent);
                            let answered = s.answered.contains(&last) || (args.dialect == WireDialect::Legacy && s.answers >= s.chunks_sent);
                            if answered || sent_all_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
                                closing = true;
                                futures_util::SinkExt::send(&mut sink, Message::text(client::close_event())).await.map_err(|e| e.to_string())?;
                            }
                        }
                    }
                }
                text = next(&mut stream, wait) => {
                    let Some(text) = text? else { break };
                    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                    let kind = v["type"].as_str().unwrap_or_default().to_string();
                    match kind.as_str() {
                        "session.created" => {
                            created = true;
                            s.created_ms = Some(ms());
                            s.session_id = v["session_id"].as_str().unwrap_or_default().to_string();
                            println!("{} session.created {} ({})", stamp(), s.session_id, v["mode"].as_str().or(v["prompt_length"].as_u64().map(|_| "prompt")).unwrap_or(""));
                            if chat && !chat_sent {
                                chat_sent = true;
                                let event = json!({"type": "input.append", "input": {
                                    "messages": [{"role": "user", "content": args.message.clone().unwrap_or_default()}],
                                    "streaming": true, "tts": {"enabled": args.tts}}});
                                futures_util::SinkExt::send(&mut sink, Message::text(event.to_string())).await.map_err(|e| e.to_string())?;
                            }
                        }
                        "response.output.delta" => {
                            let input = v["input_id"].as_str().unwrap_or_default().to_string();
                            // Chat answers are counted at response.done.
                            if !chat && !input.is_empty() && s.answered.insert(input.clone()) {
                                s.answers += 1;
                            }
                            match v["kind"].as_str().unwrap_or_default() {
                                "listen" => {
                                    s.listens += 1;
                                    println!("{} listen   {input} kv={}", stamp(), v["metrics"]["kv_cache_length"]);
                                }
                                "text" => {
                                    let delta = v["text"].as_str().unwrap_or_default();
                                    s.text.push_str(delta);
                                    println!("{} text     {input} {delta:?}", stamp());
                                }
                                "audio" => {
                                    let pcm = client::f32_of(v["audio"].as_str().unwrap_or_default());
                                    s.first_audio_ms.get_or_insert(ms());
                                    println!("{} audio    {input} {} samples{}", stamp(), pcm.len(), if v["end_of_turn"] == true { " (end of turn)" } else { "" });
                                    s.audio_samples += pcm.len();
                                    reply_audio.extend(pcm);
                                }
                                _ => {}
                            }
                        }
                        "response.listen" => {
                            s.answers += 1;
                            s.listens += 1;
                            println!("{} listen   kv={}", stamp(), v["kv_cache_length"]);
                        }
                        "response.output_audio.delta" => {
                            s.answers += 1;
                            let delta = v["text"].as_str().unwrap_or_default();
                            s.text.push_str(delta);
                            let pcm = client::f32_of(v["audio"].as_str().unwrap_or_default());
                            s.first_audio_ms.get_or_insert(ms());
                            println!("{} speech   {} samples, text {delta:?}{}", stamp(), pcm.len(), if v["end_of_turn"] == true { " (end of turn)" } else { "" });
                            s.audio_samples += pcm.len();
                            reply_audio.extend(pcm);
                        }
                        "response.done" => {
                            s.answers += 1;
                            if let Some(a) = v["audio"].as_str() {
                                let pcm = client::f32_of(a);
                                s.first_audio_ms.get_or_insert(ms());
                                s.audio_samples += pcm.len();
                                reply_audio.extend(pcm);
                            }
                            if s.text.is_empty() {
                                s.text = v["text"].as_str().unwrap_or_default().to_string();
                            }
                            println!("{} done     {:?} ({})", stamp(), v["text"].as_str().unwrap_or_default(), v["reason"].as_str().unwrap_or_default());
                            if chat && !closing {
                                closing = true;
                                futures_util::SinkExt::send(&mut sink, Message::text(client::close_event())).await.map_err(|e| e.to_string())?;
                            }
                        }
                        "error" => {
                            let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
                            println!("{} error    {code}: {}", stamp(), v["error"]["message"].as_str().unwrap_or_default());
                            s.errors.push(code);
                        }
                        "input.transcript" => {
                            let text = v["text"].as_str().unwrap_or_default().to_string();
                            println!("{} heard    {text:?}", stamp());
                            s.heard.push(text);
                        }
                        "session.closed" => {
                            s.closed = v["reason"].as_str().map(String::from);
                            println!("{} session.closed ({})", stamp(), s.closed.as_deref().unwrap_or(""));
                        }
                        other => println!("{} {other}", stamp()),
                    }
                }
            }
        }

        if !reply_audio.is_empty() {
            std::fs::write(&args.out, audio::encode_wav(&reply_audio, 24000))
                .map_err(|e| format!("{}: {e}", args.out.display()))?;
        }
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |ms| format!("{ms:.1} ms"));
        println!("summary:");
        println!("  session            {}", s.session_id);
        println!("  queued at position {}", s.queued_at.map_or("- (no wait)".into(), |p| p.to_string()));
        println!("  to queue_done      {}", fmt(s.queue_done_ms));
        println!("  to session.created {}", fmt(s.created_ms));
        println!("  to first audio     {}", fmt(s.first_audio_ms));
        if !s.heard.is_empty() {
            println!("  heard              {:?}", s.heard.join(" "));
        }
        println!("  text received      {:?}", s.text);
        println!(
            "  audio received     {} samples ({:.2} s) saved to {}",
            s.audio_samples,
            s.audio_samples as f64 / 24000.0,
            if s.audio_samples > 0 { args.out.display().to_string() } else { "-".into() }
        );
        if chat {
            println!("  messages sent      {}", chat_sent as u32);
            println!("  answers            {}", s.answers);
        } else {
            println!("  chunks sent        {}", s.chunks_sent);
            println!("  chunks answered    {} ({} listens)", s.answers, s.listens);
        }
        println!("  errors             {}", if s.errors.is_empty() { "none".to_string() } else { s.errors.join(", ") });
        println!("  closed             {}", s.closed.as_deref().unwrap_or("-"));
        if !chat && s.text.is_empty() && s.audio_samples == 0 {
            println!(
                "  note: the model said nothing{}. A real model answers words, not a tone: \
                 --say \"What is the capital of France?\" (espeak-ng) or --wav speech.wav",
                if s.heard.is_empty() { " and reported hearing nothing" } else { "" }
            );
        }
        if args.json {
            let summary = json!({
                "heard": s.heard,
                "session_id": s.session_id, "queued_at": s.queued_at, "queue_done_ms": s.queue_done_ms,
                "created_ms": s.created_ms, "first_audio_ms": s.first_audio_ms, "text": s.text,
                "audio_samples": s.audio_samples, "chunks_sent": s.chunks_sent, "chunks_answered": s.answers,
                "listens": s.listens, "errors": s.errors, "closed": s.closed,
            });
            println!("{summary}");
        }
        Ok::<(), String>(())
    });
    tokio::select! {
        done = &mut session => return done,
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(session);
    let _ = futures_util::SinkExt::send(&mut sink, Message::Close(None)).await;
    Err("interrupted: the session was closed".into())
}

/// `text` spoken by espeak-ng, at 16 kHz (written to a file of its own: a WAV on stdout has no
/// length in its header).
fn spoken(text: &str) -> Result<Vec<f32>, String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let wav = std::env::temp_dir().join(format!("omni-probe-say-{}-{nanos}.wav", std::process::id()));
    let out = std::process::Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "150", "-w"])
        .arg(&wav)
        .args(["--", text])
        .output()
        .map_err(|e| format!("--say needs espeak-ng (apt-get install espeak-ng): {e}"))?;
    let bytes = std::fs::read(&wav);
    let _ = std::fs::remove_file(&wav);
    if !out.status.success() {
        return Err(format!("espeak-ng failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let bytes = bytes.map_err(|e| format!("espeak-ng's WAV: {e}"))?;
    audio::wav_to_16k_mono(&bytes, audio::AudioLimits { max_seconds: 600.0 })
        .map_err(|e| format!("espeak-ng's WAV: {e}"))
}

/// Two seconds of a 220 Hz tone with a syllable-like loudness contour: what the reference
/// backend (and an energy detector) hears as speech.
pub fn synthetic_voice() -> Vec<f32> {
    (0..32_000)
        .map(|i| {
            let t = i as f32 / 16000.0;
            let syllables = 0.6 + 0.4 * (2.0 * std::f32::consts::PI * 4.0 * t).sin().abs();
            0.3 * syllables * (2.0 * std::f32::consts::PI * 220.0 * t).sin()
        })
        .collect()
}
