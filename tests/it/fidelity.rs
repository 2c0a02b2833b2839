//! Fidelity to the protocol documents over real sockets: generation settings reach the
//! model through the ABI and are echoed; transcripts of the user's speech; Qwen's usage,
//! content parts, defaults, error codes and statuses; chat deltas with ids and metrics,
//! images of any common type, and chat turns that replace the conversation instead of
//! filling the context.

use crate::common::*;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

async fn qwen(server: &Server) -> (Client, Value) {
    let mut c = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    let created = c.expect("session.created").await;
    (c, created)
}

fn manual_text(text: &str) -> Value {
    json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": text}]}})
}

/// Events until `response.done` (errors included), and the done event.
async fn until_done(c: &mut Client) -> (Vec<Value>, Value) {
    let mut seen = Vec::new();
    loop {
        let v = c.event().await;
        if v["type"] == "response.done" {
            return (seen, v);
        }
        seen.push(v);
    }
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|v| v["type"] == kind).collect()
}

#[tokio::test]
async fn duplex_config_settings_reach_the_model_and_are_echoed() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "audio").await;
    let config = json!({"length_penalty": 1.1, "top_p": 0.8, "top_k": 20, "listen_prob_scale": 1.0,
                        "decode_mode": "sampling", "text_repetition_penalty": 1.05});
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "Hi.", "config": config}})).await;
    let created = c.expect("session.created").await;
    assert_eq!(created["config"], config, "session.created echoes the configuration");
    // The reference backend applies top_p and top_k; the others it does not know.
    assert_eq!(
        created["unsupported_settings"],
        json!(["decode_mode", "listen_prob_scale", "text_repetition_penalty"]),
        "{created}"
    );
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await;
    let deltas = answer_to(&mut c, "input_2").await;
    let text = deltas.iter().find(|d| d["kind"] == "text").expect("a text delta");
    assert_eq!(
        text["text"], "Reply 1: I heard 1.0 seconds of speech [top_k=20 top_p=0.8].",
        "the model says which settings it holds"
    );
}

#[tokio::test]
async fn out_of_range_settings_are_refused_with_the_field() {
    let server = Server::ready(Setup::default());
    let mut c = connected(&server, "video").await;
    for (config, field) in [
        (json!({"top_p": 1.5}), "payload.config.top_p"),
        (json!({"top_k": -1}), "payload.config.top_k"),
        (json!({"decode_mode": "beam"}), "payload.config.decode_mode"),
        (json!({"temperature": 9}), "payload.config.temperature"),
        (json!({"max_new_tokens": 0}), "payload.config.max_new_tokens"),
        (json!({"length_penalty": "long"}), "payload.config.length_penalty"),
        (json!({"my_knob": {"nested": true}}), "payload.config.my_knob"),
    ] {
        c.send(json!({"type": "session.init", "payload": {"config": config}})).await;
        let e = c.expect_error("invalid_payload").await;
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{config}: {message}");
    }
    // The session can still be initialised.
    c.send(json!({"type": "session.init", "payload": {"config": {"top_k": 5}}})).await;
    let created = c.expect("session.created").await;
    assert_eq!(created["unsupported_settings"], json!([]));
}

#[tokio::test]
async fn chat_deltas_carry_input_id_and_metrics_and_images_of_any_common_type() {
    let server = Server::ready(Setup::default());
    let mut c = active(&server, "chat").await;
    let webp = STANDARD.encode(b"RIFF\x24\x00\x00\x00WEBPVP8 \x18\x00\x00\x00");
    let gif = STANDARD.encode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;");
    let bmp = STANDARD.encode(b"BM\x3a\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00");
    let content = json!([{"type": "text", "text": ""}, {"type": "image", "data": webp},
                         {"type": "image", "data": gif}, {"type": "image", "data": bmp}]);
    c.send(json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": content}]}})).await;
    let delta = c.until("response.output.delta").await;
    assert_eq!(delta["input_id"], "input_1");
    assert!(delta["metrics"]["kv_cache_length"].as_u64().unwrap() > 0, "{delta}");
    assert!(delta["metrics"]["generate_ms"].is_number(), "{delta}");
    let done = c.until("response.done").await;
    assert_eq!(done["text"], "I received 0.0 seconds of audio and 3 images.");
    let text = json!([{"type": "image", "data": STANDARD.encode(b"not an image at all")}]);
    c.send(json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": text}]}})).await;
    let e = c.expect_error("invalid_payload").await;
    assert_eq!(e["error"]["message"], "input.messages[0].content[0].data: not a JPEG, PNG, WebP, GIF or BMP image");
}

/// Sends a growing conversation, as an application that resends its history does; returns
/// the kv_cache_length of each answer.
async fn resend_history(c: &mut Client, turns: usize) -> Vec<u64> {
    let mut messages = vec![json!({"role": "system", "content": "You count words."})];
    let mut lengths = Vec::new();
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("This is turn number {turn} of a long chat.")}));
        c.send(json!({"type": "input.append", "input": {"messages": messages, "streaming": false}})).await;
        let done = c.until("response.done").await;
        assert_eq!(done["reason"], "turn_end", "{done}");
        lengths.push(done["metrics"]["kv_cache_length"].as_u64().unwrap());
        messages.push(json!({"role": "assistant", "content": done["text"]}));
    }
    lengths
}

#[tokio::test]
async fn chat_turns_replace_the_conversation_and_kv_follows_its_length() {
    // 200 tokens of context: a history appended turn after turn would fill it by turn 5;
    // the conversation itself reaches 144 tokens by turn 8.
    let server = Server::ready(Setup::default().workers(workers(1, "n_ctx = 200")));
    let mut c = active(&server, "chat").await;
    let lengths = resend_history(&mut c, 8).await;
    // Each turn's context is the conversation so far: it grows by one question and one
    // answer (17 tokens), not by the whole history again.
    let steps: Vec<u64> = lengths.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(steps.iter().all(|&s| s == 17), "kv per turn {lengths:?}");
    c.send(json!({"type": "session.close"})).await;
    assert_eq!(c.until("session.closed").await["reason"], "user_stop");
}

#[tokio::test]
async fn a_1_0_backend_is_prepared_again_for_each_replacing_turn() {
    // revision = 0: the reference backend behaves as an ABI 1.0 backend, which appends
    // whatever it is given; the gateway starts each turn from a fresh session instead.
    let server = Server::ready(Setup::default().workers(workers(1, "n_ctx = 200\nrevision = 0")));
    let mut c = active(&server, "chat").await;
    let lengths = resend_history(&mut c, 8).await;
    let steps: Vec<u64> = lengths.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(steps.iter().all(|&s| s == 17), "kv per turn {lengths:?}");
}

#[tokio::test]
async fn qwen_vad_turn_transcribes_the_user_and_counts_text_and_audio() {
    let server = Server::ready(Setup::default());
    let (mut c, created) = qwen(&server).await;
    let s = &created["session"];
    assert_eq!(s["input_audio_transcription"], json!({"model": "gummy-realtime-v1"}));
    assert_eq!((s["enable_search"].clone(), s["search_options"].clone()), (json!(false), json!({})));
    assert_eq!(s["turn_detection"]["silence_duration_ms"], 800);
    assert_eq!(s["temperature"].to_string(), "0.8");
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.0)})).await;
    let (events, done) = until_done(&mut c).await;
    assert!(of_type(&events, "error").is_empty(), "{events:?}");
    // The item is added when the speech stops (800 ms of silence), before the model answers:
    // its transcript comes with the answer.
    let created_item = of_type(&events, "conversation.item.created")[0];
    let item_id = created_item["item"]["id"].clone();
    assert_eq!(created_item["item"]["content"][0]["transcript"], Value::Null);
    assert_eq!(of_type(&events, "input_audio_buffer.speech_stopped")[0]["audio_end_ms"], 1000);
    let completed = of_type(&events, "conversation.item.input_audio_transcription.completed");
    assert_eq!(completed.len(), 1, "{events:?}");
    assert_eq!(
        (completed[0]["item_id"].clone(), completed[0]["content_index"].clone(), completed[0]["transcript"].clone()),
        (item_id, json!(0), json!("(1.0 seconds of speech)"))
    );
    // Content parts show `text`; response.done keeps `transcript`.
    let part = &of_type(&events, "response.content_part.done")[0]["part"];
    assert_eq!(part["type"], "audio");
    assert!(part["text"].as_str().unwrap().starts_with("Reply 1"), "{part}");
    let item = &of_type(&events, "response.output_item.done")[0]["item"];
    assert!(item["content"][0]["text"].is_string() && item["content"][0].get("transcript").is_none(), "{item}");
    assert!(done["response"]["output"][0]["content"][0]["transcript"].is_string(), "{done}");
    // Usage in Qwen's spelling, audio counted as audio: 25 tokens per second heard.
    let usage = &done["response"]["usage"];
    let input = &usage["input_tokens_details"];
    // 25 per second of the steps the answer spans (one step per second of input).
    assert!(input["audio_tokens"].as_u64().unwrap() >= 25, "{usage}");
    assert_eq!(input["audio_tokens"].as_u64().unwrap() % 25, 0, "{usage}");
    assert_eq!(
        input["text_tokens"].as_u64().unwrap() + input["audio_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap()
    );
    let output = &usage["output_tokens_details"];
    assert!(output["audio_tokens"].as_u64().unwrap() > 0 && output["text_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        output["text_tokens"].as_u64().unwrap() + output["audio_tokens"].as_u64().unwrap(),
        usage["output_tokens"].as_u64().unwrap()
    );
    assert!(usage.get("input_token_details").is_none(), "the OpenAI spelling is not Qwen's: {usage}");
}

#[tokio::test]
async fn qwen_manual_turn_transcript_settings_and_refusals() {
    let server = Server::ready(Setup::default());
    let (mut c, _) = qwen(&server).await;
    c.send(json!({"type": "session.update", "session": {"turn_detection": null, "top_k": 20, "seed": 7,
        "presence_penalty": 0.5, "enable_search": true, "search_options": {"enable_source": true}}}))
        .await;
    let updated = c.expect("session.updated").await;
    assert_eq!(
        (updated["session"]["top_k"].clone(), updated["session"]["enable_search"].clone()),
        (json!(20), json!(true))
    );
    assert_eq!(updated["session"]["search_options"], json!({"enable_source": true}));
    // The model applies top_k, seed and presence_penalty; search it cannot do.
    let mut unsupported = Vec::new();
    for _ in 0..2 {
        let e = c.expect("error").await;
        assert_eq!(e["error"]["code"], "unsupported_setting", "{e}");
        unsupported.push(e["error"]["param"].as_str().unwrap().to_string());
    }
    assert_eq!(unsupported, ["session.enable_search", "session.search_options"]);
    c.send(manual_text("What are your settings?")).await;
    c.send(json!({"type": "response.create"})).await;
    let (_, done) = until_done(&mut c).await;
    assert_eq!(
        done["response"]["output"][0]["content"][0]["transcript"], "My settings: presence_penalty=0.5 seed=7 top_k=20.",
        "the settings reached the model through the ABI"
    );
    // Audio committed: its transcript arrives with the answer.
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(2.0, 16000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.commit"})).await;
    let committed = c.expect("input_audio_buffer.committed").await;
    c.send(json!({"type": "response.create"})).await;
    let (events, done) = until_done(&mut c).await;
    let completed = of_type(&events, "conversation.item.input_audio_transcription.completed");
    assert_eq!(completed.len(), 1, "{events:?}");
    assert_eq!(completed[0]["item_id"], committed["item_id"]);
    assert_eq!(completed[0]["transcript"], "(2.0 seconds of speech)");
    assert_eq!(done["response"]["usage"]["input_tokens_details"]["audio_tokens"], 50);
    // Refusals in Qwen's words.
    c.send(json!({"type": "session.update", "session": {"modalities": ["audio"]}})).await;
    let e = c.expect("error").await;
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["param"].as_str()),
        (Some("invalid_value"), Some("session.modalities"))
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("Supported combinations are: ['text'] and ['audio', 'text']")
    );
    c.send(json!({"type": "session.update", "session": {"top_p": 0}})).await;
    let e = c.expect("error").await;
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["param"].as_str()),
        (Some("invalid_value"), Some("session.top_p"))
    );
}

#[tokio::test]
async fn qwen_cancelled_response_is_incomplete() {
    let server = Server::ready(Setup::default().workers(workers(1, "token_ms = 200")));
    let (mut c, _) = qwen(&server).await;
    c.send(json!({"type": "session.update", "session": {"turn_detection": null}})).await;
    c.expect("session.updated").await;
    c.send(manual_text("Reply with exactly: one two three four five six seven eight")).await;
    c.send(json!({"type": "response.create"})).await;
    c.until("response.audio_transcript.delta").await;
    c.send(json!({"type": "response.cancel"})).await;
    let done = c.until("response.done").await;
    assert_eq!(done["response"]["status"], "incomplete");
    assert_eq!(done["response"]["status_details"]["reason"], "client_cancelled");
}

#[tokio::test]
async fn a_model_without_transcripts_says_so_per_item() {
    let server = Server::ready(Setup::default().workers(workers(1, "revision = 0")));
    let (mut c, _) = qwen(&server).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.0)})).await;
    let (events, done) = until_done(&mut c).await;
    let failed = of_type(&events, "conversation.item.input_audio_transcription.failed");
    assert_eq!(failed.len(), 1, "{events:?}");
    assert_eq!(failed[0]["error"]["code"], "transcription_unavailable");
    assert_eq!(failed[0]["error"]["param"], "session.input_audio_transcription");
    assert_eq!(failed[0]["item_id"], of_type(&events, "conversation.item.created")[0]["item"]["id"]);
    // Without the model's counts, 25 tokens per second of audio heard, within the input.
    let usage = &done["response"]["usage"];
    let audio = usage["input_tokens_details"]["audio_tokens"].as_u64().unwrap();
    assert!(audio >= 25 && audio <= usage["input_tokens"].as_u64().unwrap(), "{usage}");
}

#[tokio::test]
async fn openai_transcription_is_off_until_asked_for() {
    let server = Server::ready(Setup::default());
    let mut c = Client::connect(&server.url("/v1/realtime?model=omni")).await;
    let created = c.expect("session.created").await;
    assert_eq!(created["session"]["audio"]["input"]["transcription"], Value::Null);
    let audio = pcm16(1.0, 24000, 0.3);
    c.send(json!({"type": "input_audio_buffer.append", "audio": audio})).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 24000, 0.0)})).await;
    let (events, done) = until_done(&mut c).await;
    assert!(of_type(&events, "conversation.item.input_audio_transcription.completed").is_empty());
    assert_eq!(of_type(&events, "conversation.item.added")[0]["item"]["content"][0]["transcript"], Value::Null);
    let usage = &done["response"]["usage"];
    assert!(usage["input_token_details"]["cached_tokens"].is_number(), "OpenAI's spelling: {usage}");
    c.send(json!({"type": "session.update", "session": {"type": "realtime",
        "audio": {"input": {"transcription": {"model": "whisper-1"}}}}}))
        .await;
    let updated = c.until("session.updated").await;
    assert_eq!(updated["session"]["audio"]["input"]["transcription"], json!({"model": "whisper-1"}));
    c.send(json!({"type": "input_audio_buffer.append", "audio": audio})).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 24000, 0.0)})).await;
    let (events, _) = until_done(&mut c).await;
    let completed = of_type(&events, "conversation.item.input_audio_transcription.completed");
    assert_eq!(completed.len(), 1, "{events:?}");
}
