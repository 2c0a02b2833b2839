//! `omni-gateway check-recordings DIR`: verifies every recorded session under DIR (the
//! `[recording] dir`): finalized (`meta.json` written, no temporary left), both WAVs
//! readable to the end with as many samples as `meta.json` says, every `events.jsonl` line
//! JSON and as many as recorded, every frame listed. Used after soak runs; exits 1 on the
//! first kind of damage, naming the session.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

#[derive(Args, Debug, Clone)]
pub struct CheckRecordingsArgs {
    /// The recordings directory (`[recording] dir`).
    pub dir: PathBuf,
    /// Every input chunk had this many samples (loadgen: 16000): input.wav must then hold
    /// exactly chunks_received of them.
    #[arg(long)]
    pub chunk_samples: Option<u64>,
}

pub fn run(args: CheckRecordingsArgs) -> Result<(), crate::ToolError> {
    check_all(args).map_err(crate::ToolError::Recordings)
}

fn check_all(args: CheckRecordingsArgs) -> Result<(), String> {
    let mut sessions = Vec::new();
    let days = std::fs::read_dir(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    for day in days.flatten().filter(|d| d.path().is_dir()) {
        for session in std::fs::read_dir(day.path()).map_err(|e| e.to_string())?.flatten() {
            if session.path().is_dir() {
                sessions.push(session.path());
            }
        }
    }
    sessions.sort();
    let mut bad = Vec::new();
    let (mut input, mut output) = (0u64, 0u64);
    for dir in &sessions {
        match check(dir, args.chunk_samples) {
            Ok((i, o)) => {
                input += i;
                output += o;
            }
            Err(e) => bad.push(format!("{}: {e}", dir.display())),
        }
    }
    println!(
        "{} sessions checked, {} damaged; {:.1} h of input audio, {:.1} h of output audio",
        sessions.len(),
        bad.len(),
        input as f64 / 16000.0 / 3600.0,
        output as f64 / 24000.0 / 3600.0
    );
    if bad.is_empty() {
        return Ok(());
    }
    for b in bad.iter().take(20) {
        println!("  {b}");
    }
    Err(format!("{} damaged recordings", bad.len()))
}

/// Checks one session's directory; returns its input and output sample counts.
pub(crate) fn check(dir: &Path, chunk_samples: Option<u64>) -> Result<(u64, u64), String> {
    if dir.join("meta.json.tmp").exists() {
        return Err("meta.json.tmp left behind".into());
    }
    let meta: Value = std::fs::read(dir.join("meta.json"))
        .map_err(|e| format!("not finalized (meta.json: {e})"))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("meta.json: {e}")))?;
    if meta["close_reason"].as_str().unwrap_or_default().is_empty() {
        return Err("meta.json has no close_reason".into());
    }
    let rec = &meta["recording"];
    if let Some(e) = rec["error"].as_str() {
        return Err(format!("the recorder failed: {e}"));
    }
    let input = wav_samples(&dir.join("input.wav"), 16000)?;
    let output = wav_samples(&dir.join("output.wav"), 24000)?;
    let expect = |what: &str, found: u64, key: &str| match rec[key].as_u64() {
        Some(n) if n == found => Ok(()),
        n => Err(format!("{what} holds {found}, meta.json says {n:?}")),
    };
    expect("input.wav", input, "input_samples")?;
    expect("output.wav", output, "output_samples")?;
    if let (Some(per), Some(chunks)) = (chunk_samples, meta["chunks_received"].as_u64())
        && input != per * chunks
    {
        return Err(format!("input.wav holds {input} samples for {chunks} chunks of {per}"));
    }
    let events = std::fs::read_to_string(dir.join("events.jsonl")).map_err(|e| format!("events.jsonl: {e}"))?;
    for (n, line) in events.lines().enumerate() {
        serde_json::from_str::<Value>(line).map_err(|e| format!("events.jsonl line {}: {e}", n + 1))?;
    }
    expect("events.jsonl", events.lines().count() as u64, "events")?;
    let frames = std::fs::read_dir(dir.join("frames")).map(|d| d.count() as u64).unwrap_or(0);
    expect("frames/", frames, "frames")?;
    Ok((input, output))
}

fn wav_samples(path: &Path, rate: u32) -> Result<u64, String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("wav");
    let mut reader = hound::WavReader::open(path).map_err(|e| format!("{name}: {e}"))?;
    let spec = reader.spec();
    if spec.sample_rate != rate || spec.channels != 1 {
        return Err(format!("{name}: {} Hz, {} channels", spec.sample_rate, spec.channels));
    }
    let declared = u64::from(reader.len());
    let mut read = 0u64;
    for sample in reader.samples::<i32>() {
        sample.map_err(|e| format!("{name}: sample {read}: {e}"))?;
        read += 1;
    }
    if read != declared {
        return Err(format!("{name}: header says {declared} samples, {read} present"));
    }
    Ok(read)
}
