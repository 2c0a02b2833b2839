//! Operating the gateway: recordings, status and metrics, cancellation, graceful
//! shutdown, access control and TLS, over real sockets against the real server.

/// An admin key for the tests (keys are at least 16 bytes).
const ADMIN: &str = "admin-key-for-tests-0";

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::common::*;
use serde_json::{Value, json};

fn wav_samples(path: &Path, rate: u32) -> u32 {
    let reader = hound::WavReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(reader.spec().sample_rate, rate, "{}", path.display());
    reader.duration()
}

fn events(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

fn recorded() -> Setup {
    Setup::default().recording("enabled = true")
}

#[tokio::test]
async fn a_complete_duplex_session_is_recorded() {
    let server = Server::ready(recorded());
    let root = server.dir().join("recordings");
    server.wait_log(&format!("recording is on: every session is recorded under {}", root.display()), WAIT);
    let mut c = connected(&server, "video").await;
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "You are a test."}})).await;
    let id = c.expect("session.created").await["session_id"].as_str().unwrap().to_string();
    let mut received_audio = 0;
    for (i, pcm) in [loud(), quiet(), quiet(), quiet(), quiet()].iter().enumerate() {
        c.send(append_with(pcm, json!({"video_frames": [jpeg_b64()]}))).await;
        for d in answer_to(&mut c, &format!("input_{}", i + 1)).await {
            if d["kind"] == "audio" {
                received_audio += pcm_of(&d["audio"]).len() as u32;
            }
        }
    }
    c.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    c.closed().await;

    let dir = server.recording(&id);
    assert_eq!(wav_samples(&dir.join("input.wav"), 16000), 5 * 16000, "every input sample, in order");
    assert_eq!(wav_samples(&dir.join("output.wav"), 24000), received_audio, "every audio sample sent");
    assert_eq!(received_audio, 60000);
    assert_eq!(std::fs::read_dir(dir.join("frames")).unwrap().count(), 5);

    let lines = events(&dir);
    let t: Vec<f64> = lines.iter().map(|l| l["t"].as_f64().unwrap()).collect();
    assert!(t.windows(2).all(|w| w[0] <= w[1]), "ordered");
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| format!("{} {}", l["dir"].as_str().unwrap(), l["event"]["type"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds[..4], ["out session.queue_done", "in session.init", "out session.created", "in input.append"]);
    assert_eq!(kinds.last().unwrap(), "out session.closed");
    let first_append = &lines[3]["event"]["input"];
    assert_eq!(first_append["audio"], json!({"$ref": "input.wav", "offset": 0, "samples": 16000}));
    assert_eq!(first_append["video_frames"][0], json!({"$ref": "frames/000001.jpg"}));
    let audio_refs: Vec<&Value> =
        lines.iter().filter(|l| l["event"]["kind"] == "audio").map(|l| &l["event"]["audio"]).collect();
    assert_eq!(audio_refs[1], &json!({"$ref": "output.wav", "offset": 24000, "samples": 24000}));
    assert!(!std::fs::read_to_string(dir.join("events.jsonl")).unwrap().contains("AAAA"), "no base64 data inline");

    let meta: Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["session_id"], id.as_str());
    assert_eq!(
        (meta["mode"].as_str(), meta["dialect"].as_str(), meta["worker"].as_str()),
        (Some("video"), Some("minicpm"), Some("sim-0"))
    );
    assert_eq!(meta["close_reason"], "user_stop");
    assert_eq!(
        (meta["chunks_received"].as_u64(), meta["chunks_answered"].as_u64(), meta["chunks_dropped"].as_u64()),
        (Some(5), Some(5), Some(0))
    );
    assert!(meta["client_addr"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(meta["start"].as_str().unwrap() < meta["end"].as_str().unwrap());

    // The same through the HTTP routes.
    let (code, body) = server.get("/sessions");
    assert_eq!(code, 200);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((list["total"].as_u64(), list["sessions"][0]["session_id"].as_str()), (Some(1), Some(id.as_str())));
    let (code, body) = server.get(&format!("/sessions/{id}"));
    assert_eq!(code, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["close_reason"], "user_stop");
    assert_eq!(server.get(&format!("/sessions/{id}/input.wav")).0, 200);
    assert_eq!(server.get(&format!("/sessions/{id}/frames/000002.jpg")).0, 200);
    assert_eq!(server.get(&format!("/sessions/{id}/frames/000009.jpg")).0, 404);
}

#[tokio::test]
async fn a_session_whose_client_vanished_mid_speech_is_recorded_complete() {
    let server = Server::ready(recorded());
    let mut c = connected(&server, "audio").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    let id = c.expect("session.created").await["session_id"].as_str().unwrap().to_string();
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await;
    let speech = answer_to(&mut c, "input_2").await;
    let received: usize = speech.iter().filter(|d| d["kind"] == "audio").map(|d| pcm_of(&d["audio"]).len()).sum();
    drop(c); // the TCP connection goes away without a close frame

    let dir = server.recording(&id);
    let meta: Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["close_reason"], "client_closed");
    assert_eq!(wav_samples(&dir.join("input.wav"), 16000), 32000, "what was sent");
    assert_eq!(wav_samples(&dir.join("output.wav"), 24000) as usize, received, "what was received");
    assert!(events(&dir).len() >= 6);
    server.wait_idle();
}

#[tokio::test]
async fn the_retention_sweep_deletes_old_recordings_and_keeps_recent_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recordings");
    let day = Duration::from_secs(86400);
    let make = |date: &str, id: &str, age: Duration, bytes: usize| {
        let d = root.join(date).join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("input.wav"), vec![0u8; bytes]).unwrap();
        std::fs::write(d.join("meta.json"), "{}").unwrap();
        std::fs::File::options()
            .write(true)
            .open(d.join("meta.json"))
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
    };
    make("2026-10-01", "sess_old", day * 30, 100);
    make("2026-11-24", "sess_recent", day / 4, 100);
    make("2026-11-25", "sess_newest", Duration::from_secs(60), 100);
    let server = Server::start_in(
        recorded()
            .recording("retention_days = 7")
            .recording("max_total_gb = 0.00000015")
            .recording("sweep_interval_s = 0.1"),
        dir,
    );
    let deadline = Instant::now() + WAIT;
    while root.join("2026-10-01").exists() || root.join("2026-11-24/sess_recent").exists() {
        assert!(Instant::now() < deadline, "the sweep did not run");
        std::thread::sleep(Duration::from_millis(20));
    }
    // 30 days old: past retention. The cap (150 bytes: one 102-byte session) then removes
    // the oldest remaining.
    assert!(root.join("2026-11-25/sess_newest").exists());
    server.wait_log("recordings sweep: deleted", WAIT);
}

#[tokio::test]
async fn path_traversal_on_sessions_is_refused() {
    let server = Server::ready(recorded());
    std::fs::write(server.dir().join("secret.txt"), "do not serve").unwrap();
    let root = server.dir().join("recordings/2026-11-25/sess_ok");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("meta.json"), "{\"ok\":true}").unwrap();
    assert_eq!(server.get("/sessions/sess_ok").0, 200);
    for path in [
        "/sessions/..%2F..%2Fsecret.txt",
        "/sessions/sess_ok/..%2F..%2F..%2Fsecret.txt",
        "/sessions/sess_ok/../../../secret.txt",
        "/sessions/sess_ok/frames/../../../../secret.txt",
        "/sessions/%2e%2e/meta.json",
        "/sessions/sess_ok/%2e%2e%2f%2e%2e%2fsecret.txt",
        "/sessions/sess_ok/meta.json%00",
        "/sessions/..%5c..%5csecret.txt",
    ] {
        let (code, body) = server.get(path);
        assert!(code == 400 || code == 404, "{path}: {code} {body}");
        assert!(!body.contains("do not serve"), "{path} leaked a file");
    }
}

#[tokio::test]
async fn status_and_metrics_after_a_scripted_run() {
    let server = Server::ready(Setup::default().workers(workers(1, "step_ms = 100")));
    let mut c = active(&server, "audio").await;
    c.send(json!({"type": "input.append", "input": {"audio": "!!"}})).await;
    c.expect_error("invalid_payload").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    for _ in 0..6 {
        c.send(append(&quiet())).await; // a burst: some are dropped
    }
    answer_to(&mut c, "input_7").await;

    let status = server.status();
    assert_eq!(status["workers"][0]["state"], "busy");
    assert_eq!(status["workers"][0]["mode"], "audio");
    assert_eq!(status["workers"][0]["backend"], "builtin");
    assert_eq!(status["workers"][0]["modes"], json!(["chat", "video", "audio"]));
    assert_eq!(status["sessions"]["active"]["audio"], 1);
    assert_eq!(status["queue"]["length"], 0);

    c.send(json!({"type": "session.close"})).await;
    c.closed().await;
    server.wait_idle();
    let (code, text) = server.get("/metrics");
    assert_eq!(code, 200);
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
    };
    assert_eq!(value("omni_connections_total"), 1.0);
    assert_eq!(value("omni_connections_open"), 0.0);
    assert_eq!(value("omni_errors_total{code=\"invalid_payload\"}"), 1.0);
    assert_eq!(value("omni_chunks_received_total{mode=\"audio\"}"), 7.0);
    let (dropped, answered) =
        (value("omni_chunks_dropped_total{mode=\"audio\"}"), value("omni_chunks_answered_total{mode=\"audio\"}"));
    assert!(dropped >= 1.0 && dropped + answered == 7.0, "dropped {dropped}, answered {answered}");
    assert_eq!(value("omni_sessions_closed_total{reason=\"user_stop\"}"), 1.0);
    assert_eq!(value("omni_sessions_active{dialect=\"minicpm\",mode=\"audio\",transport=\"websocket\"}"), 0.0);
    assert_eq!(value("omni_workers{state=\"idle\"}"), 1.0);
    assert_eq!(value("omni_queue_length"), 0.0);
    assert_eq!(value("omni_queue_wait_seconds_count"), 1.0);
    assert!(value("omni_step_duration_seconds_count{kind=\"step\"}") >= 2.0);
    assert_eq!(value("omni_first_audio_latency_seconds_count{mode=\"audio\"}"), 1.0);
    assert!(value("omni_bytes_received_total") > 7.0 * 85000.0);
    assert!(value("omni_bytes_sent_total") > 0.0);
}

#[tokio::test]
async fn a_waiting_ticket_is_cancelled_by_delete() {
    let server = Server::ready(Setup::default());
    let _holder = connected(&server, "video").await;
    let mut waiting = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    let ticket = waiting.expect("session.queued").await["ticket_id"].as_str().unwrap().to_string();
    let (code, body) = http(server.addr, "DELETE", &format!("/queue/{ticket}"), &[]);
    assert_eq!(code, 200, "{body}");
    let closed = waiting.expect("session.closed").await;
    assert_eq!(closed["reason"], "cancelled");
    assert_eq!(waiting.closed().await, Some(1000));
    assert_eq!(http(server.addr, "DELETE", &format!("/queue/{ticket}"), &[]).0, 404, "not waiting any more");
    assert_eq!(http(server.addr, "DELETE", "/queue/12", &[]).0, 400);
}

#[tokio::test]
async fn shutdown_tells_everyone_finalizes_recordings_and_exits_0() {
    let mut server = Server::ready(recorded().server("shutdown_grace_s = 5").workers(workers(1, "step_ms = 400")));
    let mut active_client = active(&server, "audio").await;
    let id = active_client.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut waiting = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    waiting.expect("session.queued").await;
    active_client.send(append(&loud())).await; // a step in flight during the shutdown
    server.wait_metric("omni_chunks_received_total{mode=\"audio\"}", 1.0, WAIT);
    let signalled = Instant::now();
    server.signal("TERM");

    let closed = waiting.expect("session.closed").await;
    assert_eq!(closed["reason"], "server_shutdown");
    assert_eq!(waiting.closed().await, Some(1001));
    // The active client first gets the output of the step in flight.
    let answer = answer_to(&mut active_client, "input_1").await;
    assert_eq!(answer.last().unwrap()["kind"], "listen");
    assert_eq!(active_client.expect("session.closed").await["reason"], "server_shutdown");
    assert_eq!(active_client.closed().await, Some(1001));

    let status = server.wait_exit(Duration::from_secs(10)).expect("the server exits");
    assert_eq!(status.code(), Some(0), "{}", server.logs());
    assert!(signalled.elapsed() < Duration::from_secs(5), "within the grace period");
    let meta: Value = serde_json::from_slice(&std::fs::read(server.recording(&id).join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["close_reason"], "server_shutdown");
    assert!(server.logs().contains("1 of 1 backends closed"), "{}", server.logs());
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let mut server = Server::ready(
        Setup::default().server("shutdown_grace_s = 30").workers(workers(1, "hang_at_step = 1\nhang_ms = 20000")),
    );
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await; // hangs: the graceful shutdown would wait 30 s
    server.wait_metric("omni_chunks_received_total{mode=\"audio\"}", 1.0, WAIT);
    server.signal("TERM");
    server.wait_log("SIGTERM: shutting down", WAIT);
    assert!(server.alive(), "still draining");
    server.signal("INT");
    let status = server.wait_exit(Duration::from_secs(5)).expect("exits at once");
    assert_eq!(status.code(), Some(130));
}

#[tokio::test]
async fn api_keys_guard_the_realtime_endpoint() {
    let server = Server::ready(
        Setup::default().auth("api_keys = [\"key-one-0123456789\", \"key-two-0123456789\"]").admin_key(ADMIN),
    );
    let url = server.url("/v1/realtime?mode=audio");
    let refused = |e: tokio_tungstenite::tungstenite::Error| match e {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            (resp.status().as_u16(), body["error"]["code"].as_str().unwrap().to_string())
        }
        other => panic!("expected an HTTP refusal, got {other}"),
    };
    let no_key = tokio_tungstenite::connect_async(&url).await.expect_err("no key");
    assert_eq!(refused(no_key), (401, "unauthorized".into()));
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    req.headers_mut().insert("Authorization", "Bearer nope".parse().unwrap());
    assert_eq!(
        refused(tokio_tungstenite::connect_async(req).await.expect_err("wrong key")),
        (401, "unauthorized".into())
    );

    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    req.headers_mut().insert("Authorization", "Bearer key-two-0123456789".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("header key");
    use futures_util::StreamExt;
    let first = ws.next().await.unwrap().unwrap();
    assert!(first.to_text().unwrap().contains("session.queue_done"));
    drop(ws);
    server.wait_idle();
    let mut c = Client::connect(&format!("{url}&api_key=key-one-0123456789")).await;
    c.expect("session.queue_done").await;
    drop(c);
    server.wait_idle();
    assert!(!server.logs().contains("key-one") && !server.logs().contains("key-two"), "keys never logged");
}

#[tokio::test]
async fn the_admin_key_guards_every_admin_route_and_never_health() {
    let server = Server::ready(recorded().admin_key(ADMIN));
    let routes = [
        ("GET", "/status"),
        ("GET", "/metrics"),
        ("GET", "/sessions"),
        ("GET", "/sessions/sess_x"),
        ("GET", "/sessions/sess_x/input.wav"),
        ("DELETE", "/queue/ticket_1"),
    ];
    for (method, path) in routes {
        assert_eq!(http(server.addr, method, path, &[]).0, 401, "{method} {path} without a key");
        assert_eq!(
            http(server.addr, method, path, &[("Authorization", "Bearer wrong")]).0,
            401,
            "{method} {path} wrong key"
        );
        let (code, _) = http(server.addr, method, path, &[("Authorization", &format!("Bearer {ADMIN}"))]);
        assert!(code == 200 || code == 404, "{method} {path} with the admin key: {code}");
    }
    assert_eq!(server.get("/healthz").0, 200);
    assert_eq!(server.get("/readyz").0, 200);
}

#[tokio::test]
async fn the_per_ip_connection_cap_answers_429() {
    let server = Server::ready(Setup::default().server("max_connections_per_ip = 2").workers(workers(2, "")));
    let a = connected(&server, "audio").await;
    let _b = connected(&server, "audio").await;
    let err = tokio_tungstenite::connect_async(server.url("/v1/realtime?mode=audio")).await.expect_err("capped");
    let tokio_tungstenite::tungstenite::Error::Http(resp) = err else { panic!("expected HTTP 429") };
    assert_eq!(resp.status().as_u16(), 429);
    a.close_socket().await;
    let deadline = Instant::now() + WAIT;
    loop {
        match tokio_tungstenite::connect_async(server.url("/v1/realtime?mode=audio")).await {
            Ok(_) => break,
            Err(_) => assert!(Instant::now() < deadline, "a closed connection frees its place"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_disallowed_origin_gets_403() {
    let server = Server::ready(Setup::default().server("allowed_origins = [\"https://ok.example\"]"));
    let connect = |origin: &'static str| {
        let url = server.url("/v1/realtime?mode=audio");
        async move {
            let mut req =
                tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
            req.headers_mut().insert("Origin", origin.parse().unwrap());
            tokio_tungstenite::connect_async(req).await
        }
    };
    match connect("https://evil.example").await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 403),
        other => panic!("expected 403, got {:?}", other.map(|_| ())),
    }
    let (ws, _) = connect("https://ok.example").await.expect("allowed origin");
    drop(ws);
}

#[tokio::test]
async fn tls_serves_wss_with_a_certificate_made_by_the_test() {
    let dir = tempfile::tempdir().unwrap();
    let cert = localhost_certificate(dir.path(), "cert.pem", "key.pem");
    let mut server =
        Server::start_in(Setup::default().extra("[server.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\""), dir);
    server.skip_invariants(); // the harness reads /status over plain HTTP

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let url = format!("wss://localhost:{}/v1/realtime?mode=audio", server.addr.port());
    let (mut ws, _) = tokio_tungstenite::connect_async_tls_with_config(
        url,
        None,
        false,
        Some(tokio_tungstenite::Connector::Rustls(Arc::new(client))),
    )
    .await
    .expect("TLS handshake and upgrade");
    use futures_util::{SinkExt, StreamExt};
    // (the worker may still be opening: session.queued can come first)
    while !ws.next().await.unwrap().unwrap().to_text().unwrap().contains("session.queue_done") {}
    ws.send(tokio_tungstenite::tungstenite::Message::text(json!({"type": "session.init", "payload": {}}).to_string()))
        .await
        .unwrap();
    assert!(ws.next().await.unwrap().unwrap().to_text().unwrap().contains("session.created"));
    // Plain WebSocket on the TLS port does not work.
    assert!(
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{}/v1/realtime", server.addr.port())).await.is_err()
    );
    assert!(!server.logs().contains("outgoing buffer is unbounded"), "TLS connections are bounded too");
}

#[tokio::test]
async fn readyz_is_503_when_every_worker_has_failed() {
    let lib = env!("OMNI_REFERENCE_LIB_WRONG_ABI");
    let server = Server::start(
        Setup::default().workers(format!("[[workers]]\nname = \"bad\"\nbackend = \"library\"\nlibrary = \"{lib}\"\n")),
    );
    let deadline = Instant::now() + WAIT;
    while server.get("/readyz").0 != 503 {
        assert!(Instant::now() < deadline, "readyz stays 200");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.get("/healthz").0, 200, "the process still serves");
    let status = server.status();
    assert_eq!(status["workers"][0]["state"], "failed");
    assert!(status["workers"][0]["failure"].as_str().unwrap().contains("ABI version 2"), "{status}");
}
