//! Subscribers of session and worker events (docs/extending.md) against the real server:
//! usage accounting matches what scripted sessions sent and received; webhooks arrive
//! signed, are retried, and a receiver that never answers costs a bounded queue.

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};
use sha2::Digest;

const KEY: &str = "usage-key-0123456789abcdef";
const SECRET: &str = "webhook-secret-0123456789";

fn key_id(key: &str) -> String {
    format!("key_{}", &hex::encode(sha2::Sha256::digest(key.as_bytes()))[..12])
}

/// The day file's lines, once `count` are written.
fn usage_lines(server: &Server, count: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let lines: Vec<Value> = std::fs::read_dir(server.dir().join("usage"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|f| {
                std::fs::read_to_string(f.path()).unwrap_or_default().lines().map(String::from).collect::<Vec<_>>()
            })
            .map(|l| serde_json::from_str(&l).unwrap())
            .collect();
        if lines.len() >= count {
            return lines;
        }
        assert!(std::time::Instant::now() < deadline, "usage lines: {lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn usage_matches_what_the_sessions_sent_and_received() {
    let server = Server::ready(
        Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")).extra("[usage]\nenabled = true\ndir = \"usage\""),
    );
    // Duplex: four seconds of audio in; the reference backend answers the first tone with
    // three speaking steps (1 s, 1 s, 0.5 s of speech).
    let mut c = Client::connect(&server.url(&format!("/v1/realtime?mode=audio&api_key={KEY}"))).await;
    c.until("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    let session_id = c.expect("session.created").await["session_id"].as_str().unwrap().to_string();
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    for i in 2..=4 {
        c.send(append(&quiet())).await;
        answer_to(&mut c, &format!("input_{i}")).await;
    }
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    // Chat: one answer of two words with speech (0.25 s a piece).
    let mut chat = Client::connect(&server.url(&format!("/v1/realtime?mode=chat&api_key={KEY}"))).await;
    chat.until("session.queue_done").await;
    chat.send(json!({"type": "session.init", "payload": {}})).await;
    chat.expect("session.created").await;
    chat.send(json!({"type": "input.append", "input": {"tts": {"enabled": true},
        "messages": [{"role": "user", "content": "Reply with exactly: two words"}]}}))
        .await;
    chat.until("response.done").await;
    chat.send(json!({"type": "session.close"})).await;
    chat.until("session.closed").await;

    let lines = usage_lines(&server, 2);
    let id = key_id(KEY);
    let duplex = lines.iter().find(|l| l["mode"] == "audio").unwrap();
    assert_eq!(duplex["key"], id.as_str());
    assert_eq!(duplex["session_id"], session_id.as_str());
    assert_eq!(
        (duplex["audio_in_s"].as_f64(), duplex["audio_out_s"].as_f64(), duplex["steps"].as_u64()),
        (Some(4.0), Some(2.5), Some(4)),
        "{duplex}"
    );
    assert_eq!(duplex["close_reason"], "user_stop");
    let chat_line = lines.iter().find(|l| l["mode"] == "chat").unwrap();
    assert_eq!((chat_line["audio_out_s"].as_f64(), chat_line["steps"].as_u64()), (Some(0.5), Some(1)), "{chat_line}");
    assert!(
        !std::fs::read_to_string(server.dir().join("usage").read_dir().unwrap().next().unwrap().unwrap().path())
            .unwrap()
            .contains(KEY)
    );
    let m = |name: &str, mode: &str| server.metric(&format!("{name}{{key=\"{id}\",mode=\"{mode}\"}}"));
    assert_eq!(m("omni_usage_sessions_total", "audio"), 1.0);
    assert_eq!(m("omni_usage_audio_in_seconds_total", "audio"), 4.0);
    assert_eq!(m("omni_usage_audio_out_seconds_total", "audio"), 2.5);
    assert_eq!(m("omni_usage_steps_total", "audio"), 4.0);
    assert_eq!(m("omni_usage_audio_out_seconds_total", "chat"), 0.5);
    assert!(m("omni_usage_connected_seconds_total", "audio") > 0.0);
}

fn webhook(receiver: &Receiver, events: &[&str], extra: &str) -> String {
    format!(
        "[[webhooks]]\nname = \"ops\"\nurl = \"{}\"\nevents = {}\nsecret = \"{SECRET}\"\nretry_base_s = 0.1\n{extra}\n",
        receiver.url(),
        serde_json::to_string(events).unwrap()
    )
}

fn signed(r: &Received) -> bool {
    let stamp = r.header("X-Omni-Timestamp").unwrap_or_default();
    let expected = omni_gateway::observe::webhooks::sign(SECRET, stamp, &r.body);
    r.header("X-Omni-Signature") == Some(format!("sha256={expected}").as_str())
}

#[tokio::test]
async fn webhooks_arrive_signed_and_failed_attempts_are_retried() {
    let receiver = Receiver::start();
    receiver.with(|s| s.fail_next = 2);
    let server = Server::ready(Setup::default().extra(&webhook(&receiver, &["session.started", "session.closed"], "")));
    let mut c = active(&server, "audio").await;
    c.send(json!({"type": "session.close", "reason": "bye"})).await;
    c.until("session.closed").await;
    let closed = receiver.wait_for("session.closed", |r| r.header("X-Omni-Event") == Some("session.closed"));
    assert!(signed(&closed), "{closed:?}");
    let body = closed.json();
    assert_eq!((body["event"].as_str(), body["data"]["reason"].as_str()), (Some("session.closed"), Some("bye")));
    assert_eq!(body["data"]["mode"], "audio");
    assert!(body["data"]["session_id"].as_str().unwrap().starts_with("sess_"));
    // The first delivery (session.started) failed twice and was sent a third time, the same.
    let started: Vec<Received> = receiver
        .with(|s| s.received.iter().filter(|r| r.header("X-Omni-Event") == Some("session.started")).cloned().collect());
    assert_eq!(started.len(), 3, "{started:?}");
    assert!(started.iter().all(|r| r.header("X-Omni-Delivery") == started[0].header("X-Omni-Delivery")));
    assert!(started.iter().all(signed));
    assert_eq!(
        server.wait_metric("omni_webhook_deliveries_total{outcome=\"delivered\",webhook=\"ops\"}", 2.0, WAIT),
        2.0
    );
    assert_eq!(server.metric("omni_webhook_deliveries_total{outcome=\"retried\",webhook=\"ops\"}"), 2.0);
    // A forged body does not match the signature.
    let mut forged = closed.clone();
    forged.body = forged.body.replace("bye", "hi!");
    assert!(!signed(&forged));
}

#[tokio::test]
async fn a_worker_that_fails_and_comes_back_is_told() {
    let receiver = Receiver::start();
    let server = Server::ready(
        Setup::default()
            .workers(workers(1, "hang_at_step = 2\nhang_ms = 3000"))
            .limits("step_timeout_ms = 500")
            .extra(&webhook(&receiver, &["worker.failed", "worker.recovered"], "")),
    );
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    let failed = receiver.wait_for("worker.failed", |r| r.header("X-Omni-Event") == Some("worker.failed")).json();
    assert_eq!(failed["data"]["worker"], "sim-0");
    assert!(failed["data"]["reason"].as_str().unwrap().contains("step"), "{failed}");
    let recovered = receiver.wait_for("worker.recovered", |r| r.header("X-Omni-Event") == Some("worker.recovered"));
    assert_eq!(recovered.json()["data"]["to"], "idle");
}

#[tokio::test]
async fn a_webhook_follows_no_redirect_and_its_deliveries_have_ids_no_restart_repeats() {
    // A receiver answering 302 towards another internal port.
    let (receiver, elsewhere) = (Receiver::start(), Receiver::start());
    receiver.with(|s| s.redirect_to = Some(elsewhere.url()));
    let server = Server::ready(Setup::default().extra(&webhook(&receiver, &["session.closed"], "max_attempts = 2")));
    let mut c = active(&server, "audio").await;
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    server.wait_metric("omni_webhook_deliveries_total{outcome=\"failed\",webhook=\"ops\"}", 1.0, WAIT);
    assert_eq!(server.metric("omni_webhook_deliveries_total{outcome=\"delivered\",webhook=\"ops\"}"), 0.0);
    assert!(elsewhere.with(|s| s.received.is_empty()), "the redirect was followed");
    // Both attempts carried one delivery id: a UUID, not a count a restarted process repeats.
    let ids: Vec<String> =
        receiver.with(|s| s.received.iter().map(|r| r.header("X-Omni-Delivery").unwrap().to_string()).collect());
    assert_eq!(ids.len(), 2);
    assert!(ids[0] == ids[1] && uuid::Uuid::parse_str(&ids[0]).is_ok(), "{ids:?}");
}

#[tokio::test]
async fn a_receiver_that_never_answers_costs_a_bounded_queue_and_nothing_else() {
    let receiver = Receiver::start();
    receiver.with(|s| s.hang = Some(Duration::from_secs(60)));
    // Its URL carries its secret, as many services' do: logs show only its host.
    let hook = webhook(&receiver, &["session.started", "session.closed"], "queue_size = 4\ntimeout_s = 30");
    let server = Server::ready(Setup::default().extra(&hook.replace("/hook", "/hook/t0ken-in-the-path?sig=s3cret")));
    // 20 sessions, 40 deliveries: one in flight, four waiting, the rest dropped.
    for _ in 0..20 {
        let mut c = active(&server, "chat").await;
        c.send(json!({"type": "session.close"})).await;
        c.until("session.closed").await;
    }
    let dropped = server.wait_metric("omni_webhook_deliveries_total{outcome=\"dropped\",webhook=\"ops\"}", 35.0, WAIT);
    assert!((35.0..=36.0).contains(&dropped), "{dropped}");
    server.wait_log("webhook ops: its queue is full", WAIT);
    server.wait_log(&format!("waiting for http://{}/***", receiver.addr), WAIT);
    assert!(!server.logs().contains("t0ken") && !server.logs().contains("s3cret"), "a log shows the URL");
    receiver.wait_for("the one in flight", |_| true);
    assert_eq!(receiver.with(|s| s.received.len()), 1);
}
