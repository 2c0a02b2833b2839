//! Hostile and broken clients over real sockets: silent peers found by the heartbeat, a
//! client that never reads cut off at the outgoing limit, and floods (connection churn,
//! chunk and tiny-frame floods, frames at and over the size limit) while a well-behaved
//! session is served. The floods come from `omni-gateway flood`, the tool whose figures
//! `docs/reliability.md` reports.

use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn silent_peers_are_found_by_the_heartbeat_and_their_worker_and_ticket_freed() {
    let server = Server::ready(
        Setup::default().server("heartbeat_interval_s = 0.2\nheartbeat_timeout_s = 1").workers(workers(1, "")),
    );
    // Two clients that complete the handshake and then never read nor answer a ping: one
    // holds the worker, one waits in the queue.
    let (holder, _) = tokio_tungstenite::connect_async(server.url("/v1/realtime?mode=audio")).await.unwrap();
    server.wait_status("the first peer holds the worker", WAIT, |s| s["workers"][0]["state"] == "busy");
    let (waiting, _) = tokio_tungstenite::connect_async(server.url("/v1/realtime?mode=audio")).await.unwrap();
    server.wait_status("the second peer waits", WAIT, |s| s["queue"]["length"] == 1);
    let silent_since = Instant::now();
    // Freed within the timeout (1 s) plus a ping interval, with room for a busy machine.
    server.wait_status("both silent peers are dropped", Duration::from_secs(5), |s| {
        s["workers"][0]["state"] == "idle" && s["queue"]["length"] == 0 && s["sessions"]["open"] == 0
    });
    assert!(silent_since.elapsed() >= Duration::from_millis(700), "dropped before the timeout");
    assert!(server.logs().contains("heartbeat"), "the log says why");
    drop((holder, waiting));

    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_off_at_the_outgoing_limit() {
    let server = Server::ready(
        Setup::default().server("max_outgoing_bytes = 65536").recording("enabled = true").workers(workers(1, "")),
    );
    // A small receive window, so the kernel's buffers fill quickly.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(server.addr).await.unwrap();
    let tcp = tokio_tungstenite::MaybeTlsStream::Plain(tcp);
    let (ws, _) = tokio_tungstenite::client_async(server.url("/v1/realtime?mode=chat"), tcp).await.unwrap();
    let mut c = Client::from_stream(ws);
    c.until("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    let id = c.expect("session.created").await["session_id"].as_str().unwrap().to_string();
    // A spoken answer of 300 words: about 9.6 MB of audio deltas, never read. (One request:
    // the connection may be cut before a second one could be sent.)
    let words: Vec<String> = (0..300).map(|i| format!("w{i}")).collect();
    let request = json!({"type": "input.append", "input": {
        "messages": [{"role": "user", "content": format!("Reply with exactly: {}", words.join(" "))}],
        "streaming": true, "tts": {"enabled": true}}});
    c.send(request).await;
    server.wait_status("the session is cut off and its worker freed", WAIT, |s| {
        s["workers"][0]["state"] == "idle" && s["sessions"]["open"] == 0
    });
    assert_eq!(server.metric("omni_slow_consumers_total"), 1.0);
    assert!(server.logs().contains("does not read its output"), "the log says why");

    // The connection is gone: what the kernel buffered drains, then the stream ends.
    let deadline = Instant::now() + WAIT;
    let mut client = c.into_inner();
    loop {
        match tokio::time::timeout(WAIT, client.next()).await.expect("the connection ends") {
            Some(Ok(Message::Text(_))) | Some(Ok(Message::Ping(_))) => {}
            _ => break,
        }
        assert!(Instant::now() < deadline, "the connection was not dropped");
    }
    // Its recording is finalized with the reason.
    let meta: Value = serde_json::from_slice(&std::fs::read(server.recording(&id).join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["close_reason"], "slow_consumer");
    // What waited for it is no longer counted as waiting.
    while server.metric("omni_outgoing_bytes_waiting") > 0.0 {
        assert!(Instant::now() < deadline, "{} bytes still counted", server.metric("omni_outgoing_bytes_waiting"));
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut next = active(&server, "audio").await;
    next.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut next, "input_1").await), ["listen"]);
}

async fn flood(server: &Server, args: &[&str]) -> Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
        .arg("flood")
        .arg("--url")
        .arg(format!("ws://{}", server.addr))
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "flood {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn floods_leave_a_well_behaved_session_served() {
    const LIMIT: usize = 262_144;
    let server = Server::ready(Setup::default().server(&format!("max_frame_bytes = {LIMIT}")).workers(workers(3, "")));
    let mut good = active(&server, "audio").await;
    let limit = LIMIT.to_string();
    let oversize_args = ["--kind", "oversize", "--bytes", limit.as_str()];
    let floods = async {
        tokio::join!(
            flood(&server, &["--kind", "connect-drop", "--count", "1000"]),
            flood(&server, &["--kind", "chunks", "--rate", "100", "--seconds", "3"]),
            flood(&server, &["--kind", "tiny", "--rate", "1000", "--seconds", "3"]),
            flood(&server, &oversize_args),
        )
    };
    let well_behaved = async {
        // Real time, one chunk a second, every one answered as the reference backend
        // answers: speech, then a pause, gets a three-step reply, then it listens again.
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        let expected = [&["listen"][..], &["text", "audio"], &["text", "audio"], &["text", "audio"], &["listen"]];
        for (k, want) in (1..=5).zip(expected) {
            ticks.tick().await;
            let audio = if k == 1 { loud() } else { quiet() };
            good.send(append(&audio)).await;
            let answer = answer_to(&mut good, &format!("input_{k}")).await;
            let mine: Vec<Value> = answer.into_iter().filter(|d| d["input_id"] == format!("input_{k}")).collect();
            assert_eq!(kinds(&mine), want, "input_{k}");
        }
        assert!(good.seen.iter().all(|e| e["type"] != "error"), "the good session saw an error");
    };
    let ((churn, chunks, tiny, oversize), ()) = tokio::join!(floods, well_behaved);

    assert_eq!(churn["opened"], 1000, "{churn}");
    assert_eq!(chunks["sent"], 300, "{chunks}");
    assert!(chunks["received"]["response.output.delta"].as_u64().unwrap_or(0) >= 3, "{chunks}");
    assert!(
        chunks["received"].as_object().unwrap().keys().all(|k| !k.starts_with("error:")),
        "a chunk flood is dropped silently, not answered with errors: {chunks}"
    );
    // 1,000 invalid frames a second for 3 s: what the rate admits (200 a second after a
    // burst of 400) gets its error; the rest is dropped unprocessed, with one
    // `rate_limited` error a second saying how many; 3 s is too short to be cut off.
    let count = |code: &str| tiny["received"][format!("error:{code}")].as_u64().unwrap_or(0);
    assert_eq!(tiny["sent"], 3000, "{tiny}");
    assert!((400..=1100).contains(&count("invalid_payload")), "what the rate admits is answered: {tiny}");
    assert!((1..=5).contains(&count("rate_limited")), "the drops are told once a second: {tiny}");
    let frames = oversize["frames"].as_array().unwrap();
    assert!(frames[0]["answer"].get("close").is_none(), "a frame at the limit is read: {oversize}");
    assert_eq!(frames[1]["answer"]["close"], 1009, "a frame over the limit closes with 1009: {oversize}");

    good.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    good.until("session.closed").await;

    // No worker was lost to the churn: three new clients at once are all served.
    let (mut a, mut b, mut c) =
        tokio::join!(active(&server, "audio"), active(&server, "audio"), active(&server, "audio"));
    for client in [&mut a, &mut b, &mut c] {
        client.send(append(&loud())).await;
        assert_eq!(kinds(&answer_to(client, "input_1").await), ["listen"]);
    }
}

#[tokio::test]
async fn a_client_joining_during_connection_churn_gets_a_worker() {
    // A session that ends right after its worker was assigned must not leave that worker
    // reserved (this starved every later client before Attach was sent with do_send).
    let server = Server::ready(Setup::default().workers(workers(2, "")));
    let churn = flood(&server, &["--kind", "connect-drop", "--count", "3000"]);
    let joiner = async {
        // Once the churn is under way.
        while server.metric("omni_connections_total") < 100.0 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // It may wait behind churning connections first.
        let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
        c.until("session.queue_done").await;
        c.send(json!({"type": "session.init", "payload": {}})).await;
        c.expect("session.created").await;
        c.send(append(&loud())).await;
        assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
    };
    let joiner =
        async { tokio::time::timeout(Duration::from_secs(30), joiner).await.expect("the joiner was never served") };
    let (report, ()) = tokio::join!(churn, joiner);
    assert_eq!(report["opened"], 3000, "{report}");
    let (mut a, mut b) = tokio::join!(active(&server, "audio"), active(&server, "audio"));
    for client in [&mut a, &mut b] {
        client.send(append(&loud())).await;
        assert_eq!(kinds(&answer_to(client, "input_1").await), ["listen"]);
    }
}
