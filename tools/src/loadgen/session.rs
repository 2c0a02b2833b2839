//! One simulated client: it connects, waits in the queue (measuring its updates), starts its
//! session, streams one-second chunks while a reader matches the answers to them, and closes
//! (or vanishes without a word, when asked).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use super::{Counters, Shared, Target, error, record};
use crate::client::{self, WireDialect, Ws, next};

type Stream = futures_util::stream::SplitStream<Ws>;

/// One session: connect, wait for a worker, initialise, stream for `duration`, close.
pub(super) async fn session(shared: Arc<Shared>) {
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

    // A worker spoken to directly has no queue: it is prepared at once.
    if !worker && !wait_for_worker(&shared, &mut stream, began).await {
        return;
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
    let reader = tokio::spawn(read_answers(
        shared.clone(),
        stream,
        Answers { sent_at: sent_at.clone(), fifo: fifo.clone(), created: created.clone() },
        (worker, in_order),
    ));
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

/// Reads the queue's events until a worker is assigned (measuring the wait, and how soon a
/// lower position follows a release); false when the session ended meanwhile (counted).
async fn wait_for_worker(shared: &Shared, stream: &mut Stream, began: Instant) -> bool {
    let (c, a) = (&shared.counters, &shared.args);
    let mut waited = false;
    let mut position = u64::MAX;
    // The release whose position change this session has measured already.
    let mut measured_release: Option<Instant> = None;
    let max_wait = Instant::now() + Duration::from_secs_f64(a.max_wait);
    let deadline = shared.run_end.map_or(max_wait, |end| end.min(max_wait));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let text = match next(stream, left).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                error(shared, "closed_while_waiting");
                leave(c);
                return false;
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
                return false;
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
                position =
                    serde_json::from_str::<Value>(&text).ok().and_then(|v| v["position"].as_u64()).unwrap_or(u64::MAX);
            }
            Some("session.queue_update") => {
                let p =
                    serde_json::from_str::<Value>(&text).ok().and_then(|v| v["position"].as_u64()).unwrap_or(u64::MAX);
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
                return true;
            }
            Some("error") => {
                let v: Value = serde_json::from_str(&text).unwrap_or_default();
                error(shared, v["error"]["code"].as_str().unwrap_or("error"));
                if waited {
                    c.waiting.fetch_sub(1, Ordering::Relaxed);
                }
                leave(c);
                return false;
            }
            _ => {}
        }
    }
}

/// What the reader matches answers against: when each chunk was sent (by its input number,
/// or in order), and the session's start.
struct Answers {
    sent_at: Arc<Mutex<HashMap<u64, Instant>>>,
    fifo: Arc<Mutex<VecDeque<Instant>>>,
    created: Arc<tokio::sync::Notify>,
}

/// Reads the session's events until it closes: each answer's round trip from its chunk, and
/// the errors by code. `worker`: spoken to directly; `in_order`: answers carry no ids.
async fn read_answers(
    shared: Arc<Shared>,
    mut stream: Stream,
    answers: Answers,
    (worker, in_order): (bool, bool),
) -> u64 {
    let shared = &*shared;
    let Answers { sent_at, fifo, created } = answers;
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
}

/// A session that ended: no longer connected, finished.
fn leave(c: &Counters) {
    c.connected.fetch_sub(1, Ordering::Relaxed);
    c.finished.fetch_add(1, Ordering::Relaxed);
}
