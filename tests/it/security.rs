//! The security audit's findings, each reproduced over real sockets against the real
//! server: per-address fairness, fragmented-message memory, message floods, key handling,
//! the operator routes from other hosts, headers, client-supplied close reasons, SIGHUP,
//! and what a backend process can see.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::{Bytes, Message};

const ADMIN: &str = "admin-key-for-tests-0";

/// The HTTP status of a refused upgrade and its error code.
fn refusal(e: tokio_tungstenite::tungstenite::Error) -> (u16, String) {
    match e {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap_or(b"{}")).unwrap_or_default();
            (resp.status().as_u16(), body["error"]["code"].as_str().unwrap_or("").to_string())
        }
        other => panic!("expected an HTTP refusal, got {other}"),
    }
}

/// A raw HTTP GET from this host to `localhost` (unless `headers` name another Host);
/// returns the whole response (status line, headers, body).
fn raw_get(server: &Server, path: &str, headers: &[(&str, &str)]) -> String {
    raw_get_from(TcpStream::connect(server.addr).unwrap(), path, headers)
}

/// [`raw_get`] on a connection made from the source address `from` (another of 127/8).
async fn raw_get_via(server: &Server, from: &str, path: &str) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(server.addr).await.unwrap().into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    raw_get_from(stream, path, &[])
}

fn raw_get_from(mut stream: TcpStream, path: &str, headers: &[(&str, &str)]) -> String {
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str("Host: localhost\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test]
async fn one_address_cannot_take_the_whole_queue() {
    let server = Server::ready(
        Setup::default().server("max_connections_per_ip = 4").server("max_waiting_per_ip = 2").workers(workers(1, "")),
    );
    let url = server.url("/v1/realtime?mode=audio");
    let _holder = active(&server, "audio").await;
    let mut a = Client::connect(&url).await;
    a.expect("session.queued").await;
    let mut b = Client::connect(&url).await;
    b.expect("session.queued").await;
    let third = tokio_tungstenite::connect_async(&url).await.expect_err("a third waiter from one address");
    assert_eq!(refusal(third), (429, "too_many_waiting".to_string()));
    assert_eq!(server.metric("omni_connections_refused_total{reason=\"too_many_waiting\"}"), 1.0);
    // Once one of them is served, another may wait; connections stay capped.
    drop(a);
    server.wait_status("the waiter left", WAIT, |s| s["queue"]["length"] == 1);
    let mut c = Client::connect(&url).await;
    c.expect("session.queued").await;
    let fifth = tokio_tungstenite::connect_async(&url).await.expect_err("a fifth connection");
    assert_eq!(refusal(fifth).0, 429);
}

#[test]
fn the_shipped_defaults_cap_every_address() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let config = omni_gateway::config::Config::load(&path).unwrap();
    assert_eq!((config.server.max_connections_per_ip, config.server.max_waiting_per_ip), (32, 8));
    assert!(config.server.max_messages_per_s > 0.0);
}

/// Sends the first frame of a fragmented text message (FIN unset) and `more` continuations.
async fn unfinished(
    ws: &mut tokio_tungstenite::WebSocketStream<impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>,
    bytes: usize,
) {
    let chunk = vec![b' '; bytes];
    ws.send(Message::Frame(Frame::message(Bytes::from(chunk), OpCode::Data(Data::Text), false))).await.unwrap();
}

/// Waits until the server has read everything sent on `ws` so far (its pong to a ping sent now).
async fn read_so_far(
    ws: &mut tokio_tungstenite::WebSocketStream<impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>,
) {
    ws.send(Message::Ping(Bytes::from_static(b"read so far?"))).await.unwrap();
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("a pong") {
            Some(Ok(Message::Pong(p))) if &p[..] == b"read so far?" => return,
            Some(Ok(_)) => {} // the server's own pings
            other => panic!("no pong: {other:?}"),
        }
    }
}

#[tokio::test]
async fn unfinished_fragmented_messages_are_bounded_together_and_in_time() {
    let server = Server::ready(
        Setup::default()
            .server("max_fragment_buffer_mb = 2")
            .server("message_timeout_s = 1")
            .server("heartbeat_interval_s = 0.2")
            .workers(workers(3, "")),
    );
    let url = server.url("/v1/realtime?mode=audio");
    // Two connections each hold 0.9 MB of an unfinished message: a third cannot.
    let (mut a, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (mut b, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    unfinished(&mut a, 900_000).await;
    unfinished(&mut b, 900_000).await;
    // Both counted before the third begins: the server answers a ping only once it has read
    // what came before it on that connection.
    read_so_far(&mut a).await;
    read_so_far(&mut b).await;
    let (mut c, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    unfinished(&mut c, 900_000).await;
    let code = loop {
        match tokio::time::timeout(WAIT, c.next()).await.expect("an answer") {
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            _ => break None,
        }
    };
    assert_eq!(code, Some(1013), "over the budget of every connection together");
    // The others, answering pings all along, are closed when their message is overdue.
    let started = Instant::now();
    let code = loop {
        match tokio::time::timeout(WAIT, a.next()).await.expect("an answer") {
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {} // pings: tungstenite answers them
            _ => break None,
        }
    };
    assert_eq!(code, Some(1008), "an unfinished message past message_timeout_s");
    assert!(started.elapsed() < Duration::from_secs(10));
    server.wait_status("every connection gone", WAIT, |s| s["sessions"]["open"] == 0);
    drop(b);
    // Nothing is held any more: a complete fragmented message goes through.
    let (mut d, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let event = json!({"type": "session.close", "reason": "fragmented"}).to_string().into_bytes();
    let (head, tail) = event.split_at(10);
    d.send(Message::Frame(Frame::message(Bytes::from(head.to_vec()), OpCode::Data(Data::Text), false))).await.unwrap();
    d.send(Message::Frame(Frame::message(Bytes::from(tail.to_vec()), OpCode::Data(Data::Continue), true)))
        .await
        .unwrap();
    let mut d = Client::from_stream(d);
    assert_eq!(d.until("session.closed").await["reason"], "fragmented");
}

#[tokio::test]
async fn a_message_flood_is_dropped_told_and_then_closed() {
    let server = Server::ready(Setup::default().server("max_messages_per_s = 50").server("max_messages_burst = 100"));
    let (ws, _) = tokio_tungstenite::connect_async(server.url("/v1/realtime?mode=audio")).await.unwrap();
    let (mut sink, mut stream) = ws.split();
    let flood = tokio::spawn(async move {
        let frame = Message::text(r#"{"type":"x"}"#);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if sink.send(frame.clone()).await.is_err() {
                break;
            }
        }
    });
    let (mut unknown, mut told, mut close) = (0u64, 0u64, None);
    while let Ok(Some(msg)) = tokio::time::timeout(WAIT, stream.next()).await {
        match msg {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                match v["error"]["code"].as_str() {
                    Some("unknown_event") => unknown += 1,
                    Some("rate_limited") => told += 1,
                    _ => {}
                }
            }
            Ok(Message::Close(f)) => {
                close = f.map(|f| u16::from(f.code));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    flood.abort();
    assert_eq!(close, Some(1008), "persistent abuse closes the connection");
    // 5 s over the rate: at most the burst and 50 a second were answered; the drops were
    // told about once a second.
    assert!((100..=500).contains(&unknown), "{unknown} answered");
    assert!((3..=8).contains(&told), "{told} rate_limited errors");
    assert!(server.metric("omni_rate_limited_messages_total") > 1000.0);
    assert!(server.metric("omni_sessions_closed_total{reason=\"rate_limited\"}") >= 1.0);
}

#[tokio::test]
async fn a_recording_stops_at_its_cap_and_notes_the_truncation() {
    let server = Server::ready(
        Setup::default()
            .recording("enabled = true")
            .recording("max_session_mb = 1")
            .server("max_frame_bytes = 2097152"),
    );
    let mut c = active(&server, "audio").await;
    let id =
        c.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"].as_str().unwrap().to_string();
    for k in 1..=8 {
        c.send(append(&quiet())).await; // 64 KB of samples, 85 KB of JSON each
        answer_to(&mut c, &format!("input_{k}")).await;
    }
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    let dir = server.recording(&id);
    let meta: Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["recording"]["truncated"], true, "{meta}");
    let recorded = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum::<u64>();
    assert!(recorded < 2 << 20, "{recorded} bytes on disk");
    assert!(server.metric("omni_recording_dropped_total{reason=\"session_cap\"}") >= 1.0);
}

/// The bytes a recording takes on disk, every file of it.
fn recorded_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { recorded_bytes(&entry.path()) } else { meta.len() };
    }
    total
}

#[tokio::test]
async fn frames_the_server_refuses_are_recorded_as_a_stub_not_as_their_bytes() {
    let server = Server::ready(Setup::default().recording("enabled = true"));
    let mut c = active(&server, "audio").await;
    let id =
        c.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"].as_str().unwrap().to_string();
    // 20 frames of 1 MB of an event type nobody knows (20 MB of junk, each answered by an error).
    let junk = json!({"type": "no.such.event", "blob": "x".repeat(1 << 20)});
    for _ in 0..20 {
        c.send(junk.clone()).await;
        assert_eq!(c.until("error").await["error"]["code"], "unknown_event");
    }
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    let dir = server.recording(&id);
    let bytes = recorded_bytes(&dir);
    assert!(bytes < 64 << 10, "{bytes} bytes on disk for 20 MB of refused frames");
    let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    let stubs: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"]["type"] == "unrecorded")
        .collect();
    assert_eq!(stubs.len(), 20, "{events}");
    assert_eq!(stubs[0]["event"]["bytes"].as_u64(), Some(junk.to_string().len() as u64));
    assert_eq!(stubs[0]["event"]["refused"], "unknown_event");
}

#[tokio::test]
async fn a_session_records_at_most_its_rate() {
    // 0.1 MB/s: a burst of 0.4 MB, then 0.1 MB a second.
    let server = Server::ready(Setup::default().recording("enabled = true").recording("max_rate_mb_s = 0.1"));
    let mut c = active(&server, "audio").await;
    let id =
        c.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"].as_str().unwrap().to_string();
    for k in 1..=8 {
        c.send(append(&quiet())).await; // about 150 KB recorded each
        answer_to(&mut c, &format!("input_{k}")).await;
    }
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    assert!(server.metric("omni_recording_dropped_total{reason=\"rate\"}") >= 1.0);
    server.wait_log("dropping records (rate): the session sends more than recording.max_rate_mb_s", WAIT);
    let meta: Value = serde_json::from_slice(&std::fs::read(server.recording(&id).join("meta.json")).unwrap()).unwrap();
    assert!(meta["recording"]["dropped_records"].as_u64().unwrap() >= 1, "{meta}");
}

#[tokio::test]
async fn nothing_is_recorded_while_the_disk_is_under_its_floor() {
    // A floor no disk has: recording pauses at once, and sessions go on unrecorded.
    let server = Server::ready(Setup::default().recording("enabled = true").recording("min_free_gb = 1000000000"));
    server.wait_log("(recording.min_free_gb: ", WAIT);
    server.wait_log("recording paused", WAIT);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    assert!(server.metric("omni_recording_dropped_total{reason=\"disk_floor\"}") >= 1.0);
}

#[tokio::test]
async fn recordings_are_readable_by_the_servers_user_only() {
    use std::os::unix::fs::PermissionsExt;
    let server = Server::ready(Setup::default().recording("enabled = true"));
    let mut c = active(&server, "audio").await;
    let id =
        c.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"].as_str().unwrap().to_string();
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    let dir = server.recording(&id);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&server.dir().join("recordings")), 0o700);
    assert_eq!(mode(dir.parent().unwrap()), 0o700);
    assert_eq!(mode(&dir), 0o700);
    for f in ["meta.json", "events.jsonl", "input.wav", "output.wav"] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
}

#[tokio::test]
async fn wrong_keys_are_throttled_per_address() {
    let key = "the-right-key-0123456789";
    let server = Server::ready(Setup::default().auth(&format!("api_keys = [\"{key}\"]")));
    let url = server.url("/v1/realtime?mode=audio");
    for i in 0..10 {
        let e = tokio_tungstenite::connect_async(format!("{url}&api_key=guess{i}")).await.expect_err("wrong");
        assert_eq!(refusal(e), (401, "unauthorized".to_string()));
    }
    // Further guesses are checked one at a time, a second each, however many arrive at once.
    let started = Instant::now();
    let guesses = (10..13).map(|i| tokio_tungstenite::connect_async(format!("{url}&api_key=guess{i}")));
    for e in futures_util::future::join_all(guesses).await {
        assert_eq!(refusal(e.expect_err("throttled")), (429, "too_many_attempts".to_string()));
    }
    let paced = started.elapsed();
    assert!(paced >= 3 * omni_gateway::auth::THROTTLE_PACE, "3 guesses in {paced:?}");
    // Whoever shares the address (a NAT, an office) and holds the right key is let in, and not
    // behind the guesses: eight right keys, one after another, are all in while three more
    // guesses still wait for their turns.
    let guesses = tokio::spawn(futures_util::future::join_all(
        (13..16).map(|i| tokio_tungstenite::connect_async(format!("{url}&api_key=guess{i}"))),
    ));
    for _ in 0..8 {
        tokio_tungstenite::connect_async(format!("{url}&api_key={key}")).await.expect("the right key");
    }
    assert!(!guesses.is_finished(), "the right keys waited behind the guesses");
    for e in guesses.await.unwrap() {
        assert_eq!(refusal(e.expect_err("throttled")), (429, "too_many_attempts".to_string()));
    }
    let mut c = Client::connect(&format!("{url}&api_key={key}")).await;
    c.expect("session.queue_done").await;
    assert!(!server.logs().contains(key) && !server.logs().contains("guess"), "keys are never logged");
}

#[tokio::test]
async fn operator_routes_answer_only_requests_made_on_this_host_without_an_admin_key() {
    let server = Server::ready(Setup::default());
    // From this host, to localhost: answered.
    assert!(raw_get(&server, "/status", &[]).starts_with("HTTP/1.1 200"));
    let host = format!("127.0.0.1:{}", server.addr.port());
    assert!(raw_get(&server, "/status", &[("Host", &host)]).starts_with("HTTP/1.1 200"));
    for path in ["/status", "/metrics", "/sessions", "/sessions/sess_x/input.wav"] {
        // Forwarded by a proxy.
        let answer = raw_get(&server, path, &[("X-Forwarded-For", "192.0.2.7")]);
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        assert!(answer.contains("admin_key"), "the refusal names the key to set: {answer}");
        // A page of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding).
        let answer = raw_get(&server, path, &[("Host", "rebind.attacker.example")]);
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        // Another address of 127/8: a service mesh's sidecar, forwarding for anyone.
        let answer = raw_get_via(&server, "127.0.0.6", path).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
    }
    assert!(raw_get(&server, "/healthz", &[("X-Forwarded-For", "192.0.2.7")]).starts_with("HTTP/1.1 200"));
    // Behind a proxy on this host, listed as one: nothing through it is local, header or not.
    let mut proxied = Server::start(Setup::default().server("trusted_proxies = [\"127.0.0.1\"]"));
    proxied.wait_log("requests through [server] trusted_proxies are not local", WAIT);
    assert!(raw_get(&proxied, "/status", &[]).starts_with("HTTP/1.1 403"));
    proxied.skip_invariants();
}

#[tokio::test]
async fn a_forwarded_address_counts_only_from_a_trusted_proxy_and_proxies_may_be_a_network() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let connect = |server: &Server, forwarded_for: &'static str| {
        let mut req = server.url("/v1/realtime?mode=audio").into_client_request().unwrap();
        req.headers_mut().insert("X-Forwarded-For", forwarded_for.parse().unwrap());
        tokio_tungstenite::connect_async(req)
    };
    // No trusted proxy: the header is the client's own claim; both connections are this host's.
    let server = Server::ready(Setup::default().server("max_connections_per_ip = 1"));
    let _first = connect(&server, "192.0.2.7").await.unwrap();
    let e = connect(&server, "192.0.2.8").await.expect_err("one connection per address");
    assert_eq!(refusal(e), (429, "too_many_connections".to_string()));
    // Proxies anywhere in 127.0.0.0/8 (an ingress whose pods change addresses): each client
    // counts as the address its proxy names.
    let behind = Server::ready(
        Setup::default()
            .server("max_connections_per_ip = 1")
            .server("trusted_proxies = [\"127.0.0.0/8\"]")
            .admin_key(ADMIN), // nothing through a proxy is local: the test reads /status with it
    );
    let _a = connect(&behind, "192.0.2.7").await.unwrap();
    let _b = connect(&behind, "192.0.2.8").await.unwrap();
    let e = connect(&behind, "192.0.2.7").await.expect_err("a second one from 192.0.2.7");
    assert_eq!(refusal(e), (429, "too_many_connections".to_string()));
}

#[tokio::test]
async fn operator_answers_are_not_cached_nor_sniffed() {
    let server = Server::ready(Setup::default().recording("enabled = true").admin_key(ADMIN));
    let mut c = active(&server, "audio").await;
    let id =
        c.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"].as_str().unwrap().to_string();
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    server.recording(&id);
    let bearer = format!("Bearer {ADMIN}");
    for path in ["/status".to_string(), "/metrics".into(), "/sessions".into(), format!("/sessions/{id}/input.wav")] {
        let answer = raw_get(&server, &path, &[("Authorization", &bearer)]).to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 200"), "{path}: {answer:.200}");
        assert!(answer.contains("cache-control: no-store"), "{path}");
        assert!(answer.contains("x-content-type-options: nosniff"), "{path}");
    }
    let refused = raw_get(&server, "/status", &[]);
    assert!(refused.contains("the admin key is required"), "{refused}");
    let wrong = raw_get(&server, "/status", &[("Authorization", "Bearer wrong-key")]);
    assert!(wrong.contains("\"the admin key is not valid\""), "{wrong}");
}

#[tokio::test]
async fn an_origin_that_is_not_text_is_refused() {
    let server = Server::ready(Setup::default().server("allowed_origins = [\"https://ok.example\"]"));
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = b"GET /v1/realtime?mode=audio HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: https://ok.example"
        .to_vec();
    req.extend_from_slice(b"\xff\r\n\r\n");
    stream.write_all(&req).unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 403");
}

#[tokio::test]
async fn a_clients_close_reason_is_bounded_and_cannot_forge_log_lines() {
    let server = Server::ready(Setup::default().recording("enabled = true"));
    let mut c = active(&server, "audio").await;
    let id =
        c.seen.iter().find(|e| e["type"] == "session.created").unwrap()["session_id"].as_str().unwrap().to_string();
    let reason = format!("bye\n[2026-01-01T00:00:00Z ERROR forged] line{}", "x".repeat(200_000));
    c.send(json!({"type": "session.close", "reason": reason})).await;
    let closed = c.until("session.closed").await;
    let echoed = closed["reason"].as_str().unwrap();
    assert_eq!(echoed.len(), 64, "bounded");
    assert!(reason.starts_with(echoed));
    assert_eq!(c.closed().await, Some(1000), "a normal close, not a protocol error");
    let meta: Value = serde_json::from_slice(&std::fs::read(server.recording(&id).join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["close_reason"], echoed);
    assert!(!server.logs().lines().any(|l| l.starts_with("[2026-01-01T00:00:00Z ERROR forged]")), "no forged line");
}

#[tokio::test]
async fn sighup_reloads_the_keys_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keys.txt"), "# keys\nfirst-key-0123456789\n").unwrap();
    let server = Server::start_in(Setup::default().auth("api_keys_file = \"keys.txt\""), dir);
    server.wait_idle();
    let url = server.url("/v1/realtime?mode=audio");
    let connect = |key: &'static str| {
        let url = format!("{url}&api_key={key}");
        async move { tokio_tungstenite::connect_async(url).await.map(drop) }
    };
    connect("first-key-0123456789").await.expect("the first key");
    server.wait_idle();
    // A secret the first key minted dies with it: rotating a leaked key cuts its holders off.
    let (code, minted) =
        http(server.addr, "POST", "/v1/realtime/client_secrets", &[("Authorization", "Bearer first-key-0123456789")]);
    assert_eq!(code, 200, "{minted}");
    let secret = serde_json::from_str::<Value>(&minted).unwrap()["value"].as_str().unwrap().to_string();
    std::fs::write(server.dir().join("keys.txt"), "second-key-0123456789\n").unwrap();
    server.signal("HUP");
    server.wait_log("SIGHUP: API keys reloaded: 1 key(s); 1 client secret(s) of removed keys revoked", WAIT);
    connect("second-key-0123456789").await.expect("the new key");
    assert_eq!(refusal(connect("first-key-0123456789").await.expect_err("the old key")).0, 401);
    let with_secret = tokio_tungstenite::connect_async(format!("{url}&api_key={secret}")).await.map(drop);
    assert_eq!(refusal(with_secret.expect_err("the old key's secret")).0, 401);
    // A broken file leaves the keys as they were.
    std::fs::write(server.dir().join("keys.txt"), "short\n").unwrap();
    server.signal("HUP");
    server.wait_log("API keys not reloaded, the previous ones stay", WAIT);
    server.wait_idle();
    connect("second-key-0123456789").await.expect("still the key");
}

#[tokio::test]
async fn a_backend_process_sees_neither_the_options_on_its_command_line_nor_the_gateways_environment() {
    let server = Server::ready(Setup::default().workers(process_workers(1, "reply_steps = 2")));
    let child = *server.children().first().expect("a worker-host child");
    let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains("worker-host") && !cmdline.contains("reply_steps"), "{cmdline}");
    let environ =
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{child}/environ")).unwrap()).replace('\0', "\n");
    assert!(environ.contains("RUST_LOG="), "what a backend needs is kept");
    assert!(!environ.contains("CARGO_"), "the rest is not passed on:\n{environ}");
}

#[tokio::test]
async fn a_worker_restarts_after_the_binary_was_replaced_on_disk() {
    // The server runs from a copy of the binary, which is then deleted (as an upgrade
    // replaces it); a worker whose process dies must come back all the same.
    let bin_dir = tempfile::tempdir().unwrap();
    let copy = bin_dir.path().join("omni-gateway");
    std::fs::copy(env!("CARGO_BIN_EXE_omni-gateway"), &copy).unwrap();
    let server = Server::ready(Setup::default().workers(process_workers(1, "")).binary(&copy));
    std::fs::remove_file(&copy).unwrap();
    let child = *server.children().first().unwrap();
    std::process::Command::new("kill").args(["-9", &child.to_string()]).status().unwrap();
    server.wait_status("the worker restarts with a new process", WAIT, |s| {
        s["workers"][0]["state"] == "idle" && s["workers"][0]["restarts"] == 1
    });
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
}
