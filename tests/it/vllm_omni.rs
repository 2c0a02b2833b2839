//! `backend = "vllm-omni"`: the gateway in front of vLLM-Omni servers, each session slot a
//! worker, over real sockets through a mock of the server written from its contract
//! (`common::vllm_omni`): the dialects through it, the voice prompt and the close of every
//! session, the queue in front of its slots, capacity taken by someone else, interrupts as
//! its cancel, its errors, and the server dying and coming back.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};

fn gateway(mock: &MockVllm, count: usize, voice: &std::path::Path) -> Server {
    let options = format!("ref_audio = \"{}\"", voice.display());
    Server::ready(Setup::default().workers(mock.entry("vo", count, &options)))
}

/// Sends a chunk and reads the deltas answering it.
async fn step(c: &mut Client, audio: &[f32], n: usize) -> Vec<Value> {
    c.send(append(audio)).await;
    answer_to(c, &format!("input_{n}")).await
}

/// A MiniCPM-o-dialect client that heard the mock's first reply (a voiced unit, then a quiet
/// one), with its chunks numbered from 1.
async fn hears_a_reply(c: &mut Client) {
    assert_eq!(kinds(&step(c, &quiet(), 1).await), ["listen"]);
    assert_eq!(kinds(&step(c, &loud(), 2).await), ["listen"]);
    let reply = step(c, &quiet(), 3).await;
    assert_eq!(kinds(&reply), ["text", "audio"], "{reply:?}");
    assert_eq!(reply[0]["text"], "Mock reply 1.");
    assert_eq!(pcm_of(&reply[1]["audio"]).len(), 24000, "a second of the model's voice at 24 kHz");
}

/// A client of the server's own opens a session on it directly and drops its socket without
/// `session.close`: the server holds that slot for its disconnect grace.
async fn hold_a_slot_and_drop_it(mock: &MockVllm, wav: &std::path::Path) {
    use base64::Engine;
    let wav_b64 = base64::engine::general_purpose::STANDARD.encode(std::fs::read(wav).unwrap());
    let (mut direct, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/v1/realtime?duplex=1", mock.addr)).await.unwrap();
    let update =
        json!({"type": "session.update", "session": {"ref_audio": format!("data:audio/wav;base64,{wav_b64}")}});
    futures_util::SinkExt::send(&mut direct, tokio_tungstenite::tungstenite::Message::text(update.to_string()))
        .await
        .unwrap();
    let created: Value = serde_json::from_str(direct.next().await.unwrap().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(created["type"], "session.created");
}

async fn close(mut c: Client) {
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
}

/// The session objects the mock opened (at least `opened`) carried the voice prompt as a WAV
/// data URL, and every session it opened was closed with `session.close` (none left to its 30 s
/// hold).
fn every_session_had_a_voice_and_was_closed(mock: &MockVllm, opened: usize) {
    mock.wait_for(|s| s.opened.len() >= opened && s.closed == s.opened.len(), |_| ());
    mock.with(|s| {
        assert_eq!(s.dropped, 0, "no socket dropped without session.close");
        assert_eq!(s.autostarts, 0, "never ?model= without autostart=0");
        for session in &s.opened {
            let voice = session["ref_audio"].as_str().unwrap();
            assert!(voice.starts_with("data:audio/wav;base64,"), "{}", &voice[..40.min(voice.len())]);
            assert_eq!(session["input_audio_format"], "pcm_f32le");
            assert_eq!(session["extra_body"]["auto_response"], true);
        }
    });
}

#[tokio::test]
async fn a_minicpm_and_an_openai_session_hear_the_model_through_vllm_omni() {
    let mock = MockVllm::start(2);
    let (_dir, wav) = voice();
    let server = gateway(&mock, 2, &wav);
    assert_eq!(server.status()["workers"][0]["backend"], format!("vllm-omni {}", mock.url()));

    let mut c = active(&server, "audio").await;
    hears_a_reply(&mut c).await;
    let last = step(&mut c, &quiet(), 4).await;
    assert_eq!(last.last().unwrap()["end_of_turn"], true, "{last:?}");
    assert_eq!(last[0]["text"], " Done.");
    // Camera frames ride the unit they came with.
    let mut v = active(&server, "video").await;
    v.send(append_with(&quiet(), json!({"video_frames": [jpeg_b64()]}))).await;
    answer_to(&mut v, "input_1").await;
    assert_eq!(mock.with(|s| s.frames), 1);
    close(v).await;
    close(c).await;
    assert_eq!(mock.with(|s| s.opened[0]["instructions"].clone()), "You are a test.");
    assert!(mock.with(|s| s.acks) >= 2, "the voice handed on is acknowledged as played");

    let mut o = Client::connect(&server.url("/v1/realtime?model=omni")).await;
    o.until("session.created").await;
    // A voice by name and a sampling knob vLLM-Omni lacks: taken, echoed, and said to be unapplied.
    o.send(json!({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "marin"}},
        "top_p": 0.5, "temperature": 0.6}}))
        .await;
    o.until("session.updated").await;
    let mut unapplied = Vec::new();
    while unapplied.len() < 2 {
        let e = o.until("error").await;
        assert_eq!(e["error"]["code"], "unsupported_setting", "{e}");
        unapplied.push(e["error"]["param"].as_str().unwrap().to_string());
    }
    unapplied.sort();
    assert_eq!(unapplied, ["session.top_p", "session.voice"]);
    for seconds in [(1.0, 0.5), (1.0, 0.0), (1.0, 0.0)] {
        o.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(seconds.0, 24000, seconds.1)})).await;
    }
    let delta = o.until("response.output_audio.delta").await;
    assert!(!delta["delta"].as_str().unwrap().is_empty());
    let transcript = o.until("response.output_audio_transcript.done").await;
    assert!(transcript["transcript"].as_str().unwrap().starts_with("Mock reply 1."), "{transcript}");
    drop(o);
    server.wait_idle();
    // The update started the OpenAI session over on its slot, with the temperature asked.
    every_session_had_a_voice_and_was_closed(&mock, 4);
    assert_eq!(mock.with(|s| s.opened.last().unwrap()["temperature"].clone()), json!(0.6));
}

#[tokio::test]
async fn three_clients_on_two_slots_the_third_waits_and_is_served_never_refused() {
    let mock = MockVllm::start(2);
    let (_dir, wav) = voice();
    let server = gateway(&mock, 2, &wav);
    let a = active(&server, "audio").await;
    let b = active(&server, "audio").await;
    let mut third = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    assert_eq!(third.expect("session.queued").await["position"], 1);
    close(a).await;
    third.until("session.queue_done").await;
    third.send(json!({"type": "session.init", "payload": {"system_prompt": "Third."}})).await;
    third.expect("session.created").await;
    hears_a_reply(&mut third).await;
    assert_eq!(mock.with(|s| s.refused), 0, "the gateway never asked a full server");
    close(third).await;
    close(b).await;
    every_session_had_a_voice_and_was_closed(&mock, 3);
}

/// Someone else (a direct client) holds one of the server's slots, and drops its socket without
/// `session.close`: the server holds that slot. The gateway's second client is refused by the
/// server at prepare (`resource_exhausted`), keeps its place at the head of the queue, and is
/// served once the hold ends; `/status` shows the slot retried meanwhile.
#[tokio::test]
async fn a_slot_taken_by_someone_else_keeps_the_client_queued_until_it_is_free() {
    let mock = MockVllm::start(2);
    mock.with(|s| s.hold = Duration::from_secs(3));
    let (_dir, wav) = voice();
    let server = gateway(&mock, 2, &wav);
    hold_a_slot_and_drop_it(&mock, &wav).await;

    let first = active(&server, "audio").await;
    let mut second = connected(&server, "audio").await;
    second.send(json!({"type": "session.init", "payload": {"system_prompt": "Wait for me."}})).await;
    let held = server.wait_status("a slot retried", WAIT, |s| {
        s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["failure"].as_str().is_some_and(|f| f.contains("resource_exhausted")))
    });
    assert!(held.to_string().contains("no free session slot"), "{held}");
    // No error: the client waits, and is served once the server frees the held slot.
    second.expect("session.created").await;
    assert!(mock.with(|s| s.refused) >= 1);
    hears_a_reply(&mut second).await;
    server.wait_log("back to the head of the queue", WAIT);
    close(second).await;
    close(first).await;
    mock.wait_for(|s| s.admitted == 0, |_| ());
}

#[tokio::test]
async fn an_interrupt_reaches_vllm_omni_as_its_cancel_and_nothing_of_the_answer_comes_after() {
    let mock = MockVllm::start(1);
    let (_dir, wav) = voice();
    let server = gateway(&mock, 1, &wav);
    let mut c = active(&server, "audio").await;
    hears_a_reply(&mut c).await;
    // The client barges in: force-listen on its next chunk.
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await;
    let after = answer_to(&mut c, "input_4").await;
    assert_eq!(kinds(&after), ["listen"], "nothing of the cancelled answer: {after:?}");
    mock.wait_for(|s| s.cancels == 1, |_| ());
    assert_eq!(mock.with(|s| s.forced), 1);
    // The session goes on: a new question, a new answer.
    assert_eq!(kinds(&step(&mut c, &loud(), 5).await), ["listen"]);
    let again = step(&mut c, &quiet(), 6).await;
    assert_eq!(again[0]["text"], "Mock reply 2.", "{again:?}");
    close(c).await;
    every_session_had_a_voice_and_was_closed(&mock, 1);
}

#[tokio::test]
async fn the_servers_errors_reach_the_client_with_their_code_and_the_session_goes_on() {
    let mock = MockVllm::start(1);
    let (_dir, wav) = voice();
    let server = gateway(&mock, 1, &wav);
    let mut c = active(&server, "audio").await;
    mock.with(|s| s.error_next_unit = Some("input_backpressure".into()));
    c.send(append(&quiet())).await;
    let e = c.until("error").await;
    assert!(e["error"]["message"].as_str().unwrap().contains("input_backpressure"), "{e}");
    assert_eq!(kinds(&step(&mut c, &quiet(), 2).await), ["listen"]);
    close(c).await;

    // What the engine does not apply is said, never dropped: settings by name and the ABI's own
    // fields it ignores, at creation; frames asked in slices, with the step that sent them.
    let mut v = connected(&server, "video").await;
    let config = json!({"length_penalty": 1.2, "max_slice_nums": 2, "top_k": 5, "temperature": 0.5});
    v.send(json!({"type": "session.init", "payload": {"system_prompt": "x", "config": config}})).await;
    let created = v.expect("session.created").await;
    let mut unsupported: Vec<String> = serde_json::from_value(created["unsupported_settings"].clone()).unwrap();
    unsupported.sort();
    assert_eq!(unsupported, ["length_penalty", "max_slice_nums", "top_k"], "temperature is applied");
    v.send(append_with(&quiet(), json!({"video_frames": [jpeg_b64()], "max_slice_nums": 3}))).await;
    let e = v.until("error").await;
    assert!(e["error"]["message"].as_str().unwrap().contains("max_slice_nums 3"), "{e}");
    v.send(append_with(&quiet(), json!({"video_frames": [jpeg_b64()], "max_slice_nums": 3}))).await;
    assert_eq!(kinds(&answer_to(&mut v, "input_2").await), ["listen"], "said once");
    close(v).await;

    // The trap the gateway avoids (autostart=0), as the server sets it.
    let (mut trapped, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/v1/realtime?duplex=1&model=m", mock.addr)).await.unwrap();
    let said: Value = serde_json::from_str(trapped.next().await.unwrap().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(said["error"]["code"], "ref_audio_required");
    assert_eq!(mock.with(|s| s.opened.len()), 2, "the gateway's sessions only");
}

#[tokio::test]
async fn a_server_that_dies_ends_its_session_with_backend_error_and_its_slots_come_back_with_it() {
    let mock = MockVllm::start(2);
    let (_dir, wav) = voice();
    let server = gateway(&mock, 2, &wav);
    let mut c = active(&server, "audio").await;
    assert_eq!(kinds(&step(&mut c, &quiet(), 1).await), ["listen"]);
    mock.kill();
    c.send(append(&quiet())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    assert_eq!(c.closed().await, Some(1011));
    // Both slots out while it is down (the idle one finds out from /health).
    server
        .wait_status("both slots out", WAIT, |s| s["workers"].as_array().unwrap().iter().all(|w| w["state"] != "idle"));
    mock.revive();
    server.wait_status("both slots back", Duration::from_secs(40), |s| {
        s["workers"].as_array().unwrap().iter().all(|w| w["state"] == "idle")
    });
    let mut again = active(&server, "audio").await;
    hears_a_reply(&mut again).await;
    close(again).await;
}

/// The connection to the server breaks while the server lives (a network fault): the session
/// ends with `backend_error`, and the slot is not left to the server's 30 s hold: the session
/// is taken back on a new connection (`session.resume`) and closed.
#[tokio::test]
async fn a_session_whose_connection_breaks_is_taken_back_and_closed_not_left_held() {
    let mock = MockVllm::start(1);
    let proxy = Proxy::start(mock.addr);
    let (_dir, wav) = voice();
    let entry = mock
        .entry("vo", 1, &format!("ref_audio = \"{}\"", wav.display()))
        .replace(&mock.url(), &format!("http://{}", proxy.addr));
    let server = Server::ready(Setup::default().workers(entry));
    let mut c = active(&server, "audio").await;
    assert_eq!(kinds(&step(&mut c, &quiet(), 1).await), ["listen"]);
    proxy.cut();
    proxy.restore();
    c.send(append(&quiet())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    // Taken back and closed at once, not held for the server's 30 s.
    mock.wait_for(|s| s.resumed == 1 && s.closed == 1 && s.admitted == 0, |_| ());
    server.wait_log("taken back and closed", WAIT);
    let mut again = active(&server, "audio").await;
    hears_a_reply(&mut again).await;
    close(again).await;
}

/// The operators' script (scripts/vllm_omni_check.sh), run here against the mock as an
/// operator runs it against a real server: every scenario passes.
#[tokio::test]
async fn the_operators_check_passes_against_the_mock() {
    if !needs(&[Need::Sdks]) {
        return;
    }
    let mock = MockVllm::start(2);
    let (dir, wav) = voice();
    // A "question": two voiced seconds (the mock answers a voiced unit followed by a quiet one).
    let question = dir.path().join("question.wav");
    write_wav(&question, 2, 12000.0);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(root.join("scripts/vllm_omni_check.sh"))
        .args([mock.url(), "2".into(), wav.display().to_string(), question.display().to_string()])
        .env("OMNI_BIN", env!("CARGO_BIN_EXE_omni-gateway"))
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(said.lines().filter(|l| l.starts_with("PASS ")).count(), 5, "{said}");
    mock.with(|s| assert_eq!(s.closed, s.opened.len(), "every session closed: {s:?}"));
}

/// The model takes longer than a step waits for a reply's first piece: that piece comes with the
/// next step, with the next unit's decision (the step that owed one waits for its own too, so
/// the decisions are not a unit late from then on), and a barge-in before the late reply's start
/// was read still cancels it: none of it reaches the client.
#[tokio::test]
async fn a_late_decision_does_not_make_the_next_ones_late_and_a_barge_in_still_cancels_it() {
    let mock = MockVllm::start(1);
    let (_dir, wav) = voice();
    let options = format!("ref_audio = \"{}\"\ndecision_wait_ms = 300", wav.display());
    let server = Server::ready(Setup::default().workers(mock.entry("vo", 1, &options)));
    let mut c = active(&server, "audio").await;
    assert_eq!(kinds(&step(&mut c, &quiet(), 1).await), ["listen"]);
    assert_eq!(kinds(&step(&mut c, &loud(), 2).await), ["listen"]);
    mock.with(|s| s.unit_delay = Duration::from_millis(800));
    assert_eq!(kinds(&step(&mut c, &quiet(), 3).await), ["listen"], "the reply is late");
    mock.wait_for(|s| s.pieces == 1, |_| ());
    mock.with(|s| s.unit_delay = Duration::ZERO);
    let both = step(&mut c, &quiet(), 4).await;
    let text: String = both.iter().filter_map(|d| d["text"].as_str()).collect();
    assert_eq!(text, "Mock reply 1. Done.", "the late piece and this unit's own: {:?}", kinds(&both));
    assert_eq!(both.last().unwrap()["end_of_turn"], true);
    assert_eq!(kinds(&step(&mut c, &quiet(), 5).await), ["listen"], "in step again");

    // A reply late again; the client barges in before its start is read.
    assert_eq!(kinds(&step(&mut c, &loud(), 6).await), ["listen"]);
    mock.with(|s| s.unit_delay = Duration::from_millis(800));
    assert_eq!(kinds(&step(&mut c, &quiet(), 7).await), ["listen"]);
    mock.wait_for(|s| s.pieces == 3, |_| ());
    mock.with(|s| s.unit_delay = Duration::ZERO);
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_8").await), ["listen"], "none of the cancelled reply");
    mock.wait_for(|s| s.cancels == 1, |_| ());
    assert_eq!(kinds(&step(&mut c, &quiet(), 9).await), ["listen"]);
    close(c).await;
}

/// Behind replicas, a vLLM-Omni server is reached through a node on its host: its slots are the
/// node's workers. Through a node the model is heard, every session is closed, and a slot taken
/// by someone else at prepare keeps the client waiting until it is free.
#[tokio::test]
async fn a_nodes_vllm_omni_slots_serve_a_gateway_and_a_slot_taken_keeps_the_client_waiting() {
    let mock = MockVllm::start(2);
    mock.with(|s| s.hold = Duration::from_secs(3));
    let (_dir, wav) = voice();
    let node = Node::start(&mock.entry("vo", 2, &format!("ref_audio = \"{}\"", wav.display())), "");
    let server = Server::start(Setup::default().workers(String::new()).extra(&node.entry("gpu1", "")));
    server.wait_status("the node's slots join", WAIT, |s| {
        let w = s["workers"].as_array().unwrap();
        w.len() == 2 && w.iter().all(|w| w["state"] == "idle")
    });
    let mut c = active(&server, "audio").await;
    hears_a_reply(&mut c).await;
    close(c).await;
    every_session_had_a_voice_and_was_closed(&mock, 1);

    // A direct client takes a slot and drops without closing it: the server holds it.
    hold_a_slot_and_drop_it(&mock, &wav).await;
    let first = active(&server, "audio").await;
    let mut second = connected(&server, "audio").await;
    second.send(json!({"type": "session.init", "payload": {"system_prompt": "Through the node."}})).await;
    second.expect("session.created").await;
    assert!(mock.with(|s| s.refused) >= 1, "the server refused a slot while the dropped one was held");
    hears_a_reply(&mut second).await;
    close(second).await;
    close(first).await;
    mock.wait_for(|s| s.admitted == 0, |_| ());
}
