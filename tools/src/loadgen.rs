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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::client::{self, WireDialect, next};

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

pub fn run(args: LoadgenArgs) -> Result<(), String> {
    let runtime = client::runtime()?;
    runtime.block_on(loadgen(args))
}

async fn loadgen(args: LoadgenArgs) -> Result<(), String> {
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
    let events = Events {
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
    };
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
    let sessions_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = {
        let sessions_done = sessions_done.clone();
        let shared = shared.clone();
        let quiet = args.quiet;
        let pids = args.server_pid.clone();
        tokio::spawn(async move {
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
        })
    };
    for t in tasks {
        let _ = t.await;
    }
    sessions_done.store(true, Ordering::Relaxed);
    let (rss_curve, rss_peak) = progress.await.unwrap_or_default();
    if !args.quiet {
        eprintln!();
    }
    let c = &shared.counters;
    let sent = c.sent.load(Ordering::Relaxed);
    let answered = c.answered.load(Ordering::Relaxed);
    let abandoned = c.abandoned.load(Ordering::Relaxed);
    let result = json!({
        "config": {"url": args.url, "sessions": args.sessions, "ramp_s": args.ramp, "duration_s": args.duration, "mode": args.mode,
                   "dialect": format!("{:?}", args.dialect).to_lowercase(), "frames": args.frames, "cycle": args.cycle, "rejoin": args.rejoin,
                   "force_listen_every": args.force_listen_every, "vanish_every": args.vanish_every},
        "elapsed_s": started.elapsed().as_secs_f64(),
        "sessions": {"started": c.started.load(Ordering::Relaxed), "finished": c.finished.load(Ordering::Relaxed),
                     "connect_failures": c.connect_failures.load(Ordering::Relaxed), "gave_up_waiting": c.gave_up.load(Ordering::Relaxed),
                     "left_waiting_at_the_end": c.left_at_end.load(Ordering::Relaxed),
                     "told_position": c.told_position.load(Ordering::Relaxed), "vanished": c.vanished.load(Ordering::Relaxed)},
        "chunks": {"sent": sent, "answered": answered, "abandoned": abandoned, "dropped": sent.saturating_sub(answered + abandoned)},
        "errors": *shared.errors.lock(),
        "rtt_ms": summary(&shared.rtt_us.lock(), 1000.0),
        "queue_wait_ms": summary(&shared.queue_wait_us.lock(), 1000.0),
        "release_to_queue_done_ms": summary(&shared.release_to_done_us.lock(), 1000.0),
        "position_update_latency_ms": summary(&shared.update_latency_us.lock(), 1000.0),
        "server_rss_kib": {"start": rss_start, "peak": rss_peak, "curve": rss_curve},
        "cpu_percent": {
            "server": total_cpu(&args.server_pid).zip(server_cpu_start).map(|(end, start)| 100.0 * (end - start) / started.elapsed().as_secs_f64()),
            "loadgen": cpu_seconds("self").zip(own_cpu_start).map(|(end, start)| 100.0 * (end - start) / started.elapsed().as_secs_f64()),
        },
    });
    print_result(&result);
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

/// The report, as a table with units.
fn print_result(r: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let s = &r["sessions"];
    println!();
    println!(
        "sessions     {} started, {} finished, {} gave up waiting, {} could not connect, {} vanished on purpose",
        n(&s["started"]),
        n(&s["finished"]),
        n(&s["gave_up_waiting"]),
        n(&s["connect_failures"]),
        n(&s["vanished"])
    );
    let c = &r["chunks"];
    println!(
        "chunks       {} sent, {} answered, {} dropped by the server, {} abandoned by vanished sessions",
        n(&c["sent"]),
        n(&c["answered"]),
        n(&c["dropped"]),
        n(&c["abandoned"])
    );
    let errors: Vec<String> =
        r["errors"].as_object().into_iter().flatten().map(|(code, count)| format!("{code} x{count}")).collect();
    println!("errors       {}", if errors.is_empty() { "none".to_string() } else { errors.join(", ") });
    println!();
    println!("{:<28}{:>10}{:>10}{:>10}{:>10}{:>8}", "latency", "p50", "p90", "p99", "max", "n");
    let row = |name: &str, v: &Value| {
        if n(&v["count"]) == 0 {
            println!("{name:<28}{:>10}", "-");
            return;
        }
        let ms = |k: &str| {
            let x = v[k].as_f64().unwrap_or(0.0);
            if x >= 1000.0 { format!("{:.2} s", x / 1000.0) } else { format!("{x:.2} ms") }
        };
        println!("{name:<28}{:>10}{:>10}{:>10}{:>10}{:>8}", ms("p50"), ms("p90"), ms("p99"), ms("max"), n(&v["count"]));
    };
    row("chunk round trip", &r["rtt_ms"]);
    row("queue wait", &r["queue_wait_ms"]);
    row("release to queue_done", &r["release_to_queue_done_ms"]);
    row("position update", &r["position_update_latency_ms"]);
    println!();
    let mib = |v: &Value| v.as_f64().map_or("-".to_string(), |k| format!("{:.1} MiB", k / 1024.0));
    if !r["server_rss_kib"]["start"].is_null() {
        println!(
            "server memory  {} at the start, {} at the peak",
            mib(&r["server_rss_kib"]["start"]),
            mib(&r["server_rss_kib"]["peak"])
        );
    }
    let pct = |v: &Value| v.as_f64().map_or("-".to_string(), |p| format!("{p:.1} %"));
    println!(
        "cpu            server {} of one core, loadgen {} of one core",
        pct(&r["cpu_percent"]["server"]),
        pct(&r["cpu_percent"]["loadgen"])
    );
}

fn error(shared: &Shared, code: &str) {
    *shared.errors.lock().entry(code.to_string()).or_insert(0) += 1;
}

/// One session: connect, wait for a worker, initialise, stream for `duration`, close.
async fn session(shared: Arc<Shared>) {
    let c = &shared.counters;
    let a = &shared.args;
    let nth = c.started.fetch_add(1, Ordering::Relaxed) + 1;
    let vanish = a.vanish_every > 0 && nth.is_multiple_of(a.vanish_every);
    let began = Instant::now();
    let urls: Vec<&str> = a.url.split(',').collect();
    let url = urls[(nth - 1) % urls.len()];
    // Spoken to directly: no queue, prepared at once, answers in order.
    let worker = a.target != Target::Gateway;
    let connect = async {
        match a.target {
            Target::Worker => client::connect_worker(url).await,
            Target::VllmOmni => client::connect_vllm(url).await,
            Target::Gateway => client::connect(url, &a.mode, a.api_key.as_deref()).await,
        }
    };
    let ws = match tokio::time::timeout(Duration::from_secs(30), connect).await {
        Ok(Ok(ws)) => ws,
        _ => {
            c.connect_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    c.connected.fetch_add(1, Ordering::Relaxed);
    let (mut sink, mut stream) = ws.split();
    let leave = |c: &Counters| {
        c.connected.fetch_sub(1, Ordering::Relaxed);
        c.finished.fetch_add(1, Ordering::Relaxed);
    };

    // Wait for a worker.
    let mut waited = false;
    let mut position = u64::MAX;
    // The release whose position change this session has measured already.
    let mut measured_release: Option<Instant> = None;
    let max_wait = Instant::now() + Duration::from_secs_f64(a.max_wait);
    let deadline = shared.run_end.map_or(max_wait, |end| end.min(max_wait));
    // A worker spoken to directly has no queue: it is prepared at once.
    if !worker {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let text = match next(&mut stream, left).await {
                Ok(Some(t)) => t,
                Ok(None) => {
                    error(&shared, "closed_while_waiting");
                    leave(c);
                    return;
                }
                Err(_) => {
                    if waited {
                        c.waiting.fetch_sub(1, Ordering::Relaxed);
                    }
                    // The run's end (--run-time) is not giving up: it is the end.
                    if shared.run_end.is_some_and(|end| Instant::now() >= end) {
                        c.left_at_end.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.gave_up.fetch_add(1, Ordering::Relaxed);
                    }
                    c.connected.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            };
            match client::event_type(&text).as_deref() {
                Some("session.queued") => {
                    waited = true;
                    if !c.warned_waiting.swap(true, Ordering::Relaxed) && !a.rejoin {
                        eprintln!(
                            "\nwarning: sessions wait in the server's queue: it has fewer free workers than --sessions ({}); \
                         each waits up to --max-wait {} s, and round trips measure only sessions that got a worker",
                            a.sessions, a.max_wait
                        );
                    }
                    c.waiting.fetch_add(1, Ordering::Relaxed);
                    c.told_position.fetch_add(1, Ordering::Relaxed);
                    position = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["position"].as_u64())
                        .unwrap_or(u64::MAX);
                }
                Some("session.queue_update") => {
                    let p = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["position"].as_u64())
                        .unwrap_or(u64::MAX);
                    // The first lower position after a worker's release: how long that change
                    // took to reach this client (one sample per client per release).
                    let release = *shared.last_release.lock();
                    if p < position
                        && let Some(at) = release
                        && measured_release != release
                    {
                        measured_release = release;
                        record(&shared.update_latency_us, at.elapsed().as_micros() as u64);
                    }
                    position = p;
                }
                Some("session.queue_done") => {
                    record(&shared.queue_wait_us, began.elapsed().as_micros() as u64);
                    if waited {
                        c.waiting.fetch_sub(1, Ordering::Relaxed);
                        if let Some(at) = shared.releases.lock().pop_front() {
                            record(&shared.release_to_done_us, at.elapsed().as_micros() as u64);
                        }
                    }
                    break;
                }
                Some("error") => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    error(&shared, v["error"]["code"].as_str().unwrap_or("error"));
                    if waited {
                        c.waiting.fetch_sub(1, Ordering::Relaxed);
                    }
                    leave(c);
                    return;
                }
                _ => {}
            }
        }
    }
    if sink.send(Message::Text(shared.events.init.clone())).await.is_err() {
        error(&shared, "send_failed");
        leave(c);
        return;
    }

    // Stream: a reader task matches answers to chunks.
    c.streaming.fetch_add(1, Ordering::Relaxed);
    let sent_at: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let fifo: Arc<Mutex<VecDeque<Instant>>> = Arc::new(Mutex::new(VecDeque::new()));
    let created = Arc::new(tokio::sync::Notify::new());
    // Answers in order, with no ids: the earlier dialect, and a worker's own `result`s.
    let in_order = worker || a.dialect == WireDialect::Legacy;
    let reader = {
        let sent_at = sent_at.clone();
        let fifo = fifo.clone();
        let created = created.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            let shared = &*shared;
            let mut answered = 0u64;
            while let Ok(Some(text)) = next(&mut stream, Duration::from_secs(120)).await {
                match client::event_type(&text).as_deref() {
                    Some("session.created") | Some("prepared") => created.notify_one(),
                    Some("response.output.delta") => {
                        if let Some(id) = client::early_field(&text, "input_id")
                            .and_then(|i| i.strip_prefix("input_"))
                            .and_then(|n| n.parse::<u64>().ok())
                            && let Some(at) = sent_at.lock().remove(&id)
                        {
                            record(&shared.rtt_us, at.elapsed().as_micros() as u64);
                            answered += 1;
                            shared.counters.answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some("response.listen") | Some("response.output_audio.delta") | Some("result") if in_order => {
                        if let Some(at) = fifo.lock().pop_front() {
                            record(&shared.rtt_us, at.elapsed().as_micros() as u64);
                            answered += 1;
                            shared.counters.answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // A worker's own error (its text in `error`) answers the chunk it was sent for.
                    Some("error") if worker => {
                        fifo.lock().pop_front();
                        error(shared, "worker_error");
                    }
                    Some("error") => {
                        let v: Value = serde_json::from_str(&text).unwrap_or_default();
                        error(shared, v["error"]["code"].as_str().unwrap_or("error"));
                    }
                    Some("session.closed") | Some("stopped") => break,
                    _ => {}
                }
            }
            answered
        })
    };
    if tokio::time::timeout(Duration::from_secs(30), created.notified()).await.is_err() {
        error(&shared, "no_session_created");
    }
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let chunks = a.duration.round().max(1.0) as u64;
    for k in 1..=chunks {
        ticker.tick().await;
        if vanish && k > chunks / 2 {
            // Gone without a word: the reader and the socket are dropped mid-stream.
            reader.abort();
            drop(sink);
            c.abandoned.fetch_add(sent_at.lock().len() as u64 + fifo.lock().len() as u64, Ordering::Relaxed);
            c.vanished.fetch_add(1, Ordering::Relaxed);
            c.streaming.fetch_sub(1, Ordering::Relaxed);
            leave(c);
            return;
        }
        if shared.run_end.is_some_and(|end| Instant::now() >= end) {
            break;
        }
        let loud = (k - 1) % a.cycle.max(1) as u64 == 0;
        let force = a.force_listen_every > 0 && k % a.force_listen_every as u64 == 0;
        let event = match (loud, force) {
            (true, false) => shared.events.loud.clone(),
            (false, false) => shared.events.quiet.clone(),
            (true, true) => shared.events.loud_forced.clone(),
            (false, true) => shared.events.quiet_forced.clone(),
        };
        let now = Instant::now();
        if in_order {
            fifo.lock().push_back(now);
        } else {
            sent_at.lock().insert(k, now);
        }
        if sink.send(Message::Text(event)).await.is_err() {
            error(&shared, "send_failed");
            break;
        }
        c.sent.fetch_add(1, Ordering::Relaxed);
    }
    // Let the last answers arrive, then close: the worker is released.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    shared.releases.lock().push_back(released);
    *shared.last_release.lock() = Some(released);
    let _ = sink.send(Message::Text(shared.events.close.clone())).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), reader).await;
    let _ = sink.close().await;
    c.streaming.fetch_sub(1, Ordering::Relaxed);
    leave(c);
}
