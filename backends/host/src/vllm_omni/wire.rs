//! vLLM-Omni's duplex protocol as this backend speaks it: the messages it sends, and the
//! server's events it acts on, parsed into [`Event`]. Pinned to vLLM-Omni 0.30.0 (its
//! `entrypoints/duplex/` and `engine/duplex/` sources); docs/deployment.md names what differs
//! in other releases.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::domain::{DuplexChunk, SessionSetup};
use serde_json::{Value, json};

/// The path of the duplex WebSocket. `autostart=0`: without it, a `?model=` would open a
/// default session before our settings arrive, which fails on MiniCPM-o (`ref_audio_required`).
pub(super) const PATH: &str = "/v1/realtime?duplex=1&autostart=0";
/// At most this many camera frames ride one unit's append (the server's limit).
const MAX_FRAMES: usize = 2;
/// The server's receive-idle window asked for: an hour.
const IDLE_TIMEOUT_S: u32 = 3600;
/// The most voice one event may carry: ten seconds at 24 kHz.
const MAX_DELTA_SAMPLES: usize = 240_000;

/// The session's settings, the first message on the socket. The client's audio goes as it
/// arrives, float32 at 16 kHz (`pcm_f32le`, taken without re-encoding); the model's voice
/// comes back as 16-bit PCM at 24 kHz. The model owns the turns (`turn_detection: null`,
/// `auto_response`): one decision per one-second unit, as a MiniCPM-o worker's.
pub(super) fn session_update(setup: &SessionSetup, ref_audio: Option<String>, model: Option<&str>) -> String {
    let g = &setup.generation;
    let mut session = json!({
        "modalities": ["text", "audio"],
        "input_audio_format": "pcm_f32le",
        "sample_rate_hz": 16000,
        "output_audio_format": "pcm16",
        "turn_detection": null,
        "overlap_policy": "listen_only",
        "extra_body": {"auto_response": true, "force_listen_count": g.force_listen_count.unwrap_or(0)},
        // The server ends a session that sends nothing for this long (300 s by default); a
        // client may stay silent longer, and the gateway's own limits end a session.
        "idle_timeout_s": IDLE_TIMEOUT_S,
    });
    if !setup.system_prompt.is_empty() {
        session["instructions"] = json!(setup.system_prompt);
    }
    if let Some(t) = g.temperature {
        // As the client wrote it (1.2, not 1.2000000476837158).
        session["temperature"] = t.to_string().parse::<f64>().map_or(Value::Null, |v| json!(v));
    }
    if let Some(n) = g.max_new_tokens {
        session["max_response_output_tokens"] = json!(n);
    }
    if let Some(r) = ref_audio {
        session["ref_audio"] = json!(r);
    }
    if let Some(m) = model {
        session["model"] = json!(m);
    }
    json!({"type": "session.update", "session": session}).to_string()
}

/// A WAV file as the data URL `ref_audio` takes.
pub(super) fn wav_data_url(wav: &[u8]) -> String {
    format!("data:audio/wav;base64,{}", STANDARD.encode(wav))
}

/// One unit's `input_audio_buffer.append`, written as text: the client's own base64 of the
/// audio is forwarded when it has it (base64 needs no JSON escaping), else encoded once.
pub(super) fn append(c: &DuplexChunk, force_listen: bool) -> String {
    let frames = &c.frames[c.frames.len().saturating_sub(MAX_FRAMES)..];
    let mut m = String::with_capacity(96 + crate::chunk_text::encoded_len(c, frames));
    m.push_str(r#"{"type":"input_audio_buffer.append""#);
    if force_listen {
        m.push_str(r#","force_listen":true"#);
    }
    // Bare base64 (the server checks the JPEG's magic bytes; a data URL fails it).
    crate::chunk_text::push_frames("video_frames", frames, &mut m);
    crate::chunk_text::push_audio("audio", c, &mut m);
    m.push('}');
    m
}

/// Cancels `response_id`, or whatever response is active (one whose start is not read yet).
pub(super) fn cancel(response_id: Option<&str>) -> String {
    match response_id {
        Some(id) => json!({"type": "response.cancel", "response_id": id}).to_string(),
        None => json!({"type": "response.cancel"}).to_string(),
    }
}

/// The events received up to `seq`: the server's journal of them can be trimmed (it keeps them
/// for a resume, 60 s or 8 MiB, and stops keeping any past that).
pub(super) fn event_ack(seq: u64) -> String {
    json!({"type": "session.event_ack", "server_event_seq": seq}).to_string()
}

/// The voice handed on to the session counts as played (`playback_commit_policy` is
/// `ack_only`: the model's history keeps what was acknowledged). The gateway cannot know what a
/// client played; its session cuts the voice on barge-in and cancels the rest.
pub(super) fn playback_ack(response_id: &str, played_ms: u64) -> String {
    json!({"type": "playback.ack", "response_id": response_id, "item_id": format!("item_{response_id}"),
           "played_ms": played_ms})
    .to_string()
}

pub(super) fn close() -> String {
    json!({"type": "session.close", "reason": "client_close"}).to_string()
}

/// Takes a session whose connection was lost back, to close it (the server would hold its slot
/// for 30 to 35 s). `seq`: the last event received (older ones are not replayed).
pub(super) fn resume(session_id: &str, token: &str, seq: u64) -> String {
    json!({"type": "session.resume", "session_id": session_id, "resume_token": token,
           "last_received_server_event_seq": seq})
    .to_string()
}

/// What the backend acts on among the server's events.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Event {
    /// The session is open (`session.created`), with the token that takes it back on another
    /// connection.
    Created { session_id: String, resume_token: String },
    /// A session taken back on a new connection (`session.resumed`).
    Resumed,
    /// A cancel that came after the response's end cleared its unplayed voice
    /// (`output_audio_buffer.cleared`).
    Cleared,
    /// The model starts speaking (`response.created`).
    ResponseCreated { id: String },
    /// A piece of its voice, as 24 kHz samples (`response.output_audio.delta`).
    Audio { response_id: String, samples: Vec<f32>, end_of_turn: bool },
    /// A piece of its words (`response.output_audio_transcript.delta` or `response.output_text.delta`).
    Text { response_id: String, text: String },
    /// It listens: a unit's decision (no response), or the end of a response.
    Listen { response_id: Option<String> },
    /// A response ended: `completed`, `cancelled` or `failed`, with the reason.
    Done { id: String, status: String, reason: String },
    /// An error; in a session it does not end it.
    Error { code: String, message: String },
    /// The server ended the session (`session.closed`, `session.expired`, `session.replaced`).
    Ended { kind: String, reason: String },
    /// The server keeps no more of the session's events for a resume (`session.resync_required`).
    Unjournaled { reason: String },
    /// Anything else (item events, speech started, rate limits...).
    Other,
}

/// A frame that is not the protocol: what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct BadEvent(String);

/// One server event, and its number in the session's journal (`server_event_seq`: all but
/// `session.created` and the errors of the socket itself have one).
pub(super) fn parse(text: &str) -> Result<(Event, Option<u64>), BadEvent> {
    let v: Value = serde_json::from_str(text).map_err(|e| BadEvent(format!("not JSON: {e}")))?;
    Ok((event(&v)?, v["server_event_seq"].as_u64()))
}

fn event(v: &Value) -> Result<Event, BadEvent> {
    let bad = |why: String| BadEvent(why);
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let response_id = s(&v["response_id"]);
    Ok(match v["type"].as_str().ok_or_else(|| bad("an event without a type".into()))? {
        "session.created" => Event::Created { session_id: s(&v["session"]["id"]), resume_token: s(&v["resume_token"]) },
        "session.resumed" => Event::Resumed,
        "output_audio_buffer.cleared" => Event::Cleared,
        "response.created" => Event::ResponseCreated { id: s(&v["response"]["id"]) },
        "response.output_audio.delta" => {
            let b64 = v["delta"].as_str().unwrap_or("");
            let rate = v["sample_rate_hz"].as_u64().unwrap_or(24000);
            // Judged before it is decoded or resampled: at most ten seconds once at 24 kHz.
            let at_24k = (b64.len() as u64 / 4 * 3 / 2).saturating_mul(24000) / rate.max(1);
            if at_24k > MAX_DELTA_SAMPLES as u64 {
                return Err(bad(format!(
                    "an audio delta of {} samples at {rate} Hz (more than 10 s)",
                    b64.len() / 4 * 3 / 2
                )));
            }
            let samples = pcm16(b64)?;
            let samples = if rate == 24000 {
                samples
            } else {
                let rate = u32::try_from(rate).map_err(|_| bad(format!("an audio delta at {rate} Hz")))?;
                omni_actors::audio::resample(&samples, rate, 24000).map_err(|e| bad(format!("audio delta: {e}")))?
            };
            Event::Audio { response_id, samples, end_of_turn: v["metadata"]["end_of_turn"] == true }
        }
        "response.output_audio_transcript.delta" | "response.output_text.delta" => {
            Event::Text { response_id, text: s(&v["delta"]) }
        }
        "response.listen" => Event::Listen { response_id: v["response_id"].as_str().map(String::from) },
        "response.done" => Event::Done {
            id: s(&v["response"]["id"]),
            status: s(&v["response"]["status"]),
            reason: s(&v["response"]["status_details"]["reason"]),
        },
        // The session's errors carry `error.code`; the route's own (before a session) a
        // top-level `code` and a string `error`.
        "error" => match &v["error"] {
            Value::Object(e) => Event::Error {
                code: e.get("code").map(s).unwrap_or_default(),
                message: e.get("message").map(s).unwrap_or_default(),
            },
            other => Event::Error { code: s(&v["code"]), message: s(other) },
        },
        kind @ ("session.closed" | "session.expired" | "session.replaced") => {
            Event::Ended { kind: kind.to_string(), reason: s(&v["reason"]) }
        }
        // The server stopped keeping events for a resume; the session goes on.
        "session.resync_required" => Event::Unjournaled { reason: s(&v["reason"]) },
        _ => Event::Other,
    })
}

/// Base64 of 16-bit little-endian PCM as samples.
fn pcm16(b64: &str) -> Result<Vec<f32>, BadEvent> {
    let bytes = STANDARD.decode(b64).map_err(|e| BadEvent(format!("audio delta: {e}")))?;
    if bytes.len() % 2 != 0 {
        return Err(BadEvent(format!("audio delta: {} bytes is not whole 16-bit samples", bytes.len())));
    }
    let mut samples = Vec::with_capacity(bytes.len() / 2);
    omni_actors::audio::pcm::decode_i16_le(&bytes, &mut samples);
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::SessionKind;

    #[test]
    fn the_settings_ask_for_model_owned_turns_float_input_and_the_voice_prompt() {
        let mut setup = SessionSetup::new(SessionKind::Duplex);
        setup.system_prompt = "Be brief.".into();
        setup.generation.temperature = Some(0.7);
        let v: Value = serde_json::from_str(&session_update(&setup, Some(wav_data_url(b"RIFF")), None)).unwrap();
        let s = &v["session"];
        assert_eq!(v["type"], "session.update");
        assert_eq!(s["instructions"], "Be brief.");
        assert_eq!(s["temperature"], json!(0.7));
        assert_eq!(s["input_audio_format"], "pcm_f32le");
        assert_eq!(s["turn_detection"], Value::Null);
        assert_eq!(s["extra_body"]["auto_response"], true);
        assert_eq!(s["ref_audio"], "data:audio/wav;base64,UklGRg==");
        assert!(s.get("model").is_none());
    }

    #[test]
    fn an_append_forwards_the_clients_base64_and_at_most_two_bare_frames() {
        let chunk = DuplexChunk {
            audio: vec![1.0],
            audio_base64: Some(bytes::Bytes::from_static(b"AAAAAA==")),
            frames: vec![vec![1], vec![0xFF, 0xD8], vec![0x89, 0x50]],
            ..DuplexChunk::default()
        };
        let v: Value = serde_json::from_str(&append(&chunk, true)).unwrap();
        assert_eq!(
            v,
            json!({"type": "input_audio_buffer.append", "force_listen": true, "video_frames": ["/9g=", "iVA="],
                   "audio": "AAAAAA=="})
        );
        let v: Value = serde_json::from_str(&append(&DuplexChunk { audio_base64: None, ..chunk }, false)).unwrap();
        assert_eq!(v["audio"], STANDARD.encode(1.0f32.to_le_bytes()));
        assert!(v.get("force_listen").is_none());
    }

    #[test]
    fn events_are_read_as_the_server_writes_them() {
        let delta = json!({"type": "response.output_audio.delta", "response_id": "r1", "delta": STANDARD.encode([0u8, 64, 0, 192]),
            "format": "pcm16", "sample_rate_hz": 24000, "metadata": {"end_of_turn": true}});
        assert_eq!(
            parse(&delta.to_string()).unwrap().0,
            Event::Audio { response_id: "r1".into(), samples: vec![0.5, -0.5], end_of_turn: true }
        );
        let full = r#"{"type":"error","event_id":"event_1","error":{"type":"rate_limit_error","code":"resource_exhausted","message":"duplex_session_capacity_exhausted: limit=4"}}"#;
        assert_eq!(
            parse(full).unwrap().0,
            Event::Error {
                code: "resource_exhausted".into(),
                message: "duplex_session_capacity_exhausted: limit=4".into()
            }
        );
        let route = r#"{"type":"error","error":"Duplex sessions require a single API worker","code":"multi_api_duplex_unsupported"}"#;
        assert!(matches!(parse(route).unwrap().0, Event::Error { code, .. } if code == "multi_api_duplex_unsupported"));
        let done = r#"{"type":"response.done","response":{"id":"r1","status":"cancelled","status_details":{"type":"cancelled","reason":"client_cancelled"}}}"#;
        assert_eq!(
            parse(done).unwrap().0,
            Event::Done { id: "r1".into(), status: "cancelled".into(), reason: "client_cancelled".into() }
        );
        let listen = r#"{"type":"response.listen","response":{},"server_event_seq":7}"#;
        assert_eq!(parse(listen).unwrap(), (Event::Listen { response_id: None }, Some(7)));
        assert!(parse(r#"{"type":"response.output_audio.delta","delta":"AAA"}"#).is_err(), "odd bytes");
        // At most ten seconds once at 24 kHz, judged before decoding or resampling.
        let delta = |seconds: usize, rate: u32| {
            let b64 = STANDARD.encode(vec![0u8; seconds * rate as usize * 2]);
            json!({"type": "response.output_audio.delta", "delta": b64, "sample_rate_hz": rate}).to_string()
        };
        assert!(parse(&delta(9, 24000)).is_ok());
        assert!(parse(&delta(11, 24000)).unwrap_err().to_string().contains("more than 10 s"));
        assert!(parse(&delta(4, 8000)).is_ok(), "4 s at 8 kHz is 4 s at 24 kHz");
        assert!(parse(&delta(2, 1)).is_err(), "1 Hz: refused by the resampler");
        assert!(parse("[1]").is_err());
    }
}
