//! Webhooks (`[[webhooks]]`): a signed JSON POST per chosen event.
//!
//! Events: `session.queued`, `session.assigned`, `session.started`, `session.error`,
//! `session.closed`, `worker.changed` (any state change), `worker.failed`, `worker.recovered`
//! (failed, then idle again), and `realtime.call.incoming` (a SIP call offered to the app:
//! [`Announcer`]). A delivery of the gateway's own format is signed with HMAC-SHA256 of
//! `TIMESTAMP.BODY` under the webhook's secret, in `X-Omni-Signature: sha256=HEX`, with the
//! timestamp (Unix seconds) in `X-Omni-Timestamp`; `X-Omni-Event` names the event and
//! `X-Omni-Delivery` is unique per delivery (a UUID, the same on its retries, never reused
//! across restarts). A webhook of `format = "openai"` is written and signed as OpenAI's are
//! (Standard Webhooks), so that an app's `client.webhooks.unwrap` takes it.
//!
//! Redirects are not followed (a 3xx is a failed attempt: a receiver cannot send the gateway
//! to another address), and logs show a webhook's URL without its path or query, which are
//! often its secret.
//!
//! A session's sink builds the payload and puts it on the webhook's queue without waiting;
//! when the queue (`queue_size`) is full the delivery is dropped and counted. One thread per
//! webhook sends them in order, retrying a failed attempt (an error or a status other than
//! 2xx) with backoff, up to `max_attempts`. A call offered to the app does not wait behind them:
//! a webhook that takes `realtime.call.incoming` sends those from a queue and a thread of their
//! own, each by its deadline (the call's ringing), after which it is neither sent nor retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use omni_actors::observe::events::{Interest, SessionEvent, SessionInfo, SessionSink, Subscriber, WorkerChange};
use omni_actors::observe::meta::timestamp;
use omni_actors::observe::metrics::metrics;
use serde_json::{Value, json};

pub use config::{WebhookEntry, WebhookFormat, WebhookSpec};

pub(crate) mod config;

/// The event of a call offered to the app.
pub const OFFER: &str = "realtime.call.incoming";

/// Every event a webhook may ask for.
pub const EVENTS: [&str; 9] = [
    "session.queued",
    "session.assigned",
    "session.started",
    "session.error",
    "session.closed",
    "worker.changed",
    "worker.failed",
    "worker.recovered",
    "realtime.call.incoming",
];

struct Delivery {
    id: String,
    event: &'static str,
    body: String,
    /// Sent and retried until then only (a call offer: its ringing), and while this is not set
    /// (a call offer: the call was decided, or ended).
    deadline: Option<Instant>,
    settled: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// One configured webhook.
pub struct Webhook {
    spec: WebhookSpec,
    queue: SyncSender<Delivery>,
    /// Calls offered to the app, when it takes them: a queue of their own.
    offers: Option<SyncSender<Delivery>>,
    dropped: AtomicU64,
}

impl Webhook {
    /// Starts its sending thread.
    pub fn start(spec: WebhookSpec) -> Arc<Webhook> {
        let (queue, rx) = sync_channel(spec.queue_size);
        let (offers, offers_rx) = match spec.events.iter().any(|e| e == OFFER) {
            true => {
                let (tx, rx) = sync_channel(spec.queue_size);
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let hook = Arc::new(Webhook { spec, queue, offers, dropped: AtomicU64::new(0) });
        for (suffix, rx) in [("", Some(rx)), ("-calls", offers_rx)] {
            let Some(rx) = rx else { continue };
            let sender = hook.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("webhook-{}{suffix}", hook.spec.name))
                .spawn(move || sender.send_loop(rx));
            if let Err(e) = spawned {
                log::error!("webhook {}: cannot start its thread: {e}", hook.spec.name);
            }
        }
        hook
    }

    fn wants(&self, event: &str) -> bool {
        self.spec.events.iter().any(|e| e == event)
    }

    /// Queues a delivery of `event` with `data` (on the offers' queue, by `deadline`, when it is
    /// one); never waits. Whether it was queued.
    fn post(&self, event: &'static str, data: Value) -> bool {
        self.post_by(event, data, None, None)
    }

    fn post_by(
        &self,
        event: &'static str,
        data: Value,
        deadline: Option<Instant>,
        settled: Option<Arc<std::sync::atomic::AtomicBool>>,
    ) -> bool {
        let (id, body) = match self.spec.format {
            WebhookFormat::Omni => {
                let id = uuid::Uuid::new_v4().to_string();
                let (at, _) = timestamp(SystemTime::now());
                let body = json!({"event": event, "delivery": id, "at": at, "data": data}).to_string();
                (id, body)
            }
            WebhookFormat::Openai => {
                let id = format!("evt_{}", uuid::Uuid::new_v4().simple());
                let created_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
                let body = json!({"object": "event", "id": id, "type": event, "created_at": created_at, "data": data})
                    .to_string();
                (id, body)
            }
        };
        let queue = match (&self.offers, event) {
            (Some(offers), OFFER) => offers,
            _ => &self.queue,
        };
        match queue.try_send(Delivery { id, event, body, deadline, settled }) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                metrics().webhook_deliveries.with_label_values(&[self.spec.name.as_str(), "dropped"]).inc();
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped == 1 || dropped.is_multiple_of(1000) {
                    log::warn!(
                        "webhook {}: its queue is full ({} deliveries waiting for {}); {dropped} dropped so far",
                        self.spec.name,
                        self.spec.queue_size,
                        self.spec.redacted_url()
                    );
                }
                false
            }
        }
    }

    fn send_loop(&self, rx: Receiver<Delivery>) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(self.spec.timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        let name = self.spec.name.as_str();
        for delivery in rx {
            let mut attempt = 1;
            let late = |after: std::time::Duration| delivery.deadline.is_some_and(|d| Instant::now() + after >= d);
            let settled = || delivery.settled.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
            loop {
                if settled() {
                    // Decided (or ended) meanwhile: nothing more to tell.
                    break;
                }
                if late(std::time::Duration::ZERO) {
                    metrics().webhook_deliveries.with_label_values(&[name, "failed"]).inc();
                    log::warn!(
                        "webhook {name}: {} {} not delivered before its call rang out",
                        delivery.event,
                        delivery.id
                    );
                    break;
                }
                match self.attempt(&agent, &delivery) {
                    Ok(()) => {
                        metrics().webhook_deliveries.with_label_values(&[name, "delivered"]).inc();
                        break;
                    }
                    Err(why) if attempt < self.spec.max_attempts && !late(self.backoff(attempt)) => {
                        metrics().webhook_deliveries.with_label_values(&[name, "retried"]).inc();
                        let wait = self.backoff(attempt);
                        log::warn!(
                            "webhook {name}: {} {} (attempt {attempt}): {why}; again in {} ms",
                            delivery.event,
                            delivery.id,
                            wait.as_millis()
                        );
                        std::thread::sleep(wait);
                        attempt += 1;
                    }
                    Err(why) => {
                        metrics().webhook_deliveries.with_label_values(&[name, "failed"]).inc();
                        log::error!(
                            "webhook {name}: {} {} failed after {attempt} attempt(s): {why}",
                            delivery.event,
                            delivery.id
                        );
                        break;
                    }
                }
            }
        }
    }

    /// The wait before attempt `attempt + 1`.
    fn backoff(&self, attempt: u32) -> std::time::Duration {
        self.spec.retry_base * 2u32.saturating_pow(attempt - 1).min(64)
    }

    fn attempt(&self, agent: &ureq::Agent, d: &Delivery) -> Result<(), String> {
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs().to_string();
        let request = agent.post(&self.spec.url).header("Content-Type", "application/json");
        let request = match self.spec.format {
            WebhookFormat::Omni => request
                .header("X-Omni-Event", d.event)
                .header("X-Omni-Delivery", &d.id)
                .header("X-Omni-Timestamp", &stamp)
                .header("X-Omni-Signature", &format!("sha256={}", sign(&self.spec.secret, &stamp, &d.body))),
            WebhookFormat::Openai => request.header("webhook-id", &d.id).header("webhook-timestamp", &stamp).header(
                "webhook-signature",
                &format!("v1,{}", sign_standard(&self.spec.secret, &d.id, &stamp, &d.body)),
            ),
        };
        let response = request.send(d.body.as_str()).map_err(|e| without_urls(&e.to_string()))?;
        let status = response.status();
        if status.is_success() { Ok(()) } else { Err(format!("answered {status}")) }
    }
}

/// An error's text with every URL in it redacted (the client's messages may quote the URL, in
/// whatever form it parsed it).
fn without_urls(text: &str) -> String {
    text.split(' ')
        .map(|word| match word.find("://") {
            Some(at) => {
                // The scheme starts after the last character before `://` that is not a letter.
                let start = word[..at].char_indices().rev().find(|(_, c)| !c.is_ascii_alphabetic());
                let start = start.map_or(0, |(i, c)| i + c.len_utf8());
                format!("{}{}", &word[..start], omni_actors::settings::redacted_url(&word[start..]))
            }
            None => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// HMAC-SHA256 of `TIMESTAMP.BODY` under `secret`, in hex.
pub fn sign(secret: &str, stamp: &str, body: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(stamp.as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Standard Webhooks' signature (OpenAI's): base64 of HMAC-SHA256 of `ID.TIMESTAMP.BODY` under
/// the secret's key (the base64 after `whsec_`, checked when the config was read).
pub fn sign_standard(secret: &str, id: &str, stamp: &str, body: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key =
        secret.strip_prefix("whsec_").and_then(|k| b64.decode(k).ok()).unwrap_or_else(|| secret.as_bytes().to_vec());
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length");
    for part in [id, ".", stamp, ".", body] {
        mac.update(part.as_bytes());
    }
    b64.encode(mac.finalize().into_bytes())
}

/// The webhooks of this configuration, for what is told to them directly rather than through
/// a session's events (a SIP call offered to the app). Cheap to clone.
#[derive(Clone, Default)]
pub struct Announcer {
    hooks: Arc<[Arc<Webhook>]>,
}

impl Announcer {
    /// Starts every webhook's sending thread.
    pub fn start(specs: &[WebhookSpec]) -> Announcer {
        Announcer { hooks: specs.iter().map(|s| Webhook::start(s.clone())).collect() }
    }

    /// The webhooks as session and worker subscribers.
    pub fn subscribers(&self) -> impl Iterator<Item = WebhookSubscriber> + '_ {
        self.hooks.iter().map(|hook| WebhookSubscriber { hook: hook.clone(), failed: Default::default() })
    }

    /// Queues a call offered to the app (`realtime.call.incoming` with `data`) for every
    /// webhook that takes it, to be sent by `deadline` and while `settled` is not set: how many
    /// queued it.
    pub fn offer(&self, data: &Value, deadline: Instant, settled: &Arc<std::sync::atomic::AtomicBool>) -> usize {
        self.hooks
            .iter()
            .filter(|h| h.wants(OFFER) && h.post_by(OFFER, data.clone(), Some(deadline), Some(settled.clone())))
            .count()
    }
}

/// The webhook as a subscriber.
pub struct WebhookSubscriber {
    hook: Arc<Webhook>,
    /// Workers that failed and are not idle again yet (for `worker.recovered`).
    failed: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Subscriber for WebhookSubscriber {
    fn name(&self) -> &str {
        &self.hook.spec.name
    }

    fn interest(&self) -> Interest {
        let mut interest = Interest::NONE;
        for e in &self.hook.spec.events {
            interest = interest
                | match e.as_str() {
                    "session.error" => Interest::ERRORS,
                    e if e.starts_with("worker.") => Interest::WORKERS,
                    "realtime.call.incoming" => Interest::NONE,
                    _ => Interest::LIFECYCLE,
                };
        }
        interest
    }

    fn session(&self, info: &SessionInfo) -> Option<Box<dyn SessionSink>> {
        let session = json!({
            "connection": info.conn,
            "mode": info.mode.as_str(),
            "client_addr": info.client_addr,
            "key": info.key_id,
        });
        Some(Box::new(WebhookSink { hook: self.hook.clone(), session }))
    }

    fn worker(&self, change: &WorkerChange) {
        let data = || json!({"worker": change.worker, "node": change.node, "from": change.from, "to": change.to, "reason": change.reason});
        let hook = &self.hook;
        if hook.wants("worker.changed") {
            hook.post("worker.changed", data());
        }
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if change.to == "failed" {
            // Once per failure: a worker that keeps failing to open is told once.
            if failed.insert(change.worker.clone()) && hook.wants("worker.failed") {
                hook.post("worker.failed", data());
            }
        } else if change.to == "idle" && failed.remove(&change.worker) && hook.wants("worker.recovered") {
            hook.post("worker.recovered", data());
        }
    }
}

/// One session's deliveries.
struct WebhookSink {
    hook: Arc<Webhook>,
    /// What every delivery says of the session (its id added once it has one).
    session: Value,
}

impl SessionSink for WebhookSink {
    fn event(&mut self, event: &SessionEvent<'_>) {
        let (name, extra) = match *event {
            SessionEvent::Queued { position } => ("session.queued", json!({"position": position})),
            SessionEvent::Assigned { worker, waited } => {
                ("session.assigned", json!({"worker": worker, "waited_s": waited.as_secs_f64()}))
            }
            SessionEvent::Started { session_id, dialect, .. } => {
                self.session["session_id"] = json!(session_id);
                ("session.started", json!({"dialect": dialect}))
            }
            SessionEvent::Error { code, message } => ("session.error", json!({"code": code, "message": message})),
            SessionEvent::Closed { meta } => (
                "session.closed",
                json!({
                    "reason": meta.close_reason, "worker": meta.worker, "dialect": meta.dialect,
                    "start": meta.start, "end": meta.end, "duration_s": meta.duration_s,
                    "chunks_received": meta.chunks_received, "chunks_dropped": meta.chunks_dropped,
                    "chunks_answered": meta.chunks_answered, "turns": meta.turns,
                }),
            ),
            _ => return,
        };
        if self.hook.wants(name) {
            let mut data = self.session.clone();
            if let (Value::Object(d), Value::Object(e)) = (&mut data, extra) {
                d.extend(e);
            }
            self.hook.post(name, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_shows_no_url_whole() {
        let e = "http://h:9/hook/t0k3n?x=1 is missing host; see \"https://u:p@x/y\"";
        assert_eq!(without_urls(e), "http://h:9/*** is missing host; see \"https://***@x/***");
    }

    #[test]
    fn the_openai_signature_is_standard_webhooks() {
        // Computed independently: Python's base64.b64encode(hmac.new(base64.b64decode(
        // "MDEyMzQ1Njc4OWFiY2RlZg=="), b"evt_1.1700000000.{}", sha256).digest()).
        assert_eq!(
            sign_standard("whsec_MDEyMzQ1Njc4OWFiY2RlZg==", "evt_1", "1700000000", "{}"),
            "5/6qDyjZnwbEUs9I9I8i7BGKidfp/4yA/2sCbBGqvwc="
        );
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // Computed independently: Python's hmac.new(secret, b"1700000000." + body, sha256).
        assert_eq!(
            sign("0123456789abcdef", "1700000000", "{\"event\":\"session.closed\"}"),
            "e9d160abe775b05f6f4ca29789375adde72182dde99a16c9f9672985029082da"
        );
    }
}
