//! The earlier MiniCPM-o duplex dialect (docs/protocol.md, "The earlier duplex dialect"):
//! `session.update`, `input_audio_buffer.append`, `session.close` in;
//! `session.created{session_id, prompt_length}`, `response.listen`,
//! `response.output_audio.delta{text, audio, end_of_turn, kv_cache_length}` out.
//!
//! Audio out is regrouped so that middle deltas carry exactly 24000 samples (one second at
//! 24 kHz) whatever the backend's step size: each step's text rides on its first delta;
//! what does not fill a second waits for the next step, and the end of the turn flushes
//! the rest in a shorter last delta.

use omni_actors::domain::{Mode, SessionKind, SessionSetup, StepKind};
use omni_actors::edge::dialect::{DecodeError, Dialect, Outbox};
use omni_actors::ids;
use omni_actors::protocol::{CloseReason, Inbound, Outbound, ProtocolError};
use serde::Deserialize;
use serde_json::json;

use std::sync::Arc;

use omni_actors::edge::redact::Redact;

use super::Limits;
use super::minicpm::{self, duplex_chunk};
use super::record::{AudioEncoding, JsonRedactor};
use super::wire::{self, JsonWriter, Text};
use omni_actors::audio::{self, AudioLimits};

/// Samples per middle `response.output_audio.delta`: one second at 24 kHz.
pub const DELTA_SAMPLES: usize = 24000;

pub struct Legacy {
    mode: Mode,
    limits: Limits,
    /// Audio of the current turn not yet sent (less than a second), and its text.
    carry: Vec<f32>,
    carry_text: String,
}

impl Legacy {
    pub fn new(mode: Mode, limits: Limits) -> Legacy {
        Legacy { mode, limits, carry: Vec::new(), carry_text: String::new() }
    }
}

#[derive(Deserialize)]
struct UpdateEvent<'a> {
    #[serde(borrow)]
    session: Option<UpdateSession<'a>>,
}

#[derive(Deserialize)]
struct UpdateSession<'a> {
    #[serde(borrow, default)]
    instructions: Option<Text<'a>>,
    #[serde(default)]
    max_slice_nums: Option<i64>,
    #[serde(borrow, default)]
    ref_audio: Option<Text<'a>>,
    #[serde(borrow, default)]
    tts_ref_audio: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct AppendEvent<'a> {
    #[serde(borrow, default)]
    audio: Option<Text<'a>>,
    #[serde(borrow, default)]
    video_frames: Option<Vec<Text<'a>>>,
    #[serde(default)]
    force_listen: Option<bool>,
    #[serde(default)]
    max_slice_nums: Option<i64>,
}

/// Reference audio: base64 WAV (any PCM WAV within the limits), as 16 kHz mono float32.
fn reference_audio(b64: &str, field: &str, limits: AudioLimits) -> Result<Vec<f32>, ProtocolError> {
    let bytes = wire::decode_base64(b64, field)?;
    audio::wav_to_16k_mono(&bytes, limits).map_err(|e| ProtocolError::InvalidPayload(format!("{field}: {e}")))
}

impl Legacy {
    fn update(&self, text: &str) -> Result<Inbound, DecodeError> {
        let event: UpdateEvent = wire::parse_event(text, &["session"])?;
        let s = event.session.ok_or_else(|| ProtocolError::MissingField("session is required (an object)".into()))?;
        let instructions =
            s.instructions.ok_or_else(|| ProtocolError::MissingField("session.instructions is required".into()))?;
        let mut setup = SessionSetup::new(SessionKind::Duplex);
        setup.system_prompt = instructions.0.into_owned();
        setup.generation.max_slice_nums = wire::slice_nums(s.max_slice_nums, "session.max_slice_nums")?;
        if let Some(b64) = &s.ref_audio {
            setup.ref_audio = reference_audio(b64, "session.ref_audio", self.limits.reference)?;
        }
        setup.tts_ref_audio = match &s.tts_ref_audio {
            Some(b64) => reference_audio(b64, "session.tts_ref_audio", self.limits.reference)?,
            None => setup.ref_audio.clone(),
        };
        Ok(Inbound::Init(setup))
    }

    fn append(&self, text: &bytestring::ByteString) -> Result<Inbound, DecodeError> {
        let e: AppendEvent = wire::parse_event(text, &[])?;
        let chunk = duplex_chunk(
            (text, e.audio.as_deref()),
            e.video_frames.as_deref(),
            e.force_listen,
            e.max_slice_nums,
            self.mode,
            self.limits.min_audio_samples,
            "",
        )?;
        Ok(Inbound::Chunk(chunk))
    }

    fn delta(out: &mut Outbox, text: &str, audio: &[f32], end_of_turn: bool, kv: u64) {
        JsonWriter::new(256 + text.len() + wire::pcm_b64_len(audio.len()))
            .field("type", "response.output_audio.delta")
            .field("text", text)
            .pcm_field("audio", audio)
            .field("end_of_turn", end_of_turn)
            .field("kv_cache_length", kv)
            .finish_into(out, audio.len())
    }
}

/// `session.closed` reasons of this dialect.
fn closed_reason(reason: &CloseReason) -> &'static str {
    match reason {
        CloseReason::Client(_) => "stopped",
        CloseReason::Timeout => "timeout",
        CloseReason::ContextFull => "context_full",
        CloseReason::ServerShutdown => "server_shutdown",
        _ => "error",
    }
}

impl Dialect for Legacy {
    fn name(&self) -> &'static str {
        "minicpm-legacy"
    }

    fn decode(&mut self, text: &bytestring::ByteString, _replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        let kind = wire::event_type(text)?;
        let cmd = match kind.as_ref() {
            "session.update" => self.update(text)?,
            "input_audio_buffer.append" => self.append(text)?,
            "session.close" => minicpm::close(text)?,
            other => {
                return Err(ProtocolError::UnknownEvent(format!("unknown event type '{other}'")).into());
            }
        };
        Ok(vec![cmd])
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        let reason = match &event {
            Outbound::Closed { reason, .. } => closed_reason(reason),
            _ => "",
        };
        if let Outbound::Closed { .. } = event {
            out.push(json!({"type": "session.closed", "reason": reason}).to_string());
            return;
        }
        if let Some(frame) = minicpm::encode_common(&event, reason) {
            out.push(frame);
            return;
        }
        match event {
            Outbound::Created { session_id, prompt_length, .. } => {
                out.push(
                    json!({"type": "session.created", "session_id": session_id, "prompt_length": prompt_length})
                        .to_string(),
                );
            }
            Outbound::Step { outcome, .. } => {
                match outcome.kind {
                    StepKind::Listen => {
                        // A listen ends the turn: audio not yet sent is dropped (force-listen).
                        self.carry.clear();
                        self.carry_text.clear();
                        out.push(json!({"type": "response.listen", "kv_cache_length": outcome.kv_length}).to_string());
                    }
                    StepKind::Speak => {
                        self.carry.extend_from_slice(&outcome.audio);
                        self.carry_text.push_str(&outcome.text);
                        let kv = outcome.kv_length;
                        while self.carry.len() >= DELTA_SAMPLES
                            && !(outcome.end_of_turn && self.carry.len() == DELTA_SAMPLES)
                        {
                            let text = std::mem::take(&mut self.carry_text);
                            Self::delta(out, &text, &self.carry[..DELTA_SAMPLES], false, kv);
                            self.carry.drain(..DELTA_SAMPLES);
                        }
                        if outcome.end_of_turn {
                            Self::delta(out, &self.carry_text, &self.carry, true, kv);
                            self.carry.clear();
                            self.carry_text.clear();
                        }
                    }
                }
            }
            // Turn mode is not part of this dialect (chat uses the current dialect).
            _ => {}
        }
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        JsonRedactor::shared(AudioEncoding::F32)
    }

    /// `rt_` and the millisecond timestamp, strictly increasing so never repeated.
    fn new_session_id(&mut self) -> String {
        format!("rt_{}", ids::unique_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::StepOutcome;
    use serde_json::Value;

    fn speak(text: &str, samples: usize, eot: bool) -> StepOutcome {
        StepOutcome {
            kind: StepKind::Speak,
            text: text.into(),
            audio: vec![0.1; samples],
            end_of_turn: eot,
            kv_length: 10,
            ..StepOutcome::default()
        }
    }

    fn encode(l: &mut Legacy, o: &StepOutcome) -> Vec<(String, usize, bool)> {
        let mut out = Outbox::default();
        l.encode(
            Outbound::Step { session_id: "rt_1", response_id: Some("r"), input_id: "input_1", outcome: o },
            &mut out,
        );
        out.texts()
            .into_iter()
            .map(|f| {
                let v: Value = serde_json::from_str(f).unwrap();
                let n = wire::decode_pcm_f32(v["audio"].as_str().unwrap(), "a").unwrap().len();
                (v["text"].as_str().unwrap().to_string(), n, v["end_of_turn"].as_bool().unwrap())
            })
            .collect()
    }

    #[test]
    fn middle_deltas_carry_exactly_one_second() {
        let mut l = Legacy::new(Mode::Video, Limits::default());
        // a backend with 1.5 s steps
        assert_eq!(encode(&mut l, &speak("a", 36000, false)), vec![("a".into(), 24000, false)]);
        assert_eq!(
            encode(&mut l, &speak("b", 36000, false)),
            vec![("b".into(), 24000, false), (String::new(), 24000, false)]
        );
        assert_eq!(encode(&mut l, &speak("c", 6000, true)), vec![("c".into(), 6000, true)]);
        // a backend with half-second steps: text waits with its audio
        assert!(encode(&mut l, &speak("x", 12000, false)).is_empty());
        assert_eq!(encode(&mut l, &speak("y", 12000, false)), vec![("xy".into(), 24000, false)]);
        // exactly one second at the end of the turn is one last delta
        assert_eq!(encode(&mut l, &speak("z", 24000, true)), vec![("z".into(), 24000, true)]);
    }

    #[test]
    fn update_requires_instructions_and_falls_back_to_ref_audio() {
        let l = Legacy::new(Mode::Video, Limits::default());
        let e = l.update(r#"{"type":"session.update","session":{}}"#).unwrap_err();
        assert!(matches!(&e, DecodeError::Protocol(p) if p.code() == "missing_field"), "{e}");
        assert_eq!(e.to_string(), "session.instructions is required");
        let wav = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            audio::encode_wav_f32(&[0.2; 1600], 16000),
        );
        let Inbound::Init(s) = l
            .update(&json!({"type": "session.update", "session": {"instructions": "hi", "ref_audio": wav}}).to_string())
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(s.ref_audio.len(), 1600);
        assert_eq!(s.tts_ref_audio, s.ref_audio, "tts_ref_audio falls back to ref_audio");
        let e = l.update(r#"{"type":"session.update","session":{"instructions":"x","ref_audio":"AAAA"}}"#).unwrap_err();
        assert!(e.to_string().starts_with("session.ref_audio: not a PCM WAV file"), "{e}");
    }

    #[test]
    fn closed_reasons_of_this_dialect() {
        let mut l = Legacy::new(Mode::Video, Limits::default());
        for (reason, expected) in [
            (CloseReason::Client("user_stop".into()), "stopped"),
            (CloseReason::Timeout, "timeout"),
            (CloseReason::ContextFull, "context_full"),
            (CloseReason::ServerShutdown, "server_shutdown"),
            (CloseReason::BackendError("hang".into()), "error"),
        ] {
            let mut out = Outbox::default();
            l.encode(Outbound::Closed { session_id: Some("rt_1"), reason: &reason }, &mut out);
            assert_eq!(out.texts(), vec![json!({"type": "session.closed", "reason": expected}).to_string()]);
        }
    }

    #[test]
    fn session_ids_are_rt_and_a_unique_timestamp() {
        let mut l = Legacy::new(Mode::Video, Limits::default());
        let (a, b) = (l.new_session_id(), l.new_session_id());
        assert!(a.starts_with("rt_") && a[3..].parse::<u64>().is_ok());
        assert_ne!(a, b);
    }
}
