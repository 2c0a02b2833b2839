//! The OpenAI-shaped dialects as codecs, without a server.

use omni_actors::dialect::{DecodeError, Dialect};
use omni_actors::domain::{SessionKind, StepKind};
use omni_actors::protocol::{Inbound, Outbound, ProtocolError};
use serde_json::{Value, json};

use super::conf::Conf;
use super::input::{decode_pcm16, encode_pcm16};
use super::{Flavor, Realtime, STEP};
use crate::dialect::Limits;

fn pcm16_b64(samples: &[f32]) -> String {
    encode_pcm16(samples)
}

fn types(frames: &[String]) -> Vec<String> {
    frames.iter().map(|f| serde_json::from_str::<Value>(f).unwrap()["type"].as_str().unwrap().to_string()).collect()
}

#[test]
fn session_update_in_every_shape() {
    let mut c = Conf::new(Flavor::Beta);
    c.apply(&json!({"instructions": "hi", "voice": "echo", "modalities": ["text"], "turn_detection": null,
                     "input_audio_format": "pcm16", "max_response_output_tokens": 64}))
        .unwrap();
    assert_eq!(
        (c.instructions.as_str(), c.voice.as_str(), c.audio_out, c.vad.is_none(), c.max_tokens),
        ("hi", "echo", false, true, Some(64))
    );
    assert_eq!(c.setup().kind, SessionKind::Turn);
    let mut g = Conf::new(Flavor::Ga);
    g.apply(&json!({"type": "realtime", "output_modalities": ["audio"],
                     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad", "threshold": 0.7}},
                               "output": {"voice": "marin"}}}))
        .unwrap();
    assert_eq!((g.voice.as_str(), g.audio_out, g.vad.as_ref().unwrap().threshold), ("marin", true, 0.7));
    let mut q = Conf::new(Flavor::Qwen);
    q.apply(&json!({"modalities": ["text", "audio"], "voice": "Chelsie", "input_audio_format": "pcm", "output_audio_format": "pcm",
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
        let e = Conf::new(Flavor::Qwen).apply(&bad).unwrap_err();
        assert!(e.to_string().starts_with(param), "{bad}: {e}");
    }
}

fn active(flavor: Flavor) -> (Realtime, Vec<String>) {
    let mut d = Realtime::new(flavor, "m", Limits::default());
    let mut out = Vec::new();
    d.encode(Outbound::QueueDone, &mut out);
    assert!(matches!(d.take_commands()[..], [Inbound::Init(_)]));
    let kind = SessionKind::Duplex;
    d.encode(Outbound::Created { session_id: "sess_1", kind, prompt_length: 0, queue_wait_ms: 0 }, &mut out);
    (d, out)
}

#[test]
fn nothing_but_queue_events_before_created_then_updates_in_order() {
    let mut d = Realtime::new(Flavor::Beta, "m", Limits::default());
    let mut out = Vec::new();
    let cmds =
        d.decode(&json!({"type": "session.update", "session": {"instructions": "x"}}).to_string(), &mut out).unwrap();
    assert!(cmds.is_empty() && out.is_empty(), "a waiting client hears nothing");
    d.encode(Outbound::QueueDone, &mut out);
    let Inbound::Init(setup) = d.take_commands().remove(0) else { panic!() };
    assert_eq!(setup.system_prompt, "x", "the session starts with the configuration so far");
    d.encode(
        Outbound::Created { session_id: "sess_9", kind: SessionKind::Duplex, prompt_length: 1, queue_wait_ms: 0 },
        &mut out,
    );
    assert_eq!(types(&out), ["session.created", "session.updated"]);
    let created: Value = serde_json::from_str(&out[0]).unwrap();
    assert_eq!(created["session"]["id"], "sess_9");
    assert!(d.take_commands().is_empty(), "prepared as configured: no reconfigure");
}

#[test]
fn appended_audio_of_any_size_is_gathered_into_steps() {
    let (mut d, _) = active(Flavor::Beta);
    let mut out = Vec::new();
    let piece = pcm16_b64(&vec![0.0; 2400]); // 100 ms at 24 kHz
    let mut chunks = Vec::new();
    for _ in 0..25 {
        chunks.extend(
            d.decode(&json!({"type": "input_audio_buffer.append", "audio": piece}).to_string(), &mut out).unwrap(),
        );
    }
    assert_eq!(chunks.len(), 2, "2.5 s of audio is 2 one-second steps");
    assert!(chunks.iter().all(|c| matches!(c, Inbound::Chunk(ch) if ch.audio.len() == STEP)));
}

#[test]
fn the_duplex_models_speech_becomes_a_response() {
    let (mut d, _) = active(Flavor::Qwen);
    let mut out = Vec::new();
    let loud: Vec<f32> = (0..16000).map(|i| 0.3 * (i as f32 * 0.1).sin()).collect();
    d.decode(&json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&loud)}).to_string(), &mut out).unwrap();
    assert_eq!(types(&out), ["input_audio_buffer.speech_started"]);
    out.clear();
    let speak = |text: &str, eot| omni_actors::domain::StepOutcome {
        kind: StepKind::Speak,
        text: text.into(),
        audio: vec![0.1; 24000],
        end_of_turn: eot,
        kv_length: 0,
        input_tokens: 5,
        output_tokens: 2,
        prefill_us: 0,
        generate_us: 0,
    };
    let s1 = speak("Hello", false);
    d.encode(Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_2", outcome: &s1 }, &mut out);
    let s2 = speak(" there", true);
    d.encode(Outbound::Step { session_id: "s", response_id: Some("r"), input_id: "input_3", outcome: &s2 }, &mut out);
    assert_eq!(
        types(&out),
        [
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.created",
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
    let done: Value = serde_json::from_str(out.last().unwrap()).unwrap();
    assert_eq!(done["response"]["status"], "completed");
    assert_eq!(done["response"]["usage"]["output_tokens"], 4);
    assert_eq!(done["response"]["output"][0]["content"][0]["transcript"], "Hello there");
    let audio: Value = serde_json::from_str(&out[8]).unwrap();
    assert_eq!(decode_pcm16(audio["delta"].as_str().unwrap(), "d").unwrap().len(), 24000);
}

#[test]
fn manual_turn_commit_and_create() {
    let (mut d, _) = active(Flavor::Ga);
    let mut out = Vec::new();
    let cmds = d
        .decode(&json!({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": null}}}}).to_string(), &mut out)
        .unwrap();
    assert!(matches!(cmds[..], [Inbound::Reconfigure(ref s)] if s.kind == SessionKind::Turn));
    assert_eq!(types(&out), ["session.updated"]);
    out.clear();
    let e = d.decode(&json!({"type": "input_audio_buffer.commit"}).to_string(), &mut out).unwrap_err();
    assert!(matches!(e, DecodeError::Protocol(ProtocolError::InvalidPayload(_))));
    d.decode(
        &json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(&vec![0.2; 24000])}).to_string(),
        &mut out,
    )
    .unwrap();
    d.decode(&json!({"type": "input_audio_buffer.commit"}).to_string(), &mut out).unwrap();
    let cmds = d.decode(&json!({"type": "response.create"}).to_string(), &mut out).unwrap();
    let [Inbound::Turn { input, streaming: true }] = &cmds[..] else { panic!("{cmds:?}") };
    assert!((input.messages[0].audios[0].len() as i64 - 16000).abs() < 400);
    assert_eq!(types(&out), ["input_audio_buffer.committed", "conversation.item.added", "response.created"]);
    out.clear();
    d.encode(Outbound::TurnDelta { session_id: "s", response_id: "r", text: "ok", audio: &[0.1; 6000] }, &mut out);
    d.encode(
        Outbound::TurnDone {
            session_id: "s",
            response_id: "r",
            text: "ok",
            audio: None,
            input_tokens: 3,
            output_tokens: 1,
            kv_length: 4,
            duration_ms: 1,
            cancelled: false,
        },
        &mut out,
    );
    assert_eq!(
        types(&out),
        [
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
}

#[test]
fn images_need_audio_first_and_errors_have_the_openai_shape() {
    let (mut d, _) = active(Flavor::Qwen);
    let mut out = Vec::new();
    let e = d
        .decode(
            &json!({"type": "input_image_buffer.append", "image": "/9j/4AAQ", "event_id": "c1"}).to_string(),
            &mut out,
        )
        .unwrap_err();
    let DecodeError::Protocol(e) = e else { panic!() };
    assert_eq!(e.code(), "not_ready");
    let frame: Value = serde_json::from_str(&{
        let mut o = Vec::new();
        d.encode(Outbound::Error(&e), &mut o);
        o.remove(0)
    })
    .unwrap();
    assert_eq!(frame["type"], "error");
    assert_eq!(frame["error"]["event_id"], "c1");
    assert_eq!(frame["error"]["param"], "input_image_buffer.append");
    assert!(frame["event_id"].as_str().unwrap().starts_with("event_"));
}
