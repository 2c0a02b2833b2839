//! The OpenAI / Qwen-compatible dialect over real sockets: event sequences of a manual
//! turn, a server-VAD turn, barge-in, cancel, image before audio, finish; endpoint and
//! model selection; browser authentication.

use crate::common::*;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

async fn openai(server: &Server, beta: bool) -> Client {
    let mut req = server.url("/v1/realtime?model=omni").into_client_request().unwrap();
    if beta {
        req.headers_mut().insert("OpenAI-Beta", "realtime=v1".parse().unwrap());
    }
    let (ws, _) = tokio_tungstenite::connect_async(req).await.expect("connect");
    let mut c = Client::from_stream(ws);
    let created = c.expect("session.created").await;
    assert!(created["session"]["id"].as_str().unwrap().starts_with("sess_"));
    c
}

async fn qwen(server: &Server) -> Client {
    let mut c = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    c.expect("session.created").await;
    c
}

/// Reads events until `response.done`; returns their types and the done event.
async fn until_done(c: &mut Client) -> (Vec<String>, Value) {
    let mut types = Vec::new();
    loop {
        let v = c.event().await;
        let t = v["type"].as_str().unwrap().to_string();
        assert_ne!(t, "error", "{v}");
        types.push(t.clone());
        if t == "response.done" {
            return (types, v);
        }
    }
}

fn sub<'a>(types: &'a [String], wanted: &[&str]) -> Vec<&'a str> {
    types.iter().map(String::as_str).filter(|t| wanted.contains(t)).collect()
}

#[tokio::test]
async fn ga_manual_turn_event_sequence() {
    let server = Server::ready(Setup::default());
    let mut c = openai(&server, false).await;
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
        "audio": {"input": {"turn_detection": null}, "output": {"voice": "marin"}}}}))
        .await;
    let updated = c.expect("session.updated").await;
    assert_eq!(updated["session"]["audio"]["input"]["turn_detection"], Value::Null);
    assert_eq!(updated["session"]["audio"]["output"]["voice"], "marin");
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 24000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.commit"})).await;
    let committed = c.expect("input_audio_buffer.committed").await;
    let user_item = c.expect("conversation.item.added").await;
    assert_eq!(user_item["item"]["id"], committed["item_id"]);
    assert_eq!(user_item["item"]["role"], "user");
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: from text"}]}}))
        .await;
    c.expect("conversation.item.added").await;
    c.send(json!({"type": "response.create"})).await;
    let (types, done) = until_done(&mut c).await;
    assert_eq!(
        sub(
            &types,
            &[
                "response.created",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.done"
            ]
        ),
        [
            "response.created",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_audio.done",
            "response.output_audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.done"
        ]
    );
    assert!(types.contains(&"response.output_audio.delta".to_string()));
    assert_eq!(done["response"]["status"], "completed");
    assert_eq!(
        done["response"]["output"][0]["content"][0]["transcript"], "from text",
        "the last user message is answered"
    );
    assert!(done["response"]["usage"]["total_tokens"].as_u64().unwrap() > 0, "token usage from the backend");
}

#[tokio::test]
async fn beta_vad_turn_event_sequence_with_pcm16_at_24k() {
    let server = Server::ready(Setup::default());
    let mut c = openai(&server, true).await;
    // 1.5 s of speech in 100 ms appends, then the client stops sending.
    let speech = STANDARD.decode(pcm16(1.5, 24000, 0.3)).unwrap();
    for piece in speech.chunks(4800) {
        c.send(json!({"type": "input_audio_buffer.append", "audio": STANDARD.encode(piece)})).await;
    }
    let (types, done) = until_done(&mut c).await;
    let order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.audio.done",
        "response.audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ];
    assert_eq!(sub(&types, &order), order, "{types:?}");
    let audio: usize = c
        .seen
        .iter()
        .filter(|e| e["type"] == "response.audio.delta")
        .map(|e| STANDARD.decode(e["delta"].as_str().unwrap()).unwrap().len() / 2)
        .sum();
    assert_eq!(audio, 60000, "pcm16 at 24 kHz: the model's 2.5 s, steps paced by the server");
    assert_eq!(done["response"]["status"], "completed");
    assert!(c.seen.iter().any(|e| e["type"] == "conversation.item.created"), "beta names");
}

#[tokio::test]
async fn barge_in_cancels_the_response_and_force_listens() {
    let server = Server::ready(Setup::default().workers(workers(1, "step_ms = 300")));
    let mut c = openai(&server, false).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.5, 24000, 0.3)})).await;
    c.until("response.created").await;
    let response_id = c.until("response.output_audio.delta").await["response_id"].clone();
    // The user speaks while the model does.
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(0.5, 24000, 0.3)})).await;
    let done = c.until("response.done").await;
    assert_eq!(done["response"]["status"], "cancelled");
    assert_eq!(done["response"]["status_details"]["reason"], "turn_detected");
    assert_eq!(done["response"]["id"], response_id);
    let finished = c.seen.len() - 1;
    assert_eq!(c.event().await["type"], "input_audio_buffer.speech_started", "then the user's new turn starts");
    // Nothing more of the cancelled response arrives; the next one is a new response.
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 24000, 0.3)})).await;
    let next = c.until("response.created").await;
    assert_ne!(next["response"]["id"], response_id);
    let after: Vec<&Value> = c.seen[finished + 1..].iter().filter(|e| e["response_id"] == response_id).collect();
    assert!(after.is_empty(), "deltas of the cancelled response after its done: {after:?}");
}

#[tokio::test]
async fn response_cancel_in_a_manual_turn() {
    let server = Server::ready(Setup::default().workers(workers(1, "token_ms = 200")));
    let mut c = openai(&server, true).await;
    c.send(json!({"type": "session.update", "session": {"turn_detection": null}})).await;
    c.expect("session.updated").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: one two three four five six seven eight"}]}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    c.until("response.audio_transcript.delta").await;
    c.send(json!({"type": "response.cancel"})).await;
    let done = c.until("response.done").await;
    assert_eq!(done["response"]["status"], "cancelled");
    c.send(json!({"type": "response.cancel"})).await;
    let e = c.until("error").await;
    assert_eq!(e["error"]["code"], "response_cancel_not_active", "nothing to cancel: {e}");
    // The session goes on.
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: again"}]}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    let done = c.until("response.done").await;
    assert_eq!(
        (done["response"]["status"].as_str(), done["response"]["output"][0]["content"][0]["transcript"].as_str()),
        (Some("completed"), Some("again"))
    );
}

#[tokio::test]
async fn qwen_image_before_audio_is_an_error_and_finish_ends_the_session() {
    let server = Server::ready(Setup::default());
    let mut c = qwen(&server).await;
    c.send(json!({"type": "input_image_buffer.append", "image": jpeg_b64(), "event_id": "client_7"})).await;
    let e = c.expect("error").await;
    assert_eq!(e["error"]["event_id"], "client_7");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(e["error"]["message"].as_str().unwrap().contains("audio before"), "{e}");
    assert!(e["event_id"].as_str().unwrap().starts_with("event_"));
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(0.5, 16000, 0.0)})).await;
    c.send(json!({"type": "input_image_buffer.append", "image": jpeg_b64()})).await;
    c.send(json!({"type": "session.finish"})).await;
    c.expect("session.finished").await;
    assert_eq!(c.closed().await, Some(1000));
    server.wait_idle();
}

#[tokio::test]
async fn qwen_vad_turn_with_16k_input() {
    let server = Server::ready(Setup::default());
    let mut c = qwen(&server).await;
    c.send(json!({"type": "session.update", "session": {"modalities": ["text", "audio"], "voice": "Cherry",
        "input_audio_format": "pcm16", "output_audio_format": "pcm16", "turn_detection": {"type": "server_vad", "threshold": 0.2}}}))
        .await;
    c.expect("session.updated").await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.5, 16000, 0.3)})).await;
    let (types, done) = until_done(&mut c).await;
    assert!(types.contains(&"response.audio_transcript.delta".to_string()));
    assert_eq!(done["response"]["status"], "completed");
    assert!(done["response"]["id"].as_str().unwrap().starts_with("resp_"));
}

/// The documents' own example, `seed: -1` (no fixed seed), is accepted by the reference backend
/// (which refuses negative seeds): the session is confirmed and answers, with no error.
#[tokio::test]
async fn qwen_seed_minus_one_is_no_fixed_seed_and_the_session_answers() {
    let server = Server::ready(Setup::default());
    let mut c = qwen(&server).await;
    c.send(json!({"type": "session.update", "session": {"seed": -1, "top_k": 50,
        "turn_detection": {"type": "server_vad", "threshold": 0.2}, "input_audio_format": "pcm16"}}))
        .await;
    let updated = c.expect("session.updated").await;
    assert_eq!((updated["session"]["seed"].clone(), updated["session"]["top_p"].clone()), (json!(-1), json!(1.0)));
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.5, 16000, 0.3)})).await;
    let (types, done) = until_done(&mut c).await;
    assert!(!types.contains(&"error".to_string()), "{types:?}");
    assert_eq!(done["response"]["status"], "completed");
}

#[tokio::test]
async fn text_only_modality_sends_text_deltas() {
    let server = Server::ready(Setup::default());
    let mut c = openai(&server, false).await;
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
        "audio": {"input": {"turn_detection": null}}}}))
        .await;
    c.expect("session.updated").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: just text"}]}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    let (types, done) = until_done(&mut c).await;
    assert!(types.contains(&"response.output_text.delta".to_string()), "{types:?}");
    assert!(!types.iter().any(|t| t.contains("audio")), "no audio events: {types:?}");
    assert_eq!(done["response"]["output"][0]["content"][0]["text"], "just text");
}

#[tokio::test]
async fn an_unknown_model_is_model_not_found_and_close_1008() {
    let server = Server::ready(Setup::default().extra("[[models]]\nname = \"omni\"\n"));
    let mut c = Client::connect(&server.url("/v1/realtime?model=gpt-4o-realtime")).await;
    let e = c.expect("error").await;
    assert_eq!(e["error"]["code"], "model_not_found");
    assert!(e["error"]["message"].as_str().unwrap().contains("known: omni"));
    assert_eq!(c.closed().await, Some(1008));
    openai(&server, false).await; // the listed model works
}

#[tokio::test]
async fn browsers_authenticate_with_a_subprotocol_and_get_realtime_selected() {
    let server = Server::ready(Setup::default().auth("api_keys = [\"browser-key-0123456789\"]"));
    let mut req = server.url("/v1/realtime?model=omni").into_client_request().unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "realtime, openai-insecure-api-key.browser-key-0123456789, openai-beta.realtime-v1".parse().unwrap(),
    );
    let (ws, response) = tokio_tungstenite::connect_async(req).await.expect("authenticated by subprotocol");
    assert_eq!(response.headers().get("sec-websocket-protocol").unwrap(), "realtime");
    let mut c = Client::from_stream(ws);
    assert_eq!(c.expect("session.created").await["session"]["object"], "realtime.session");
    assert!(c.seen[0]["session"].get("modalities").is_some(), "the beta subprotocol selects beta names");

    let mut wrong = server.url("/v1/realtime?model=omni").into_client_request().unwrap();
    wrong.headers_mut().insert("Sec-WebSocket-Protocol", "realtime, openai-insecure-api-key.nope".parse().unwrap());
    match tokio_tungstenite::connect_async(wrong).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 401),
        other => panic!("expected 401, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn a_waiting_openai_client_hears_only_queue_events_until_created() {
    let server = Server::ready(Setup::default());
    let holder = openai(&server, false).await;
    let mut req = server.url("/v1/realtime?model=omni").into_client_request().unwrap();
    req.headers_mut().insert("Authorization", "Bearer anything".parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let mut c = Client::from_stream(ws);
    assert_eq!(c.expect("session.queued").await["position"], 1);
    // Sent while waiting: applied, answered once the session exists.
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "instructions": "queued config"}})).await;
    holder.close_socket().await;
    c.expect("session.created").await;
    assert_eq!(c.expect("session.updated").await["session"]["instructions"], "queued config");
}

#[tokio::test]
async fn errors_have_the_openai_shape() {
    let server = Server::ready(Setup::default());
    let mut c = openai(&server, false).await;
    for (event, code) in [
        (json!({"type": "input_audio_buffer.append", "audio": "%%%"}), "invalid_value"),
        (json!({"type": "input_audio_buffer.append"}), "missing_required_parameter"),
        (
            json!({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/flac"}}}}}),
            "invalid_value",
        ),
        (json!({"type": "response.fly"}), "unknown_event"),
    ] {
        c.send(event.clone()).await;
        let e = c.expect("error").await;
        assert_eq!(e["error"]["code"], code, "{event}");
        assert!(e["error"].get("param").is_some() && e["error"]["message"].is_string());
    }
}

/// A setting the backend refuses on a reconfigure (the reference backend allows `top_k` up to
/// `max_top_k`): one error, no `session.updated`, and the session goes on answering with the
/// configuration it had, which the next `session.updated` shows.
#[tokio::test]
async fn a_reconfigure_the_backend_refuses_keeps_the_previous_configuration() {
    let server = Server::ready(Setup::default().workers(workers(1, "max_top_k = 20")));
    let mut c = qwen(&server).await;
    c.send(json!({"type": "session.update", "session": {"top_k": 10, "input_audio_format": "pcm16",
        "turn_detection": {"type": "server_vad", "threshold": 0.2}}}))
        .await;
    assert_eq!(c.expect("session.updated").await["session"]["top_k"], 10);
    c.send(json!({"type": "session.update", "session": {"top_k": 50, "instructions": "Be verbose."}})).await;
    let e = c.event().await;
    assert_eq!(e["type"], "error", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("top_k"), "{e}");
    // It still answers, and nothing else comes first: no session.updated, no second error.
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.5, 16000, 0.3)})).await;
    let (types, done) = until_done(&mut c).await;
    assert!(!types.iter().any(|t| t == "session.updated"), "{types:?}");
    assert_eq!(done["response"]["status"], "completed");
    // The reference backend names the settings it holds in its reply's first text.
    let text = done["response"]["output"][0]["content"][0]["transcript"].as_str().unwrap().to_string();
    assert!(text.contains("top_k=10"), "{text}");
    c.send(json!({"type": "session.update", "session": {}})).await;
    let shown = c.expect("session.updated").await;
    assert_eq!((shown["session"]["top_k"].clone(), shown["session"]["instructions"].clone()), (json!(10), json!("")));
}

/// A backend that decides on every chunk names its preferred chunk (ABI 1.2 `step_samples`):
/// audio is gathered into 200 ms steps, so the quiet after a short utterance reaches it at once,
/// not with the next full second.
#[tokio::test]
async fn audio_is_stepped_in_the_chunk_the_backend_prefers() {
    let server = Server::ready(Setup::default().workers(workers(1, "chunk_ms = 200\nreply_steps = 1")));
    let mut c = openai(&server, true).await;
    let at_24k = |samples: &[f32]| -> Vec<f32> { (0..samples.len() * 3 / 2).map(|i| samples[i * 2 / 3]).collect() };
    // 0.6 s of speech, then 0.4 s of quiet.
    let speech: Vec<f32> = loud().into_iter().take(9600).collect();
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(&at_24k(&speech))})).await;
    c.until("input_audio_buffer.speech_started").await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(&at_24k(&[0.0; 6400]))})).await;
    // The backend answered a step of at most the 0.4 s of quiet (25 audio tokens a second),
    // not a padded second (25 tokens).
    let (_, done) = until_done(&mut c).await;
    assert_eq!(done["response"]["status"], "completed", "{done}");
    let audio = done["response"]["usage"]["input_token_details"]["audio_tokens"].as_u64().unwrap();
    assert!((1..=10).contains(&audio), "{done}");
}

/// G.711 at 8 kHz both ways, μ-law in the beta names and A-law in GA's: the caller's tone is
/// heard as speech and the model's 2.5 s answer comes back as a byte a sample.
#[tokio::test]
async fn g711_sessions_hear_and_speak_at_8_khz() {
    use audio_codec_algorithms::{decode_alaw, decode_ulaw, encode_alaw, encode_ulaw};
    let server = Server::ready(Setup::default().recording("enabled = true"));
    type Law = (fn(i16) -> u8, fn(u8) -> i16);
    let (ulaw, alaw): (Law, Law) = ((encode_ulaw, decode_ulaw), (encode_alaw, decode_alaw));
    for (beta, update, law) in [
        (true, json!({"input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw"}), ulaw),
        (
            false,
            json!({"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcma"}},
                   "output": {"format": {"type": "audio/pcma"}}}}),
            alaw,
        ),
    ] {
        let mut c = openai(&server, beta).await;
        c.send(json!({"type": "session.update", "session": update})).await;
        let updated = c.expect("session.updated").await;
        if beta {
            assert_eq!(updated["session"]["output_audio_format"], "g711_ulaw", "{updated}");
        } else {
            assert_eq!(updated["session"]["audio"]["output"]["format"]["type"], "audio/pcma", "{updated}");
        }
        // 1.5 s of a tone at 8 kHz, in 100 ms appends, then nothing: server VAD ends the turn.
        let tone: Vec<u8> = (0..12000)
            .map(|i| (law.0)(((i as f32 * 220.0 * std::f32::consts::TAU / 8000.0).sin() * 9000.0) as i16))
            .collect();
        for piece in tone.chunks(800) {
            c.send(json!({"type": "input_audio_buffer.append", "audio": STANDARD.encode(piece)})).await;
        }
        let (_, done) = until_done(&mut c).await;
        assert_eq!(done["response"]["status"], "completed", "{done}");
        let kind = if beta { "response.audio.delta" } else { "response.output_audio.delta" };
        let voice: Vec<u8> = c
            .seen
            .iter()
            .filter(|e| e["type"] == kind)
            .flat_map(|e| STANDARD.decode(e["delta"].as_str().unwrap()).unwrap())
            .collect();
        assert!((19_800..=20_200).contains(&voice.len()), "2.5 s at 8 kHz, a byte a sample: {}", voice.len());
        let loud = voice.iter().map(|&b| (law.1)(b).unsigned_abs()).max().unwrap();
        assert!(loud > 1000, "the model's voice, not silence: peak {loud}");
        let session_id = c.seen[0]["session"]["id"].as_str().unwrap().to_string();
        c.close_socket().await;
        server.wait_idle();
        // The recording reads the G.711 it sent: the model's 2.5 s, at 24 kHz.
        let wav = hound::WavReader::open(server.recording(&session_id).join("output.wav")).unwrap();
        let seconds = wav.duration() as f64 / wav.spec().sample_rate as f64;
        assert!((2.4..2.6).contains(&seconds), "output.wav holds {seconds} s");
    }
}

/// The gateway checks a model's call before the client hears of it: the reference backend
/// calls a tool whose name the user said with `{}`; where the tool's schema requires a
/// property, the client gets one `invalid_tool_arguments` error and no call, and a call the
/// schema takes goes out whole. (A tool not given, `tool_not_found`: `conversation::calls`'s
/// and `conversation::tests`' unit tests.)
#[tokio::test]
async fn a_call_its_schema_refuses_is_one_error_and_never_reaches_the_client() {
    let server = Server::ready(Setup::default());
    let mut c = openai(&server, false).await;
    let weather = json!({"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "tools": [weather],
        "turn_detection": null}}))
        .await;
    c.until("session.updated").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "What is the weather?"}]}}))
        .await;
    c.send(json!({"type": "response.create", "response": {"output_modalities": ["text"]}})).await;
    let mut errors = Vec::new();
    let done = loop {
        let v = c.event().await;
        match v["type"].as_str() {
            Some("error") => errors.push(v),
            Some("response.function_call_arguments.done" | "response.function_call_arguments.delta") => {
                panic!("a refused call reached the client: {v}")
            }
            Some("response.done") => break v,
            _ => {}
        }
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["error"]["code"], "invalid_tool_arguments", "{}", errors[0]);
    assert!(errors[0]["error"]["message"].as_str().unwrap().contains("city"), "{}", errors[0]);
    assert!(done["response"]["output"].as_array().unwrap().is_empty(), "{done}");
    assert_eq!(server.metric("omni_function_calls_refused_total{code=\"invalid_tool_arguments\"}"), 1.0);
    // A tool whose parameters take `{}`: its call goes out.
    let time = json!({"type": "function", "name": "get_time", "description": "The time now",
        "parameters": {"type": "object", "properties": {}}});
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "What time is it?"}]}}))
        .await;
    c.send(json!({"type": "response.create", "response": {"output_modalities": ["text"], "tools": [time]}})).await;
    let call = c.until("response.function_call_arguments.done").await;
    assert_eq!((call["name"].as_str(), call["arguments"].as_str()), (Some("get_time"), Some("{}")), "{call}");
    c.until("response.done").await;
}
