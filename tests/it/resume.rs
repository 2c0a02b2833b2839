//! Resumable sessions over real sockets: a client whose TCP connection drops takes its session
//! back with its token (`?resume=TOKEN&received=N`): the same session and worker, its place in
//! the queue, every message it did not receive exactly once, the model's voice produced while
//! it was away not sent late; and the token's rules (once, its own key, within the grace).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common::*;

fn held(grace_s: u32) -> Setup {
    Setup::default().server(&format!("resume_grace_s = {grace_s}"))
}

/// Drops the client's TCP connection without a close frame (a network that went away).
fn drop_connection(c: Client) {
    drop(c.into_inner());
}

/// Waits until the server noticed the drop and holds the session.
fn wait_held(server: &Server, n: u64) {
    server.wait_status("the session held", WAIT, |s| s["sessions"]["held"] == n);
}

/// The HTTP status a WebSocket connection to `url` was refused with.
async fn refused(url: &str) -> u16 {
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => panic!("{url} was accepted"),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// The samples of a MiniCPM-o audio delta.
fn samples(events: &[Value]) -> usize {
    events.iter().filter(|e| e["kind"] == "audio").map(|e| pcm_of(&e["audio"]).len()).sum()
}

#[tokio::test]
async fn a_minicpm_client_dropped_mid_answer_resumes_its_session_with_nothing_lost_or_twice() {
    let server = Server::ready(held(30));
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    let first = c.until("session.queue_done").await;
    let token = first["resume_token"].as_str().expect("a resume token in the first event").to_string();
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "You are a test."}})).await;
    let session_id = c.expect("session.created").await["session_id"].as_str().unwrap().to_string();
    let worker = server.status()["workers"][0]["name"].clone();
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    // The user goes quiet: the model answers; the connection drops before the answer is read.
    c.send(append(&quiet())).await;
    let received = c.seen.len();
    let before = c.seen.clone();
    drop_connection(c);
    wait_held(&server, 1);
    let status = server.status();
    assert_eq!(status["workers"][0]["session"], session_id.as_str(), "the worker is held for it");
    assert!(status["workers"][0]["client_away_s"].as_f64().is_some(), "{status}");
    assert_eq!(server.metric("omni_sessions_held"), 1.0);

    let mut c = Client::connect(&server.url(&format!("/v1/realtime?resume={token}&received={received}"))).await;
    let resumed = c.expect("session.resumed").await;
    assert_eq!(resumed["session_id"], session_id.as_str());
    assert_eq!(resumed["lost"], 0);
    let next = resumed["resume_token"].as_str().unwrap().to_string();
    assert_ne!(next, token, "a token is used once; the next one comes with session.resumed");
    // What it missed: the answer to input_2, once; its voice either sent before the drop was
    // noticed (so sent again) or produced after (not sent, counted).
    let mut answer = Vec::new();
    for _ in 0..resumed["replayed"].as_u64().unwrap() {
        answer.push(c.event().await);
    }
    assert!(answer.iter().all(|e| e["input_id"] == "input_2"), "{answer:?}");
    assert!(answer.iter().any(|e| e["kind"] == "text"), "{answer:?}");
    let skipped = resumed["audio_skipped_ms"].as_u64().unwrap() as usize;
    assert_eq!(samples(&answer) + skipped * 24, 24000, "one second of voice, heard or counted as skipped");
    let mut all: Vec<String> = before.iter().chain(&c.seen[1..]).map(Value::to_string).collect();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "no message twice");
    // The session goes on, on the same worker.
    c.send(append(&loud())).await;
    assert_eq!(answer_to(&mut c, "input_3").await.last().unwrap()["session_id"], session_id.as_str());
    assert_eq!(server.status()["workers"][0]["name"], worker);
    assert_eq!(server.status()["sessions"]["held"], 0);
    c.send(json!({"type": "session.close"})).await;
    assert_eq!(c.until("session.closed").await["session_id"], session_id.as_str());
    server.wait_idle();
    assert_eq!(server.metric("omni_resumes_total{outcome=\"resumed\"}"), 1.0);
}

#[tokio::test]
async fn an_openai_client_dropped_mid_answer_resumes_and_the_answer_continues() {
    // Slow steps: the answer lasts while the client is away.
    let server = Server::ready(held(30).workers(workers(1, "step_ms = 300")));
    let (ws, _) =
        tokio_tungstenite::connect_async(server.url("/v1/realtime?model=omni").into_client_request().unwrap())
            .await
            .unwrap();
    let mut c = Client::from_stream(ws);
    let created = c.expect("session.created").await;
    let token = created["resume_token"].as_str().expect("a resume token in session.created").to_string();
    let session_id = created["session"]["id"].as_str().unwrap().to_string();
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.5, 24000, 0.3)})).await;
    let delta = c.until("response.output_audio.delta").await;
    let response_id = delta["response_id"].clone();
    // What the client received: the number of the last event_N (every event numbered).
    let received: u64 = delta["event_id"].as_str().unwrap().trim_start_matches("event_").parse().unwrap();
    assert_eq!(received as usize, c.seen.len());
    let before = c.seen.clone();
    drop_connection(c);
    wait_held(&server, 1);

    let url = server.url(&format!("/v1/realtime?model=omni&resume={token}&received={received}"));
    let mut c = Client::connect(&url).await;
    let resumed = c.expect("session.resumed").await;
    assert_eq!(resumed["session_id"], session_id.as_str());
    let done = c.until("response.done").await;
    assert_eq!(done["response"]["id"], response_id, "the same answer, continued");
    assert_eq!(done["response"]["status"], "completed");
    // Every event of the session exactly once, in order: their ids count up without a gap.
    assert!(resumed["event_id"].as_str().unwrap().starts_with("event_resumed_"), "outside the numbering");
    let ids: Vec<u64> = before
        .iter()
        .chain(&c.seen[1..])
        .map(|e| e["event_id"].as_str().unwrap().trim_start_matches("event_").parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "event ids");
    // The words whole; the voice heard plus the voice skipped while away is the answer's.
    let events: Vec<&Value> = before.iter().chain(&c.seen).collect();
    let words: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_audio_transcript.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(words, done["response"]["output"][0]["content"][0]["transcript"].as_str().unwrap());
    let heard: usize = events
        .iter()
        .filter(|e| e["type"] == "response.output_audio.delta")
        .map(|e| STANDARD.decode(e["delta"].as_str().unwrap()).unwrap().len() / 2)
        .sum();
    let skipped = resumed["audio_skipped_ms"].as_u64().unwrap() as usize * 24;
    assert_eq!(heard + skipped, 60000, "2.5 s of voice at 24 kHz, heard or skipped: {heard} + {skipped}");
    // The session goes on.
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.5, 24000, 0.3)})).await;
    assert_eq!(c.until("response.done").await["response"]["status"], "completed");
    c.close_socket().await;
    server.wait_idle();
}

#[tokio::test]
async fn a_client_waiting_at_position_3_drops_and_resumes_at_position_3() {
    let server = Server::ready(held(30));
    let mut a = connected(&server, "audio").await;
    let mut waiting = Vec::new();
    for position in 1..=3u64 {
        let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
        let queued = c.expect("session.queued").await;
        assert_eq!(queued["position"], position);
        waiting.push((c, queued["resume_token"].as_str().unwrap().to_string()));
    }
    let (third, token) = waiting.pop().unwrap();
    drop_connection(third);
    wait_held(&server, 1);
    assert_eq!(server.status()["queue"]["length"], 3, "its place is kept");
    let mut third = Client::connect(&server.url(&format!("/v1/realtime?resume={token}"))).await;
    third.expect("session.resumed").await;
    let place = third.expect("session.queue_update").await;
    assert_eq!((place["position"].as_u64(), place["queue_length"].as_u64()), (Some(3), Some(3)));
    // The queue moves on with it in its place.
    a.send(json!({"type": "session.close"})).await;
    assert_eq!(a.closed().await, Some(1000));
    waiting[0].0.until("session.queue_done").await;
    assert_eq!(third.until("session.queue_update").await["position"], 2);
    // Clients that close (rather than drop) end their sessions at once.
    third.close_socket().await;
    for (c, _) in waiting {
        c.close_socket().await;
    }
    server.wait_idle();
}

#[tokio::test]
async fn a_token_resumes_once_only_with_its_own_key_and_only_within_the_grace() {
    let server = Server::ready(held(1).auth("api_keys = [\"key-one-0123456789\", \"key-two-0123456789\"]"));
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio&api_key=key-one-0123456789")).await;
    let token = c.until("session.queue_done").await["resume_token"].as_str().unwrap().to_string();
    drop_connection(c);
    wait_held(&server, 1);
    let resume = |key: &str, token: &str| server.url(&format!("/v1/realtime?resume={token}&api_key={key}"));
    assert_eq!(refused(&resume("key-two-0123456789", &token)).await, 403, "another key");
    assert_eq!(refused(&server.url(&format!("/v1/realtime?resume={token}"))).await, 401, "no key");
    assert_eq!(refused(&format!("{}&received=many", resume("key-one-0123456789", &token))).await, 400);
    let mut c = Client::connect(&resume("key-one-0123456789", &token)).await;
    let next = c.expect("session.resumed").await["resume_token"].as_str().unwrap().to_string();
    assert_eq!(refused(&resume("key-one-0123456789", &token)).await, 404, "used once");
    assert_eq!(server.metric("omni_resumes_total{outcome=\"unknown_token\"}"), 1.0);
    assert_eq!(server.metric("omni_resumes_total{outcome=\"other_key\"}"), 1.0);
    // Dropped again and not back within the grace: the session ends, its token with it.
    drop_connection(c);
    server.wait_log("not resumed within 1s", WAIT);
    assert_eq!(refused(&resume("key-one-0123456789", &next)).await, 404);
    server.wait_idle();
    assert!(!server.logs().contains(&token) && !server.logs().contains(&next), "a token is never logged");
}

#[tokio::test]
async fn without_a_grace_a_dropped_client_ends_its_session_as_before() {
    let server = Server::ready(Setup::default().server("resume_grace_s = 0"));
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    let first = c.until("session.queue_done").await;
    assert!(first.get("resume_token").is_none(), "{first}");
    drop_connection(c);
    server.wait_idle();
    assert_eq!(server.status()["sessions"]["held"], 0);
    assert_eq!(refused(&server.url("/v1/realtime?resume=rsm_0")).await, 404);
}
