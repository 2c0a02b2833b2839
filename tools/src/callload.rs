//! `omni-gateway callload`: N concurrent voice sessions of the OpenAI dialect, over WebRTC calls
//! (str0m as the client, Opus) or over WebSockets (24 kHz PCM in base64), speaking the same
//! pattern: a tone burst, then silence, in real time. Server VAD ends each turn; the reference
//! backend answers it with its voice.
//!
//! Measures, per transport, what a client sees: bytes a second upstream and downstream (UDP
//! payloads for a call, WebSocket messages' payloads for a socket), the time from the end of a
//! burst to the first of the model's voice, and, for calls, each voice frame's delay: its
//! arrival against its RTP timestamp, relative to the earliest frame of its talk spurt (the
//! jitter a client's buffer has to absorb). Writes everything as JSON.

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use clap::{Args, ValueEnum};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{Value, json};
use str0m::change::SdpAnswer;
use str0m::media::{Direction, Frequency, MediaKind, MediaTime};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, Input, Output, Rtc, RtcConfig};
use tokio_tungstenite::tungstenite::Message;

use super::client;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Webrtc,
    Websocket,
}

#[derive(Args, Debug, Clone)]
pub struct CallloadArgs {
    /// The server's HTTP address, e.g. http://127.0.0.1:8006.
    #[arg(long, default_value = "http://127.0.0.1:8006")]
    pub url: String,
    #[arg(long, value_enum, default_value = "webrtc")]
    pub transport: Transport,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Seconds over which the sessions start (evenly).
    #[arg(long, default_value_t = 2.0)]
    pub ramp: f64,
    /// Seconds each session talks once it is created.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Seconds of tone, then of silence, in each cycle.
    #[arg(long, default_value_t = 1.0)]
    pub tone: f64,
    #[arg(long, default_value_t = 3.0)]
    pub silence: f64,
    #[arg(long, env = "OMNI_API_KEY")]
    pub api_key: Option<String>,
    /// Write the results here as JSON.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

const RATE: u32 = 24_000;
const FRAME: usize = 480; // 20 ms at 24 kHz
const FRAME_MS: u64 = 20;

#[derive(Default)]
struct Totals {
    sessions_ok: usize,
    failures: Vec<String>,
    bytes_up: u64,
    bytes_down: u64,
    /// Seconds the sessions talked, together.
    talked_s: f64,
    turns: u64,
    answered: u64,
}

struct Shared {
    args: CallloadArgs,
    totals: Mutex<Totals>,
    eos_to_voice_us: Mutex<Histogram<u64>>,
    frame_delay_us: Mutex<Histogram<u64>>,
    /// One cycle of the user's voice: Opus frames (calls) and PCM frames (sockets).
    opus: Vec<Vec<u8>>,
    pcm: Vec<Vec<i16>>,
    tone_frames: usize,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn summary(h: &Histogram<u64>) -> Value {
    let ms = |v: u64| (v as f64 / 1000.0 * 10.0).round() / 10.0;
    json!({"count": h.len(), "p50_ms": ms(h.value_at_quantile(0.5)), "p90_ms": ms(h.value_at_quantile(0.9)),
           "p99_ms": ms(h.value_at_quantile(0.99)), "max_ms": ms(h.max())})
}

/// One cycle: `tone` seconds of a 220 Hz tone, then `silence` seconds, in 20 ms frames.
fn cycle(tone: f64, silence: f64) -> (Vec<Vec<i16>>, usize) {
    let tone_frames = (tone * 50.0).round() as usize;
    let frames = tone_frames + (silence * 50.0).round() as usize;
    let pcm = (0..frames)
        .map(|f| {
            (0..FRAME)
                .map(|i| {
                    if f >= tone_frames {
                        return 0;
                    }
                    let t = (f * FRAME + i) as f32 / RATE as f32;
                    ((t * 220.0 * std::f32::consts::TAU).sin() * 0.3 * i16::MAX as f32) as i16
                })
                .collect()
        })
        .collect();
    (pcm, tone_frames)
}

pub fn run(args: CallloadArgs) -> Result<(), String> {
    let (pcm, tone_frames) = cycle(args.tone, args.silence);
    let mut encoder =
        opus::Encoder::new(RATE, opus::Channels::Mono, opus::Application::Voip).map_err(|e| e.to_string())?;
    let opus = pcm.iter().map(|f| encoder.encode_vec(f, 1275).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let shared = Arc::new(Shared {
        args: args.clone(),
        totals: Mutex::default(),
        eos_to_voice_us: Mutex::new(histogram()),
        frame_delay_us: Mutex::new(histogram()),
        opus,
        pcm,
        tone_frames,
    });
    let runtime = client::runtime()?;
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..args.sessions {
            let shared = shared.clone();
            let delay = Duration::from_secs_f64(args.ramp * i as f64 / args.sessions.max(1) as f64);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let result = match shared.args.transport {
                    Transport::Webrtc => call(&shared).await,
                    Transport::Websocket => socket(&shared).await,
                };
                let mut t = shared.totals.lock();
                match result {
                    Ok(()) => t.sessions_ok += 1,
                    Err(e) => t.failures.push(e),
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let t = shared.totals.lock();
    let per_s = |bytes: u64| if t.talked_s > 0.0 { (bytes as f64 / t.talked_s).round() } else { 0.0 };
    let out = json!({
        "transport": format!("{:?}", args.transport).to_lowercase(),
        "sessions": args.sessions,
        "sessions_ok": t.sessions_ok,
        "failures": t.failures.iter().take(10).collect::<Vec<_>>(),
        "failed": t.failures.len(),
        "bytes_up_per_s": per_s(t.bytes_up),
        "bytes_down_per_s": per_s(t.bytes_down),
        "turns": t.turns,
        "answered": t.answered,
        "end_of_speech_to_voice": summary(&shared.eos_to_voice_us.lock()),
        "frame_delay": summary(&shared.frame_delay_us.lock()),
    });
    println!("{out}");
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_vec_pretty(&out).unwrap_or_default()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What one session saw of the model's voice.
#[derive(Default)]
struct Heard {
    /// When the last burst ended, until the voice answering it arrives.
    burst_ended: Option<Instant>,
    /// The current talk spurt's frames: (arrival, RTP time in ms).
    spurt: Vec<(Instant, f64)>,
    delays_us: Vec<u64>,
    eos_us: Vec<u64>,
    turns: u64,
    answered: u64,
}

impl Heard {
    fn voice(&mut self, at: Instant) {
        if let Some(end) = self.burst_ended.take() {
            self.eos_us.push(at.saturating_duration_since(end).as_micros() as u64);
            self.answered += 1;
        }
    }

    /// A frame of a call's voice: its delay against the spurt's earliest frame.
    fn frame(&mut self, at: Instant, rtp_ms: f64) {
        if let Some(&(last, _)) = self.spurt.last()
            && at.saturating_duration_since(last) > Duration::from_millis(200)
        {
            self.end_spurt();
        }
        self.spurt.push((at, rtp_ms));
    }

    fn end_spurt(&mut self) {
        let Some(&(t0, r0)) = self.spurt.first() else { return };
        let offsets: Vec<f64> =
            self.spurt.iter().map(|(t, r)| t.saturating_duration_since(t0).as_secs_f64() * 1000.0 - (r - r0)).collect();
        let base = offsets.iter().copied().fold(f64::INFINITY, f64::min);
        self.delays_us.extend(offsets.iter().map(|o| ((o - base) * 1000.0) as u64));
        self.spurt.clear();
    }

    fn report(mut self, shared: &Shared, up: u64, down: u64, talked: Duration) {
        self.end_spurt();
        let mut eos = shared.eos_to_voice_us.lock();
        for v in &self.eos_us {
            let _ = eos.record((*v).max(1));
        }
        drop(eos);
        let mut delay = shared.frame_delay_us.lock();
        for v in &self.delays_us {
            let _ = delay.record((*v).max(1));
        }
        drop(delay);
        let mut t = shared.totals.lock();
        t.bytes_up += up;
        t.bytes_down += down;
        t.talked_s += talked.as_secs_f64();
        t.turns += self.turns;
        t.answered += self.answered;
    }
}

fn auth(shared: &Shared) -> Option<String> {
    shared.args.api_key.as_ref().map(|k| format!("Bearer {k}"))
}

/// Posts the offer; the answer and the call's location.
fn post_offer(url: &str, key: Option<String>, sdp: String) -> Result<(String, String), String> {
    let agent = ureq::Agent::new_with_defaults();
    let mut req = agent.post(format!("{url}/v1/realtime/calls")).header("Content-Type", "application/sdp");
    if let Some(k) = &key {
        req = req.header("Authorization", k);
    }
    let mut resp = req.send(sdp).map_err(|e| format!("the offer: {e}"))?;
    let location = resp.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    Ok((resp.body_mut().read_to_string().map_err(|e| format!("the answer: {e}"))?, location))
}

/// Hangs a call up.
fn hang_up(url: &str, key: Option<String>, location: &str) {
    let agent = ureq::Agent::new_with_defaults();
    let mut req = agent.post(format!("{url}{location}/hangup"));
    if let Some(k) = &key {
        req = req.header("Authorization", k);
    }
    let _ = req.send_empty();
}

async fn call(shared: &Shared) -> Result<(), String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let socket = tokio::net::UdpSocket::from_std(socket).map_err(|e| e.to_string())?;
    let crypto = Arc::new(str0m::crypto::from_feature_flags());
    let mut rtc: Rtc =
        RtcConfig::new().set_crypto_provider(crypto).clear_codecs().enable_opus(true, false).build(Instant::now());
    rtc.add_local_candidate(Candidate::host(local, "udp").map_err(|e| e.to_string())?);
    let mut change = rtc.sdp_api();
    let mid = change.add_media(MediaKind::Audio, Direction::SendRecv, None, None, None);
    let channel = change.add_channel("oai-events".into());
    let (offer, pending) = change.apply().ok_or("no offer")?;
    let (url, key, sdp) = (shared.args.url.clone(), auth(shared), offer.to_sdp_string());
    let (answer, location) =
        tokio::task::spawn_blocking(move || post_offer(&url, key, sdp)).await.map_err(|e| e.to_string())??;
    let answer = SdpAnswer::from_sdp_string(&answer).map_err(|e| format!("the answer: {e}"))?;
    rtc.sdp_api().accept_answer(pending, answer).map_err(|e| e.to_string())?;

    let (mut up, mut down) = (0u64, 0u64);
    let mut heard = Heard::default();
    let mut created: Option<Instant> = None;
    let mut next_frame = Instant::now();
    let mut frame_no = 0usize;
    let mut buf = vec![0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs_f64(shared.args.duration + 60.0);
    loop {
        // Drain the engine: datagrams out, events in, until its next deadline.
        let timeout = loop {
            match rtc.poll_output().map_err(|e| e.to_string())? {
                Output::Timeout(t) => break t,
                Output::Transmit(t) => {
                    up += t.contents.len() as u64;
                    let _ = socket.try_send_to(&t.contents, t.destination);
                }
                Output::Event(Event::ChannelData(d)) => {
                    let Ok(event) = serde_json::from_slice::<Value>(&d.data) else { continue };
                    match event["type"].as_str() {
                        Some("session.created") => {
                            created = Some(Instant::now());
                            next_frame = Instant::now();
                        }
                        Some("error") => return Err(format!("error event: {event}")),
                        _ => {}
                    }
                }
                Output::Event(Event::MediaData(m)) => {
                    let now = Instant::now();
                    // Opus silence is a few bytes; the reference backend's voice is not.
                    if m.data.len() > 20 {
                        heard.voice(now);
                    }
                    heard.frame(now, m.time.rebase(Frequency::MILLIS).numer() as f64);
                }
                Output::Event(_) => {}
            }
        };
        if let Some(since) = created
            && since.elapsed().as_secs_f64() >= shared.args.duration
        {
            let talked = since.elapsed();
            if let Some(mut ch) = rtc.channel(channel) {
                let _ = ch.write(false, br#"{"type":"response.cancel"}"#);
            }
            rtc.disconnect();
            heard.report(shared, up, down, talked);
            let (url, key) = (shared.args.url.clone(), auth(shared));
            let _ = tokio::task::spawn_blocking(move || hang_up(&url, key, &location)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the call did not start".into());
        }
        let wake = if created.is_some() { timeout.min(next_frame) } else { timeout };
        tokio::select! {
            got = socket.recv_from(&mut buf) => {
                let (n, from): (usize, SocketAddr) = got.map_err(|e| e.to_string())?;
                down += n as u64;
                if let Ok(r) = Receive::new(Protocol::Udp, from, local, &buf[..n]) {
                    let _ = rtc.handle_input(Input::Receive(Instant::now(), r));
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                if created.is_some() && now >= next_frame {
                    let i = frame_no % shared.opus.len();
                    if i == shared.tone_frames {
                        heard.burst_ended = Some(now);
                        heard.turns += 1;
                    }
                    let pt = rtc.writer(mid).and_then(|w| w.payload_params().next().map(|p| p.pt()));
                    if let (Some(pt), Some(writer)) = (pt, rtc.writer(mid)) {
                        let time = MediaTime::new(frame_no as u64 * 960, Frequency::FORTY_EIGHT_KHZ);
                        let _ = writer.write(pt, now, time, shared.opus[i].clone());
                    }
                    frame_no += 1;
                    next_frame += Duration::from_millis(FRAME_MS);
                    continue;
                }
                let _ = rtc.handle_input(Input::Timeout(now));
            }
        }
    }
}

async fn socket(shared: &Shared) -> Result<(), String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let base = shared.args.url.replacen("http", "ws", 1);
    let mut req = format!("{base}/v1/realtime?model=omni").into_client_request().map_err(|e| e.to_string())?;
    if let Some(k) = auth(shared) {
        req.headers_mut().insert("Authorization", k.parse().map_err(|_| "a bad key")?);
    }
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await.map_err(|e| e.to_string())?;
    let (mut tx, mut rx) = ws.split();
    let (mut up, mut down) = (0u64, 0u64);
    let mut heard = Heard::default();
    let mut created: Option<Instant> = None;
    let mut next_frame = Instant::now();
    let mut frame_no = 0usize;
    // The same 40 ms pieces the gateway hands the session from a call.
    let mut pending: Vec<i16> = Vec::with_capacity(FRAME * 2);
    let b64 = base64::engine::general_purpose::STANDARD;
    loop {
        if let Some(since) = created
            && since.elapsed().as_secs_f64() >= shared.args.duration
        {
            let talked = since.elapsed();
            let _ = tx.close().await;
            heard.report(shared, up, down, talked);
            return Ok(());
        }
        let wake = if created.is_some() { next_frame } else { Instant::now() + Duration::from_secs(60) };
        tokio::select! {
            msg = rx.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    other => return Err(format!("the socket ended: {other:?}")),
                };
                down += text.len() as u64;
                if text.contains(r#""type":"response.output_audio.delta""#) {
                    heard.voice(Instant::now());
                } else if text.contains(r#""type":"session.created""#) {
                    created = Some(Instant::now());
                    next_frame = Instant::now();
                } else if text.contains(r#""type":"error""#) {
                    return Err(format!("error event: {text}"));
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                let i = frame_no % shared.pcm.len();
                if i == shared.tone_frames {
                    heard.burst_ended = Some(now);
                    heard.turns += 1;
                }
                pending.extend_from_slice(&shared.pcm[i]);
                if pending.len() >= FRAME * 2 {
                    let bytes: Vec<u8> = pending.iter().flat_map(|s| s.to_le_bytes()).collect();
                    let text = format!(r#"{{"type":"input_audio_buffer.append","audio":"{}"}}"#, b64.encode(bytes));
                    up += text.len() as u64;
                    tx.send(Message::text(text)).await.map_err(|e| e.to_string())?;
                    pending.clear();
                }
                frame_no += 1;
                next_frame += Duration::from_millis(FRAME_MS);
            }
        }
    }
}
