//! `omni-gateway probe`: one session against a server speaking the current or the earlier
//! MiniCPM-o dialect. Streams a WAV file in one-second chunks (or `--chunk-ms`; real time, or
//! `--speed N`),
//! optional JPEG frames, a force-listen at a chosen second; or, in chat mode, one message.
//! Prints events as they arrive, saves the model's audio, and ends with a summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

mod session;

use super::client::{self, WireDialect};
use omni_actors::audio;
use session::Run;

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

pub fn run(args: ProbeArgs) -> Result<(), crate::ToolError> {
    probe_session(args).map_err(crate::ToolError::Probe)
}

fn probe_session(args: ProbeArgs) -> Result<(), String> {
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
    let mut samples = input_audio(&args, chat)?;
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
    let mut run = Run::new(&args, Instant::now());
    let ws = client::connect(&args.url, &args.mode, args.api_key.as_deref()).await?;
    println!("{} connected to {} (mode {}, {:?} dialect)", run.stamp(), args.url, args.mode, args.dialect);
    let (mut sink, mut stream) = ws.split();
    // The session, until it ends or the user presses Ctrl-C: then its close goes to the server
    // (a probe cut off without one would leave its worker held for a resume).
    let mut session = Box::pin(async {
        run.wait_for_worker(&mut stream).await?;
        let init = client::init_event_with_transcripts(args.dialect, &args.instructions);
        futures_util::SinkExt::send(&mut sink, Message::text(init)).await.map_err(|e| e.to_string())?;
        run.converse(&mut sink, &mut stream, &samples, &frames).await?;
        run.report()
    });
    tokio::select! {
        done = &mut session => return done,
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(session);
    let _ = futures_util::SinkExt::send(&mut sink, Message::Close(None)).await;
    Err("interrupted: the session was closed".into())
}

/// The audio to stream: the WAV, the spoken text, or a synthetic voice (none in chat mode).
fn input_audio(args: &ProbeArgs, chat: bool) -> Result<Vec<f32>, String> {
    Ok(match &args.wav {
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
    })
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
