//! What a call does with the dialect's events, both ways, as plain functions.
//!
//! Out: the model's audio deltas become Opus frames on the audio track and never reach the
//! data channel; everything else is sent on `oai-events` as a WebSocket client would get it.
//! The user's speech starting (server VAD) clears the model's voice at once.
//!
//! In: `output_audio_buffer.clear` is the call's own (it clears the voice); `response.cancel`
//! clears it too and goes on to the session; the audio formats of a `session.update` are the
//! call's (Opus on the tracks, 24 kHz PCM to the session), so they are taken out of it.

use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

/// A server event, as the call sees it.
#[derive(Debug, PartialEq)]
pub enum Outgoing {
    /// The model's voice: 16-bit PCM at the dialect's 24 kHz.
    Audio { response_id: String, pcm: Vec<i16> },
    /// A response's audio is complete (its done event or the response's); sent on too.
    AudioDone { response_id: String },
    /// The user started speaking: the model's voice stops; sent on too.
    SpeechStarted,
    /// Anything else: sent on as it is.
    Other,
}

#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    response_id: Option<String>,
    #[serde(default)]
    delta: Option<String>,
    #[serde(default)]
    response: Option<ResponseHead>,
}

#[derive(Deserialize)]
struct ResponseHead {
    id: String,
}

/// Classifies one event the session sends.
pub fn outgoing(text: &str) -> Outgoing {
    let Ok(head) = serde_json::from_str::<Head>(text) else { return Outgoing::Other };
    match head.kind.as_str() {
        "response.output_audio.delta" | "response.audio.delta" => {
            let pcm = head
                .delta
                .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
                .map(|bytes| bytes.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect())
                .unwrap_or_default();
            Outgoing::Audio { response_id: head.response_id.unwrap_or_default(), pcm }
        }
        "response.output_audio.done" | "response.audio.done" => {
            Outgoing::AudioDone { response_id: head.response_id.unwrap_or_default() }
        }
        "response.done" => match head.response {
            Some(r) => Outgoing::AudioDone { response_id: r.id },
            None => Outgoing::Other,
        },
        "input_audio_buffer.speech_started" => Outgoing::SpeechStarted,
        _ => Outgoing::Other,
    }
}

/// A client event from the data channel, as the call sees it.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// `output_audio_buffer.clear`: the call's own.
    Clear { event_id: Option<String> },
    /// `response.cancel`: clears the voice, then goes to the session.
    Cancel,
    /// A `session.update` without the audio formats.
    Rewritten(String),
    /// Anything else, unchanged (malformed JSON too: the session answers it).
    Forward,
}

pub fn incoming(text: &str) -> Incoming {
    let Ok(mut event) = serde_json::from_str::<Value>(text) else { return Incoming::Forward };
    match event.get("type").and_then(Value::as_str) {
        Some("output_audio_buffer.clear") => {
            Incoming::Clear { event_id: event.get("event_id").and_then(Value::as_str).map(String::from) }
        }
        Some("response.cancel") => Incoming::Cancel,
        Some("session.update") => {
            let Some(session) = event.get_mut("session").and_then(Value::as_object_mut) else {
                return Incoming::Forward;
            };
            let mut changed = session.remove("input_audio_format").is_some();
            changed |= session.remove("output_audio_format").is_some();
            if let Some(audio) = session.get_mut("audio").and_then(Value::as_object_mut) {
                for side in ["input", "output"] {
                    if let Some(s) = audio.get_mut(side).and_then(Value::as_object_mut) {
                        changed |= s.remove("format").is_some();
                    }
                }
            }
            if changed { Incoming::Rewritten(event.to_string()) } else { Incoming::Forward }
        }
        _ => Incoming::Forward,
    }
}

/// The client's voice as the session takes it.
pub fn append(pcm: &[i16]) -> String {
    let bytes: Vec<u8> = pcm.iter().flat_map(|s| s.to_le_bytes()).collect();
    let audio = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!(r#"{{"type":"input_audio_buffer.append","audio":"{audio}"}}"#)
}

/// An `output_audio_buffer.*` event; the answer to a client's clear names its event.
pub fn buffer_event(kind: &str, response_id: &str, client_event_id: Option<&str>) -> String {
    let mut event = serde_json::json!({
        "type": format!("output_audio_buffer.{kind}"),
        "event_id": format!("event_{}", uuid::Uuid::new_v4().simple()),
        "response_id": response_id,
    });
    if let Some(id) = client_event_id {
        event["client_event_id"] = id.into();
    }
    event.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn audio_deltas_become_pcm_and_the_rest_passes() {
        let delta = base64::engine::general_purpose::STANDARD.encode([1u8, 0, 0xff, 0x7f]);
        let ev = json!({"type": "response.output_audio.delta", "response_id": "r1", "delta": delta}).to_string();
        assert_eq!(outgoing(&ev), Outgoing::Audio { response_id: "r1".into(), pcm: vec![1, i16::MAX] });
        let beta = json!({"type": "response.audio.delta", "response_id": "r2", "delta": ""}).to_string();
        assert_eq!(outgoing(&beta), Outgoing::Audio { response_id: "r2".into(), pcm: vec![] });
        let done = json!({"type": "response.done", "response": {"id": "r1", "status": "completed"}}).to_string();
        assert_eq!(outgoing(&done), Outgoing::AudioDone { response_id: "r1".into() });
        assert_eq!(outgoing(r#"{"type":"input_audio_buffer.speech_started"}"#), Outgoing::SpeechStarted);
        assert_eq!(outgoing(r#"{"type":"response.output_text.delta","delta":"hi"}"#), Outgoing::Other);
        assert_eq!(outgoing("not json"), Outgoing::Other);
    }

    #[test]
    fn a_session_update_loses_its_audio_formats_only() {
        let ev = json!({"type": "session.update", "session": {"instructions": "be brief",
            "input_audio_format": "pcm16", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
            "turn_detection": {"type": "server_vad"}}}}});
        let Incoming::Rewritten(text) = incoming(&ev.to_string()) else { panic!("not rewritten") };
        let out: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(out["session"]["instructions"], "be brief");
        assert_eq!(out["session"]["audio"]["input"], json!({"turn_detection": {"type": "server_vad"}}));
        assert!(out["session"].get("input_audio_format").is_none());
        assert_eq!(incoming(r#"{"type":"session.update","session":{"voice":"x"}}"#), Incoming::Forward);
        assert_eq!(
            incoming(r#"{"type":"output_audio_buffer.clear","event_id":"e1"}"#),
            Incoming::Clear { event_id: Some("e1".into()) }
        );
        assert_eq!(incoming(r#"{"type":"response.cancel"}"#), Incoming::Cancel);
    }

    #[test]
    fn appends_carry_little_endian_pcm() {
        let text = append(&[1, -2]);
        let v: Value = serde_json::from_str(&text).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(v["audio"].as_str().unwrap()).unwrap();
        assert_eq!(bytes, vec![1, 0, 0xfe, 0xff]);
    }
}
