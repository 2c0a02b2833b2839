//! The run's report: its figures as JSON, and as a table with units.

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{Value, json};

use super::{Shared, cpu_seconds, summary, total_cpu};

/// The run's figures, as written with `--json-out`.
pub(super) fn result(
    shared: &Shared,
    started: Instant,
    (rss_start, rss_peak, rss_curve): (Option<u64>, u64, Vec<(f64, u64)>),
    (server_cpu_start, own_cpu_start): (Option<f64>, Option<f64>),
) -> Value {
    let (args, c) = (&shared.args, &shared.counters);
    let sent = c.sent.load(Ordering::Relaxed);
    let answered = c.answered.load(Ordering::Relaxed);
    let abandoned = c.abandoned.load(Ordering::Relaxed);
    json!({
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
    })
}

/// The report, as a table with units.
pub(super) fn print(r: &Value) {
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
