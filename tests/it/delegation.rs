//! Delegation (`[delegation]`): a voice that calls no tools (a MiniCPM-o worker, here the mock of
//! its protocol) gets the session's tools from a decider beside it, a chat-completions server (a
//! fake of the API, in-process). Real sockets throughout: an OpenAI client speaks espeak-ng
//! speech, the gateway's Whisper transcribes it, the decider decides, the client runs the tool,
//! and the voice is prepared again with the result and speaks from it.

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

fn weather_tool() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])
}

/// A gateway in front of `workers` with Whisper and the decider at `decider`.
fn gateway(workers: &[&MockWorker], decider: &FakeDecider, extra: &str) -> Server {
    let entries: String = workers.iter().enumerate().map(|(i, w)| w.entry(&format!("gpu{i}"), "")).collect();
    gateway_of(entries, decider, extra)
}

fn gateway_of(entries: String, decider: &FakeDecider, extra: &str) -> Server {
    Server::ready(Setup::default().workers(entries).limits("max_pending_chunks = 100").extra(&format!(
        "{}{}",
        transcription_section(),
        decider.section(extra)
    )))
}

/// An OpenAI client under server VAD with the weather tool, its audio at 16 kHz.
async fn agent(server: &Server, instructions: &str) -> Client {
    let mut c = Client::connect(&server.url("/v1/realtime?model=omni")).await;
    c.expect("session.created").await;
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "instructions": instructions,
        "tools": weather_tool(), "tool_choice": "auto",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                            "turn_detection": {"type": "server_vad"}}}}}))
        .await;
    c.until("session.updated").await;
    c
}

/// `words` spoken, with silence around them (the mock worker steps each second at once).
async fn say(c: &mut Client, words: &str) {
    let mut audio = vec![0.0; 8000];
    audio.extend(speech(words));
    audio.extend(vec![0.0; 24000]);
    for piece in audio.chunks(3200) {
        c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(piece)})).await;
    }
}

/// `seconds` of silence.
async fn hush(c: &mut Client, seconds: usize) {
    for _ in 0..seconds {
        c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(&quiet())})).await;
    }
}

/// Events until the next `error` or function call, whichever comes first.
async fn next_outcome(c: &mut Client) -> Value {
    loop {
        let e = c.event().await;
        if e["type"] == "error" || e["type"] == "response.function_call_arguments.done" {
            return e;
        }
    }
}

/// The transcript of the last user message in a decider's request.
fn last_user_words(request: &Value) -> String {
    let messages = request["messages"].as_array().unwrap();
    let last = messages.iter().rev().find(|m| m["role"] != "system").unwrap();
    assert_eq!(last["role"], "user", "the newest user turn is the last message: {request}");
    last["content"].as_str().unwrap().to_lowercase()
}

#[tokio::test]
async fn a_minicpmo_voice_calls_a_tool_through_the_decider_and_speaks_its_result() {
    if !needs(&[Need::Models]) {
        return;
    }
    let worker = MockWorker::start();
    let decider = FakeDecider::start(Answer::Call("get_weather".into(), r#"{"city": "Paris"}"#.into()));
    let server = gateway(&[&worker], &decider, "");
    let mut c = agent(&server, "Be brief.").await;
    say(&mut c, "What is the weather in Paris?").await;
    let call = next_outcome(&mut c).await;
    assert_eq!(call["type"], "response.function_call_arguments.done", "{call}");
    assert_eq!(
        (call["name"].as_str(), call["arguments"].as_str()),
        (Some("get_weather"), Some(r#"{"city": "Paris"}"#))
    );
    let done = c.until("response.done").await;
    assert_eq!(done["response"]["output"][0]["type"], "function_call", "{done}");
    assert_eq!(done["response"]["output"][0]["call_id"], call["call_id"]);
    // The decider was asked a standard request, with the key, the tools and the turn.
    let requests = decider.requests();
    let (auth, request) = requests.last().unwrap();
    assert_eq!(auth.as_deref(), Some("Bearer sk-decider-test"));
    assert_eq!(request["model"], "decider-model");
    assert_eq!(request["tools"][0]["function"]["name"], "get_weather");
    assert!(request["messages"][0]["content"].as_str().unwrap().contains("Be brief."), "{request}");
    let words = last_user_words(request);
    assert!(words.contains("weather") && words.contains("paris"), "{words}");
    // The client's tool answers; the voice is prepared again with the result and speaks from it.
    c.send(json!({"type": "conversation.item.create", "item": {"type": "function_call_output",
        "call_id": call["call_id"], "output": "21 degrees and sunny"}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    hush(&mut c, 6).await;
    let briefed = |s: &MockState| s.prepares.last().map(|p| p["system_prompt"].as_str().unwrap_or("").contains('\n'));
    let prompt = worker.wait_for(|s| briefed(s) == Some(true), |s| s.prepares.last().unwrap()["system_prompt"].clone());
    let prompt = prompt.as_str().unwrap();
    assert!(prompt.starts_with("Be brief.") && prompt.to_lowercase().contains("weather in paris"), "{prompt}");
    assert!(prompt.ends_with("The tool get_weather answered: 21 degrees and sunny"), "{prompt}");
    let spoken = c.until("response.output_audio_transcript.done").await;
    assert!(spoken["transcript"].as_str().unwrap().contains("21 degrees and sunny"), "{spoken}");
    // Nothing was refused on the way: tools were not reported unsupported, no error came.
    assert!(!c.seen.iter().any(|e| e["type"] == "error"), "{:?}", c.seen);
    // An out-of-band response is the decider's words, with the response's instructions.
    c.until("response.done").await;
    decider.answer(Answer::Words("weather".into()));
    c.send(json!({"type": "response.create", "response": {"conversation": "none",
        "instructions": "Name the topic in one word.", "metadata": {"topic": "x"}}}))
        .await;
    let delta = c.until("response.output_text.delta").await;
    assert_eq!(delta["delta"], "weather");
    let done = c.until("response.done").await;
    assert_eq!(done["response"]["metadata"]["topic"], "x", "{done}");
    assert!(done["response"]["conversation_id"].is_null(), "outside the conversation: {done}");
    let (_, asked) = decider.requests().pop().unwrap();
    assert_eq!(asked["messages"][0], json!({"role": "system", "content": "Name the topic in one word."}));
    drop(c);
    server.wait_idle();
}

#[tokio::test]
async fn each_failed_decision_is_one_error_and_the_conversation_goes_on() {
    if !needs(&[Need::Models]) {
        return;
    }
    let worker = MockWorker::start();
    let decider = FakeDecider::start(Answer::Down);
    let server = gateway(&[&worker], &decider, "timeout_s = 1\nmax_answer_kb = 64");
    let mut c = agent(&server, "").await;
    let faults = [
        (Answer::Down, "decider_unavailable"),
        (Answer::Malformed, "decider_invalid_output"),
        (Answer::Huge, "decider_invalid_output"),
        (Answer::Slow(Duration::from_secs(3)), "decider_timeout"),
        (Answer::Call("get_stock".into(), "{}".into()), "tool_not_found"),
        (Answer::Call("get_weather".into(), r#"{"town": "Paris"}"#.into()), "invalid_tool_arguments"),
    ];
    for (answer, code) in faults {
        decider.answer(answer.clone());
        c.seen.clear();
        say(&mut c, "What is the weather in Paris?").await;
        let error = next_outcome(&mut c).await;
        assert_eq!(error["error"]["code"], code, "{answer:?}: {error}");
    }
    // The session goes on: a decider that works again is heard, once per turn.
    c.seen.clear();
    decider.answer(Answer::Call("get_weather".into(), r#"{"city": "Paris"}"#.into()));
    say(&mut c, "And now?").await;
    let call = next_outcome(&mut c).await;
    assert_eq!(call["type"], "response.function_call_arguments.done", "{call}");
    let errors = c.seen.iter().filter(|e| e["type"] == "error").count();
    assert_eq!(errors, 0, "no error left over from the faults: {:?}", c.seen);
    for (outcome, n) in
        [("decider_unavailable", 1.0), ("decider_invalid_output", 2.0), ("decider_timeout", 1.0), ("call", 3.0)]
    {
        let name = format!("omni_decisions_total{{outcome=\"{outcome}\"}}");
        // At least: a turn the VAD heard as two asks twice.
        assert!(server.metric(&name) >= n, "{name}");
    }
    drop(c);
    server.wait_idle();
}

#[tokio::test]
async fn a_decider_sees_only_its_own_sessions_conversation() {
    if !needs(&[Need::Models]) {
        return;
    }
    let (first, second) = (MockWorker::start(), MockWorker::start());
    let decider = FakeDecider::start(Answer::Words("No tool needed.".into()));
    let server = gateway(&[&first, &second], &decider, "");
    let mut a = agent(&server, "You help Alice.").await;
    let mut b = agent(&server, "You help Bob.").await;
    say(&mut a, "Tell me about the ocean.").await;
    say(&mut b, "Tell me about the mountains.").await;
    for (_, request) in decider.wait_for(2) {
        let all = request["messages"].to_string().to_lowercase();
        let alice = all.contains("alice") || all.contains("ocean");
        let bob = all.contains("bob") || all.contains("mountain");
        assert!(alice != bob, "one session's words only: {all}");
    }
}

/// A vLLM-Omni slot as the voice: the same tools, and after a handoff (new instructions, which
/// open a new session on the server) the voice still has the conversation.
#[tokio::test]
async fn a_vllm_omni_voice_gets_tools_and_keeps_the_conversation_across_a_handoff() {
    if !needs(&[Need::Models]) {
        return;
    }
    let (_dir, wav) = voice();
    let mock = MockVllm::start(1);
    let decider = FakeDecider::start(Answer::Call("get_weather".into(), r#"{"city": "Paris"}"#.into()));
    let entry = mock.entry("vo", 1, &format!("ref_audio = \"{}\"", wav.display()));
    let server = gateway_of(entry, &decider, "");
    let mut c = agent(&server, "You are the front desk.").await;
    say(&mut c, "What is the weather in Paris?").await;
    let call = next_outcome(&mut c).await;
    assert_eq!(call["type"], "response.function_call_arguments.done", "{call}");
    c.until("response.done").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "function_call_output",
        "call_id": call["call_id"], "output": "21 degrees and sunny"}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    hush(&mut c, 2).await;
    let spoken = c.until("response.output_audio_transcript.done").await;
    assert!(spoken["transcript"].as_str().unwrap().contains("21 degrees and sunny"), "{spoken}");
    c.until("response.done").await;
    // The handoff: new instructions. The server opens a new session, which holds the conversation.
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "instructions": "You are the billing agent."}}))
        .await;
    c.until("session.updated").await;
    let instructions = mock.wait_for(
        |s| {
            s.opened.last().is_some_and(|o| o["instructions"].as_str().unwrap_or("").starts_with("You are the billing"))
        },
        |s| s.opened.last().unwrap()["instructions"].as_str().unwrap().to_string(),
    );
    let lowered = instructions.to_lowercase();
    assert!(lowered.contains("user: what is the weather in paris"), "{instructions}");
    assert!(instructions.contains("The tool get_weather answered: 21 degrees and sunny"), "{instructions}");
    assert!(instructions.contains("from what I was told"), "the voice's own answer too: {instructions}");
    hush(&mut c, 2).await;
    let spoken = c.until("response.output_audio_transcript.done").await;
    assert!(spoken["transcript"].as_str().unwrap().contains("Assistant: Mock reply"), "{spoken}");
    drop(c);
    server.wait_idle();
}

/// `check-config` says which backends get tools and from where; a decider without the gateway's
/// transcription is refused with the reason, as is a decider that is not one.
#[test]
fn check_config_names_the_decider_and_refuses_one_without_transcription() {
    if !needs(&[Need::Models]) {
        return;
    }
    let decider = FakeDecider::start(Answer::Words(String::new()));
    let base = format!("[server]\nbind = \"127.0.0.1:0\"\n{}", workers(1, ""));
    let (code, stdout, stderr) = check_config(&format!("{base}{}{}", transcription_section(), decider.section("")));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let url = format!("http://{}/v1/chat/completions", decider.addr);
    assert!(stdout.contains("delegation: tools of backends that call none") && stdout.contains(&url), "{stdout}");
    assert!(!stdout.contains("sk-decider-test"), "the key is never printed: {stdout}");
    let (code, _, stderr) = check_config(&format!("{base}{}", decider.section("")));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("delegation.decider") && stderr.contains("enable [transcription]"), "{stderr}");
    let with_password = decider.section("").replace("url = \"http://", "url = \"http://user:sk-secret@");
    let (code, _, stderr) = check_config(&format!("{base}{}{with_password}", transcription_section()));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("must not hold credentials") && !stderr.contains("sk-secret"), "{stderr}");
    let (code, _, stderr) =
        check_config(&format!("{base}{}[delegation]\ndecider = \"ask\"\n", transcription_section()));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("'ask' is not a decider (off, http, pool)"), "{stderr}");
    // A pool decider needs a chat worker.
    let audio_only = format!("[server]\nbind = \"127.0.0.1:0\"\n[[workers]]\nname = \"v\"\nmodes = [\"audio\"]\n");
    let (code, _, stderr) =
        check_config(&format!("{audio_only}{}[delegation]\ndecider = \"pool\"\n", transcription_section()));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("a pool decider is a chat worker of this gateway"), "{stderr}");
    let (code, stdout, stderr) =
        check_config(&format!("{base}{}[delegation]\ndecider = \"pool\"\n", transcription_section()));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("decided by the pool's chat workers"), "{stdout}");
}

/// `decider = "pool"`: the decider is a chat worker of the gateway's own pool whose backend calls
/// tools (here the reference backend, by its documented rule: the tool whose name's last word
/// the user said), taken from the queue for one turn and given back; the voice is a MiniCPM-o
/// worker serving audio only.
#[tokio::test]
async fn a_chat_worker_of_the_pool_decides_for_a_minicpmo_voice() {
    if !needs(&[Need::Models]) {
        return;
    }
    let worker = MockWorker::start();
    let entries = format!(
        "[[workers]]\nname = \"voice\"\nbackend = \"minicpmo-worker\"\nurl = \"{}\"\nmodes = [\"audio\", \"video\"]\n\
         [[workers]]\nname = \"decider\"\nmodes = [\"chat\"]\n",
        worker.url()
    );
    let server = Server::ready(
        Setup::default()
            .workers(entries)
            .limits("max_pending_chunks = 100")
            .extra(&format!("{}[delegation]\ndecider = \"pool\"\n", transcription_section())),
    );
    let mut c = Client::connect(&server.url("/v1/realtime?model=omni")).await;
    c.expect("session.created").await;
    let tools = json!([{"type": "function", "name": "get_time", "description": "The time now",
        "parameters": {"type": "object", "properties": {}}}]);
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "tools": tools,
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad"}}}}}))
        .await;
    c.until("session.updated").await;
    say(&mut c, "What time is it now?").await;
    let call = next_outcome(&mut c).await;
    assert_eq!(call["type"], "response.function_call_arguments.done", "{call}");
    assert_eq!((call["name"].as_str(), call["arguments"].as_str()), (Some("get_time"), Some("{}")));
    c.until("response.done").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "function_call_output",
        "call_id": call["call_id"], "output": "noon"}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    let spoken = c.until("response.output_audio_transcript.done").await;
    assert!(spoken["transcript"].as_str().unwrap().contains("The tool get_time answered: noon"), "{spoken}");
    assert_eq!(server.metric("omni_decisions_total{outcome=\"call\"}"), 1.0);
    drop(c);
    // The decider's worker went back to the pool with the voice's.
    server.wait_idle();
    let status = server.status();
    let idle = status["workers"].as_array().unwrap().iter().filter(|w| w["state"] == "idle").count();
    assert_eq!(idle, 2, "{status}");
}
