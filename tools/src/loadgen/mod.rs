//! `omni-gateway loadgen`: N concurrent duplex sessions, each sending real-time one-second
//! chunks of prepared audio (a tone burst, then silence, so the reference backend speaks).
//!
//! Measures the per-chunk round trip (append sent to the first delta that answers it, by
//! `input_id`; FIFO for the earlier dialect, which has no ids), the queue wait, the time
//! from a worker's release (a session's close sent) to the next waiting client's
//! `session.queue_done`, how fast position updates reach waiting clients after a change,
//! connect failures, errors by code and dropped chunks. Prints a live progress line and
//! p50/p90/p99/max, and writes everything as JSON. `--target worker` sends the same load
//! straight to MiniCPM-o model workers, in their own protocol (answers in order, no queue);
//! `--target vllm-omni` to vLLM-Omni servers' duplex endpoints.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Utf8Bytes;

mod report;
mod session;

use super::client::{self, WireDialect};
use session::session;

#[derive(Args, Debug, Clone)]
pub struct LoadgenArgs {
    /// The server, e.g. ws://127.0.0.1:8006; several, comma-separated (replicas of a
    /// cluster): sessions go to each in turn.
    #[arg(long, default_value = "ws://127.0.0.1:8006")]
    pub url: String,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Seconds over which the sessions start (evenly).
    #[arg(long, default_value_t = 1.0)]
    pub ramp: f64,
    /// Seconds each session streams once it has a worker.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// video or audio.
    #[arg(long, default_value = "audio")]
    pub mode: String,
    #[arg(long, value_enum, default_value = "current")]
    pub dialect: WireDialect,
    /// What --url names: a gateway, or MiniCPM-o model workers spoken to directly (their own
    /// `prepare` and `audio_chunk` on `/ws/duplex`, one session per worker in turn): the path the
    /// gateway's `minicpmo-worker` backend is measured against. Its `prepare` carries the system
    /// prompt only (the gateway's also carries the session's settings), which a mock ignores and
    /// a real worker may not.
    #[arg(long, value_enum, default_value = "gateway")]
    pub target: Target,
    /// Send a small JPEG frame with every chunk.
    #[arg(long)]
    pub frames: bool,
    /// Chunks per cycle: one tone burst, then silence (the reference backend answers each burst).
    #[arg(long, default_value_t = 6)]
    pub cycle: usize,
    /// Mark every Nth chunk force_listen (0 = never).
    #[arg(long, default_value_t = 0)]
    pub force_listen_every: usize,
    /// Longest a session waits for a worker before giving up, seconds.
    #[arg(long, default_value_t = 120.0)]
    pub max_wait: f64,
    /// End the whole run after this many seconds: waiting clients leave, streaming ones close
    /// (0 = when every session is done).
    #[arg(long, default_value_t = 0.0)]
    pub run_time: f64,
    /// Once a session ends, start a new one in its place (churn), until --total-time.
    #[arg(long)]
    pub rejoin: bool,
    /// With --rejoin: how long the whole run lasts, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub total_time: f64,
    /// Every Nth session vanishes halfway through its stream: the TCP connection is dropped
    /// without a close frame, as a phone losing its network would (0 = never).
    #[arg(long, default_value_t = 0)]
    pub vanish_every: usize,
    /// Sample this process's resident memory (the server's pid) every second; several,
    /// comma-separated (replicas), are added up.
    #[arg(long, value_delimiter = ',')]
    pub server_pid: Vec<u32>,
    /// Write the results here as JSON.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    #[arg(long, env = "OMNI_API_KEY")]
    pub api_key: Option<String>,
    /// No live progress line.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    Gateway,
    /// MiniCPM-o model workers, no gateway between.
    Worker,
    /// vLLM-Omni servers' duplex endpoints, no gateway between (`session.update`,
    /// `input_audio_buffer.append` of float32, `session.close`): the path the gateway's
    /// `vllm-omni` backend is measured against. `--url` names each server once per slot.
    VllmOmni,
}

/// Prepared events, shared by every session.
struct Events {
    init: Utf8Bytes,
    loud: Utf8Bytes,
    quiet: Utf8Bytes,
    loud_forced: Utf8Bytes,
    quiet_forced: Utf8Bytes,
    close: Utf8Bytes,
}

#[derive(Default)]
struct Counters {
    started: AtomicUsize,
    connected: AtomicUsize,
    waiting: AtomicUsize,
    streaming: AtomicUsize,
    finished: AtomicUsize,
    connect_failures: AtomicUsize,
    gave_up: AtomicUsize,
    /// Still waiting when `--run-time` ended the run.
    left_at_end: AtomicUsize,
    told_position: AtomicUsize,
    /// A session had to wait: the server has fewer free workers than sessions.
    warned_waiting: std::sync::atomic::AtomicBool,
    sent: AtomicU64,
    answered: AtomicU64,
    vanished: AtomicUsize,
    /// Chunks in flight when their session vanished: never answered, by design.
    abandoned: AtomicU64,
}

struct Shared {
    args: LoadgenArgs,
    events: Events,
    counters: Counters,
    rtt_us: Mutex<Histogram<u64>>,
    queue_wait_us: Mutex<Histogram<u64>>,
    release_to_done_us: Mutex<Histogram<u64>>,
    update_latency_us: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    /// Releases (close sent) not yet paired with a waiting client's queue_done.
    releases: Mutex<VecDeque<Instant>>,
    /// The latest release, for position-update latency.
    last_release: Mutex<Option<Instant>>,
    stop: Instant,
    /// `--run-time`: when every session stops.
    run_end: Option<Instant>,
}

/// The events every session sends, prepared once.
fn events(args: &LoadgenArgs) -> Events {
    let frame = vec![client::TINY_JPEG.to_string()];
    let frames: &[String] = if args.frames { &frame } else { &[] };
    let (loud, quiet) = (client::second(true), client::second(false));
    let ev = |samples: &[f32], force: bool| {
        Utf8Bytes::from(match args.target {
            Target::Worker => client::worker_chunk_event(samples, frames, force),
            Target::VllmOmni => client::vllm_append_event(samples, frames, force),
            Target::Gateway => client::chunk_event(args.dialect, samples, frames, force),
        })
    };
    Events {
        init: Utf8Bytes::from(match args.target {
            Target::Worker => client::worker_prepare_event("You are a test."),
            Target::VllmOmni => client::vllm_session_event("You are a test."),
            Target::Gateway => client::init_event(args.dialect, "You are a test."),
        }),
        loud: ev(&loud, false),
        quiet: ev(&quiet, false),
        loud_forced: ev(&loud, true),
        quiet_forced: ev(&quiet, true),
        close: Utf8Bytes::from(match args.target {
            Target::Worker => json!({"type": "stop"}).to_string(),
            Target::VllmOmni => json!({"type": "session.close"}).to_string(),
            Target::Gateway => client::close_event(),
        }),
    }
}

/// The server's memory each second (its curve and peak) until the sessions are done, and a
/// progress line unless `--quiet`.
async fn progress(shared: Arc<Shared>, started: Instant, sessions_done: Arc<AtomicBool>) -> (Vec<(f64, u64)>, u64) {
    let (quiet, pids) = (shared.args.quiet, shared.args.server_pid.clone());
    let mut curve = Vec::new();
    let mut peak = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let c = &shared.counters;
        let rss = total_rss(&pids);
        if let Some(r) = rss {
            curve.push((started.elapsed().as_secs_f64(), r));
            peak = peak.max(r);
        }
        if !quiet {
            let rtt = shared.rtt_us.lock();
            let p = |q: f64| if rtt.is_empty() { 0.0 } else { rtt.value_at_quantile(q) as f64 / 1000.0 };
            eprint!(
                "\r[{:5.0}s] connected {} waiting {} streaming {} finished {} | chunks sent {} answered {} | rtt p50 {:.2} ms p99 {:.2} ms | errors {}{}   ",
                started.elapsed().as_secs_f64(),
                c.connected.load(Ordering::Relaxed),
                c.waiting.load(Ordering::Relaxed),
                c.streaming.load(Ordering::Relaxed),
                c.finished.load(Ordering::Relaxed),
                c.sent.load(Ordering::Relaxed),
                c.answered.load(Ordering::Relaxed),
                p(0.5),
                p(0.99),
                shared.errors.lock().values().sum::<u64>(),
                rss.map_or(String::new(), |r| format!(" | server rss {} MiB", r / 1024)),
            );
        }
        if sessions_done.load(Ordering::Relaxed) || Instant::now() > shared.stop {
            break;
        }
    }
    (curve, peak)
}

/// 1 µs (or 1 ms) to an hour, 3 significant digits: nothing is clamped.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn record(h: &Mutex<Histogram<u64>>, v: u64) {
    h.lock().saturating_record(v);
}

fn summary(h: &Histogram<u64>, scale: f64) -> Value {
    if h.is_empty() {
        return json!({"count": 0});
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / scale;
    json!({"count": h.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": h.max() as f64 / scale, "mean": h.mean() / scale})
}

/// CPU time (user + system) a process has used, in seconds (Linux clock ticks of 1/100 s).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resident memory of these processes together, in KiB (none: no figure).
fn total_rss(pids: &[u32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|&p| rss_kib(p)).sum()
}

/// CPU seconds of these processes together.
fn total_cpu(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|p| cpu_seconds(&p.to_string())).sum()
}

pub fn run(args: LoadgenArgs) -> Result<(), crate::ToolError> {
    measure(args).map_err(crate::ToolError::Load)
}

fn measure(args: LoadgenArgs) -> Result<(), String> {
    let runtime = client::runtime()?;
    runtime.block_on(loadgen(args))
}

async fn loadgen(args: LoadgenArgs) -> Result<(), String> {
    let events = events(&args);
    let lifetime = match (args.rejoin, args.run_time > 0.0) {
        (_, true) => args.run_time,
        (true, false) => args.total_time,
        (false, false) => args.ramp + args.max_wait + args.duration,
    };
    let started = Instant::now();
    let shared = Arc::new(Shared {
        args: args.clone(),
        events,
        counters: Counters::default(),
        rtt_us: Mutex::new(histogram()),
        queue_wait_us: Mutex::new(histogram()),
        release_to_done_us: Mutex::new(histogram()),
        update_latency_us: Mutex::new(histogram()),
        errors: Mutex::new(BTreeMap::new()),
        releases: Mutex::new(VecDeque::new()),
        last_release: Mutex::new(None),
        stop: started + Duration::from_secs_f64(lifetime + 30.0),
        run_end: (args.run_time > 0.0).then(|| started + Duration::from_secs_f64(args.run_time)),
    });
    let rss_start = total_rss(&args.server_pid);
    let server_cpu_start = total_cpu(&args.server_pid);
    let own_cpu_start = cpu_seconds("self");
    let mut tasks = Vec::new();
    for i in 0..args.sessions {
        let shared = shared.clone();
        let delay = Duration::from_secs_f64(args.ramp * i as f64 / args.sessions.max(1) as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            loop {
                session(shared.clone()).await;
                let total = Duration::from_secs_f64(shared.args.total_time);
                if !shared.args.rejoin || started.elapsed() >= total {
                    break;
                }
            }
        }));
    }
    let sessions_done = Arc::new(AtomicBool::new(false));
    let progress = tokio::spawn(progress(shared.clone(), started, sessions_done.clone()));
    for t in tasks {
        let _ = t.await;
    }
    sessions_done.store(true, Ordering::Relaxed);
    let (rss_curve, rss_peak) = progress.await.unwrap_or_default();
    if !args.quiet {
        eprintln!();
    }
    let c = &shared.counters;
    let result = report::result(&shared, started, (rss_start, rss_peak, rss_curve), (server_cpu_start, own_cpu_start));
    report::print(&result);
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_vec_pretty(&result).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let (failed, gave_up) = (c.connect_failures.load(Ordering::Relaxed), c.gave_up.load(Ordering::Relaxed));
    if failed + gave_up > 0 {
        return Err(format!(
            "{failed} session(s) could not connect and {gave_up} gave up waiting for a worker (--max-wait {} s): \
             the server has fewer workers than --sessions ({}), or refused connections (see its log and /status)",
            args.max_wait, args.sessions
        ));
    }
    Ok(())
}

fn error(shared: &Shared, code: &str) {
    *shared.errors.lock().entry(code.to_string()).or_insert(0) += 1;
}
