//! The OpenAI-shaped dialects as codecs, without a server.

use omni_actors::domain::{BackendInfo, SessionKind, StepKind, StepOutcome};
use omni_actors::edge::dialect::{DecodeError, Dialect, Emit, Outbox};
use omni_actors::protocol::{Inbound, Outbound, ProtocolError};
use serde_json::{Value, json};

use super::coding;
use super::conf::{apply, defaults};
use super::{Flavor, Realtime};
use crate::Limits;
use crate::conversation::Coding;
use crate::conversation::DEFAULT_STEP;

fn pcm16_b64(samples: &[f32]) -> String {
    coding::encode(Coding::Pcm16, samples, 24000)
}

fn types(out: &Outbox) -> Vec<String> {
    out.texts()
        .iter()
        .map(|f| serde_json::from_str::<Value>(f).unwrap()["type"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn session_update_in_every_shape() {
    let beta = |session: Value| apply(&defaults(Flavor::Beta), &session, Flavor::Beta);
    let c = beta(json!({"instructions": "hi", "voice": "echo", "modalities": ["text"], "turn_detection": null,
                     "input_audio_format": "pcm16", "max_response_output_tokens": 64}))
    .unwrap();
    assert_eq!(
        (c.instructions.as_str(), c.voice.as_str(), c.audio_out, c.vad.is_none(), c.max_tokens),
        ("hi", "echo", false, true, Some(64))
    );
    assert_eq!(c.setup().kind, SessionKind::Turn);
    let g = apply(&defaults(Flavor::Ga), &json!({"type": "realtime", "output_modalities": ["audio"],
                     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad", "threshold": 0.7}},
                               "output": {"voice": "marin"}}}), Flavor::Ga)
        .unwrap();
    assert_eq!((g.voice.as_str(), g.audio_out, g.vad.as_ref().unwrap().threshold), ("marin", true, 0.7));
    let qwen = |session: Value| apply(&defaults(Flavor::Qwen), &session, Flavor::Qwen);
    let q = qwen(json!({"modalities": ["text", "audio"], "voice": "Chelsie", "input_audio_format": "pcm", "output_audio_format": "pcm",
                     "audio": {"input": {"format": {"type": "pcm", "sample_rate": 16000}}}}))
        .unwrap();
    assert_eq!(q.input_rate, 16000);
    for (bad, param) in [
        (json!({"input_audio_format": "g711_ulaw"}), "session.input_audio_format"),
        (json!({"modalities": ["video"]}), "session.modalities"),
        (json!({"turn_detection": {"type": "magic"}}), "session.turn_detection"),
        (json!({"temperature": "hot"}), "session.temperature"),
        (json!({"max_response_output_tokens": 0}), "session.max_response_output_tokens"),
        (json!({"output_audio_format": {"type": "pcm", "sample_rate": 16000}}), "session.output_audio_format"),
    ] {
        let e = qwen(bad.clone()).unwrap_err();
        assert!(e.to_string().starts_with(param), "{bad}: {e}");
    }
}

/// A backend that transcribes, counts audio tokens and applies top_k.
fn capable() -> BackendInfo {
    BackendInfo {
        name: "test".into(),
        transcripts: true,
        token_details: true,
        settings: vec!["top_k".into()],
        ..BackendInfo::default()
    }
}

fn active(flavor: Flavor) -> (Realtime, Outbox) {
    active_with(flavor, &capable())
}

fn active_with(flavor: Flavor, backend: &BackendInfo) -> (Realtime, Outbox) {
    let mut d = Realtime::new(flavor, "m", Limits::default(), &crate::vad::energy());
    let mut out = Outbox::default();
    d.encode(Outbound::QueueDone, &mut out);
    assert!(matches!(out.issued()[..], [Inbound::Init(_)]), "the dialect initialises its session itself");
    out.clear();
    let kind = SessionKind::Duplex;
    d.encode(Outbound::Created { session_id: "sess_1", kind, prompt_length: 0, queue_wait_ms: 0, backend }, &mut out);
    (d, out)
}

/// The backend took the settings of the oldest reconfigure.
fn reconfigured(d: &mut Realtime, out: &mut Outbox) {
    d.encode(Outbound::Reconfigured { prompt_length: 0, backend: &capable() }, out);
}

fn update(d: &mut Realtime, session: Value, out: &mut Outbox) -> Vec<Inbound> {
    let frame = json!({"type": "session.update", "session": session}).to_string();
    d.decode(&frame.into(), out).unwrap()
}

#[test]
fn a_reconfigure_the_backend_refuses_is_one_error_and_the_previous_configuration_stays() {
    let (mut d, _) = active(Flavor::Qwen);
    let mut out = Outbox::default();
    let cmds = update(&mut d, json!({"instructions": "Be brief.", "top_k": 5}), &mut out);
    assert!(matches!(&cmds[..], [Inbound::Reconfigure(s)] if s.system_prompt == "Be brief."));
    reconfigured(&mut d, &mut out);
    assert_eq!(types(&out), ["session.updated"]);
    out.clear();
    // The backend refuses the next settings.
    let cmds = update(&mut d, json!({"instructions": "Be verbose.", "top_k": 7}), &mut out);
    assert_eq!(cmds.len(), 1);
    let refusal = ProtocolError::InvalidPayload("setting top_k has an invalid value '7'".into());
    d.encode(Outbound::ReconfigureFailed(&refusal), &mut out);
    assert_eq!(types(&out), ["error"], "one error, no session.updated");
    assert!(frame(out.texts()[0])["error"]["message"].as_str().unwrap().contains("top_k"));
    out.clear();
    // The session restores the previous settings; the dialect shows them, and asks for no more.
    reconfigured(&mut d, &mut out);
    assert!(out.is_empty(), "{out:?}");
    let cmds = update(&mut d, json!({}), &mut out);
    assert!(cmds.is_empty(), "nothing changed: {cmds:?}");
    let shown = frame(out.texts()[0]);
    assert_eq!(
        (shown["session"]["instructions"].clone(), shown["session"]["top_k"].clone()),
        (json!("Be brief."), json!(5))
    );
}

fn frame(f: &str) -> Value {
    serde_json::from_str(f).unwrap()
}

#[test]
fn nothing_but_queue_events_before_created_then_updates_in_order() {
    let mut d = Realtime::new(Flavor::Beta, "m", Limits::default(), &crate::vad::energy());
    let mut out = Outbox::default();
    let cmds = d
        .decode(
            &bytestring::ByteString::from(String::from(
                &json!({"type": "session.update", "session": {"instructions": "x"}}).to_string(),
            )),
            &mut out,
        )
        .unwrap();
    assert!(cmds.is_empty() && out.is_empty(), "a waiting client hears nothing");
    d.encode(Outbound::QueueDone, &mut out);
    let Some(Inbound::Init(setup)) = out.issued().first().cloned().cloned() else { panic!() };
    out.clear();
    assert_eq!(setup.system_prompt, "x", "the session starts with the configuration so far");
    let backend = &capable();
    d.encode(
        Outbound::Created {
            session_id: "sess_9",
            kind: SessionKind::Duplex,
            prompt_length: 1,
            queue_wait_ms: 0,
            backend,
        },
        &mut out,
    );
    assert_eq!(types(&out), ["session.created", "session.updated"]);
    let created: Value = serde_json::from_str(out.texts()[0]).unwrap();
    assert_eq!(created["session"]["id"], "sess_9");
    assert!(out.issued().is_empty(), "prepared as configured: no reconfigure");
}

#[test]
fn appended_audio_of_any_size_is_gathered_into_steps() {
    let (mut d, _) = active(Flavor::Beta);
    let mut out = Outbox::default();
    let piece = pcm16_b64(&vec![0.0; 2400]); // 100 ms at 24 kHz
    let mut chunks = Vec::new();
    for _ in 0..25 {
        chunks.extend(
            d.decode(
                &bytestring::ByteString::from(String::from(
                    &json!({"type": "input_audio_buffer.append", "audio": piece}).to_string(),
                )),
                &mut out,
            )
            .unwrap(),
        );
    }
    assert_eq!(chunks.len(), 2, "2.5 s of audio is 2 one-second steps");
    assert!(chunks.iter().all(|c| matches!(c, Inbound::Chunk(ch) if ch.audio.len() == DEFAULT_STEP)));
}

#[test]
fn audio_is_gathered_into_the_chunk_the_backend_prefers() {
    let mut out = Outbox::default();
    for (preferred, step) in [(3200, 3200), (800, 1600), (64000, 16000), (0, DEFAULT_STEP)] {
        let backend = BackendInfo { step_samples: preferred, ..capable() };
        let (mut d, _) = active_with(Flavor::Beta, &backend);
        let mut chunks = Vec::new();
        for _ in 0..20 {
            // 100 ms at 24 kHz each, 2 s in all.
            let frame = json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&[0.0; 2400])}).to_string();
            chunks.extend(d.decode(&frame.into(), &mut out).unwrap());
        }
        assert_eq!(chunks.len(), 32000 / step, "{preferred}: {} steps", chunks.len());
        assert!(chunks.iter().all(|c| matches!(c, Inbound::Chunk(ch) if ch.audio.len() == step)), "{preferred}");
    }
    // One append of 2.5 s to a backend of 200 ms steps: chunks of whole steps, at most a
    // second each, the rest kept for the next append.
    let (mut d, _) = active_with(Flavor::Beta, &BackendInfo { step_samples: 3200, ..capable() });
    let frame = json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&[0.0; 60000])}).to_string();
    let chunks = d.decode(&frame.into(), &mut out).unwrap();
    let sizes: Vec<usize> =
        chunks.iter().filter_map(|c| if let Inbound::Chunk(ch) = c { Some(ch.audio.len()) } else { None }).collect();
    assert_eq!(sizes, [16000, 16000, 6400]);
}

fn append(d: &mut Realtime, samples: &[f32], out: &mut Outbox) {
    let frame = json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(samples)}).to_string();
    d.decode(&frame.into(), out).unwrap();
}

/// `seconds` of a loud tone (speech to the energy detector) at 16 kHz.
fn tone(seconds: f32) -> Vec<f32> {
    (0..(16000.0 * seconds) as usize).map(|i| 0.3 * (i as f32 * 0.1).sin()).collect()
}

#[test]
fn speech_stops_at_its_own_end_and_the_answer_brings_the_transcript() {
    // Qwen's input is 16 kHz, and its default silence is 800 ms.
    let (mut d, _) = active(Flavor::Qwen);
    let mut out = Outbox::default();
    append(&mut d, &vec![0.0; 8000], &mut out);
    append(&mut d, &tone(1.0), &mut out);
    assert_eq!(types(&out), ["input_audio_buffer.speech_started"]);
    // Speech began at 500 ms: its start, less the 300 ms of padding.
    assert_eq!(frame(out.texts()[0])["audio_start_ms"], 200);
    out.clear();
    // 2 s of silence, sent in 100 ms pieces: the stop comes after 800 ms of them.
    let mut at_stop = None;
    for i in 0..20 {
        append(&mut d, &vec![0.0; 1600], &mut out);
        if at_stop.is_none() && !out.is_empty() {
            at_stop = Some(i + 1);
        }
    }
    assert_eq!(at_stop, Some(8), "stopped after 800 ms of silence, not before and not later");
    assert_eq!(
        types(&out),
        ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.created"]
    );
    let stopped = frame(out.texts()[0]);
    assert_eq!(stopped["audio_end_ms"], 1500, "the end of the speech, not of the audio (2500 ms)");
    let item = frame(out.texts()[2]);
    assert_eq!(item["item"]["id"], stopped["item_id"]);
    assert_eq!(item["item"]["content"][0]["transcript"], Value::Null);
    out.clear();
    // The model answers: what it heard goes to the committed item, and no second stop.
    d.encode(Outbound::Transcript { session_id: "s", input_id: "input_3", response_id: None, text: "Hi" }, &mut out);
    let speak =
        StepOutcome { kind: StepKind::Speak, text: "Hello".into(), end_of_turn: true, ..StepOutcome::default() };
    d.encode(
        Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_3", outcome: &speak },
        &mut out,
    );
    let kinds = types(&out);
    assert_eq!(kinds[..2], ["conversation.item.input_audio_transcription.completed", "response.created"]);
    assert_eq!(frame(out.texts()[0])["item_id"], stopped["item_id"]);
    assert_eq!(frame(out.texts()[0])["transcript"], "Hi");
    assert!(!kinds.iter().any(|k| k.starts_with("input_audio_buffer")), "{kinds:?}");
}

#[test]
fn a_short_utterance_then_silence_gets_its_stop_and_a_model_without_transcripts_says_so_at_once() {
    let backend = BackendInfo { transcripts: false, ..capable() };
    let (mut d, _) = active_with(Flavor::Qwen, &backend);
    let mut out = Outbox::default();
    append(&mut d, &tone(0.3), &mut out);
    append(&mut d, &vec![0.0; 48000], &mut out);
    assert_eq!(
        types(&out),
        [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.created",
            "conversation.item.input_audio_transcription.failed",
        ]
    );
    assert_eq!(frame(out.texts()[1])["audio_end_ms"], 300);
    assert_eq!(frame(out.texts()[4])["error"]["code"], "transcription_unavailable");
}

#[test]
fn the_duplex_models_speech_becomes_a_response() {
    let (mut d, _) = active(Flavor::Qwen);
    let mut out = Outbox::default();
    let loud: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.1).sin()).collect();
    d.decode(&json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&loud)}).to_string().into(), &mut out)
        .unwrap();
    assert_eq!(types(&out), ["input_audio_buffer.speech_started"]);
    out.clear();
    let speak = |text: &str, eot| StepOutcome {
        kind: StepKind::Speak,
        text: text.into(),
        audio: vec![0.1; 24000],
        end_of_turn: eot,
        input_tokens: 5,
        output_tokens: 2,
        input_audio_tokens: 4,
        output_audio_tokens: 25,
        ..StepOutcome::default()
    };
    let s1 = speak("Hello", false);
    // The model says what it heard as it starts to answer.
    d.encode(Outbound::Transcript { session_id: "s", input_id: "input_2", response_id: None, text: "Hi" }, &mut out);
    d.encode(Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_2", outcome: &s1 }, &mut out);
    let s2 = speak(" there", true);
    d.encode(Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_3", outcome: &s2 }, &mut out);
    assert_eq!(
        types(&out),
        [
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.created",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            "response.output_item.added",
            "conversation.item.created",
            "response.content_part.added",
            "response.audio_transcript.delta",
            "response.audio.delta",
            "response.audio_transcript.delta",
            "response.audio.delta",
            "response.audio.done",
            "response.audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.done",
        ]
    );
    let user = frame(out.texts()[2]);
    assert_eq!(user["item"]["content"][0]["transcript"], "Hi", "the user item carries what was heard");
    let heard = frame(out.texts()[3]);
    assert_eq!((heard["item_id"].clone(), heard["transcript"].clone()), (user["item"]["id"].clone(), json!("Hi")));
    let done = frame(out.texts().last().unwrap());
    assert_eq!(done["response"]["status"], "completed");
    // Qwen's spelling; 2 x (5 in, 4 of them audio; 2 text and 25 speech out).
    let usage = &done["response"]["usage"];
    assert_eq!((usage["input_tokens"].clone(), usage["output_tokens"].clone()), (json!(10), json!(54)));
    assert_eq!(usage["input_tokens_details"], json!({"text_tokens": 2, "audio_tokens": 8}));
    assert_eq!(usage["output_tokens_details"], json!({"text_tokens": 4, "audio_tokens": 50}));
    assert!(usage.get("input_token_details").is_none());
    // Qwen shows the content part's text as `text`; response.done keeps `transcript`.
    assert_eq!(done["response"]["output"][0]["content"][0], json!({"type": "audio", "transcript": "Hello there"}));
    let kinds = types(&out);
    let at = |kind: &str| frame(out.texts()[kinds.iter().position(|k| k == kind).unwrap()]);
    assert_eq!(at("response.content_part.added")["part"], json!({"type": "audio", "text": ""}));
    assert_eq!(at("response.content_part.done")["part"], json!({"type": "audio", "text": "Hello there"}));
    assert_eq!(at("response.output_item.done")["item"]["content"][0]["text"], "Hello there");
    let audio = frame(out.texts()[9]);
    assert_eq!(coding::decode(Coding::Pcm16, audio["delta"].as_str().unwrap(), "d").unwrap().len(), 24000);
}

#[test]
fn openai_keeps_its_own_names_and_a_model_without_transcripts_says_so() {
    let silent = BackendInfo { name: "plain".into(), ..BackendInfo::default() };
    let (mut d, _) = active_with(Flavor::Beta, &silent);
    let mut out = Outbox::default();
    let update = json!({"type": "session.update", "session": {"input_audio_transcription": {"model": "whisper-1"}}});
    d.decode(&bytestring::ByteString::from(String::from(&update.to_string())), &mut out).unwrap();
    assert_eq!(frame(out.texts()[0])["session"]["input_audio_transcription"], json!({"model": "whisper-1"}));
    // A second of audio goes to the backend (1.1 s at 24 kHz: the resampler holds a little back).
    append(&mut d, &[0.0; 26400], &mut out);
    out.clear();
    let speak = StepOutcome {
        kind: StepKind::Speak,
        text: "Yes".into(),
        audio: vec![0.1; 24000],
        end_of_turn: true,
        input_tokens: 30,
        output_tokens: 1,
        ..StepOutcome::default()
    };
    d.encode(
        Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_1", outcome: &speak },
        &mut out,
    );
    let kinds = types(&out);
    let failed = frame(
        out.texts()[kinds.iter().position(|k| k == "conversation.item.input_audio_transcription.failed").unwrap()],
    );
    assert_eq!(failed["error"]["code"], "transcription_unavailable");
    assert_eq!(failed["error"]["param"], "session.input_audio_transcription");
    let done = frame(out.texts().last().unwrap());
    let usage = &done["response"]["usage"];
    // No audio counts from this model: 25 tokens per second of audio, the step's second heard
    // and the second spoken.
    assert_eq!(usage["output_token_details"], json!({"text_tokens": 1, "audio_tokens": 25}));
    assert_eq!(usage["input_token_details"], json!({"text_tokens": 5, "audio_tokens": 25, "cached_tokens": 0}));
    assert_eq!(done["response"]["output"][0]["content"][0], json!({"type": "audio", "transcript": "Yes"}));
}

#[test]
fn qwen_session_fields_settings_and_errors() {
    let (mut d, created) = active(Flavor::Qwen);
    let s = &frame(created.texts()[0])["session"];
    assert_eq!((s["enable_search"].clone(), s["search_options"].clone()), (json!(false), json!({})));
    assert_eq!(s["turn_detection"]["silence_duration_ms"], 800);
    assert_eq!(s["input_audio_transcription"], json!({"model": "gummy-realtime-v1"}));
    assert_eq!(s["temperature"], json!(0.8));
    // The sampling settings in force, as Qwen's document shows them, before any are set.
    for (name, value) in [
        ("top_p", json!(1.0)),
        ("top_k", json!(50)),
        ("repetition_penalty", json!(1.05)),
        ("presence_penalty", json!(0.0)),
    ] {
        assert_eq!(s[name], value, "{name}");
    }
    assert_eq!((s["seed"].clone(), s["max_tokens"].clone()), (json!(-1), json!(16384)));
    let mut out = Outbox::default();
    let update = json!({"type": "session.update", "event_id": "c_update", "session": {"temperature": 0.8, "top_p": 0.9, "top_k": 50,
        "repetition_penalty": 1.05, "presence_penalty": 0.0, "seed": -1, "enable_search": false, "search_options": {}}});
    let cmds = d.decode(&bytestring::ByteString::from(String::from(&update.to_string())), &mut out).unwrap();
    assert!(out.is_empty(), "session.updated waits for the backend to take the settings: {out:?}");
    reconfigured(&mut d, &mut out);
    let updated = frame(out.texts()[0]);
    assert_eq!(updated["session"]["temperature"].to_string(), "0.8", "no float32 artefacts");
    assert_eq!((updated["session"]["top_k"].clone(), updated["session"]["seed"].clone()), (json!(50), json!(-1)));
    assert_eq!(updated["session"]["top_p"], json!(0.9), "the client's value replaces the default");
    // The settings reach the backend; the capable test backend applies only top_k. `seed: -1`
    // asks for no fixed seed: nothing to send, nothing unsupported.
    let [Inbound::Reconfigure(setup)] = &cmds[..] else { panic!("{cmds:?}") };
    let names: Vec<&str> = setup.generation.settings.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["presence_penalty", "repetition_penalty", "top_k", "top_p"]);
    let unsupported: Vec<String> =
        out.texts()[1..].iter().map(|f| frame(f)["error"]["param"].as_str().unwrap().to_string()).collect();
    assert_eq!(unsupported, ["session.presence_penalty", "session.repetition_penalty", "session.top_p"]);
    assert_eq!(frame(out.texts()[1])["error"]["code"], "unsupported_setting");
    // Reported once the backend took the update, when other events may have been read since:
    // it carries no client event's id (never the id of the last one read).
    assert_eq!(frame(out.texts()[1])["error"]["event_id"], Value::Null);
    // Refusals with Qwen's codes.
    for (session, param) in [
        (json!({"modalities": ["audio"]}), "session.modalities"),
        (json!({"top_p": 1.5}), "session.top_p"),
        (json!({"seed": "x"}), "session.seed"),
        (json!({"temperature": 3}), "session.temperature"),
    ] {
        let e = d
            .decode(
                &bytestring::ByteString::from(String::from(
                    &json!({"type": "session.update", "session": session}).to_string(),
                )),
                &mut out,
            )
            .unwrap_err();
        let DecodeError::Protocol(e) = e else { panic!() };
        let mut o = Outbox::default();
        d.encode(Outbound::Error(&e), &mut o);
        let error = &frame(o.texts()[0])["error"];
        assert_eq!((error["code"].as_str(), error["param"].as_str()), (Some("invalid_value"), Some(param)), "{error}");
    }
}

#[test]
fn a_cut_short_response_is_incomplete_in_qwen_and_cancelled_in_openai() {
    for (flavor, status) in [(Flavor::Qwen, "incomplete"), (Flavor::Beta, "cancelled")] {
        let (mut d, _) = active(flavor);
        let mut out = Outbox::default();
        let update = json!({"type": "session.update", "session": {"turn_detection": null}});
        d.decode(&bytestring::ByteString::from(String::from(&update.to_string())), &mut out).unwrap();
        let item = json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "hi"}]}});
        d.decode(&bytestring::ByteString::from(String::from(&item.to_string())), &mut out).unwrap();
        d.decode(
            &bytestring::ByteString::from(String::from(&json!({"type": "response.create"}).to_string())),
            &mut out,
        )
        .unwrap();
        out.clear();
        d.decode(
            &bytestring::ByteString::from(String::from(&json!({"type": "response.cancel"}).to_string())),
            &mut out,
        )
        .unwrap();
        let done = frame(out.texts().last().unwrap());
        assert_eq!(done["response"]["status"], status, "{flavor:?}");
    }
}

#[test]
fn manual_turn_commit_and_create() {
    let (mut d, _) = active(Flavor::Ga);
    let mut out = Outbox::default();
    let cmds = d
        .decode(&bytestring::ByteString::from(String::from(&json!({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": null, "transcription": {"model": "any"}}}}}).to_string())), &mut out)
        .unwrap();
    assert!(matches!(cmds[..], [Inbound::Reconfigure(ref s)] if s.kind == SessionKind::Turn));
    reconfigured(&mut d, &mut out);
    assert_eq!(types(&out), ["session.updated"]);
    out.clear();
    let e = d
        .decode(
            &bytestring::ByteString::from(String::from(&json!({"type": "input_audio_buffer.commit"}).to_string())),
            &mut out,
        )
        .unwrap_err();
    assert!(matches!(e, DecodeError::Protocol(ref p) if p.code() == "input_audio_buffer_commit_empty"), "{e:?}");
    d.decode(
        &json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&vec![0.2; 24000])}).to_string().into(),
        &mut out,
    )
    .unwrap();
    d.decode(
        &bytestring::ByteString::from(String::from(&json!({"type": "input_audio_buffer.commit"}).to_string())),
        &mut out,
    )
    .unwrap();
    let cmds = d
        .decode(&bytestring::ByteString::from(String::from(&json!({"type": "response.create"}).to_string())), &mut out)
        .unwrap();
    let [Inbound::Turn { input, streaming: true }] = &cmds[..] else { panic!("{cmds:?}") };
    assert!((input.messages[0].audios[0].len() as i64 - 16000).abs() < 400);
    assert_eq!(types(&out), ["input_audio_buffer.committed", "conversation.item.added", "response.created"]);
    out.clear();
    assert!(input.continues, "manual-mode items continue the conversation");
    let transcript = Outbound::Transcript { session_id: "s", input_id: "input_1", response_id: Some("r"), text: "hm" };
    d.encode(transcript, &mut out);
    let delta = Outbound::TurnDelta {
        session_id: "s",
        response_id: "r",
        input_id: "input_1",
        text: "ok",
        audio: &[0.1; 6000],
        kv_length: 4,
        generate_us: 0,
        call: None,
    };
    d.encode(delta, &mut out);
    d.encode(
        Outbound::TurnDone {
            session_id: "s",
            response_id: "r",
            text: "ok",
            audio: None,
            input_tokens: 3,
            output_tokens: 1,
            input_audio_tokens: 0,
            output_audio_tokens: 6,
            kv_length: 4,
            duration_ms: 1,
            cancelled: false,
        },
        &mut out,
    );
    assert_eq!(
        types(&out),
        [
            "conversation.item.input_audio_transcription.completed",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
            "response.output_audio_transcript.delta",
            "response.output_audio.delta",
            "response.output_audio.done",
            "response.output_audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "conversation.item.done",
            "response.done",
        ]
    );
    // The voice's delta says where its voice is: kept for a resume, it is the same event, empty.
    let voiced = out.items().iter().find_map(|e| match e {
        Emit::Voiced(v) => Some(v),
        _ => None,
    });
    let voiced = voiced.expect("the audio delta is a voiced frame");
    let quiet: Value = serde_json::from_str(&voiced.quiet()).unwrap();
    let whole: Value = serde_json::from_str(&voiced.text).unwrap();
    assert_eq!((quiet["type"].as_str(), quiet["delta"].as_str()), (Some("response.output_audio.delta"), Some("")));
    assert_eq!(whole["delta"].as_str().map(str::len), Some(voiced.voice.len()));
    assert_eq!(voiced.samples, 6000);
}

#[test]
fn images_need_audio_first_and_errors_have_the_openai_shape() {
    let (mut d, _) = active(Flavor::Qwen);
    let mut out = Outbox::default();
    let e = d
        .decode(
            &json!({"type": "input_image_buffer.append", "image": "/9j/4AAQ", "event_id": "c1"}).to_string().into(),
            &mut out,
        )
        .unwrap_err();
    let DecodeError::Protocol(e) = e else { panic!() };
    assert_eq!(e.code(), "not_ready");
    let frame: Value = serde_json::from_str(&{
        let mut o = Outbox::default();
        d.encode(Outbound::Error(&e), &mut o);
        o.texts()[0].to_string()
    })
    .unwrap();
    assert_eq!(frame["type"], "error");
    assert_eq!(frame["error"]["event_id"], "c1");
    assert_eq!(frame["error"]["param"], "input_image_buffer.append");
    assert!(frame["event_id"].as_str().unwrap().starts_with("event_"));
}

/// A call's voice while it waits in the queue is not kept (the caller told once, `not_ready`):
/// the first step after creation holds only what was said from then on.
#[test]
fn a_calls_voice_while_queued_is_dropped_and_the_caller_told_once() {
    use omni_actors::edge::client::CallerAudio;
    use omni_actors::protocol::QueueInfo;
    let mut d = Realtime::new(Flavor::Ga, "m", Limits::default(), &crate::vad::energy());
    let mut out = Outbox::default();
    let info = QueueInfo { ticket: 2, position: 1, estimated_wait_s: 5.0, queue_length: 1, measured: false };
    d.encode(Outbound::Queued(info), &mut out);
    // A muted track's zeros are dropped without a word.
    for _ in 0..10 {
        let silence = CallerAudio { samples: vec![0.0; 960], rate: 48000 };
        assert!(d.hear(silence, &mut out).unwrap().is_empty());
    }
    assert!(!types(&out).contains(&"error".to_string()), "{:?}", types(&out));
    for _ in 0..50 {
        let voice = CallerAudio { samples: vec![0.3; 960], rate: 48000 };
        assert!(d.hear(voice, &mut out).unwrap().is_empty(), "nothing for the session while queued");
    }
    let errors: Vec<Value> = out
        .texts()
        .iter()
        .map(|f| serde_json::from_str::<Value>(f).unwrap())
        .filter(|e| e["type"] == "error")
        .collect();
    assert_eq!(errors.len(), 1, "told once: {errors:?}");
    assert_eq!(errors[0]["error"]["code"], "not_ready");
    // Created: the voice is taken from then on.
    d.encode(Outbound::QueueDone, &mut out);
    out.clear();
    let kind = SessionKind::Duplex;
    let backend = capable();
    d.encode(
        Outbound::Created { session_id: "sess_1", kind, prompt_length: 0, queue_wait_ms: 0, backend: &backend },
        &mut out,
    );
    let mut steps = Vec::new();
    for _ in 0..60 {
        steps.extend(d.hear(CallerAudio { samples: vec![0.3; 960], rate: 48000 }, &mut out).unwrap());
    }
    let heard: usize = steps.iter().map(|c| if let Inbound::Chunk(chunk) = c { chunk.audio.len() } else { 0 }).sum();
    assert!(heard <= 16000 * 6 / 5, "only the 1.2 s said after creation reach the backend: {heard} samples");
    assert!(heard > 0, "the voice after creation reaches the backend");
}

#[test]
fn a_calls_settings_are_applied_as_the_clients_own_and_a_bad_choice_is_refused() {
    use omni_actors::domain::{Tool, ToolChoice, Tools};
    use omni_actors::edge::client::{CallSettings, TurnDetection};
    let (mut d, _) = active(Flavor::Ga);
    let mut out = Outbox::default();
    let settings = CallSettings {
        instructions: Some("Answer the phone.".into()),
        voice: Some("marin".into()),
        turn_detection: Some(TurnDetection::Off),
        tools: None,
    };
    let cmds = d.configure(settings, &mut out).unwrap();
    assert!(matches!(&cmds[..], [Inbound::Reconfigure(s)] if s.system_prompt == "Answer the phone."), "{cmds:?}");
    reconfigured(&mut d, &mut out);
    let shown = frame(out.texts().last().unwrap());
    assert_eq!(shown["type"], "session.updated");
    assert_eq!(shown["session"]["audio"]["output"]["voice"], "marin");
    assert_eq!(shown["session"]["audio"]["input"]["turn_detection"], Value::Null, "turns off: the client commits");
    // A choice of a tool the settings do not give is the client's error, told as one.
    let tools = Tools { functions: vec![], choice: ToolChoice::Function("lookup".into()) };
    let bad = CallSettings { tools: Some(tools), ..Default::default() };
    assert!(matches!(d.configure(bad, &mut out), Err(DecodeError::Protocol(_))));
    let tool = Tool { name: "lookup".into(), description: "".into(), parameters: r#"{"type":"object"}"#.into() };
    let good =
        CallSettings { tools: Some(Tools { functions: vec![tool], choice: ToolChoice::Auto }), ..Default::default() };
    assert_eq!(d.configure(good, &mut out).unwrap().len(), 1);
}

#[test]
fn a_call_that_plays_the_voice_is_told_what_was_heard_in_openai_and_not_in_qwen() {
    use omni_actors::edge::client::{ModelAudio, Playback};
    let (mut d, _) = active(Flavor::Ga);
    assert!(d.carry_audio());
    let mut out = Outbox::default();
    d.played(Playback::Started { response: "resp_1".into() }, &mut out);
    assert_eq!(types(&out), ["output_audio_buffer.started"]);
    assert_eq!(frame(out.texts()[0])["response_id"], "resp_1");
    out.clear();
    // The client's clear: the call is told to stop the voice, and the `cleared` names the clear.
    let clear = json!({"type": "output_audio_buffer.clear", "event_id": "c1"}).to_string();
    assert!(d.decode(&clear.into(), &mut out).unwrap().is_empty());
    assert!(matches!(out.items(), [Emit::Audio(ModelAudio::Clear)]), "{out:?}");
    out.clear();
    d.played(Playback::Cleared { response: Some("resp_1".into()) }, &mut out);
    let cleared = frame(out.texts()[0]);
    assert_eq!(
        (cleared["type"].as_str(), cleared["client_event_id"].as_str()),
        (Some("output_audio_buffer.cleared"), Some("c1"))
    );
    out.clear();
    // A clear the server made (the caller spoke over the voice) names no client event; one of
    // nothing playing is not told.
    d.played(Playback::Cleared { response: Some("resp_2".into()) }, &mut out);
    assert!(frame(out.texts()[0]).get("client_event_id").is_none());
    out.clear();
    d.played(Playback::Cleared { response: None }, &mut out);
    assert!(out.is_empty());
    // Qwen has no such events.
    let (mut q, _) = active(Flavor::Qwen);
    assert!(q.carry_audio());
    q.played(Playback::Started { response: "resp_1".into() }, &mut out);
    assert!(out.is_empty());
}

#[test]
fn with_nobody_reading_text_the_dialect_writes_none_and_the_voice_still_goes() {
    use omni_actors::edge::dialect::Emit;
    let (mut d, _) = active(Flavor::Ga);
    assert!(d.carry_audio());
    let mut out = Outbox::default();
    out.set_wants_text(false);
    let speech = StepOutcome {
        kind: StepKind::Speak,
        text: "Hello".into(),
        audio: vec![0.1; 2400],
        end_of_turn: true,
        ..StepOutcome::listen(0)
    };
    d.encode(
        Outbound::Step { session_id: "sess_1", response_id: Some("r1"), input_id: "input_1", outcome: &speech },
        &mut out,
    );
    assert!(out.texts().is_empty(), "no event written: {out:?}");
    assert!(out.items().iter().any(|e| matches!(e, Emit::Audio(_))), "the voice goes to the edge: {out:?}");
}
