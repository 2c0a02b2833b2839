//! The earlier duplex dialect (session.update / input_audio_buffer.append) on the same
//! endpoint, over real sockets.

use crate::common::*;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

fn update(instructions: &str) -> Value {
    json!({"type": "session.update", "session": {"instructions": instructions, "max_slice_nums": 1}})
}

fn legacy_append(audio: &[f32]) -> Value {
    json!({"type": "input_audio_buffer.append", "audio": b64_pcm(audio)})
}

/// Reads until the next listen or audio delta; returns (type, text, samples, end_of_turn).
async fn next_output(c: &mut Client) -> (String, String, usize, bool) {
    loop {
        let v = c.event().await;
        match v["type"].as_str().unwrap() {
            "response.listen" => {
                assert!(v["kv_cache_length"].is_u64(), "{v}");
                return ("listen".into(), String::new(), 0, false);
            }
            "response.output_audio.delta" => {
                assert!(v["kv_cache_length"].is_u64(), "{v}");
                return (
                    "speech".into(),
                    v["text"].as_str().unwrap().to_string(),
                    pcm_of(&v["audio"]).len(),
                    v["end_of_turn"].as_bool().unwrap(),
                );
            }
            "error" => panic!("unexpected error {v}"),
            _ => {}
        }
    }
}

/// A WAV file of `secs` seconds of a tone at `rate` Hz, stereo 16-bit.
fn wav(rate: u32, secs: f32) -> String {
    let spec =
        hound::WavSpec { channels: 2, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut cursor = std::io::Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
        for i in 0..(rate as f32 * secs) as usize {
            let v = (8000.0 * (i as f32 * 0.05).sin()) as i16;
            w.write_sample(v).unwrap();
            w.write_sample(v).unwrap();
        }
        w.finalize().unwrap();
    }
    STANDARD.encode(cursor.into_inner())
}

#[tokio::test]
async fn the_legacy_documents_complete_timeline() {
    let server = Server::ready(Setup::default().queue("update_interval_s = 0.3"));
    // Phase 1: connect and queue behind another client.
    let mut holder = connected(&server, "video").await;
    let mut c = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    assert_eq!(c.expect("session.queued").await["position"], 1);
    assert_eq!(c.expect("session.queue_update").await["position"], 1);
    holder.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    holder.closed().await;
    c.until("session.queue_done").await;

    // Phase 2: init.
    c.send(update("You are a helpful English assistant.")).await;
    let created = c.expect("session.created").await;
    let id = created["session_id"].as_str().unwrap();
    assert!(id.starts_with("rt_") && id[3..].parse::<u64>().is_ok(), "{created}");
    assert_eq!(created["prompt_length"], 6, "six words of instructions");
    assert_eq!(server.status()["workers"][0]["dialect"], "minicpm-legacy", "status names the dialect");

    // Phase 3: full duplex.
    let mut outputs = Vec::new();
    for (i, pcm) in [loud(), quiet(), quiet(), quiet(), quiet()].iter().enumerate() {
        let mut event = legacy_append(pcm);
        event["video_frames"] = json!([jpeg_b64()]);
        c.send(event).await;
        outputs.push(next_output(&mut c).await);
        assert!(i < 5);
    }
    let shape: Vec<(&str, usize, bool)> = outputs.iter().map(|(k, _, n, e)| (k.as_str(), *n, *e)).collect();
    assert_eq!(
        shape,
        vec![
            ("listen", 0, false),
            ("speech", 24000, false),
            ("speech", 24000, false),
            ("speech", 12000, true),
            ("listen", 0, false)
        ]
    );
    assert!(outputs[1].1.starts_with("Reply 1:"), "text rides with its audio: {outputs:?}");

    // Phase 4: close.
    c.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "stopped");
    assert_eq!(c.closed().await, Some(1000));
    server.wait_idle();
}

#[tokio::test]
async fn every_error_row_of_the_legacy_tables() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    // CONNECTED: only session.update is accepted
    c.send(legacy_append(&loud())).await;
    let e = c.expect_error("not_ready").await;
    assert_eq!(e["error"]["type"], "client_error");
    c.send(json!({"type": "session.update", "session": {}})).await;
    assert!(c.expect_error("missing_field").await["error"]["message"].as_str().unwrap().contains("instructions"));
    c.send(json!({"type": "session.update"})).await;
    c.expect_error("missing_field").await;
    c.send(json!({"type": "session.update", "session": {"instructions": "x", "ref_audio": "UklGRgAAAAA="}})).await;
    assert!(c.expect_error("invalid_payload").await["error"]["message"].as_str().unwrap().contains("WAV"));
    c.send(update("You are a test.")).await;
    c.expect("session.created").await;

    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"type": "input.append", "input": {}}), "unknown_event", "input.append"),
        (json!({"type": "input_audio_buffer.append"}), "missing_field", "audio"),
        (json!({"type": "input_audio_buffer.append", "audio": "!!"}), "invalid_payload", "base64"),
        (json!({"type": "input_audio_buffer.append", "audio": "AAAAAAA="}), "invalid_payload", "multiple of 4"),
        (legacy_append(&vec![0.0; 100]), "invalid_payload", "at least 4000"),
        (
            json!({"type": "input_audio_buffer.append", "audio": b64_pcm(&loud()), "video_frames": ["AAAA"]}),
            "invalid_payload",
            "JPEG",
        ),
        (
            json!({"type": "input_audio_buffer.append", "audio": b64_pcm(&loud()), "max_slice_nums": 12}),
            "invalid_payload",
            "1..9",
        ),
        (update("again"), "not_ready", "already"),
    ];
    for (event, code, mentions) in cases {
        c.send(event.clone()).await;
        let e = c.expect_error(code).await;
        assert!(e["error"]["message"].as_str().unwrap().contains(mentions), "{event} -> {e}");
    }
    c.send(legacy_append(&loud())).await;
    assert_eq!(next_output(&mut c).await.0, "listen", "the session goes on");
    c.send_raw(Message::text("{{{")).await;
    assert_eq!(c.closed().await, Some(1003), "invalid JSON closes with 1003");
}

#[tokio::test]
async fn legacy_server_errors_close_with_1013() {
    let server = Server::ready(
        Setup::default().queue("max_waiting = 0").workers("[[workers]]\nname = \"v\"\nmodes = [\"video\"]\n".into()),
    );
    let _holder = connected(&server, "video").await;
    let mut full = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    assert_eq!(full.expect_error("queue_full").await["error"]["type"], "server_error");
    assert_eq!(full.closed().await, Some(1013));
    let mut none = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    none.expect_error("service_unavailable").await;
    assert_eq!(none.closed().await, Some(1013));
}

#[tokio::test]
async fn legacy_session_update_while_queued_is_not_ready() {
    let server = Server::ready(Setup::default());
    let _holder = connected(&server, "video").await;
    let mut c = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    c.expect("session.queued").await;
    c.send(update("too early")).await;
    c.expect_error("not_ready").await;
}

#[tokio::test]
async fn legacy_force_listen_interrupts_speech() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "audio").await;
    c.send(update("You are a test.")).await;
    c.expect("session.created").await;
    c.send(legacy_append(&loud())).await;
    assert_eq!(next_output(&mut c).await.0, "listen");
    c.send(legacy_append(&quiet())).await;
    assert_eq!(next_output(&mut c).await.0, "speech");
    let mut forced = legacy_append(&quiet());
    forced["force_listen"] = json!(true);
    c.send(forced).await;
    assert_eq!(next_output(&mut c).await.0, "listen");
    c.send(legacy_append(&quiet())).await;
    assert_eq!(next_output(&mut c).await.0, "listen", "the turn is over");
}

#[tokio::test]
async fn legacy_silent_drop_keeps_the_newest() {
    let server = Server::ready(Setup::default().workers(workers(1, "step_ms = 200")));
    let mut c = connected(&server, "audio").await;
    c.send(update("You are a test.")).await;
    c.expect("session.created").await;
    for _ in 0..20 {
        c.send(legacy_append(&quiet())).await;
    }
    // Fewer answers than chunks, no error; then the session is still responsive.
    let mut answers = 0;
    loop {
        let v = c.event().await;
        assert_ne!(v["type"], "error", "{v}");
        if v["type"] == "response.listen" {
            answers += 1;
            if answers >= 3 {
                break;
            }
        }
    }
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    let listens = c.seen.iter().filter(|v| v["type"] == "response.listen").count();
    assert!(listens < 20, "chunks were dropped: {listens} answers to 20 chunks");
}

#[tokio::test]
async fn one_server_holds_a_current_and_a_legacy_session_at_once() {
    let server = Server::ready(Setup::default().workers(workers(2, "")));
    let mut current = connected(&server, "video").await;
    let mut legacy = connected(&server, "video").await;
    current.send(json!({"type": "session.init", "payload": {"system_prompt": "one"}})).await;
    legacy.send(update("two")).await;
    assert!(current.expect("session.created").await["session_id"].as_str().unwrap().starts_with("sess_"));
    assert!(legacy.expect("session.created").await["session_id"].as_str().unwrap().starts_with("rt_"));
    let status = server.status();
    let mut dialects: Vec<&str> =
        status["workers"].as_array().unwrap().iter().map(|w| w["dialect"].as_str().unwrap()).collect();
    dialects.sort();
    assert_eq!(dialects, ["minicpm", "minicpm-legacy"]);
    for round in 0..3 {
        let pcm = if round == 0 { loud() } else { quiet() };
        current.send(append(&pcm)).await;
        legacy.send(legacy_append(&pcm)).await;
        let a = answer_to(&mut current, &format!("input_{}", round + 1)).await;
        let b = next_output(&mut legacy).await;
        assert_eq!(a.last().unwrap()["kind"] == "listen", b.0 == "listen", "both sessions behave alike");
    }
    current.send(json!({"type": "session.close"})).await;
    legacy.send(json!({"type": "session.close"})).await;
    assert_eq!(current.until("session.closed").await["reason"], "user_stop");
    assert_eq!(legacy.until("session.closed").await["reason"], "stopped");
}

#[tokio::test]
async fn legacy_reference_audio_is_any_pcm_wav_resampled_to_16k() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    // 2 s of 8 kHz stereo: 32000 samples at 16 kHz, 25 tokens per second in the reference backend.
    c.send(json!({"type": "session.update", "session": {"instructions": "hi", "ref_audio": wav(8000, 2.0)}})).await;
    assert_eq!(c.expect("session.created").await["prompt_length"], 1 + 50);
}

#[tokio::test]
async fn legacy_server_side_ends_use_its_reasons() {
    let server = Server::ready(Setup::default().limits("video_session_s = 1"));
    let mut c = connected(&server, "video").await;
    c.send(update("x")).await;
    c.expect("session.created").await;
    assert_eq!(c.until("session.closed").await, json!({"type": "session.closed", "reason": "timeout"}));

    let server = Server::ready(
        Setup::default().limits("step_timeout_ms = 300").workers(workers(1, "hang_at_step = 1\nhang_ms = 2000")),
    );
    let mut c = connected(&server, "video").await;
    c.send(update("x")).await;
    c.expect("session.created").await;
    c.send(legacy_append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "error");
    assert_eq!(c.closed().await, Some(1011));
}
