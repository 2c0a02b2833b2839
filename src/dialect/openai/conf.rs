//! The session configuration on the wire: `session.update` in any flavor's shape (beta, GA,
//! Qwen), validated field by field into the driver's typed [`Conf`], and each flavor's
//! defaults.

use omni_actors::protocol::ProtocolError;
use serde_json::{Value, json};

use super::Flavor;
use crate::dialect::conversation::{Conf, OUTPUT_RATE, Vad};
use crate::dialect::settings::{self, QWEN_SESSION, Settings};

/// The settings `session.update` takes by name rather than as fields of its own.
const BY_NAME: [&str; 7] =
    ["top_p", "top_k", "repetition_penalty", "presence_penalty", "seed", "enable_search", "search_options"];

/// Server VAD as each flavor's documents show it (Qwen waits 800 ms of silence, OpenAI 500).
fn vad_of(flavor: Flavor) -> Vad {
    let silence_duration_ms = if flavor == Flavor::Qwen { 800 } else { 500 };
    Vad { kind: "server_vad".into(), threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms }
}

/// A session's configuration before the client changes any of it.
pub(super) fn defaults(flavor: Flavor) -> Conf {
    Conf {
        instructions: String::new(),
        voice: if flavor == Flavor::Qwen { "Cherry".into() } else { "alloy".into() },
        audio_out: true,
        vad: Some(vad_of(flavor)),
        temperature: None,
        max_tokens: None,
        input_rate: flavor.default_input_rate(),
        // Qwen's document shows transcription on by default; OpenAI's is off.
        transcription: (flavor == Flavor::Qwen).then(|| json!({"model": "gummy-realtime-v1"})),
        settings: Settings::default(),
    }
}

pub(super) fn invalid(param: &str, why: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::InvalidPayload(format!("{param}: {why}"))
}

/// `input_audio_format` / `audio.input.format`: only 16-bit PCM; returns the rate if given.
pub(super) fn pcm_format(v: &Value, param: &str) -> Result<Option<u32>, ProtocolError> {
    let (kind, rate) = match v {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("type").and_then(Value::as_str).unwrap_or("pcm"),
            match o.get("rate").or_else(|| o.get("sample_rate")) {
                None | Some(Value::Null) => None,
                Some(r) => Some(r.as_u64().ok_or_else(|| invalid(param, "rate: must be a whole number of Hz"))?),
            },
        ),
        _ => return Err(invalid(param, "must be a string or an object")),
    };
    if !matches!(kind, "pcm16" | "pcm" | "audio/pcm") {
        return Err(invalid(param, format!("'{kind}' is not supported (16-bit PCM only: pcm16, pcm, audio/pcm)")));
    }
    rate.map(|r| omni_actors::audio::check_rate(r).map_err(|e| invalid(param, e))).transpose()
}

pub(super) fn turn_detection(v: &Value, param: &str, flavor: Flavor) -> Result<Option<Vad>, ProtocolError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(o) => {
            let mut vad = vad_of(flavor);
            if let Some(kind) = o.get("type").and_then(Value::as_str) {
                if !matches!(kind, "server_vad" | "semantic_vad") {
                    return Err(invalid(param, format!("type '{kind}' is not supported (server_vad, semantic_vad)")));
                }
                vad.kind = kind.to_string();
            }
            if let Some(t) = o.get("threshold").and_then(Value::as_f64) {
                vad.threshold = t;
            }
            if let Some(p) = o.get("prefix_padding_ms").and_then(Value::as_u64) {
                vad.prefix_padding_ms = p;
            }
            if let Some(s) = o.get("silence_duration_ms").and_then(Value::as_u64) {
                vad.silence_duration_ms = s;
            }
            Ok(Some(vad))
        }
        _ => Err(invalid(param, "must be an object or null")),
    }
}

/// Whether the modalities ask for audio. Qwen answers audio with its text: `["audio"]`
/// alone is refused there, as its document shows.
pub(super) fn modalities(v: &Value, param: &str, flavor: Flavor) -> Result<bool, ProtocolError> {
    let list = v.as_array().ok_or_else(|| invalid(param, "must be a list"))?;
    let (mut audio, mut text) = (false, false);
    for m in list {
        match m.as_str() {
            Some("audio") => audio = true,
            Some("text") => text = true,
            other => return Err(invalid(param, format!("{other:?} is not a modality (text, audio)"))),
        }
    }
    if flavor == Flavor::Qwen && audio && !text {
        return Err(invalid(
            param,
            "Invalid modalities: ['audio']. Supported combinations are: ['text'] and ['audio', 'text'].",
        ));
    }
    Ok(audio)
}

/// `input_audio_transcription` (or GA `audio.input.transcription`): an object naming the
/// transcription model, or null for none.
fn transcription(v: &Value, param: &str) -> Result<Option<Value>, ProtocolError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(o) if o.len() <= 8 && v.to_string().len() <= 1024 => Ok(Some(v.clone())),
        Value::Object(_) => Err(invalid(param, "at most 8 fields and 1024 bytes")),
        _ => Err(invalid(param, "must be an object or null")),
    }
}

pub(super) fn max_tokens(v: &Value, param: &str) -> Result<Option<u32>, ProtocolError> {
    match v {
        Value::String(s) if s == "inf" => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(n @ 1..=1_000_000) => Ok(Some(n as u32)),
            _ => Err(invalid(param, "must be a positive integer or \"inf\"")),
        },
        _ => Err(invalid(param, "must be a positive integer or \"inf\"")),
    }
}

/// `conf` with a `session` object in any flavor's shape (beta, GA, Qwen) applied; nothing of
/// it applies if any of it is refused.
pub(super) fn apply(conf: &Conf, s: &Value, flavor: Flavor) -> Result<Conf, ProtocolError> {
    let s = s.as_object().ok_or_else(|| ProtocolError::MissingField("session must be an object".into()))?;
    let mut next = conf.clone();
    let text = |key: &str| -> Result<Option<String>, ProtocolError> {
        match s.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(v)) => Ok(Some(v.clone())),
            Some(_) => Err(invalid(&format!("session.{key}"), "must be a string")),
        }
    };
    if let Some(i) = text("instructions")? {
        next.instructions = i;
    }
    if let Some(v) = text("voice")? {
        next.voice = v;
    }
    if let Some(m) = s.get("modalities") {
        next.audio_out = modalities(m, "session.modalities", flavor)?;
    }
    if let Some(m) = s.get("output_modalities") {
        next.audio_out = modalities(m, "session.output_modalities", flavor)?;
    }
    if let Some(td) = s.get("turn_detection") {
        next.vad = turn_detection(td, "session.turn_detection", flavor)?;
    }
    if let Some(t) = s.get("input_audio_transcription") {
        next.transcription = transcription(t, "session.input_audio_transcription")?;
    }
    for name in BY_NAME {
        if let Some(v) = s.get(name) {
            next.settings.set(QWEN_SESSION, name, v, "session.")?;
        }
    }
    if let Some(f) = s.get("input_audio_format")
        && let Some(rate) = pcm_format(f, "session.input_audio_format")?
    {
        next.input_rate = rate;
    }
    if let Some(f) = s.get("output_audio_format")
        && let Some(rate) = pcm_format(f, "session.output_audio_format")?
        && rate != OUTPUT_RATE
    {
        return Err(invalid("session.output_audio_format", format!("output audio is {OUTPUT_RATE} Hz, not {rate}")));
    }
    if let Some(t) = s.get("temperature") {
        next.temperature = Some(settings::temperature(t, "session.temperature")?);
    }
    for key in ["max_response_output_tokens", "max_output_tokens", "max_tokens"] {
        if let Some(v) = s.get(key) {
            next.max_tokens = max_tokens(v, &format!("session.{key}"))?;
        }
    }
    // GA: audio.input.{format, turn_detection, transcription}, audio.output.{format, voice}
    if let Some(audio) = s.get("audio") {
        let input = &audio["input"];
        if let Some(f) = input.get("format")
            && let Some(rate) = pcm_format(f, "session.audio.input.format")?
        {
            next.input_rate = rate;
        }
        if let Some(td) = input.get("turn_detection") {
            next.vad = turn_detection(td, "session.audio.input.turn_detection", flavor)?;
        }
        if let Some(t) = input.get("transcription") {
            next.transcription = transcription(t, "session.audio.input.transcription")?;
        }
        let output = &audio["output"];
        if let Some(v) = output.get("voice").and_then(Value::as_str) {
            next.voice = v.to_string();
        }
        if let Some(f) = output.get("format")
            && let Some(rate) = pcm_format(f, "session.audio.output.format")?
            && rate != OUTPUT_RATE
        {
            return Err(invalid(
                "session.audio.output.format",
                format!("output audio is {OUTPUT_RATE} Hz, not {rate}"),
            ));
        }
    }
    Ok(next)
}

/// A `session` object without its audio formats (`input_audio_format`,
/// `output_audio_format`, `audio.input.format`, `audio.output.format`): for a session whose
/// edge carries the audio in formats of its own.
pub(super) fn without_formats(session: &Value) -> Value {
    let mut session = session.clone();
    if let Some(s) = session.as_object_mut() {
        s.remove("input_audio_format");
        s.remove("output_audio_format");
        if let Some(audio) = s.get_mut("audio").and_then(Value::as_object_mut) {
            for side in ["input", "output"] {
                if let Some(side) = audio.get_mut(side).and_then(Value::as_object_mut) {
                    side.remove("format");
                }
            }
        }
    }
    session
}
