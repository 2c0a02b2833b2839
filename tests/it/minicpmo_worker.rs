//! `backend = "minicpmo-worker"`: the gateway in front of a MiniCPM-o model worker (a mock
//! of its protocol, written from its documentation), over real sockets: every dialect
//! through it, the session's settings reaching it, force-listen, validation before
//! forwarding, the worker's faults (a dropped socket, loading, error, busy), the step
//! watchdog and the context limit.

use crate::common::*;
use serde_json::json;

fn gateway(worker: &MockWorker, options: &str) -> Server {
    Server::ready(Setup::default().workers(worker.entry("gpu", options)))
}

/// A gateway in front of `worker` with its own transcription. Clients may send their audio
/// faster than real time: every chunk waits its turn (none is dropped as ahead of the worker,
/// which would drop the question, however fast it steps).
fn transcribing_gateway(worker: &MockWorker) -> Server {
    Server::ready(
        Setup::default()
            .workers(worker.entry("gpu", ""))
            .limits("max_pending_chunks = 100")
            .extra(&transcription_section()),
    )
}

/// Sends `n` quiet chunks answered by listens (the worker's first three steps always listen).
async fn warm_up(c: &mut Client, n: usize) {
    for i in 1..=n {
        c.send(append(&quiet())).await;
        assert_eq!(kinds(&answer_to(c, &format!("input_{i}")).await), ["listen"]);
    }
}

#[tokio::test]
async fn a_duplex_session_reaches_the_worker_with_its_prompt_voice_and_settings() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "");
    let status = server.status();
    assert_eq!(status["workers"][0]["backend"], format!("minicpmo-worker {}", worker.url()));
    let mut c = connected(&server, "video").await;
    let config = json!({"top_p": 0.7, "top_k": 10, "length_penalty": 1.2, "generate_audio": true, "model_path": "/x"});
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "Be a mock.", "config": config,
        "voice": {"ref_audio_base64": b64_pcm(&[0.1; 1600])}}}))
        .await;
    let created = c.expect("session.created").await;
    assert_eq!(created["unsupported_settings"], json!(["generate_audio", "model_path"]), "not applied per session");
    let prepare = worker.with(|s| s.prepares[0].clone());
    assert_eq!(prepare["system_prompt"], "Be a mock.");
    assert_eq!(prepare["config"]["top_p"], 0.7);
    assert_eq!(prepare["config"]["top_k"], 10);
    assert_eq!(prepare["config"]["length_penalty"], json!(1.2), "as written, not widened from f32");
    // Only the settings the worker applies per session reach it.
    let sent: Vec<&String> = prepare["config"].as_object().unwrap().keys().collect();
    assert_eq!(sent, ["length_penalty", "top_k", "top_p"], "{prepare}");
    assert!(prepare["ref_audio_base64"].is_string() && prepare.get("tts_ref_audio_base64").is_none());
    warm_up(&mut c, 3).await;
    c.send(append_with(&loud(), json!({"video_frames": [jpeg_b64()]}))).await;
    let listen = answer_to(&mut c, "input_4").await;
    assert_eq!(listen[0]["metrics"]["kv_cache_length"], 50 + 4 * 25 + 64);
    c.send(append(&quiet())).await;
    let speech = answer_to(&mut c, "input_5").await;
    assert_eq!(kinds(&speech), ["text", "audio"]);
    assert_eq!(speech[0]["text"], "Mock reply 1.");
    assert_eq!(pcm_of(&speech[1]["audio"]).len(), 24000);
    c.send(append(&quiet())).await;
    let last = answer_to(&mut c, "input_6").await;
    assert_eq!(last.last().unwrap()["end_of_turn"], true);
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    server.wait_idle();
}

/// A chunk's audio reaches the worker as the client wrote it when the client wrote the worker's
/// format (the MiniCPM-o dialects: base64 of float32 at 16 kHz); written with JSON escapes, or in
/// another format (the OpenAI dialect's pcm16), it is encoded once, to the same samples. (That
/// the text is forwarded, not encoded again to the same text, the unit tests show:
/// `a_chunk_keeps_the_clients_base64_unless_the_json_escaped_it`,
/// `a_chunk_forwards_the_clients_base64_and_encodes_only_without_it`.)
#[tokio::test]
async fn chunk_audio_reaches_the_worker_as_the_client_wrote_it() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "");
    let mut c = active(&server, "audio").await;
    let audio: Vec<f32> = (0..16000).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let written = b64_pcm(&audio);
    assert!(written.contains('/'), "the test's audio has a slash to escape");
    c.send(append(&audio)).await;
    answer_to(&mut c, "input_1").await;
    // The same audio with its slashes escaped, as some JSON encoders write them.
    let escaped = json!({"type": "input.append", "input": {"audio": written}}).to_string().replace('/', "\\/");
    c.send_raw(tokio_tungstenite::tungstenite::Message::text(escaped)).await;
    answer_to(&mut c, "input_2").await;
    let got = worker.with(|s| s.audio.clone());
    assert_eq!(got[0], written, "forwarded as written");
    assert_eq!(pcm_of(&json!(got[1])), audio, "encoded again, the same samples");
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    server.wait_idle();

    let mut openai = Client::connect(&server.url("/v1/realtime?model=omni")).await;
    openai.until("session.created").await;
    openai.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 24000, 0.5)})).await;
    let sent = worker.wait_for(|s| s.audio.len() > 2, |s| s.audio[2].clone());
    let samples = pcm_of(&json!(sent));
    assert_eq!(samples.len(), 16000, "1 s of pcm16 at 24 kHz, as float32 at 16 kHz");
    assert!(samples.iter().any(|s| s.abs() > 0.4), "the tone, not silence");
    drop(openai);
    server.wait_idle();
}

#[tokio::test]
async fn chat_and_the_other_dialects_run_through_the_worker() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "");
    let mut chat = active(&server, "chat").await;
    let mut messages = vec![json!({"role": "user", "content": "Reply with exactly: one two"})];
    chat.send(json!({"type": "input.append", "input": {"messages": messages, "tts": {"enabled": true}}})).await;
    let first = chat.until("response.output.delta").await;
    assert_eq!(first["text"], "one");
    let done = chat.until("response.done").await;
    assert_eq!(done["text"], "one two");
    messages.push(json!({"role": "assistant", "content": "one two"}));
    messages.push(json!({"role": "user", "content": "And now?"}));
    chat.send(json!({"type": "input.append", "input": {"messages": messages, "streaming": false}})).await;
    // The session's system prompt, then the conversation as the client sent it, once.
    assert_eq!(chat.until("response.done").await["text"], "Mock answer to 4 message(s).");
    let sent = worker.with(|s| s.chats.clone());
    assert_eq!(sent[0]["tts"]["enabled"], true);
    assert_eq!(sent[1]["messages"][0], json!({"role": "system", "content": "You are a test."}));
    assert_eq!(sent[1]["messages"].as_array().unwrap().len(), 4);
    chat.send(json!({"type": "session.close"})).await;
    chat.until("session.closed").await;

    let mut legacy = connected(&server, "video").await;
    legacy.send(json!({"type": "session.update", "session": {"instructions": "x"}})).await;
    legacy.expect("session.created").await;
    legacy.send(json!({"type": "input_audio_buffer.append", "audio": b64_pcm(&quiet())})).await;
    legacy.expect("response.listen").await;
    legacy.send(json!({"type": "session.close"})).await;
    legacy.until("session.closed").await;

    let mut qwen = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    // (the worker may still be resetting after the previous session: queued first)
    qwen.until("session.created").await;
    qwen.send(json!({"type": "session.update", "session": {"turn_detection": null}})).await;
    qwen.until("session.updated").await;
    qwen.send(json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Reply with exactly: via qwen"}]}}))
        .await;
    qwen.send(json!({"type": "response.create"})).await;
    let done = qwen.until("response.done").await;
    assert_eq!(done["response"]["output"][0]["content"][0]["transcript"], "via qwen");
    drop(qwen);
    server.wait_idle();
}

#[tokio::test]
async fn force_listen_does_not_wait_behind_the_worker() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "");
    let mut c = active(&server, "audio").await;
    warm_up(&mut c, 3).await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_4").await;
    worker.with(|s| s.step_delay = 0.5);
    // A reply starts; a burst arrives while its step runs, then a force-listen.
    c.send(append(&quiet())).await;
    for _ in 0..3 {
        c.send(append(&quiet())).await;
    }
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await;
    let deltas = answer_to(&mut c, "input_9").await;
    assert_eq!(deltas.last().unwrap()["kind"], "listen");
    // The backlog was dropped (silent drop keeps the newest), and the force-listen reached
    // the worker with the chunks it was sent; it is consumed: the next chunk is not forced.
    assert!(worker.with(|s| s.chunks) <= 8, "the gateway sent the worker {} chunks", worker.with(|s| s.chunks));
    let forced = worker.with(|s| s.forced);
    assert!(forced >= 1);
    worker.with(|s| s.step_delay = 0.0);
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_10").await;
    assert_eq!(worker.with(|s| s.forced), forced, "a force-listen is consumed once");
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
}

#[tokio::test]
async fn bad_input_is_refused_by_the_gateway_and_never_reaches_the_worker() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "");
    let mut c = active(&server, "video").await;
    c.send(json!({"type": "input.append", "input": {"audio": "%%%"}})).await;
    c.expect_error("invalid_payload").await;
    c.send(append_with(&quiet(), json!({"video_frames": ["R0lGODlh"]}))).await;
    c.expect_error("invalid_payload").await;
    assert_eq!(worker.with(|s| s.chunks), 0);
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_1").await;
    assert_eq!(worker.with(|s| s.chunks), 1);
}

#[tokio::test]
async fn a_worker_that_drops_its_socket_ends_that_session_and_serves_the_next() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "");
    let mut c = active(&server, "audio").await;
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_1").await;
    worker.with(|s| s.drop_next_chunk = true);
    c.send(append(&quiet())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    assert_eq!(c.closed().await, Some(1011));
    server.wait_idle();
    let mut again = active(&server, "audio").await;
    again.send(append(&quiet())).await;
    answer_to(&mut again, "input_1").await;
}

#[tokio::test]
async fn a_loading_worker_keeps_clients_waiting_until_it_is_ready() {
    let worker = MockWorker::start();
    worker.with(|s| s.status = "loading".into());
    let server = Server::start(Setup::default().workers(worker.entry("gpu", "")));
    server.wait_status("the worker waits for the model", WAIT, |s| {
        s["workers"][0]["state"] == "failed"
            && s["workers"][0]["failure"].as_str().unwrap_or("").contains("is loading its model")
    });
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    assert_eq!(c.event().await["type"], "session.queued", "waits for it rather than being refused");
    worker.with(|s| s.status = "idle".into());
    c.until("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    c.expect("session.created").await;
    assert!(server.metric("omni_remote_worker_health_total{status=\"loading\",worker=\"gpu-0\"}") >= 1.0);
}

#[tokio::test]
async fn a_worker_busy_with_another_job_is_not_taken() {
    let worker = MockWorker::start();
    worker.with(|s| s.busy = true); // someone else's session on it
    let server = Server::start(Setup::default().workers(worker.entry("gpu", "")));
    server.wait_status("the worker is not offered", WAIT, |s| {
        s["workers"][0]["state"] == "failed" && s["workers"][0]["failure"].as_str().unwrap_or("").contains("is busy")
    });
    let mut c = Client::connect(&server.url("/v1/realtime?mode=chat")).await;
    assert_eq!(c.event().await["type"], "session.queued");
    worker.with(|s| s.busy = false);
    c.until("session.queue_done").await;
    c.send(json!({"type": "session.init", "payload": {}})).await;
    c.expect("session.created").await;
    assert_eq!(worker.with(|s| s.prepares.len()), 0, "a chat session prepares nothing on the worker");
}

#[tokio::test]
async fn an_idle_worker_in_error_is_noticed_and_rejoins_when_healthy() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "health_interval_s = 0.2");
    worker.with(|s| s.status = "error".into());
    server.wait_status("the health check notices", WAIT, |s| {
        s["workers"][0]["state"] == "failed" && s["workers"][0]["failure"].as_str().unwrap_or("").contains("error")
    });
    worker.with(|s| s.status = "idle".into());
    server.wait_idle();
}

#[tokio::test]
async fn the_step_watchdog_and_the_context_limit_hold() {
    let worker = MockWorker::start();
    let server = Server::ready(
        Setup::default().workers(worker.entry("gpu", "")).limits("step_timeout_ms = 1000\ncontext_tokens = 100"),
    );
    let mut c = active(&server, "audio").await;
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_1").await; // kv 75
    c.send(append(&quiet())).await;
    assert_eq!(c.until("session.closed").await["reason"], "context_full", "kv 75 + 25 reaches 100");
    server.wait_idle();
    worker.with(|s| s.step_delay = 3.0);
    let mut slow = active(&server, "audio").await;
    slow.send(append(&quiet())).await;
    assert_eq!(slow.until("session.closed").await["reason"], "backend_error");
    worker.with(|s| s.step_delay = 0.0);
    server.wait_idle();
}

#[test]
fn check_config_says_when_the_worker_cannot_serve() {
    let worker = MockWorker::start();
    worker.with(|s| s.status = "loading".into());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, worker.entry("gpu", "")).unwrap();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_omni-gateway")).arg("check-config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("workers[0].url") && stderr.contains("loading its model"),
        "{stderr}"
    );
    worker.with(|s| s.status = "idle".into());
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_omni-gateway")).arg("check-config").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Through the OpenAI-shaped dialects: settings under the Realtime API's names reach the worker
/// under its own (`repetition_penalty`) with their values as written, responses count what the
/// worker heard (its KV growth), and with the gateway's transcription the user's item gets the
/// spoken words (the worker transcribes nothing).
#[tokio::test]
async fn a_qwen_session_through_the_worker_gets_its_settings_usage_and_transcript() {
    if !needs(&[Need::Models]) {
        return;
    }
    let worker = MockWorker::start();
    let server = transcribing_gateway(&worker);
    let mut c = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    c.expect("session.created").await;
    c.send(json!({"type": "session.update", "session": {"temperature": 1.2, "repetition_penalty": 1.05, "top_k": 10,
        "input_audio_format": "pcm16"}}))
        .await;
    let updated = c.expect("session.updated").await;
    assert_eq!(updated["session"]["repetition_penalty"], json!(1.05));
    let prepare = worker.with(|s| s.prepares.last().unwrap().clone());
    assert_eq!(prepare["config"]["temperature"], json!(1.2), "{prepare}");
    assert_eq!(prepare["config"]["text_repetition_penalty"], json!(1.05), "{prepare}");
    assert!(prepare["config"].get("repetition_penalty").is_none(), "{prepare}");
    // A spoken question, then silence, in 100 ms pieces of pcm16; the mock worker's first three
    // steps only listen, so the question comes after 3.5 s.
    let mut audio = vec![0.0; 56000];
    audio.extend(speech("What is the capital of France?"));
    audio.extend(vec![0.0; 64000]);
    for piece in audio.chunks(1600) {
        c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(piece)})).await;
    }
    let (mut done, mut heard) = (None, None);
    while done.is_none() || heard.is_none() {
        let e = c.event().await;
        assert_ne!(e["type"], "error", "{e}");
        match e["type"].as_str().unwrap() {
            "response.done" => done = Some(e),
            "conversation.item.input_audio_transcription.completed" => heard = Some(e),
            "conversation.item.input_audio_transcription.failed" => panic!("{e}"),
            _ => {}
        }
    }
    let words = heard.unwrap()["transcript"].as_str().unwrap().to_lowercase();
    assert!(words.contains("capital") && words.contains("france"), "{words}");
    let usage = &done.unwrap()["response"]["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "what the worker heard counts: {usage}");
}

/// The MiniCPM-o dialect through the worker, which transcribes nothing: with the gateway's
/// transcription and `payload.transcripts`, the user's turn, found by the gateway's detector at
/// the end of the speech, comes back as `input.transcript`, named by the append in which its end
/// was found.
#[tokio::test]
async fn a_minicpm_session_through_the_worker_gets_the_gateways_transcript() {
    if !needs(&[Need::Models]) {
        return;
    }
    let worker = MockWorker::start();
    let server = transcribing_gateway(&worker);
    let mut c = connected(&server, "audio").await;
    c.send(json!({"type": "session.init", "payload": {"transcripts": true}})).await;
    c.expect("session.created").await;
    // Half a second of silence, the question, then silence, in whole 1 s appends.
    let mut audio = vec![0.0; 8000];
    audio.extend(speech("What is the capital of France?"));
    // Where the speech ends: its last sample over -40 dBFS.
    let spoken_until = audio.iter().rposition(|s| s.abs() > 0.01).unwrap();
    audio.resize((spoken_until / 16000 + 3) * 16000, 0.0);
    for piece in audio.chunks(16000) {
        c.send(append(piece)).await;
    }
    let heard = c.until("input.transcript").await;
    let words = heard["text"].as_str().unwrap().to_lowercase();
    assert!(words.contains("capital") && words.contains("france"), "{heard}");
    assert_eq!(heard["session_id"].as_str().map(|s| s.starts_with("sess_")), Some(true), "{heard}");
    // Named by the append that held the end of the speech or its 500 ms of silence after.
    let named: Vec<String> =
        (spoken_until / 16000 + 1..=(spoken_until + 500 * 16) / 16000 + 1).map(|n| format!("input_{n}")).collect();
    assert!(named.iter().any(|n| heard["input_id"] == *n), "{heard} not one of {named:?}");
}

/// An idle worker link costs one thread, the one its blocking calls run on, which also asks
/// the worker's health while no session runs (counted here after every link has been asked
/// again; `an_idle_worker_in_error_is_noticed_and_rejoins_when_healthy` shows it notices);
/// links used to cost two each.
#[tokio::test]
async fn an_idle_worker_link_holds_one_thread() {
    let threads = |server: &Server| std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap().count();
    let worker = MockWorker::start();
    let options = "health_interval_s = 0.1";
    let one = Server::ready(Setup::default().workers(worker.entry("gpu", options)));
    let entries: String = (0..20).map(|i| worker.entry(&format!("gpu{i}"), options)).collect();
    let twenty = Server::ready(Setup::default().workers(entries));
    // Each link asked at its open and twice since (one link of the first gateway among them).
    worker.wait_for(|s| s.health_asks >= 21 * 3, |_| ());
    let (a, b) = (threads(&one), threads(&twenty));
    // 19 more links: 19 more threads (and a spare or two), where they used to cost 38.
    assert!(b >= a + 19 && b <= a + 19 + 4, "{a} threads with one link, {b} with twenty");
}

/// The health check is the BackendActor's, run only while no session has the worker: while a
/// session holds one worker (idle between its steps), the other, idle, worker is asked five
/// times and the first not once; a worker gone into error meanwhile is noticed once the
/// session has ended.
#[tokio::test]
async fn the_health_is_asked_only_while_no_session_runs() {
    let workers = [MockWorker::start(), MockWorker::start()];
    let options = "health_interval_s = 0.1";
    let server =
        Server::ready(Setup::default().workers(workers[0].entry("gpu", options) + &workers[1].entry("spare", options)));
    let mut c = active(&server, "audio").await;
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_1").await;
    let busy = server.status()["workers"].as_array().unwrap().iter().position(|w| w["state"] == "busy").unwrap();
    let (held, spare) = (&workers[busy], &workers[1 - busy]);
    assert_eq!(server.status()["workers"][busy]["backend"], format!("minicpmo-worker {}", held.url()));
    let asked = held.with(|s| {
        s.status = "error".into();
        s.health_asks
    });
    let clock = spare.with(|s| s.health_asks);
    spare.wait_for(|s| s.health_asks >= clock + 5, |_| ());
    assert_eq!(held.with(|s| s.health_asks), asked, "asked while its session was idle");
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_2").await;
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    server.wait_status("the check after the session notices", WAIT, |s| {
        s["workers"][busy]["state"] == "failed"
            && s["workers"][busy]["failure"].as_str().unwrap_or("").contains("error")
    });
}

/// A check that fails while a session takes the worker (the check was in flight when it was
/// assigned) does not fail the worker under that session: the session's own calls tell, and
/// this one is served.
#[tokio::test]
async fn a_check_that_fails_as_a_session_takes_the_worker_spares_that_session() {
    let worker = MockWorker::start();
    let server = gateway(&worker, "health_interval_s = 0.2\nconnect_timeout_s = 1.0");
    let asked = worker.with(|s| {
        s.health_delay = 2.0; // past connect_timeout_s: the check in flight fails
        s.health_asks
    });
    worker.wait_for(|s| s.health_asks > asked, |_| ());
    let mut c = active(&server, "audio").await;
    server.wait_log("its idle health check failed", WAIT);
    worker.with(|s| s.health_delay = 0.0);
    c.send(append(&quiet())).await;
    answer_to(&mut c, "input_1").await;
    c.send(json!({"type": "session.close", "reason": "user_stop"})).await;
    assert_eq!(c.until("session.closed").await["reason"], "user_stop");
    server.wait_idle();
}

/// A worker is not trusted with the gateway's memory or threads: one that only pings is cut off
/// at its reply's deadline (pings do not extend it), one that streams an answer without end at
/// the answer's cap, one that sends an 8 MB message at the message cap; each time its link's
/// thread ends (the gateway ends up with the threads it started with) and the next session is
/// served.
#[tokio::test]
async fn a_worker_that_pings_forever_talks_forever_or_sends_a_huge_message_is_cut_off() {
    let threads = |server: &Server| std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap().count();
    let worker = MockWorker::start();
    let server = Server::ready(
        Setup::default().workers(worker.entry("gpu", "reply_timeout_s = 1")).limits("step_timeout_ms = 3000"),
    );
    let before = threads(&server);
    let back_to_before = |server: &Server| {
        let deadline = std::time::Instant::now() + WAIT;
        while threads(server) > before {
            assert!(std::time::Instant::now() < deadline, "{} threads, {before} before", threads(server));
            std::thread::sleep(std::time::Duration::from_millis(20)); // the next look at its threads
        }
    };
    worker.with(|s| s.misbehave = Some(Misbehave::PingsOnly));
    let mut c = active(&server, "audio").await;
    c.send(append(&quiet())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    server.wait_log("audio_chunk: no answer within 1 s", WAIT);
    server.wait_idle();
    back_to_before(&server);

    let ask = json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": "hi"}]}});
    worker.with(|s| s.misbehave = Some(Misbehave::EndlessAnswer));
    let mut c = active(&server, "chat").await;
    c.send(ask.clone()).await;
    c.until("session.closed").await;
    server.wait_log("an answer of more than 256 KB of text", WAIT);
    server.wait_idle();
    back_to_before(&server);

    worker.with(|s| s.misbehave = Some(Misbehave::HugeMessage));
    let mut c = active(&server, "chat").await;
    c.send(ask.clone()).await;
    c.until("session.closed").await;
    server.wait_log("Message too long", WAIT);
    server.wait_idle();
    back_to_before(&server);

    worker.with(|s| s.misbehave = None);
    let mut c = active(&server, "chat").await;
    c.send(ask).await;
    assert!(c.until("response.done").await["text"].as_str().is_some_and(|t| t.starts_with("Mock answer")));
}
