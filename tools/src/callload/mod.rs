//! `omni-gateway callload`: N concurrent voice sessions of the OpenAI dialect, speaking the same
//! pattern (a tone burst, then silence, in real time) over one of four transports: WebRTC calls
//! ([`webrtc`]: str0m as the client, Opus), WebSockets ([`websocket`]: 24 kHz PCM in base64),
//! Twilio Media Streams ([`twilio`]: μ-law frames on `/v1/telephony/twilio`, as Twilio sends
//! them) and SIP calls ([`sip`]: ezk's SIP stack as the caller, G.711 over RTP). Server VAD ends
//! each turn; the reference backend answers it with its voice.
//!
//! Measures, per transport, what a client sees: bytes a second upstream and downstream (UDP
//! payloads for a call, WebSocket messages' payloads for a socket), the time from the end of a
//! burst to the first of the model's voice, and, for calls (WebRTC and SIP), each voice frame's
//! delay: its arrival against its RTP timestamp, relative to the earliest frame of its talk
//! spurt (the jitter a client's buffer has to absorb). Writes everything as JSON.

mod sip;
mod twilio;
mod webrtc;
mod websocket;

use omni_actors::audio::{g711::Law, pcm};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::client;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Webrtc,
    Websocket,
    Twilio,
    Sip,
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
    /// SIP: where the gateway hears SIP (its `[sip] bind`).
    #[arg(long, default_value = "127.0.0.1:5060")]
    pub sip: std::net::SocketAddr,
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
    /// The same at 8 kHz in μ-law (a phone's), 160 bytes a frame.
    ulaw: Vec<Vec<u8>>,
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

pub fn run(args: CallloadArgs) -> Result<(), crate::ToolError> {
    place_calls(args).map_err(crate::ToolError::Calls)
}

fn place_calls(args: CallloadArgs) -> Result<(), String> {
    let (pcm, tone_frames) = cycle(args.tone, args.silence);
    let mut encoder =
        opus::Encoder::new(RATE, opus::Channels::Mono, opus::Application::Voip).map_err(|e| e.to_string())?;
    let opus = pcm.iter().map(|f| encoder.encode_vec(f, 1275).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let shared = Arc::new(Shared {
        args: args.clone(),
        totals: Mutex::default(),
        eos_to_voice_us: Mutex::new(histogram()),
        frame_delay_us: Mutex::new(histogram()),
        ulaw: pcm
            .iter()
            .map(|f| f.iter().step_by(3).map(|&s| Law::Mu.compand_one(pcm::from_i16(s))).collect())
            .collect(),
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
                    Transport::Webrtc => webrtc::call(&shared).await,
                    Transport::Websocket => websocket::socket(&shared).await,
                    Transport::Twilio => twilio::stream(&shared).await,
                    Transport::Sip => sip::call(&shared).await,
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
    /// The user's frame number `frame_no` leaves at `now`: its index in the cycle (the tone
    /// ends at [`Shared::tone_frames`], when the answer's wait starts).
    fn frame_out(&mut self, shared: &Shared, frame_no: usize, cycle: usize, now: Instant) -> usize {
        let i = frame_no % cycle;
        if i == shared.tone_frames {
            self.burst_ended = Some(now);
            self.turns += 1;
        }
        i
    }

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
