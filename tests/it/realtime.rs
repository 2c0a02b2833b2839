//! The MiniCPM-o Realtime API on /v1/realtime, over real sockets against the real server
//! and the reference backend.

use crate::common::*;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn video_full_lifecycle() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "You are a test.", "config": {"length_penalty": 1.1}}}))
        .await;
    let created = c.expect("session.created").await;
    assert_eq!(created["mode"], "full_duplex");
    let session_id = created["session_id"].as_str().unwrap().to_string();
    assert!(!session_id.is_empty());
    assert_eq!(created["metrics"]["prompt_length"], 4, "the system prompt occupies the context");
    assert_eq!(created["input_chunk_ms"], 1000, "the reference backend answers best on one-second chunks");

    c.send(append_with(&loud(), json!({"video_frames": [jpeg_b64()], "max_slice_nums": 1}))).await;
    let listen = answer_to(&mut c, "input_1").await;
    assert_eq!(kinds(&listen), ["listen"]);
    assert_eq!(listen[0]["session_id"], session_id.as_str());
    // 4 (prompt) + 1 (step) + 25 (1 s of audio) + 64 (one frame at max_slice_nums 1)
    assert_eq!(listen[0]["metrics"]["kv_cache_length"], 94);

    c.send(append_with(&quiet(), json!({"video_frames": [jpeg_b64()]}))).await;
    let speech = answer_to(&mut c, "input_2").await;
    assert_eq!(kinds(&speech), ["text", "audio"], "text first, then audio");
    assert_eq!(pcm_of(&speech[1]["audio"]).len(), 24000, "24 kHz, one second");

    c.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "user_stop");
    assert_eq!(closed["session_id"], session_id.as_str());
    assert_eq!(c.closed().await, Some(1000));
    server.wait_idle();
}

#[tokio::test]
async fn audio_full_lifecycle_ignores_video_frames() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "audio").await;
    c.send(json!({"type": "session.init", "payload": {"instructions": "Alias of system_prompt."}})).await;
    assert_eq!(c.expect("session.created").await["mode"], "full_duplex");
    // Frames in audio mode are ignored, even ones that are not JPEGs: no frame tokens.
    c.send(append_with(&loud(), json!({"video_frames": ["bm90IGEganBlZw=="]}))).await;
    let listen = answer_to(&mut c, "input_1").await;
    assert_eq!(listen[0]["metrics"]["kv_cache_length"], 3 + 1 + 25);
    c.send(json!({"type": "session.close"})).await;
    assert_eq!(c.until("session.closed").await["reason"], "user_stop", "no reason given: user_stop");
    assert_eq!(c.closed().await, Some(1000));
}

#[tokio::test]
async fn missing_mode_means_video_and_an_unknown_mode_is_http_400() {
    let server = Server::ready(Setup::default());
    let mut c = Client::connect(&server.url("/v1/realtime")).await;
    c.expect("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    assert_eq!(c.expect("session.created").await["mode"], "full_duplex");
    c.send(append_with(&loud(), json!({"video_frames": [jpeg_b64()]}))).await;
    let listen = answer_to(&mut c, "input_1").await;
    assert_eq!(listen[0]["metrics"]["kv_cache_length"], 1 + 25 + 64, "frames count: this is video mode");

    let err = tokio_tungstenite::connect_async(server.url("/v1/realtime?mode=tv")).await.expect_err("refused");
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            assert_eq!(resp.status(), 400);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "invalid_payload");
        }
        other => panic!("expected HTTP 400, got {other}"),
    }
}

#[tokio::test]
async fn chat_streaming_and_non_streaming_turns_in_order() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "chat").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    assert_eq!(c.expect("session.created").await["mode"], "turn_based");

    // Two requests back to back: answered in order.
    c.send(json!({"type": "input.append", "input": {
        "messages": [{"role": "user", "content": "Reply with exactly: hello there world"}],
        "streaming": true, "generation": {"max_new_tokens": 64, "length_penalty": 1.1}, "tts": {"enabled": false}}}))
        .await;
    c.send(json!({"type": "input.append", "input": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Reply with exactly: second"}]}],
        "streaming": false, "tts": {"enabled": true}}}))
        .await;

    let mut deltas = Vec::new();
    let first = loop {
        let v = c.event().await;
        match v["type"].as_str() {
            Some("response.output.delta") => deltas.push(v),
            Some("response.done") => break v,
            _ => panic!("unexpected {v}"),
        }
    };
    let streamed: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(streamed, "hello there world");
    assert_eq!(deltas.len(), 3, "one text delta per piece");
    assert!(deltas.iter().all(|d| d["kind"] == "text" && d["response_id"] == first["response_id"]));
    assert_eq!((first["text"].as_str(), first["reason"].as_str()), (Some("hello there world"), Some("turn_end")));
    assert!(first.get("audio").is_none());

    // Non-streaming: response.done alone, with the whole text and audio.
    let second = c.expect("response.done").await;
    assert_eq!(second["text"], "second");
    assert_ne!(second["response_id"], first["response_id"]);
    assert_eq!(pcm_of(&second["audio"]).len(), 6000, "one piece of 0.25 s at 24 kHz");
    assert!(second["metrics"]["output_tokens"].as_u64().unwrap() >= 1);

    c.send(json!({"type": "session.close", "reason": "turn_done"})).await;
    assert_eq!(c.until("session.closed").await["reason"], "turn_done", "the client's reason is echoed");
    assert_eq!(c.closed().await, Some(1000));
}

#[tokio::test]
async fn chat_audio_and_image_content_with_streamed_speech() {
    let server = Server::ready(Setup::default());
    let mut c = active(&server, "chat").await;
    c.send(json!({"type": "input.append", "input": {
        "messages": [{"role": "user", "content": [
            {"type": "audio", "data": b64_pcm(&vec![0.1; 32000])}, {"type": "image", "data": jpeg_b64()}]}],
        "tts": {"enabled": true}}}))
        .await;
    let mut text = String::new();
    let mut audio = 0;
    let done = loop {
        let v = c.event().await;
        if v["type"] == "response.done" {
            break v;
        }
        match v["kind"].as_str() {
            Some("text") => text.push_str(v["text"].as_str().unwrap()),
            Some("audio") => audio += pcm_of(&v["audio"]).len(),
            _ => panic!("unexpected {v}"),
        }
    };
    assert_eq!(text, "I received 2.0 seconds of audio and 1 image.");
    assert_eq!(done["text"], text.as_str());
    assert!(audio > 0 && audio % 6000 == 0, "streamed speech as audio deltas");
    assert!(done.get("audio").is_none(), "streamed audio is not repeated in response.done");
}

#[tokio::test]
async fn queueing_with_one_worker_and_three_clients() {
    let server = Server::ready(Setup::default());
    let mut a = connected(&server, "video").await;

    let mut b = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    let qb = b.expect("session.queued").await;
    assert_eq!((qb["position"].as_u64(), qb["queue_length"].as_u64()), (Some(1), Some(1)));
    assert!(qb["estimated_wait_s"].is_number() && qb["ticket_id"].as_str().unwrap().starts_with("ticket_"));

    let mut c = Client::connect(&server.url("/v1/realtime?mode=chat")).await;
    let qc = c.expect("session.queued").await;
    assert_eq!((qc["position"].as_u64(), qc["queue_length"].as_u64()), (Some(2), Some(2)));
    assert!(qc["estimated_wait_s"].as_f64().unwrap() > qb["estimated_wait_s"].as_f64().unwrap());

    // A waiting client must not initialise yet.
    c.send(json!({"type": "session.init", "payload": {}})).await;
    c.expect_error("not_ready").await;

    // The first leaves: the second gets the worker, the third moves up at once.
    a.send(json!({"type": "session.close"})).await;
    assert_eq!(a.closed().await, Some(1000));
    b.expect("session.queue_done").await;
    let update = c.expect("session.queue_update").await;
    assert_eq!((update["position"].as_u64(), update["queue_length"].as_u64()), (Some(1), Some(1)));
    assert_eq!(update["ticket_id"], qc["ticket_id"]);

    b.send(json!({"type": "session.init", "payload": {}})).await;
    b.expect("session.created").await;
    b.close_socket().await;
    c.expect("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    assert_eq!(c.expect("session.created").await["mode"], "turn_based");
    c.close_socket().await;
    server.wait_idle();
}

#[tokio::test]
async fn a_waiting_client_leaving_mid_queue_moves_those_behind_it() {
    let server = Server::ready(Setup::default());
    let _a = connected(&server, "audio").await;
    let mut waiting = Vec::new();
    for expected in 1..=3u64 {
        let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
        assert_eq!(c.expect("session.queued").await["position"].as_u64(), Some(expected));
        waiting.push(c);
    }
    let last = waiting.pop().unwrap();
    let middle = waiting.pop().unwrap();
    let mut first = waiting.pop().unwrap();
    let mut last = last;
    middle.close_socket().await;
    let update = last.expect("session.queue_update").await;
    assert_eq!((update["position"].as_u64(), update["queue_length"].as_u64()), (Some(2), Some(2)));
    // The one ahead of the leaver did not move, so it hears nothing now.
    let status = server.status();
    assert_eq!(status["queue"]["length"], 2);
    assert_eq!(status["queue"]["tickets"][0]["position"], 1);
    first.send(json!({"type": "session.close"})).await;
    assert_eq!(first.closed().await, Some(1000), "a waiting client may close");
    assert_eq!(last.expect("session.queue_update").await["position"], 1);
}

#[tokio::test]
async fn periodic_queue_updates_carry_a_fresh_eta() {
    let server = Server::ready(Setup::default().queue("update_interval_s = 0.2"));
    let _a = connected(&server, "video").await;
    let mut b = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    let queued = b.expect("session.queued").await;
    let update = b.expect("session.queue_update").await;
    assert_eq!(update["position"], 1);
    assert!(update["estimated_wait_s"].as_f64().unwrap() <= queued["estimated_wait_s"].as_f64().unwrap());
}

#[tokio::test]
async fn queue_full_is_an_error_and_close_1013() {
    let server = Server::ready(Setup::default().queue("max_waiting = 1"));
    let _a = connected(&server, "video").await;
    let mut b = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    b.expect("session.queued").await;
    let mut c = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    let e = c.expect_error("queue_full").await;
    assert_eq!(e["error"]["type"], "server_error");
    assert_eq!(c.closed().await, Some(1013));
}

#[tokio::test]
async fn a_mode_no_worker_serves_is_service_unavailable() {
    let server = Server::ready(Setup::default().workers("[[workers]]\nname = \"chat\"\nmodes = [\"chat\"]\n".into()));
    let mut c = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    c.expect_error("service_unavailable").await;
    assert_eq!(c.closed().await, Some(1013));
    connected(&server, "chat").await;
}

#[tokio::test]
async fn every_client_error_code_and_the_session_goes_on() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    // not_ready: input before session.created
    c.send(append(&loud())).await;
    c.expect_error("not_ready").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    c.expect("session.created").await;
    // not_ready: a second session.init
    c.send(json!({"type": "session.init", "payload": {}})).await;
    let e = c.expect_error("not_ready").await;
    assert_eq!(e["error"]["type"], "client_error");

    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"type": "response.create"}), "unknown_event", "response.create"),
        (json!({"input": {}}), "missing_field", "type"),
        (json!({"type": "input.append"}), "missing_field", "input"),
        (json!({"type": "input.append", "input": []}), "missing_field", "input"),
        (json!({"type": "input.append", "input": {"force_listen": true}}), "missing_field", "input.audio"),
        (json!({"type": "input.append", "input": {"audio": "***"}}), "invalid_payload", "base64"),
        (json!({"type": "input.append", "input": {"audio": "AAAAAAA="}}), "invalid_payload", "multiple of 4"),
        (append(&vec![0.0; 3999]), "invalid_payload", "at least 4000"),
        (append_with(&loud(), json!({"video_frames": ["R0lGODlhAQAB"]})), "invalid_payload", "JPEG"),
        (append_with(&loud(), json!({"max_slice_nums": 0})), "invalid_payload", "1..9"),
        (append_with(&loud(), json!({"max_slice_nums": 10})), "invalid_payload", "1..9"),
        (append_with(&loud(), json!({"force_listen": "yes"})), "invalid_payload", "force_listen"),
    ];
    for (event, code, mentions) in cases {
        c.send(event.clone()).await;
        let e = c.expect_error(code).await;
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(mentions), "{event} -> {message}");
    }
    // After all that the session works.
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
}

#[tokio::test]
async fn a_text_frame_that_is_not_json_closes_with_1003() {
    let server = Server::ready(Setup::default());
    for bad in ["this is not json", "[1, 2, 3]", "\"a string\""] {
        let mut c = connected(&server, "video").await;
        c.send_raw(Message::text(bad)).await;
        assert_eq!(c.closed().await, Some(1003), "{bad}");
    }
    server.wait_idle();
}

#[tokio::test]
async fn a_binary_frame_closes_with_1003() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    c.send_raw(Message::binary(vec![1u8, 2, 3])).await;
    assert_eq!(c.closed().await, Some(1003));
    server.wait_idle();
}

#[tokio::test]
async fn an_oversized_frame_closes_with_1009() {
    let server = Server::ready(Setup::default().server("max_frame_bytes = 100000"));
    let mut c = active(&server, "video").await;
    c.send(append(&vec![0.01; 24000])).await; // about 128 KB of JSON
    assert_eq!(c.closed().await, Some(1009));
    server.wait_idle();
}

#[tokio::test]
async fn the_time_limit_counts_from_the_upgrade() {
    let server = Server::ready(Setup::default().limits("video_session_s = 1.5"));
    let mut c = active(&server, "video").await;
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "timeout");
    assert_eq!(c.closed().await, Some(1000));
    server.wait_idle();
}

#[tokio::test]
async fn listen_then_speech_then_listen() {
    let server = Server::ready(Setup::default());
    let mut c = active(&server, "audio").await;
    let mut sequence = Vec::new();
    let mut responses = Vec::new();
    let mut audio_lengths = Vec::new();
    let inputs = [loud(), quiet(), quiet(), quiet(), quiet()];
    for (i, pcm) in inputs.iter().enumerate() {
        c.send(append(pcm)).await;
        for d in answer_to(&mut c, &format!("input_{}", i + 1)).await {
            sequence.push(d["kind"].as_str().unwrap().to_string());
            if d["kind"] == "audio" {
                responses.push(d["response_id"].clone());
                audio_lengths.push((pcm_of(&d["audio"]).len(), d["end_of_turn"].as_bool().unwrap()));
            }
        }
    }
    assert_eq!(sequence, ["listen", "text", "audio", "text", "audio", "text", "audio", "listen"]);
    assert!(responses.iter().all(|r| *r == responses[0]), "one response_id for the whole turn");
    assert_eq!(audio_lengths, vec![(24000, false), (24000, false), (12000, true)]);
}

#[tokio::test]
async fn force_listen_mid_speech_discards_the_rest_of_that_response() {
    // Speaking steps take 30 s (listening ones none), longer than this test waits for any
    // event: the listens below arrive only because the interrupt reaches the backend and
    // cuts the speaking step short, and the force-listen reaches it before the pending step.
    let server =
        Server::ready(Setup::default().limits("step_timeout_ms = 120000").workers(workers(1, "token_ms = 30000")));
    let mut c = active(&server, "video").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await; // input_2 starts speaking (in flight for 30 s)
    c.send(append(&quiet())).await; // input_3 pending behind it
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await; // input_4
    let events = answer_to(&mut c, "input_4").await;
    let answered: Vec<(String, String)> = events
        .iter()
        .map(|e| (e["input_id"].as_str().unwrap().to_string(), e["kind"].as_str().unwrap().to_string()))
        .collect();
    let listen = |k: u32| (format!("input_{k}"), "listen".to_string());
    assert_eq!(answered, [listen(2), listen(3), listen(4)], "cut short, force-listened, then the flagged step");
    c.send(append(&quiet())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_5").await), ["listen"], "speech is over");
}

#[tokio::test]
async fn force_listen_while_speaking_step_by_step() {
    let server = Server::ready(Setup::default());
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await;
    let speech = answer_to(&mut c, "input_2").await;
    let response = speech[1]["response_id"].clone();
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_3").await), ["listen"]);
    c.send(append(&quiet())).await;
    let after = answer_to(&mut c, "input_4").await;
    assert_eq!(kinds(&after), ["listen"]);
    assert!(c.seen.iter().skip_while(|e| e["input_id"] != "input_3").all(|e| e["response_id"] != response));
}

#[tokio::test]
async fn a_burst_of_chunks_is_dropped_silently_keeping_the_newest() {
    let server = Server::ready(Setup::default().workers(workers(1, "step_ms = 200")));
    let mut c = active(&server, "audio").await;
    for _ in 0..30 {
        c.send(append(&quiet())).await;
    }
    let events = answer_to(&mut c, "input_30").await;
    assert!(events.iter().all(|e| e["type"] == "response.output.delta"), "no error");
    let answered: Vec<&str> = events.iter().filter_map(|e| e["input_id"].as_str()).collect();
    assert!(answered.len() < 30, "fewer steps than chunks: {answered:?}");
    assert_eq!(*answered.last().unwrap(), "input_30", "the last chunk is answered");
}

#[tokio::test]
async fn context_full_with_a_small_context() {
    let server = Server::ready(Setup::default().workers(workers(1, "n_ctx = 60")));
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_2").await;
    c.send(append(&loud())).await;
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "context_full");
    assert_eq!(c.closed().await, Some(1000));
    server.wait_idle();
}

#[tokio::test]
async fn context_full_from_the_gateway_limit() {
    let server = Server::ready(Setup::default().limits("context_tokens = 50"));
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "context_full");
    assert_eq!(c.closed().await, Some(1000));
}

#[tokio::test]
async fn an_inference_error_is_recoverable() {
    let server = Server::ready(Setup::default().workers(workers(1, "fail_at_step = 2")));
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    let e = c.expect_error("inference_error").await;
    assert_eq!(e["error"]["type"], "server_error");
    assert!(e["error"]["message"].as_str().unwrap().contains("step 2"));
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_3").await), ["listen"], "the next input is processed");
}

#[tokio::test]
async fn a_hanging_step_ends_in_backend_error_and_the_worker_comes_back() {
    let server = Server::ready(
        Setup::default().limits("step_timeout_ms = 500").workers(workers(1, "hang_at_step = 2\nhang_ms = 3000")),
    );
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "backend_error");
    assert_eq!(c.closed().await, Some(1011));

    // The next client gets a working worker (a new backend instance).
    let mut next = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    next.until("session.queue_done").await;
    next.send(json!({"type": "session.init", "payload": {}})).await;
    next.expect("session.created").await;
    next.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut next, "input_1").await), ["listen"]);
    let status = server.status();
    assert_eq!(status["workers"][0]["restarts"], 1);
    assert!(status["workers"][0]["last_error"].as_str().unwrap().contains("step_timeout_ms"));
}

#[tokio::test]
async fn client_disconnect_in_every_state_leaves_every_worker_idle() {
    let server = Server::ready(Setup::default().workers(workers(1, "step_ms = 300")));
    // queued
    let holder = connected(&server, "video").await;
    let mut waiting = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    waiting.expect("session.queued").await;
    waiting.close_socket().await;
    holder.close_socket().await;
    server.wait_idle();
    // connected, before session.init
    connected(&server, "video").await.close_socket().await;
    server.wait_idle();
    // initialising
    let mut c = connected(&server, "video").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    c.close_socket().await;
    server.wait_idle();
    // active, with a step in flight and chunks pending
    let mut c = active(&server, "video").await;
    for _ in 0..3 {
        c.send(append(&loud())).await;
    }
    c.close_socket().await;
    server.wait_idle();
    // chat, mid-answer
    let server_chat = Server::ready(Setup::default().workers(workers(1, "token_ms = 200")));
    let mut c = active(&server_chat, "chat").await;
    c.send(json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": "Reply with exactly: a b c d e f"}]}}))
        .await;
    c.expect("response.output.delta").await;
    drop(c);
    server_chat.wait_idle();
    // and the worker still serves
    let mut c = active(&server, "video").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    assert!(server.status()["workers"][0]["sessions_served"].as_u64().unwrap() >= 4);
}

#[tokio::test]
async fn the_first_estimate_is_the_typical_session_not_the_time_limit() {
    let server = Server::ready(Setup::default().queue("typical_chat_s = 45"));
    let _holder = active(&server, "chat").await;
    let mut c = Client::connect(&server.url("/v1/realtime?mode=chat")).await;
    let queued = c.expect("session.queued").await;
    let eta = queued["estimated_wait_s"].as_f64().unwrap();
    assert!((40.0..=45.0).contains(&eta), "a typical chat session (45 s), not the 600 s limit: {eta}");
    assert!(server.logs().contains("recording is off ([recording] enabled = false)"), "the start says so");
}

#[tokio::test]
async fn a_worker_whose_backend_has_no_vision_serves_no_video() {
    // The reference backend with vision = 0 says so in info(); the configured modes (all
    // three by default) lose video when it opens.
    let server = Server::ready(Setup::default().workers(workers(1, "vision = 0")));
    assert_eq!(server.status()["workers"][0]["modes"], json!(["chat", "audio"]));
    server.wait_log("its backend has no vision, so it serves no video", WAIT);
    let mut v = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    v.expect_error("service_unavailable").await;
    active(&server, "audio").await.close_socket().await;
    server.wait_idle();
}
