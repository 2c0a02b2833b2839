//! The documentation cannot drift from the server: every metric the server defines is in
//! the table of `docs/operations.md` (and the table names nothing else), what `/metrics`
//! serves is documented, and every server event and field shown in `docs/protocol.md` is
//! what the dialects emit over real sockets, both ways (a field the server sends that the
//! page does not show fails too).

use std::collections::{BTreeMap, BTreeSet};

use crate::common::*;
use serde_json::{Value, json};

fn doc(name: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(name)).unwrap()
}

/// The metric names in the first column of the table under `## Metrics`.
fn documented_metrics() -> BTreeSet<String> {
    let text = doc("operations.md");
    let section = text.split("## Metrics").nth(1).expect("a Metrics section").split("\n## ").next().unwrap();
    let mut names = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `omni_")) {
        let first = row.split('|').nth(1).unwrap();
        for name in first.split('`').filter(|s| s.starts_with("omni_")) {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn every_metric_defined_is_documented_and_nothing_else() {
    let defined: BTreeSet<String> = omni_actors::observe::metrics::metrics().names().iter().cloned().collect();
    let documented = documented_metrics();
    assert_eq!(
        defined.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "defined in actors/src/observe/metrics.rs, missing from docs/operations.md"
    );
    assert_eq!(
        documented.difference(&defined).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented in docs/operations.md, not defined"
    );
}

/// `a.b`, `a.c[].d`: every key of an event, as paths.
fn paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => {
            for (k, item) in map {
                let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                out.insert(p.clone());
                paths(item, &p, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// What an event is for comparison: its dialect section, type and (for deltas) kind.
fn key(section: &str, v: &Value) -> String {
    match v["kind"].as_str() {
        Some(kind) => format!("{section} {} {kind}", v["type"].as_str().unwrap_or("?")),
        None => format!("{section} {}", v["type"].as_str().unwrap_or("?")),
    }
}

const CLIENT_EVENTS: &[&str] =
    &["session.init", "input.append", "session.close", "session.update", "input_audio_buffer.append"];

/// The server events shown in `docs/protocol.md`, by key, with their field paths.
fn documented_events() -> BTreeMap<String, BTreeSet<String>> {
    let text = doc("protocol.md");
    let (current, legacy) = text.split_once("## The earlier duplex dialect").unwrap();
    let mut events: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (section, body) in [("current", current), ("legacy", legacy)] {
        for block in body.split("```json").skip(1) {
            let block = block.split("```").next().unwrap();
            for line in block.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
                if !v.is_object() || CLIENT_EVENTS.contains(&v["type"].as_str().unwrap_or("")) {
                    continue;
                }
                paths(&v, "", events.entry(key(section, &v)).or_default());
            }
        }
    }
    events
}

async fn collect(c: &mut Client, section: &str, emitted: &mut BTreeMap<String, BTreeSet<String>>) {
    for v in c.seen.drain(..) {
        paths(&v, "", emitted.entry(key(section, &v)).or_default());
    }
}

#[tokio::test]
async fn every_event_and_field_in_the_protocol_page_is_what_the_server_emits() {
    let setup = Setup::default().queue("update_interval_s = 0.2").server("resume_grace_s = 30");
    let server = Server::ready(setup.workers(workers(1, "")));
    let mut emitted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();

    // A session whose connection drops, resumed.
    let mut dropped = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    let token = dropped.until("session.queue_done").await["resume_token"].as_str().unwrap().to_string();
    collect(&mut dropped, "current", &mut emitted).await;
    drop(dropped.into_inner());
    server.wait_status("the session held", WAIT, |s| s["sessions"]["held"] == 1);
    let mut resumed = Client::connect(&server.url(&format!("/v1/realtime?resume={token}"))).await;
    resumed.expect("session.resumed").await;
    resumed.send(json!({"type": "session.close"})).await;
    resumed.until("session.closed").await;
    collect(&mut resumed, "current", &mut emitted).await;
    drop(resumed);
    server.wait_idle();

    // Waiting, then a duplex session: listen, text, audio, an error, the close.
    let mut holder = active(&server, "video").await;
    let mut c = Client::connect(&server.url("/v1/realtime?mode=video")).await;
    c.expect("session.queued").await;
    c.expect("session.queue_update").await;
    holder.send(json!({"type": "session.close"})).await;
    holder.until("session.closed").await;
    collect(&mut holder, "current", &mut emitted).await;
    c.until("session.queue_done").await;
    c.send(json!({"type": "input.append", "input": {"audio": b64_pcm(&quiet())}})).await;
    c.expect_error("not_ready").await;
    let config = json!({"top_p": 0.8, "decode_mode": "sampling"});
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "x", "config": config, "transcripts": true}}))
        .await;
    c.until("session.created").await;
    c.send(append_with(&loud(), json!({"video_frames": [jpeg_b64()]}))).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_2").await;
    c.send(json!({"type": "session.close", "reason": "done"})).await;
    c.until("session.closed").await;
    collect(&mut c, "current", &mut emitted).await;
    drop(c);
    server.wait_idle();

    // Chat: streamed text and audio, then an answer not streamed, with its audio.
    let mut chat = active(&server, "chat").await;
    // The non-streamed answer asks for a setting the backend does not apply.
    let ask = |streaming: bool| {
        let generation = if streaming { json!({}) } else { json!({"mystery_knob": 1}) };
        json!({"type": "input.append", "input": {"streaming": streaming, "tts": {"enabled": true},
            "generation": generation, "messages": [{"role": "user", "content": "Reply with exactly: hello"}]}})
    };
    chat.send(ask(true)).await;
    chat.until("response.done").await;
    chat.send(ask(false)).await;
    chat.until("response.done").await;
    chat.send(json!({"type": "session.close"})).await;
    chat.until("session.closed").await;
    collect(&mut chat, "current", &mut emitted).await;
    drop(chat);
    server.wait_idle();

    // The earlier dialect.
    let mut legacy = connected(&server, "video").await;
    legacy.seen.clear();
    legacy.send(json!({"type": "session.update", "session": {"instructions": "x"}})).await;
    legacy.expect("session.created").await;
    legacy.send(json!({"type": "input_audio_buffer.append", "audio": b64_pcm(&loud())})).await;
    legacy.expect("response.listen").await;
    for _ in 0..3 {
        legacy.send(json!({"type": "input_audio_buffer.append", "audio": b64_pcm(&quiet())})).await;
    }
    legacy.until("response.output_audio.delta").await;
    legacy.send(json!({"type": "session.close"})).await;
    legacy.until("session.closed").await;
    collect(&mut legacy, "legacy", &mut emitted).await;

    let documented = documented_events();
    for (event, shown) in &documented {
        let Some(sent) = emitted.get(event) else { panic!("docs/protocol.md shows {event}, the server never sent it") };
        let missing: Vec<_> = shown.difference(sent).collect();
        assert!(missing.is_empty(), "{event}: docs/protocol.md shows {missing:?}, the server does not send them");
        let undocumented: Vec<_> = sent.difference(shown).collect();
        assert!(
            undocumented.is_empty(),
            "{event}: the server sends {undocumented:?}, docs/protocol.md does not show them"
        );
    }
    for event in emitted.keys() {
        assert!(documented.contains_key(event), "the server sends {event}, docs/protocol.md does not show it");
    }
}

#[tokio::test]
async fn what_metrics_serves_is_documented() {
    let server = Server::ready(Setup::default());
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    let (_, body) = server.get("/metrics");
    let served: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert!(served.len() > 10, "{body}");
    let documented = documented_metrics();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(undocumented.is_empty(), "served by /metrics, not in docs/operations.md: {undocumented:?}");
}

/// The Qwen-flavor events shown in `docs/openai-dialect.md` (its `## Qwen events` section).
fn documented_qwen_events() -> BTreeMap<String, BTreeSet<String>> {
    let text = doc("openai-dialect.md");
    let section = text.split("## Qwen events").nth(1).expect("a Qwen events section").split("\n## ").next().unwrap();
    let mut events: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for block in section.split("```json").skip(1) {
        for line in block.split("```").next().unwrap().lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            paths(&v, "", events.entry(v["type"].as_str().unwrap_or("?").to_string()).or_default());
        }
    }
    events
}

async fn qwen_client(server: &Server) -> Client {
    Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await
}

async fn until_type(c: &mut Client, kind: &str) {
    while c.event().await["type"] != kind {}
}

#[tokio::test]
async fn every_qwen_event_and_field_in_the_dialect_page_is_what_the_server_emits() {
    let server = Server::ready(Setup::default().queue("update_interval_s = 0.2").workers(workers(1, "token_ms = 50")));
    let mut emitted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut gather = |c: &mut Client| {
        for v in c.seen.drain(..) {
            paths(&v, "", emitted.entry(v["type"].as_str().unwrap_or("?").to_string()).or_default());
        }
    };

    // Waiting behind another client, then a server-VAD turn with transcription.
    let mut holder = qwen_client(&server).await;
    holder.expect("session.created").await;
    let mut c = qwen_client(&server).await;
    c.expect("session.queued").await;
    c.expect("session.queue_update").await;
    holder.send(json!({"type": "session.finish"})).await;
    holder.until("session.finished").await;
    gather(&mut holder);
    c.until("session.created").await;
    c.send(json!({"type": "session.update", "session": {"modalities": ["text", "audio"], "top_k": 20, "top_p": 0.9, "seed": 1,
        "enable_search": true, "input_audio_transcription": {"model": "gummy-realtime-v1"}}}))
        .await;
    c.until("error").await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.3)})).await;
    c.send(json!({"type": "input_image_buffer.append", "image": jpeg_b64()})).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.0)})).await;
    until_type(&mut c, "response.done").await;

    // Manual turns: committed audio, a text item, a text-only answer, a cancel, an error.
    c.send(json!({"type": "session.update", "session": {"turn_detection": null, "max_tokens": 64}})).await;
    c.until("session.updated").await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(0.5, 16000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.clear"})).await;
    c.until("input_audio_buffer.cleared").await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.commit"})).await;
    c.send(json!({"type": "response.create"})).await;
    until_type(&mut c, "response.done").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: a b c d e f g h i j"}]}}))
        .await;
    c.send(json!({"type": "response.create", "response": {"modalities": ["text"]}})).await;
    until_type(&mut c, "response.done").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: a b c d e f g h i j"}]}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    until_type(&mut c, "response.audio_transcript.delta").await;
    c.send(json!({"type": "response.cancel"})).await;
    until_type(&mut c, "response.done").await;
    // A tool, in Qwen's shape: the model calls it, the client answers, the model goes on.
    let tools = json!([{"type": "function", "function": {"name": "get_time", "description": "The time now",
        "parameters": {"type": "object", "properties": {}}}}]);
    c.send(json!({"type": "session.update", "session": {"tools": tools}})).await;
    c.until("session.updated").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "What time is it?"}]}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    let call = c.until("response.function_call_arguments.done").await;
    until_type(&mut c, "response.done").await;
    c.send(json!({"type": "conversation.item.create", "item": {"type": "function_call_output",
        "call_id": call["call_id"], "output": "noon"}}))
        .await;
    c.send(json!({"type": "response.create"})).await;
    until_type(&mut c, "response.done").await;
    c.send(json!({"type": "session.update", "session": {"top_p": 7}, "event_id": "client_1"})).await;
    c.until("error").await;
    c.send(json!({"type": "session.finish"})).await;
    c.until("session.finished").await;
    gather(&mut c);
    drop(c);

    // A model that does not transcribe.
    let plain = Server::ready(Setup::default().workers(workers(1, "revision = 0")));
    let mut c = qwen_client(&plain).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.3)})).await;
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.0)})).await;
    until_type(&mut c, "response.done").await;
    gather(&mut c);

    let documented = documented_qwen_events();
    let mut problems = Vec::new();
    for (event, sent) in &emitted {
        match documented.get(event) {
            None => problems.push(format!("the server sends {event}, docs/openai-dialect.md does not show it")),
            Some(shown) => {
                let missing: Vec<_> = shown.difference(sent).collect();
                let undocumented: Vec<_> = sent.difference(shown).collect();
                if !missing.is_empty() {
                    problems.push(format!("{event}: the page shows {missing:?}, the server does not send them"));
                }
                if !undocumented.is_empty() {
                    problems.push(format!("{event}: the server sends {undocumented:?}, the page does not show them"));
                }
            }
        }
    }
    for event in documented.keys().filter(|e| !emitted.contains_key(*e)) {
        problems.push(format!("docs/openai-dialect.md shows {event}, the server never sent it"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every function name in a Rust or C source under `dir`.
fn function_names(dir: &std::path::Path, names: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            function_names(&path, names);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for rest in text.split("fn ").skip(1) {
                names.insert(rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap().to_string());
            }
        }
    }
}

#[test]
fn every_test_the_fidelity_table_cites_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = BTreeSet::new();
    for dir in ["tests", "src", "actors/src", "dialects/src", "transports/src", "backends/host/src"] {
        function_names(&root.join(dir), &mut names);
    }
    let c_test = std::fs::read_to_string(root.join("tests/c/abi_test.c")).unwrap();
    let text = doc("fidelity.md");
    let mut cited = 0;
    for row in text.lines().filter(|l| l.starts_with("| ") && l.matches('|').count() >= 5) {
        let tested_by = row.rsplit('|').nth(1).unwrap();
        for quoted in tested_by.split('`').skip(1).step_by(2) {
            cited += 1;
            let known = names.contains(quoted) || c_test.contains(quoted);
            assert!(known, "docs/fidelity.md cites `{quoted}`, which is no test here:\n{row}");
        }
    }
    assert!(cited > 100, "{cited} tests cited");
}

#[test]
fn the_worked_example_in_the_extending_page_is_the_one_cargo_builds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("actors/examples/transcript_log.rs")).unwrap();
    let page = doc("extending.md");
    let shown = page.split("```rust\n").nth(1).expect("a rust block").split("```").next().unwrap();
    assert_eq!(shown, example, "docs/extending.md shows another example than actors/examples/transcript_log.rs");
}

/// The Python client in README ("For programs") runs as printed against a server: it waits in
/// line, speaks, prints the model's words and saves its voice as a WAV Python's `wave` reads.
#[test]
fn the_readme_python_client_runs_as_printed() {
    if !needs(&[Need::Sdks]) {
        return;
    }
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let code = readme.split("```python\n").nth(1).expect("a Python block").split("```").next().unwrap();
    assert!(code.lines().count() <= 30, "README's client is short");
    let server = Server::ready(Setup::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("client.py"), code).unwrap();
    let out = std::process::Command::new(sdk_python())
        .arg("client.py")
        .arg(server.url("/v1/realtime?mode=audio"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("model: "), "{stdout}");
    let wav = hound::WavReader::open(dir.path().join("answer.wav")).unwrap();
    assert_eq!((wav.spec().sample_rate, wav.spec().bits_per_sample), (24000, 16));
    // The reference backend answers a 2 s tone with 2.5 s of voice: all of it, its last piece too.
    assert_eq!(wav.duration(), 60000, "the whole answer: {stdout}");
    server.wait_idle();
}
