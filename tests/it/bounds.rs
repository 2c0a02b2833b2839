//! Everything a client sends is bounded, over real sockets: audio declaring absurd rates,
//! channel counts or lengths is refused before anything is allocated; every buffer a client
//! can grow (items, images, uncommitted audio, replies held while queued, chat answers
//! waiting, the recording prelude) refuses more past its bound with `buffer_full`, in
//! every dialect and phase; and the worker side cannot hang a session (a backend that
//! never opens, an any-thread call that blocks).

use crate::common::*;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A WAV header declaring `rate`, 8-bit mono PCM, with 100 samples: 144 bytes.
fn crafted_wav(rate: u32) -> Vec<u8> {
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&136u32.to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&rate.to_le_bytes());
    w.extend_from_slice(&rate.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&8u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&100u32.to_le_bytes());
    w.extend_from_slice(&[128u8; 100]);
    w
}

/// pcm16 base64 of `seconds` of silence at `rate`.
fn pcm16_silence(seconds: f64, rate: u32) -> String {
    STANDARD.encode(vec![0u8; (seconds * rate as f64) as usize * 2])
}

async fn openai(server: &Server) -> Client {
    let req = server.url("/v1/realtime?model=omni").into_client_request().unwrap();
    let (ws, _) = tokio_tungstenite::connect_async(req).await.expect("connect");
    Client::from_stream(ws)
}

#[tokio::test]
async fn a_crafted_wav_rate_is_refused_at_once_and_costs_nothing() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    let update = |wav: &[u8]| json!({"type": "session.update", "session": {"instructions": "x", "ref_audio": STANDARD.encode(wav)}});
    // The 300-byte frame that once took the server to 3 GB: answered at once.
    c.send(update(&crafted_wav(4_294_967_291))).await;
    let e = c.expect_error("invalid_payload").await;
    let message = e["error"]["message"].as_str().unwrap();
    assert_eq!(message, "session.ref_audio: sample rate 4294967291 Hz is outside 8000..192000 Hz");
    c.send(update(&crafted_wav(7_999))).await;
    assert!(c.expect_error("invalid_payload").await["error"]["message"].as_str().unwrap().contains("7999 Hz"));
    let (_, peak_mb) = server.memory_mb();
    assert!(peak_mb < 200.0, "the server peaked at {peak_mb:.0} MB");
    // The session is not harmed: a real voice is taken.
    c.send(update(&crafted_wav(16_000))).await;
    c.expect("session.created").await;
}

#[tokio::test]
async fn reference_voices_longer_than_the_limit_are_refused_in_every_dialect() {
    let server =
        Server::ready(Setup::default().limits("max_reference_audio_s = 2").server("max_frame_bytes = 8388608"));
    let three_seconds = b64_pcm(&vec![0.0; 48_000]);
    let mut c = connected(&server, "audio").await;
    c.send(json!({"type": "session.init", "payload": {"voice": {"ref_audio_base64": three_seconds}}})).await;
    let e = c.expect_error("invalid_payload").await;
    assert_eq!(e["error"]["message"], "payload.voice.ref_audio_base64: 3.0 s of audio; at most 2 s are accepted");
    c.send(json!({"type": "session.init", "payload": {"voice": {"tts_ref_audio_base64": b64_pcm(&[0.0; 16000])}}}))
        .await;
    c.expect("session.created").await;
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    drop(c);
    server.wait_idle();

    let mut chat = active(&server, "chat").await;
    chat.send(json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": "hi"}],
        "tts": {"enabled": true, "ref_audio_data": three_seconds}}}))
        .await;
    let e = chat.expect_error("invalid_payload").await;
    assert!(e["error"]["message"].as_str().unwrap().starts_with("input.tts.ref_audio_data: 3.0 s"), "{e}");
    drop(chat);
    server.wait_idle();

    // Legacy: a WAV of 3 s at 8 kHz.
    let mut wav = std::io::Cursor::new(Vec::new());
    {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 8000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::new(&mut wav, spec).unwrap();
        for _ in 0..24_000 {
            w.write_sample(0i16).unwrap();
        }
        w.finalize().unwrap();
    }
    let mut legacy = connected(&server, "video").await;
    let voice = STANDARD.encode(wav.into_inner());
    legacy.send(json!({"type": "session.update", "session": {"instructions": "x", "ref_audio": voice}})).await;
    let e = legacy.expect_error("invalid_payload").await;
    assert_eq!(e["error"]["message"], "session.ref_audio: 3.0 s of audio; at most 2 s are accepted");
}

#[tokio::test]
async fn openai_sample_rates_outside_the_range_are_refused() {
    let server = Server::ready(Setup::default());
    let mut c = openai(&server).await;
    c.expect("session.created").await;
    for (session, param) in [
        (json!({"input_audio_format": {"type": "pcm", "sample_rate": 4_294_967_291u64}}), "session.input_audio_format"),
        (json!({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 200_000}}}}), "session.audio.input.format"),
        (json!({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 7_000}}}}), "session.audio.input.format"),
    ] {
        c.send(json!({"type": "session.update", "session": session})).await;
        let e = c.until("error").await;
        assert_eq!(
            (e["error"]["code"].as_str(), e["error"]["param"].as_str()),
            (Some("invalid_value"), Some(param)),
            "{e}"
        );
        assert!(e["error"]["message"].as_str().unwrap().contains("is outside 8000..192000 Hz"), "{e}");
    }
    // A real rate is taken, and audio at it flows.
    c.send(json!({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}}}))
        .await;
    c.until("session.updated").await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_silence(0.5, 44100)})).await;
    c.send(json!({"type": "input_audio_buffer.commit"})).await;
    assert!(c.seen.iter().all(|e| e["type"] != "error" || e["error"]["param"] != "audio"));
}

#[tokio::test]
async fn what_a_queued_openai_client_sends_is_bounded() {
    let server = Server::ready(Setup::default().limits("max_buffered_mb = 4").workers(workers(1, "")));
    let holder = active(&server, "audio").await; // the only worker
    let mut c = openai(&server).await;
    c.expect("session.queued").await;
    // 30 s of 24 kHz pcm16 per item (1.4 MB sent), held as 16 kHz float (1.92 MB): two
    // fit under the bound (4 MiB), the other 18 are refused.
    let item = json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_audio", "audio": pcm16_silence(30.0, 24000)}]}});
    let (rss_before, _) = server.memory_mb();
    for _ in 0..20 {
        c.send(item.clone()).await;
    }
    // (queue updates come meanwhile)
    let e = c.until("error").await;
    assert_eq!(e["error"]["code"], "buffer_full", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("limits.max_buffered_mb"), "{e}");
    let mut refused = 1;
    while refused < 18 {
        assert_eq!(c.until("error").await["error"]["code"], "buffer_full");
        refused += 1;
    }
    server.wait_metric("omni_buffer_refusals_total{buffer=\"items\"}", 18.0, WAIT);
    let (rss_after, _) = server.memory_mb();
    assert!(rss_after - rss_before < 64.0, "RSS grew from {rss_before:.0} to {rss_after:.0} MB");
    // Served once the worker is free: the session starts with what was held.
    holder.close_socket().await;
    c.until("session.created").await;
    let mut echoes = Vec::new();
    while echoes.len() < 2 {
        echoes.push(c.until("conversation.item.added").await);
    }
    assert!(echoes.iter().all(|e| e["item"]["content"][0].get("audio").is_none()), "echoes carry no audio");
}

#[tokio::test]
async fn an_uncommitted_audio_buffer_and_images_are_bounded() {
    let server = Server::ready(Setup::default().limits("max_buffered_mb = 2"));
    let mut c = openai(&server).await;
    c.expect("session.created").await;
    c.send(json!({"type": "session.update", "session": {"turn_detection": null}})).await;
    c.until("session.updated").await;
    // 10 s at 24 kHz: 640 KB once at 16 kHz float. The fourth does not fit in 2 MB.
    let append = json!({"type": "input_audio_buffer.append", "audio": pcm16_silence(10.0, 24000)});
    for _ in 0..3 {
        c.send(append.clone()).await;
    }
    c.send(append.clone()).await;
    let e = c.expect_error("buffer_full").await;
    assert!(e["error"]["message"].as_str().unwrap().starts_with("input_audio_buffer.append: refused"), "{e}");
    // Committing makes room: the buffer is an item now, answered and gone.
    c.send(json!({"type": "input_audio_buffer.commit"})).await;
    c.until("input_audio_buffer.committed").await;
    c.send(json!({"type": "response.create"})).await;
    c.until("response.done").await;
    c.send(append).await;
    c.send(json!({"type": "input_audio_buffer.commit"})).await;
    c.until("input_audio_buffer.committed").await;
    assert_eq!(server.metric("omni_buffer_refusals_total{buffer=\"audio_buffer\"}"), 1.0);
}

#[tokio::test]
async fn chat_answers_waiting_are_bounded() {
    let server = Server::ready(Setup::default().limits("max_pending_turns = 2").workers(workers(1, "token_ms = 50")));
    let mut c = active(&server, "chat").await;
    let ask = |n: u32| {
        json!({"type": "input.append", "input": {"streaming": false,
            "messages": [{"role": "user", "content": format!("Reply with exactly: answer {n}")}]}})
    };
    for n in 1..=6 {
        c.send(ask(n)).await;
    }
    // One in progress and two waiting are taken; the other three are refused.
    let mut done = Vec::new();
    let mut refused = 0;
    while done.len() < 3 || refused < 3 {
        let v = c.event().await;
        match v["type"].as_str() {
            Some("response.done") => done.push(v["text"].as_str().unwrap().to_string()),
            Some("error") => {
                assert_eq!(v["error"]["code"], "buffer_full", "{v}");
                refused += 1;
            }
            _ => {}
        }
    }
    assert_eq!(done, ["answer 1", "answer 2", "answer 3"], "answered in order");
    assert_eq!(server.metric("omni_buffer_refusals_total{buffer=\"turns\"}"), 3.0);
    c.send(ask(7)).await;
    assert_eq!(c.expect("response.done").await["text"], "answer 7", "room again");
}

#[tokio::test]
async fn the_recording_prelude_of_a_queued_client_is_bounded() {
    let server = Server::ready(Setup::default().recording("enabled = true").recording("max_lag_mb = 1"));
    let holder = active(&server, "audio").await;
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    c.expect("session.queued").await;
    // Chunks sent while queued are refused (not_ready) but recorded: at most 1 MB is held.
    for _ in 0..10 {
        c.send(append(&vec![0.0; 64_000])).await;
        c.expect_error("not_ready").await;
    }
    holder.close_socket().await;
    c.until("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    let id = c.expect("session.created").await["session_id"].as_str().unwrap().to_string();
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    let meta: Value = serde_json::from_slice(&std::fs::read(server.recording(&id).join("meta.json")).unwrap()).unwrap();
    let dropped = meta["recording"]["dropped_records"].as_u64().unwrap();
    assert!(dropped >= 5, "the prelude kept at most 1 MB: {meta}");
    assert!(server.metric("omni_recording_dropped_total{reason=\"prelude\"}") >= 5.0);
}

#[tokio::test]
async fn a_backend_that_never_opens_fails_its_worker_at_the_open_timeout() {
    let server = Server::start(
        Setup::default().limits("open_timeout_s = 1").workers(
            "[[workers]]\nname = \"slow\"\nmodes = [\"video\"]\nisolation = \"process\"\n[workers.options]\nopen_ms = 600000\n\
             [[workers]]\nname = \"sim\"\nmodes = [\"audio\"]\n"
                .into(),
        ),
    );
    let status = server.wait_status("the slow worker fails at the open timeout", WAIT, |s| {
        s["workers"][0]["state"] == "failed" && s["workers"][0]["restarts"].as_u64().unwrap_or(0) >= 1
    });
    let failure = status["workers"][0]["last_error"].as_str().unwrap();
    assert!(failure.contains("did not open within limits.open_timeout_s (1 s)"), "{failure}");
    assert!(server.logs().contains("worker slow-0"), "the log names the worker");
    // Its process was killed: at most the one of the attempt in progress is alive.
    assert!(server.children().len() <= 1, "children: {:?}", server.children());
    // The rest of the pool serves.
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
}

#[tokio::test]
async fn an_any_thread_call_that_blocks_stalls_only_its_own_worker() {
    // The stuck worker's interrupt blocks for a minute; its speaking steps take 30 s.
    let server = Server::ready(
        Setup::default().limits("step_timeout_ms = 120000").workers(
            "[[workers]]\nname = \"stuck\"\nmodes = [\"video\"]\n[workers.options]\ninterrupt_hang_ms = 60000\ntoken_ms = 30000\n\
             [[workers]]\nname = \"sim\"\nmodes = [\"audio\"]\n"
                .into(),
        ),
    );
    let mut stuck = active(&server, "video").await;
    stuck.send(append(&loud())).await;
    answer_to(&mut stuck, "input_1").await;
    stuck.send(append(&quiet())).await; // speaking, in flight
    stuck.send(append_with(&quiet(), json!({"force_listen": true}))).await; // the interrupt blocks
    server.wait_metric("omni_chunks_received_total{mode=\"video\"}", 3.0, WAIT);
    // Another worker's session is served meanwhile, and the operator routes answer.
    let mut c = active(&server, "audio").await;
    for k in 1..=3 {
        c.send(append(&quiet())).await;
        assert_eq!(kinds(&answer_to(&mut c, &format!("input_{k}")).await), ["listen"]);
    }
    assert_eq!(server.status()["workers"][1]["state"], "busy");
    // The stuck session itself was cut short all the same (the epoch moves before the block).
    let events = answer_to(&mut stuck, "input_3").await;
    assert_eq!(kinds(&events), ["listen", "listen"]);
}

/// A client that sends faster than its session handles them: past `max_incoming_bytes` of its
/// messages unhandled the server stops reading its connection (TCP makes the client's sends
/// wait), so what the server holds for it stays bounded; once the client is gone, nothing of
/// it is left counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_faster_than_its_session_handles_is_read_no_faster() {
    use tokio_tungstenite::tungstenite::Message;
    const MAX: f64 = 65536.0;
    let server = Server::ready(Setup::default().server("max_incoming_bytes = 65536").server("max_messages_per_s = 0"));
    let mut c = openai(&server).await;
    c.expect("session.created").await;
    // 400 seconds of audio, 64 KB a message, sent as fast as the connection takes them.
    let append = json!({"type": "input_audio_buffer.append", "audio": pcm16_silence(1.0, 24000)}).to_string();
    let size = append.len() as f64;
    let sender = tokio::spawn(async move {
        for _ in 0..400 {
            c.send_raw(Message::text(append.clone())).await;
        }
        c
    });
    let mut most = 0.0f64;
    while !sender.is_finished() {
        most = most.max(server.metric("omni_incoming_bytes_waiting"));
    }
    // The bound, the message that crossed it, and what the HTTP layer and the WebSocket codec
    // had already read when the reading stopped (it reads on in pieces of up to 32 KB).
    assert!(most <= MAX + 4.0 * size, "{most} bytes waited unhandled (bound {MAX}, a message {size})");
    let c = sender.await.unwrap();
    drop(c); // gone without a close
    let deadline = std::time::Instant::now() + WAIT;
    while server.metric("omni_incoming_bytes_waiting") > 0.0 {
        assert!(std::time::Instant::now() < deadline, "bytes still counted after the client left");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Queued clients hold less each (`limits.max_buffered_waiting_mb`), and all sessions together
/// at most `max_buffered_total_mb`: one budget for the process, however many addresses the
/// clients come from; what a client held is given back when it goes.
#[tokio::test]
async fn what_queued_clients_hold_is_bounded_each_and_together() {
    let server = Server::ready(
        Setup::default().limits("max_buffered_waiting_mb = 1\nmax_buffered_total_mb = 3").workers(workers(1, "")),
    );
    let holder = active(&server, "audio").await; // the only worker
    // 10 s of 24 kHz pcm16 per item: 640,000 bytes held (16 kHz float).
    let item = json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_audio", "audio": pcm16_silence(10.0, 24000)}]}});
    let mut clients = Vec::new();
    // Four items fit in 3 MiB, one per client.
    for n in 1..=4 {
        let mut c = openai(&server).await;
        c.expect("session.queued").await;
        c.send(item.clone()).await;
        server.wait_metric("omni_buffered_bytes", n as f64 * 640_000.0, WAIT);
        clients.push(c);
    }
    // A second item does not fit in what one queued client may hold (1 MiB).
    clients[0].send(item.clone()).await;
    let e = clients[0].until("error").await;
    assert_eq!(e["error"]["code"], "buffer_full", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("limits.max_buffered_waiting_mb"), "{e}");
    // A fifth client's first does not fit in what all hold together.
    let mut fifth = openai(&server).await;
    fifth.expect("session.queued").await;
    fifth.send(item.clone()).await;
    let e = fifth.until("error").await;
    assert_eq!(e["error"]["code"], "buffer_full", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("limits.max_buffered_total_mb"), "{e}");
    assert_eq!(server.metric("omni_buffer_refusals_total{buffer=\"items\"}"), 2.0);
    // Gone, they hold nothing; the fifth's item fits now.
    for c in clients {
        c.close_socket().await;
    }
    let deadline = std::time::Instant::now() + WAIT;
    while server.metric("omni_buffered_bytes") > 0.0 {
        assert!(std::time::Instant::now() < deadline, "still {} bytes held", server.metric("omni_buffered_bytes"));
        std::thread::sleep(std::time::Duration::from_millis(20)); // the next look at the gauge
    }
    fifth.send(item).await;
    server.wait_metric("omni_buffered_bytes", 640_000.0, WAIT);
    drop(holder);
}
