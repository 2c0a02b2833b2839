//! One probed session: its events read and printed as they arrive, its audio streamed on a
//! ticker, its reply's audio kept, and the summary at its end.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use futures_util::stream::{SplitSink, SplitStream};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::ProbeArgs;
use crate::client::{self, WireDialect, Ws, next};
use omni_actors::audio;

/// How long the probe waits for the server's next event.
const WAIT: Duration = Duration::from_secs(600);

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

/// The session's state as the probe sees it.
pub(super) struct Run<'a> {
    args: &'a ProbeArgs,
    chat: bool,
    t0: Instant,
    s: Summary,
    reply_audio: Vec<f32>,
    created: bool,
    closing: bool,
    chat_sent: bool,
    sent_all_at: Option<Instant>,
}

type Sink = SplitSink<Ws, Message>;

async fn send(sink: &mut Sink, text: String) -> Result<(), String> {
    sink.send(Message::text(text)).await.map_err(|e| e.to_string())
}

impl<'a> Run<'a> {
    pub(super) fn new(args: &'a ProbeArgs, t0: Instant) -> Run<'a> {
        Run {
            args,
            chat: args.mode == "chat",
            t0,
            s: Summary::default(),
            reply_audio: Vec::new(),
            created: false,
            closing: false,
            chat_sent: false,
            sent_all_at: None,
        }
    }

    fn ms(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1000.0
    }

    pub(super) fn stamp(&self) -> String {
        format!("[{:6.2}s]", self.t0.elapsed().as_secs_f64())
    }

    /// Reads the queue's events until a worker is assigned.
    pub(super) async fn wait_for_worker(&mut self, stream: &mut SplitStream<Ws>) -> Result<(), String> {
        loop {
            let text = next(stream, WAIT).await?.ok_or("closed while waiting for a worker")?;
            let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            match v["type"].as_str().unwrap_or_default() {
                "session.queued" | "session.queue_update" => {
                    self.s.queued_at.get_or_insert(v["position"].as_u64().unwrap_or(0));
                    println!(
                        "{} queue: position {} of {}, about {} s",
                        self.stamp(),
                        v["position"],
                        v["queue_length"],
                        v["estimated_wait_s"]
                    );
                }
                "session.queue_done" => {
                    self.s.queue_done_ms = Some(self.ms());
                    println!("{} queue done: a worker is assigned", self.stamp());
                    return Ok(());
                }
                "error" => return Err(format!("refused: {}", v["error"])),
                other => println!("{} {other}", self.stamp()),
            }
        }
    }

    /// Streams `samples` in chunks (with `frames`) once the session is created, or sends the
    /// chat message, and reads the server's events until the session ends.
    pub(super) async fn converse(
        &mut self,
        sink: &mut Sink,
        stream: &mut SplitStream<Ws>,
        samples: &[f32],
        frames: &[String],
    ) -> Result<(), String> {
        let args = self.args;
        let chunk_len = 16 * args.chunk_ms as usize;
        let chunk_s = args.chunk_ms as f64 / 1000.0;
        let mut chunks = samples.chunks(chunk_len).map(|c| {
            let mut c = c.to_vec();
            c.resize(chunk_len, 0.0);
            c
        });
        let total_chunks = samples.len().div_ceil(chunk_len);
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(chunk_s / args.speed.max(0.01)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick(), if self.created && !self.chat && !self.closing => {
                    let out = match chunks.next() {
                        Some(chunk) => Some(self.chunk(&chunk, frames, chunk_s, total_chunks)),
                        None => self.all_sent(),
                    };
                    if let Some(out) = out {
                        send(sink, out).await?;
                    }
                }
                text = next(stream, WAIT) => {
                    let Some(text) = text? else { return Ok(()) };
                    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                    if let Some(out) = self.event(&v) {
                        send(sink, out).await?;
                    }
                }
            }
        }
    }

    /// The next chunk's event.
    fn chunk(&mut self, chunk: &[f32], frames: &[String], chunk_s: f64, total_chunks: usize) -> String {
        let i = self.s.chunks_sent;
        let at = i as f64 * chunk_s; // seconds of audio before this chunk
        let force = self.args.force_listen_at.is_some_and(|f| at >= f && at < f + chunk_s);
        let frame: Vec<String> = if frames.is_empty() { vec![] } else { vec![frames[i % frames.len()].clone()] };
        let event = client::chunk_event(self.args.dialect, chunk, &frame, force);
        self.s.chunks_sent += 1;
        if force {
            println!("{} -> input_{} with force_listen", self.stamp(), self.s.chunks_sent);
        }
        if self.s.chunks_sent == total_chunks {
            self.sent_all_at = Some(Instant::now());
        }
        event
    }

    /// Everything sent: the close, once the last chunk is answered (or after 5 s).
    fn all_sent(&mut self) -> Option<String> {
        let last = format!("input_{}", self.s.chunks_sent);
        let legacy = self.args.dialect == WireDialect::Legacy;
        let answered = self.s.answered.contains(&last) || (legacy && self.s.answers >= self.s.chunks_sent);
        if answered || self.sent_all_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            self.closing = true;
            return Some(client::close_event());
        }
        None
    }

    /// One event of the server's, printed and counted; what to send in return.
    fn event(&mut self, v: &Value) -> Option<String> {
        let stamp = self.stamp();
        match v["type"].as_str().unwrap_or_default() {
            "session.created" => return self.created(v),
            "response.output.delta" => self.output_delta(v),
            "response.listen" => {
                self.s.answers += 1;
                self.s.listens += 1;
                println!("{stamp} listen   kv={}", v["kv_cache_length"]);
            }
            "response.output_audio.delta" => {
                self.s.answers += 1;
                let delta = v["text"].as_str().unwrap_or_default();
                self.s.text.push_str(delta);
                let pcm = client::f32_of(v["audio"].as_str().unwrap_or_default());
                let end = if v["end_of_turn"] == true { " (end of turn)" } else { "" };
                println!("{stamp} speech   {} samples, text {delta:?}{end}", pcm.len());
                self.audio(pcm);
            }
            "response.done" => return self.done(v),
            "error" => {
                let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
                println!("{stamp} error    {code}: {}", v["error"]["message"].as_str().unwrap_or_default());
                self.s.errors.push(code);
            }
            "input.transcript" => {
                let text = v["text"].as_str().unwrap_or_default().to_string();
                println!("{stamp} heard    {text:?}");
                self.s.heard.push(text);
            }
            "session.closed" => {
                self.s.closed = v["reason"].as_str().map(String::from);
                println!("{stamp} session.closed ({})", self.s.closed.as_deref().unwrap_or(""));
            }
            other => println!("{stamp} {other}"),
        }
        None
    }

    /// `session.created`: streaming starts; in chat mode, the message goes.
    fn created(&mut self, v: &Value) -> Option<String> {
        self.created = true;
        self.s.created_ms = Some(self.ms());
        self.s.session_id = v["session_id"].as_str().unwrap_or_default().to_string();
        let kind = v["mode"].as_str().or(v["prompt_length"].as_u64().map(|_| "prompt")).unwrap_or("");
        println!("{} session.created {} ({kind})", self.stamp(), self.s.session_id);
        if !self.chat || self.chat_sent {
            return None;
        }
        self.chat_sent = true;
        let event = json!({"type": "input.append", "input": {
            "messages": [{"role": "user", "content": self.args.message.clone().unwrap_or_default()}],
            "streaming": true, "tts": {"enabled": self.args.tts}}});
        Some(event.to_string())
    }

    /// `response.output.delta`: a listen, text or audio, for one input.
    fn output_delta(&mut self, v: &Value) {
        let stamp = self.stamp();
        let input = v["input_id"].as_str().unwrap_or_default().to_string();
        // Chat answers are counted at response.done.
        if !self.chat && !input.is_empty() && self.s.answered.insert(input.clone()) {
            self.s.answers += 1;
        }
        match v["kind"].as_str().unwrap_or_default() {
            "listen" => {
                self.s.listens += 1;
                println!("{stamp} listen   {input} kv={}", v["metrics"]["kv_cache_length"]);
            }
            "text" => {
                let delta = v["text"].as_str().unwrap_or_default();
                self.s.text.push_str(delta);
                println!("{stamp} text     {input} {delta:?}");
            }
            "audio" => {
                let pcm = client::f32_of(v["audio"].as_str().unwrap_or_default());
                let end = if v["end_of_turn"] == true { " (end of turn)" } else { "" };
                println!("{stamp} audio    {input} {} samples{end}", pcm.len());
                self.audio(pcm);
            }
            _ => {}
        }
    }

    /// `response.done`: its audio and text; in chat mode, the close.
    fn done(&mut self, v: &Value) -> Option<String> {
        self.s.answers += 1;
        if let Some(a) = v["audio"].as_str() {
            self.audio(client::f32_of(a));
        }
        if self.s.text.is_empty() {
            self.s.text = v["text"].as_str().unwrap_or_default().to_string();
        }
        let (text, reason) = (v["text"].as_str().unwrap_or_default(), v["reason"].as_str().unwrap_or_default());
        println!("{} done     {text:?} ({reason})", self.stamp());
        if self.chat && !self.closing {
            self.closing = true;
            return Some(client::close_event());
        }
        None
    }

    fn audio(&mut self, pcm: Vec<f32>) {
        self.s.first_audio_ms.get_or_insert(self.ms());
        self.s.audio_samples += pcm.len();
        self.reply_audio.extend(pcm);
    }

    /// Saves the reply's audio and prints the summary (and its JSON line, when asked).
    pub(super) fn report(&self) -> Result<(), String> {
        let (args, s) = (self.args, &self.s);
        if !self.reply_audio.is_empty() {
            std::fs::write(&args.out, audio::encode_wav(&self.reply_audio, 24000))
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
        if self.chat {
            println!("  messages sent      {}", self.chat_sent as u32);
            println!("  answers            {}", s.answers);
        } else {
            println!("  chunks sent        {}", s.chunks_sent);
            println!("  chunks answered    {} ({} listens)", s.answers, s.listens);
        }
        println!("  errors             {}", if s.errors.is_empty() { "none".to_string() } else { s.errors.join(", ") });
        println!("  closed             {}", s.closed.as_deref().unwrap_or("-"));
        if !self.chat && s.text.is_empty() && s.audio_samples == 0 {
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
        Ok(())
    }
}
